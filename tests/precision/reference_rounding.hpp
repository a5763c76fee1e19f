#pragma once
// An independent reference for float -> bf16 / fp16 / fp8 encoding. It knows the formats only
// through the formula for the value of a code (OCP OFP8 rev 1.0 table 1; bf16 = IEEE binary32
// with 7 fraction bits; fp16 = IEEE-754 binary16) evaluated with ldexp in double, and rounds by
// comparing distances in double: no bit manipulation of the input is involved, unlike the encoders
// in storage.hpp.

#include <tessera/precision.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace tessera_test {

/// A format described by its fields, and the value of each non-negative finite code.
struct format_spec {
  int exponent_bits, mantissa_bits, bias;
  std::uint32_t max_code;      // largest finite magnitude code
  std::uint32_t overflow_code; // what overflow_to_inf_nan produces: inf, or NaN for E4M3FN
  std::uint32_t sign_mask;     // the sign bit of a code
  bool has_inf;                // false: E4M3FN, whose only NaN is S.1111.111

  /// Value of a non-negative code with the normal/subnormal formula, ignoring inf/NaN
  /// meanings: for max_code + 1 this is the first value past max finite on an unbounded
  /// exponent range, which is what IEEE rounding compares against before declaring overflow.
  double value(std::uint32_t code) const {
    const std::uint32_t e = code >> mantissa_bits;
    const std::uint32_t m = code & ((1u << mantissa_bits) - 1u);
    if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias - mantissa_bits);
    return std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -mantissa_bits),
                      static_cast<int>(e) - bias);
  }

  bool is_nan(std::uint32_t code) const {
    const std::uint32_t mag = code & ~sign_mask;
    const std::uint32_t exp_all = ((1u << exponent_bits) - 1u) << mantissa_bits;
    if (!has_inf) return mag == ((1u << (exponent_bits + mantissa_bits)) - 1u);
    return (mag & exp_all) == exp_all && (mag & ~exp_all) != 0;
  }
};

inline constexpr format_spec bf16_spec{8, 7, 127, 0x7f7f, 0x7f80, 0x8000, true};
inline constexpr format_spec e4m3_spec{4, 3, 7, 0x7e, 0x7f, 0x80, false};
inline constexpr format_spec e5m2_spec{5, 2, 15, 0x7b, 0x7c, 0x80, true};
// IEEE-754 binary16: bias 15, 10 fraction bits, max finite 0x7bff = 65504, inf 0x7c00.
inline constexpr format_spec fp16_spec{5, 10, 15, 0x7bff, 0x7c00, 0x8000, true};

/// Every non-negative finite value of a format plus the first one past max finite, in
/// increasing code order, and the midpoints between neighbours (all exact in double).
struct value_table {
  format_spec spec;
  std::vector<double> value; // value[c] for c = 0 .. max_code + 1

  explicit value_table(const format_spec& s) : spec(s) {
    for (std::uint32_t c = 0; c <= s.max_code + 1; ++c) value.push_back(s.value(c));
    for (std::size_t c = 1; c < value.size(); ++c)
      if (!(value[c - 1] < value[c])) throw std::logic_error("codes are not increasing in value");
  }
};

/// Rounds non-negative values given in non-decreasing order to the nearest code, ties to the
/// even code, in amortised O(1) per value by walking the table. A result of max_code + 1 means
/// overflow.
class sweep_rounder {
public:
  explicit sweep_rounder(const value_table& t) : t_(&t) {}

  std::uint32_t nearest(double x) {
    const auto& v = t_->value;
    const std::uint32_t top = static_cast<std::uint32_t>(v.size() - 1);
    if (k_ == 0 && x > v[1]) // first call of a sweep starting high: binary search once
      k_ = static_cast<std::uint32_t>(std::upper_bound(v.begin(), v.end(), x) - v.begin()) - 1;
    while (k_ < top && x >= v[k_ + 1]) ++k_;
    if (k_ == top) return top;
    const double below = x - v[k_], above = v[k_ + 1] - x;
    if (below < above) return k_;
    if (above < below) return k_ + 1;
    return (k_ % 2 == 0) ? k_ : k_ + 1;
  }

private:
  const value_table* t_;
  std::uint32_t k_ = 0;
};

/// The reference rounding of one float, before the overflow policy is applied.
struct rounded {
  bool nan;           // the input is a NaN: the result must be a NaN (payload unspecified)
  std::uint32_t sign; // the sign bit of the result (0 or spec.sign_mask)
  std::uint32_t code; // magnitude code; max_code + 1 means overflow
};

/// Rounds the float with bit pattern bits. Magnitudes given to one rounder must not decrease.
inline rounded reference_round(sweep_rounder& r, const format_spec& s, std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  if (std::isnan(f)) return {true, 0, 0};
  const std::uint32_t sign = std::signbit(f) ? s.sign_mask : 0u;
  if (std::isinf(f)) return {false, sign, s.max_code + 1};
  return {false, sign, r.nearest(std::fabs(static_cast<double>(f)))};
}

/// Whether code is the right result for x under Policy: overflow gives +-max finite
/// (saturate) or the format's overflow code (inf, or NaN for E4M3FN); NaN stays NaN.
template <class Policy>
bool reference_accepts(const format_spec& s, const rounded& x, std::uint32_t code) {
  if (x.nan) return s.is_nan(code);
  if (x.code <= s.max_code) return code == (x.sign | x.code);
  return code ==
         (x.sign | (std::is_same_v<Policy, tessera::saturate> ? s.max_code : s.overflow_code));
}

} // namespace tessera_test
