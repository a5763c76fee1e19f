#pragma once
/// \file config/cpu.hpp
/// What the host CPU can do, at compile time (what the compiler was allowed to emit) and at run
/// time (what this CPU and OS actually allow). Fast paths need both.

#include <tessera/config/macros.hpp>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && defined(__linux__) &&      \
    !TESSERA_DEVICE_PASS
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TESSERA_CPU_X86_LINUX 1
#else
#define TESSERA_CPU_X86_LINUX 0
#endif

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
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) &&     \
    !TESSERA_DEVICE_PASS
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

/// Run-time check for AMX bf16 tiles: the CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7), the
/// OS enables the tile state in XCR0 (bits 17 and 18), and Linux grants this process the
/// permission to use it (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)). The request is
/// made once per process (a function-local static); a refusal (an old kernel, a seccomp
/// filter, another OS) makes this false and callers fall back to the FMA path.
inline bool amx_bf16_usable() noexcept {
#if TESSERA_CPU_X86_LINUX
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1u)) return false; // OSXSAVE: xgetbv is usable
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3u) != 3u) return false;   // XTILECFG and XTILEDATA enabled by the OS
    constexpr long arch_req_xcomp_perm = 0x1023; // <asm/prctl.h>
    constexpr long xfeature_xtiledata = 18;      // the XSAVE feature number of the tile data
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

} // namespace tessera::cpu
