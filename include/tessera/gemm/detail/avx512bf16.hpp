#pragma once
/// \file gemm/detail/avx512bf16.hpp
/// The AVX512_BF16 micro-kernel of gemm_algo::host_packed, for bf16 and fp8 inputs (any mix of
/// bf16, fp8_e4m3, fp8_e5m2 for A and B), on CPUs with VDPBF16PS but no usable AMX (AMD Zen 4
/// and 5, Intel Cooper Lake). Packing widens fp8 to bf16 exactly (every fp8 value is a bf16
/// value), as the AMX path does.
///
/// VDPBF16PS multiplies pairs of bf16 along K and adds both exact products to each fp32 lane:
/// c[j] += a[2q] b[2q][j] + a[2q + 1] b[2q + 1][j], with round-to-nearest-even, denormal inputs
/// and outputs flushed to zero, MXCSR ignored (Intel SDM, VDPBF16PS). It is fp32 accumulation of
/// exact products, one rounding per product added, so the fp32 error bound of the tests
/// (tests/support/tolerance.hpp, with its FLT_MIN term for the flushes) covers it. fp8 values
/// widened to bf16 are never bf16 denormals (the smallest, e5m2's 2^-16, is a normal bf16).
///
/// Packed layouts (32-bit words, each a bf16 pair (K = 2q, K = 2q + 1), K padded with a zero to
/// an even length):
///   A micro-panel: [kc/2][MR] words: one word per row is broadcast to all 16 lanes;
///   B micro-panel: [kc/2][NR] words: NR/16 vectors of 16 columns.
/// The register tile is MR x NR = 14 x 32 as in the fp32 kernel (host.hpp): 28 zmm accumulators,
/// 2 for the B row pair, the A pair broadcast folded into VDPBF16PS's {1to16} memory operand.
/// Per K pair: 28 VDPBF16PS (28 x 16 x 2 multiply-adds) for 2 vector loads and 14 broadcasts.
///
/// Compiled when the translation unit targets AVX512_BF16 (__AVX512BF16__, e.g. -march=native
/// on Zen 4 or later); used when cpu::has_avx512bf16() says so at run time and AMX is not
/// usable.

#include <tessera/config/cpu.hpp>
#include <tessera/gemm/detail/amx.hpp>
#include <tessera/gemm/detail/problem.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if !TESSERA_DEVICE_PASS && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define TESSERA_GEMM_AVX512BF16 1
#else
#define TESSERA_GEMM_AVX512BF16 0
#endif

namespace tessera::detail::hostgemm {

#if TESSERA_GEMM_AVX512BF16

struct dpbf16_kernel {
  static constexpr index_t NV = 2;
  static constexpr index_t MR = 14, NR = 16 * NV;
  /// KC: a B micro-panel (KC x NR bf16 = 512 * 32 * 2 = 32 KiB) stays in the 48 KiB L1d while
  /// the A micro-panels (14 * 512 * 2 = 14 KiB each) stream past it from L2.
  static constexpr index_t KC = 512;
  /// MC: the packed A block (MC x KC bf16 = 336 * 512 * 2 = 336 KiB) stays in the 1 MiB L2 of a
  /// Zen 5 core, beside the C rows being updated.
  static constexpr index_t MC = MR * 24;
  /// NC: C block columns (see host.hpp's fp32 kernel); the packed B block (K x NC bf16) is kept
  /// under 8 MiB (L3).
  static constexpr index_t NC_max = 1024;
  static constexpr std::size_t b_bytes = std::size_t(8) << 20;
  using packed_t = std::uint16_t;
  /// K is padded with a zero to whole bf16 pairs.
  static constexpr index_t k_align = 2;

  static std::uint32_t pair(std::uint16_t lo, std::uint16_t hi) noexcept {
    return static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
  }

  /// A(i0 .. i0+mc, p0 .. p0+kc) into micro-panels [mc/MR][kcp/2][MR] words, zero-padded.
  template <class VA>
  static void pack_a(const VA& a, index_t i0, index_t mc, index_t p0, index_t kc,
                     std::uint16_t* dst) {
    using S = typename VA::storage_type;
    const index_t s0 = a.stride(0), s1 = a.stride(1), kcp = (kc + 1) / 2 * 2, kq = kcp / 2;
    const S* base = a.data();
    std::uint16_t run[KC + MR];
    for (index_t ip = 0; ip < mc; ip += MR) {
      std::uint32_t* d = reinterpret_cast<std::uint32_t*>(dst + ip * kcp);
      const index_t rows = std::min(MR, mc - ip);
      if (s1 == 1 || s0 != 1) {
        // One row of K at a time (contiguous when s1 == 1), its pairs scattered MR words apart.
        for (index_t r = 0; r < rows; ++r) {
          const S* src = base + (i0 + ip + r) * s0 + p0 * s1;
          if (s1 == 1) {
            load_bf16(src, run, kc);
          } else {
            for (index_t p = 0; p < kc; ++p) run[p] = bf16_bits(src[p * s1]);
          }
          run[kc] = 0;
          for (index_t q = 0; q < kq; ++q) d[q * MR + r] = pair(run[2 * q], run[2 * q + 1]);
        }
      } else {
        // Columns of M are contiguous: columns 2q and 2q + 1 interleaved.
        std::uint16_t run1[MR];
        for (index_t q = 0; q < kq; ++q) {
          const index_t p = 2 * q;
          load_bf16(base + (p0 + p) * s1 + i0 + ip, run, rows);
          if (p + 1 < kc) {
            load_bf16(base + (p0 + p + 1) * s1 + i0 + ip, run1, rows);
          } else {
            std::memset(run1, 0, sizeof run1);
          }
          for (index_t r = 0; r < rows; ++r) d[q * MR + r] = pair(run[r], run1[r]);
        }
      }
      if (rows < MR)
        for (index_t q = 0; q < kq; ++q)
          for (index_t r = rows; r < MR; ++r) d[q * MR + r] = 0;
    }
  }

  /// B(p0 .. p0+kc, j0 .. j0+nc) into micro-panels [nc/NR][kcp/2][NR] words, zero-padded.
  template <class VB>
  static void pack_b(const VB& b, index_t p0, index_t kc, index_t j0, index_t nc,
                     std::uint16_t* dst) {
    using S = typename VB::storage_type;
    const index_t s0 = b.stride(0), s1 = b.stride(1), kcp = (kc + 1) / 2 * 2, kq = kcp / 2;
    const S* base = b.data();
    std::uint16_t run[KC > NR ? KC + 1 : NR];
    for (index_t jp = 0; jp < nc; jp += NR) {
      std::uint32_t* d = reinterpret_cast<std::uint32_t*>(dst + jp * kcp);
      const index_t cols = std::min(NR, nc - jp);
      if (s1 == 1) {
        // Rows of N are contiguous: rows 2q and 2q + 1 interleaved into pairs, 16 columns (one
        // vector of words) at a time.
        alignas(64) std::uint16_t r0[NR], r1[NR];
        for (index_t q = 0; q < kq; ++q) {
          const index_t p = 2 * q;
          load_bf16(base + (p0 + p) * s0 + j0 + jp, r0, cols);
          for (index_t j = cols; j < NR; ++j) r0[j] = 0;
          if (p + 1 < kc) {
            load_bf16(base + (p0 + p + 1) * s0 + j0 + jp, r1, cols);
            for (index_t j = cols; j < NR; ++j) r1[j] = 0;
          } else {
            std::memset(r1, 0, sizeof r1);
          }
          for (index_t v = 0; v < NV; ++v) {
            const __m512i lo = _mm512_cvtepu16_epi32(
                _mm256_load_si256(reinterpret_cast<const __m256i*>(r0 + 16 * v)));
            const __m512i hi = _mm512_cvtepu16_epi32(
                _mm256_load_si256(reinterpret_cast<const __m256i*>(r1 + 16 * v)));
            _mm512_store_si512(d + q * NR + 16 * v, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
          }
        }
      } else {
        // One column of K at a time (contiguous when s0 == 1), its pairs NR words apart.
        for (index_t j = 0; j < cols; ++j) {
          const S* src = base + p0 * s0 + (j0 + jp + j) * s1;
          if (s0 == 1) {
            load_bf16(src, run, kc);
          } else {
            for (index_t p = 0; p < kc; ++p) run[p] = bf16_bits(src[p * s0]);
          }
          run[kc] = 0;
          for (index_t q = 0; q < kq; ++q) d[q * NR + j] = pair(run[2 * q], run[2 * q + 1]);
        }
        if (cols < NR)
          for (index_t q = 0; q < kq; ++q)
            for (index_t j = cols; j < NR; ++j) d[q * NR + j] = 0;
      }
    }
  }

  static void begin() {}
  static void end() {}

  /// The MR x NR products of a_panel and b_panel over kcp (even), in registers.
  [[gnu::always_inline]] static inline void product(index_t kcp, const std::uint16_t* __restrict a,
                                                    const std::uint16_t* __restrict b,
                                                    __m512 (&c)[MR][NV]) {
    const auto* aw = reinterpret_cast<const std::uint32_t*>(a);
    const auto* bw = reinterpret_cast<const __m512i*>(b);
#pragma GCC unroll 14
    for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
    const index_t kq = kcp / 2;
    for (index_t q = 0; q < kq; ++q) {
      __m512bh bv[NV];
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_load_si512(bw + q * NV + v);
#pragma GCC unroll 14
      for (index_t r = 0; r < MR; ++r) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(aw[q * MR + r]));
#pragma GCC unroll 4
        for (index_t v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], av, bv[v]);
      }
    }
  }

  /// t (MR x NR fp32, row-major) = a_panel * b_panel over kcp (even).
  [[gnu::noinline]] static void micro(index_t kcp, const std::uint16_t* __restrict a,
                                      const std::uint16_t* __restrict b, float* __restrict t) {
    __m512 c[MR][NV];
    product(kcp, a, b, c);
#pragma GCC unroll 14
    for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v) _mm512_store_ps(t + r * NR + 16 * v, c[r][v]);
  }

  /// The full MR x NR fp32 tile at d (row stride ldd) = alpha * a_panel * b_panel + beta * d
  /// over kcp with alpha = ab[0], beta = ab[1] (beta == 0: d is not read; through memory so as
  /// not to hold two vector registers during the loop). The tile's rows are prefetched first:
  /// they are often 4 KiB apart and miss.
  [[gnu::noinline]] static void micro_c(index_t kcp, const std::uint16_t* __restrict a,
                                        const std::uint16_t* __restrict b, float* __restrict d,
                                        index_t ldd, const float* ab) {
#pragma GCC unroll 14
    for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v) __builtin_prefetch(d + r * ldd + 16 * v, 1, 3);
    __m512 c[MR][NV];
    product(kcp, a, b, c);
    const float beta = ab[1];
    const __m512 va = _mm512_set1_ps(ab[0]), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 14
    for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v) {
        float* p = d + r * ldd + 16 * v;
        __m512 x = _mm512_mul_ps(va, c[r][v]);
        if (beta == 1.f) {
          x = _mm512_fmadd_ps(va, c[r][v], _mm512_loadu_ps(p));
        } else if (beta != 0.f) {
          x = _mm512_fmadd_ps(va, c[r][v], _mm512_mul_ps(vb, _mm512_loadu_ps(p)));
        }
        _mm512_storeu_ps(p, x);
      }
  }
};

#endif // TESSERA_GEMM_AVX512BF16

} // namespace tessera::detail::hostgemm
