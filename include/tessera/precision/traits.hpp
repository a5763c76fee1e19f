#pragma once
/// \file precision/traits.hpp
/// Precision tags (fp32, bf16, fp8_e4m3, fp8_e5m2), precision_traits<Tag> and the Precision
/// concept. A tag names a number format; its storage type is what a tensor holds; arithmetic
/// always widens to the accumulator type (float).

#include <tessera/config/bit_cast.hpp>
#include <tessera/precision/storage.hpp>

#include <concepts>
#include <cstdint>
#include <type_traits>

namespace tessera {

// Tags: lower-case, like builtin scalars.
struct fp32 {};
struct bf16 {};
struct fp8_e4m3 {};
struct fp8_e5m2 {};

/// precision_traits<Tag>: everything known about a format at compile time.
template <class Tag>
struct precision_traits; // undefined: not a precision

namespace detail {
template <class Storage, int Bits, int ExpBits, int ManBits, int Bias, bool HasInf,
          std::uint32_t MaxFiniteBits, std::uint32_t MinNormalBits, std::uint32_t MinSubBits>
struct precision_traits_base {
  using storage_type = Storage;
  using accumulator_type = float;
  static constexpr int bits = Bits;
  static constexpr int exponent_bits = ExpBits;
  static constexpr int mantissa_bits = ManBits;
  static constexpr int bias = Bias;
  static constexpr bool has_inf = HasInf;
  static constexpr bool has_nan = true;
  /// Largest finite value, smallest positive normal, smallest positive subnormal, as floats
  /// (each is exactly representable in float).
  static constexpr float max_finite = bit_cast<float>(MaxFiniteBits);
  static constexpr float min_normal = bit_cast<float>(MinNormalBits);
  static constexpr float min_subnormal = bit_cast<float>(MinSubBits);
  /// Distance from 1 to the next representable value: 2^-mantissa_bits.
  static constexpr float epsilon =
      bit_cast<float>(static_cast<std::uint32_t>(127 - ManBits) << 23);
  /// Unit roundoff of round-to-nearest: epsilon / 2. Tolerances derive from this.
  static constexpr float unit_roundoff = epsilon / 2;
};
} // namespace detail

template <>
struct precision_traits<fp32>
    : detail::precision_traits_base<float, 32, 8, 23, 127, true, 0x7f7fffffu, 0x00800000u,
                                    0x00000001u> {
  static constexpr const char* name = "fp32";
};
template <>
struct precision_traits<bf16>
    : detail::precision_traits_base<bfloat16, 16, 8, 7, 127, true, 0x7f7f0000u, 0x00800000u,
                                    0x00010000u> {
  static constexpr const char* name = "bf16";
};
// e4m3: max 448 = 1.75 * 2^8, min normal 2^-6, min subnormal 2^-9.
template <>
struct precision_traits<fp8_e4m3>
    : detail::precision_traits_base<float8_e4m3, 8, 4, 3, 7, false, 0x43e00000u, 0x3c800000u,
                                    0x3b000000u> {
  static constexpr const char* name = "fp8_e4m3";
};
// e5m2: max 57344 = 1.75 * 2^15, min normal 2^-14, min subnormal 2^-16.
template <>
struct precision_traits<fp8_e5m2>
    : detail::precision_traits_base<float8_e5m2, 8, 5, 2, 15, true, 0x47600000u, 0x38800000u,
                                    0x37800000u> {
  static constexpr const char* name = "fp8_e5m2";
};

/// A precision tag: one of fp32, bf16, fp8_e4m3, fp8_e5m2 (or a user tag with traits).
template <class T>
concept Precision = requires {
  typename precision_traits<T>::storage_type;
  { precision_traits<T>::bits } -> std::convertible_to<int>;
};

template <class T>
concept Fp8Precision = Precision<T> && precision_traits<T>::bits == 8;

template <Precision P>
using storage_t = typename precision_traits<P>::storage_type;

/// The tag whose storage type is S (float -> fp32, bfloat16 -> bf16, ...).
template <class S>
struct precision_of;
template <>
struct precision_of<float> { using type = fp32; };
template <>
struct precision_of<bfloat16> { using type = bf16; };
template <>
struct precision_of<float8_e4m3> { using type = fp8_e4m3; };
template <>
struct precision_of<float8_e5m2> { using type = fp8_e5m2; };
template <class S>
using precision_of_t = typename precision_of<std::remove_cv_t<S>>::type;

} // namespace tessera
