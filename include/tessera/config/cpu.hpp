#pragma once
/// \file config/cpu.hpp
/// What the host CPU can do, at compile time (what the compiler was allowed to emit) and at run
/// time (what this CPU and OS actually allow). Fast paths need both.

#include <tessera/config/macros.hpp>

namespace tessera::cpu {

/// Instruction sets the translation unit was compiled for.
struct compiled {
#if defined(__AVX512F__)
  static constexpr bool avx512f = true;
#else
  static constexpr bool avx512f = false;
#endif
#if defined(__AVX512BF16__)
  static constexpr bool avx512bf16 = true;
#else
  static constexpr bool avx512bf16 = false;
#endif
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  static constexpr bool amx_bf16 = true;
#else
  static constexpr bool amx_bf16 = false;
#endif
#if defined(__FMA__)
  static constexpr bool fma = true;
#else
  static constexpr bool fma = false;
#endif
};

/// Run-time check: does this CPU report the feature? (GCC/Clang builtin; false elsewhere.)
inline bool has_avx512bf16() noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) &&    \
    !TESSERA_DEVICE_PASS
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

} // namespace tessera::cpu
