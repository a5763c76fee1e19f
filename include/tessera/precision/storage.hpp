#pragma once
/// \file precision/storage.hpp
/// Storage types for the low precisions: bfloat16, float16 (IEEE binary16), float8_e4m3 (OCP
/// E4M3FN) and float8_e5m2 (OCP E5M2). Each is a trivially copyable wrapper of its bit pattern,
/// usable in Kokkos Views and in kernels on every execution space.
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

/// float -> a binary format of Bits bits (1 sign, Bits - 1 - ManBits exponent, ManBits mantissa,
/// bias Bias). MaxCode is the largest finite magnitude code, OverflowCode the code overflow
/// produces under overflow_to_inf_nan (inf for e5m2 and fp16, NaN for e4m3) and NanCode the NaN
/// produced for NaN input; with KeepNanPayload (fp16) a NaN keeps the top ManBits bits of its
/// payload and gets the quiet bit instead (IEEE-754 narrowing, as F16C does).
template <int Bits, int ManBits, int Bias, std::uint32_t MaxCode, std::uint32_t OverflowCode,
          std::uint32_t NanCode, bool KeepNanPayload, class Policy>
TESSERA_INLINE constexpr std::uint32_t encode_minifloat(float f) noexcept {
  const std::uint32_t u = bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> (32 - Bits)) & (1u << (Bits - 1));
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    if constexpr (KeepNanPayload)
      return sign | OverflowCode | (1u << (ManBits - 1)) |
             ((a >> (23 - ManBits)) & ((1u << ManBits) - 1u));
    else
      return sign | NanCode;
  }
  constexpr bool sat = std::is_same_v<Policy, saturate>;
  if (a == 0x7f800000u) return sign | (sat ? MaxCode : OverflowCode);
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
    if ((a >> 23) == 0) return sign;
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    code = rne_shift(m, static_cast<std::uint32_t>(23 - ManBits + 1 - e));
  }
  if (code > MaxCode) code = sat ? MaxCode : OverflowCode;
  return sign | code;
}

template <int ManBits, int Bias, std::uint32_t MaxCode, std::uint32_t OverflowCode,
          std::uint32_t NanCode, class Policy>
TESSERA_INLINE constexpr std::uint8_t encode_fp8(float f) noexcept {
  return static_cast<std::uint8_t>(
      encode_minifloat<8, ManBits, Bias, MaxCode, OverflowCode, NanCode, false, Policy>(f));
}

/// A code of a binary format of Bits bits -> float, exactly. With QuietNan (fp16) a NaN gets
/// the quiet bit (IEEE-754 widening, as F16C does); otherwise its payload is kept as is.
template <int Bits, int ExpBits, int ManBits, int Bias, bool HasInf, bool QuietNan>
TESSERA_INLINE constexpr float decode_minifloat(std::uint32_t b) noexcept {
  const std::uint32_t sign = (b >> (Bits - 1) & 1u) << 31;
  const std::uint32_t exp = (b >> ManBits) & ((1u << ExpBits) - 1u);
  const std::uint32_t man = b & ((1u << ManBits) - 1u);
  constexpr std::uint32_t exp_max = (1u << ExpBits) - 1u;
  constexpr std::uint32_t quiet = QuietNan ? 0x00400000u : 0u;
  if constexpr (HasInf) {
    if (exp == exp_max)
      return bit_cast<float>(sign | 0x7f800000u | (man << (23 - ManBits)) | (man ? quiet : 0u));
  } else {
    if (exp == exp_max && man == (1u << ManBits) - 1u) return bit_cast<float>(sign | 0x7fc00000u);
  }
  if (exp == 0) {
    // man * 2^(1 - Bias - ManBits): an exact product (small integer times a power of two).
    constexpr float step =
        bit_cast<float>(static_cast<std::uint32_t>(127 + 1 - Bias - ManBits) << 23);
    const float v = static_cast<float>(man) * step;
    return bit_cast<float>(sign | bit_cast<std::uint32_t>(v));
  }
  return bit_cast<float>(sign | ((exp - Bias + 127) << 23) | (man << (23 - ManBits)));
}

template <int ExpBits, int ManBits, int Bias, bool HasInf>
TESSERA_INLINE constexpr float decode_fp8(std::uint8_t b) noexcept {
  return decode_minifloat<8, ExpBits, ManBits, Bias, HasInf, false>(b);
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
  /// Largest finite magnitude code, the code of overflow under overflow_to_inf_nan, the NaN.
  static constexpr std::uint32_t max_code = 0x7e, overflow_code = 0x7f, nan_code = 0x7f;
  static constexpr bool has_inf = false, quiet_nan_on_decode = false, nan_keeps_payload = false;

  TESSERA_INLINE static constexpr float8_e4m3 from_bits(std::uint8_t b) noexcept { return {b}; }

  template <OverflowPolicy Policy = saturate>
  TESSERA_INLINE static constexpr float8_e4m3 from_float(float f) noexcept {
    return {detail::encode_fp8<mantissa_bits, bias, max_code, overflow_code, nan_code, Policy>(f)};
  }
  TESSERA_INLINE constexpr float to_float() const noexcept {
    return detail::decode_fp8<exponent_bits, mantissa_bits, bias, has_inf>(bits);
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
  static constexpr std::uint32_t max_code = 0x7b, overflow_code = 0x7c, nan_code = 0x7e;
  static constexpr bool has_inf = true, quiet_nan_on_decode = false, nan_keeps_payload = false;

  TESSERA_INLINE static constexpr float8_e5m2 from_bits(std::uint8_t b) noexcept { return {b}; }

  template <OverflowPolicy Policy = saturate>
  TESSERA_INLINE static constexpr float8_e5m2 from_float(float f) noexcept {
    return {detail::encode_fp8<mantissa_bits, bias, max_code, overflow_code, nan_code, Policy>(f)};
  }
  TESSERA_INLINE constexpr float to_float() const noexcept {
    return detail::decode_fp8<exponent_bits, mantissa_bits, bias, has_inf>(bits);
  }
  TESSERA_INLINE explicit constexpr operator float() const noexcept { return to_float(); }
  friend TESSERA_INLINE constexpr bool operator==(float8_e5m2 a, float8_e5m2 b) noexcept {
    return a.bits == b.bits;
  }
};

/// IEEE-754 binary16 ("half"): 1 sign, 5 exponent, 10 mantissa bits, bias 15, max finite 65504,
/// infinities (S.11111.0) and NaNs (S.11111.m, m != 0). Conversions are IEEE-754's: round to
/// nearest even, subnormals kept, overflow to inf (or +-65504 under saturate); a NaN keeps the
/// top bits of its payload and gets the quiet bit, both ways, bit for bit as F16C does.
struct float16 {
  std::uint16_t bits;

  static constexpr int exponent_bits = 5, mantissa_bits = 10, bias = 15;
  static constexpr std::uint32_t max_code = 0x7bff, overflow_code = 0x7c00, nan_code = 0x7e00;
  static constexpr bool has_inf = true, quiet_nan_on_decode = true, nan_keeps_payload = true;

  TESSERA_INLINE static constexpr float16 from_bits(std::uint16_t b) noexcept { return {b}; }

  template <OverflowPolicy Policy = overflow_to_inf_nan>
  TESSERA_INLINE static constexpr float16 from_float(float f) noexcept {
    return {static_cast<std::uint16_t>(
        detail::encode_minifloat<16, mantissa_bits, bias, max_code, overflow_code, nan_code,
                                 nan_keeps_payload, Policy>(f))};
  }
  TESSERA_INLINE constexpr float to_float() const noexcept {
    return detail::decode_minifloat<16, exponent_bits, mantissa_bits, bias, has_inf,
                                    quiet_nan_on_decode>(bits);
  }
  TESSERA_INLINE explicit constexpr operator float() const noexcept { return to_float(); }
  friend TESSERA_INLINE constexpr bool operator==(float16 a, float16 b) noexcept {
    return a.bits == b.bits;
  }
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float8_e4m3) == 1 && std::is_trivially_copyable_v<float8_e4m3>);
static_assert(sizeof(float8_e5m2) == 1 && std::is_trivially_copyable_v<float8_e5m2>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);

} // namespace tessera
