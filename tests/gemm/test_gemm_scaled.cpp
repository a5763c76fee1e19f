// tessera::gemm with scaled operands: fp8 inputs carrying a per-tensor scale (scaled_tensor from
// quantize, or tessera::scaled(view, s) on strided and transposed views) and scaled fp8 outputs
// with the amax gemm returns; plus a plain fp8 C (scale 1).
//
// Inputs are compared against the reference on the dequantised values payload / scale (exact in
// double), so the kernel's only extra roundings are folding 1 / scale into alpha, counted in
// tests/support/tolerance.hpp's gamma_{K+5}.
// A scaled output stores payload = saturate(round_P(v * s)) for the fp32 value v: with e_v the
// accumulation bound on v (tolerance.hpp), fl(v * s) is within e_x = s e_v + u_fp32 (|v s| +
// s e_v) of v s, and the payload within store_bound<P>(v s, e_x) of saturate(v s) (saturation
// is 1-Lipschitz, so it only shrinks the difference). The amax returned is max |v| over C,
// within max e_v of the exact one.
// Each test runs on main_configs: every enabled space, the operands in its memory.
#include "gemm_testing.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr std::uint64_t base_seed = 0x5ca1ed;

/// Dequantised values: payload / scale for every element.
dmatrix dequantised(const dmatrix& payload, double scale) {
  dmatrix d = payload;
  for (auto& x : d.v) x /= scale;
  return d;
}

/// Checks a scaled output (payload of precision P, scale s) against the reference and the amax
/// gemm returned (see the file comment). Returns the number of misses.
template <Precision P>
index_t check_scaled_output(const std::string& what, const dmatrix& payload, double s,
                            const gemm_reference& ref, index_t k, float amax) {
  index_t bad = 0;
  double want_amax = 0, amax_tol = 0;
  const double u = precision_traits<fp32>::unit_roundoff;
  for (index_t i = 0; i < payload.rows; ++i)
    for (index_t j = 0; j < payload.cols; ++j) {
      const double v = ref.value(i, j);
      const double e_v = fp32_accumulation_bound(ref.abs(i, j), gemm_rounding_steps(k));
      const double x = v * s, e_x = s * e_v + u * (std::abs(x) + s * e_v);
      const double want = saturated<P>(x), tol = store_bound<P>(x, e_x);
      if (!(std::abs(payload(i, j) - want) <= tol)) {
        if (bad < 5)
          UNSCOPED_INFO(what << ": payload(" << i << ", " << j << ") = " << payload(i, j)
                             << ", want " << want << " (value " << v << " x scale " << s
                             << "), bound " << tol);
        ++bad;
      }
      if (std::abs(v) > want_amax) want_amax = std::abs(v);
      amax_tol = std::max(amax_tol, e_v);
    }
  if (!(std::abs(amax - want_amax) <= amax_tol)) {
    UNSCOPED_INFO(what << ": amax " << amax << ", want " << want_amax << " within " << amax_tol);
    ++bad;
  }
  return bad;
}
} // namespace

TEMPLATE_LIST_TEST_CASE("gemm scaled: fp8 inputs with scales into fp32 and bf16 C",
                        "[gemm][scaled]", main_configs) {
  // (M, N, K): below and above automatic's direct threshold (64), and a long K.
  using mem = memory_of<TestType>;
  const index_t shapes[][3] = {{17, 33, 65}, {130, 129, 257}, {64, 80, 1000}};
  std::uint64_t seed = base_seed;
  for (const auto& s : shapes) {
    const index_t m = s[0], n = s[1], k = s[2];
    INFO(TestType::name() << ": M " << m << ", N " << n << ", K " << k << ", seed " << seed);
    // A: scaled_tensor from quantize (x in [-300, 300), so the scale is about 448 / 300).
    Tensor<fp32, dextents<2>, layout_right, mem> x("x", m, k);
    fill_uniform(x, ++seed, -300.f, 300.f);
    const auto aq = quantize<fp8_e4m3>(typename TestType::exec_space{}, x);
    const dmatrix a_deq = dequantised(to_dmatrix(aq.data), aq.scale);
    // B: an e5m2 payload stored transposed with a padded leading dimension, scale 1 / 8.
    const auto bp = make_matrix<fp8_e5m2, mem>(k, n, {true, 3, 1}, ++seed, -2000.f, 2000.f);
    const float b_scale = 0.125f;
    const dmatrix b_deq = dequantised(bp.values, b_scale);

    const auto c = make_matrix<fp32, mem>(m, n, {false, 2, 0}, ++seed, -1.f, 1.f);
    const auto ref = reference_gemm(a_deq, b_deq, 0.5, 1.0, c.values);
    const float amax = TestType::run(aq, scaled(bp.view, b_scale), c.view,
                                     gemm_options{.alpha = 0.5f, .beta = 1.f});
    CHECK(check_against_reference<fp32>(TestType::name() + " e4m3 (scaled_tensor) x e5m2 "
                                                           "(scaled view) -> fp32",
                                        to_dmatrix(c.view), ref, k) == 0);
    CHECK(amax == 0.f); // only a scaled C reports an amax

    // bf16 C, B scaled e4m3 x A bf16 scaled by 4 (scaled() takes any precision).
    const auto a16 = make_matrix<bf16, mem>(m, k, {true, 0, 0}, ++seed, -1.f, 1.f);
    const auto b8 = make_matrix<fp8_e4m3, mem>(k, n, {}, ++seed, -448.f, 448.f);
    const auto c16 = make_matrix<bf16, mem>(m, n, {}, ++seed, -1.f, 1.f, true);
    const auto ref16 = reference_gemm(dequantised(a16.values, 4.0), dequantised(b8.values, 300.0));
    TestType::run(scaled(a16.view, 4.f), scaled(b8.view, 300.f), c16.view);
    CHECK(check_against_reference<bf16>(TestType::name() + " bf16 (scale 4) x e4m3 (scale 300) "
                                                           "-> bf16",
                                        to_dmatrix(c16.view), ref16, k) == 0);
  }
}

TEMPLATE_LIST_TEST_CASE("gemm scaled: fp8 output with scale, saturation and amax", "[gemm][scaled]",
                        main_configs) {
  using mem = memory_of<TestType>;
  const index_t shapes[][3] = {{33, 17, 63}, {129, 130, 255}};
  std::uint64_t seed = base_seed + 100;
  const auto run = [&]<class PC>(PC, index_t m, index_t n, index_t k, float beta, bool saturating) {
    const auto a = make_matrix<bf16, mem>(m, k, {}, ++seed, -1.f, 1.f);
    const auto b = make_matrix<fp8_e4m3, mem>(k, n, {true, 1, 0}, ++seed, -1.f, 1.f);
    const auto c = make_matrix<PC, mem>(m, n, {false, 4, 2}, ++seed, -100.f, 100.f, beta == 0.f);
    // The scale maps the expected amax (about 3 sqrt(K / 9), uniform inputs) to 1/8 of the
    // format's range, or (saturating) to 4x past it so that the largest values saturate.
    const double expected_amax = 3.0 * std::sqrt(static_cast<double>(k) / 9.0);
    const float s = static_cast<float>(precision_traits<PC>::max_finite / expected_amax *
                                       (saturating ? 4.0 : 0.125));
    const auto c0 = snapshot(c);
    const auto ref = reference_gemm(a.values, b.values, 1.0, beta, dequantised(c.values, s));
    const float amax =
        TestType::run(a.view, b.view, scaled(c.view, s), gemm_options{.alpha = 1.f, .beta = beta});
    std::ostringstream what;
    what << TestType::name() << " bf16 x e4m3 -> scaled " << precision_traits<PC>::name << ": M "
         << m << ", N " << n << ", K " << k << ", beta " << beta << ", scale " << s;
    CHECK(check_scaled_output<PC>(what.str(), to_dmatrix(c.view), s, ref, k, amax) == 0);
    CHECK(changed_outside(c, c0) == 0);
  };
  for (const auto& sh : shapes)
    for (const bool saturating : {false, true}) {
      run(fp8_e4m3{}, sh[0], sh[1], sh[2], 0.f, saturating);
      run(fp8_e5m2{}, sh[0], sh[1], sh[2], 0.5f, saturating);
    }
}

TEMPLATE_LIST_TEST_CASE("gemm scaled: plain fp8 C is scale 1", "[gemm][scaled]", main_configs) {
  // Values within both formats' ranges; each output rounded once to fp8 (store_bound).
  using mem = memory_of<TestType>;
  std::uint64_t seed = base_seed + 200;
  const auto run = [&]<class PC>(PC) {
    const index_t m = 70, n = 65, k = 129;
    const auto a = make_matrix<fp32, mem>(m, k, {}, ++seed, -1.f, 1.f);
    const auto b = make_matrix<fp8_e5m2, mem>(k, n, {}, ++seed, -1.f, 1.f);
    const auto c = make_matrix<PC, mem>(m, n, {}, ++seed, -1.f, 1.f, true);
    TestType::run(a.view, b.view, c.view);
    CHECK(check_against_reference<PC>(
              TestType::name() + " fp32 x e5m2 -> plain " + precision_traits<PC>::name,
              to_dmatrix(c.view), reference_gemm(a.values, b.values), k) == 0);
  };
  run(fp8_e4m3{});
  run(fp8_e5m2{});
}
