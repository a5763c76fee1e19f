// Random fills (reproducibility across execution spaces and thread counts, statistics) and fp8
// quantization (scale choice, error bounds derived from the format's unit roundoff).
#include "tensor_testing.hpp"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

template <class P, class Exec>
using vec = Tensor<P, dextents<1>, layout_right, typename Exec::memory_space>;

// Statistical checks use 6-sigma bounds: for a correct generator a deviation that large has
// probability about 2e-9 per check, so a failure means a biased generator, not bad luck. The
// seeds are fixed, so every run checks the same numbers.
constexpr double sigmas = 6.0;

struct moments {
  double mean = 0, var = 0, third = 0; // mean, variance, third central moment
};
template <class H>
moments moments_of(const H& h) {
  const auto n = static_cast<double>(h.size());
  moments m;
  for (index_t i = 0; i < h.size(); ++i) m.mean += to_float(h.data()[i]);
  m.mean /= n;
  for (index_t i = 0; i < h.size(); ++i) {
    const double d = to_float(h.data()[i]) - m.mean;
    m.var += d * d;
    m.third += d * d * d;
  }
  m.var /= n;
  m.third /= n;
  return m;
}

} // namespace

#if defined(KOKKOS_ENABLE_SERIAL)
TEST_CASE(
    "random fills give the same bits on Serial, the threaded host space and a device space, for "
    "any size and shape",
    "[tensor][random]") {
  using par = threaded_host_space; // OpenMP, Threads or HPX (Serial when it is the only one)
  INFO(par::name() << " threads: " << par().concurrency());
  if (par().concurrency() < 2)
    WARN(par::name() << " runs one thread: Serial vs it does not vary the thread count here");
  for_each_type(all_precisions, [&]<class P>() {
    INFO(precision_traits<P>::name);
    for (const index_t n : {index_t{1}, index_t{31}, index_t{10007}, index_t{262147}}) {
      INFO("n = " << n);
      vec<P, Kokkos::Serial> s("s", n), s2("s2", n);
      vec<P, par> o("o", n), o2("o2", n);
      fill_uniform(Kokkos::Serial{}, s, 42, -3.f, 5.f);
      fill_uniform(par{}, o, 42, -3.f, 5.f);
      REQUIRE(first_bitwise_difference(s, o) == -1);
      fill_normal(Kokkos::Serial{}, s2, 42, 1.f, 2.f);
      fill_normal(par{}, o2, 42, 1.f, 2.f);
      REQUIRE(first_bitwise_difference(s2, o2) == -1);

      // The device space (in a device build) gives the same bits as Serial.
      if constexpr (!is_host_execution_space_v<Kokkos::DefaultExecutionSpace>) {
        vec<P, Kokkos::DefaultExecutionSpace> d("d", n), d2("d2", n);
        fill_uniform(Kokkos::DefaultExecutionSpace{}, d, 42, -3.f, 5.f);
        REQUIRE(first_bitwise_difference(to_host(d), s) == -1);
        fill_normal(Kokkos::DefaultExecutionSpace{}, d2, 42, 1.f, 2.f);
        REQUIRE(first_bitwise_difference(to_host(d2), s2) == -1);
      }

      // A longer tensor is split differently among threads; its first n elements are the same.
      vec<P, par> longer("longer", 2 * n + 5);
      fill_uniform(par{}, longer, 42, -3.f, 5.f);
      for (index_t i = 0; i < n; ++i) REQUIRE(bits_of(longer.data()[i]) == bits_of(s.data()[i]));
    }
    // Element i depends on (seed, i) only, not on the shape: a (7, 11, 13) tensor holds the same
    // sequence as a flat one of 1001 elements.
    Tensor<P, extents<7, 11, 13>, layout_right, Kokkos::HostSpace> cube("cube");
    vec<P, Kokkos::Serial> flat("flat", 1001);
    fill_normal(cube, 9);
    fill_normal(Kokkos::Serial{}, flat, 9, 0.f, 1.f);
    REQUIRE(first_bitwise_difference(cube, flat) == -1);
  });
}
#endif

TEMPLATE_LIST_TEST_CASE("random fills: different seeds give different tensors and low precision is "
                        "the fp32 fill rounded",
                        "[tensor][random]", enabled_exec_spaces) {
  using exec = TestType;
  INFO("execution space " << exec::name());
  constexpr index_t n = 4099;
  vec<fp32, exec> da("a", n), db("b", n), du32("u32", n), dg32("g32", n);
  fill_uniform(exec{}, da, 1, 0.f, 1.f);
  fill_uniform(exec{}, db, 2, 0.f, 1.f);
  const auto a = to_host(da), b = to_host(db);
  index_t same = 0;
  for (index_t i = 0; i < n; ++i) same += a.data()[i] == b.data()[i];
  // Two independent 24-bit uniforms collide with probability 2^-24 each.
  CHECK(same <= 2);

  fill_uniform(exec{}, du32, 5, -2.f, 6.f);
  fill_normal(exec{}, dg32, 5, 0.5f, 3.f);
  const auto u32 = to_host(du32), g32 = to_host(dg32);
  for_each_type(all_precisions, [&]<class P>() {
    INFO(precision_traits<P>::name);
    vec<P, exec> du("u", n), dg("g", n);
    fill_uniform(exec{}, du, 5, -2.f, 6.f);
    fill_normal(exec{}, dg, 5, 0.5f, 3.f);
    const auto u = to_host(du), g = to_host(dg);
    for (index_t i = 0; i < n; ++i) {
      REQUIRE(bits_of(u.data()[i]) == bits_of(from_float<P>(u32.data()[i])));
      REQUIRE(bits_of(g.data()[i]) == bits_of(from_float<P>(g32.data()[i])));
    }
  });
}

TEST_CASE("fill_uniform: range, mean, variance and histogram match the uniform distribution",
          "[tensor][random][statistics]") {
  constexpr index_t n = index_t{1} << 20;
  const double nd = static_cast<double>(n);
  for (const auto& [lo, hi] :
       {std::pair{0.f, 1.f}, std::pair{-3.f, 5.f}, std::pair{100.f, 101.f}}) {
    INFO("U[" << lo << ", " << hi << ")");
    Tensor<fp32, dextents<1>> t("t", n);
    fill_uniform(t, 2024, lo, hi);
    const auto h = to_host(t);
    const double w = static_cast<double>(hi) - lo;
    // hi itself is reachable only by the float rounding of lo + (hi - lo) * u (see ops.hpp).
    constexpr int bins = 16;
    std::vector<double> count(bins, 0.0);
    for (index_t i = 0; i < n; ++i) {
      const float x = h.data()[i];
      REQUIRE(x >= lo);
      REQUIRE(x <= hi);
      const int b = static_cast<int>((x - lo) / w * bins);
      count[b < bins ? b : bins - 1] += 1;
    }
    const auto m = moments_of(h);
    // Mean of n uniforms: sd w / sqrt(12 n). Sample variance: Var = (mu4 - sigma^4) / n with
    // mu4 = w^4 / 80 and sigma^4 = w^4 / 144.
    CHECK(std::fabs(m.mean - (lo + hi) / 2.0) <= sigmas * w / std::sqrt(12 * nd));
    CHECK(std::fabs(m.var - w * w / 12) <=
          sigmas * w * w * std::sqrt(1.0 / 80 - 1.0 / 144) / std::sqrt(nd));
    // Each bin count is binomial(n, 1/16).
    const double p = 1.0 / bins;
    for (int b = 0; b < bins; ++b) {
      INFO("bin " << b);
      CHECK(std::fabs(count[b] - nd * p) <= sigmas * std::sqrt(nd * p * (1 - p)));
    }
  }
}

TEST_CASE("fill_normal: mean, variance, skewness and the one- and two-sigma masses match "
          "N(mean, stddev^2)",
          "[tensor][random][statistics]") {
  constexpr index_t n = index_t{1} << 20;
  const double nd = static_cast<double>(n);
  for (const auto& [mu, sd] : {std::pair{0.f, 1.f}, std::pair{-4.f, 0.25f}, std::pair{3.f, 10.f}}) {
    INFO("N(" << mu << ", " << sd << "^2)");
    Tensor<fp32, dextents<1>> t("t", n);
    fill_normal(t, 77, mu, sd);
    const auto h = to_host(t);
    const auto m = moments_of(h);
    const double s2 = static_cast<double>(sd) * sd;
    // Standard errors for normal samples: mean sd/sqrt(n); variance sd^2 sqrt(2/n); third
    // central moment sd^3 sqrt(15/n) (E z^6 = 15).
    CHECK(std::fabs(m.mean - mu) <= sigmas * sd / std::sqrt(nd));
    CHECK(std::fabs(m.var - s2) <= sigmas * s2 * std::sqrt(2 / nd));
    CHECK(std::fabs(m.third) <= sigmas * s2 * sd * std::sqrt(15 / nd));
    // P(|z| < 1) = erf(1/sqrt 2), P(|z| > 2) = erfc(sqrt 2); counts are binomial.
    const double p1 = std::erf(1 / std::sqrt(2.0)), p2 = std::erfc(std::sqrt(2.0));
    double in1 = 0, out2 = 0;
    for (index_t i = 0; i < n; ++i) {
      const double z = (h.data()[i] - static_cast<double>(mu)) / sd;
      REQUIRE(std::isfinite(z));
      in1 += std::fabs(z) < 1;
      out2 += std::fabs(z) > 2;
    }
    CHECK(std::fabs(in1 - nd * p1) <= sigmas * std::sqrt(nd * p1 * (1 - p1)));
    CHECK(std::fabs(out2 - nd * p2) <= sigmas * std::sqrt(nd * p2 * (1 - p2)));
  }
}

TEST_CASE("scale_for_amax maps amax to max_finite / 2^margin and keeps the previous scale "
          "when amax carries no information",
          "[tensor][quantize]") {
  constexpr float max = precision_traits<fp8_e4m3>::max_finite;
  CHECK(scale_for_amax<fp8_e4m3>(2.f) == max / 2.f);
  CHECK(scale_for_amax<fp8_e4m3>(2.f, 3) == max / 16.f);
  CHECK(scale_for_amax<fp8_e5m2>(57344.f) == 1.f);
  for (const float bad :
       {0.f, -1.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min()}) { // 448 / denorm_min = inf
    INFO("amax " << bad);
    CHECK(scale_for_amax<fp8_e4m3>(bad, 0, 0.5f) == 0.5f);
  }
}

TEMPLATE_LIST_TEST_CASE("quantize / dequantize: scale from amax and error within the fp8 unit "
                        "roundoff",
                        "[tensor][quantize]", enabled_exec_spaces) {
  using exec = TestType;
  INFO("execution space " << exec::name());
  constexpr index_t n = 10007;
  for_each_type(fp8_precisions, [&]<class P>() {
    using traits = precision_traits<P>;
    INFO(traits::name);
    for (const float sd : {1e-3f, 1.f, 1e3f}) {
      for (const int margin : {0, 1, 3}) {
        INFO("normal data, stddev " << sd << ", margin " << margin);
        vec<fp32, exec> x("x", n);
        fill_normal(exec{}, x, 11, 0.f, sd);
        const auto hx = to_host(x);
        float ax = 0.f;
        index_t arg = 0;
        for (index_t i = 0; i < n; ++i)
          if (std::fabs(hx.data()[i]) > ax) ax = std::fabs(hx.data()[i]), arg = i;

        const auto q = quantize<P>(exec{}, x, margin);
        static_assert(std::is_same_v<typename decltype(q)::precision, P>);
        // The scale is max_finite / amax / 2^margin up to two float roundings (2^-24 each).
        const double want = traits::max_finite / static_cast<double>(ax) / std::ldexp(1.0, margin);
        REQUIRE(std::fabs(q.scale - want) <= 0x1.0p-23 * want);

        const auto hq = to_host(q.data);
        // The largest magnitude lands exactly on max_finite / 2^margin (a value of the format),
        // and nothing exceeds it.
        REQUIRE(std::fabs(to_float(hq.data()[arg])) == std::ldexp(traits::max_finite, -margin));
        for (index_t i = 0; i < n; ++i)
          REQUIRE(std::fabs(to_float(hq.data()[i])) <= std::ldexp(traits::max_finite, -margin));

        // payload = RNE(x s) has |payload - x s| <= u |x s| in the normal range and
        // <= min_subnormal / 2 below it (u = 2^-(mantissa bits + 1)). Dividing by s and adding
        // the fp32 roundings of x * s, 1 / s and payload * (1 / s) (each 2^-24 relative) gives
        // |dequant - x| <= (u + 2^-21) |x| + min_subnormal / s, with room to spare in the last
        // two terms.
        const auto hy = to_host(dequantize(exec{}, q));
        REQUIRE(hy.size() == n);
        const double u = traits::unit_roundoff;
        for (index_t i = 0; i < n; ++i) {
          const double xi = hx.data()[i], yi = hy.data()[i];
          const double bound = (u + 0x1.0p-21) * std::fabs(xi) + traits::min_subnormal / q.scale;
          INFO("element " << i << ": x = " << xi << ", dequantized " << yi);
          REQUIRE(std::fabs(yi - xi) <= bound);
        }
      }
    }

    // A bf16 source quantizes like its float values.
    vec<bf16, exec> xb("xb", n);
    fill_uniform(exec{}, xb, 3, -20.f, 7.f);
    const auto qb = quantize<P>(exec{}, xb);
    REQUIRE(qb.scale == scale_for_amax<P>(amax(exec{}, xb)));
    const auto hb = to_host(xb);
    const auto hqb = to_host(qb.data);
    for (index_t i = 0; i < n; ++i)
      REQUIRE(bits_of(hqb.data()[i]) ==
              bits_of(from_float<P, saturate>(to_float(hb.data()[i]) * qb.scale)));

    // All zeros: no information, scale stays 1, payload and result are zeros.
    vec<fp32, exec> z("z", 5);
    const auto qz = quantize<P>(exec{}, z);
    REQUIRE(qz.scale == 1.f);
    const auto hz = to_host(dequantize(exec{}, qz));
    for (index_t i = 0; i < 5; ++i) REQUIRE(hz.data()[i] == 0.f);

    // A NaN element: amax is NaN, the scale stays 1, the NaN stays NaN and finite values
    // saturate to max_finite.
    Tensor<fp32, dextents<1>, layout_right, Kokkos::HostSpace> hn("hn", 3);
    hn.data()[0] = std::numeric_limits<float>::quiet_NaN();
    hn.data()[1] = 1e30f;
    hn.data()[2] = -0.5f;
    vec<fp32, exec> xn("xn", 3);
    deep_copy(xn, hn);
    const auto qn = quantize<P>(exec{}, xn);
    REQUIRE(qn.scale == 1.f);
    const auto hyn = to_host(dequantize(exec{}, qn));
    REQUIRE(std::isnan(hyn.data()[0]));
    REQUIRE(hyn.data()[1] == traits::max_finite);
    REQUIRE(hyn.data()[2] == -0.5f);
  });
}

TEMPLATE_LIST_TEST_CASE("quantize_with_scale and amax give the scalar rule's bits for every bf16 "
                        "code and for random fp32 bit patterns, at any length",
                        "[tensor][quantize]", enabled_exec_spaces) {
  // On host spaces both run vectorised in chunks; the reference here is the scalar rule
  // payload = from_float<P, saturate>(to_float(x) * scale), amax = max of |x|'s bit pattern.
  using exec = TestType;
  INFO("execution space " << exec::name());
  std::uint64_t state = 2026;
  const auto next = [&state] {
    state += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const auto check = [&]<class P, class S>(const std::vector<S>& src, float scale) {
    const auto n = static_cast<index_t>(src.size());
    INFO("n = " << n << ", scale " << scale);
    using src_p = precision_of_t<S>;
    Tensor<src_p, dextents<1>, layout_right, Kokkos::HostSpace> h("h", n);
    for (index_t i = 0; i < n; ++i) h.data()[i] = src[static_cast<std::size_t>(i)];
    vec<src_p, exec> x("x", n);
    deep_copy(x, h);
    vec<P, exec> q("q", n);
    const float seen = quantize_with_scale(exec{}, x, q, scale);
    const float whole = amax(exec{}, x);
    std::uint32_t want = 0;
    for (const S v : src) {
      const std::uint32_t a = bits_of(to_float(v)) & 0x7fffffffu;
      want = a > want ? a : want;
    }
    REQUIRE(bits_of(seen) == want);
    REQUIRE(bits_of(whole) == want);
    const auto hq = to_host(q);
    for (index_t i = 0; i < n; ++i) {
      const auto expected = from_float<P, saturate>(to_float(h.data()[i]) * scale);
      INFO("element " << i << " bits " << bits_of(h.data()[i]));
      REQUIRE(bits_of(hq.data()[i]) == bits_of(expected));
    }
  };
  for_each_type(fp8_precisions, [&]<class P>() {
    INFO(precision_traits<P>::name);
    // Every bf16 code (NaNs, infinities, subnormals, both zeros), shifted by an odd offset so
    // that the chunks and batches cut the codes differently; scales that keep, shrink into the
    // subnormals and overflow into saturation.
    std::vector<bfloat16> codes(65536 + 37);
    for (std::size_t i = 0; i < codes.size(); ++i)
      codes[i] = bfloat16::from_bits(static_cast<std::uint16_t>((i * 40503u + 11u) & 0xffffu));
    for (const float scale : {1.f, 0x1p-10f, 448.f / 3.f, 1e30f, 0x1p-120f})
      check.template operator()<P>(codes, scale);
    // Random fp32 bit patterns (every class) at lengths around a batch, a chunk and beyond.
    for (const std::size_t n : {std::size_t{1}, std::size_t{31}, std::size_t{32}, std::size_t{33},
                                std::size_t{16384 + 17}, std::size_t{100003}}) {
      std::vector<float> f(n);
      for (auto& v : f) {
        const auto r = next();
        // Half arbitrary patterns, half values near the format's range, so that rounding and
        // saturation are exercised as often as the special classes.
        v = (r & 1) ? std::bit_cast<float>(static_cast<std::uint32_t>(r >> 32))
                    : static_cast<float>(static_cast<std::int32_t>(r >> 32)) * 0x1p-22f;
      }
      check.template operator()<P>(f, 1.f);
      check.template operator()<P>(f, 0.37f);
    }
  });
}
