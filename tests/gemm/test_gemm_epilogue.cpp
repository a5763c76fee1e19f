// Epilogue ops holding data (epi::bias_col, epi::bias_row, epi::residual) in every precision,
// strided, against the double reference: C = residual + relu(A B + bias_col[j] + bias_row[i]).
// Each op takes the precision of the tensor it is built from as a template argument (no
// run-time switch per element); the static_asserts check the deduction, the cases the values.
// Run on main_configs (every enabled space, operands and epilogue tensors in its memory).
// Bound: the fp32 GEMM bound of tests/support/tolerance.hpp with the biases and the residual
// counted as three more terms (relu is 1-Lipschitz and adds no error).
#include "gemm_testing.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

template <class P, class Mem = host_space>
using vector_view = TensorView<P, dextents<1>, layout_stride, Mem>;

static_assert(std::is_same_v<decltype(epi::bias_col{std::declval<vector_view<fp16>>()}),
                             epi::bias_col<fp16>>);
static_assert(std::is_same_v<decltype(epi::bias_row{std::declval<vector_view<fp8_e5m2>>()}),
                             epi::bias_row<fp8_e5m2>>);
static_assert(std::is_same_v<decltype(epi::residual{std::declval<strided_matrix_view<bf16>>()}),
                             epi::residual<bf16>>);

/// n values uniform in [-1, 1) rounded to P, every other element of a 2n allocation (stride 2)
/// in memory space Mem; also their values in double.
template <class P, class Mem>
struct strided_vector {
  Tensor<P, dextents<1>, layout_right, Mem> storage;
  vector_view<P, Mem> view;
  std::vector<double> values;
  strided_vector(index_t n, std::uint64_t seed)
      : storage("v", dextents<1>(2 * n)), view(storage.data(), dextents<1>(n), {2}) {
    const counter_rng rng{seed, 11};
    const auto h = host_mirror_copy(storage);
    for (index_t i = 0; i < n; ++i) {
      const auto x = from_float<P, saturate>(2.f * rng.uniform01(std::uint64_t(i)) - 1.f);
      h.data()[2 * i] = x;
      values.push_back(to_float(x));
    }
    copy_from_host(storage, h);
  }
};

template <class Config, class PA, class PB, class PC, class PBias, class PRow, class PRes>
index_t epilogue_case(index_t m, index_t n, index_t k, std::uint64_t seed) {
  const std::string what =
      Config::name() + " " + precision_traits<PA>::name + " x " + precision_traits<PB>::name +
      " -> " + precision_traits<PC>::name + ", bias_col " + precision_traits<PBias>::name +
      ", bias_row " + precision_traits<PRow>::name + ", residual " + precision_traits<PRes>::name +
      ", M " + std::to_string(m) + " N " + std::to_string(n) + " K " + std::to_string(k);
  using mem = memory_of<Config>;
  const auto a = make_matrix<PA, mem>(m, k, {false, 1, 0}, seed);
  const auto b = make_matrix<PB, mem>(k, n, {true, 0, 2}, seed + 1);
  const auto c = make_matrix<PC, mem>(m, n, {false, 2, 1}, seed + 2, -1.f, 1.f, true);
  const auto r = make_matrix<PRes, mem>(m, n, {true, 1, 0}, seed + 3);
  const strided_vector<PBias, mem> bc(n, seed + 4);
  const strided_vector<PRow, mem> br(m, seed + 5);
  auto ref = reference_gemm(a.values, b.values);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const double bias = bc.values[std::size_t(j)] + br.values[std::size_t(i)];
      const double v = ref.value(i, j) + bias;
      ref.value(i, j) = (v < 0 ? 0 : v) + r.values(i, j);
      ref.abs(i, j) += std::abs(bc.values[std::size_t(j)]) + std::abs(br.values[std::size_t(i)]) +
                       std::abs(r.values(i, j));
    }
  Config::run(a.view, b.view, c.view,
              make_epilogue({}, epi::bias_col{bc.view}, epi::bias_row{br.view}, epi::relu{},
                            epi::residual{r.view}));
  return check_against_reference<PC>(what, to_dmatrix(c.view), ref, k + 3);
}

} // namespace

TEMPLATE_LIST_TEST_CASE("gemm epilogue: biases and residual of every precision, strided",
                        "[gemm][epilogue]", main_configs) {
  index_t bad = 0;
  std::uint64_t seed = 0xe91;
  for (const auto& s : std::vector<std::array<index_t, 3>>{
           {1, 1, 1}, {7, 13, 5}, {37, 61, 97}, {64, 33, 130}, {131, 17, 257}}) {
    bad += epilogue_case<TestType, fp32, fp32, fp32, fp32, fp32, fp32>(s[0], s[1], s[2], seed += 8);
    bad += epilogue_case<TestType, fp16, fp16, fp32, fp16, bf16, fp8_e4m3>(s[0], s[1], s[2],
                                                                           seed += 8);
    bad += epilogue_case<TestType, bf16, fp16, fp16, fp8_e5m2, fp16, bf16>(s[0], s[1], s[2],
                                                                           seed += 8);
    bad += epilogue_case<TestType, fp8_e4m3, bf16, bf16, bf16, fp8_e4m3, fp16>(s[0], s[1], s[2],
                                                                               seed += 8);
  }
  CHECK(bad == 0);
}
