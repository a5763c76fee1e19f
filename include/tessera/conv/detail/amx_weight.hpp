#pragma once

/// Backward-weight on AMX tiles (host CPUs with usable AMX-BF16; x and dy exact in bf16, stride 1).
///
/// dW(k, c, r, s) = sum over images and output pixels (p, q) of dy(k, p, q) x(c, p + r dh - pt,
/// q + s dw - pl). Transposed, dW^T(c, k) of one tap is a product whose reduction is the pixels:
/// - A (16 input channels x 32 pixels): each image's band of input rows is copied once as bf16
///   (cin planes of BH rows x Wp, zero-padded, Wp = Wout + (S - 1) dw), and the pixels are laid
///   out on the band's grid (pixel (p, q) at slot p Wp + q; the Wp - Wout slots after each row
///   are garbage). Tap (r, s) of slot t then reads band element t + r dh Wp + s dw: a tile row is
///   32 consecutive band elements and its 16 rows are 16 channel planes, so the A tile of any tap
///   is one strided TILELOADD from the band, no im2col.
/// - B (16 pairs of slots x 16 output channels): dy on the same grid (zeros in the garbage slots
///   and past the band's rows), pairs of slots transposed to rows of output channels once per
///   image (transpose16 of the 32-bit pair words), read by every tap.
/// TDPBF16PS adds C(c, k) += the products of both slots of each pair (exact products, fp32 sums,
/// denormals flushed, as the AMX GEMM). A register block is 32 channels x 32 output channels of
/// one tap (C tiles 0-3, A tiles 4-5, B tiles 6-7), loaded from the thread's fp32 sums, run over
/// every slot of a block of images and stored back; the threads' sums are added at the end.
///
/// A garbage slot multiplies a zero of dy by a real input: finite, it adds nothing; a band
/// holding Inf or NaN (0 x Inf = NaN) runs its images through exact loops over the true pairs
/// instead, so that only real products reach the sums.

#include <tessera/conv/detail/implicit.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tessera::detail {

#if !TESSERA_DEVICE_PASS

namespace implicit_conv {

#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16

/// The layout of the AMX backward-weight (see above).
struct weight_amx_layout {
  bool ok = false;
  index_t Wp = 0, BR = 0, BH = 0, bands = 0; ///< grid row, output and input rows of a band
  index_t slots = 0;                         ///< slots of a band: BR x Wp rounded up to 32
  index_t cpad = 0, kpad = 0;                ///< cin and cout rounded up to 16
  index_t NB = 0, nblk = 0;                  ///< images of a unit (at most), blocks of images
  index_t units(const geometry& g) const noexcept { return g.G * nblk * bands; }
  /// bf16 elements of an image's band: cpad planes of BH x Wp, then zeros for the reads of the
  /// last slots' taps (a multiple of 32: 64-byte aligned bands).
  std::size_t band_stride(const geometry& g) const noexcept {
    return static_cast<std::size_t>((cpad * BH * Wp + (g.S - 1) * g.dw + 63) / 32 * 32);
  }
  /// 32-bit words of an image's dy pairs: slots / 2 rows of kpad.
  std::size_t dyt_words() const noexcept { return static_cast<std::size_t>(slots / 2 * kpad); }
  /// Floats of a thread's sums: G x R*S x cpad x kpad (dW^T per group and tap).
  std::size_t sums_floats(const geometry& g) const noexcept {
    return static_cast<std::size_t>(g.G * g.R * g.S * cpad * kpad);
  }
  /// Bytes per thread: NB bands, NB dy pairs, 16 dy rows on the grid (bf16), the sums (each
  /// part a multiple of 64 bytes).
  std::size_t part_bytes(const geometry& g) const noexcept {
    return static_cast<std::size_t>(NB) * (band_stride(g) * 2 + dyt_words() * 4) +
           static_cast<std::size_t>(16 * slots * 2) + sums_floats(g) * 4;
  }
};

/// threads: the threads that will share the units (blocks of images made a multiple of it where
/// the batch allows). Not ok for strides above 1, where the padding of channels to 16 and of
/// rows to Wp would more than double the products, or for 1 x 1 kernels: there im2col + the AMX
/// GEMM reads x in place, while here copying dy onto the grid and transposing it cost as much as
/// the products (2 cin flops per element of dy; measured 0.6x of the GEMM on a 64 -> 256
/// channel 1 x 1 layer of 56 x 56, Xeon 0xCF).
inline weight_amx_layout weight_amx_layout_for(const geometry& g, index_t threads) {
  weight_amx_layout d;
  if (g.sh != 1 || g.sw != 1 || g.R * g.S == 1 || g.N < 1 || g.Hout < 1 || g.Wout < 1 ||
      g.cin < 1 || g.cout < 1)
    return d;
  d.cpad = (g.cin + 15) / 16 * 16;
  d.kpad = (g.cout + 15) / 16 * 16;
  d.Wp = g.Wout + (g.S - 1) * g.dw;
  if (d.cpad * d.kpad * d.Wp > 2 * g.cin * g.cout * g.Wout) return d;
  // A unit's bands and dy pairs stay in L2 (512 KiB: a quarter of Sapphire Rapids' 2 MiB).
  const index_t budget = index_t(512) << 10;
  const auto image = [&](index_t br) {
    return 2 * (d.cpad * (br + (g.R - 1) * g.dh) * d.Wp + (br * d.Wp + 31) / 32 * 32 * d.kpad);
  };
  index_t br = g.Hout;
  while (br > 1 && image(br) > budget) br = (br + 1) / 2;
  d.bands = (g.Hout + br - 1) / br;
  d.BR = (g.Hout + d.bands - 1) / d.bands;
  d.BH = d.BR + (g.R - 1) * g.dh;
  d.slots = (d.BR * d.Wp + 31) / 32 * 32;
  // Images per unit: a register block's reduction of 1024 slots or more (its 4 C tile loads
  // and stores beside at least 32 steps of 4 tile products), as many as fit the budget.
  const index_t fit = std::max<index_t>(1, budget / image(d.BR));
  const index_t want = std::clamp<index_t>((1024 + d.slots - 1) / d.slots, 1, std::min(fit, g.N));
  d.nblk = (g.N + want - 1) / want;
  if (d.bands * g.G % threads != 0)
    d.nblk = std::min(g.N, (d.nblk + threads - 1) / threads * threads);
  d.NB = (g.N + d.nblk - 1) / d.nblk;
  d.ok = true;
  return d;
}

/// One register block: the C tiles at c (NC blocks of 16 input channels, 16 ldc floats apart, x
/// NK blocks of 16 output channels) += the products over nb images (bands a_img elements apart,
/// dy pairs b_img words apart) and `steps` steps of 32 slots: A tiles at a (+ 16 planes for the
/// second channel block; rows `plane` elements apart), B tiles at b (rows ldb words apart). The
/// tiles are configured (hostgemm::amx_kernel::begin).
template <int NC, int NK>
[[gnu::noinline]] inline void amx_weight_block(index_t nb, index_t steps, const std::uint16_t* a,
                                               std::size_t a_img, index_t plane,
                                               const std::uint32_t* b, std::size_t b_img,
                                               index_t ldb, float* c, index_t ldc) {
  const auto pa = static_cast<long>(plane * 2), pb = static_cast<long>(ldb * 4),
             pc = static_cast<long>(ldc * 4);
  TESSERA_AMX_LOADD(0, c, pc);
  if constexpr (NK == 2) TESSERA_AMX_LOADD(1, c + 16, pc);
  if constexpr (NC == 2) TESSERA_AMX_LOADD(2, c + 16 * ldc, pc);
  if constexpr (NC == 2 && NK == 2) TESSERA_AMX_LOADD(3, c + 16 * ldc + 16, pc);
  for (index_t i = 0; i < nb; ++i) {
    const std::uint16_t* ai = a + i * a_img;
    const std::uint32_t* bi = b + i * b_img;
    for (index_t q = 0; q < steps; ++q) {
      TESSERA_AMX_LOADD(4, ai + q * 32, pa);
      TESSERA_AMX_LOADD(6, bi + q * 16 * ldb, pb);
      TESSERA_AMX_DPBF16PS(0, 4, 6);
      if constexpr (NK == 2) {
        TESSERA_AMX_LOADD(7, bi + q * 16 * ldb + 16, pb);
        TESSERA_AMX_DPBF16PS(1, 4, 7);
      }
      if constexpr (NC == 2) {
        TESSERA_AMX_LOADD(5, ai + 16 * plane + q * 32, pa);
        TESSERA_AMX_DPBF16PS(2, 5, 6);
        if constexpr (NK == 2) TESSERA_AMX_DPBF16PS(3, 5, 7);
      }
    }
  }
  TESSERA_AMX_STORED(0, c, pc);
  if constexpr (NK == 2) TESSERA_AMX_STORED(1, c + 16, pc);
  if constexpr (NC == 2) TESSERA_AMX_STORED(2, c + 16 * ldc, pc);
  if constexpr (NC == 2 && NK == 2) TESSERA_AMX_STORED(3, c + 16 * ldc + 16, pc);
}

/// Backward-weight through AMX tiles (d.ok): x (in: N images, G*cin channels; strides in_ns,
/// in_cs, in_hs; rows contiguous) and dy (N, G*cout, Hout x Wout contiguous per channel; strides
/// dy_ns, dy_cs) of bf16 or fp8 storage; store(k, kk, v) for every output channel k (of G*cout)
/// and tap kk = (c*R + r)*S + s with v = alpha * sum. scratch: parts_for(exec, g, d) *
/// d.part_bytes(g) bytes, 64-byte aligned.
template <class Exec, class TX, class TD, class Store>
void run_weight_amx(const Exec& exec, const geometry& g, const weight_amx_layout& d, const TX* in,
                    index_t in_ns, index_t in_cs, index_t in_hs, const TD* dy, index_t dy_ns,
                    index_t dy_cs, void* scratch, const Store& store) {
  const int parts = parts_for(exec, g, d);
  const index_t units = d.units(g), RS = g.R * g.S, cout = g.cout;
  const index_t plane = d.BH * d.Wp, cpad = d.cpad, kpad = d.kpad;
  const std::size_t per_part = d.part_bytes(g), band_stride = d.band_stride(g),
                    dyt_words = d.dyt_words(), used = static_cast<std::size_t>(g.cin * plane);
  const std::size_t sums_at = static_cast<std::size_t>(d.NB) * (band_stride * 2 + dyt_words * 4) +
                              static_cast<std::size_t>(16 * d.slots * 2);
  auto* base = static_cast<unsigned char*>(scratch);
  const geometry bg{.cin = g.cin, .Hin = g.Hin, .Win = g.Win, .pl = g.pl}; // for fill_band_bf16
  const direct_layout fl{.BH = d.BH, .Wp = d.Wp};
  const auto body = [&](const int part) {
    unsigned char* mine = base + static_cast<std::size_t>(part) * per_part;
    auto* bands = reinterpret_cast<std::uint16_t*>(mine);                     // NB x band
    auto* dyt = reinterpret_cast<std::uint32_t*>(bands + d.NB * band_stride); // NB x pairs
    auto* grid = reinterpret_cast<std::uint16_t*>(dyt + d.NB * dyt_words);    // 16 x slots
    auto* sums = reinterpret_cast<float*>(mine + sums_at);                    // G RS cpad kpad
    std::memset(sums, 0, sizeof(float) * d.sums_floats(g));
    for (index_t b = 0; b < d.NB; ++b) // the padded planes and the slack stay zero
      std::memset(bands + b * band_stride + used, 0, 2 * (band_stride - used));
    hostgemm::amx_kernel::begin();
    const index_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    for (index_t u = u0; u < u1; ++u) {
      const index_t gi = u / (d.nblk * d.bands), blk = u / d.bands % d.nblk;
      const index_t n0 = g.N * blk / d.nblk, nb = g.N * (blk + 1) / d.nblk - n0;
      const index_t p0 = u % d.bands * d.BR, rows = std::min(d.BR, g.Hout - p0);
      const index_t steps = (rows * d.Wp + 31) / 32;
      const TD* dyu = dy + n0 * dy_ns + gi * cout * dy_cs + p0 * g.Wout;
      bool finite = true;
      for (index_t b = 0; b < nb; ++b) {
        std::uint16_t* band = bands + b * band_stride;
        fill_band_bf16(bg, fl, in + (n0 + b) * in_ns + gi * g.cin * in_cs, in_cs, in_hs, p0 - g.pt,
                       band);
        finite = finite && all_finite(band, used);
        // dy on the grid, 16 output channels at a time, its pairs of slots transposed.
        const float* src[16];
        for (index_t k0 = 0; k0 < kpad; k0 += 16) {
          for (index_t i = 0; i < 16; ++i) {
            src[i] = nullptr;
            if (k0 + i >= cout) continue;
            std::uint16_t* row = grid + i * d.slots;
            const TD* dk = dyu + b * dy_ns + (k0 + i) * dy_cs;
            for (index_t p = 0; p < rows; ++p) {
              hostgemm::load_bf16(dk + p * g.Wout, row + p * d.Wp, g.Wout);
              std::memset(row + p * d.Wp + g.Wout, 0, 2 * static_cast<std::size_t>(d.Wp - g.Wout));
            }
            std::memset(row + rows * d.Wp, 0,
                        2 * static_cast<std::size_t>(steps * 32 - rows * d.Wp));
            src[i] = reinterpret_cast<const float*>(row);
          }
          transpose16(src, steps * 16, reinterpret_cast<float*>(dyt + b * dyt_words + k0), kpad);
        }
      }
      float* sg = sums + gi * RS * cpad * kpad;
      if (!finite) { // exact loops over the true pairs only (see above)
        for (index_t b = 0; b < nb; ++b)
          for (index_t c = 0; c < g.cin; ++c)
            for (index_t t = 0; t < RS; ++t) {
              const std::uint16_t* xb =
                  bands + b * band_stride + c * plane + t / g.S * g.dh * d.Wp + t % g.S * g.dw;
              for (index_t k = 0; k < cout; ++k) {
                const TD* dk = dyu + b * dy_ns + k * dy_cs;
                float v = 0.f;
                for (index_t p = 0; p < rows; ++p)
                  for (index_t q = 0; q < g.Wout; ++q)
                    v += bfloat16::from_bits(xb[p * d.Wp + q]).to_float() *
                         to_float(dk[p * g.Wout + q]);
                sg[(t * cpad + c) * kpad + k] += v;
              }
            }
        continue;
      }
      // The register block of 1 or 2 x 1 or 2 blocks of 16 channels.
      const auto block = [](bool c2, bool k2) {
        return c2 ? (k2 ? &amx_weight_block<2, 2> : &amx_weight_block<2, 1>)
                  : (k2 ? &amx_weight_block<1, 2> : &amx_weight_block<1, 1>);
      };
      // Taps innermost: a block's 32 channel planes and 32 channels of dy pairs (NB images)
      // are read by all R*S taps while they are in cache.
      for (index_t cb = 0; cb < cpad; cb += 32)
        for (index_t kb = 0; kb < kpad; kb += 32) {
          const bool c2 = cb + 32 <= cpad, k2 = kb + 32 <= kpad;
          for (index_t t = 0; t < RS; ++t) {
            const std::uint16_t* a = bands + cb * plane + t / g.S * g.dh * d.Wp + t % g.S * g.dw;
            const std::uint32_t* bw = dyt + kb;
            float* c = sg + (t * cpad + cb) * kpad + kb;
            block(c2, k2)(nb, steps, a, band_stride, plane, bw, dyt_words, kpad, c, kpad);
          }
        }
    }
    hostgemm::amx_kernel::end();
  };
  if (parts == 1) {
    body(0);
  } else {
    Kokkos::parallel_for(
        "tessera::conv2d_backward_weight[amx]",
        Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, parts), body);
  }
  // dw[k, kk] = alpha * (sum over threads, in order, of their sums): per input channel and
  // block of 16 output channels, so that both the sums (rows of kpad) and dw (rows of kred) are
  // read and written in runs (element by element along dw's rows, the sums of a 256-channel
  // layer were a cache miss each, half the time of the products).
  const float alpha = g.alpha;
  const index_t cin = g.cin, kbs = (cout + 15) / 16;
  Kokkos::parallel_for("tessera::conv2d_backward_weight[amx sum]",
                       Kokkos::RangePolicy<Exec>(exec, 0, g.G * cin * kbs), [=](const index_t i) {
                         const index_t gi = i / (cin * kbs), c = i / kbs % cin, k0 = i % kbs * 16;
                         const index_t k1 = std::min(cout, k0 + 16);
                         for (index_t t = 0; t < RS; ++t) {
                           const auto at =
                               static_cast<std::size_t>(((gi * RS + t) * cpad + c) * kpad);
                           float v[16] = {};
                           for (int p = 0; p < parts; ++p) {
                             const float* sp =
                                 reinterpret_cast<const float*>(
                                     base + per_part * static_cast<std::size_t>(p) + sums_at) +
                                 at;
                             for (index_t k = k0; k < k1; ++k) v[k - k0] += sp[k];
                           }
                           for (index_t k = k0; k < k1; ++k)
                             store(gi * cout + k, c * RS + t, alpha * v[k - k0]);
                         }
                       });
}

#endif // TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16

} // namespace implicit_conv

#endif // !TESSERA_DEVICE_PASS

} // namespace tessera::detail
