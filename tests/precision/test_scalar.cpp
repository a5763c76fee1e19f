// Scalar conversions: every fp8 code decodes to the value the OCP spec gives (computed here from
// the spec's formula with ldexp, independently of the bit tricks in storage.hpp), round trips,
// and the traits agree with the decoded extremes.
#include <tessera/precision.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

// OCP 8-bit Floating Point Specification (OFP8) rev 1.0, table 1: value of a code.
double ocp_value(std::uint8_t code, int ebits, int mbits, int bias, bool e4m3fn) {
  const int s = code >> 7;
  const int e = (code >> mbits) & ((1 << ebits) - 1);
  const int m = code & ((1 << mbits) - 1);
  const double sign = s ? -1.0 : 1.0;
  const int emax_field = (1 << ebits) - 1;
  if (e4m3fn) {
    if (e == emax_field && m == (1 << mbits) - 1) return std::numeric_limits<double>::quiet_NaN();
  } else if (e == emax_field) {
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  }
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -mbits), e - bias);
}

template <class F>
void check_all_codes(int ebits, int mbits, int bias, bool e4m3fn) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const double expect = ocp_value(code, ebits, mbits, bias, e4m3fn);
    const float got = F::from_bits(code).to_float();
    INFO("code 0x" << std::hex << c);
    if (std::isnan(expect)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(static_cast<double>(got) == expect);
      CHECK(std::signbit(got) == std::signbit(expect)); // -0 stays -0
    }
  }
}

} // namespace

TEST_CASE("every e4m3 code decodes to its OCP value", "[precision][fp8_e4m3]") {
  check_all_codes<tessera::float8_e4m3>(4, 3, 7, true);
}

TEST_CASE("every e5m2 code decodes to its OCP value", "[precision][fp8_e5m2]") {
  check_all_codes<tessera::float8_e5m2>(5, 2, 15, false);
}

TEMPLATE_TEST_CASE("non-NaN codes round-trip through float under both policies", "[precision][fp8]",
                   tessera::float8_e4m3, tessera::float8_e5m2) {
  for (int c = 0; c < 256; ++c) {
    const auto x = TestType::from_bits(static_cast<std::uint8_t>(c));
    const float f = x.to_float();
    if (std::isnan(f)) continue; // NaN payloads are not preserved, only NaN-ness
    INFO("code 0x" << std::hex << c);
    CHECK(TestType::template from_float<tessera::overflow_to_inf_nan>(f).bits == x.bits);
    if (!std::isinf(f)) CHECK(TestType::template from_float<tessera::saturate>(f).bits == x.bits);
  }
}

TEST_CASE("traits agree with the decoded extremes", "[precision]") {
  using tessera::precision_traits;
  CHECK(precision_traits<tessera::fp8_e4m3>::max_finite == 448.f);
  CHECK(tessera::float8_e4m3::from_bits(0x7e).to_float() == 448.f);
  CHECK(precision_traits<tessera::fp8_e5m2>::max_finite == 57344.f);
  CHECK(tessera::float8_e5m2::from_bits(0x7b).to_float() == 57344.f);
  CHECK(precision_traits<tessera::fp8_e4m3>::min_subnormal ==
        tessera::float8_e4m3::from_bits(0x01).to_float());
  CHECK(precision_traits<tessera::fp8_e5m2>::min_subnormal ==
        tessera::float8_e5m2::from_bits(0x01).to_float());
  CHECK(precision_traits<tessera::fp8_e4m3>::min_normal ==
        tessera::float8_e4m3::from_bits(0x08).to_float());
  CHECK(precision_traits<tessera::fp8_e5m2>::min_normal ==
        tessera::float8_e5m2::from_bits(0x04).to_float());
  CHECK(precision_traits<tessera::bf16>::max_finite ==
        tessera::bfloat16::from_bits(0x7f7f).to_float());
  CHECK(precision_traits<tessera::bf16>::epsilon == std::ldexp(1.f, -7));
  CHECK(precision_traits<tessera::fp32>::epsilon == std::numeric_limits<float>::epsilon());
  STATIC_REQUIRE(tessera::Precision<tessera::bf16>);
  STATIC_REQUIRE(!tessera::Precision<float>);
}

TEST_CASE("overflow policies", "[precision]") {
  using tessera::overflow_to_inf_nan;
  using tessera::saturate;
  const float inf = std::numeric_limits<float>::infinity();
  // e4m3 has no infinity: overflow is NaN unless saturating.
  CHECK(tessera::float8_e4m3::from_float<saturate>(1e6f).to_float() == 448.f);
  CHECK(tessera::float8_e4m3::from_float<saturate>(-inf).to_float() == -448.f);
  CHECK(std::isnan(tessera::float8_e4m3::from_float<overflow_to_inf_nan>(1e6f).to_float()));
  // 464 is the midpoint between 448 and the (NaN) code above it: ties to even keep 448.
  CHECK(tessera::float8_e4m3::from_float<overflow_to_inf_nan>(464.f).to_float() == 448.f);
  CHECK(std::isnan(tessera::float8_e4m3::from_float<overflow_to_inf_nan>(464.5f).to_float()));
  CHECK(tessera::float8_e5m2::from_float<overflow_to_inf_nan>(1e6f).to_float() == inf);
  CHECK(tessera::float8_e5m2::from_float<saturate>(1e6f).to_float() == 57344.f);
  CHECK(tessera::bfloat16::from_float<overflow_to_inf_nan>(3.4e38f).to_float() == inf);
  CHECK(tessera::bfloat16::from_float<saturate>(3.4e38f).to_float() ==
        tessera::precision_traits<tessera::bf16>::max_finite);
  CHECK(std::isnan(tessera::bfloat16::from_float(std::nanf("")).to_float()));
}
