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

#include <tessera/conv/im2col.hpp>
#include <tessera/gemm/detail/fma.hpp>
#include <tessera/tensor.hpp>

#include <algorithm>
#include <cstddef>
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
/// Threads an implicit convolution runs on: one per unit at most.
template <class Exec>
int parts_for(const Exec& exec, const geometry& g) {
  const index_t c = exec.concurrency();
  return static_cast<int>(std::max<index_t>(1, std::min(c, g.units())));
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
/// scratch: parts_for(exec, g) * (a_floats() + c_floats(g)) floats, 64-byte aligned.
template <class Exec, class T, class O, class Store>
void run(const Exec& exec, const geometry& g, const T* in, index_t in_ns, index_t in_cs,
         index_t in_hs, const float* pb, O* out, index_t out_ns, index_t out_cs, float* scratch,
         const Store& store) {
  const int parts = parts_for(exec, g);
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

/// Transposes 16 rows of n floats (row i at rows[i]; nullptr: zeros) into n rows of 16 at dst,
/// row j at dst + j*dld (dld >= 16, or smaller when the rows are written in order and the
/// caller has 16 floats of slack past row n - 1: each row is stored as 16 floats).
inline void transpose16(const float* const* rows, index_t n, float* dst, index_t dld) {
  index_t j = 0;
#if defined(__AVX512F__)
  for (; j + 16 <= n; j += 16) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i)
      r[i] = rows[i] ? _mm512_loadu_ps(rows[i] + j) : _mm512_setzero_ps();
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
    for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + (j + k) * dld, r[k]);
  }
#endif
  for (; j < n; ++j)
    for (index_t i = 0; i < 16; ++i) dst[j * dld + i] = rows[i] ? rows[i][j] : 0.f;
}

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
  const index_t units = g.N * g.G * weight_blocking(g).blocks;
  return static_cast<int>(std::max<index_t>(1, std::min<index_t>(exec.concurrency(), units)));
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

} // namespace implicit_conv

#endif // !TESSERA_DEVICE_PASS

/// True when conv2d can take the implicit-GEMM path for operands of precisions PA (the gathered
/// input) and PB (the weights) on Exec: a host space with the SIMD FMA kernel, fp32 operands.
/// Other precisions go through im2col + tessera::gemm, which has kernels for them.
template <class Exec, class PA, class PB>
inline constexpr bool implicit_capable_v =
#if TESSERA_DEVICE_PASS
    false;
#else
    is_host_exec_v<Exec>&& hostgemm::have_simd&& std::is_same_v<PA, fp32>&&
        std::is_same_v<PB, fp32>;
#endif

} // namespace tessera::detail
