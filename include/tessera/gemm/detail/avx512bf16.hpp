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
#include <tessera/gemm/detail/blocking.hpp>
#include <tessera/gemm/detail/host_pack.hpp>
#include <tessera/gemm/detail/problem.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if !TESSERA_DEVICE_PASS && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define TESSERA_GEMM_AVX512BF16 1
#else
#define TESSERA_GEMM_AVX512BF16 0
#endif

namespace tessera::detail::hostgemm {

#if TESSERA_GEMM_AVX512BF16

struct dpbf16_kernel {
  static constexpr const char* name = "avx512bf16";
  static constexpr index_t NV = 2;
  static constexpr index_t MR = 14, NR = 16 * NV;
  // The blocking is chosen at run time by gemm/detail/blocking.hpp; KC and MC here are the
  // largest it may choose and `shape` its anchors (measured on Zen 5).
  /// KC: 1024, for the reasons of the fp32 kernel's 512 (fma.hpp): the B micro-panel (KC x NR
  /// bf16 = 64 KiB) and the A micro-panels stream from L2, C tiles are updated once per 1024
  /// of K. Measured (1 thread, Zen 5): KC 1024 beat 512 and 768 by 3 to 6% at sizes >= 512.
  static constexpr index_t KC = 1024;
  /// MC: 8 micro-panels per MiB of L2 (at most 16). On Zen 5's 1 MiB L2 the packed A block
  /// (MC x KC bf16 = 112 * 1024 * 2 = 224 KiB) stays in L2 (112 and 168 measured alike, 336
  /// 2% slower).
  static constexpr index_t MC = MR * 16;
  /// K is padded with a zero to whole bf16 pairs.
  static constexpr index_t k_align = 2;
  static constexpr kernel_shape shape{MR, KC, k_align, MC / MR, 8};
  /// NC: as the fp32 kernel: at most 1024 columns, the packed B block (K x NC bf16) under
  /// blocking::b_bytes.
  static constexpr index_t NC_max = 1024;
  using packed_t = std::uint16_t;
  /// How far ahead (in pairs of K rows) the packing of row-major B and transposed A prefetches
  /// (host_pack.hpp, prefetch_bytes): 8 pairs, 16 rows.
  static constexpr index_t prefetch_pairs = 8;

  /// Rows r < rows of `src` (row stride ld elements, kc elements each, K contiguous) as bf16
  /// pairs into d[q * MR + r] (q < kcp / 2), rows up to MR zero. bf16 rows of even length are
  /// read in place; others go through a converted, zero-padded copy.
  template <class S>
  static void pairs_from_rows(const S* src, index_t ld, index_t rows, index_t kc, std::uint32_t* d,
                              index_t ldd, index_t lanes) {
    if (std::is_same_v<S, bfloat16> && kc % 2 == 0) {
      transpose_words(src, ld * 2, rows, kc / 2, d, ldd, lanes);
    } else {
      alignas(64) std::uint16_t tmp[16 * (KC + 2)];
      for (index_t r = 0; r < rows; ++r) {
        load_bf16(src + r * ld, tmp + r * (KC + 2), kc);
        tmp[r * (KC + 2) + kc] = 0;
      }
      transpose_words(tmp, (KC + 2) * 2, rows, (kc + 1) / 2, d, ldd, lanes);
    }
  }

  /// A(i0 .. i0+mc, p0 .. p0+kc) into micro-panels [mc/MR][kcp/2][MR] words, zero-padded.
  template <class VA>
  static void pack_a(const VA& a, index_t i0, index_t mc, index_t p0, index_t kc,
                     std::uint16_t* dst) {
    using S = typename VA::storage_type;
    const index_t s0 = a.stride(0), s1 = a.stride(1), kcp = (kc + 1) / 2 * 2, kq = kcp / 2;
    const S* base = a.data() + i0 * s0 + p0 * s1;
    if (s1 == 1) {
      // Rows of K are contiguous: per panel a transpose of rows x kc/2 pairs.
      for (index_t ip = 0; ip < mc; ip += MR) {
        // The next panel's rows prefetched while this one is transposed (14 streams at once
        // are more than the hardware prefetchers keep).
        for (index_t r = ip + MR; r < std::min(ip + 2 * MR, mc); ++r)
          prefetch_bytes(base + r * s0, std::size_t(kc) * sizeof(S));
        pairs_from_rows(base + ip * s0, s0, std::min(MR, mc - ip), kc,
                        reinterpret_cast<std::uint32_t*>(dst + ip * kcp), MR, MR);
      }
    } else if (s0 == 1) {
      // Columns of M are contiguous: columns 2q and 2q + 1 (sequential reads) interleaved into
      // pairs, MR rows to each panel.
      alignas(64) std::uint16_t col0[MC], col1[MC];
      const __mmask16 out = static_cast<__mmask16>((1u << MR) - 1u);
      for (index_t q = 0; q < kq; ++q) {
        const index_t p = 2 * q;
        const bool two = p + 1 < kc;
        for (index_t f = p + 2 * prefetch_pairs; f < p + 2 * prefetch_pairs + 2 && f < kc; ++f)
          prefetch_bytes(base + f * s1, std::size_t(mc) * sizeof(S));
        const std::uint16_t *c0 = col0, *c1 = col1;
        if constexpr (std::is_same_v<S, bfloat16>) {
          c0 = reinterpret_cast<const std::uint16_t*>(base + p * s1);
          if (two) c1 = reinterpret_cast<const std::uint16_t*>(base + (p + 1) * s1);
        } else {
          load_bf16(base + p * s1, col0, mc);
          if (two) load_bf16(base + (p + 1) * s1, col1, mc);
        }
        for (index_t ip = 0; ip < mc; ip += MR) {
          const index_t rows = std::min(MR, mc - ip);
          const __mmask16 in = static_cast<__mmask16>((1u << rows) - 1u);
          const __m256i lo = _mm256_maskz_loadu_epi16(in, c0 + ip);
          const __m256i hi = two ? _mm256_maskz_loadu_epi16(in, c1 + ip) : _mm256_setzero_si256();
          const __m512i w = _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                            _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
          _mm512_mask_storeu_epi32(reinterpret_cast<std::uint32_t*>(dst + ip * kcp) + q * MR, out,
                                   w);
        }
      }
    } else {
      for (index_t ip = 0; ip < mc; ip += MR) {
        auto* d = reinterpret_cast<std::uint32_t*>(dst + ip * kcp);
        const index_t rows = std::min(MR, mc - ip);
        for (index_t q = 0; q < kq; ++q) {
          const index_t p = 2 * q;
          for (index_t r = 0; r < rows; ++r) {
            const std::uint16_t lo = bf16_bits(base[(ip + r) * s0 + p * s1]);
            const std::uint16_t hi = p + 1 < kc ? bf16_bits(base[(ip + r) * s0 + (p + 1) * s1]) : 0;
            d[q * MR + r] = static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
          }
          for (index_t r = rows; r < MR; ++r) d[q * MR + r] = 0;
        }
      }
    }
  }

  /// B(p0 .. p0+kc, j0 .. j0+nc) into micro-panels [nc/NR][kcp/2][NR] words, zero-padded.
  template <class VB>
  static void pack_b(const VB& b, index_t p0, index_t kc, index_t j0, index_t nc,
                     std::uint16_t* dst) {
    using S = typename VB::storage_type;
    const index_t s0 = b.stride(0), s1 = b.stride(1), kcp = (kc + 1) / 2 * 2, kq = kcp / 2;
    const S* base = b.data() + p0 * s0 + j0 * s1;
    if (s1 == 1) {
      // Rows of N are contiguous: rows 2q and 2q + 1 (sequential reads) interleaved into pairs,
      // 32 columns (two vectors of pairs) per step: lane 2j from row 2q, 2j + 1 from 2q + 1.
      static_assert(NR == 32);
      alignas(64) static constexpr std::uint16_t idx_lo[32] = {
          0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
          8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
      const __m512i ilo = _mm512_load_si512(idx_lo);
      const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
      alignas(64) std::uint16_t row0[NC_max], row1[NC_max];
      for (index_t q = 0; q < kq; ++q) {
        const index_t p = 2 * q;
        const bool two = p + 1 < kc;
        for (index_t f = p + 2 * prefetch_pairs; f < p + 2 * prefetch_pairs + 2 && f < kc; ++f)
          prefetch_bytes(base + f * s0, std::size_t(nc) * sizeof(S));
        const std::uint16_t *r0, *r1;
        if constexpr (std::is_same_v<S, bfloat16>) {
          r0 = reinterpret_cast<const std::uint16_t*>(base + p * s0);
          r1 = two ? reinterpret_cast<const std::uint16_t*>(base + (p + 1) * s0) : r0;
        } else {
          load_bf16(base + p * s0, row0, nc);
          if (two) load_bf16(base + (p + 1) * s0, row1, nc);
          r0 = row0;
          r1 = row1;
        }
        for (index_t jp = 0; jp < nc; jp += NR) {
          const index_t cols = std::min(NR, nc - jp);
          const __mmask32 m = cols == 32 ? ~__mmask32(0) : (__mmask32(1) << cols) - 1u;
          const __m512i lo = _mm512_maskz_loadu_epi16(m, r0 + jp);
          const __m512i hi = two ? _mm512_maskz_loadu_epi16(m, r1 + jp) : _mm512_setzero_si512();
          auto* d = reinterpret_cast<std::uint32_t*>(dst + jp * kcp) + q * NR;
          _mm512_store_si512(d, _mm512_permutex2var_epi16(lo, ilo, hi));
          _mm512_store_si512(d + 16, _mm512_permutex2var_epi16(lo, ihi, hi));
        }
      }
    } else if (s0 == 1) {
      // Columns of K are contiguous: transposes of 16 columns x kc/2 pairs.
      for (index_t jp = 0; jp < nc; jp += NR) {
        auto* d = reinterpret_cast<std::uint32_t*>(dst + jp * kcp);
        for (index_t j = 0; j < NR; j += 16)
          pairs_from_rows(base + (jp + j) * s1, s1, std::clamp<index_t>(nc - jp - j, 0, 16), kc,
                          d + j, NR, 16);
      }
    } else {
      for (index_t jp = 0; jp < nc; jp += NR) {
        auto* d = reinterpret_cast<std::uint32_t*>(dst + jp * kcp);
        const index_t cols = std::min(NR, nc - jp);
        for (index_t q = 0; q < kq; ++q) {
          const index_t p = 2 * q;
          for (index_t j = 0; j < cols; ++j) {
            const std::uint16_t lo = bf16_bits(base[p * s0 + (jp + j) * s1]);
            const std::uint16_t hi = p + 1 < kc ? bf16_bits(base[(p + 1) * s0 + (jp + j) * s1]) : 0;
            d[q * NR + j] = static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
          }
          for (index_t j = cols; j < NR; ++j) d[q * NR + j] = 0;
        }
      }
    }
  }

  static void begin() {}
  static void end() {}

  /// The R x (V vectors) products of a_panel and b_panel over kcp (even), in registers: the
  /// first R rows and V vectors of the packed micro-panels.
  template <index_t R, index_t V>
  [[gnu::always_inline]] static inline void product(index_t kcp, const std::uint16_t* __restrict a,
                                                    const std::uint16_t* __restrict b,
                                                    __m512 (&c)[R][V]) {
    const auto* aw = reinterpret_cast<const std::uint32_t*>(a);
    const auto* bw = reinterpret_cast<const __m512i*>(b);
#pragma GCC unroll 14
    for (index_t r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < V; ++v) c[r][v] = _mm512_setzero_ps();
    const index_t kq = kcp / 2;
    for (index_t q = 0; q < kq; ++q) {
      __m512bh bv[V];
#pragma GCC unroll 4
      for (index_t v = 0; v < V; ++v) bv[v] = (__m512bh)_mm512_load_si512(bw + q * NV + v);
#pragma GCC unroll 14
      for (index_t r = 0; r < R; ++r) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(aw[q * MR + r]));
#pragma GCC unroll 4
        for (index_t v = 0; v < V; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], av, bv[v]);
      }
    }
  }

  /// t (R x V vectors of a row-major MR x NR fp32 tile) = a_panel * b_panel over kcp.
  template <index_t R, index_t V>
  [[gnu::noinline]] static void micro_rv(index_t kcp, const std::uint16_t* __restrict a,
                                         const std::uint16_t* __restrict b, float* __restrict t) {
    __m512 c[R][V];
    product<R, V>(kcp, a, b, c);
#pragma GCC unroll 14
    for (index_t r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < V; ++v) _mm512_store_ps(t + r * NR + 16 * v, c[r][v]);
  }

  /// t (MR x NR fp32, row-major) = a_panel * b_panel over kcp (even), for the first mr rows
  /// and nr columns at least (edge tiles: 5, 10 or 14 rows, 16 or 32 columns).
  static void micro(index_t kcp, const std::uint16_t* __restrict a,
                    const std::uint16_t* __restrict b, float* __restrict t, index_t mr = MR,
                    index_t nr = NR) {
    static_assert(NV == 2);
    if (nr > 16) {
      if (mr > 10) return micro_rv<MR, 2>(kcp, a, b, t);
      if (mr > 5) return micro_rv<10, 2>(kcp, a, b, t);
      return micro_rv<5, 2>(kcp, a, b, t);
    }
    if (mr > 10) return micro_rv<MR, 1>(kcp, a, b, t);
    if (mr > 5) return micro_rv<10, 1>(kcp, a, b, t);
    return micro_rv<5, 1>(kcp, a, b, t);
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
    product<MR, NV>(kcp, a, b, c);
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
