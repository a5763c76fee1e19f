#pragma once
/// \file gemm/detail/amx.hpp
/// The AMX micro-kernel of gemm_algo::host_packed, for bf16 and fp8 inputs (any mix of bf16,
/// fp8_e4m3, fp8_e5m2 for A and B): packing widens fp8 to bf16, exactly (every fp8 value is a
/// bf16 value), and TDPBF16PS accumulates in fp32.
///
/// Register tile: 32 x 32 outputs in the 4 accumulator tiles C00 C01 C10 C11 (16 x 16 fp32
/// each), fed per 32-step of K by 2 A tiles (16 rows x 32 bf16) and 2 B tiles (16 pairs of K x
/// 16 columns, the "VNNI" layout of bf16 pairs): all 8 tile registers. Each step is 4
/// TDPBF16PS (4 x 16 x 16 x 32 multiply-adds) for 4 KiB of tile loads.
///
/// Compiled only when the translation unit targets AMX (__AMX_TILE__ and __AMX_BF16__, e.g.
/// -march=native on a Sapphire Rapids or later Xeon); used only when cpu::amx_bf16_usable()
/// (CPU, OS and the Linux permission request) says so at run time. Tests also compile it with
/// TESSERA_GEMM_AMX_EMULATE on any AVX-512 machine: the tile instructions then come from the
/// software model of gemm/detail/amx_emulation.hpp (test_gemm_amx_emulated), so the packing,
/// tile configuration and indexing below run against the reference without AMX hardware.

#include <tessera/config/cpu.hpp>
#include <tessera/gemm/detail/blocking.hpp>
#include <tessera/gemm/detail/problem.hpp>
#include <tessera/precision/vector_convert.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if !TESSERA_DEVICE_PASS &&                                                                        \
    (defined(__AVX512VBMI__) || defined(__AMX_TILE__) || defined(TESSERA_GEMM_AMX_EMULATE))
#include <immintrin.h>
#endif
// The tile instructions: the real ones where the translation unit targets AMX, else (tests
// only, TESSERA_GEMM_AMX_EMULATE on an AVX-512 target, which packing needs) the software model
// of gemm/detail/amx_emulation.hpp, so that the kernel's code is the same in both.
#if !TESSERA_DEVICE_PASS && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define TESSERA_GEMM_AMX 1
#define TESSERA_GEMM_AMX_EMULATED 0
#define TESSERA_AMX_LOADCONFIG(cfg) _tile_loadconfig(cfg)
#define TESSERA_AMX_RELEASE() _tile_release()
#define TESSERA_AMX_ZERO(t) _tile_zero(t)
#define TESSERA_AMX_LOADD(t, p, s) _tile_loadd(t, p, s)
#define TESSERA_AMX_STORED(t, p, s) _tile_stored(t, p, s)
#define TESSERA_AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#elif !TESSERA_DEVICE_PASS && defined(TESSERA_GEMM_AMX_EMULATE) && defined(__AVX512BW__)
#include <tessera/gemm/detail/amx_emulation.hpp>
#define TESSERA_GEMM_AMX 1
#define TESSERA_GEMM_AMX_EMULATED 1
#define TESSERA_AMX_LOADCONFIG(cfg) amx_emulation::loadconfig(cfg)
#define TESSERA_AMX_RELEASE() amx_emulation::release()
#define TESSERA_AMX_ZERO(t) amx_emulation::zero(t)
#define TESSERA_AMX_LOADD(t, p, s) amx_emulation::loadd(t, p, s)
#define TESSERA_AMX_STORED(t, p, s) amx_emulation::stored(t, p, s)
#define TESSERA_AMX_DPBF16PS(c, a, b) amx_emulation::dpbf16ps(c, a, b)
#else
#define TESSERA_GEMM_AMX 0
#define TESSERA_GEMM_AMX_EMULATED 0
#endif

namespace tessera::detail::hostgemm {

/// bf16 bit patterns of the 256 codes of an fp8 format (exact widening), built once.
template <class S>
struct fp8_to_bf16_table {
  std::uint16_t v[256];
  constexpr fp8_to_bf16_table() : v{} {
    for (int i = 0; i < 256; ++i) {
      const float f = S{static_cast<std::uint8_t>(i)}.to_float();
      v[i] = static_cast<std::uint16_t>(bit_cast<std::uint32_t>(f) >> 16);
    }
  }
};

/// The low and high bytes of fp8_to_bf16_table, as two 256-byte tables (for byte shuffles),
/// and the byte order that interleaves 32 low and 32 high bytes into 32 bf16: byte 2k of the
/// output is low byte k, byte 2k + 1 high byte k (index bit 6 picks the second source).
template <class S>
struct fp8_to_bf16_bytes {
  alignas(64) std::uint8_t lo[256];
  alignas(64) std::uint8_t hi[256];
  alignas(64) std::uint8_t order[128]; ///< elements 0..31, then 32..63
  constexpr fp8_to_bf16_bytes() : lo{}, hi{}, order{} {
    const fp8_to_bf16_table<S> t{};
    for (int i = 0; i < 256; ++i) {
      lo[i] = static_cast<std::uint8_t>(t.v[i] & 0xff);
      hi[i] = static_cast<std::uint8_t>(t.v[i] >> 8);
    }
    for (int k = 0; k < 64; ++k) {
      order[k] = static_cast<std::uint8_t>((k >> 1) | (k & 1) << 6);
      order[64 + k] = static_cast<std::uint8_t>((32 + (k >> 1)) | (k & 1) << 6);
    }
  }
};

/// bf16 bits of one element of storage type S (bf16: as is; fp8: exact; fp32: rounded).
template <class S>
inline std::uint16_t bf16_bits(S x) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>) {
    return x.bits;
  } else if constexpr (std::is_same_v<S, float>) {
    return bfloat16::from_float(x).bits;
  } else {
    static constexpr fp8_to_bf16_table<S> table{};
    return table.v[x.bits];
  }
}

/// A contiguous run of n elements to bf16 bits.
template <class S>
inline void load_bf16(const S* src, std::uint16_t* dst, index_t n) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * 2);
  } else {
    index_t i = 0;
#if !TESSERA_DEVICE_PASS && defined(__AVX512VBMI__)
    if constexpr (!std::is_same_v<S, float>) {
      // fp8: 64 codes per step through the byte tables: each byte of the bf16 is one 256-entry
      // lookup (two 128-entry VPERMI2B, chosen by the code's top bit), then the two bytes are
      // interleaved. Bit-identical to the table (and so to the scalar conversion).
      if (n >= 64) {
        static constexpr fp8_to_bf16_bytes<S> t{};
        const auto* in = reinterpret_cast<const std::uint8_t*>(src);
        const __m512i lo0 = _mm512_load_si512(t.lo), lo1 = _mm512_load_si512(t.lo + 64),
                      lo2 = _mm512_load_si512(t.lo + 128), lo3 = _mm512_load_si512(t.lo + 192);
        const __m512i hi0 = _mm512_load_si512(t.hi), hi1 = _mm512_load_si512(t.hi + 64),
                      hi2 = _mm512_load_si512(t.hi + 128), hi3 = _mm512_load_si512(t.hi + 192);
        const __m512i first = _mm512_load_si512(t.order), second = _mm512_load_si512(t.order + 64);
        for (; i + 64 <= n; i += 64) {
          const __m512i x = _mm512_loadu_si512(in + i);
          const __mmask64 top = _mm512_movepi8_mask(x);
          const __m512i l = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(lo0, x, lo1),
                                                   _mm512_permutex2var_epi8(lo2, x, lo3));
          const __m512i h = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(hi0, x, hi1),
                                                   _mm512_permutex2var_epi8(hi2, x, hi3));
          _mm512_storeu_si512(dst + i, _mm512_permutex2var_epi8(l, first, h));
          _mm512_storeu_si512(dst + i + 32, _mm512_permutex2var_epi8(l, second, h));
        }
      }
    }
#endif
#if !TESSERA_DEVICE_PASS
    if constexpr (simd::available && !std::is_same_v<S, float>) {
      // fp8 codes -> float bit patterns in 32-bit lanes (precision/vector_convert.hpp's exact
      // decode) -> their top 16 bits, which are the bf16 (the low 16 are zero for fp8 values).
      using A = xsimd::default_arch;
      constexpr index_t L = static_cast<index_t>(simd::lanes<A>::size);
      for (; i + L <= n; i += L) {
        const auto u = vector_decode<S, A>(simd::load_widened<A, 1>(src + i));
        simd::store_narrowed<A, 2>(dst + i, u >> 16);
      }
    }
#endif
    for (; i < n; ++i) dst[i] = bf16_bits(src[i]);
  }
}

/// Precisions the bf16 kernels (AMX tiles, AVX512_BF16 dot products) take: those whose every
/// value is a bf16 (precision_traits<P>::exact_in_bf16: bf16 and fp8, not fp32 nor fp16).
template <class P>
inline constexpr bool amx_input_v = precision_traits<P>::exact_in_bf16;

/// The AMX kernel's shape for the blocking rule (amx_kernel below; here also where the kernel is
/// not compiled, so that the choice can be tested on any machine): 32-row tiles, KC 512 in
/// steps of 32, at most 16 panels, 4 per MiB of L2.
inline constexpr kernel_shape amx_shape{32, 512, 32, 16, 4};

#if TESSERA_GEMM_AMX

struct amx_kernel {
  static constexpr const char* name = "amx";
  static constexpr index_t MR = 32, NR = 32;
  // The blocking is chosen at run time by gemm/detail/blocking.hpp; KC and MC here are the
  // largest it may choose and `shape` its anchors (designed for Sapphire Rapids, not measured).
  /// KC: a B micro-panel (KC x NR bf16 = 512 * 32 * 2 = 32 KiB) stays in the 48 KiB L1d.
  static constexpr index_t KC = 512;
  /// MC: 4 micro-panels per MiB of L2 (at most 16): on Sapphire Rapids' 2 MiB L2 the packed A
  /// block (MC x KC bf16 = 256 * 512 * 2 = 256 KiB) stays in L2.
  static constexpr index_t MC = MR * 16;
  static constexpr kernel_shape shape = amx_shape;
  /// NC: the C block (MC x NC fp32 = 256 * 1024 * 4 = 1 MiB) stays in L2 across the KC slices;
  /// the packed B block (K x NC bf16) is kept under blocking::b_bytes (L3).
  static constexpr index_t NC_max = 1024;
  using packed_t = std::uint16_t;
  /// K is padded with zeros to whole 32-element tile steps.
  static constexpr index_t k_align = 32;
  static_assert(shape.mr == MR && shape.kc == KC && shape.k_align == k_align &&
                    shape.max_panels == MC / MR,
                "amx_shape must describe amx_kernel");

  /// A(i0.., p0..) into panels of 32 rows: [kcp/32][32 rows][32 k], zero-padded.
  template <class VA>
  static void pack_a(const VA& a, index_t i0, index_t mc, index_t p0, index_t kc,
                     std::uint16_t* dst) {
    using S = typename VA::storage_type;
    const index_t s0 = a.stride(0), s1 = a.stride(1), kcp = (kc + 31) / 32 * 32;
    const S* base = a.data();
    std::uint16_t row[KC];
    for (index_t ip = 0; ip < mc; ip += MR) {
      std::uint16_t* d = dst + ip * kcp;
      const index_t rows = std::min(MR, mc - ip);
      for (index_t r = 0; r < MR; ++r) {
        if (r < rows) {
          const S* src = base + (i0 + ip + r) * s0 + p0 * s1;
          if (s1 == 1) {
            load_bf16(src, row, kc);
          } else {
            for (index_t p = 0; p < kc; ++p) row[p] = bf16_bits(src[p * s1]);
          }
          for (index_t p = kc; p < kcp; ++p) row[p] = 0;
        } else {
          std::memset(row, 0, static_cast<std::size_t>(kcp) * 2);
        }
        for (index_t kk = 0; kk < kcp; kk += 32)
          std::memcpy(d + (kk + r) * 32, row + kk, 64); // (kk/32 * 32 + r) * 32 = (kk + r) * 32
      }
    }
  }

  /// B(p0.., j0..) into panels of 32 columns: [kcp/32][tile 0..1][16 pairs][16 cols][2].
  template <class VB>
  static void pack_b(const VB& b, index_t p0, index_t kc, index_t j0, index_t nc,
                     std::uint16_t* dst) {
    using S = typename VB::storage_type;
    const index_t s0 = b.stride(0), s1 = b.stride(1), kcp = (kc + 31) / 32 * 32;
    const S* base = b.data();
    std::uint16_t run[KC > NR ? KC : NR];
    for (index_t jp = 0; jp < nc; jp += NR) {
      std::uint16_t* d = dst + jp * kcp;
      const index_t cols = std::min(NR, nc - jp);
      const auto at = [&](index_t p, index_t j) -> std::uint16_t& {
        return d[(p >> 5) * 1024 + (j >> 4) * 512 + ((p & 31) >> 1) * 32 + (j & 15) * 2 + (p & 1)];
      };
      if (s0 == 1 || s1 != 1) {
        // Columns are contiguous (or nothing is): one column of K at a time.
        for (index_t j = 0; j < NR; ++j) {
          if (j < cols) {
            const S* src = base + p0 * s0 + (j0 + jp + j) * s1;
            if (s0 == 1) {
              load_bf16(src, run, kc);
            } else {
              for (index_t p = 0; p < kc; ++p) run[p] = bf16_bits(src[p * s0]);
            }
            for (index_t p = kc; p < kcp; ++p) run[p] = 0;
          } else {
            std::memset(run, 0, static_cast<std::size_t>(kcp) * 2);
          }
          for (index_t p = 0; p < kcp; ++p) at(p, j) = run[p];
        }
      } else {
        // Rows are contiguous: rows p and p + 1 interleaved into bf16 pairs, 16 columns (one
        // 64-byte tile row) at a time.
        std::uint16_t run1[NR];
        for (index_t p = 0; p < kcp; p += 2) {
          for (int h = 0; h < 2; ++h) {
            std::uint16_t* r = h ? run1 : run;
            if (p + h < kc) {
              load_bf16(base + (p0 + p + h) * s0 + j0 + jp, r, cols);
              for (index_t j = cols; j < NR; ++j) r[j] = 0;
            } else {
              std::memset(r, 0, sizeof(std::uint16_t) * NR);
            }
          }
          std::uint16_t* row = d + (p >> 5) * 1024 + ((p & 31) >> 1) * 32;
          for (index_t t = 0; t < 2; ++t) {
            const __m512i lo = _mm512_cvtepu16_epi32(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(run + 16 * t)));
            const __m512i hi = _mm512_cvtepu16_epi32(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(run1 + 16 * t)));
            _mm512_storeu_si512(row + 512 * t, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
          }
        }
      }
    }
  }

  /// Tile configuration (palette 1): 8 tiles of 16 rows x 64 bytes.
  struct alignas(64) tile_config {
    std::uint8_t palette = 1, start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  };
  static void begin() {
    static const tile_config cfg{};
    TESSERA_AMX_LOADCONFIG(&cfg);
  }
  static void end() { TESSERA_AMX_RELEASE(); }

  /// t (32 x 32 fp32, row-major) = a_panel * b_panel over kcp (a multiple of 32).
  static void micro(index_t kcp, const std::uint16_t* a, const std::uint16_t* b, float* t) {
    TESSERA_AMX_ZERO(0);
    TESSERA_AMX_ZERO(1);
    TESSERA_AMX_ZERO(2);
    TESSERA_AMX_ZERO(3);
    for (index_t kk = 0; kk < kcp; kk += 32) {
      const std::uint16_t* ak = a + kk * 32;
      const std::uint16_t* bk = b + kk * 32;
      TESSERA_AMX_LOADD(4, ak, 64);
      TESSERA_AMX_LOADD(6, bk, 64);
      TESSERA_AMX_LOADD(7, bk + 512, 64);
      TESSERA_AMX_DPBF16PS(0, 4, 6);
      TESSERA_AMX_DPBF16PS(1, 4, 7);
      TESSERA_AMX_LOADD(5, ak + 512, 64);
      TESSERA_AMX_DPBF16PS(2, 5, 6);
      TESSERA_AMX_DPBF16PS(3, 5, 7);
    }
    TESSERA_AMX_STORED(0, t, 128);
    TESSERA_AMX_STORED(1, t + 16, 128);
    TESSERA_AMX_STORED(2, t + 16 * 32, 128);
    TESSERA_AMX_STORED(3, t + 16 * 32 + 16, 128);
  }
};

#endif // TESSERA_GEMM_AMX

} // namespace tessera::detail::hostgemm
