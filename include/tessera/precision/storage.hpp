#pragma once
/// \file precision/storage.hpp
/// Storage types for the low precisions: bfloat16, float8_e4m3 (OCP E4M3FN) and float8_e5m2
/// (OCP E5M2). Each is a trivially copyable wrapper of its bit pattern, usable in Kokkos Views
/// and in kernels on every execution space.
///
/// Conversions:
///  - to float is exact (every value of these formats is a float);
///  - from float rounds to nearest, ties to even, keeps +-0, subnormals and NaN, and handles
///    overflow as the policy says (see precision/policies.hpp).
///
/// Example:
///   auto h = tessera::float8_e4m3::from_float<tessera::saturate>(1000.f); // 448
///   float f = h.to_float();

#include <tessera/config/bit_cast.hpp>
#include <tessera/config/macros.hpp>
#include <tessera/precision/policies.hpp>

#include <cstdint>
#include <type_traits>

namespace tessera {

namespace detail {

/// Round-to-nearest-even right shift of a non-negative integer: value / 2^shift rounded.
TESSERA_INLINE constexpr std::uint32_t rne_shift(std::uint32_t v, std::uint32_t shift) noexcept {
  if (shift == 0) return v;
  if (shift > 31) return 0;
  const std::uint32_t q = v >> shift;
  const std::uint32_t rem = v & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

/// float -> an 8-bit OCP format with ExpBits exponent bits, ManBits mantissa bits, bias Bias.
/// MaxCode is the largest finite magnitude code, OverflowCode the code overflow produces under
/// overflow_to_inf_nan (inf for e5m2, NaN for e4m3) and NanCode the NaN produced for NaN input.
template <int ManBits, int Bias, std::uint32_t MaxCode, std::uint32_t OverflowCode,
          std::uint32_t NanCode, class Policy>
TESSERA_INLINE constexpr std::uint8_t encode_fp8(float f) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | NanCode);
  constexpr bool sat = std::is_same_v<Policy, saturate>;
  if (a == 0x7f800000u) return static_cast<std::uint8_t>(sign | (sat ? MaxCode : OverflowCode));
  const int e = static_cast<int>(a >> 23) - 127 + Bias; // biased exponent in the target format
  std::uint32_t code;
  if (e >= 1) {
    // Normal in the target: drop 23 - ManBits mantissa bits with RNE on the whole magnitude
    // (a carry into the exponent is the correct result), then rebias the exponent.
    const std::uint32_t r = rne_shift(a, 23 - ManBits);
    code = r - (static_cast<std::uint32_t>(127 - Bias) << ManBits);
  } else {
    // Subnormal (or zero) in the target: value / 2^(1 - Bias - ManBits), rounded. A float
    // subnormal input is far below the target's smallest subnormal and rounds to 0.
    if ((a >> 23) == 0) return static_cast<std::uint8_t>(sign);
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    code = rne_shift(m, static_cast<std::uint32_t>(23 - ManBits + 1 - e));
  }
  if (code > MaxCode) code = sat ? MaxCode : OverflowCode;
  return static_cast<std::uint8_t>(sign | code);
}

/// An 8-bit OCP format code -> float, exactly.
template <int ExpBits, int ManBits, int Bias, bool HasInf>
TESSERA_INLINE constexpr float decode_fp8(std::uint8_t b) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exp = (b >> ManBits) & ((1u << ExpBits) - 1u);
  const std::uint32_t man = b & ((1u << ManBits) - 1u);
  constexpr std::uint32_t exp_max = (1u << ExpBits) - 1u;
  if constexpr (HasInf) {
    if (exp == exp_max) return bit_cast<float>(sign | 0x7f800000u | (man << (23 - ManBits)));
  } else {
    if (exp == exp_max && man == (1u << ManBits) - 1u) return bit_cast<float>(sign | 0x7fc00000u);
  }
  if (exp == 0) {
    // man * 2^(1 - Bias - ManBits): an exact product (small integer times a power of two).
    constexpr float step = bit_cast<float>(static_cast<std::uint32_t>(127 + 1 - Bias - ManBits)
                                           << 23);
    const float v = static_cast<float>(man) * step;
    return bit_cast<float>(sign | bit_cast<std::uint32_t>(v));
  }
  return bit_cast<float>(sign | ((exp - Bias + 127) << 23) | (man << (23 - ManBits)));
}

} // namespace detail

/// bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an IEEE float).
struct bfloat16 {
  std::uint16_t bits;

  TESSERA_INLINE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept { return {b}; }

  template <OverflowPolicy Policy = overflow_to_inf_nan>
  TESSERA_INLINE static constexpr bfloat16 from_float(float f) noexcept {
    const std::uint32_t u = detail::bit_cast<std::uint32_t>(f);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return {static_cast<std::uint16_t>((u >> 16) | 0x0040u)}; // quiet NaN
    if constexpr (std::is_same_v<Policy, saturate>) {
      if (a >= 0x7f7f8000u) // rounds to (or is) infinity
        return {static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7f7fu)};
    }
    // Round to nearest even on the 16 dropped bits; a carry into the exponent is correct and
    // turns max-float-range values into infinity.
    const std::uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<std::uint16_t>(r >> 16)};
  }

  TESSERA_INLINE constexpr float to_float() const noexcept {
    return detail::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  TESSERA_INLINE explicit constexpr operator float() const noexcept { return to_float(); }
  friend TESSERA_INLINE constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept {
    return a.bits == b.bits; // bitwise identity, not IEEE equality
  }
};

/// OCP FP8 E4M3 ("E4M3FN"): bias 7, no infinities, NaN = S.1111.111, max finite 448.
struct float8_e4m3 {
  std::uint8_t bits;

  static constexpr int exponent_bits = 4, mantissa_bits = 3, bias = 7;

  TESSERA_INLINE static constexpr float8_e4m3 from_bits(std::uint8_t b) noexcept { return {b}; }

  template <OverflowPolicy Policy = saturate>
  TESSERA_INLINE static constexpr float8_e4m3 from_float(float f) noexcept {
    return {detail::encode_fp8<3, 7, 0x7eu, 0x7fu, 0x7fu, Policy>(f)};
  }
  TESSERA_INLINE constexpr float to_float() const noexcept {
    return detail::decode_fp8<4, 3, 7, false>(bits);
  }
  TESSERA_INLINE explicit constexpr operator float() const noexcept { return to_float(); }
  friend TESSERA_INLINE constexpr bool operator==(float8_e4m3 a, float8_e4m3 b) noexcept {
    return a.bits == b.bits;
  }
};

/// OCP FP8 E5M2: bias 15, infinities (S.11111.00) and NaNs (S.11111.{01,10,11}), max 57344.
struct float8_e5m2 {
  std::uint8_t bits;

  static constexpr int exponent_bits = 5, mantissa_bits = 2, bias = 15;

  TESSERA_INLINE static constexpr float8_e5m2 from_bits(std::uint8_t b) noexcept { return {b}; }

  template <OverflowPolicy Policy = saturate>
  TESSERA_INLINE static constexpr float8_e5m2 from_float(float f) noexcept {
    return {detail::encode_fp8<2, 15, 0x7bu, 0x7cu, 0x7eu, Policy>(f)};
  }
  TESSERA_INLINE constexpr float to_float() const noexcept {
    return detail::decode_fp8<5, 2, 15, true>(bits);
  }
  TESSERA_INLINE explicit constexpr operator float() const noexcept { return to_float(); }
  friend TESSERA_INLINE constexpr bool operator==(float8_e5m2 a, float8_e5m2 b) noexcept {
    return a.bits == b.bits;
  }
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float8_e4m3) == 1 && std::is_trivially_copyable_v<float8_e4m3>);
static_assert(sizeof(float8_e5m2) == 1 && std::is_trivially_copyable_v<float8_e5m2>);

} // namespace tessera
