#pragma once
/// \file precision/traits.hpp
/// Precision tags (fp32, bf16, fp16, fp8_e4m3, fp8_e5m2), precision_traits<Tag> and the Precision
/// concept. A tag names a number format; its storage type is what a tensor holds; arithmetic
/// always widens to the accumulator type (float).

#include <tessera/config/bit_cast.hpp>
#include <tessera/precision/policies.hpp>
#include <tessera/precision/storage.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tessera {

// Tags: lower-case, like builtin scalars.
struct fp32 {};
struct bf16 {};
struct fp16 {};
struct fp8_e4m3 {};
struct fp8_e5m2 {};

/// How a format's codes map to float bit patterns; the vector conversions (vector_convert.hpp)
/// pick their code from this.
enum class precision_encoding {
  binary32,          ///< the float itself (fp32)
  binary32_top_half, ///< the top 16 bits of a float (bf16): widening is a shift
  minifloat,         ///< sign, exponent, mantissa of their own widths and bias (fp16, fp8)
};

/// precision_traits<Tag>: everything known about a format at compile time. Consumers read these
/// facts and never list precisions; a new precision is a tag, a storage type and one
/// specialisation here (plus its entry in known_precisions).
///
/// Members: name; storage_type (what a tensor holds); compute_type and accumulator_type (float:
/// arithmetic widens, sums accumulate in fp32); wire_type (the storage gradients and activations
/// of this precision travel in between processes: one a communicator carries); bits,
/// exponent_bits, mantissa_bits, bias, has_inf; max_finite, min_normal, min_subnormal, epsilon,
/// unit_roundoff (floats); encoding; scaled (true: fp8-like, a tensor needs a per-tensor scale
/// and the default overflow policy saturates); overflow_policy (the default of narrowing
/// conversions); exact_in_bf16 (every value is a bf16: the bf16 kernels, AVX512_BF16 dot
/// products and AMX tiles, take it after an exact widening); f16c (converts with the x86 F16C
/// instructions).
///
/// The primary template is no precision: Precision<T> is false, and storage_t<T> and the other
/// aliases stop compilation with a sentence saying so.
template <class Tag>
struct precision_traits {
  static constexpr bool is_precision = false;
};

namespace detail {
template <class Storage, class Wire, int Bits, int ExpBits, int ManBits, int Bias, bool HasInf,
          bool Scaled, std::uint32_t MaxFiniteBits, std::uint32_t MinNormalBits,
          std::uint32_t MinSubBits>
struct precision_traits_base {
  static constexpr bool is_precision = true;
  using storage_type = Storage;
  using compute_type = float;
  using accumulator_type = float;
  using wire_type = Wire;
  static constexpr int bits = Bits;
  static constexpr int exponent_bits = ExpBits;
  static constexpr int mantissa_bits = ManBits;
  static constexpr int bias = Bias;
  static constexpr bool has_inf = HasInf;
  static constexpr bool has_nan = true;
  /// fp8-like: tensors carry a per-tensor scale (scaled_tensor), conversions saturate.
  static constexpr bool scaled = Scaled;
  using overflow_policy = std::conditional_t<Scaled, saturate, overflow_to_inf_nan>;
  static constexpr precision_encoding encoding =
      Bits == 32 ? precision_encoding::binary32
                 : (Bits == 16 && ExpBits == 8 ? precision_encoding::binary32_top_half
                                               : precision_encoding::minifloat);
  /// Every value is exactly a bf16 (exponent range and mantissa both fit).
  static constexpr bool exact_in_bf16 = Bits < 32 && ExpBits <= 8 && ManBits <= 7;
  static constexpr bool f16c = false;
  /// Largest finite value, smallest positive normal, smallest positive subnormal, as floats
  /// (each is exactly representable in float).
  static constexpr float max_finite = bit_cast<float>(MaxFiniteBits);
  static constexpr float min_normal = bit_cast<float>(MinNormalBits);
  static constexpr float min_subnormal = bit_cast<float>(MinSubBits);
  /// Distance from 1 to the next representable value: 2^-mantissa_bits.
  static constexpr float epsilon = bit_cast<float>(static_cast<std::uint32_t>(127 - ManBits) << 23);
  /// Unit roundoff of round-to-nearest: epsilon / 2. Tolerances derive from this.
  static constexpr float unit_roundoff = epsilon / 2;
};
} // namespace detail

template <>
struct precision_traits<fp32>
    : detail::precision_traits_base<float, float, 32, 8, 23, 127, true, false, 0x7f7fffffu,
                                    0x00800000u, 0x00000001u> {
  static constexpr const char* name = "fp32";
};
template <>
struct precision_traits<bf16>
    : detail::precision_traits_base<bfloat16, bfloat16, 16, 8, 7, 127, true, false, 0x7f7f0000u,
                                    0x00800000u, 0x00010000u> {
  static constexpr const char* name = "bf16";
};
// fp16 (IEEE binary16): max 65504 = (2 - 2^-10) * 2^15, min normal 2^-14, min subnormal 2^-24.
// Its values are not all bf16 (10 mantissa bits), so it travels as fp32 (exact) and its GEMMs
// take the fp32 kernels; F16C converts it.
template <>
struct precision_traits<fp16>
    : detail::precision_traits_base<float16, float, 16, 5, 10, 15, true, false, 0x477fe000u,
                                    0x38800000u, 0x33800000u> {
  static constexpr const char* name = "fp16";
  static constexpr bool f16c = true;
};
// e4m3: max 448 = 1.75 * 2^8, min normal 2^-6, min subnormal 2^-9.
template <>
struct precision_traits<fp8_e4m3>
    : detail::precision_traits_base<float8_e4m3, bfloat16, 8, 4, 3, 7, false, true, 0x43e00000u,
                                    0x3c800000u, 0x3b000000u> {
  static constexpr const char* name = "fp8_e4m3";
};
// e5m2: max 57344 = 1.75 * 2^15, min normal 2^-14, min subnormal 2^-16.
template <>
struct precision_traits<fp8_e5m2>
    : detail::precision_traits_base<float8_e5m2, bfloat16, 8, 5, 2, 15, true, true, 0x47600000u,
                                    0x38800000u, 0x37800000u> {
  static constexpr const char* name = "fp8_e5m2";
};

/// Every precision tessera knows, for code that must handle whichever one it meets at run time
/// (a buffer per precision, a run-time precision choice). The one list of precisions.
template <class... Ps>
struct precision_list {
  static constexpr std::size_t size = sizeof...(Ps);
};
using known_precisions = precision_list<fp32, bf16, fp16, fp8_e4m3, fp8_e5m2>;

/// A precision tag: fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, or a user tag with traits.
template <class T>
concept Precision = precision_traits<T>::is_precision;

/// fp8-like precisions: values need a per-tensor scale (precision_traits<P>::scaled).
template <class T>
concept ScaledPrecision = Precision<T> && precision_traits<T>::scaled;
/// The historical name of ScaledPrecision.
template <class T>
concept Fp8Precision = ScaledPrecision<T>;

namespace detail {
/// precision_traits<P>, or a compile error with a sentence when P is not a precision.
template <class P>
struct checked_traits : precision_traits<P> {
  static_assert(Precision<P>,
                "tessera: this type is not a precision tag (tessera::fp32, bf16, fp16, fp8_e4m3, "
                "fp8_e5m2): a precision is a tag with a tessera::precision_traits specialisation "
                "(precision/traits.hpp), not a storage type such as float.");
};
} // namespace detail

template <class P>
using storage_t = typename detail::checked_traits<P>::storage_type;
/// The storage type values of precision P travel in between processes.
template <class P>
using wire_t = typename detail::checked_traits<P>::wire_type;

namespace detail {
template <class S, class List>
struct precision_of_impl {}; // no precision stores S: no member `type`
template <class S, class P, class... Ps>
struct precision_of_impl<S, precision_list<P, Ps...>>
    : std::conditional_t<std::is_same_v<S, storage_t<P>>, std::type_identity<P>,
                         precision_of_impl<S, precision_list<Ps...>>> {};
} // namespace detail

/// The tag whose storage type is S (float -> fp32, bfloat16 -> bf16, ...), found in
/// known_precisions.
template <class S>
struct precision_of : detail::precision_of_impl<S, known_precisions> {};
template <class S>
using precision_of_t = typename precision_of<std::remove_cv_t<S>>::type;

/// Calls f(P{}) for every precision P of known_precisions, in order.
template <class F>
constexpr void for_each_precision(F&& f) {
  [&]<class... Ps>(precision_list<Ps...>) { (f(Ps{}), ...); }(known_precisions{});
}

/// The position of P in known_precisions, -1 if absent (a compact run-time code for a precision).
template <class P>
constexpr int precision_index() {
  return []<class... Ps>(precision_list<Ps...>) {
    constexpr bool same[] = {std::is_same_v<P, Ps>...};
    for (int i = 0; i < static_cast<int>(sizeof...(Ps)); ++i)
      if (same[i]) return i;
    return -1;
  }(known_precisions{});
}

} // namespace tessera
