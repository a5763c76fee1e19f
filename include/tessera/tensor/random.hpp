#pragma once
/// \file tensor/random.hpp
/// Counter-based random numbers: element i of a tensor filled with seed s is a pure function of
/// (s, i), so the result does not depend on the thread count, the execution space or the order
/// in which elements are visited.

#include <tessera/config/macros.hpp>

#include <cmath>
#include <cstdint>

namespace tessera {

/// The counter-based generator: a 64-bit mix of (seed, stream, counter). The finalizer is
/// SplitMix64's (Steele, Lea, Flood 2014), whose output passes BigCrush when fed a counter.
struct counter_rng {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;

  TESSERA_INLINE static constexpr std::uint64_t mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// 64 random bits for counter i.
  TESSERA_INLINE constexpr std::uint64_t bits(std::uint64_t i) const noexcept {
    return mix(mix(seed ^ (stream * 0x9e3779b97f4a7c15ull)) + i * 0x9e3779b97f4a7c15ull);
  }
  /// Uniform in [0, 1) with 24 random bits (every value exactly a float).
  TESSERA_INLINE constexpr float uniform01(std::uint64_t i) const noexcept {
    return static_cast<float>(bits(i) >> 40) * 0x1.0p-24f;
  }
  /// Standard normal by Box-Muller on two independent 24-bit uniforms of the same counter.
  TESSERA_INLINE float normal(std::uint64_t i) const noexcept {
    const std::uint64_t b = bits(i);
    const float u1 = static_cast<float>((b >> 40) + 1) * 0x1.0p-24f; // (0, 1]
    const float u2 = static_cast<float>((b >> 16) & 0xffffffu) * 0x1.0p-24f;
    return ::sqrtf(-2.0f * ::logf(u1)) * ::cosf(6.2831853071795864769f * u2);
  }
};

} // namespace tessera
