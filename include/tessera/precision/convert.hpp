#pragma once
/// \file precision/convert.hpp
/// Scalar conversions between the storage types, device-callable. Every conversion goes through
/// float: widening is exact, so bf16 -> fp8 rounds once, exactly as float -> fp8 would.
///
///   float f = tessera::to_float(x);                       // any storage type, exact
///   auto y = tessera::from_float<fp8_e4m3, saturate>(f);  // rounds to nearest even

#include <tessera/precision/policies.hpp>
#include <tessera/precision/traits.hpp>

#include <concepts>

namespace tessera {

TESSERA_INLINE constexpr float to_float(float x) noexcept {
  return x;
}
/// Any storage type (bfloat16, float16, float8_e4m3, ...) to float, exactly.
template <class S>
requires requires(S s) {
  { s.to_float() } -> std::same_as<float>;
}
TESSERA_INLINE constexpr float to_float(S x) noexcept {
  return x.to_float();
}

/// The default overflow policy of a format (precision_traits<P>::overflow_policy): IEEE
/// behaviour for fp32, bf16 and fp16, saturation for the scaled fp8 formats (what fp8 training
/// uses).
template <Precision P>
using default_overflow_t = typename precision_traits<P>::overflow_policy;

/// float -> storage of precision P, rounding to nearest even.
template <Precision P, OverflowPolicy Policy = default_overflow_t<P>>
TESSERA_INLINE constexpr storage_t<P> from_float(float f) noexcept {
  if constexpr (precision_traits<P>::encoding == precision_encoding::binary32) {
    return f;
  } else {
    return storage_t<P>::template from_float<Policy>(f);
  }
}

/// Storage -> storage: widen to float (exact), then narrow once.
template <Precision To, OverflowPolicy Policy = default_overflow_t<To>, class From>
TESSERA_INLINE constexpr storage_t<To> convert(From x) noexcept {
  return from_float<To, Policy>(to_float(x));
}

} // namespace tessera
