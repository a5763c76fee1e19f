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

/// n values uniform in [-1, 1) rounded to P, every `stride`-th element of an allocation
/// (every other one by default) in memory space Mem; also their values in double. Element
/// `nan_at`, when given, is NaN (its value in double too).
template <class P, class Mem>
struct strided_vector {
  Tensor<P, dextents<1>, layout_right, Mem> storage;
  vector_view<P, Mem> view;
  std::vector<double> values;
  strided_vector(index_t n, std::uint64_t seed, index_t stride = 2, index_t nan_at = -1)
      : storage("v", dextents<1>(stride * n)), view(storage.data(), dextents<1>(n), {stride}) {
    const counter_rng rng{seed, 11};
    const auto h = host_mirror_copy(storage);
    for (index_t i = 0; i < n; ++i) {
      auto x = from_float<P, saturate>(2.f * rng.uniform01(std::uint64_t(i)) - 1.f);
      if (i == nan_at) x = nan_of<P>();
      h.data()[stride * i] = x;
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

/// fp32 C with unit-stride rows and every op with a vector form, the operands unit-stride too:
/// C = residual + relu(scale * (alpha A B + beta C_old + bias_col[j] + bias_row[i])). The host
/// GEMM applies these ops on vectors in its last store (on the fp32 kernel's registers for full
/// tiles, from the tile buffer for edge tiles, after several K slices when K > KC). Row `nan_row`
/// of bias_row is NaN: relu keeps NaN, so that row must come out all NaN. Also checks that
/// nothing around C is written.
template <class Config>
index_t vector_epilogue_case(index_t m, index_t n, index_t k, float alpha, float beta,
                             std::uint64_t seed) {
  const std::string what = Config::name() + " fp32 ops on vectors, M " + std::to_string(m) + " N " +
                           std::to_string(n) + " K " + std::to_string(k) + " alpha " +
                           std::to_string(alpha) + " beta " + std::to_string(beta);
  using mem = memory_of<Config>;
  const float factor = 0.75f;
  const index_t nan_row = m / 2;
  const auto a = make_matrix<fp32, mem>(m, k, {false, 0, 0}, seed);
  const auto b = make_matrix<fp32, mem>(k, n, {false, 1, 3}, seed + 1);
  const auto c = make_matrix<fp32, mem>(m, n, {false, 2, 5}, seed + 2, -1.f, 1.f, beta == 0.f);
  const auto r = make_matrix<fp32, mem>(m, n, {false, 0, 0}, seed + 3);
  const strided_vector<fp32, mem> bc(n, seed + 4, 1);
  const strided_vector<fp32, mem> br(m, seed + 5, 1, nan_row);
  auto ref = reference_gemm(a.values, b.values, alpha, beta, c.values);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const double bias = bc.values[std::size_t(j)] + br.values[std::size_t(i)];
      const double v = factor * (ref.value(i, j) + bias);
      ref.value(i, j) = (v < 0 ? 0 : v) + r.values(i, j);
      ref.abs(i, j) = factor * (ref.abs(i, j) + std::abs(bc.values[std::size_t(j)]) +
                                std::abs(br.values[std::size_t(i)])) +
                      std::abs(r.values(i, j));
    }
  const auto c0 = snapshot(c);
  Config::run(a.view, b.view, c.view,
              make_epilogue({.alpha = alpha, .beta = beta}, epi::bias_col{bc.view},
                            epi::bias_row{br.view}, epi::scale{factor}, epi::relu{},
                            epi::residual{r.view}));
  dmatrix got = to_dmatrix(c.view);
  index_t nan_bad = 0;
  for (index_t j = 0; j < n; ++j) {
    if (!std::isnan(got(nan_row, j))) ++nan_bad;
    got(nan_row, j) = ref.value(nan_row, j) = ref.abs(nan_row, j) = 0.; // checked above
  }
  if (nan_bad) UNSCOPED_INFO(what << ": " << nan_bad << " elements of the NaN row are not NaN");
  const index_t outside = changed_outside(c, c0);
  if (outside) UNSCOPED_INFO(what << ": " << outside << " elements around C were written");
  return check_against_reference<fp32>(what, got, ref, k + 3) + nan_bad + outside;
}

} // namespace

TEMPLATE_LIST_TEST_CASE("gemm epilogue: fp32 C with every op on vectors (unit-stride operands, "
                        "several K slices, edge tiles, NaN through relu)",
                        "[gemm][epilogue]", main_configs) {
  index_t bad = 0;
  std::uint64_t seed = 0xe95;
  for (const auto& s : std::vector<std::array<index_t, 3>>{
           {14, 32, 64}, {45, 70, 600}, {29, 95, 1100}, {200, 131, 77}, {3, 17, 5}, {97, 64, 513}})
    for (const auto& [alpha, beta] : {std::pair{1.f, 0.f}, {2.f, 0.5f}, {-1.f, 1.f}})
      bad += vector_epilogue_case<TestType>(s[0], s[1], s[2], alpha, beta, seed += 8);
  CHECK(bad == 0);
}

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
