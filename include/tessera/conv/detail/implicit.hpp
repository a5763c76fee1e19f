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
///
/// Threads: B (the weights, a few MiB at most) is packed once per call, then the work units
/// (image, group, block of MC pixels) are shared out in contiguous ranges, one per thread, in
/// one parallel region; each thread packs its own A blocks and owns its C block (regions of the
/// workspace). Every output element is summed by one thread in one fixed order: the results do
/// not depend on the thread count.
/// Host only (compiled out of device passes); the caller checks is_host_exec_v.

#include <tessera/conv/im2col.hpp>
#include <tessera/gemm/detail/host.hpp>
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
