// Issue 12 for tessera::gemm / gemm_batched: the overlap check is exact (operands in one
// allocation that share no element are legal and computed right), epilogue operands (bias_row,
// bias_col, residual) must not overlap C (host_packed keeps partial sums in C between K blocks
// of 512, so a residual or bias read from C was silently wrong for K > 512), and the scales of
// scaled operands must be positive, finite and normal. Refused calls leave every operand
// bit-identical. Each test runs on main_configs: every enabled space, the operands (and the
// buffers they are cut from) in its memory, read back through host copies.
#include "gemm_testing.hpp"
#include "support/messages.hpp"

#include <limits>

using namespace tessera;
using namespace tessera::testing;
using Catch::Matchers::Contains;
namespace epi = tessera::epi;

namespace {
constexpr std::uint64_t seed = 0x5afe12;

template <Precision P, class Mem>
using vec_view = TensorView<P, dextents<1>, layout_stride, Mem>;
template <class Mem>
using buffer = Tensor<fp32, dextents<1>, layout_right, Mem>;

/// C = A B + extra(i, j) in double.
template <class Extra>
gemm_reference reference_plus(const dmatrix& a, const dmatrix& b, Extra extra) {
  auto r = reference_gemm(a, b);
  for (index_t i = 0; i < r.value.rows; ++i)
    for (index_t j = 0; j < r.value.cols; ++j) {
      r.value(i, j) += extra(i, j);
      r.abs(i, j) += std::abs(extra(i, j));
    }
  return r;
}
} // namespace

TEMPLATE_LIST_TEST_CASE("gemm refuses epilogue operands that overlap C (K beyond one K block)",
                        "[gemm][safety]", main_configs) {
  using mem = memory_of<TestType>;
  const index_t m = 20, n = 24, k = 600; // K > KC = 512: host_packed stores partial sums in C
  const auto a = make_matrix<fp32, mem>(m, k, {}, seed);
  const auto b = make_matrix<fp32, mem>(k, n, {true, 1, 0}, seed + 1);
  const auto c = make_matrix<fp32, mem>(m, n, {false, 3, 2}, seed + 2);
  const auto a0 = snapshot(a), b0 = snapshot(b), c0 = snapshot(c);
  const auto same = [&] { return unchanged(a, a0) && unchanged(b, b0) && unchanged(c, c0); };
  // residual = C itself; bias_col = row 3 of C; bias_row = column 5 of C; a residual that is C
  // shifted by one row (overlapping most of it).
  const vec_view<fp32, mem> row3(c.view.data() + 3 * c.view.stride(0), dextents<1>(n), {1});
  const vec_view<fp32, mem> col5(c.view.data() + 5, dextents<1>(m), {c.view.stride(0)});
  const strided_matrix_view<fp32, mem> shifted(c.view.data() + c.view.stride(0), dextents<2>(m, n),
                                               {c.view.stride(0), 1});
  CHECK_THAT(message_of<shape_error>([&] {
               TestType::run(a.view, b.view, c.view, make_epilogue({}, epi::residual{c.view}));
             }),
             Contains("tessera::gemm") && Contains("residual") && Contains("overlaps C") &&
                 Contains("(20, 600)") && Contains("(600, 24)") && Contains("(20, 24)"));
  CHECK_THAT(message_of<shape_error>([&] {
               TestType::run(a.view, b.view, c.view,
                             make_epilogue({}, epi::relu{}, epi::bias_col{row3}));
             }),
             Contains("tessera::gemm") && Contains("bias_col") && Contains("overlaps C"));
  CHECK_THAT(message_of<shape_error>([&] {
               TestType::run(a.view, b.view, c.view, make_epilogue({}, epi::bias_row{col5}));
             }),
             Contains("bias_row") && Contains("overlaps C"));
  CHECK_THROWS_AS(TestType::run(a.view, b.view, c.view, make_epilogue({}, epi::residual{shifted})),
                  shape_error);
  CHECK(same());

  // The padding columns of C's allocation (pad 3) hold no element of C: a bias stored there
  // (column n + 1 of each stored row) is legal, and the result is A B + bias.
  const vec_view<fp32, mem> in_pad(c.view.data() + n + 1, dextents<1>(m), {c.view.stride(0)});
  std::vector<float> bias_vals(static_cast<std::size_t>(m));
  const auto hc = host_mirror_copy(c.storage);
  for (index_t i = 0; i < m; ++i)
    hc.data()[(in_pad.data() - c.storage.data()) + i * in_pad.stride(0)] =
        bias_vals[static_cast<std::size_t>(i)] = 0.25f * i;
  copy_from_host(c.storage, hc);
  REQUIRE_NOTHROW(TestType::run(a.view, b.view, c.view, make_epilogue({}, epi::bias_row{in_pad})));
  const auto ref = reference_plus(a.values, b.values, [&](index_t i, index_t) {
    return static_cast<double>(bias_vals[static_cast<std::size_t>(i)]);
  });
  CHECK(check_against_reference<fp32>(TestType::name() + " bias in C's padding", to_dmatrix(c.view),
                                      ref, k) == 0);
  CHECK(elements_of(in_pad) == bias_vals);
}

TEMPLATE_LIST_TEST_CASE("gemm accepts disjoint strided parts of one allocation and computes them "
                        "right",
                        "[gemm][safety]", main_configs) {
  // X (m, k + n): A = X[:, :k], C = X[:, k:]. Their byte ranges interleave row by row, but no
  // element is shared (refused before issue 12).
  using mem = memory_of<TestType>;
  const index_t m = 37, k = 40, n = 33;
  const auto x = make_matrix<fp32, mem>(m, k + n, {}, seed + 3);
  const strided_matrix_view<fp32, mem> a(x.view.data(), dextents<2>(m, k), {k + n, 1});
  const strided_matrix_view<fp32, mem> c(x.view.data() + k, dextents<2>(m, n), {k + n, 1});
  const auto b = make_matrix<bf16, mem>(k, n, {}, seed + 4);
  const dmatrix a_vals = to_dmatrix(a);
  REQUIRE_NOTHROW(TestType::run(a, b.view, c));
  CHECK(check_against_reference<fp32>(TestType::name() + " A | C halves", to_dmatrix(c),
                                      reference_gemm(a_vals, b.values), k) == 0);
  CHECK(to_dmatrix(a).v == a_vals.v); // A untouched

  // Interleaved rows: B = Y[0::2, :], C = Y[1::2, :] (k == m rows each), with A read through a
  // transpose; and a residual taken from the other parity of a third matrix's rows.
  const index_t r = 24, w = 30;
  const auto y = make_matrix<fp32, mem>(2 * r, w, {}, seed + 5);
  const strided_matrix_view<fp32, mem> b_even(y.view.data(), dextents<2>(r, w), {2 * w, 1});
  const strided_matrix_view<fp32, mem> c_odd(y.view.data() + w, dextents<2>(r, w), {2 * w, 1});
  const auto at = make_matrix<fp32, mem>(r, r, {true, 2, 1}, seed + 6);
  const dmatrix b_vals = to_dmatrix(b_even);
  REQUIRE_NOTHROW(TestType::run(at.view, b_even, c_odd));
  CHECK(check_against_reference<fp32>(TestType::name() + " interleaved rows", to_dmatrix(c_odd),
                                      reference_gemm(at.values, b_vals), r) == 0);
  // ...whereas C = Y[1:r+1, :] with B = Y[0:r, :] (contiguous, overlapping) is refused.
  const strided_matrix_view<fp32, mem> b_top(y.view.data(), dextents<2>(r, w), {w, 1});
  const strided_matrix_view<fp32, mem> c_shift(y.view.data() + w, dextents<2>(r, w), {w, 1});
  const auto y0 = snapshot(y);
  CHECK_THAT(message_of<shape_error>([&] { TestType::run(at.view, b_top, c_shift); }),
             Contains("C overlaps B"));
  CHECK(unchanged(y, y0));
}

TEMPLATE_LIST_TEST_CASE("gemm takes a C whose rows interleave without sharing an element",
                        "[gemm][safety]", main_configs) {
  // C (m, 3) with strides (5, 2): row i holds elements 5i, 5i + 2, 5i + 4, so rows interleave
  // (row 0 ends at 4, row 1 starts at 5) and every element has its own address. The strides are
  // not those of a packed matrix (5 < 3 * 2), which the check accepts because it is exact.
  using mem = memory_of<TestType>;
  const index_t m = 9, k = 11, n = 3;
  buffer<mem> buf("buf", 5 * m + 3);
  fill(buf, -7.f);
  const strided_matrix_view<fp32, mem> c(buf.data(), dextents<2>(m, n), {5, 2});
  const auto a = make_matrix<fp32, mem>(m, k, {}, seed + 11);
  const auto b = make_matrix<bf16, mem>(k, n, {}, seed + 12);
  REQUIRE_NOTHROW(TestType::run(a.view, b.view, c));
  CHECK(check_against_reference<fp32>(TestType::name() + " interleaved C", to_dmatrix(c),
                                      reference_gemm(a.values, b.values), k) == 0);
  // The elements between C's (offsets 1, 3 mod 5) are not C's: untouched.
  const auto hb = host_mirror_copy(buf);
  for (index_t s = 0; s < hb.size(); ++s) {
    const auto r = s % 5;
    if (r == 1 || r == 3 || s >= 5 * m) REQUIRE(hb.data()[s] == -7.f);
  }
  // Strides (2, 1) with 3 columns make rows share elements: refused, C untouched.
  buffer<mem> buf2("buf2", 2 * m + 3);
  fill(buf2, -7.f);
  const strided_matrix_view<fp32, mem> c_bad(buf2.data(), dextents<2>(m, n), {2, 1});
  CHECK_THAT(message_of<shape_error>([&] { TestType::run(a.view, b.view, c_bad); }),
             Contains("own address"));
  const auto hb2 = host_mirror_copy(buf2);
  for (index_t s = 0; s < hb2.size(); ++s) REQUIRE(hb2.data()[s] == -7.f);
}

TEMPLATE_LIST_TEST_CASE("gemm_batched: disjoint interleaved batches are legal, overlapping ones "
                        "and epilogue operands in C refused",
                        "[gemm][safety]", main_configs) {
  using mem = memory_of<TestType>;
  using tensor3 = Tensor<fp32, dextents<3>, layout_right, mem>;
  using strided3 = TensorView<fp32, dextents<3>, layout_stride, mem>;
  const index_t nb = 3, m = 5, k = 6, n = 4;
  // One buffer (nb, m, k + n): A[b] = buf[b, :, :k], C[b] = buf[b, :, k:].
  tensor3 buf("buf", nb, m, k + n), b("b", nb, k, n);
  fill_uniform(buf, seed + 7, -1.f, 1.f);
  fill_uniform(b, seed + 8, -1.f, 1.f);
  const strided3 a3(buf.data(), dextents<3>(nb, m, k), {m * (k + n), k + n, 1});
  const strided3 c3(buf.data() + k, dextents<3>(nb, m, n), {m * (k + n), k + n, 1});
  const std::vector<float> before = elements_of(buf.view()), bv = elements_of(b.view());
  REQUIRE_NOTHROW(TestType::run_batched(a3, b, c3));
  const std::vector<float> av = elements_of(a3), cv = elements_of(c3);
  const auto at = [&](const std::vector<float>& v, index_t i, index_t r, index_t c, index_t rows,
                      index_t cols) {
    return static_cast<double>(v[static_cast<std::size_t>((i * rows + r) * cols + c)]);
  };
  for (index_t i = 0; i < nb; ++i)
    for (index_t r = 0; r < m; ++r)
      for (index_t j = 0; j < n; ++j) {
        double want = 0;
        for (index_t p = 0; p < k; ++p) want += at(av, i, r, p, m, k) * at(bv, i, p, j, k, n);
        CHECK(at(cv, i, r, j, m, n) == Approx(want).margin(1e-5));
      }
  for (index_t i = 0; i < nb; ++i)
    for (index_t r = 0; r < m; ++r)
      for (index_t p = 0; p < k; ++p)
        REQUIRE(at(av, i, r, p, m, k) == at(before, i, r, p, m, k + n));

  // C's batches overlapping A's (C[b] = buf[b, :, k-1 : k-1+n]): refused, nothing written.
  const strided3 c_bad(buf.data() + k - 1, dextents<3>(nb, m, n), {m * (k + n), k + n, 1});
  const std::vector<float> mid = elements_of(buf.view());
  CHECK_THAT(message_of<shape_error>([&] { TestType::run_batched(a3, b, c_bad); }),
             Contains("tessera::gemm_batched"));
  // A residual that is C[0]'s memory: refused in every matrix.
  const strided_matrix_view<fp32, mem> r0(c3.data(), dextents<2>(m, n), {k + n, 1});
  CHECK_THAT(message_of<shape_error>(
                 [&] { TestType::run_batched(a3, b, c3, make_epilogue({}, epi::residual{r0})); }),
             Contains("tessera::gemm_batched") && Contains("residual"));
  CHECK(elements_of(buf.view()) == mid);
}

TEMPLATE_LIST_TEST_CASE("gemm refuses scales that are not positive, finite and normal, on A, B "
                        "and C",
                        "[gemm][safety]", main_configs) {
  using mem = memory_of<TestType>;
  const auto a = make_matrix<fp8_e4m3, mem>(6, 5, {}, seed + 9);
  const auto b = make_matrix<fp8_e5m2, mem>(5, 7, {true, 0, 1}, seed + 10);
  const auto c = make_matrix<fp32, mem>(6, 7, {}, seed + 11);
  const auto c8 = make_matrix<fp8_e4m3, mem>(6, 7, {}, seed + 12);
  const auto a0 = snapshot(a), b0 = snapshot(b), c0 = snapshot(c), c80 = snapshot(c8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm = std::numeric_limits<float>::denorm_min() * 1000;
  for (const float s : {0.f, -0.f, -1.f, nan, inf, -inf, denorm}) {
    INFO("scale " << s);
    CHECK_THAT(message_of<value_error>([&] { TestType::run(scaled(a.view, s), b.view, c.view); }),
               Contains("tessera::gemm") && Contains("scale of A"));
    CHECK_THAT(message_of<value_error>([&] { TestType::run(a.view, scaled(b.view, s), c.view); }),
               Contains("tessera::gemm") && Contains("scale of B"));
    CHECK_THAT(message_of<value_error>(
                   [&] { TestType::run(scaled(a.view, 2.f), b.view, scaled(c8.view, s)); }),
               Contains("tessera::gemm") && Contains("scale of C"));
    // gemm_batched: one rank-3 view of each.
    using v3 = TensorView<fp8_e4m3, dextents<3>, layout_stride, mem>;
    using c3 = TensorView<fp32, dextents<3>, layout_stride, mem>;
    const v3 a3(a.view.data(), dextents<3>(1, 6, 5), {30, a.view.stride(0), a.view.stride(1)});
    const TensorView<fp8_e5m2, dextents<3>, layout_stride, mem> b3(
        b.view.data(), dextents<3>(1, 5, 7), {0, b.view.stride(0), b.view.stride(1)});
    const c3 cc(c.view.data(), dextents<3>(1, 6, 7), {42, c.view.stride(0), c.view.stride(1)});
    CHECK_THAT(message_of<value_error>([&] { TestType::run_batched(scaled(a3, s), b3, cc); }),
               Contains("tessera::gemm_batched") && Contains("scale of A"));
  }
  CHECK(unchanged(a, a0));
  CHECK(unchanged(b, b0));
  CHECK(unchanged(c, c0));
  CHECK(unchanged(c8, c80));
  // The extremes of the valid range pass.
  CHECK_NOTHROW(TestType::run(scaled(a.view, std::numeric_limits<float>::min()), b.view, c.view));
  CHECK_NOTHROW(TestType::run(scaled(a.view, std::numeric_limits<float>::max()), b.view, c.view));
}
