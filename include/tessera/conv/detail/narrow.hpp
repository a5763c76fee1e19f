#pragma once
/// \file conv/detail/narrow.hpp
/// Forward convolution with a short reduction (C/groups * R * S < 64: a first layer, 1 or 3
/// input channels) on host spaces, stride 1: vectors along the output row, one pass, the
/// outputs stored straight into NCHW.
///
/// With a reduction of 9 (1 x 3 x 3) the GEMM's tiles are too thin: im2col + GEMM stores each
/// MR x NR tile after 9 steps and writes and reads a column matrix 9x the input (measured, Zen 5:
/// 0.5 of oneDNN), and the implicit paths' transposed stores cost more than the products. Here
/// a work unit is a band of output rows of one image and group; its input rows are copied,
/// zero-padded, once (fill_band: cin x BH x Wp floats, Wp = Wout + (S - 1) dw), and for each
/// output row, block of 2L columns (L floats a vector) and block of KB output channels the
/// micro-kernel (narrow_block) keeps KB x 2 vector sums: per tap (c, r, s) two unaligned loads
/// of the band row r shifted by s and KB broadcast weights, 2 KB FMAs. The sums of a channel
/// are a contiguous run of its output row, stored through the caller's store function (alpha,
/// bias, epilogue, rounding). Every output is summed in tap order by one thread: results do not
/// depend on the thread count. Any operand precision (widened to fp32 exactly while filling the
/// band and packing the weights: the products of bf16, fp16 and fp8 values are exact in fp32).

#include <tessera/config/kokkos_compat.hpp>
#include <tessera/conv/detail/implicit.hpp>

#include <algorithm>
#include <cstddef>

namespace tessera::detail {

#if !TESSERA_DEVICE_PASS

namespace narrow_conv {

using implicit_conv::geometry;
using implicit_conv::parts_for;
using vf = hostgemm::fma_kernel::vf;
inline constexpr index_t L = hostgemm::fma_kernel::L;
/// Output channels per register block: KB x 2 accumulators + 2 inputs + 1 weight fit the
/// registers (32 with AVX-512: 24 + 3; 16 with AVX2: 12 + 3).
inline constexpr index_t KB = L >= 16 ? 12 : 6;
/// The largest reduction taken (below it implicit_min_reduction sends convolutions here).
inline constexpr index_t max_reduction = 64;

/// The layout of a narrow convolution.
struct layout {
  bool ok = false;
  index_t Wp = 0, BR = 0, BH = 0, bands = 0; ///< band row, output rows and input rows per unit
  index_t blocks(const geometry& g) const noexcept { return (g.cout + KB - 1) / KB; }
  index_t units(const geometry& g) const noexcept { return g.N * g.G * bands; }
  /// Floats of a band, with slack for the last column block's reads past a row (2L).
  std::size_t band_floats(const geometry& g) const noexcept {
    return static_cast<std::size_t>((g.cin * BH * Wp + 2 * L + (g.S - 1) * g.dw + L - 1) / L * L);
  }
  /// Floats of a channel's sums over a band (its rows, then slack for a column block's
  /// extra columns).
  index_t sums_ld(const geometry& g) const noexcept { return BR * g.Wout + 2 * L; }
  /// Per thread: the band, then the sums of a block of channels (KB x sums_ld).
  std::size_t part_floats(const geometry& g) const noexcept {
    return band_floats(g) + static_cast<std::size_t>(KB * sums_ld(g));
  }
  /// Floats of the packed weights: per group and block, kred x KB.
  std::size_t weight_floats(const geometry& g) const noexcept {
    return static_cast<std::size_t>(g.G * blocks(g) * g.kred() * KB);
  }
};

/// Taken for stride 1 with a reduction under max_reduction and at least 8 output channels per
/// group (fewer leave most of a register block idle). even_rows: bands of an even number of
/// output rows (all but a last one of odd Hout), for a consumer of row pairs (2 x 2 pooling).
inline layout layout_for(const geometry& g, bool even_rows = false) {
  layout d;
  if (!hostgemm::have_simd || g.sh != 1 || g.sw != 1 || g.kred() >= max_reduction || g.cout < 8 ||
      g.Hout < 1 || g.Wout < 1 || g.N < 1)
    return d;
  d.Wp = g.Wout + (g.S - 1) * g.dw;
  // Bands of at most 32 KiB (in L1 with the packed weights of a block).
  const auto band = [&](index_t br) { return g.cin * (br + (g.R - 1) * g.dh) * d.Wp; };
  index_t br = g.Hout;
  while (br > 1 && band(br) * 4 > (index_t(32) << 10)) br = (br + 1) / 2;
  d.bands = (g.Hout + br - 1) / br;
  d.BR = (g.Hout + d.bands - 1) / d.bands;
  if (even_rows && d.BR % 2 != 0 && d.BR < g.Hout) { // every band starts at an even row
    ++d.BR;
    d.bands = (g.Hout + d.BR - 1) / d.BR;
  }
  d.BH = d.BR + (g.R - 1) * g.dh;
  d.ok = true;
  return d;
}

/// out[k * ldo + j] = sum over kk < kred of w[kk * KB + k] * a0[off[kk] + j], k < KB, j < 2L.
[[gnu::noinline]] inline void narrow_block(index_t kred, const float* __restrict a0,
                                           const index_t* __restrict off, const float* __restrict w,
                                           float* __restrict out, index_t ldo) {
  vf acc[KB][2];
#pragma GCC unroll 12
  for (index_t k = 0; k < KB; ++k) acc[k][0] = acc[k][1] = vf(0.f);
  for (index_t kk = 0; kk < kred; ++kk) {
    const float* a = a0 + off[kk];
    const vf x0 = vf::load_unaligned(a), x1 = vf::load_unaligned(a + L);
#pragma GCC unroll 12
    for (index_t k = 0; k < KB; ++k) {
      const vf wk(w[kk * KB + k]);
      acc[k][0] = xsimd::fma(wk, x0, acc[k][0]);
      acc[k][1] = xsimd::fma(wk, x1, acc[k][1]);
    }
  }
#pragma GCC unroll 12
  for (index_t k = 0; k < KB; ++k) {
    acc[k][0].store_unaligned(out + k * ldo);
    acc[k][1].store_unaligned(out + k * ldo + L);
  }
}

/// Packs the weights: group gi, block b of KB channels, tap kk at pw + ((gi * blocks + b) * kred
/// + kk) * KB + k = wval(gi, kk, b * KB + k) (zero past cout).
template <class Exec, class WVal>
void pack(const Exec& exec, const geometry& g, const layout& d, float* pw, const WVal& wval) {
  const index_t kred = g.kred(), nb = d.blocks(g);
  Kokkos::parallel_for("tessera::conv2d[narrow pack weights]",
                       Kokkos::RangePolicy<Exec>(exec, 0, g.G * nb), [=](const index_t i) {
                         const index_t gi = i / nb, b = i % nb;
                         float* dst = pw + i * kred * KB;
                         for (index_t kk = 0; kk < kred; ++kk)
                           for (index_t k = 0; k < KB; ++k)
                             dst[kk * KB + k] =
                                 b * KB + k < g.cout ? wval(gi, kk, b * KB + k) : 0.f;
                       });
}

/// The convolution (d.ok) of in (NCHW strides in_ns, in_cs, in_hs; W contiguous) with the packed
/// weights pw: rows(sums, k, n, p0, count) takes the fp32 sums of output channel k of image n,
/// output rows p0 .. p0 + count - 1 (Wout sums each, contiguous). scratch: g.kred()
/// offsets (index_t, rounded up to 64 bytes), then parts_for(exec, g, d) * d.part_floats(g)
/// floats.
template <class Exec, class T, class Rows>
void run(const Exec& exec, const geometry& g, const layout& d, const T* in, index_t in_ns,
         index_t in_cs, index_t in_hs, const float* pw, void* scratch, const Rows& rows_out) {
  const int parts = parts_for(exec, g, d);
  const index_t units = d.units(g), kred = g.kred(), nb = d.blocks(g);
  const auto* off = static_cast<const index_t*>(scratch);
  float* base = reinterpret_cast<float*>(implicit_conv::tap_offsets(g, g.cin, d.BH, d.Wp, scratch));
  const std::size_t band_n = d.band_floats(g), used = static_cast<std::size_t>(g.cin * d.BH * d.Wp),
                    per_part = d.part_floats(g);
  const index_t ld = d.sums_ld(g);
  const implicit_conv::direct_layout fl{.planes = g.cin, .BH = d.BH, .Wp = d.Wp}; // for fill_band
  const auto body = [&](const int part) {
    float* band = base + static_cast<std::size_t>(part) * per_part;
    float* sums = band + band_n; // KB x ld
    std::fill(band + used, band + band_n, 0.f);
    const index_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    for (index_t u = u0; u < u1; ++u) {
      const index_t n = u / (g.G * d.bands), gi = u / d.bands % g.G, p0 = u % d.bands * d.BR;
      const index_t rows = std::min(d.BR, g.Hout - p0);
      implicit_conv::fill_band(g, fl, in + n * in_ns + gi * g.cin * in_cs, in_cs, in_hs, p0 - g.pt,
                               band);
      for (index_t b = 0; b < nb; ++b) {
        const float* wb = pw + (gi * nb + b) * kred * KB;
        const index_t kn = std::min(KB, g.cout - b * KB);
        // The sums of a channel are its output rows, contiguous: a column block's columns
        // past Wout spill into the next row's first ones, which are computed after them.
        for (index_t p = 0; p < rows; ++p)
          for (index_t q0 = 0; q0 < g.Wout; q0 += 2 * L)
            narrow_block(kred, band + p * d.Wp + q0, off, wb, sums + p * g.Wout + q0, ld);
        for (index_t k = 0; k < kn; ++k) {
          const index_t kc = gi * g.cout + b * KB + k;
          rows_out(sums + k * ld, kc, n, p0, rows);
        }
      }
    }
  };
  if (parts == 1) {
    body(0);
  } else {
    Kokkos::parallel_for(
        "tessera::conv2d[narrow]",
        Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, parts), body);
  }
}

} // namespace narrow_conv

#endif // !TESSERA_DEVICE_PASS

} // namespace tessera::detail
