#pragma once
/// \file gemm/detail/fma.hpp
/// The fp32 FMA micro-kernel of gemm_algo::host_packed (any SIMD arch xsimd knows; tuned for
/// AVX-512) with its packing and the helpers it shares with the driver (gemm/detail/host.hpp):
/// the conversion of a run to float, the prefetch of a C tile and the update of a C tile from
/// registers. The implicit-GEMM convolution (conv/detail/implicit.hpp) runs this kernel on its
/// own packed panels and includes only this file.

#include <tessera/config/macros.hpp>
#include <tessera/gemm/detail/blocking.hpp>
#include <tessera/gemm/detail/host_pack.hpp>
#include <tessera/gemm/detail/problem.hpp>
#include <tessera/precision/vector_convert.hpp>
#include <tessera/simd/lanes.hpp>

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace tessera::detail {

#if !TESSERA_DEVICE_PASS

namespace hostgemm {
using arch = xsimd::default_arch;
inline constexpr bool have_simd = simd::available;

/// Converts n elements of a contiguous run to float.
template <class S>
inline void load_floats(const S* src, float* dst, index_t n) {
  if constexpr (std::is_same_v<S, float>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
  } else {
    convert_n<fp32>(src, dst, static_cast<std::size_t>(n));
  }
}

/// Asks for the rows of an MR x NR fp32 tile of C (row stride ld) to be brought into L1 while
/// the micro-kernel computes: consecutive rows are often 4 KiB apart and miss.
template <index_t MR, index_t NR>
[[gnu::always_inline]] inline void prefetch_tile(const float* d, index_t ld) {
#pragma GCC unroll 16
  for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (index_t j = 0; j < NR; j += 16) __builtin_prefetch(d + r * ld + j, 1, 3);
}

/// d (MR x NV vectors, row stride ld) = alpha * c + beta * d with alpha = ab[0], beta = ab[1];
/// beta == 0 does not read d. (alpha and beta come through memory, read only here: as float
/// arguments they would occupy two of the 32 vector registers the micro-kernel's loop needs.)
/// (post(v, r, j): a function of the vector v of row r at column j of the tile applied before
/// the store, the GEMM's epilogue ops in their vector form; the identity by default.)
struct no_post {
  template <class V>
  [[gnu::always_inline]] V operator()(const V& v, index_t, index_t) const {
    return v;
  }
};
template <index_t MR, index_t NV, class V, class Post = no_post>
[[gnu::always_inline]] inline void update_tile(V (&c)[MR][NV], float* d, index_t ld,
                                               const float* ab, const Post& post = {}) {
  constexpr index_t L = static_cast<index_t>(V::size);
  const float beta = ab[1];
  const V va(ab[0]), vb(beta);
  if (beta == 0.f) {
#pragma GCC unroll 16
    for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v)
        post(va * c[r][v], r, v * L).store_unaligned(d + r * ld + v * L);
  } else if (beta == 1.f) {
#pragma GCC unroll 16
    for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v) {
        float* p = d + r * ld + v * L;
        post(xsimd::fma(va, c[r][v], V::load_unaligned(p)), r, v * L).store_unaligned(p);
      }
  } else {
#pragma GCC unroll 16
    for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (index_t v = 0; v < NV; ++v) {
        float* p = d + r * ld + v * L;
        post(xsimd::fma(va, c[r][v], vb * V::load_unaligned(p)), r, v * L).store_unaligned(p);
      }
  }
}

// ---------------------------------------------------------------------------------------------
// fp32 FMA kernel (any SIMD arch xsimd knows; tuned for AVX-512)
// ---------------------------------------------------------------------------------------------

struct fma_kernel {
  using vf = xsimd::batch<float, arch>;
  static constexpr index_t L = static_cast<index_t>(vf::size);
  /// Register tile. AVX-512 has 32 vector registers of 16 floats: 14 x 32 uses 28 accumulators,
  /// 2 for the row of B and 1 for a broadcast of A; with 16 registers (AVX2) 6 x 2 vectors use
  /// 12 + 2 + 1. Per k: 28 FMAs for 2 vector loads and 14 broadcasts (loads), so the 2 FMA
  /// pipes, not the load ports, set the pace (the kernel alone, its data in L1/L2, runs at 98%
  /// of the measured FMA peak on the Zen 5 this was tuned on).
  static constexpr const char* name = "fma";
  static constexpr index_t NV = 2;
  static constexpr index_t NR = NV * L;
  static constexpr index_t MR = L >= 16 ? 14 : 6;
  // The blocking (KC, MC, NC) is chosen at run time from the CPU model by
  // gemm/detail/blocking.hpp; KC and MC here are the largest it may choose (the buffers below
  // are sized by them) and `shape` its anchors, measured on the Zen 5 this kernel was tuned on.
  /// KC: 512. A B micro-panel (KC x NR floats = 64 KiB) does not stay in the 48 KiB L1d; it and
  /// the A micro-panels stream from L2 (2 vectors + 14 floats per 14 cycles, a small share of
  /// what L2 delivers), and the C tiles are read and written half as often as with KC = 256,
  /// which kept the B micro-panel in L1. Measured (1 thread, Zen 5): KC 512 beat 256 and 384
  /// by 2 to 5% for sizes >= 1024, equal below.
  static constexpr index_t KC = 512;
  /// MC: 12 micro-panels per MiB of L2 (at most 24). On Zen 5's 1 MiB L2 the packed A block
  /// (MC x KC floats = 168 * 512 * 4 = 336 KiB) stays in L2, with room for the B micro-panel
  /// and C rows in flight.
  static constexpr index_t MC = MR * 24;
  static constexpr index_t k_align = 1;
  static constexpr kernel_shape shape{MR, KC, k_align, MC / MR, 12};
  /// NC: at most 1024 columns per packed B block (blocking::nc_max), and the block (K x NC)
  /// under blocking::b_bytes (8 MiB, in L3; B of 64 x 4096 x 4096 gives NC = 512).
  static constexpr index_t NC_max = 1024;
  using packed_t = float;
  /// fp32 B with contiguous rows is read in place, unpacked, when the part of it a thread uses
  /// is at most 1 MiB (k x n x 4 bytes) and at most L2 (blocking::in_place_b_bytes): packing
  /// it cost 3 to 6% at 128^3 .. 512^3 on Zen 5 (1 MiB L2), and its rows, a few KiB apart, stay
  /// in L2. Larger B (2048^3, or B re-read for many row blocks of
  /// A) ran 2 to 8% slower unpacked: rows 8 or 16 KiB apart compete for a few cache sets.
  static constexpr index_t in_place_b_bytes = index_t(1) << 20;
  /// ... and when its rows are at most a page apart. Rows farther apart put each row of a
  /// micro-panel on a page of its own, more pages than the first-level TLB holds: a 1x1
  /// convolution's image (B = x or dy, rows H W floats apart) read in place ran 0.66x the packed
  /// speed (res1x1_56 backward-data, 256 rows 12.5 KiB apart; 0.87x its forward, 64 rows; 0.77x
  /// res3x3_56 backward-data; Xeon family 6 model 0xCF, 1 thread, 2026-12-01).
  static constexpr index_t in_place_b_row_bytes = 4096;
  /// How many rows ahead the packing of a transposed A prefetches (host_pack.hpp).
  static constexpr index_t prefetch_rows = 16;

  /// A(i0 .. i0+mc, p0 .. p0+kc) into micro-panels [mc/MR][kc][MR], rows past mc zero.
  template <class VA>
  static void pack_a(const VA& a, index_t i0, index_t mc, index_t p0, index_t kc, float* dst) {
    using S = typename VA::storage_type;
    const index_t s0 = a.stride(0), s1 = a.stride(1);
    const S* base = a.data() + i0 * s0 + p0 * s1;
    if (s1 == 1 && MR <= 16) {
      // Rows of K are contiguous: per panel a transpose of rows x kc (converted first unless
      // fp32).
      for (index_t ip = 0; ip < mc; ip += MR) {
        const index_t rows = std::min(MR, mc - ip);
        const S* src = base + ip * s0;
        // The next panel's rows prefetched (host_pack.hpp, prefetch_bytes).
        for (index_t r = ip + MR; r < std::min(ip + 2 * MR, mc); ++r)
          prefetch_bytes(base + r * s0, std::size_t(kc) * sizeof(S));
        if constexpr (std::is_same_v<S, float>) {
          transpose_words(src, s0 * 4, rows, kc, dst + ip * kc, MR, MR);
        } else {
          float tmp[MR * KC];
          for (index_t r = 0; r < rows; ++r) load_floats(src + r * s0, tmp + r * KC, kc);
          transpose_words(tmp, KC * 4, rows, kc, dst + ip * kc, MR, MR);
        }
      }
    } else if (s0 == 1 && MR <= 32) {
      // Columns of M are contiguous: column by column (sequential reads), MR rows to each panel.
      float col[MC];
      for (index_t p = 0; p < kc; ++p) {
        if (p + prefetch_rows < kc)
          prefetch_bytes(base + (p + prefetch_rows) * s1, std::size_t(mc) * sizeof(S));
        const float* c;
        if constexpr (std::is_same_v<S, float>) {
          c = base + p * s1;
        } else {
          load_floats(base + p * s1, col, mc);
          c = col;
        }
        for (index_t ip = 0; ip < mc; ip += MR)
          copy_words(c + ip, std::min(MR, mc - ip), dst + ip * kc + p * MR, MR);
      }
    } else {
      for (index_t ip = 0; ip < mc; ip += MR) {
        float* d = dst + ip * kc;
        const index_t rows = std::min(MR, mc - ip);
        for (index_t p = 0; p < kc; ++p) {
          for (index_t r = 0; r < rows; ++r) d[p * MR + r] = to_float(base[(ip + r) * s0 + p * s1]);
          for (index_t r = rows; r < MR; ++r) d[p * MR + r] = 0.f;
        }
      }
    }
  }

  /// B(p0 .. p0+kc, j0 .. j0+nc) into micro-panels [nc/NR][kc][NR], columns past nc zero.
  template <class VB>
  static void pack_b(const VB& b, index_t p0, index_t kc, index_t j0, index_t nc, float* dst) {
    using S = typename VB::storage_type;
    const index_t s0 = b.stride(0), s1 = b.stride(1);
    const S* base = b.data() + p0 * s0 + j0 * s1;
    if (s1 == 1 && NR <= 32) {
      // Rows of N are contiguous: 8 rows at a time, NR columns of them to each panel. (Panel by
      // panel over all kc rows touches a new page per row: 30% slower on a 4096 x 4096 B.)
      constexpr index_t rows_per_step = 8;
      float row[NR];
      for (index_t r0 = 0; r0 < kc; r0 += rows_per_step) {
        const index_t r1 = std::min(kc, r0 + rows_per_step);
        // The step after next's rows prefetched (host_pack.hpp, prefetch_bytes).
        for (index_t p = r0 + 2 * rows_per_step; p < std::min(kc, r0 + 3 * rows_per_step); ++p)
          prefetch_bytes(base + p * s0, std::size_t(nc) * sizeof(S));
        for (index_t jp = 0; jp < nc; jp += NR) {
          const index_t cols = std::min(NR, nc - jp);
          float* d = dst + jp * kc;
          for (index_t p = r0; p < r1; ++p) {
            if constexpr (std::is_same_v<S, float>) {
              copy_words(base + p * s0 + jp, cols, d + p * NR, NR);
            } else {
              load_floats(base + p * s0 + jp, row, cols);
              copy_words(row, cols, d + p * NR, NR);
            }
          }
        }
      }
    } else if (s0 == 1 && NR % 16 == 0) {
      // Columns of K are contiguous: transposes of 16 columns x kc.
      for (index_t jp = 0; jp < nc; jp += NR) {
        float* d = dst + jp * kc;
        for (index_t j = 0; j < NR; j += 16) {
          const index_t cols = std::clamp<index_t>(nc - jp - j, 0, 16);
          const S* src = base + (jp + j) * s1;
          if constexpr (std::is_same_v<S, float>) {
            transpose_words(src, s1 * 4, cols, kc, d + j, NR, 16);
          } else {
            float tmp[16 * KC];
            for (index_t c = 0; c < cols; ++c) load_floats(src + c * s1, tmp + c * KC, kc);
            transpose_words(tmp, KC * 4, cols, kc, d + j, NR, 16);
          }
        }
      }
    } else {
      for (index_t jp = 0; jp < nc; jp += NR) {
        float* d = dst + jp * kc;
        const index_t cols = std::min(NR, nc - jp);
        for (index_t p = 0; p < kc; ++p) {
          for (index_t j = 0; j < cols; ++j) d[p * NR + j] = to_float(base[p * s0 + (jp + j) * s1]);
          for (index_t j = cols; j < NR; ++j) d[p * NR + j] = 0.f;
        }
      }
    }
  }

  static void begin() {}
  static void end() {}

  /// The R x (V vectors) products of a_panel and b_panel over kc, in registers: the first R rows
  /// and V vectors of the micro-panels (A packed, row stride MR; B packed, ldb = NR, or B itself
  /// read in place, ldb its row stride).
  template <index_t R, index_t V>
  [[gnu::always_inline]] static inline void product(index_t kc, const float* __restrict a,
                                                    const float* __restrict b, index_t ldb,
                                                    vf (&c)[R][V]) {
#pragma GCC unroll 14
    for (index_t r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (index_t v = 0; v < V; ++v) c[r][v] = vf(0.f);
    for (index_t p = 0; p < kc; ++p) {
      vf bv[V];
#pragma GCC unroll 2
      for (index_t v = 0; v < V; ++v) bv[v] = vf::load_unaligned(b + p * ldb + v * L);
#pragma GCC unroll 14
      for (index_t r = 0; r < R; ++r) {
        const vf av(a[p * MR + r]);
#pragma GCC unroll 2
        for (index_t v = 0; v < V; ++v) c[r][v] = xsimd::fma(av, bv[v], c[r][v]);
      }
    }
  }

  /// t (R x V vectors of a row-major MR x NR tile) = a_panel * b_panel over kc.
  template <index_t R, index_t V>
  [[gnu::noinline]] static void micro_rv(index_t kc, const float* __restrict a,
                                         const float* __restrict b, index_t ldb,
                                         float* __restrict t) {
    vf c[R][V];
    product<R, V>(kc, a, b, ldb, c);
#pragma GCC unroll 14
    for (index_t r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (index_t v = 0; v < V; ++v) c[r][v].store_aligned(t + r * NR + v * L);
  }

  /// t (MR x NR, row-major) = a_panel * b_panel over kc, for the first mr rows and nr columns
  /// (at least: edge tiles compute only the rows and vectors they need, rounded up to
  /// MR / 3, 2 MR / 3 or MR rows and to whole vectors).
  static void micro(index_t kc, const float* __restrict a, const float* __restrict b,
                    float* __restrict t, index_t mr = MR, index_t nr = NR, index_t ldb = NR) {
    constexpr index_t R1 = (MR + 2) / 3, R2 = (2 * MR + 2) / 3;
    if (nr > (NV - 1) * L) {
      if (mr > R2) return micro_rv<MR, NV>(kc, a, b, ldb, t);
      if (mr > R1) return micro_rv<R2, NV>(kc, a, b, ldb, t);
      return micro_rv<R1, NV>(kc, a, b, ldb, t);
    }
    if constexpr (NV > 1) {
      if (mr > R2) return micro_rv<MR, NV - 1>(kc, a, b, ldb, t);
      if (mr > R1) return micro_rv<R2, NV - 1>(kc, a, b, ldb, t);
      return micro_rv<R1, NV - 1>(kc, a, b, ldb, t);
    }
  }

  /// The full MR x NR tile at d (row stride ldd) = alpha * a_panel * b_panel + beta * d over kc
  /// with alpha = ab[0], beta = ab[1] (see update_tile).
  [[gnu::noinline]] static void micro_c(index_t kc, const float* __restrict a,
                                        const float* __restrict b, float* __restrict d, index_t ldd,
                                        const float* ab, index_t ldb = NR) {
    prefetch_tile<MR, NR>(d, ldd);
    vf c[MR][NV];
    product<MR, NV>(kc, a, b, ldb, c);
    update_tile<MR, NV>(c, d, ldd, ab);
  }

  /// micro_c with post(v, r, j) applied to each vector before its store (see update_tile): the
  /// GEMM's epilogue ops in their vector form (gemm/detail/host.hpp, vec_op).
  template <class Post>
  [[gnu::noinline]] static void
  micro_c_post(index_t kc, const float* __restrict a, const float* __restrict b,
               float* __restrict d, index_t ldd, const float* ab, index_t ldb, const Post& post) {
    prefetch_tile<MR, NR>(d, ldd);
    vf c[MR][NV];
    product<MR, NV>(kc, a, b, ldb, c);
    update_tile<MR, NV>(c, d, ldd, ab, post);
  }
};

} // namespace hostgemm

#endif // !TESSERA_DEVICE_PASS

} // namespace tessera::detail
