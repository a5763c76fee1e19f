#pragma once
/// \file conv/detail/implicit.hpp
/// Implicit-GEMM convolution for host execution spaces: the GEMM's packed panels are gathered
/// straight from the input image, so no column matrix is written and read back.
///
/// As a GEMM, per image n and group g (cin input and cout output channels per group):
///   out[n, g*cout + j, m] = sum over kk = (c*R + r)*S + s of  A(m, kk) * B(kk, j)
///   A(m, kk) = in[n, g*cin + c, p*sh - pt + r*dh, q*sw - pl + s*dw]   (0 outside; m = p*Wout + q)
///   B(kk, j) = the weight of tap (c, r, s) for output channel j
/// Output pixels are the GEMM's rows (micro-panels of MR = 14 consecutive pixels, one 14-float
/// run of the input per tap when the panel lies in one output row), output channels its columns
/// (panels of NR = 32, so 32, 64, ... channels fill them exactly). The micro-kernel is the host
/// GEMM's (hostgemm::fma_kernel, fp32 FMA); its MR x NR results are summed in a C block (MC
/// pixels x all channels of the group, fp32) over the KC slices of the reduction, and the block
/// is written once to the NCHW output: alpha, bias, the epilogue and the rounding applied there.
///
/// Used for conv2d_forward, and for conv2d_backward_data with stride 1 (dx is then the
/// convolution of dy with the weights transposed per group and flipped in R and S, and padding
/// dilation*(R - 1) - pad, which may be negative: the gather checks bounds only).
/// conv2d_backward_weight has its own driver below (run_weight): its reduction runs over pixels.
///
/// Threads: B (the weights, a few MiB at most) is packed once per call, then the work units
/// (image, group, block of MC pixels) are shared out in contiguous ranges, one per thread, in
/// one parallel region; each thread packs its own A blocks and owns its C block (regions of the
/// workspace). Every output element is summed by one thread in one fixed order: forward and
/// backward-data results do not depend on the thread count.
/// Host only (compiled out of device passes); the caller checks is_host_exec_v. The 16 x 16
/// transposes of run_weight use AVX-512 when compiled for it, else scalar loops.

#include <tessera/config/kokkos_compat.hpp>
#include <tessera/conv/im2col.hpp>
#include <tessera/conv/workspace.hpp>
#include <tessera/gemm/detail/avx512bf16.hpp>
#include <tessera/gemm/detail/fma.hpp>
#include <tessera/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tessera::detail {

#if !TESSERA_DEVICE_PASS

namespace implicit_conv {

using kern = hostgemm::fma_kernel;
static_assert(kern::k_align == 1, "implicit_conv packs the fp32 FMA kernel's layout");

inline constexpr index_t MR = kern::MR, NR = kern::NR, KC = kern::KC;
/// Output pixels per work unit: 16 micro-panels. The packed A block (MC x KC fp32, 224 KiB)
/// and the C block (MC x up to 256 channels, 224 KiB) then share the 1-2 MiB L2 with the
/// slice of packed weights the micro-kernels stream (KC x 32 floats, 32 KiB, per panel).
inline constexpr index_t MC = MR * 16;
/// Output slots per band of the AMX direct form (rows of the band: amx_slots / slots a row).
inline constexpr index_t amx_slots = 256;
/// The AMX segments form: values of a segment (taps of one input row, padded with zeros),
/// segments per 32-value step, and segments (input channels x R) at most.
inline constexpr index_t seg_width = 8;
inline constexpr index_t seg_per_step = 4;
inline constexpr index_t max_segments = 64;

/// Sizes and index maps of one implicit convolution (see the file comment).
struct geometry {
  index_t N = 0, G = 1;
  index_t cin = 0, cout = 0; ///< input / output channels per group
  index_t Hin = 0, Win = 0, Hout = 0, Wout = 0, R = 1, S = 1;
  index_t sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0; ///< pt, pl may be negative
  float alpha = 1.f;

  index_t kred() const noexcept { return cin * R * S; }
  index_t npad() const noexcept { return (cout + NR - 1) / NR * NR; }
  index_t pixels() const noexcept { return Hout * Wout; }
  index_t blocks() const noexcept { return (pixels() + MC - 1) / MC; }
  index_t units() const noexcept { return N * G * blocks(); }
};

/// Floats of the packed weights (all groups).
inline std::size_t packed_b_floats(const geometry& g) {
  return static_cast<std::size_t>(g.G * g.kred() * g.npad());
}
/// Floats of one thread's A block (with a vector of slack) and C block.
inline std::size_t a_floats() {
  return static_cast<std::size_t>(MC * KC + 16);
}
inline std::size_t c_floats(const geometry& g) {
  return static_cast<std::size_t>(MC * g.npad());
}
/// Threads a convolution of `units` independent pieces of work runs on: one per unit at most.
template <class Exec>
int parts_for(const Exec& exec, index_t units) {
  return static_cast<int>(
      std::max<index_t>(1, std::min<index_t>(tessera::concurrency(exec), units)));
}
/// The threads of a layout's units (direct_layout, weight_direct_layout, weight_amx_layout,
/// narrow_conv::layout).
template <class Exec, class Layout>
int parts_for(const Exec& exec, const geometry& g, const Layout& d) {
  return parts_for(exec, d.units(g));
}

/// Packs the weights: for group gi, KC slice pc and panel jp of NR channels, the kc x NR floats
/// at pb + (gi*kred + pc)*npad + jp*kc, row kk - pc holding wval(gi, kk, jp .. jp + NR) (zero
/// past cout). wval(gi, kk, j) returns the weight as float.
template <class Exec, class WVal>
void pack_weights(const Exec& exec, const geometry& g, float* pb, const WVal& wval) {
  const index_t kred = g.kred(), np = g.npad(), slices = (kred + KC - 1) / KC, panels = np / NR;
  Kokkos::parallel_for("tessera::conv2d[implicit pack weights]",
                       Kokkos::RangePolicy<Exec>(exec, 0, g.G * slices * panels),
                       [=](const index_t i) {
                         const index_t gi = i / (slices * panels), pc = i / panels % slices * KC,
                                       jp = i % panels * NR;
                         const index_t kc = std::min(KC, kred - pc);
                         float* d = pb + (gi * kred + pc) * np + jp * kc;
                         for (index_t kk = 0; kk < kc; ++kk)
                           for (index_t j = 0; j < NR; ++j)
                             d[kk * NR + j] = jp + j < g.cout ? wval(gi, pc + kk, jp + j) : 0.f;
                       });
}

/// d[0 .. MR) = run[0 .. MR) as floats (fp32 runs: one fixed-size copy, a few vector moves).
template <class T>
inline void copy_run(const T* __restrict run, float* __restrict d) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(d, run, sizeof(float) * MR);
  } else {
    for (index_t i = 0; i < MR; ++i) d[i] = to_float(run[i]);
  }
}

/// d[i] = run[i] for lo <= i < hi, else 0 (i < MR): one masked copy (run[i] is only read
/// inside [lo, hi)).
template <class T>
inline void copy_run_masked(const T* __restrict run, float* __restrict d, index_t lo, index_t hi) {
  for (index_t i = 0; i < MR; ++i) d[i] = i >= lo && i < hi ? to_float(run[i]) : 0.f;
}

/// Packs A for pixels [m0, m0 + mc) of one image and group (channel planes at in + c*cs, rows
/// hs apart, unit stride along rows) and reduction rows [pc, pc + kc): micro-panel ip (MR
/// pixels) at pa + ip*kc, row kk - pc holding the MR pixels' inputs for tap kk (zero past mc).
template <class T>
void pack_pixels(const geometry& g, const T* in, index_t cs, index_t hs, index_t m0, index_t mc,
                 index_t pc, index_t kc, float* pa) {
  const index_t R = g.R, S = g.S, RS = R * S, dh = g.dh, dw = g.dw, sw = g.sw;
  const index_t Hin = g.Hin, Win = g.Win, Wout = g.Wout;
  const index_t never = -1 - (R - 1) * dh; // a row base no tap row reaches the image from
  for (index_t ip = 0; ip < mc; ip += MR) {
    float* d = pa + ip * kc;
    const index_t rows = std::min(MR, mc - ip);
    index_t hb[MR], wb[MR]; // input row / column of tap (0, 0) for each pixel of the panel
    for (index_t i = 0; i < MR; ++i) {
      const index_t m = m0 + ip + i, p = m / Wout, q = m % Wout;
      hb[i] = i < rows ? p * g.sh - g.pt : never;
      wb[i] = q * sw - g.pl;
    }
    // All MR pixels in one output row: each tap reads one run of the input row (stride sw).
    const bool one_row = rows == MR && hb[0] == hb[MR - 1];
    index_t c = pc / RS, r = pc / S % R, s = pc % S;
    for (index_t kk = 0; kk < kc; ++kk, d += MR) {
      const T* plane = in + c * cs;
      if (one_row) {
        const index_t h = hb[0] + r * dh, w0 = wb[0] + s * dw;
        if (h < 0 || h >= Hin) {
          for (index_t i = 0; i < MR; ++i) d[i] = 0.f;
        } else if (sw == 1) {
          const T* row = plane + h * hs + w0; // element i at row[i] when 0 <= w0 + i < Win
          if (w0 >= 0 && w0 + MR <= Win) {
            copy_run(row, d);
          } else {
            copy_run_masked(row, d, -w0, Win - w0);
          }
        } else {
          const T* row = plane + h * hs;
          for (index_t i = 0; i < MR; ++i) {
            const index_t w = w0 + i * sw;
            d[i] = w >= 0 && w < Win ? to_float(row[w]) : 0.f;
          }
        }
      } else {
        for (index_t i = 0; i < MR; ++i) {
          const index_t h = hb[i] + r * dh, w = wb[i] + s * dw;
          d[i] = h >= 0 && h < Hin && w >= 0 && w < Win ? to_float(plane[h * hs + w]) : 0.f;
        }
      }
      if (++s == S) {
        s = 0;
        if (++r == R) r = 0, ++c;
      }
    }
  }
}

/// Runs the convolution: in (N images, G*cin channels; image stride in_ns, channel stride
/// in_cs, row stride in_hs), packed weights pb, out (N, G*cout, Hout*Wout pixels contiguous per
/// channel; image stride out_ns, channel stride out_cs). store(c_row, k, dst, count) writes
/// count output values of channel k (of all G*cout) from the fp32 sums at c_row (stride npad).
/// scratch: parts_for(exec, g.units()) * (a_floats() + c_floats(g)) floats, 64-byte aligned.
template <class Exec, class T, class O, class Store>
void run(const Exec& exec, const geometry& g, const T* in, index_t in_ns, index_t in_cs,
         index_t in_hs, const float* pb, O* out, index_t out_ns, index_t out_cs, float* scratch,
         const Store& store) {
  const int parts = parts_for(exec, g.units());
  const index_t units = g.units(), blocks = g.blocks(), kred = g.kred(), np = g.npad();
  const std::size_t per_part = a_floats() + c_floats(g);
  const auto body = [&](const int part) {
    float* pa = scratch + static_cast<std::size_t>(part) * per_part;
    float* cb = pa + a_floats();
    alignas(64) float t[MR * NR];
    const index_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    for (index_t u = u0; u < u1; ++u) {
      const index_t n = u / (g.G * blocks), gi = u / blocks % g.G, m0 = u % blocks * MC;
      const index_t mc = std::min(MC, g.pixels() - m0);
      const T* img = in + n * in_ns + gi * g.cin * in_cs;
      for (index_t pc = 0; pc < kred; pc += KC) {
        const index_t kc = std::min(KC, kred - pc);
        const bool first = pc == 0;
        pack_pixels(g, img, in_cs, in_hs, m0, mc, pc, kc, pa);
        const float* bs = pb + (gi * kred + pc) * np;
        for (index_t jp = 0; jp < np; jp += NR) {
          for (index_t ip = 0; ip < mc; ip += MR) {
            kern::micro(kc, pa + ip * kc, bs + jp * kc, t);
            float* c0 = cb + ip * np + jp;
            const index_t rows = std::min(MR, mc - ip);
            if (first) {
              for (index_t i = 0; i < rows; ++i)
                for (index_t j = 0; j < NR; ++j) c0[i * np + j] = t[i * NR + j];
            } else {
              for (index_t i = 0; i < rows; ++i)
                for (index_t j = 0; j < NR; ++j) c0[i * np + j] += t[i * NR + j];
            }
          }
        }
      }
      O* dst = out + n * out_ns + m0;
      for (index_t j = 0; j < g.cout; ++j) {
        const index_t k = gi * g.cout + j;
        store(cb + j, k, dst + k * out_cs, mc);
      }
    }
  };
  if (parts == 1) {
    body(0);
  } else {
    Kokkos::parallel_for(
        "tessera::conv2d[implicit]",
        Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, parts), body);
  }
}

// ---------------------------------------------------------------------------------------------
// 16 x 16 transposes (AVX-512 when compiled for it)
// ---------------------------------------------------------------------------------------------

#if defined(__AVX512F__)
/// In-register 16 x 16 transpose: r[i] lane j becomes r[j] lane i.
inline void transpose16_regs(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) { // 2 x 2 blocks of single floats
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) { // 4 x 4 blocks (pairs of floats)
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; ++i) // 128-bit lanes, then 256-bit halves
    for (int k = 0; k < 4; ++k) {
      t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
      t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
    }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
  }
}
#endif

/// Transposes 16 rows of n floats (row i at rows[i]; nullptr: zeros) into n rows of 16 at dst,
/// row j at dst + j*dld (dld >= 16, or smaller when the rows are written in order and the
/// caller has 16 floats of slack past row n - 1: each row is stored as 16 floats).
inline void transpose16(const float* const* rows, index_t n, float* dst, index_t dld) {
  index_t j = 0;
#if defined(__AVX512F__)
  for (; j + 16 <= n; j += 16) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = rows[i] ? _mm512_loadu_ps(rows[i] + j) : _mm512_setzero_ps();
    transpose16_regs(r);
    for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + (j + k) * dld, r[k]);
  }
#endif
  for (; j < n; ++j)
    for (index_t i = 0; i < 16; ++i) dst[j * dld + i] = rows[i] ? rows[i][j] : 0.f;
}

/// The first n words of `channels` rows (a multiple of 16; row c at base + c * cs) as blocks of
/// 64 channels: block k at dst + 64 k * pixels holds pixel j's channels of the block at
/// j * kv (kv = 64, or the channels left in the last block). The channels-along-the-lanes forms
/// of backward-weight read dy or x so (weight_lanes, weight_lanes_pairs on 32-bit words).
inline void transpose_channel_blocks(const float* base, index_t cs, index_t channels, index_t n,
                                     float* dst, index_t pixels) {
  const float* src[16];
  for (index_t c0 = 0; c0 < channels; c0 += 16) {
    for (index_t i = 0; i < 16; ++i) src[i] = base + (c0 + i) * cs;
    const index_t blk = c0 / 64, kv = std::min<index_t>(64, channels - 64 * blk);
    transpose16(src, n, dst + blk * 64 * pixels + c0 % 64, kv);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward and stride-1 backward-data without packing A: direct reads of a padded band
// ---------------------------------------------------------------------------------------------
//
// pack_pixels copies every tap's MR inputs into the A micro-panel (a run of 14 floats per tap
// and panel: on a 32 -> 64 channel 3x3 layer of 14 x 14, a third of the time the micro-kernel
// takes). When the stride is 1 or 2, the MR pixels of a panel read MR inputs sw apart from one
// row of the input for every tap, so the micro-kernel can broadcast them straight from the
// input if the input is zero-padded: each work unit copies the band of input rows it reads,
// with its padding, once (cin x BH x Wp floats, about 1/(2 R S cout) of the unit's flops), and
// tap kk of the panel whose first slot lies at offset o of the band reads band[off[kk] + o +
// i*sw] (off[kk] = (c*BH + r*dh)*Wp + s*dw). A unit is a band of output rows; its slots (the
// GEMM's rows) are laid out per output row, SP slots per row:
//  - per row: SP = Wout rounded up to MR (14, 28, 56, 112 waste nothing), a panel never spans
//    two rows; the band is Wp = (SP - 1)*sw + (S - 1)*dw + 1 wide, so garbage slots read zeros;
//  - linear (stride 1, when Wout + (S-1)*dw < SP): SP = Wp = Wout + (S - 1)*dw, slot j of the
//    band reads grid position j (S - 1 garbage slots per row, whose sums are never stored), so
//    a 7 x 7 output uses 9 slots a row instead of 14.
// The sums (slots x channels) are transposed 16 slots at a time into channel rows, and each
// output row of a channel is stored as one contiguous run.
//
// bf16 pairs (operands exact in bf16: bf16, fp8; CPUs with AVX512_BF16): the band holds 32-bit
// words, word (c2, row, col) = the bf16 of channels 2*c2 (low half) and 2*c2 + 1 (high half; zero
// past cin) at (row, col), and the packed weights hold the same pairs of taps; one VDPBF16PS
// step then adds two channels' products to each sum (micro_pairs), half the steps of fp32 for the
// same loads and broadcasts. The sums are fp32 as in the GEMM's dpbf16 kernel
// (gemm/detail/avx512bf16.hpp: exact products, fp32 accumulation, denormals flushed).

/// The band layout of the direct path (see above).
struct direct_layout {
  bool ok = false;        ///< the direct path applies (stride 1 or 2, waste under 25%)
  bool amx = false;       ///< AMX tiles of bf16 pairs (see "AMX tiles" below)
  bool seg = false;       ///< AMX: rows of input segments per output pixel ("AMX segments")
  index_t planes = 0;     ///< planes of the band: cin, or (cin + 1) / 2 channel pairs
  index_t SP = 0;         ///< slots per output row
  index_t rows = 0;       ///< output rows per band (unit)
  index_t bands = 0;      ///< bands per image
  index_t BH = 0, Wp = 0; ///< rows and row length of the padded band
  index_t cap = 0;        ///< slots of a C block: rows * SP rounded up to MR, then to 16 (AMX: 32)
  index_t PR = 0;         ///< AMX: grid rows of a chunk's pixels (BH and the last tiles' reads)
  index_t units(const geometry& g) const noexcept { return g.N * g.G * bands; }
  /// Planes the reduction runs over: AMX tiles take 16 pair planes a step (zeros past planes).
  index_t tile_planes() const noexcept { return amx ? (planes + 15) / 16 * 16 : planes; }
  /// AMX: chunks of 16 pair planes (32 channels), each PR x Wp pixels of 16 words.
  index_t chunks() const noexcept { return tile_planes() / 16; }
  /// Band offset of slot i: output row i / SP, column i % SP (any slot when linear); AMX: its
  /// pixel; segments: the slot itself.
  index_t slot_offset(const geometry& g, index_t i) const noexcept {
    return seg ? i : i / SP * g.sh * Wp + i % SP * g.sw;
  }
  /// Floats of the band with slack for the garbage slots' reads past its end; AMX: the chunks
  /// of pixels; segments: a chunk of cap rows of 16 words per step.
  std::size_t band_floats(const geometry& g) const noexcept {
    if (!amx) return static_cast<std::size_t>(planes * BH * Wp + cap * g.sw + 16);
    if (seg) return static_cast<std::size_t>(steps(g) * cap * 16);
    return static_cast<std::size_t>(chunks() * PR * Wp * 16);
  }
  /// Steps of the reduction: one per (plane, r, s); AMX: one per (16 planes, r, s); segments:
  /// one per 4 segments (32 values).
  index_t steps(const geometry& g) const noexcept {
    if (seg) return (g.cin * g.R + seg_per_step - 1) / seg_per_step;
    return (amx ? chunks() : planes) * g.R * g.S;
  }
  /// 32-bit words of the packed weights (all groups).
  std::size_t packed_words(const geometry& g) const noexcept {
    return static_cast<std::size_t>(g.G * steps(g) * g.npad() * (amx ? 16 : 1));
  }
  /// Row stride of the channel rows (channel_rows).
  index_t ldt() const noexcept { return cap + 16; }
  /// Per thread: band, C block (cap x npad) and its channel rows (npad x ldt).
  std::size_t part_floats(const geometry& g) const noexcept {
    return (band_floats(g) + 15) / 16 * 16 + static_cast<std::size_t>((cap + ldt()) * g.npad());
  }
};

/// The bands of output rows: rows per band (at most `slots` slots each, at least one row; an
/// even number when even_rows, all but a last one of odd Hout), bands per image.
inline void band_rows_for(const geometry& g, direct_layout& d, index_t slots, bool even_rows) {
  const index_t per = std::max<index_t>(1, slots / d.SP);
  d.bands = (g.Hout + per - 1) / per;
  d.rows = (g.Hout + d.bands - 1) / d.bands;
  if (even_rows && d.rows % 2 != 0 && d.rows < g.Hout) { // every band starts at an even row
    ++d.rows;
    d.bands = (g.Hout + d.rows - 1) / d.rows;
  }
}

/// The AMX segments layout (see "AMX segments" below) of a convolution with few input channels
/// (!ok unless at least half of the steps' values are real products: 2 cin R S >= 32 steps).
/// Its band has no rows of input (BH unused): each slot's segments are read from the input.
inline direct_layout segments_layout_for(const geometry& g, bool even_rows) {
  direct_layout d;
  d.amx = d.seg = true;
  d.planes = (g.cin + 1) / 2;
  if (g.dw != 1 || g.S > seg_width || g.sh < 1 || g.sw < 1 || g.Wout < 1 || g.Hout < 1 ||
      g.cin * g.R > max_segments)
    return d;
  if (2 * g.cin * g.R * g.S < d.steps(g) * seg_width * seg_per_step) return d;
  d.SP = g.Wout;
  band_rows_for(g, d, amx_slots, even_rows);
  d.cap = (d.rows * d.SP + 31) / 32 * 32;
  d.ok = true;
  return d;
}

/// The grid band's layout: of fp32, or of bf16 channel pairs when `pairs` (AMX tiles of its
/// pixels when `amx`); even_rows: bands of an even number of output rows (all but a last one of
/// odd Hout), for a consumer of row pairs.
inline direct_layout grid_layout_for(const geometry& g, bool pairs, bool even_rows, bool amx) {
  direct_layout d;
  d.amx = pairs && amx;
  d.planes = pairs ? (g.cin + 1) / 2 : g.cin;
  if (d.amx && (g.sw != 1 || 4 * d.tile_planes() > 5 * d.planes)) return d;
  if (g.sh < 1 || g.sh > 2 || g.sw < 1 || g.sw > 2 || g.Wout < 1 || g.Hout < 1) return d;
  // Slots come in micro-panels of MR (AMX: tiles of 16, one tile row = 16 consecutive words of
  // the band, so unit column stride only).
  const index_t unit = d.amx ? 16 : MR;
  const index_t row_sp = (g.Wout + unit - 1) / unit * unit;
  const index_t lin_wp = g.Wout + (g.S - 1) * g.dw;
  const bool linear = g.sh == 1 && g.sw == 1 && (d.amx ? lin_wp <= row_sp : lin_wp < row_sp);
  d.SP = linear ? lin_wp : row_sp;
  d.Wp = linear ? lin_wp : (row_sp - 1) * g.sw + (g.S - 1) * g.dw + 1;
  if (4 * d.SP > 5 * g.Wout) return d; // more than 25% of the products wasted
  band_rows_for(g, d, d.amx ? amx_slots : MC, even_rows);
  d.BH = (d.rows - 1) * g.sh + (g.R - 1) * g.dh + 1;
  d.cap =
      d.amx ? (d.rows * d.SP + 31) / 32 * 32 : ((d.rows * d.SP + MR - 1) / MR * MR + 15) / 16 * 16;
  if (d.amx) { // a chunk holds the band's rows and the pixels the last tile of any tap reads
    const index_t last =
        d.slot_offset(g, d.cap - 16) + 16 + (g.R - 1) * g.dh * d.Wp + (g.S - 1) * g.dw;
    d.PR = std::max(d.BH, (last + d.Wp - 1) / d.Wp);
  }
  d.ok = true;
  return d;
}
/// The direct path's layout (grid_layout_for); on AMX tiles, where the grid does not apply (few
/// input channels, a column stride other than 1), the segments (segments_layout_for).
inline direct_layout direct_layout_for(const geometry& g, bool pairs = false,
                                       bool even_rows = false, bool amx = false) {
  const direct_layout d = grid_layout_for(g, pairs, even_rows, amx);
  return d.ok || !(pairs && amx) ? d : segments_layout_for(g, even_rows);
}

/// The band offsets of the taps of a band of BH rows of Wp elements per plane, at the start of
/// scratch: off[q] = (c*BH + r*dh)*Wp + s*dw for q = (c*R + r)*S + s < planes*R*S. Returns the
/// 64-byte aligned memory after them.
inline unsigned char* tap_offsets(const geometry& g, index_t planes, index_t BH, index_t Wp,
                                  void* scratch) {
  const index_t RS = g.R * g.S, n = planes * RS;
  auto* off = static_cast<index_t*>(scratch);
  for (index_t q = 0; q < n; ++q) {
    const index_t c = q / RS, r = q / g.S % g.R, s = q % g.S;
    off[q] = (c * BH + r * g.dh) * Wp + s * g.dw;
  }
  return static_cast<unsigned char*>(scratch) + round_up_64(sizeof(index_t) * n);
}

/// Step offsets of the segments form, at the start of scratch: off[k] = k * rows (in 64-byte
/// rows). Returns the 64-byte aligned memory after them.
inline unsigned char* step_offsets(index_t steps, index_t rows, void* scratch) {
  auto* off = static_cast<index_t*>(scratch);
  for (index_t k = 0; k < steps; ++k) off[k] = k * rows;
  return static_cast<unsigned char*>(scratch) + round_up_64(sizeof(index_t) * steps);
}

/// The MR x NR tile at d (row stride ldd) = (acc ? d : 0) + sum over kk < kc of A(., kk) B(kk, .)
/// with A(i, kk) = a0[off[kk] + i*SW] and B the packed weight panel b (kc x NR).
template <index_t SW>
[[gnu::noinline]] inline void micro_direct(index_t kc, const float* __restrict a0,
                                           const index_t* __restrict off, const float* __restrict b,
                                           float* __restrict d, index_t ldd, bool acc) {
  using vf = kern::vf;
  constexpr index_t L = kern::L, NV = kern::NV;
  vf c[MR][NV];
#pragma GCC unroll 14
  for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (index_t v = 0; v < NV; ++v) c[r][v] = vf(0.f);
  for (index_t p = 0; p < kc; ++p) {
    const float* a = a0 + off[p];
    vf bv[NV];
#pragma GCC unroll 2
    for (index_t v = 0; v < NV; ++v) bv[v] = vf::load_unaligned(b + p * NR + v * L);
#pragma GCC unroll 14
    for (index_t r = 0; r < MR; ++r) {
      const vf av(a[r * SW]);
#pragma GCC unroll 2
      for (index_t v = 0; v < NV; ++v) c[r][v] = xsimd::fma(av, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 14
  for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (index_t v = 0; v < NV; ++v) {
      float* q = d + r * ldd + v * L;
      (acc ? c[r][v] + vf::load_unaligned(q) : c[r][v]).store_unaligned(q);
    }
}

/// dst[0, n) = src[0, n) widened to fp32, exactly. AVX-512: bf16 by a shift, fp8 through its
/// bf16 bits (hostgemm::load_bf16, byte tables), 16 values a step, the last ones masked
/// (convert_n, 16 values a step and the rest one by one, took 37% of a first layer's fp8
/// backward-weight on rows of 28). AVX2: bf16 by a shift, 8 values a step, the rest one by one.
/// Other precisions and targets through hostgemm::load_floats.
template <class S>
inline void widen_floats(const S* src, float* dst, index_t n) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (std::is_same_v<S, bfloat16> || sizeof(S) == 1) {
    alignas(64) std::uint16_t bits[64];
    for (index_t i = 0; i < n; i += 64) {
      const index_t m = std::min<index_t>(64, n - i);
      const std::uint16_t* b = bits;
      if constexpr (std::is_same_v<S, bfloat16>)
        b = reinterpret_cast<const std::uint16_t*>(src + i);
      else
        hostgemm::load_bf16(src + i, bits, m);
      for (index_t j = 0; j < m; j += 16) {
        const index_t r = std::min<index_t>(16, m - j);
        const auto k = static_cast<__mmask16>((1u << r) - 1u);
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, b + j));
        _mm512_mask_storeu_ps(dst + i + j, k, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      }
    }
    return;
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<S, bfloat16>) { // 8 values a step (a shift), the rest one by one
    const auto* b = reinterpret_cast<const std::uint16_t*>(src);
    index_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i w =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) dst[i] = to_float(src[i]);
    return;
  }
#endif
  hostgemm::load_floats(src, dst, n);
}

/// Brings the input rows of the next work unit into L2 while the kernels run on the current
/// one, a share of rows per call of step(): rows [h0, h0 + BH) (those inside [0, H)) of
/// `planes` planes at base + i*ns + c*cs (image i < images), `elems` elements from each row's
/// start. The band fill otherwise waits on every line: a band is hundreds of short rows in
/// distant planes (64 channels x 6 rows of 224 bytes on a 56 x 56 layer), streams too short
/// for the hardware prefetchers. Rows that are whole planes one after another (a band of the
/// whole image, stored contiguously) are one stream, which the hardware follows: those are left
/// to it: a software prefetch also takes room in L1 (the L2, L3 and non-temporal hints measured
/// alike on Zen 5), and there it evicted the band and weights of a small layer whose working set
/// fits L1 (FashionCNN conv2 in bf16, 14 x 14: 8-14% slower). Measured (Zen 5, 1 thread, fp32 /
/// bf16 / fp8, docs/performance.md): res3x3_56 forward and backward-data 1.04-1.13x,
/// backward-weight 1.01-1.05x; res3x3_28 0.99-1.05x.
template <class T>
struct band_prefetch {
  const T* base = nullptr;
  index_t ns = 0, planes = 0, cs = 0, hs = 0, h0 = 0, BH = 0, H = 0, elems = 0;
  index_t next = 0, total = 0, per_step = 0;
  /// Arms it for images x planes x BH rows, spread over `steps` calls of step().
  void arm(const T* base_, index_t images, index_t ns_, index_t planes_, index_t cs_, index_t hs_,
           index_t h0_, index_t BH_, index_t H_, index_t elems_, index_t steps) noexcept {
    base = base_, ns = ns_, planes = planes_, cs = cs_, hs = hs_, h0 = h0_, BH = BH_, H = H_;
    elems = elems_, next = 0, total = images * planes * BH;
    per_step = steps > 0 ? (total + steps - 1) / steps : total;
    const index_t plane = H == 1 ? elems : H * hs; // a plane's extent when its rows abut
    if ((H == 1 || elems == hs) && h0 <= 0 && h0 + BH >= H && (planes == 1 || cs == plane) &&
        (images == 1 || ns == planes * plane))
      total = 0; // one contiguous stream
  }
  /// Calls touch(line) for the 64-byte lines of the next share of rows (by default: a read
  /// prefetch of each, hinted to L2).
  template <class Touch>
  void step(const Touch& touch) noexcept {
    for (const index_t end = std::min(total, next + per_step); next < end; ++next) {
      const index_t h = h0 + next % BH;
      if (h < 0 || h >= H || elems <= 0) continue;
      const T* row = base + next / (planes * BH) * ns + next / BH % planes * cs + h * hs;
      const auto lo = reinterpret_cast<std::uintptr_t>(row);
      const auto hi = reinterpret_cast<std::uintptr_t>(row + elems);
      for (std::uintptr_t a = lo & ~std::uintptr_t(63); a < hi; a += 64) touch(a);
    }
  }
  void step() noexcept {
    step([](std::uintptr_t a) { __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2); });
  }
};

/// Copies input rows [h0, h0 + BH) (h0 may be negative; rows outside are zeros) of cin channel
/// planes, each shifted right by pl columns and zero-padded to Wp, into band.
template <class T>
void fill_band(const geometry& g, const direct_layout& d, const T* in, index_t cs, index_t hs,
               index_t h0, float* band) {
  index_t lo, hi; // band columns holding input columns: wc = w + pl
  valid_output_range(g.Win, d.Wp, 1, -g.pl, lo, hi);
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    // 16 columns a step, the padding by the load's mask (no call of memcpy / memset per row:
    // the rows are short, 16 floats on a 14-wide layer).
    const auto lanes = [](index_t a, index_t b) { // lanes [a, b) of 16, clamped
      a = a < 0 ? 0 : a > 16 ? 16 : a;
      b = b < 0 ? 0 : b > 16 ? 16 : b;
      return b <= a ? __mmask16(0) : __mmask16(((1u << b) - 1u) & ~((1u << a) - 1u));
    };
    for (index_t c = 0; c < g.cin; ++c)
      for (index_t hr = 0; hr < d.BH; ++hr) {
        float* row = band + (c * d.BH + hr) * d.Wp;
        const index_t h = h0 + hr;
        const bool inside = h >= 0 && h < g.Hin;
        const float* src = inside ? in + c * cs + h * hs - g.pl : row;
        for (index_t w = 0; w < d.Wp; w += 16) {
          const __mmask16 m = inside ? lanes(lo - w, hi - w) : __mmask16(0);
          _mm512_mask_storeu_ps(row + w, lanes(0, d.Wp - w), _mm512_maskz_loadu_ps(m, src + w));
        }
      }
    return;
  }
#endif
  for (index_t c = 0; c < g.cin; ++c)
    for (index_t hr = 0; hr < d.BH; ++hr) {
      float* row = band + (c * d.BH + hr) * d.Wp;
      const index_t h = h0 + hr;
      if (h < 0 || h >= g.Hin) {
        std::memset(row, 0, sizeof(float) * static_cast<std::size_t>(d.Wp));
        continue;
      }
      const T* src = in + c * cs + h * hs - g.pl;
      for (index_t w = 0; w < lo; ++w) row[w] = 0.f;
      widen_floats(src + lo, row + lo, hi - lo);
      for (index_t w = hi; w < d.Wp; ++w) row[w] = 0.f;
    }
}

#if TESSERA_GEMM_AVX512BF16
/// micro_direct for bf16 pairs: A(i, q) = the word a0[off[q] + i*SW], b the packed panel of
/// pairs (kc x NR words), one VDPBF16PS per step and 16 channels.
template <index_t SW>
[[gnu::noinline]] inline void
micro_pairs(index_t kc, const std::uint32_t* __restrict a0, const index_t* __restrict off,
            const std::uint32_t* __restrict b, float* __restrict d, index_t ldd, bool acc) {
  static_assert(MR == 14 && NR == 32, "micro_pairs is the AVX-512 tile");
  __m512 c[MR][2];
#pragma GCC unroll 14
  for (index_t r = 0; r < MR; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (index_t p = 0; p < kc; ++p) {
    const std::uint32_t* a = a0 + off[p];
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * NR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * NR + 16);
#pragma GCC unroll 14
    for (index_t r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * SW]));
      c[r][0] = _mm512_dpbf16_ps(c[r][0], av, b0);
      c[r][1] = _mm512_dpbf16_ps(c[r][1], av, b1);
    }
  }
#pragma GCC unroll 14
  for (index_t r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (index_t v = 0; v < 2; ++v) {
      float* q = d + r * ldd + v * 16;
      _mm512_storeu_ps(q, acc ? _mm512_add_ps(c[r][v], _mm512_loadu_ps(q)) : c[r][v]);
    }
}

/// Words [0, n) of a band row of pairs: the bf16 of s0[i] (low half) and, when two, of s1[i]
/// (high half; else zero). bf16 rows are read in place. fp8 codes are widened in registers by
/// fp8_to_bf16_x64 where the CPU has AVX512_VBMI, 64 a step, with no buffer: 1.13-1.5x less
/// time than a decode into a buffer and a second pass, on rows 14 to 129 wide (Zen 5; the same
/// form for bf16 rows was no faster than the one below, 0.7-1.09x). Elsewhere load_bf16 decodes
/// them into a buffer first.
template <class T>
inline void pair_row(const T* s0, const T* s1, bool two, index_t n, std::uint32_t* row) noexcept {
#if defined(__AVX512VBMI__)
  if constexpr (!std::is_same_v<T, bfloat16> && !std::is_same_v<T, float>) {
    // Word order of two registers of 32 bf16 each: a[k] and b[k] side by side, k = 0..15 (v[0
    // .. 31]) or 16..31 (v[32 .. 63]); index bit 5 picks b.
    struct pair_order {
      alignas(64) std::uint16_t v[64];
      constexpr pair_order() : v{} {
        for (int k = 0; k < 64; ++k)
          v[k] = static_cast<std::uint16_t>(k / 32 * 16 + k % 32 / 2 + (k & 1) * 32);
      }
    };
    static constexpr pair_order order{};
    const __m512i o0 = _mm512_load_si512(order.v), o1 = _mm512_load_si512(order.v + 32);
    for (index_t i = 0; i < n; i += 64) {
      const index_t r = std::min<index_t>(64, n - i);
      const __mmask64 m = r == 64 ? ~__mmask64(0) : (__mmask64(1) << r) - 1u;
      __m512i a0, a1, b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
      hostgemm::fp8_to_bf16_x64<T>(_mm512_maskz_loadu_epi8(m, s0 + i), a0, a1);
      if (two) hostgemm::fp8_to_bf16_x64<T>(_mm512_maskz_loadu_epi8(m, s1 + i), b0, b1);
      std::uint32_t* o = row + i;
      _mm512_mask_storeu_epi32(o, static_cast<__mmask16>(m), _mm512_permutex2var_epi16(a0, o0, b0));
      if (r > 16)
        _mm512_mask_storeu_epi32(o + 16, static_cast<__mmask16>(m >> 16),
                                 _mm512_permutex2var_epi16(a0, o1, b0));
      if (r > 32)
        _mm512_mask_storeu_epi32(o + 32, static_cast<__mmask16>(m >> 32),
                                 _mm512_permutex2var_epi16(a1, o0, b1));
      if (r > 48)
        _mm512_mask_storeu_epi32(o + 48, static_cast<__mmask16>(m >> 48),
                                 _mm512_permutex2var_epi16(a1, o1, b1));
    }
    return;
  }
#endif
  alignas(64) std::uint16_t t0[64] = {}, t1[64] = {};
  const __m512i keep = two ? _mm512_set1_epi32(-1) : _mm512_setzero_si512();
  for (index_t w = 0; w < n; w += 64) {
    const index_t c = std::min<index_t>(64, n - w);
    const std::uint16_t *r0 = t0, *r1 = t1;
    if constexpr (std::is_same_v<T, bfloat16>) {
      r0 = reinterpret_cast<const std::uint16_t*>(s0 + w);
      r1 = reinterpret_cast<const std::uint16_t*>(s1 + w);
    } else {
      hostgemm::load_bf16(s0 + w, t0, c);
      if (two) hostgemm::load_bf16(s1 + w, t1, c);
    }
    for (index_t i = 0; i < c; i += 16) {
      const index_t m = std::min<index_t>(16, c - i);
      const auto mask = static_cast<__mmask16>((1u << m) - 1u);
      const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, r0 + i));
      const __m512i b =
          _mm512_and_si512(keep, _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, r1 + i)));
      _mm512_mask_storeu_epi32(row + w + i, mask, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
  }
}

/// fill_band for bf16 pairs: word (c2, hr, w) of band = bf16 bits of channel 2*c2 (low half)
/// and 2*c2 + 1 (high half, zero past cin) of input row h0 + hr, column w - pl (zeros outside).
template <class T>
void fill_band_pairs(const geometry& g, const direct_layout& d, const T* in, index_t cs, index_t hs,
                     index_t h0, std::uint32_t* band) {
  index_t lo, hi; // band columns holding input columns: wc = w + pl
  valid_output_range(g.Win, d.Wp, 1, -g.pl, lo, hi);
  for (index_t c2 = 0; c2 < d.planes; ++c2) {
    const bool two = 2 * c2 + 1 < g.cin;
    for (index_t hr = 0; hr < d.BH; ++hr) {
      std::uint32_t* row = band + (c2 * d.BH + hr) * d.Wp;
      const index_t h = h0 + hr;
      if (h < 0 || h >= g.Hin) {
        std::memset(row, 0, sizeof(std::uint32_t) * static_cast<std::size_t>(d.Wp));
        continue;
      }
      const T* s0 = in + 2 * c2 * cs + h * hs + (lo - g.pl); // input column of band column lo
      for (index_t w = 0; w < lo; ++w) row[w] = 0;
      pair_row(s0, two ? s0 + cs : s0, two, hi - lo, row + lo);
      for (index_t w = hi; w < d.Wp; ++w) row[w] = 0;
    }
  }
}

/// The bf16 bits of a weight wval(gi, kk, j) gives (an element of the weights' storage type,
/// or a float exact in bf16): fp8 through its table, bf16 as it is (a float decode and a bf16
/// rounding per fp8 weight were a quarter of a 256-channel 14 x 14 layer's time).
template <class WVal>
std::uint32_t weight_bits(const WVal& wval, index_t gi, index_t kk, index_t j) {
  return hostgemm::bf16_bits(wval(gi, kk, j));
}

/// The packed word of channel pair c2, tap t = r*S + s and output channel j of group gi: the
/// bf16 of wval(gi, kk, j), kk = 2*c2*R*S + t (channel 2*c2), in the low half and that of
/// channel 2*c2 + 1 (kk + R*S) in the high half, zero past cin.
template <class WVal>
std::uint32_t weight_pair(const geometry& g, const WVal& wval, index_t gi, index_t c2, index_t t,
                          index_t j) {
  const index_t RS = g.R * g.S, kk = 2 * c2 * RS + t;
  std::uint32_t word = weight_bits(wval, gi, kk, j);
  if (2 * c2 + 1 < g.cin) word |= weight_bits(wval, gi, kk + RS, j) << 16;
  return word;
}

/// pack_weights for bf16 pairs: step q = (c2*R + r)*S + s of group gi's panel jp holds, for
/// channel j, the bf16 of wval(gi, kk, j) for kk = (2*c2*R + r)*S + s (low half) and kk + R*S
/// (high half; zero past cin), at pb + (gi*steps + pc)*npad + jp*kc + (q - pc)*NR + j.
template <class Exec, class WVal>
void pack_weight_pairs(const Exec& exec, const geometry& g, const direct_layout& d,
                       std::uint32_t* pb, const WVal& wval) {
  const index_t steps = d.steps(g), RS = g.R * g.S, np = g.npad(), slices = (steps + KC - 1) / KC,
                panels = np / NR;
  Kokkos::parallel_for(
      "tessera::conv2d[implicit pack weight pairs]",
      Kokkos::RangePolicy<Exec>(exec, 0, g.G * slices * panels), [=](const index_t i) {
        const index_t gi = i / (slices * panels), pc = i / panels % slices * KC,
                      jp = i % panels * NR;
        const index_t kc = std::min(KC, steps - pc);
        std::uint32_t* dst = pb + (gi * steps + pc) * np + jp * kc;
        for (index_t q = 0; q < kc; ++q) {
          const index_t c2 = (pc + q) / RS, t = (pc + q) % RS;
          for (index_t j = 0; j < NR; ++j)
            dst[q * NR + j] = jp + j < g.cout ? weight_pair(g, wval, gi, c2, t, jp + j) : 0u;
        }
      });
}

#if TESSERA_GEMM_AMX
// AMX tiles (CPUs with usable AMX-BF16): the band of channel pairs, transposed so that its
// pixels are rows of 64 bytes. A chunk of 16 pair planes (32 channels) holds PR x Wp pixels of
// the band's grid, each pixel the 16 words of its pairs; an A tile is 16 consecutive pixels of
// a chunk, i.e. 1 KiB read in place with a 64-byte stride: slots i .. i + 15 of tap (r, s) start
// at pixel slot_offset(i) + r dh Wp + s dw, so every tap's tile is a contiguous, aligned load
// from the band (no im2col). The B tiles are the weights, 16 pair planes x 16 output channels
// of one tap, packed once per call; TDPBF16PS then adds C(slot, channel) += the two channels'
// products of each pair. A register block is 32 slots x 32 channels (C tiles 0-3, A tiles 4-5,
// B tiles 6-7, all 8), over every step of the reduction (one chunk x R x S per step; pair planes
// past (cin + 1) / 2 are zeros in both the band and the weights); the C block (slots x channels)
// is transposed to channel rows as the fp32 form's. Sums: fp32, as the AMX GEMM's.
//
// The pixel-major band is what makes the tiles run: with the pair planes as tile rows (16 rows
// a plane apart, the form before), one core reached 1,200-1,250 GFLOP/s on a 128 -> 128 channel
// 3 x 3 layer's block loop, aligned or not; with pixel rows 1,960 (Xeon 0xCF, TDPBF16PS peak
// about 2,300 on that core).

/// pack_weights for AMX tiles: tile (gi, jt, q) for 16 output channels jt*16 .. and step
/// q = (cb*R + r)*S + s holds, in row k, word m: channels 2*c2 (low half) and 2*c2 + 1 (high
/// half; zero past cin) of c2 = cb*16 + k, tap (r, s), output channel jt*16 + m (zero past
/// cout or planes), at pb + ((gi*(npad/16) + jt)*steps + q)*256 + k*16 + m. Segments (d.seg):
/// row k of step q holds values 32q + 2k (low half) and 32q + 2k + 1 of the slots' rows, value
/// v being tap s = v % 8 of segment e = v / 8 = c*R + r (zero for s >= S or e >= cin*R).
template <class Exec, class WVal>
void pack_weight_tiles(const Exec& exec, const geometry& g, const direct_layout& d,
                       std::uint32_t* pb, const WVal& wval) {
  const index_t steps = d.steps(g), RS = g.R * g.S, tiles = g.npad() / 16;
  Kokkos::parallel_for(
      "tessera::conv2d[implicit pack weight tiles]",
      Kokkos::RangePolicy<Exec>(exec, 0, g.G * tiles * steps), [=](const index_t i) {
        const index_t gi = i / (tiles * steps), jt = i / steps % tiles, q = i % steps;
        const index_t cb = q / RS, t = q % RS;
        std::uint32_t* dst = pb + i * 256;
        if (d.seg) {
          for (index_t k = 0; k < 16; ++k)
            for (index_t m = 0; m < 16; ++m) {
              const index_t e = q * seg_per_step + k / 4, j = jt * 16 + m;
              std::uint32_t word = 0;
              for (index_t h = 0; h < 2; ++h) {
                const index_t sv = 2 * (k % 4) + h;
                if (e < g.cin * g.R && sv < g.S && j < g.cout)
                  word |= weight_bits(wval, gi, e * g.S + sv, j) << (16 * h);
              }
              dst[k * 16 + m] = word;
            }
          return;
        }
        for (index_t k = 0; k < 16; ++k)
          for (index_t m = 0; m < 16; ++m) {
            const index_t c2 = cb * 16 + k, j = jt * 16 + m;
            dst[k * 16 + m] = c2 < d.planes && j < g.cout ? weight_pair(g, wval, gi, c2, t, j) : 0u;
          }
      });
}

/// The band's chunks of pixels (see above) straight from the input: pixel (hr, w) of chunk cb
/// holds the pairs of channels cb*32 .. cb*32 + 31 (zero past cin) at input row h0 + hr, column
/// w - pl (zeros outside the input). 16 band columns at a time: two channel rows (bf16) or four
/// (fp8, then widened in one conversion) are loaded into one register, each into its own 16
/// lanes by a masked load whose base is offset so that lane i reads band column w + i (the
/// padding is the mask: no lane is shifted after the load); a permutation makes the pairs, and
/// the 16 pair vectors are transposed in registers into 16 pixels: no copy of the rows in
/// between (a copy through a buffer read back at once stalled on store forwarding: 0.5x).
/// Pixels past BH x Wp are left as they are.
template <class T>
void fill_band_pixels(const geometry& g, const direct_layout& d, const T* in, index_t cs,
                      index_t hs, index_t h0, std::uint32_t* band) {
  constexpr auto es = static_cast<std::intptr_t>(sizeof(T));
  index_t lo, hi; // band columns holding input columns: wc = w + pl
  valid_output_range(g.Win, d.Wp, 1, -g.pl, lo, hi);
  // Word 2i of a pair vector is lane i of the register's first 16 (channel 2k), word 2i + 1
  // lane i of its second 16 (channel 2k + 1).
  alignas(64) static constexpr std::uint16_t pair_words[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pairs = _mm512_load_si512(pair_words);
  for (index_t cb = 0; cb < d.chunks(); ++cb) {
    const index_t nc = std::min<index_t>(32, g.cin - cb * 32); // channels of the chunk
    for (index_t hr = 0; hr < d.BH; ++hr) {
      std::uint32_t* px = band + ((cb * d.PR + hr) * d.Wp) * 16;
      const index_t h = h0 + hr;
      if (h < 0 || h >= g.Hin) {
        std::memset(px, 0, 64 * static_cast<std::size_t>(d.Wp));
        continue;
      }
      const auto row = reinterpret_cast<std::intptr_t>(in + cb * 32 * cs + h * hs);
      for (index_t w = 0; w < d.Wp; w += 16) {
        // Lanes [c0 - w, c1 - w) of this block hold input columns (band columns [c0, c1)).
        const index_t c0 = std::max(w, lo), c1 = std::min(w + 16, hi);
        const std::uint64_t valid =
            c1 > c0 ? ((std::uint64_t(1) << (c1 - w)) - 1u) & ~((std::uint64_t(1) << (c0 - w)) - 1u)
                    : 0u;
        // Channel i's lanes in the register's u-th group of 16: the load's base is 16u elements
        // before band column w's input (masked-off lanes are not read).
        const auto mask = [&](index_t i, index_t u) { return i < nc ? valid << (16 * u) : 0u; };
        const auto base = [&](index_t i, index_t u) {
          return reinterpret_cast<const void*>(row + es * (i * cs + w - g.pl - 16 * u));
        };
        __m512 r[16];
        if constexpr (std::is_same_v<T, bfloat16>) {
          for (index_t k = 0; k < 16; ++k) {
            __m512i v =
                _mm512_maskz_loadu_epi16(static_cast<__mmask32>(mask(2 * k, 0)), base(2 * k, 0));
            v = _mm512_mask_loadu_epi16(v, static_cast<__mmask32>(mask(2 * k + 1, 1)),
                                        base(2 * k + 1, 1));
            r[k] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(pairs, v));
          }
        } else {
#if defined(__AVX512VBMI__)
          for (index_t t = 0; t < 8; ++t) { // channels 4t .. 4t + 3: pair planes 2t, 2t + 1
            __m512i v = _mm512_setzero_si512();
            for (index_t u = 0; u < 4; ++u)
              v = _mm512_mask_loadu_epi8(v, mask(4 * t + u, u), base(4 * t + u, u));
            __m512i a, b;
            hostgemm::fp8_to_bf16_x64<T>(v, a, b);
            r[2 * t] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(pairs, a));
            r[2 * t + 1] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(pairs, b));
          }
#else
          for (index_t k = 0; k < 16; ++k) {
            alignas(64) std::uint16_t t[32];
            for (index_t u = 0; u < 2; ++u) {
              const auto* src = reinterpret_cast<const T*>(row) + (2 * k + u) * cs + w - g.pl;
              for (index_t i = 0; i < 16; ++i)
                t[16 * u + i] =
                    mask(2 * k + u, 0) >> i & 1u ? hostgemm::bf16_bits(src[i]) : std::uint16_t(0);
            }
            r[k] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(pairs, _mm512_load_si512(t)));
          }
#endif
        }
        transpose16_regs(r);
        const index_t n = std::min<index_t>(16, d.Wp - w);
        for (index_t j = 0; j < n; ++j)
          _mm512_store_si512(px + (w + j) * 16, _mm512_castps_si512(r[j]));
      }
    }
  }
}

// AMX segments (few input channels or a column stride of 2: a 7 x 7 stride-2 stem on 3
// channels). The band above needs 32 channels a chunk and unit column stride; with 3 channels
// it would multiply zeros in 10 of every 11 products. Here every output pixel (slot) gets its
// own row of the reduction, as im2col would give it, but built straight into the A tiles' form
// and in segments: segment e = c*R + r of slot (p, q) holds the 8 inputs x[c, p*sh - pt + r*dh,
// q*sw - pl + s] for s < 8, zero for s >= S and outside the input (one masked load each, no
// copy in between). Four segments are a step's 32 values, 16 pair words: one 64-byte tile row.
// Chunk k of the band holds step k of every slot of the unit (cap rows), so an A tile is 16
// consecutive slots of a chunk as in the grid form, and the register block, the C block and
// channel_rows are the grid form's (SP = Wout: no garbage slots). The weights are packed in the
// same order (pack_weight_tiles). A stem's slot is 6 steps of 32 values for 147 products (77%
// used); the fill costs 4 masked loads and a store per step and slot, against 64 cout flops
// per value on the tiles. (Filling and multiplying 32 slots at a time, the band then in L1,
// ran at 0.8-0.9x: the tile loads wait for the fill's stores.)

/// The segments (see above) of a unit's `rows` output rows (slot i = p*Wout + q, output row p
/// of the unit, whose input row of tap r = 0 is h0 + p*sh): slot i of chunk k at band +
/// (k*ld + i)*16.
template <class T>
void fill_band_segments(const geometry& g, const T* in, index_t cs, index_t hs, index_t h0,
                        index_t rows, index_t ld, std::uint32_t* band) {
  constexpr index_t W8 = seg_width, SPS = seg_per_step;
  const index_t chunk = ld * 16;
  constexpr auto es = static_cast<std::intptr_t>(sizeof(T));
  const index_t segs = g.cin * g.R, steps = (segs + SPS - 1) / SPS;
  // Taps s < S of slot column q inside the input: input columns c0 + s, c0 = q*sw - pl.
  const auto taps = [&](index_t c0) {
    const index_t a = std::max<index_t>(0, -c0), b = std::min(g.S, g.Win - c0);
    return b > a ? ((1u << b) - 1u) & ~((1u << a) - 1u) : 0u;
  };
  // Segment e of output row p: its input row (bytes; `in` where it has no valid tap) and
  // whether that row is inside the input (all 8 lanes or none). Lane W8*j + s of a register
  // holding segment j reads column c0 + s: the masked load's base is W8*j elements before it
  // (masked-off lanes are not read).
  const auto row_of = [&](index_t p, index_t e, index_t j, std::intptr_t& at, std::uint64_t& rm) {
    const index_t h = h0 + p * g.sh + e % g.R * g.dh;
    const bool inside = e < segs && h >= 0 && h < g.Hin;
    rm = inside ? std::uint64_t(0xff) << (W8 * j) : 0u;
    at = reinterpret_cast<std::intptr_t>(inside ? in + e / g.R * cs + h * hs : in) - es * W8 * j;
  };
  for (index_t p = 0; p < rows; ++p) {
    std::uint32_t* run = band + p * g.Wout * 16; // column q's row at run + q*16
    if constexpr (std::is_same_v<T, bfloat16>) {
      for (index_t k = 0; k < steps; ++k) {
        std::intptr_t at[SPS];
        std::uint64_t rm[SPS];
        for (index_t j = 0; j < SPS; ++j) row_of(p, k * SPS + j, j, at[j], rm[j]);
        std::uint32_t* dst = run + k * chunk;
        for (index_t q = 0; q < g.Wout; ++q) {
          const index_t c0 = q * g.sw - g.pl;
          const std::uint64_t cm = taps(c0) * 0x01010101u; // the taps in every segment's lanes
          __m512i v = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (index_t j = 0; j < SPS; ++j)
            v = _mm512_mask_loadu_epi16(v, static_cast<__mmask32>(cm & rm[j]),
                                        reinterpret_cast<const void*>(at[j] + es * c0));
          _mm512_store_si512(dst + q * 16, v);
        }
      }
    } else {
#if defined(__AVX512VBMI__)
      // fp8: two steps' 64 codes a register, widened to bf16 in one conversion.
      for (index_t k = 0; k < steps; k += 2) {
        std::intptr_t at[2 * SPS];
        std::uint64_t rm[2 * SPS];
        for (index_t j = 0; j < 2 * SPS; ++j) row_of(p, k * SPS + j, j, at[j], rm[j]);
        std::uint32_t* dst = run + k * chunk;
        for (index_t q = 0; q < g.Wout; ++q) {
          const index_t c0 = q * g.sw - g.pl;
          const std::uint64_t cm = taps(c0) * 0x0101010101010101ull;
          __m512i v = _mm512_setzero_si512();
#pragma GCC unroll 8
          for (index_t j = 0; j < 2 * SPS; ++j)
            v = _mm512_mask_loadu_epi8(v, cm & rm[j],
                                       reinterpret_cast<const void*>(at[j] + es * c0));
          __m512i lo, hi;
          hostgemm::fp8_to_bf16_x64<T>(v, lo, hi);
          _mm512_store_si512(dst + q * 16, lo);
          if (k + 1 < steps) _mm512_store_si512(dst + chunk + q * 16, hi);
        }
      }
#else
      for (index_t k = 0; k < steps; ++k)
        for (index_t q = 0; q < g.Wout; ++q) {
          const index_t c0 = q * g.sw - g.pl;
          const std::uint32_t cm = taps(c0);
          alignas(64) std::uint16_t t[2 * 16];
          for (index_t j = 0; j < SPS; ++j) {
            std::intptr_t at;
            std::uint64_t rm;
            row_of(p, k * SPS + j, 0, at, rm);
            const auto* row = reinterpret_cast<const T*>(at);
            for (index_t s = 0; s < W8; ++s)
              t[W8 * j + s] = (cm & rm) >> s & 1u ? hostgemm::bf16_bits(row[c0 + s]) : 0;
          }
          std::memcpy(run + k * chunk + q * 16, t, 64);
        }
#endif
    }
  }
}

/// One register block: C (32 slots x 32 channels, fp32, rows ldc floats apart at c) = the sum
/// over the steps q of the band tiles at a0 + 16 off[q] (slots 0-15) and a1 + 16 off[q]
/// (16-31) times the weight tiles w0 + q*256 (channels 0-15) and w1 + q*256 (16-31). The tiles
/// are configured (hostgemm::amx_kernel::begin).
[[gnu::noinline]] inline void amx_direct_block(index_t steps, const std::uint32_t* a0,
                                               const std::uint32_t* a1, const index_t* off,
                                               const std::uint32_t* w0, const std::uint32_t* w1,
                                               float* c, index_t ldc) {
  TESSERA_AMX_ZERO(0);
  TESSERA_AMX_ZERO(1);
  TESSERA_AMX_ZERO(2);
  TESSERA_AMX_ZERO(3);
  for (index_t q = 0; q < steps; ++q) {
    TESSERA_AMX_LOADD(4, a0 + off[q] * 16, 64);
    TESSERA_AMX_LOADD(6, w0 + q * 256, 64);
    TESSERA_AMX_LOADD(7, w1 + q * 256, 64);
    TESSERA_AMX_DPBF16PS(0, 4, 6);
    TESSERA_AMX_DPBF16PS(1, 4, 7);
    TESSERA_AMX_LOADD(5, a1 + off[q] * 16, 64);
    TESSERA_AMX_DPBF16PS(2, 5, 6);
    TESSERA_AMX_DPBF16PS(3, 5, 7);
  }
  const auto ld = static_cast<long>(ldc * 4);
  TESSERA_AMX_STORED(0, c, ld);
  TESSERA_AMX_STORED(1, c + 16, ld);
  TESSERA_AMX_STORED(2, c + 16 * ldc, ld);
  TESSERA_AMX_STORED(3, c + 16 * ldc + 16, ld);
}
#endif // TESSERA_GEMM_AMX
#endif // TESSERA_GEMM_AVX512BF16

/// True when this CPU runs the bf16 pairs forms (run_direct with Pairs, run_weight_direct on
/// bf16) with VDPBF16PS: the build targets AVX512_BF16, the CPU has it, and AMX is not usable
/// (AMX machines take pairs_amx_cpu's form of run_direct and im2col + the AMX GEMM for
/// backward-weight).
inline bool pairs_cpu() {
#if TESSERA_GEMM_AVX512BF16
  bool amx = false;
#if TESSERA_GEMM_AMX
  amx = cpu::amx_bf16_usable();
#endif
  return !amx && cpu::has_avx512bf16();
#else
  return false;
#endif
}

/// True when run_direct with Pairs takes AMX tiles on this CPU: the build targets AMX-BF16 (and
/// AVX512_BF16, which fills the bands) and the CPU and OS let this process use it.
inline bool pairs_amx_cpu() {
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16 && !TESSERA_GEMM_AMX_EMULATED
  return cpu::amx_bf16_usable();
#else
  return false;
#endif
}

/// The layout of the bf16 pairs form of the direct path on this CPU (AMX tiles or VDPBF16PS;
/// !ok where neither runs).
inline direct_layout pairs_layout_for(const geometry& g, bool even_rows = false) {
  if (pairs_amx_cpu()) return direct_layout_for(g, true, even_rows, true);
  if (pairs_cpu()) return direct_layout_for(g, true, even_rows);
  return {};
}

/// True when a convolution of geometry g with operands exact in bf16 takes the pairs form of
/// the direct path on this CPU.
inline bool pairs_direct_for(const geometry& g) {
  return pairs_layout_for(g).ok;
}

/// The sums of a unit's `rows` output rows as channel rows without the garbage slots:
/// ct[j * ldt + p * Wout + q] = cb[(p * SP + q) * npad + j] for j < cout, p < rows, q < Wout, so
/// that each channel's outputs of the unit are one contiguous run. 16 slots are transposed at a
/// time: a row's last block spills up to 15 values past the row, which the next row's blocks
/// then overwrite (past the last row they land in the slack of ldt = cap + 16), and reads up to
/// 15 slots past the last row (inside the part's memory: ct follows cb).
inline void channel_rows(const geometry& g, const direct_layout& d, const float* cb, index_t rows,
                         float* ct) {
  const index_t np = g.npad();
  const float* trows[16];
  for (index_t p = 0; p < rows; ++p)
    for (index_t q0 = 0; q0 < g.Wout; q0 += 16) {
      for (index_t i = 0; i < 16; ++i) trows[i] = cb + (p * d.SP + q0 + i) * np;
      transpose16(trows, g.cout, ct + p * g.Wout + q0, d.ldt());
    }
}

/// run() through the direct path (d.ok): same operands; rows_out(sums, k, n, p0, count) takes
/// the fp32 sums of output channel k of image n, output rows p0 .. p0 + count - 1 (Wout sums
/// each, contiguous). Pairs: d is direct_layout_for(g, true), pb holds the weights as
/// pack_weight_pairs wrote them (bf16 pairs), else as pack_weights did (fp32). scratch:
/// d.steps(g) offsets (as index_t, rounded up to 64 bytes), then parts_for(exec, g, d) *
/// d.part_floats(g) floats, 64-byte aligned.
template <bool Pairs, class Exec, class T, class Rows>
void run_direct(const Exec& exec, const geometry& g, const direct_layout& d, const T* in,
                index_t in_ns, index_t in_cs, index_t in_hs, const void* pbv, void* scratch,
                const Rows& rows_out) {
  using word = std::conditional_t<Pairs, std::uint32_t, float>;
  static_assert(sizeof(word) == sizeof(float), "a band word is 4 bytes");
  const int parts = parts_for(exec, g, d);
  const index_t units = d.units(g), steps = d.steps(g), np = g.npad();
  const auto* pb = static_cast<const word*>(pbv);
  const auto* off = static_cast<const index_t*>(scratch);
  // AMX: a step reads a chunk of pixels; its offset (in pixels) is that of the chunk's start.
  word* base = reinterpret_cast<word*>(d.seg   ? step_offsets(steps, d.cap, scratch)
                                       : d.amx ? tap_offsets(g, d.chunks(), d.PR, d.Wp, scratch)
                                               : tap_offsets(g, d.planes, d.BH, d.Wp, scratch));
  const std::size_t per_part = d.part_floats(g), band_n = d.band_floats(g),
                    band_used = static_cast<std::size_t>(d.planes * d.BH * d.Wp);
  const auto body = [&](const int part) {
    word* band = base + static_cast<std::size_t>(part) * per_part;
    float* cb = reinterpret_cast<float*>(band + (band_n + 15) / 16 * 16); // cap x np
    float* ct = cb + d.cap * np;                                          // np x ldt
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
    if constexpr (Pairs) {
      if (d.amx) { // AMX tiles: the band's chunks of pixels (fill_band_pixels)
        std::memset(band, 0, sizeof(word) * band_n);
        hostgemm::amx_kernel::begin();
        const index_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
        for (index_t u = u0; u < u1; ++u) {
          const index_t n = u / (g.G * d.bands), gi = u / d.bands % g.G, p0 = u % d.bands * d.rows;
          const index_t rows = std::min(d.rows, g.Hout - p0), slots = rows * d.SP;
          const T* img = in + n * in_ns + gi * g.cin * in_cs;
          if (d.seg) {
            fill_band_segments(g, img, in_cs, in_hs, p0 * g.sh - g.pt, rows, d.cap, band);
          } else {
            fill_band_pixels(g, d, img, in_cs, in_hs, p0 * g.sh - g.pt, band);
          }
          for (index_t jb = 0; jb < np; jb += 32) {
            const word* w0 = pb + ((gi * np + jb) * steps) * 16;
            for (index_t sb = 0; sb < slots; sb += 32)
              amx_direct_block(steps, band + 16 * d.slot_offset(g, sb),
                               band + 16 * d.slot_offset(g, sb + 16), off, w0, w0 + steps * 256,
                               cb + sb * np + jb, np);
          }
          channel_rows(g, d, cb, rows, ct);
          for (index_t j = 0; j < g.cout; ++j)
            rows_out(ct + j * d.ldt(), gi * g.cout + j, n, p0, rows);
        }
        hostgemm::amx_kernel::end();
        return;
      }
    }
#endif
    std::memset(band + band_used, 0, sizeof(word) * (band_n - band_used));
    const index_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    band_prefetch<T> ahead;
    for (index_t u = u0; u < u1; ++u) {
      const index_t n = u / (g.G * d.bands), gi = u / d.bands % g.G, p0 = u % d.bands * d.rows;
      const index_t rows = std::min(d.rows, g.Hout - p0), slots = rows * d.SP;
      const T* img = in + n * in_ns + gi * g.cin * in_cs;
      if (u + 1 < u1) { // the next unit's rows, over this unit's micro-kernel calls
        const index_t nn = (u + 1) / (g.G * d.bands), ng = (u + 1) / d.bands % g.G;
        ahead.arm(in + nn * in_ns + ng * g.cin * in_cs, 1, 0, g.cin, in_cs, in_hs,
                  (u + 1) % d.bands * d.rows * g.sh - g.pt, d.BH, g.Hin, g.Win,
                  (steps + KC - 1) / KC * (np / NR) * ((slots + MR - 1) / MR));
      }
      if constexpr (Pairs) {
#if TESSERA_GEMM_AVX512BF16
        fill_band_pairs(g, d, img, in_cs, in_hs, p0 * g.sh - g.pt, band);
#endif
      } else {
        fill_band(g, d, img, in_cs, in_hs, p0 * g.sh - g.pt, band);
      }
      for (index_t pc = 0; pc < steps; pc += KC) {
        const index_t kc = std::min(KC, steps - pc);
        const word* bs = pb + (gi * steps + pc) * np;
        // Channel panels outer: one panel of weights (kc x NR words) and the band stay in L1
        // while the slot panels run over them.
        for (index_t jp = 0; jp < np; jp += NR) {
          for (index_t ip = 0; ip < slots; ip += MR) {
            // The band offset of slot ip: output row ip / SP, column ip % SP (any slot when
            // linear).
            const word* a0 = band + ip / d.SP * g.sh * d.Wp + ip % d.SP * g.sw;
            float* c0 = cb + ip * np + jp;
            ahead.step();
            if constexpr (Pairs) {
#if TESSERA_GEMM_AVX512BF16
              if (g.sw == 1) {
                micro_pairs<1>(kc, a0, off + pc, bs + jp * kc, c0, np, pc > 0);
              } else {
                micro_pairs<2>(kc, a0, off + pc, bs + jp * kc, c0, np, pc > 0);
              }
#endif
            } else if (g.sw == 1) {
              micro_direct<1>(kc, a0, off + pc, bs + jp * kc, c0, np, pc > 0);
            } else {
              micro_direct<2>(kc, a0, off + pc, bs + jp * kc, c0, np, pc > 0);
            }
          }
        }
      }
      channel_rows(g, d, cb, rows, ct);
      for (index_t j = 0; j < g.cout; ++j) rows_out(ct + j * d.ldt(), gi * g.cout + j, n, p0, rows);
    }
  };
  if (parts == 1) {
    body(0);
  } else {
    Kokkos::parallel_for(
        "tessera::conv2d[implicit direct]",
        Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, parts), body);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward-weight
// ---------------------------------------------------------------------------------------------
//
// dW_g (cout x kred, i.e. K/groups x C/groups*R*S) = sum over pixels of dy_g x A^T, where A is
// the forward pass's gathered input (pixels x kred). Here the reduction runs over pixels, which
// are contiguous in both x and dy, and the GEMM's panels need it as their outer index: both
// operands are transposed while packing, 16 x 16 floats at a time in registers (AVX-512). The
// GEMM's rows are the taps kk (micro-panels of MR = 14 taps, gathered row by row into a small
// dense block, then transposed), its columns the output channels (panels of NR = 32 dy rows,
// transposed straight from dy), its reduction the KP <= KC pixels of a work unit (image, group,
// pixel block). Each thread sums its units into its own fp32 dW^T (kred rounded up to MR, times
// cout rounded up to NR, per group); the threads' sums are added in thread order at the end,
// times alpha, into dw: deterministic for a thread count.

/// Pixel blocks of the backward-weight units: `blocks` per image of `kp` pixels (the last one
/// shorter), kp a multiple of 16 and at most KC, the blocks of an image as even as possible.
struct weight_blocks {
  index_t kp = 0, blocks = 0;
};
inline weight_blocks weight_blocking(const geometry& g) {
  const index_t pq = std::max<index_t>(g.pixels(), 1), blocks = (pq + KC - 1) / KC;
  const index_t kp = ((pq + blocks - 1) / blocks + 15) / 16 * 16;
  return {kp, (pq + kp - 1) / kp};
}
/// Rows of a group's dW^T sums: kred rounded up to MR.
inline index_t weight_rows(const geometry& g) {
  return (g.kred() + MR - 1) / MR * MR;
}
/// Floats of one thread's backward-weight scratch: A block (MC taps x KC pixels, + slack), B
/// (KC pixels x npad channels), the 16-row gather block, the dW^T sums of every group.
inline std::size_t weight_scratch_floats(const geometry& g) {
  return static_cast<std::size_t>(MC * KC + 16 * 16 + KC * g.npad() + 16 * (KC + 16) +
                                  g.G * weight_rows(g) * g.npad());
}
template <class Exec>
int weight_parts(const Exec& exec, const geometry& g) {
  return parts_for(exec, g.N * g.G * weight_blocking(g).blocks);
}

/// Gathers the inputs of tap kk (channel c, kernel row r, column s) for pixels [m0, m0 + kp)
/// of one image and group into d[0 .. kp) (0 in the padding).
inline void gather_tap(const geometry& g, const float* in, index_t cs, index_t hs, index_t c,
                       index_t r, index_t s, index_t m0, index_t kp, float* d) {
  const float* plane = in + c * cs;
  const index_t woff = s * g.dw - g.pl;
  index_t lo, hi; // output columns whose input column is inside the image
  valid_output_range(g.Win, g.Wout, g.sw, woff, lo, hi);
  for (index_t m = m0; m < m0 + kp;) {
    const index_t p = m / g.Wout, q0 = m % g.Wout, q1 = std::min(g.Wout, q0 + m0 + kp - m);
    float* out = d + (m - m0) - q0; // output column q at out[q]
    const index_t h = p * g.sh - g.pt + r * g.dh;
    if (h < 0 || h >= g.Hin) {
      for (index_t q = q0; q < q1; ++q) out[q] = 0.f;
    } else {
      const float* row = plane + h * hs + woff;
      const index_t a = std::clamp(lo, q0, q1), b = std::clamp(hi, a, q1);
      for (index_t q = q0; q < a; ++q) out[q] = 0.f;
      if (g.sw == 1) {
        for (index_t q = a; q < b; ++q) out[q] = row[q];
      } else {
        for (index_t q = a; q < b; ++q) out[q] = row[q * g.sw];
      }
      for (index_t q = b; q < q1; ++q) out[q] = 0.f;
    }
    m += q1 - q0;
  }
}

/// Runs backward-weight: x (in), dy (out-side operand, cout channels per group, pixels
/// contiguous per channel: image stride dy_ns, channel stride dy_cs) into the dW^T sums, then
/// store(k, kk, v) for every output channel k (of all G*cout) and tap kk with v = alpha * sum.
/// scratch: weight_parts(exec, g) * weight_scratch_floats(g) floats, 64-byte aligned.
template <class Exec, class Store>
void run_weight(const Exec& exec, const geometry& g, const float* in, index_t in_ns, index_t in_cs,
                index_t in_hs, const float* dy, index_t dy_ns, index_t dy_cs, float* scratch,
                const Store& store) {
  const int parts = weight_parts(exec, g);
  const weight_blocks wb = weight_blocking(g); // not a structured binding: the lambda uses them
  const index_t kp = wb.kp, blocks = wb.blocks;
  const index_t kred = g.kred(), np = g.npad(), rows = weight_rows(g), RS = g.R * g.S;
  const index_t units = g.N * g.G * blocks, ldt = KC + 16;
  const std::size_t per_part = weight_scratch_floats(g);
  const auto body = [&](const int part) {
    float* pa = scratch + static_cast<std::size_t>(part) * per_part; // MC x KC, + 16 x 16 slack
    float* pb = pa + MC * KC + 16 * 16;                              // KC x np
    float* tmp = pb + KC * np;                                       // 16 x ldt
    float* sums = tmp + 16 * ldt;                                    // G x rows x np
    std::memset(sums, 0, sizeof(float) * static_cast<std::size_t>(g.G * rows * np));
    alignas(64) float t[MR * NR];
    const float* trows[16];
    const index_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    for (index_t u = u0; u < u1; ++u) {
      const index_t n = u / (g.G * blocks), gi = u / blocks % g.G, m0 = u % blocks * kp;
      const index_t kc = std::min(kp, g.pixels() - m0);
      const float* img = in + n * in_ns + gi * g.cin * in_cs;
      // B: dy rows of the group's channels, transposed into panels of NR channels.
      for (index_t jp = 0; jp < np; jp += NR)
        for (index_t h = 0; h < NR; h += 16) {
          for (index_t i = 0; i < 16; ++i) {
            const index_t k = jp + h + i;
            trows[i] = k < g.cout ? dy + n * dy_ns + (gi * g.cout + k) * dy_cs + m0 : nullptr;
          }
          transpose16(trows, kc, pb + jp * kc + h, NR);
        }
      float* sg = sums + gi * rows * np;
      for (index_t t0 = 0; t0 < kred; t0 += MC) { // a block of MC taps
        const index_t mc = std::min(MC, kred - t0);
        for (index_t ip = 0; ip < mc; ip += MR) { // gather MR taps, transpose into a panel
          for (index_t i = 0; i < 16; ++i) {
            const index_t kk = t0 + ip + i;
            if (i < MR && ip + i < mc) {
              gather_tap(g, img, in_cs, in_hs, kk / RS, kk / g.S % g.R, kk % g.S, m0, kc,
                         tmp + i * ldt);
              trows[i] = tmp + i * ldt;
            } else {
              trows[i] = nullptr;
            }
          }
          transpose16(trows, kc, pa + ip * kc, MR); // 16-float rows: slack past the block
        }
        for (index_t jp = 0; jp < np; jp += NR)
          for (index_t ip = 0; ip < mc; ip += MR) {
            kern::micro(kc, pa + ip * kc, pb + jp * kc, t);
            float* c0 = sg + (t0 + ip) * np + jp;
            for (index_t i = 0; i < MR; ++i)
              for (index_t j = 0; j < NR; ++j) c0[i * np + j] += t[i * NR + j];
          }
      }
    }
  };
  if (parts == 1) {
    body(0);
  } else {
    Kokkos::parallel_for(
        "tessera::conv2d_backward_weight[implicit]",
        Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, parts), body);
  }
  // dw[k, kk] = alpha * (sum over threads, in order, of their dW^T sums): per block of 16 taps,
  // the sums' rows (contiguous) are added into an L1 block, then stored 16 taps per channel.
  const std::size_t stride = per_part, off = MC * KC + 16 * 16 + KC * np + 16 * ldt;
  const index_t tblocks = (kred + 15) / 16;
  Kokkos::parallel_for("tessera::conv2d_backward_weight[implicit sum]",
                       Kokkos::RangePolicy<Exec>(exec, 0, g.G * tblocks), [=](const index_t b) {
                         const index_t gi = b / tblocks, kk0 = b % tblocks * 16,
                                       nk = std::min<index_t>(16, kred - kk0);
                         float acc[16 * 256];
                         for (index_t cb = 0; cb < np; cb += 256) { // 256 channels: a 16 KiB block
                           const index_t nc = std::min<index_t>(256, np - cb);
                           for (index_t i = 0; i < nk; ++i) {
                             float* a = acc + i * nc;
                             for (int p = 0; p < parts; ++p) {
                               const float* src =
                                   scratch + stride * static_cast<std::size_t>(p) + off +
                                   static_cast<std::size_t>((gi * rows + kk0 + i) * np + cb);
                               if (p == 0) {
                                 for (index_t j = 0; j < nc; ++j) a[j] = src[j];
                               } else {
                                 for (index_t j = 0; j < nc; ++j) a[j] += src[j];
                               }
                             }
                           }
                           for (index_t j = 0; j < nc && cb + j < g.cout; ++j)
                             for (index_t i = 0; i < nk; ++i)
                               store(gi * g.cout + cb + j, kk0 + i, g.alpha * acc[i * nc + j]);
                         }
                       });
}

// ---------------------------------------------------------------------------------------------
// Backward-weight, stride 1, AVX-512: dot products along output rows
// ---------------------------------------------------------------------------------------------
//
// run_weight gathers every tap's inputs and transposes them and dy so that the pixels become
// the GEMM's reduction index: on a 32 -> 64 channel 3x3 layer of 14 x 14 that costs as much as
// the products. With stride 1 the pixels of an output row are contiguous in dy and, for every
// tap, in the zero-padded input band (fill_band): dW[k, (c, r, s)] = sum over rows p and
// columns q of dy[k, p, q] * band[c, p + r*dh, q + s*dw]. Vectors run along q (16 columns, the
// last ones of a row masked), a register block holds KB = 4 output channels x TB = 6 taps (24
// accumulators, 4 + 6 loads per 24 FMAs), and the 16 lanes are summed once per block of
// images. With S = 1 and no horizontal padding the rows of a band are contiguous in both
// operands and run as one row (1 x 1 layers). A unit is a block of NB images' bands of BR
// output rows: NB * BR * (vectors per row) >= 64 steps per register block where the images
// allow, so the horizontal sums cost a few percent; the bands fit in 384 KiB of L2.
//
// With a 3-wide kernel of dilation 1 and whole vectors of output channels (cout a multiple of
// 16, a reduction of 32 or more) the channels run along the lanes instead (klanes): each unit
// transposes its dy to pixels x channels (16 channels at a time, in blocks of 64), and a
// register block of KV channel vectors x 3 NR taps (NR runs of three adjacent taps, KV 3 NR <=
// 24) takes, per pixel, KV loads of dy and 3 NR broadcasts of the band, keeping its sums in
// registers over all of the unit's pixels: no lane sums, no masked tails, and only true pixels
// (the dot products along rows also multiply the band's padding columns). bf16 pairs run the
// same on pairs of grid positions (32-bit words of dy and of the band, the grid's extra
// columns meeting zeros of dy), a band holding Inf or NaN by the row-by-row dot products.
// Measured (Zen 5, 32 -> 64 channels at 14 x 14, fp32): 135 -> 172 GFLOP/s at 1 thread.
//
// A 1 x 1 kernel's taps are its input channels, so the same register blocks take runs of one
// tap (weight_lanes<KV, NR, 1>: 4 x 6, 3 x 8, 2 x 12, 1 x 12). With fewer input than output
// channels (cin a multiple of 16) the roles swap (xlanes): x is transposed (cin x pixels, a
// quarter of dy's 64 -> 256) and dy broadcast, the sums kept cout x cin; fp32 x without
// padding is read where it lies (the band would be a copy of it), and bf16 bands and grids
// of whole rows are copied one run per channel. The dot products along rows were load-bound
// there (10 vector loads per 24 FMAs: 74% of the FMA peak from L1, 62% from L2) and copied x.
// Measured (Zen 5, 1 thread, 64 -> 256 channels at 56 x 56, N 8): fp32 101 -> 160, bf16
// 220 -> 349, fp8 184 -> 359 GFLOP/s; docs/performance.md.

inline constexpr index_t wKB = 4, wTB = 6;

struct weight_direct_layout {
  bool ok = false;
  bool pairs = false; ///< bf16 elements (2 bytes, 32 per vector), else fp32 (4, 16)
  index_t Wp = 0, BR = 0, BH = 0, bands = 0; ///< band row length, output rows, input rows
  index_t NB = 0, nblk = 0;                  ///< images per unit (at most), blocks of images
  bool padded_dy = false; ///< dy is copied onto the band's grid (zero columns past Wout)
  /// Output channels along the lanes (3-wide kernels of dilation 1 or 1 x 1 kernels, cout a
  /// multiple of 16; the sums are kred x cout). fp32 (weight_lanes): dy is transposed, in
  /// blocks of 64 channels, to pixels x 64 (the last block pixels x its channels). bf16 pairs
  /// (weight_lanes_pairs): dy on the grid, then its pairs of positions (32-bit words)
  /// transposed so. A 1 x 1 layer with fewer input channels (a multiple of 16) transposes x
  /// instead, its input channels along the lanes and the sums cout x kred (run_weight_direct's
  /// xlanes; for bf16 pairs only that form is laid out, with 32 or more input channels).
  bool klanes = false;
  /// fp32 elements widened from x and dy of a lower precision: a unit's rows of dy are
  /// widened into a copy (cout x BR x Wout floats per image), read as dy itself would be.
  bool widened = false;
  index_t lanes() const noexcept { return pairs ? 32 : 16; }
  index_t units(const geometry& g) const noexcept { return g.G * nblk * bands; }
  /// A band in elements, with slack for the last row's reads past its end (zeros), rounded up
  /// to 64 bytes.
  std::size_t band_stride(const geometry& g) const noexcept {
    const index_t L = lanes();
    return static_cast<std::size_t>(g.cin * BH * Wp + (g.S - 1) * g.dw + L + L - 1) / L * L;
  }
  /// dy of one image on the band's grid (cout x BR x Wp elements), transposed (BR x Wout x cout
  /// floats, klanes), or 0.
  std::size_t dyp_stride(const geometry& g) const noexcept {
    const index_t L = lanes();
    if (widened) // never on the grid (padded_dy false)
      return static_cast<std::size_t>(g.cout * BR * g.Wout + L - 1) / L * L;
    if (klanes && !pairs) return static_cast<std::size_t>(BR * g.Wout * g.cout);
    if (klanes) // the grid (channels grid_cs() apart), then its pairs transposed (words x cout)
      return static_cast<std::size_t>(g.cout * grid_cs() + 2 * g.cout * pair_words() + L - 1) / L *
             L;
    return padded_dy ? static_cast<std::size_t>(g.cout * BR * Wp + L - 1) / L * L : 0;
  }
  /// Elements between two channels of dy on the grid: BR x Wp, made even for the pairs of
  /// klanes (whose last pair has a zero past the band's last position when it is odd).
  index_t grid_cs() const noexcept { return klanes && pairs ? (BR * Wp + 1) / 2 * 2 : BR * Wp; }
  /// Pairs of grid positions of a band (klanes, pairs).
  index_t pair_words() const noexcept { return (BR * Wp + 1) / 2; }
  /// dW sums of a thread: G x cout x kred floats, or G x kred x cout (klanes).
  std::size_t sums_floats(const geometry& g) const noexcept {
    return static_cast<std::size_t>(g.G * g.kred() * g.cout);
  }
  /// Bands: output rows BR per band, from the whole image halved until footprint(BR) (elements
  /// a unit holds per image) is within budget, then evened out over the bands; BH their input
  /// rows.
  template <class Footprint>
  void size_bands(const geometry& g, index_t budget, const Footprint& footprint) {
    BR = g.Hout;
    while (BR > 1 && footprint(BR) > budget) BR = (BR + 1) / 2;
    bands = (g.Hout + BR - 1) / BR;
    BR = (g.Hout + bands - 1) / bands;
    BH = BR + (g.R - 1) * g.dh;
  }
  /// Blocks of images of at most `want` images: their number made a multiple of the threads
  /// (N allowing) unless the bands already are, then the images evened out (block b: images
  /// [N b / nblk, N (b + 1) / nblk)).
  void size_blocks(const geometry& g, index_t threads, index_t want) {
    nblk = (g.N + want - 1) / want;
    if (bands * g.G % threads != 0) nblk = std::min(g.N, (nblk + threads - 1) / threads * threads);
    NB = (g.N + nblk - 1) / nblk;
  }
  /// Bytes of the elements of a thread: NB bands and padded dy (a multiple of 64).
  std::size_t element_bytes(const geometry& g) const noexcept {
    return static_cast<std::size_t>(NB) * (band_stride(g) + dyp_stride(g)) * (pairs ? 2 : 4);
  }
  /// Per thread: the elements, then the dW sums (G x cout x kred floats).
  std::size_t part_bytes(const geometry& g) const noexcept {
    return element_bytes(g) + sums_floats(g) * 4;
  }
};

/// threads: the threads that will share the units (blocks of images are made a multiple of it
/// where the batch allows).
/// pairs: the layout of bf16 elements (weight_block_pairs), which always copies dy onto the
/// band's grid (as bf16: dy in fp8 is widened there) and needs a reduction of 32 or more.
/// widened: fp32 elements from x and dy of a lower precision (run_weight_direct<true>): each
/// unit widens its band and its rows of dy (contiguous per channel) as it copies them.
inline weight_direct_layout weight_direct_layout_for(const geometry& g, index_t threads,
                                                     bool pairs = false, bool widened = false) {
  weight_direct_layout d;
  d.pairs = pairs;
#if !defined(__AVX512F__)
  return d; // the dot products are written in AVX-512
#endif
  if (g.sh != 1 || g.sw != 1 || g.Hout < 1 || g.Wout < 1 || g.N < 1) return d;
  // Bands of NB images stay in L2 (512 KiB: half of Zen 4/5's L2, a quarter of Sapphire
  // Rapids'), read once per block of wKB channels; dy is read once, wKB channels at a time.
  const index_t budget = (index_t(512) << 10) / (pairs ? 2 : 4); // elements
  d.widened = widened;
  const bool runs3 = g.S == 3 && g.dw == 1, taps1 = g.R == 1 && g.S == 1;
  if (!pairs && !widened && (runs3 || taps1) && g.cout % 16 == 0 && g.kred() >= 32) {
    // Output channels along the lanes (weight_lanes): a unit's band and transposed dy stay in
    // L2 together; its pixels are the reduction, each register block's sums kept in registers
    // over all of them (256 pixels or more per unit where the images allow). Not for a
    // reduction under 32 (a first layer, 1 x 3 x 3): there the transposed copy of dy costs as
    // much as the products, and the rows run on dy itself (measured, Zen 5, 1 -> 32 channels
    // at 28 x 28: 1.17x at 1 thread but 0.90x at 2, where both read dy at the memory's rate).
    // 1 x 1 kernels: runs of one tap (an input channel each), or x transposed (xlanes).
    d.klanes = true;
    d.Wp = g.Wout + (g.S - 1);
    const auto image = [&](index_t br) {
      return g.cin * (br + (g.R - 1) * g.dh) * d.Wp + br * g.Wout * g.cout;
    };
    d.size_bands(g, budget, image);
    const index_t fit = std::max<index_t>(1, budget / image(d.BR));
    d.size_blocks(
        g, threads,
        std::clamp<index_t>((256 + d.BR * g.Wout - 1) / (d.BR * g.Wout), 1, std::min(fit, g.N)));
    d.ok = true;
    return d;
  }
  if (pairs && g.kred() < 32) return d;
  // bf16 pairs along the lanes (below): 3-wide kernels as fp32, 1 x 1 kernels only with x
  // transposed (32 or more input channels, fewer than output channels). With dy transposed
  // they measured 0.92-0.99x the dot products (Zen 5: 256 -> 64 channels at 56 x 56, 512 ->
  // 128 at 28 x 28, 1024 -> 256 at 14 x 14), and with 16 input channels x's single vector
  // per block made 0.94x (16 -> 64 at 56 x 56).
  const bool pairs_lanes = pairs && ((runs3 && g.cout % 16 == 0) ||
                                     (taps1 && g.cin % 16 == 0 && g.cin >= 32 && g.cin < g.cout));
  d.Wp = g.Wout + (g.S - 1) * g.dw;
  if (pairs_lanes && taps1) d.Wp += d.Wp % 2; // every channel of the band starts a whole word
  // dy is copied onto the band's grid only when the copy (cout x pixels) is small beside the
  // products (cout x pixels x kred): with a reduction under 32 (a first layer, 1 x 3 x 3) the
  // rows run one by one on dy itself, their tails masked.
  d.padded_dy = !widened && (pairs || (d.Wp > g.Wout && g.kred() >= 32));
  const auto band = [&](index_t br) { return g.cin * (br + (g.R - 1) * g.dh) * d.Wp; };
  d.size_bands(g, budget, band);
  // Vectors per image and register block.
  const index_t L = d.lanes();
  const index_t steps =
      d.Wp == g.Wout || d.padded_dy ? (d.BR * d.Wp + L - 1) / L : d.BR * ((g.Wout + L - 1) / L);
  const index_t fit = std::max<index_t>(1, budget / std::max<index_t>(1, band(d.BR)));
  const index_t want = std::clamp<index_t>((96 + steps - 1) / steps, 1, std::min(fit, g.N));
  // Each register block ends in 24 lane sums and an update of the dW sums: under 48 vector
  // steps per block they cost more than the gathers and transposes of run_weight (measured,
  // Zen 5: 32 -> 64 channels at 14 x 14, 70 steps, 0.62 of oneDNN against 0.44; 256 channels
  // at 14 x 14, 14 steps, 0.32 against 0.80).
  if (want * steps < 48) return d;
  d.size_blocks(g, threads, want);
  d.ok = true;
  // bf16 pairs of grid positions with output channels along the lanes (weight_lanes_pairs):
  // 3-wide kernels of dilation 1, whole vectors of 16 channels (1 x 1 kernels: x's pairs
  // transposed, the input channels along the lanes); the same blocks of images
  // (blocks sized for L2 with both copies of dy, as for fp32, measured no faster: Zen 5,
  // 32 -> 64 channels at 14 x 14, 1.00x at 1 thread, 0.90-1.00x at 2).
  if (pairs_lanes) d.klanes = true;
  return d;
}

/// True when none of the n floats at v is Inf or NaN (exponent bits all ones).
inline bool all_finite(const float* v, std::size_t n) {
  unsigned bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, v + i, 4);
    bad |= (b & 0x7f800000u) == 0x7f800000u;
  }
  return bad == 0;
}

/// True when none of the n bf16 values (bits) at v is Inf or NaN.
inline bool all_finite(const std::uint16_t* v, std::size_t n) {
  unsigned bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad |= (v[i] & 0x7f80u) == 0x7f80u;
  return bad == 0;
}

/// fill_band for bf16 elements (bits; fp8 widened exactly): input rows [h0, h0 + BH) of cin
/// channel planes, shifted right by pl columns, zero-padded to Wp.
template <class T>
void fill_band_bf16(const geometry& g, const direct_layout& d, const T* in, index_t cs, index_t hs,
                    index_t h0, std::uint16_t* band) {
  index_t lo, hi; // band columns holding input columns: wc = w + pl
  valid_output_range(g.Win, d.Wp, 1, -g.pl, lo, hi);
  if (lo == 0 && hi == d.Wp && d.Wp == g.Win && hs == g.Win && h0 >= 0 && h0 + d.BH <= g.Hin) {
    // Whole rows without padding, contiguous in the input: one run per channel.
    for (index_t c = 0; c < g.cin; ++c)
      hostgemm::load_bf16(in + c * cs + h0 * hs, band + c * d.BH * d.Wp, d.BH * d.Wp);
    return;
  }
  for (index_t c = 0; c < g.cin; ++c)
    for (index_t hr = 0; hr < d.BH; ++hr) {
      std::uint16_t* row = band + (c * d.BH + hr) * d.Wp;
      const index_t h = h0 + hr;
      if (h < 0 || h >= g.Hin) {
        std::memset(row, 0, sizeof(std::uint16_t) * static_cast<std::size_t>(d.Wp));
        continue;
      }
      std::memset(row, 0, sizeof(std::uint16_t) * static_cast<std::size_t>(lo));
      hostgemm::load_bf16(in + c * cs + h * hs + (lo - g.pl), row + lo, hi - lo);
      std::memset(row + hi, 0, sizeof(std::uint16_t) * static_cast<std::size_t>(d.Wp - hi));
    }
}

#if TESSERA_GEMM_AVX512BF16
/// weight_block for bf16 elements: 32 columns per vector, VDPBF16PS adding the products of
/// columns 2j and 2j + 1 to lane j (exact products, fp32 sums, denormals flushed).
[[gnu::noinline]] inline void weight_block_pairs(const std::uint16_t* const* dy, index_t dy_is,
                                                 index_t dy_rs, const std::uint16_t* const* x,
                                                 index_t x_is, index_t x_rs, index_t nb,
                                                 index_t rows, index_t n, float* out) {
  __m512 acc[wKB][wTB];
#pragma GCC unroll 4
  for (index_t i = 0; i < wKB; ++i)
#pragma GCC unroll 6
    for (index_t t = 0; t < wTB; ++t) acc[i][t] = _mm512_setzero_ps();
  const std::uint16_t *d0 = dy[0], *d1 = dy[1], *d2 = dy[2], *d3 = dy[3];
  const std::uint16_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
  static_assert(wKB == 4 && wTB == 6, "weight_block_pairs names its rows");
  const index_t whole = n / 32 * 32;
  const auto m = static_cast<__mmask32>((std::uint64_t(1) << (n - whole)) - 1);
  for (index_t b = 0; b < nb; ++b)
    for (index_t p = 0; p < rows; ++p) {
      const index_t od = b * dy_is + p * dy_rs, ox = b * x_is + p * x_rs;
      for (index_t j = 0; j < whole; j += 32) {
        const __m512bh d[wKB] = {
            (__m512bh)_mm512_loadu_si512(d0 + od + j), (__m512bh)_mm512_loadu_si512(d1 + od + j),
            (__m512bh)_mm512_loadu_si512(d2 + od + j), (__m512bh)_mm512_loadu_si512(d3 + od + j)};
        const std::uint16_t* xs[wTB] = {x0 + ox + j, x1 + ox + j, x2 + ox + j,
                                        x3 + ox + j, x4 + ox + j, x5 + ox + j};
#pragma GCC unroll 6
        for (index_t t = 0; t < wTB; ++t) {
          __m512i xv = _mm512_loadu_si512(xs[t]);
          asm("" : "+v"(xv)); // one load, four products (see weight_block)
#pragma GCC unroll 4
          for (index_t i = 0; i < wKB; ++i)
            acc[i][t] = _mm512_dpbf16_ps(acc[i][t], d[i], (__m512bh)xv);
        }
      }
      if (whole < n) {
        const index_t j = whole;
        const __m512bh d[wKB] = {(__m512bh)_mm512_maskz_loadu_epi16(m, d0 + od + j),
                                 (__m512bh)_mm512_maskz_loadu_epi16(m, d1 + od + j),
                                 (__m512bh)_mm512_maskz_loadu_epi16(m, d2 + od + j),
                                 (__m512bh)_mm512_maskz_loadu_epi16(m, d3 + od + j)};
        const std::uint16_t* xs[wTB] = {x0 + ox + j, x1 + ox + j, x2 + ox + j,
                                        x3 + ox + j, x4 + ox + j, x5 + ox + j};
#pragma GCC unroll 6
        for (index_t t = 0; t < wTB; ++t) {
          const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, xs[t]);
#pragma GCC unroll 4
          for (index_t i = 0; i < wKB; ++i) acc[i][t] = _mm512_dpbf16_ps(acc[i][t], d[i], xv);
        }
      }
    }
#pragma GCC unroll 4
  for (index_t i = 0; i < wKB; ++i)
#pragma GCC unroll 6
    for (index_t t = 0; t < wTB; ++t) out[i * wTB + t] = _mm512_reduce_add_ps(acc[i][t]);
}
#endif // TESSERA_GEMM_AVX512BF16

#if defined(__AVX512F__)
/// out[i * wTB + t] = sum over images b < nb, rows p < rows and columns j < n of
/// dy[i][b * dy_is + p * dy_rs + j] * x[t][b * x_is + p * x_rs + j] (16 columns at a time, the
/// last vector of a row masked): one register block of wKB channels x wTB taps, its 24
/// accumulators kept in registers (a function of its own: inside the unit loop GCC kept them
/// in memory, storing each after its FMA), summed across lanes once at the end.
[[gnu::noinline]] inline void weight_block(const float* const* dy, index_t dy_is, index_t dy_rs,
                                           const float* const* x, index_t x_is, index_t x_rs,
                                           index_t nb, index_t rows, index_t n, float* out) {
  __m512 acc[wKB][wTB];
#pragma GCC unroll 4
  for (index_t i = 0; i < wKB; ++i)
#pragma GCC unroll 6
    for (index_t t = 0; t < wTB; ++t) acc[i][t] = _mm512_setzero_ps();
  const float *d0 = dy[0], *d1 = dy[1], *d2 = dy[2], *d3 = dy[3];
  const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
  static_assert(wKB == 4 && wTB == 6, "weight_block names its rows");
  // Whole vectors with plain loads, then the row's tail with masked ones (written out twice:
  // through a lambda GCC kept the accumulators in memory).
  const index_t whole = n / 16 * 16;
  const __mmask16 m = static_cast<__mmask16>((1u << (n - whole)) - 1);
  for (index_t b = 0; b < nb; ++b)
    for (index_t p = 0; p < rows; ++p) {
      const index_t od = b * dy_is + p * dy_rs, ox = b * x_is + p * x_rs;
      for (index_t j = 0; j < whole; j += 16) {
        const __m512 d[wKB] = {_mm512_loadu_ps(d0 + od + j), _mm512_loadu_ps(d1 + od + j),
                               _mm512_loadu_ps(d2 + od + j), _mm512_loadu_ps(d3 + od + j)};
        const float* xs[wTB] = {x0 + ox + j, x1 + ox + j, x2 + ox + j,
                                x3 + ox + j, x4 + ox + j, x5 + ox + j};
#pragma GCC unroll 6
        for (index_t t = 0; t < wTB; ++t) {
          __m512 xv = _mm512_loadu_ps(xs[t]);
          // One load, four FMAs: without this GCC folds the load into each FMA (4 loads, most
          // split across cache lines, per 4 FMAs: load-bound at 26% of the FMA peak).
          asm("" : "+v"(xv));
#pragma GCC unroll 4
          for (index_t i = 0; i < wKB; ++i) acc[i][t] = _mm512_fmadd_ps(d[i], xv, acc[i][t]);
        }
      }
      if (whole < n) {
        const index_t j = whole;
        const __m512 d[wKB] = {
            _mm512_maskz_loadu_ps(m, d0 + od + j), _mm512_maskz_loadu_ps(m, d1 + od + j),
            _mm512_maskz_loadu_ps(m, d2 + od + j), _mm512_maskz_loadu_ps(m, d3 + od + j)};
        const float* xs[wTB] = {x0 + ox + j, x1 + ox + j, x2 + ox + j,
                                x3 + ox + j, x4 + ox + j, x5 + ox + j};
#pragma GCC unroll 6
        for (index_t t = 0; t < wTB; ++t) {
          const __m512 xv = _mm512_maskz_loadu_ps(m, xs[t]);
#pragma GCC unroll 4
          for (index_t i = 0; i < wKB; ++i) acc[i][t] = _mm512_fmadd_ps(d[i], xv, acc[i][t]);
        }
      }
    }
#pragma GCC unroll 4
  for (index_t i = 0; i < wKB; ++i)
#pragma GCC unroll 6
    for (index_t t = 0; t < wTB; ++t) out[i * wTB + t] = _mm512_reduce_add_ps(acc[i][t]);
}

/// weight_block for two runs of three adjacent taps (x[1] = x[0] + 1, x[2] = x[0] + 2, x[4] =
/// x[3] + 1, x[5] = x[3] + 2: two rows of a 3-wide kernel, dilation 1) over linear runs (one run
/// of n columns per image, dy_rs unused): per 16 columns each run loads its columns j and j + 16
/// and cuts the +1 and +2 taps from them with VALIGND, 4 loads of x instead of 6, none split
/// across cache lines when the band's rows are 64-byte aligned (Wp a multiple of 16), where
/// the 6 loads of weight_block split 4 (measured alone, Zen 5: 155 -> 188 GFLOP/s, 16 columns
/// x 14 rows x 7 images). Reads up to 31 elements past x[3] + n (the band's slack); the lanes
/// past n are zeroed on both sides, so a non-finite x there multiplies nothing.
[[gnu::noinline]] inline void weight_block_runs(const float* const* dy, index_t dy_is,
                                                const float* const* x, index_t x_is, index_t nb,
                                                index_t n, float* out) {
  __m512 acc[wKB][wTB];
#pragma GCC unroll 4
  for (index_t i = 0; i < wKB; ++i)
#pragma GCC unroll 6
    for (index_t t = 0; t < wTB; ++t) acc[i][t] = _mm512_setzero_ps();
  const float *d0 = dy[0], *d1 = dy[1], *d2 = dy[2], *d3 = dy[3];
  const float* xs[2] = {x[0], x[3]};
  static_assert(wKB == 4 && wTB == 6, "weight_block_runs names its rows");
  const auto cut = [](__m512 hi, __m512 lo, auto shift) {
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(hi), _mm512_castps_si512(lo),
                                                   decltype(shift)::value));
  };
  // Whole vectors, then the tail with masks (written out twice, as in weight_block).
  const index_t whole = n / 16 * 16;
  const __mmask16 m = static_cast<__mmask16>((1u << (n - whole)) - 1);
  for (index_t b = 0; b < nb; ++b) {
    const index_t od = b * dy_is, ox = b * x_is;
    for (index_t j = 0; j < whole; j += 16) {
      const __m512 d[wKB] = {_mm512_loadu_ps(d0 + od + j), _mm512_loadu_ps(d1 + od + j),
                             _mm512_loadu_ps(d2 + od + j), _mm512_loadu_ps(d3 + od + j)};
#pragma GCC unroll 2
      for (int run = 0; run < 2; ++run) {
        const __m512 lo = _mm512_loadu_ps(xs[run] + ox + j);
        const __m512 hi = _mm512_loadu_ps(xs[run] + ox + j + 16);
        __m512 xv[3] = {lo, cut(hi, lo, std::integral_constant<int, 1>{}),
                        cut(hi, lo, std::integral_constant<int, 2>{})};
#pragma GCC unroll 3
        for (int s = 0; s < 3; ++s) {
          asm("" : "+v"(xv[s])); // one register, four products (see weight_block)
#pragma GCC unroll 4
          for (index_t i = 0; i < wKB; ++i)
            acc[i][run * 3 + s] = _mm512_fmadd_ps(d[i], xv[s], acc[i][run * 3 + s]);
        }
      }
    }
    if (whole < n) {
      const index_t j = whole;
      const __m512 d[wKB] = {
          _mm512_maskz_loadu_ps(m, d0 + od + j), _mm512_maskz_loadu_ps(m, d1 + od + j),
          _mm512_maskz_loadu_ps(m, d2 + od + j), _mm512_maskz_loadu_ps(m, d3 + od + j)};
#pragma GCC unroll 2
      for (int run = 0; run < 2; ++run) {
        const __m512 lo = _mm512_loadu_ps(xs[run] + ox + j);
        const __m512 hi = _mm512_loadu_ps(xs[run] + ox + j + 16);
        const __m512 xv[3] = {
            _mm512_maskz_mov_ps(m, lo),
            _mm512_maskz_mov_ps(m, cut(hi, lo, std::integral_constant<int, 1>{})),
            _mm512_maskz_mov_ps(m, cut(hi, lo, std::integral_constant<int, 2>{}))};
#pragma GCC unroll 3
        for (int s = 0; s < 3; ++s)
#pragma GCC unroll 4
          for (index_t i = 0; i < wKB; ++i)
            acc[i][run * 3 + s] = _mm512_fmadd_ps(d[i], xv[s], acc[i][run * 3 + s]);
      }
    }
  }
#pragma GCC unroll 4
  for (index_t i = 0; i < wKB; ++i)
#pragma GCC unroll 6
    for (index_t t = 0; t < wTB; ++t) out[i * wTB + t] = _mm512_reduce_add_ps(acc[i][t]);
}

/// Backward-weight with output channels along the lanes (weight_direct_layout::klanes):
/// out[t * ldo + 16 v + l] += sum over images b < nb, rows p < rows and columns q < wout of
/// dyt[b * dyt_is + (p * wout + q) * 16 KV + 16 v + l] * x[t / A][b * x_is + p * Wp + q + t % A]
/// for the A NR taps t < nt (NR runs of A adjacent taps: A = 3 for a 3-wide kernel of dilation
/// 1, A = 1 for a 1 x 1 kernel, whose runs are input channels) and the KV vectors v of
/// channels. Each pixel: KV loads of dy, A NR broadcasts of x, A NR KV FMAs into accumulators
/// that stay in registers over all of the unit's pixels, then one add to out: no horizontal
/// sums and no padded columns (only true pixels are visited; the band's zero padding is the
/// convolution's own). KV * A * NR <= 24. Taps from nt on are computed (their runs may repeat
/// the last one) but not added.
template <int KV, int NR, int A = 3>
[[gnu::noinline]] inline void
weight_lanes(const float* dyt, index_t dyt_is, const float* const* x, index_t x_is, index_t Wp,
             index_t nb, index_t rows, index_t wout, float* out, index_t ldo, index_t nt = A * NR) {
  static_assert(KV * A * NR <= 24, "weight_lanes keeps its sums in 24 registers or fewer");
  __m512 acc[A * NR][KV];
#pragma GCC unroll 24
  for (int t = 0; t < A * NR; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < KV; ++v) acc[t][v] = _mm512_setzero_ps();
  for (index_t b = 0; b < nb; ++b)
    for (index_t p = 0; p < rows; ++p) {
      const float* d = dyt + b * dyt_is + p * wout * 16 * KV;
      const float* xr[NR];
#pragma GCC unroll 24
      for (int r = 0; r < NR; ++r) xr[r] = x[r] + b * x_is + p * Wp;
      for (index_t q = 0; q < wout; ++q, d += 16 * KV) {
        __m512 dv[KV];
#pragma GCC unroll 4
        for (int v = 0; v < KV; ++v) {
          dv[v] = _mm512_loadu_ps(d + 16 * v);
          asm("" : "+v"(dv[v])); // one load, 3 NR products (else folded into each FMA)
        }
#pragma GCC unroll 24
        for (int r = 0; r < NR; ++r) {
          // An opaque pointer: else GCC's predictive commoning carries the broadcasts shared
          // with the next pixel in registers (two pixels an iteration, accumulators spilled).
          const float* xq = xr[r] + q;
          asm("" : "+r"(xq));
#pragma GCC unroll 3
          for (int s = 0; s < A; ++s) {
            __m512 xv = _mm512_set1_ps(xq[s]);
            if constexpr (KV > 1) asm("" : "+v"(xv)); // one broadcast, KV products
#pragma GCC unroll 4
            for (int v = 0; v < KV; ++v)
              acc[A * r + s][v] = _mm512_fmadd_ps(dv[v], xv, acc[A * r + s][v]);
          }
        }
      }
    }
#pragma GCC unroll 24
  for (int t = 0; t < A * NR; ++t) {
    if (t >= nt) break; // runs past kred
#pragma GCC unroll 4
    for (int v = 0; v < KV; ++v) {
      float* o = out + t * ldo + 16 * v;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[t][v]));
    }
  }
}

#if TESSERA_GEMM_AVX512BF16
/// weight_lanes on bf16 pairs of grid positions: out[t * ldo + 16 v + l] += sum over images
/// b < nb and pairs j < words of the dot of dyt's word (b * dyt_is + (j * KV + v) * 16 + l)
/// (dy of channel 16 v + l at grid positions 2j, 2j + 1) with the word of x[t / 3] at
/// b * x_is + 2 j + t % 3 (x there and at the next position), in elements. The grid's extra
/// columns meet zeros of dy: the band must be finite.
template <int KV, int NR, int A = 3>
[[gnu::noinline]] inline void weight_lanes_pairs(const std::uint32_t* dyt, index_t dyt_is,
                                                 const std::uint16_t* const* x, index_t x_is,
                                                 index_t nb, index_t words, float* out, index_t ldo,
                                                 index_t nt = A * NR) {
  static_assert(KV * A * NR <= 24, "weight_lanes_pairs keeps its sums in 24 registers or fewer");
  __m512 acc[A * NR][KV];
#pragma GCC unroll 24
  for (int t = 0; t < A * NR; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < KV; ++v) acc[t][v] = _mm512_setzero_ps();
  for (index_t b = 0; b < nb; ++b) {
    const std::uint32_t* d = dyt + b * dyt_is;
    for (index_t j = 0; j < words; ++j, d += 16 * KV) {
      __m512i dv[KV];
#pragma GCC unroll 4
      for (int v = 0; v < KV; ++v) {
        dv[v] = _mm512_loadu_si512(d + 16 * v);
        asm("" : "+v"(dv[v])); // one load, 3 NR products
      }
#pragma GCC unroll 24
      for (int r = 0; r < NR; ++r) {
        const std::uint16_t* xq = x[r] + b * x_is + 2 * j;
        asm("" : "+r"(xq)); // no predictive commoning (weight_lanes)
#pragma GCC unroll 3
        for (int s = 0; s < A; ++s) {
          std::uint32_t w;
          std::memcpy(&w, xq + s, 4);
          __m512i xv = _mm512_set1_epi32(static_cast<int>(w));
          if constexpr (KV > 1) asm("" : "+v"(xv));
#pragma GCC unroll 4
          for (int v = 0; v < KV; ++v)
            acc[A * r + s][v] = _mm512_dpbf16_ps(acc[A * r + s][v], (__m512bh)dv[v], (__m512bh)xv);
        }
      }
    }
  }
#pragma GCC unroll 24
  for (int t = 0; t < A * NR; ++t) {
    if (t >= nt) break; // runs past kred
#pragma GCC unroll 4
    for (int v = 0; v < KV; ++v) {
      float* o = out + t * ldo + 16 * v;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[t][v]));
    }
  }
}

#endif // TESSERA_GEMM_AVX512BF16

/// The register blocks of the klanes forms (weight_lanes, weight_lanes_pairs) over kp / 16
/// vectors of channels and kred / 3 runs of taps: f(KV, NR, v0, r0) with KV and NR as
/// std::integral_constant<int, .> (blocks of up to 4 vectors x 2 runs; 2 x 4 or 1 x 4 where
/// fewer vectors remain; the last block of runs shorter), v0 and r0 the block's first vector
/// and run.
template <class F>
inline void lanes_blocks(index_t kp, index_t kred, const F& f) {
  const index_t kvs = kp / 16, runs = kred / 3;
  for (index_t v0 = 0; v0 < kvs; v0 += 4) {
    const int kv = static_cast<int>(std::min<index_t>(4, kvs - v0));
    const index_t maxr = kv > 2 ? 2 : 4;
    for (index_t r0 = 0; r0 < runs; r0 += maxr) {
      const int nr = static_cast<int>(std::min(maxr, runs - r0));
      const auto block = [&](auto KV, auto NR) { f(KV, NR, v0, r0); };
      using c1 = std::integral_constant<int, 1>;
      using c2 = std::integral_constant<int, 2>;
      using c3 = std::integral_constant<int, 3>;
      using c4 = std::integral_constant<int, 4>;
      switch (kv * 8 + nr) {
      case 8 + 1:
        block(c1{}, c1{});
        break;
      case 8 + 2:
        block(c1{}, c2{});
        break;
      case 8 + 3:
        block(c1{}, c3{});
        break;
      case 8 + 4:
        block(c1{}, c4{});
        break;
      case 16 + 1:
        block(c2{}, c1{});
        break;
      case 16 + 2:
        block(c2{}, c2{});
        break;
      case 16 + 3:
        block(c2{}, c3{});
        break;
      case 16 + 4:
        block(c2{}, c4{});
        break;
      case 24 + 1:
        block(c3{}, c1{});
        break;
      case 24 + 2:
        block(c3{}, c2{});
        break;
      case 32 + 1:
        block(c4{}, c1{});
        break;
      default:
        block(c4{}, c2{});
        break; // 32 + 2
      }
    }
  }
}

/// The register blocks of weight_lanes<KV, NR, 1> (a 1 x 1 kernel: taps are input channels)
/// over kp / 16 vectors of channels and kred taps: f(KV, NR, v0, t0, nt) with KV and NR as
/// std::integral_constant<int, .> (4 vectors x 6 taps, 3 x 8, 2 x 12, 1 x 12 for the last
/// vectors), v0 the block's first vector, t0 its first tap and nt <= NR its taps (the last block
/// of taps may be short: its runs past kred repeat the last tap, not added).
template <class F>
inline void lanes_blocks_1x1(index_t kp, index_t kred, const F& f) {
  const index_t kvs = kp / 16;
  for (index_t v0 = 0; v0 < kvs; v0 += 4) {
    const auto blocks = [&](auto KV, auto NR) {
      for (index_t t0 = 0; t0 < kred; t0 += NR())
        f(KV, NR, v0, t0, std::min<index_t>(NR(), kred - t0));
    };
    switch (std::min<index_t>(4, kvs - v0)) {
    case 1:
      blocks(std::integral_constant<int, 1>{}, std::integral_constant<int, 12>{});
      break;
    case 2:
      blocks(std::integral_constant<int, 2>{}, std::integral_constant<int, 12>{});
      break;
    case 3:
      blocks(std::integral_constant<int, 3>{}, std::integral_constant<int, 8>{});
      break;
    default:
      blocks(std::integral_constant<int, 4>{}, std::integral_constant<int, 6>{});
      break;
    }
  }
}

/// Backward-weight through dot products (d.ok): x (in) and dy as for run_weight; store(k, kk,
/// v) for every output channel and tap with v = alpha * sum. x and dy of precisions exact in
/// bf16 run as bf16 (weight_block_pairs; d.pairs), or, Widened, as fp32: widened exactly into
/// the bands and dy's grid as they are copied (d from weight_direct_layout_for(.., widened):
/// a first layer's reduction, too short for pairs); fp32 x and dy run as fp32. scratch:
/// g.kred() offsets (index_t, rounded up to 64 bytes), then parts_for(exec, g, d) *
/// d.part_bytes(g).
template <bool Widened = false, class Exec, class TX, class TD, class Store>
void run_weight_direct(const Exec& exec, const geometry& g, const weight_direct_layout& d,
                       const TX* in, index_t in_ns, index_t in_cs, index_t in_hs, const TD* dy,
                       index_t dy_ns, index_t dy_cs, void* scratch, const Store& store) {
  constexpr bool pairs = !Widened && !std::is_same_v<TX, float>;
  constexpr bool fp32_dy = std::is_same_v<TD, float>;        // dy read in place where it may be
  using E = std::conditional_t<pairs, std::uint16_t, float>; // element of bands and dy grid
  static_assert(pairs || Widened || fp32_dy, "fp32 dot products take fp32 x and dy");
  const int parts = parts_for(exec, g, d);
  const index_t units = d.units(g), kred = g.kred(), cout = g.cout;
  const auto* off = static_cast<const index_t*>(scratch);
  unsigned char* base = tap_offsets(g, g.cin, d.BH, d.Wp, scratch);
  const std::size_t per_part = d.part_bytes(g), elems = d.element_bytes(g);
  const std::size_t band_stride = d.band_stride(g), dyp_stride = d.dyp_stride(g);
  const std::size_t band_n = static_cast<std::size_t>(g.cin * d.BH * d.Wp);
  const geometry bg{.cin = g.cin, .Hin = g.Hin, .Win = g.Win, .pl = g.pl}; // for fill_band
  const direct_layout fl{.BH = d.BH, .Wp = d.Wp};
  // fp32 x of a 1 x 1 layer without padding, its rows contiguous: the band would be a copy of
  // x, which is read where it lies instead (x_is = in_ns, channels in_cs apart).
  const bool x_in_place = !pairs && !Widened && g.R == 1 && g.S == 1 && g.pt == 0 && g.pl == 0 &&
                          g.Hout == g.Hin && g.Wout == g.Win && d.Wp == g.Win && in_hs == g.Win;
  // A 1 x 1 layer with the channels along the lanes and fewer input than output channels:
  // x is transposed (fp32: from where it lies; bf16: its band's pairs of positions) into the
  // space of dy's transposed copy, dy broadcast, the sums cout x kred.
  const bool xlanes =
      d.klanes && g.R == 1 && g.S == 1 && (pairs || x_in_place) && g.cin % 16 == 0 && g.cin < cout;
  const auto body = [&](const int part) {
    unsigned char* mine = base + static_cast<std::size_t>(part) * per_part;
    E* bands = reinterpret_cast<E*>(mine);                         // NB x band_stride
    E* dyp = bands + static_cast<std::size_t>(d.NB) * band_stride; // NB x dyp_stride
    auto* sums = reinterpret_cast<float*>(mine + elems);           // G x cout x kred
    std::memset(sums, 0, sizeof(float) * d.sums_floats(g));
    const index_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    band_prefetch<TX> ahead_x;
    band_prefetch<TD> ahead_dy;
    // Calls of the dot-product kernels per unit, over which the next unit's x and dy are
    // prefetched.
    index_t calls = 0;
    if (xlanes) {
      lanes_blocks_1x1(g.cin, cout, [&](auto, auto, index_t, index_t, index_t) { ++calls; });
    } else if (d.klanes && g.S == 1) {
      lanes_blocks_1x1(cout, kred, [&](auto, auto, index_t, index_t, index_t) { ++calls; });
    } else if (d.klanes) {
      lanes_blocks(cout, kred, [&](auto, auto, index_t, index_t) { ++calls; });
    } else {
      calls = (cout + wKB - 1) / wKB * ((kred + wTB - 1) / wTB);
    }
    const auto unit_of = [&](index_t v, index_t& gi, index_t& n0, index_t& nb, index_t& p0,
                             index_t& rows) {
      gi = v / (d.nblk * d.bands);
      const index_t blk = v / d.bands % d.nblk;
      n0 = g.N * blk / d.nblk, nb = g.N * (blk + 1) / d.nblk - n0;
      p0 = v % d.bands * d.BR, rows = std::min(d.BR, g.Hout - p0);
    };
    const auto ahead = [&] {
      ahead_x.step();
      ahead_dy.step();
    };
    for (index_t u = u0; u < u1; ++u) {
      index_t gi, n0, nb, p0, rows;
      unit_of(u, gi, n0, nb, p0, rows);
      const E* xin = nullptr; // x_in_place: the unit's x where it lies

      if constexpr (!pairs && !Widened)
        if (x_in_place) xin = in + n0 * in_ns + gi * g.cin * in_cs + p0 * g.Win;
      const TD* dyimg = dy + n0 * dy_ns + gi * cout * dy_cs + p0 * g.Wout;
      if (u + 1 < u1) {
        index_t ng, nn0, nnb, np0, nrows;
        unit_of(u + 1, ng, nn0, nnb, np0, nrows);
        ahead_x.arm(in + nn0 * in_ns + ng * g.cin * in_cs, nnb, in_ns, g.cin, in_cs, in_hs,
                    np0 - g.pt, d.BH, g.Hin, g.Win, calls);
        ahead_dy.arm(dy + nn0 * dy_ns + ng * cout * dy_cs + np0 * g.Wout, nnb, dy_ns, cout, dy_cs,
                     0, 0, 1, 1, nrows * g.Wout, calls);
      }
      bool finite = true;
      for (index_t b = 0; b < nb; ++b) {
        E* band = bands + static_cast<std::size_t>(b) * band_stride;
        const TX* img = in + (n0 + b) * in_ns + gi * g.cin * in_cs;
        if constexpr (pairs) {
          fill_band_bf16(bg, fl, img, in_cs, in_hs, p0 - g.pt, band);
        } else if (!x_in_place) {
          fill_band(bg, fl, img, in_cs, in_hs, p0 - g.pt, band);
        }
        if (!x_in_place) std::memset(band + band_n, 0, sizeof(E) * (band_stride - band_n));
        if constexpr (!pairs && fp32_dy) {
          if (d.klanes) { // x (xlanes) or dy as blocks of pixels x 64 channels
            float* dt = dyp + static_cast<std::size_t>(b) * dyp_stride;
            if (xlanes)
              transpose_channel_blocks(xin + b * in_ns, in_cs, g.cin, rows * g.Wout, dt,
                                       d.BR * g.Wout);
            else
              transpose_channel_blocks(dyimg + b * dy_ns, dy_cs, cout, rows * g.Wout, dt,
                                       d.BR * g.Wout);
            continue;
          }
        }
        if constexpr (!pairs && !fp32_dy) { // widened: the band's rows of dy, per channel
          float* dw = dyp + static_cast<std::size_t>(b) * dyp_stride;
          for (index_t k = 0; k < cout; ++k)
            widen_floats(dyimg + b * dy_ns + k * dy_cs, dw + k * d.BR * g.Wout, rows * g.Wout);
          continue;
        }
        if (!d.padded_dy) continue;
        // dy on the band's grid: Wp - Wout zero columns after each row; without them the
        // grid's rows abut as dy's do, one run per channel (fp8 rows of 56 codes, a masked
        // load each, had waited on memory).
        E* dp = dyp + static_cast<std::size_t>(b) * dyp_stride;
        const index_t gcs = d.grid_cs();
        const bool abut = d.Wp == g.Wout;
        const index_t runs = abut ? 1 : rows, run = abut ? rows * g.Wout : g.Wout;
        for (index_t k = 0; k < cout; ++k) {
          if (rows * d.Wp < gcs) dp[k * gcs + rows * d.Wp] = E(0); // an odd grid's last pair
          for (index_t p = 0; p < runs; ++p) {
            E* row = dp + k * gcs + p * d.Wp;
            const TD* src = dyimg + b * dy_ns + k * dy_cs + p * g.Wout;
            if constexpr (pairs) {
              hostgemm::load_bf16(src, row, run);
            } else {
              hostgemm::load_floats(src, row, run); // a copy, or widened exactly
            }
            for (index_t q = g.Wout; q < d.Wp; ++q) row[q] = E(0);
          }
        }
        finite = finite && all_finite(band, band_n);
      }
#if TESSERA_GEMM_AVX512BF16
      if constexpr (pairs) {
        if (xlanes && finite) { // 1 x 1: the band's words transposed, input channels along lanes
          const index_t words = (rows * d.Wp + 1) / 2, gcs = d.grid_cs(), pw = d.pair_words();
          for (index_t b = 0; b < nb; ++b) // each image's band by words (rows made even)
            transpose_channel_blocks(
                reinterpret_cast<const float*>(bands + static_cast<std::size_t>(b) * band_stride),
                d.BH * d.Wp / 2, g.cin, words,
                reinterpret_cast<float*>(dyp + static_cast<std::size_t>(b) * dyp_stride +
                                         cout * gcs),
                pw);
          float* sg = sums + gi * cout * kred;
          const auto* tw0 = reinterpret_cast<const std::uint32_t*>(dyp + cout * gcs);
          lanes_blocks_1x1(g.cin, cout, [&](auto kv, auto nr, index_t v0, index_t k0, index_t nk) {
            constexpr int KV = decltype(kv)::value, NR = decltype(nr)::value;
            const E* dr[NR];
            for (int r = 0; r < NR; ++r) dr[r] = dyp + std::min(k0 + r, cout - 1) * gcs;
            ahead();
            weight_lanes_pairs<KV, NR, 1>(tw0 + v0 * 16 * pw, static_cast<index_t>(dyp_stride / 2),
                                          dr, static_cast<index_t>(dyp_stride), nb, words,
                                          sg + k0 * kred + v0 * 16, kred, nk);
          });
          continue;
        }
        if (d.klanes && finite) { // pairs of grid positions, the channels along the lanes
          const index_t words = (rows * d.Wp + 1) / 2, gcs = d.grid_cs(), pw = d.pair_words();
          for (index_t b = 0; b < nb; ++b) { // each image's words, 16 channels at a time
            E* dp = dyp + static_cast<std::size_t>(b) * dyp_stride;
            transpose_channel_blocks(reinterpret_cast<const float*>(dp), gcs / 2, cout, words,
                                     reinterpret_cast<float*>(dp + cout * gcs), pw);
          }
          float* sg = sums + gi * kred * cout;
          const auto* tw0 = reinterpret_cast<const std::uint32_t*>(dyp + cout * gcs);
          lanes_blocks(cout, kred, [&](auto kv, auto nr, index_t v0, index_t r0) {
            constexpr int KV = decltype(kv)::value, NR = decltype(nr)::value;
            const E* xr[NR];
            for (int r = 0; r < NR; ++r) xr[r] = bands + off[(r0 + r) * 3];
            ahead();
            weight_lanes_pairs<KV, NR>(tw0 + v0 * 16 * pw, static_cast<index_t>(dyp_stride / 2), xr,
                                       static_cast<index_t>(band_stride), nb, words,
                                       sg + r0 * 3 * cout + v0 * 16, cout);
          });
          continue;
        }
      }
#endif
      if constexpr (!pairs && fp32_dy) {
        if (xlanes) { // 1 x 1, input channels along the lanes: sums cout x kred
          float* sg = sums + gi * cout * kred;
          lanes_blocks_1x1(g.cin, cout, [&](auto kv, auto nr, index_t v0, index_t k0, index_t nk) {
            constexpr int KV = decltype(kv)::value, NR = decltype(nr)::value;
            const float* dr[NR];
            for (int r = 0; r < NR; ++r) dr[r] = dyimg + std::min(k0 + r, cout - 1) * dy_cs;
            ahead();
            weight_lanes<KV, NR, 1>(dyp + v0 * 16 * d.BR * g.Wout, static_cast<index_t>(dyp_stride),
                                    dr, dy_ns, g.Wout, nb, rows, g.Wout, sg + k0 * kred + v0 * 16,
                                    kred, nk);
          });
          continue;
        }
        if (d.klanes && g.S == 1) { // 1 x 1: the taps are input channels
          float* sg = sums + gi * kred * cout;
          const E* xb = xin ? xin : bands;
          const index_t xcs = xin ? in_cs : d.BH * d.Wp;
          const index_t xis = xin ? in_ns : static_cast<index_t>(band_stride);
          lanes_blocks_1x1(cout, kred, [&](auto kv, auto nr, index_t v0, index_t t0, index_t nt) {
            constexpr int KV = decltype(kv)::value, NR = decltype(nr)::value;
            const float* xr[NR];
            for (int r = 0; r < NR; ++r) xr[r] = xb + std::min(t0 + r, kred - 1) * xcs;
            ahead();
            weight_lanes<KV, NR, 1>(dyp + v0 * 16 * d.BR * g.Wout, static_cast<index_t>(dyp_stride),
                                    xr, xis, d.Wp, nb, rows, g.Wout, sg + t0 * cout + v0 * 16, cout,
                                    nt);
          });
          continue;
        }
        if (d.klanes) { // the channels along the lanes
          float* sg = sums + gi * kred * cout;
          lanes_blocks(cout, kred, [&](auto kv, auto nr, index_t v0, index_t r0) {
            constexpr int KV = decltype(kv)::value, NR = decltype(nr)::value;
            const float* xr[NR];
            for (int r = 0; r < NR; ++r) xr[r] = bands + off[(r0 + r) * 3];
            ahead();
            weight_lanes<KV, NR>(dyp + v0 * 16 * d.BR * g.Wout, static_cast<index_t>(dyp_stride),
                                 xr, static_cast<index_t>(band_stride), d.Wp, nb, rows, g.Wout,
                                 sg + r0 * 3 * cout + v0 * 16, cout);
          });
          continue;
        }
      }
      // Linear runs over whole bands: dy itself (Wp == Wout) or dy on the grid, whose zero
      // columns meet the band's columns past the output row (finite, so the products are 0).
      // A band holding Inf or NaN runs row by row, each row's tail masked, so that only true
      // pairs are multiplied (as do the rows when dy is not copied): on dy itself in fp32, on
      // the grid for bf16 (always copied).
      const bool linear = d.Wp == g.Wout || (d.padded_dy && finite);
      const bool grid = d.padded_dy && (linear || !fp32_dy); // dy in fp32 only on the grid
      const bool copy = !grid && !fp32_dy;                   // the widened rows of dy
      const E* dyb;
      if constexpr (fp32_dy) {
        dyb = grid ? dyp : dyimg;
      } else {
        dyb = dyp;
      }
      const index_t dcs = grid ? d.grid_cs() : copy ? d.BR * g.Wout : dy_cs;
      const index_t dis = grid || copy ? static_cast<index_t>(dyp_stride) : dy_ns;
      const index_t drs = grid ? d.Wp : g.Wout;
      const index_t rn = linear ? 1 : rows, n = linear ? rows * d.Wp : g.Wout;
      float* sg = sums + gi * cout * kred;
      const E* dyr[wKB];
      const E* xr[wTB];
      for (index_t k0 = 0; k0 < cout; k0 += wKB)
        for (index_t t0 = 0; t0 < kred; t0 += wTB) {
          for (index_t i = 0; i < wKB; ++i) // channels past cout repeat the last one
            dyr[i] = dyb + std::min(k0 + i, cout - 1) * dcs;
          for (index_t t = 0; t < wTB; ++t) {
            const index_t tt = std::min(t0 + t, kred - 1);
            xr[t] = xin ? xin + tt * in_cs : bands + off[tt];
          }
          const index_t xis = xin ? in_ns : static_cast<index_t>(band_stride);
          ahead();
          float out[wKB * wTB];
          if constexpr (pairs) {
#if TESSERA_GEMM_AVX512BF16
            weight_block_pairs(dyr, dis, drs, xr, static_cast<index_t>(band_stride), d.Wp, nb, rn,
                               n, out);
#endif
          } else {
            // Two runs of three adjacent taps (a 3-wide kernel, dilation 1) over linear runs:
            // the +1 and +2 taps cut from aligned loads (weight_block_runs).
            const index_t* o = off + t0;
            const bool runs = !xin && linear && t0 + wTB <= kred && o[1] == o[0] + 1 &&
                              o[2] == o[0] + 2 && o[4] == o[3] + 1 && o[5] == o[3] + 2;
            if (runs)
              weight_block_runs(dyr, dis, xr, xis, nb, n, out);
            else
              weight_block(dyr, dis, drs, xr, xis, d.Wp, nb, rn, n, out);
          }
          for (index_t i = 0; i < wKB && k0 + i < cout; ++i) // klanes: sums kred x kp
            for (index_t t = 0; t < wTB && t0 + t < kred; ++t)
              sg[d.klanes && !xlanes ? (t0 + t) * cout + k0 + i : (k0 + i) * kred + t0 + t] +=
                  out[i * wTB + t];
        }
    }
  };
  if (parts == 1) {
    body(0);
  } else {
    Kokkos::parallel_for(
        "tessera::conv2d_backward_weight[implicit direct]",
        Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, parts), body);
  }
  // dw[k, kk] = alpha * (sum over threads, in order, of their sums).
  const float alpha = g.alpha;
  // klanes: the sums of group gi, tap kk, channel k at (gi kred + kk) cout + k.
  const bool klanes = d.klanes && !xlanes;
  Kokkos::parallel_for("tessera::conv2d_backward_weight[implicit direct sum]",
                       Kokkos::RangePolicy<Exec>(exec, 0, g.G * cout), [=](const index_t row) {
                         const index_t gi = row / cout, k = row % cout;
                         for (index_t kk = 0; kk < kred; ++kk) {
                           const index_t at =
                               klanes ? (gi * kred + kk) * cout + k : row * kred + kk;
                           float v = 0.f;
                           for (int p = 0; p < parts; ++p)
                             v += reinterpret_cast<const float*>(
                                 base + per_part * static_cast<std::size_t>(p) + elems)[at];
                           store(row, kk, alpha * v);
                         }
                       });
}
#endif // __AVX512F__

} // namespace implicit_conv

#endif // !TESSERA_DEVICE_PASS

/// True when conv2d can take the implicit-GEMM path for operands of precisions PA (the gathered
/// input) and PB (the weights) on Exec: a host space with the SIMD FMA kernel, fp32 operands.
/// Operands exact in bf16 may take the pairs form (implicit_pairs_capable_v); builds without a
/// bf16 dot product widen the others (implicit_widened_v); elsewhere they, and those where the
/// pairs form does not apply, go through im2col + tessera::gemm, which has kernels for them.
template <class Exec, class PA, class PB>
inline constexpr bool implicit_capable_v =
#if TESSERA_DEVICE_PASS
    false;
#else
    is_host_exec_v<Exec>&& hostgemm::have_simd&& std::is_same_v<PA, fp32>&&
        std::is_same_v<PB, fp32>;
#endif

/// True when conv2d runs operands of precisions PA and PB, not both fp32, on the fp32 implicit
/// paths of forward and backward-data (the direct form and the packed one), widened to fp32 as
/// the band fill and the panel gather copy them (exactly: every tessera precision is a subset
/// of fp32): a host space with the SIMD FMA kernel, in a build without AVX512_BF16. Such a build
/// (AVX2 parts, AVX-512 parts without the bf16 dot) has no low-precision dot product: the GEMM
/// of these operands widens them into its packed panels and runs the same fp32 FMA kernel, so
/// im2col + GEMM only adds the column matrix's writes and reads. Measured on an AMD EPYC Zen 3
/// (family 0x19 model 0x01, AVX2, 1 thread, 2026-12-02): bf16 forward of the ResNet and
/// FashionCNN layers ran at 0.57-0.77x fp32 as im2col + GEMM (docs/performance.md).
/// Builds with AVX512_BF16 keep im2col + the bf16 GEMM where the pairs form does not apply.
template <class Exec, class PA, class PB>
inline constexpr bool implicit_widened_v =
#if TESSERA_DEVICE_PASS || TESSERA_GEMM_AVX512BF16
    false;
#else
    is_host_exec_v<Exec>&& hostgemm::have_simd &&
    !(std::is_same_v<PA, fp32> && std::is_same_v<PB, fp32>);
#endif

/// True when conv2d can take the narrow path (conv/detail/narrow.hpp) on Exec: a host space with
/// the SIMD FMA kernel; any operand precision (widened to fp32).
template <class Exec>
inline constexpr bool implicit_narrow_capable_v =
#if TESSERA_DEVICE_PASS
    false;
#else
    is_host_exec_v<Exec>&& hostgemm::have_simd;
#endif

/// True when conv2d can take the bf16 pairs form of the direct path (implicit_conv::run_direct
/// with Pairs) for operands of precisions PA and PB on Exec: a host space, a build for
/// AVX512_BF16, both precisions exact in bf16 (bf16, fp8). implicit_conv::pairs_direct_for says
/// whether a given convolution takes it on this CPU.
template <class Exec, class PA, class PB>
inline constexpr bool implicit_pairs_capable_v =
#if TESSERA_DEVICE_PASS || !TESSERA_GEMM_AVX512BF16
    false;
#else
    is_host_exec_v<Exec>&& hostgemm::amx_input_v<PA>&& hostgemm::amx_input_v<PB>;
#endif

} // namespace tessera::detail
