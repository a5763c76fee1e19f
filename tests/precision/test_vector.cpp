// Vector conversions (convert_n) against the scalar ones, fast: random and special inputs for
// every pair of storage types and both overflow policies, over lengths and offsets that cover
// the vector body, the scalar tail and unaligned pointers; and hand-derived rounding edge cases
// (ties, subnormal boundaries, max finite boundaries, -0), checked on both paths.
#include <tessera/precision.hpp>
#include <tessera/precision/vector_convert.hpp> // convert_n

#include <tessera/gemm/detail/amx.hpp> // hostgemm::load_bf16

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using tessera::overflow_to_inf_nan;
using tessera::saturate;

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <class S>
S storage_from_float(float f) {
  if constexpr (std::is_same_v<S, float>)
    return f;
  else
    return tessera::from_float<tessera::precision_of_t<S>, overflow_to_inf_nan>(f);
}

// Floats that exercise every format: specials, each format's extremes and their float
// neighbours, midpoints, float subnormals, and random bit patterns / values in each range.
std::vector<float> interesting_floats(std::mt19937& rng, std::size_t n_random) {
  std::vector<float> v;
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.f,
                  1.f,
                  inf,
                  std::numeric_limits<float>::quiet_NaN(),
                  from_bits(0x7f800001u) /* signalling NaN */,
                  from_bits(0x7fbfffffu),
                  std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(),
                  from_bits(0x00008000u),
                  from_bits(0x00018000u),
                  448.f,
                  464.f,
                  480.f,
                  57344.f,
                  61440.f,
                  65536.f,
                  std::ldexp(1.f, -6),
                  std::ldexp(1.f, -9),
                  std::ldexp(1.f, -10),
                  std::ldexp(1.f, -14),
                  std::ldexp(1.f, -16),
                  std::ldexp(1.f, -17),
                  from_bits(0x7f7f8000u),
                  from_bits(0x7f7f7fffu),
                  1.0625f,
                  1.125f,
                  1.1875f,
                  65504.f,                  // fp16 max finite
                  65520.f,                  // fp16: tie between max finite and 2^16
                  std::ldexp(1.f, -24),     // fp16 smallest subnormal
                  std::ldexp(1.f, -25),     // half of it
                  std::ldexp(1023.5f, -24), // fp16: tie between max subnormal and min normal
                  1.f + std::ldexp(1.f, -11)}) {
    for (float s : {x, -x}) {
      v.push_back(s);
      v.push_back(std::nextafter(s, inf));
      v.push_back(std::nextafter(s, -inf));
    }
  }
  std::uniform_int_distribution<std::uint32_t> bits;
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  for (std::size_t i = 0; i < n_random; ++i) {
    v.push_back(from_bits(bits(rng)));
    v.push_back(unit(rng) * 600.f);                // around e4m3's range
    v.push_back(unit(rng) * 70000.f);              // around e5m2's range
    v.push_back(unit(rng) * std::ldexp(1.f, -13)); // fp8 subnormals
    v.push_back(unit(rng) * std::ldexp(1.f, -14)); // fp16 subnormals
  }
  return v;
}

template <class To, class Policy, class From>
void check_vector_equals_scalar(const std::vector<From>& src) {
  using S = tessera::storage_t<To>;
  // Lengths around multiples of the batch size (16 lanes x 2 on AVX-512) and a long one;
  // offsets make src and dst unaligned.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{31},
                        std::size_t{32}, std::size_t{33}, std::size_t{97}, src.size() - 3}) {
    for (std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      if (n + off > src.size()) continue;
      std::vector<S> vec(n + off + 1), sentinel(1);
      std::memset(vec.data(), 0x5a, vec.size() * sizeof(S));
      std::memset(sentinel.data(), 0x5a, sizeof(S));
      tessera::convert_n<To, Policy>(src.data() + off, vec.data() + off, n);
      std::size_t bad = 0, first = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const S s = tessera::convert<To, Policy>(src[off + i]);
        if (std::memcmp(&s, &vec[off + i], sizeof s) != 0 && bad++ == 0) first = off + i;
      }
      INFO(tessera::precision_traits<To>::name << " n=" << n << " offset=" << off
                                               << ", first mismatch at " << first);
      CHECK(bad == 0);
      CHECK(std::memcmp(&vec[off + n], &sentinel[0], sizeof(S)) == 0); // nothing written past n
      // The portable codec (no F16C) gives the same bits.
      std::vector<S> port(n + off + 1);
      tessera::detail::convert_n_impl<To, Policy, false>(src.data() + off, port.data() + off, n);
      CHECK(std::memcmp(port.data() + off, vec.data() + off, n * sizeof(S)) == 0);
    }
  }
}

// f.template operator()<To, Policy>() for every narrow target (bf16, fp16, e4m3, e5m2) and
// both overflow policies.
template <class F>
void for_each_narrow_target(const F& f) {
  using namespace tessera;
  f.template operator()<bf16, overflow_to_inf_nan>();
  f.template operator()<bf16, saturate>();
  f.template operator()<fp16, overflow_to_inf_nan>();
  f.template operator()<fp16, saturate>();
  f.template operator()<fp8_e4m3, overflow_to_inf_nan>();
  f.template operator()<fp8_e4m3, saturate>();
  f.template operator()<fp8_e5m2, overflow_to_inf_nan>();
  f.template operator()<fp8_e5m2, saturate>();
}

template <class From>
void check_all_targets(const std::vector<From>& src) {
  check_vector_equals_scalar<tessera::fp32, overflow_to_inf_nan>(src);
  for_each_narrow_target(
      [&]<class To, class Policy>() { check_vector_equals_scalar<To, Policy>(src); });
}

} // namespace

TEMPLATE_TEST_CASE("convert_n equals the scalar conversion for every target and policy",
                   "[precision][vector]", float, tessera::bfloat16, tessera::float16,
                   tessera::float8_e4m3, tessera::float8_e5m2) {
  std::mt19937 rng(20261122);
  const auto floats = interesting_floats(rng, 2000);
  std::vector<TestType> src;
  for (float f : floats) src.push_back(storage_from_float<TestType>(f));
  if constexpr (sizeof(TestType) < 4) {
    // Every code of the source format, too.
    for (std::uint32_t c = 0; c < (1u << (8 * sizeof(TestType))); ++c) {
      TestType t;
      t.bits = static_cast<decltype(t.bits)>(c);
      src.push_back(t);
    }
  }
  check_all_targets(src);
}

namespace {

struct edge_case {
  std::uint32_t input;      // float bit pattern
  std::uint32_t saturating; // expected code under saturate
  std::uint32_t inf_nan;    // expected code under overflow_to_inf_nan
  const char* why;
};

template <class To>
void check_edge_cases(std::initializer_list<edge_case> cases) {
  using S = tessera::storage_t<To>;
  // 40 copies: the vector body (32 lanes on AVX-512) and the scalar tail both see the input.
  constexpr std::size_t copies = 40;
  for (const auto& c : cases) {
    INFO(tessera::precision_traits<To>::name << " input 0x" << std::hex << c.input << ": "
                                             << c.why);
    const float f = from_bits(c.input);
    CHECK(S::template from_float<saturate>(f).bits == c.saturating);
    CHECK(S::template from_float<overflow_to_inf_nan>(f).bits == c.inf_nan);
    std::vector<float> in(copies, f);
    std::vector<S> sat(copies), inf(copies);
    tessera::convert_n<To, saturate>(in.data(), sat.data(), copies);
    tessera::convert_n<To, overflow_to_inf_nan>(in.data(), inf.data(), copies);
    for (std::size_t i = 0; i < copies; ++i) {
      CHECK(sat[i].bits == c.saturating);
      CHECK(inf[i].bits == c.inf_nan);
    }
  }
}

} // namespace

// Expected codes follow from the formats' definitions: e4m3 1.0 = 0.0111.000 (0x38), e5m2 1.0 =
// 0.01111.00 (0x3c), bf16 1.0 = 0x3f80, fp16 1.0 = 0.01111.0000000000 (0x3c00); a tie goes to
// the code with an even last bit.
TEST_CASE("rounding edge cases: fp16", "[precision][fp16]") {
  check_edge_cases<tessera::fp16>({
      {0x00000000u, 0x0000, 0x0000, "+0"},
      {0x80000000u, 0x8000, 0x8000, "-0 keeps its sign"},
      {0x3f800000u, 0x3c00, 0x3c00, "1.0"},
      {0x3f801000u, 0x3c00, 0x3c00, "1 + 2^-11: tie between 0x3c00 and 0x3c01 -> even 0x3c00"},
      {0x3f801001u, 0x3c01, 0x3c01, "just above that tie -> 0x3c01"},
      {0x3f803000u, 0x3c02, 0x3c02, "1 + 3 * 2^-11: tie between 0x3c01 and 0x3c02 -> 0x3c02"},
      {0x33800000u, 0x0001, 0x0001, "2^-24: smallest subnormal"},
      {0x33000000u, 0x0000, 0x0000, "2^-25: half the smallest subnormal, tie -> 0"},
      {0x33000001u, 0x0001, 0x0001, "just above 2^-25 -> smallest subnormal"},
      {0xb3000000u, 0x8000, 0x8000, "-2^-25 -> -0"},
      {0x33c00000u, 0x0002, 0x0002, "3 * 2^-25: tie between subnormals 1 and 2 -> 2"},
      {0x387fc000u, 0x03ff, 0x03ff, "1023 * 2^-24: max subnormal"},
      {0x387fe000u, 0x0400, 0x0400, "1023.5 * 2^-24: tie with min normal 2^-14 (even) -> 0x0400"},
      {0x38800000u, 0x0400, 0x0400, "2^-14: min normal"},
      {0x00000001u, 0x0000, 0x0000, "float subnormal -> 0"},
      {0x477fe000u, 0x7bff, 0x7bff, "65504 = max finite"},
      {0x477fefffu, 0x7bff, 0x7bff, "just below 65520 -> max finite"},
      {0x477ff000u, 0x7bff, 0x7c00, "65520: tie between 65504 (odd) and 2^16 -> inf"},
      {0x7f7fffffu, 0x7bff, 0x7c00, "FLT_MAX: max finite or inf"},
      {0x7f800000u, 0x7bff, 0x7c00, "+inf"},
      {0xff800000u, 0xfbff, 0xfc00, "-inf"},
      {0x7fc00000u, 0x7e00, 0x7e00, "quiet NaN -> 0x7e00"},
      {0xffc00000u, 0xfe00, 0xfe00, "-NaN keeps its sign"},
      {0x7f800001u, 0x7e00, 0x7e00, "signalling NaN -> quiet NaN"},
      {0x7fbfe000u, 0x7fff, 0x7fff, "NaN payload: its top 10 bits kept, quiet bit set"},
  });
}

TEST_CASE("fp16: F16C and the portable codec agree on every code and random floats",
          "[precision][fp16][vector]") {
  using namespace tessera;
#if !TESSERA_DEVICE_PASS // have_f16c is host-only code (a GPU compile's device pass has none)
  // Without F16C in this build both paths are the portable codec: the comparison then holds
  // trivially, so a failure report says which build it came from.
  INFO("F16C in this build: " << detail::have_f16c);
#endif
  std::vector<float16> codes(65536);
  for (std::uint32_t c = 0; c < 65536; ++c) codes[c] = float16::from_bits(std::uint16_t(c));
  std::vector<float> f16c(65536), port(65536);
  detail::convert_n_impl<fp32, overflow_to_inf_nan, true>(codes.data(), f16c.data(), 65536);
  detail::convert_n_impl<fp32, overflow_to_inf_nan, false>(codes.data(), port.data(), 65536);
  CHECK(std::memcmp(f16c.data(), port.data(), 65536 * sizeof(float)) == 0);
  std::mt19937 rng(16);
  const auto floats = interesting_floats(rng, 20000);
  std::vector<float16> a(floats.size()), b(floats.size()), c(floats.size()), d(floats.size());
  detail::convert_n_impl<fp16, saturate, true>(floats.data(), a.data(), floats.size());
  detail::convert_n_impl<fp16, saturate, false>(floats.data(), b.data(), floats.size());
  detail::convert_n_impl<fp16, overflow_to_inf_nan, true>(floats.data(), c.data(), floats.size());
  detail::convert_n_impl<fp16, overflow_to_inf_nan, false>(floats.data(), d.data(), floats.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 2) == 0);
  CHECK(std::memcmp(c.data(), d.data(), c.size() * 2) == 0);
}
TEST_CASE("bf16: VCVTNEPS2BF16 and the portable codec agree on every top half and random floats",
          "[precision][bf16][vector]") {
  using namespace tessera;
#if !TESSERA_DEVICE_PASS // host-only code (a GPU compile's device pass has none)
  // Without AVX512_BF16 in this build both paths are the portable codec: the comparison then
  // holds trivially, so a failure report says which build it came from.
  INFO("VCVTNEPS2BF16 in this build: " << detail::have_cvtneps2bf16);
#endif
  // Every bf16-sized top half (zeros, subnormals, normals, infinities, NaN payloads) with low
  // halves below, at and above the rounding tie and the extremes, in an order that mixes
  // subnormal and normal values within the 16-value batches; then random floats.
  std::vector<float> floats;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      floats.push_back(detail::bit_cast<float>(hi << 16 | lo));
  std::mt19937 rng(17);
  std::shuffle(floats.begin() + floats.size() / 2, floats.end(), rng);
  const auto more = interesting_floats(rng, 20000);
  floats.insert(floats.end(), more.begin(), more.end());
  for (const std::size_t off : {std::size_t{0}, std::size_t{5}}) {
    const std::size_t n = floats.size() - off;
    std::vector<bfloat16> hw(n), port(n);
    detail::convert_n_impl<bf16, overflow_to_inf_nan, true>(floats.data() + off, hw.data(), n);
    detail::convert_n_impl<bf16, overflow_to_inf_nan, false>(floats.data() + off, port.data(), n);
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (hw[i].bits != port[i].bits && bad++ == 0) first = i;
    INFO("offset " << off << ", first mismatch at " << first << " (float bits 0x" << std::hex
                   << detail::bit_cast<std::uint32_t>(floats[off + first]) << ")");
    CHECK(bad == 0);
  }
}

namespace {
// The vector encoder (both forms of convert_n_impl) against the scalar one on float bit patterns
// that walk every exponent and the top 12 mantissa bits (every sign, exponent and rounding
// position of fp8 and fp16's normals: their ties are at float bits 19, 20 and 12) with the low
// 11 bits below, at and above a tie's pattern, in batches that mix the targets' normals,
// subnormals, overflows and NaNs.
template <class To, class Policy>
void check_float_sweep(const std::vector<float>& floats) {
  using S = tessera::storage_t<To>;
  std::vector<S> hw(floats.size()), port(floats.size());
  tessera::detail::convert_n_impl<To, Policy, true>(floats.data(), hw.data(), floats.size());
  tessera::detail::convert_n_impl<To, Policy, false>(floats.data(), port.data(), floats.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < floats.size(); ++i) {
    const S s = tessera::convert<To, Policy>(floats[i]);
    if ((std::memcmp(&s, &hw[i], sizeof s) != 0 || std::memcmp(&s, &port[i], sizeof s) != 0) &&
        bad++ == 0)
      first = i;
  }
  INFO(tessera::precision_traits<To>::name
       << (std::is_same_v<Policy, saturate> ? " saturate" : " overflow_to_inf_nan")
       << ", first mismatch at float bits 0x" << std::hex
       << tessera::detail::bit_cast<std::uint32_t>(floats[first]));
  CHECK(bad == 0);
}
} // namespace

TEST_CASE("the vector encoders equal the scalar ones over a sweep of all exponents",
          "[precision][vector]") {
  std::vector<float> floats;
  for (std::uint32_t hi = 0; hi < (1u << 21); ++hi)
    for (std::uint32_t lo : {0x000u, 0x001u, 0x3ffu, 0x400u, 0x401u, 0x7ffu})
      floats.push_back(tessera::detail::bit_cast<float>(hi << 11 | lo));
  std::mt19937 rng(23);
  std::shuffle(floats.begin(), floats.end(), rng);
  for_each_narrow_target([&]<class To, class Policy>() { check_float_sweep<To, Policy>(floats); });
}

TEST_CASE("rounding edge cases: e4m3", "[precision][fp8_e4m3]") {
  check_edge_cases<tessera::fp8_e4m3>({
      {0x00000000u, 0x00, 0x00, "+0"},
      {0x80000000u, 0x80, 0x80, "-0 keeps its sign"},
      {0x3f880000u, 0x38, 0x38, "1.0625: tie between 1 (0x38) and 1.125 (0x39) -> even 0x38"},
      {0x3f880001u, 0x39, 0x39, "just above 1.0625 -> 1.125"},
      {0x3f980000u, 0x3a, 0x3a, "1.1875: tie between 0x39 and 0x3a -> even 0x3a"},
      {0x3a800000u, 0x00, 0x00, "2^-10: half the smallest subnormal, tie -> 0"},
      {0x3a800001u, 0x01, 0x01, "just above 2^-10 -> smallest subnormal 2^-9"},
      {0xba800000u, 0x80, 0x80, "-2^-10 -> -0"},
      {0x3b400000u, 0x02, 0x02, "1.5 * 2^-9: tie between subnormals 1 and 2 -> 2"},
      {0x3c700000u, 0x08, 0x08, "15 * 2^-10: tie between max subnormal 0x07 and 2^-6 -> 0x08"},
      {0x3c6fffffu, 0x07, 0x07, "just below that -> max subnormal"},
      {0x00000001u, 0x00, 0x00, "float subnormal -> 0"},
      {0x43e00000u, 0x7e, 0x7e, "448 = max finite"},
      {0x43e80000u, 0x7e, 0x7e, "464: tie between 448 (0x7e) and 480 (0x7f, odd) -> 448"},
      {0x43e80001u, 0x7e, 0x7f, "just above 464 overflows: NaN unless saturating"},
      {0x7f800000u, 0x7e, 0x7f, "+inf: max finite or NaN (e4m3 has no inf)"},
      {0xff800000u, 0xfe, 0xff, "-inf"},
      {0x7fc00000u, 0x7f, 0x7f, "NaN -> S.1111.111"},
      {0xffc00000u, 0xff, 0xff, "-NaN"},
  });
}

TEST_CASE("rounding edge cases: e5m2", "[precision][fp8_e5m2]") {
  check_edge_cases<tessera::fp8_e5m2>({
      {0x80000000u, 0x80, 0x80, "-0"},
      {0x3f900000u, 0x3c, 0x3c, "1.125: tie between 1 (0x3c) and 1.25 (0x3d) -> 0x3c"},
      {0x3fb00000u, 0x3e, 0x3e, "1.375: tie between 0x3d and 1.5 (0x3e) -> 0x3e"},
      {0x37000000u, 0x00, 0x00, "2^-17: half the smallest subnormal 2^-16, tie -> 0"},
      {0x37c00000u, 0x02, 0x02, "3 * 2^-17: tie between subnormals 1 and 2 -> 2"},
      {0x38600000u, 0x04, 0x04, "3.5 * 2^-16: tie between 0x03 and min normal 2^-14 -> 0x04"},
      {0x47600000u, 0x7b, 0x7b, "57344 = max finite"},
      {0x476fffffu, 0x7b, 0x7b, "just below 61440 -> max finite"},
      {0x47700000u, 0x7b, 0x7c, "61440: tie between 57344 (0x7b) and 65536 (0x7c, even) -> inf"},
      {0xff800000u, 0xfb, 0xfc, "-inf: -max finite or -inf"},
  });
  // NaN stays NaN (exponent all ones, mantissa non-zero), whatever the policy.
  for (std::uint32_t nan : {0x7fc00000u, 0xff800001u, 0x7f800001u}) {
    std::vector<float> in(40, from_bits(nan));
    std::vector<tessera::float8_e5m2> out(40);
    tessera::convert_n<tessera::fp8_e5m2, saturate>(in.data(), out.data(), 40);
    for (auto o : out) CHECK(std::isnan(o.to_float()));
  }
}

TEST_CASE("rounding edge cases: bf16", "[precision][bf16]") {
  check_edge_cases<tessera::bf16>({
      {0x80000000u, 0x8000, 0x8000, "-0"},
      {0x3f808000u, 0x3f80, 0x3f80, "1 + 2^-8: tie between 0x3f80 and 0x3f81 -> 0x3f80"},
      {0x3f818000u, 0x3f82, 0x3f82, "1 + 3 * 2^-8: tie between 0x3f81 and 0x3f82 -> 0x3f82"},
      {0x3f808001u, 0x3f81, 0x3f81, "just above the tie -> 0x3f81"},
      {0x00008000u, 0x0000, 0x0000, "float subnormal at a tie between 0 and 0x0001 -> 0"},
      {0x00018000u, 0x0002, 0x0002, "float subnormal at a tie between 0x0001 and 0x0002"},
      {0x7f7f7fffu, 0x7f7f, 0x7f7f, "just below the tie with 2^128 -> max finite"},
      {0x7f7f8000u, 0x7f7f, 0x7f80, "tie between max finite (odd) and 2^128 -> inf"},
      {0xff7fffffu, 0xff7f, 0xff80, "-FLT_MAX"},
      {0x7f800000u, 0x7f7f, 0x7f80, "+inf"},
      {0x7f800001u, 0x7fc0, 0x7fc0, "signalling NaN -> quiet NaN"},
  });
}

TEMPLATE_TEST_CASE("hostgemm::load_bf16: every fp8 code, every length to 140, no write past n",
                   "[precision][fp8]", tessera::float8_e4m3, tessera::float8_e5m2) {
  // The bf16 bits of each code are those of its float (exact: fp8 values are bf16 values),
  // through whichever path this build takes: 64-code byte-table steps and a masked last step
  // (AVX512-VBMI), 16-lane decodes, the scalar table.
  std::vector<std::uint8_t> codes(512);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 167 + 3);
  std::vector<TestType> src(codes.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i].bits = codes[i];
  int bad = 0;
  for (std::size_t off = 0; off < 4; ++off)
    for (tessera::index_t n = 0; n <= 140; ++n) {
      std::vector<std::uint16_t> dst(static_cast<std::size_t>(n) + 40, 0xabcd);
      tessera::detail::hostgemm::load_bf16(src.data() + off, dst.data(), n);
      for (std::size_t i = 0; i < dst.size(); ++i) {
        bool ok = dst[i] == 0xabcd; // past n: untouched
        if (i < static_cast<std::size_t>(n)) {
          const float f = tessera::to_float(src[off + i]);
          std::uint32_t u;
          std::memcpy(&u, &f, sizeof u);
          const auto want = static_cast<std::uint16_t>(u >> 16);
          const bool nan = (dst[i] & 0x7f80u) == 0x7f80u && (dst[i] & 0x7fu) != 0;
          ok = f != f ? nan && (dst[i] >> 15) == (want >> 15) : dst[i] == want;
        }
        if (!ok && bad++ < 5)
          FAIL_CHECK("offset " << off << ", n " << n << ", element " << i << ": " << dst[i]);
      }
    }
  CHECK(bad == 0);
}
