#pragma once
/// \file precision/convert.hpp
/// Scalar conversions between the storage types, device-callable. Every conversion goes through
/// float: widening is exact, so bf16 -> fp8 rounds once, exactly as float -> fp8 would.
///
///   float f = tessera::to_float(x);                       // any storage type, exact
///   auto y = tessera::from_float<fp8_e4m3, saturate>(f);  // rounds to nearest even

#include <tessera/precision/policies.hpp>
#include <tessera/precision/traits.hpp>

namespace tessera {

TESSERA_INLINE constexpr float to_float(float x) noexcept { return x; }
TESSERA_INLINE constexpr float to_float(bfloat16 x) noexcept { return x.to_float(); }
TESSERA_INLINE constexpr float to_float(float8_e4m3 x) noexcept { return x.to_float(); }
TESSERA_INLINE constexpr float to_float(float8_e5m2 x) noexcept { return x.to_float(); }

/// The default overflow policy of a format: IEEE behaviour for fp32 and bf16, saturation for
/// fp8 (what fp8 training uses).
template <Precision P>
using default_overflow_t = std::conditional_t<precision_traits<P>::bits == 8, saturate,
                                              overflow_to_inf_nan>;

/// float -> storage of precision P, rounding to nearest even.
template <Precision P, OverflowPolicy Policy = default_overflow_t<P>>
TESSERA_INLINE constexpr storage_t<P> from_float(float f) noexcept {
  if constexpr (std::is_same_v<P, fp32>) {
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
