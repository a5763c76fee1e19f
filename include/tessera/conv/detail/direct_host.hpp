#pragma once
/// \file conv/detail/direct_host.hpp
/// Host forms of the direct (one input channel per group: depthwise) kernels of
/// conv/detail/direct.hpp for unit column stride, the common case (3 x 3, 5 x 5, 7 x 7 depthwise
/// layers). The portable kernels decode every operand element per tap with the scalar to_float
/// and loop over each tap's valid range, so their inner loops are short and, for fp8, scalar
/// (fp32 10.8 GFLOP/s, fp8 1.3 on dw3x3_56, Zen 5, against oneDNN's 29 in fp32). Here each
/// run of direct_run_width (64) outputs is computed from rows widened once to fp32
/// (convert_n, vectorised, the same values as to_float) into zero-padded L1 buffers, and every
/// tap is a full-width vector multiply-add over the run, with no per-tap bounds, into sums held
/// in vector registers. A work item fills a strip of rows (a band of outputs' worth, up to
/// direct_strip_rows) before computing on it: reading a row right after widening it stalls on
/// store forwarding (unaligned loads over just-written lines), which cost 3x in fp32.
///
/// Exactness: a padded zero multiplies a finite operand into +-0, which changes no sum. Where a
/// tap's weight (forward, backward-data) or a row of x or dy (backward-weight) holds Inf or NaN,
/// that tap runs over its valid range only, as the portable kernel does: only true pairs are
/// multiplied, so a non-finite value outside a sum's terms never turns a padded 0 into NaN.
/// Host only: nothing here exists in a device compilation pass.

#include <tessera/conv/im2col.hpp>
#include <tessera/conv/params.hpp>
#include <tessera/precision/vector_convert.hpp>
#include <tessera/simd/lanes.hpp>
#include <tessera/tensor.hpp>

#include <cstring>
#include <type_traits>

namespace tessera::detail {

#if !TESSERA_DEVICE_PASS

/// Outputs per run, the widest tap reach ((S - 1) * dilation) the buffers hold, the rows of a
/// strip (16 KiB of fp32 runs) and the tallest kernel extent ((R - 1) * dilation + 1) allowed,
/// which leaves at least 16 / stride + 1 output rows per band.
inline constexpr index_t direct_run_width = 64, direct_max_reach = 64, direct_strip_rows = 32,
                         direct_max_height = 16;

namespace direct_host {

/// convert_n converts whole groups of vectors and the remainder one element at a time (for fp8
/// the scalar remainder of a 56-wide row cost more than the vector part): conversions here go
/// in blocks of conversion_block elements through small buffers, the last block padded.
inline constexpr index_t conversion_block = 64;

/// dst[0, n) = src[0, n) widened to float.
template <class S>
inline void widen_n(const S* src, float* dst, index_t n) {
  if constexpr (std::is_same_v<S, float>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
  } else {
    constexpr index_t blk = conversion_block;
    const index_t whole = n - n % blk;
    if (whole > 0) convert_n<fp32>(src, dst, static_cast<std::size_t>(whole));
    if (whole < n) {
      S codes[blk] = {};
      alignas(64) float wide[blk];
      std::memcpy(codes, src + whole, static_cast<std::size_t>(n - whole) * sizeof(S));
      convert_n<fp32>(codes, wide, static_cast<std::size_t>(blk));
      std::memcpy(dst + whole, wide, static_cast<std::size_t>(n - whole) * sizeof(float));
    }
  }
}

/// dst[i] = row[start + i] widened to float where 0 <= start + i < len, else 0, for i < count.
template <class S>
inline void widen_segment(const S* row, index_t len, index_t start, index_t count, float* dst) {
  index_t a = start < 0 ? -start : 0, b = len - start < count ? len - start : count;
  if (a > count) a = count;
  if (b < a) b = a;
  for (index_t i = 0; i < a; ++i) dst[i] = 0.f;
  if (b > a) widen_n(row + start + a, dst + a, b - a);
  for (index_t i = b; i < count; ++i) dst[i] = 0.f;
}

/// Asks for a plane of rows x cols elements (row stride ld) to be brought into L2 while the
/// current plane is computed: the backward-weight's work item reads an x and a dy plane per
/// image, 12 KiB each on dw3x3_56, short streams 1.6 MB apart, and its row copies took 40% of
/// its time waiting on memory; asking for the next image's planes took 10% off (Zen 5). The
/// forward and backward-data items, one plane each, ran 10% slower with it and do not ask.
template <class S>
inline void prefetch_plane(const S* p, index_t rows, index_t cols, index_t ld) {
  constexpr index_t line = 64 / static_cast<index_t>(sizeof(S));
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; c += line) __builtin_prefetch(p + r * ld + c, 0, 2);
}

/// True if x is neither Inf nor NaN (from its bits: unaffected by -ffinite-math-only).
inline bool finite_value(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) != 0x7f800000u;
}

/// True if every value of v[0, n) is finite: v * 0 is +-0 for a finite v and NaN for Inf or
/// NaN, and a sum of them is NaN if any is (in vectors, four independent sums; GCC 12 made the
/// bit-test loop slower than the multiply-adds it guards).
template <bool Vectors = simd::available>
inline bool all_finite(const float* v, index_t n) {
  index_t i = 0;
  float z = 0.f;
  if constexpr (Vectors) {
    using fv = xsimd::batch<float>;
    constexpr index_t lanes = static_cast<index_t>(fv::size);
    const fv zero(0.f);
    fv z0(0.f), z1(0.f), z2(0.f), z3(0.f);
    for (; i + 4 * lanes <= n; i += 4 * lanes) {
      z0 = xsimd::fma(fv::load_unaligned(v + i), zero, z0);
      z1 = xsimd::fma(fv::load_unaligned(v + i + lanes), zero, z1);
      z2 = xsimd::fma(fv::load_unaligned(v + i + 2 * lanes), zero, z2);
      z3 = xsimd::fma(fv::load_unaligned(v + i + 3 * lanes), zero, z3);
    }
    for (; i + lanes <= n; i += lanes) z0 = xsimd::fma(fv::load_unaligned(v + i), zero, z0);
    z = xsimd::hadd((z0 + z1) + (z2 + z3));
  }
  for (; i < n; ++i) z += v[i] * 0.f;
  return z == 0.f;
}

/// A run of 64 fp32 sums held in vector registers across the taps of one output run (sums kept
/// in memory wait for each tap's store before the next multiply-add).
template <bool Vectors = simd::available>
struct run_acc_t {
  using fv = std::conditional_t<Vectors, xsimd::batch<float>, float>;
  static constexpr index_t lanes = static_cast<index_t>(sizeof(fv) / sizeof(float));
  static constexpr index_t nv = direct_run_width / lanes;
  fv v[nv];

  run_acc_t() {
    for (index_t u = 0; u < nv; ++u) v[u] = fv(0.f);
  }
  /// += a * b[0, 64) (b unaligned).
  [[gnu::always_inline]] inline void axpy(float a, const float* b) {
    const fv av(a);
    for (index_t u = 0; u < nv; ++u) {
      if constexpr (Vectors)
        v[u] = xsimd::fma(av, fv::load_unaligned(b + u * lanes), v[u]);
      else
        v[u] += av * b[u];
    }
  }
  /// += a[0, 64) * b[0, 64) (a aligned to 64 bytes, b unaligned).
  [[gnu::always_inline]] inline void fma(const float* a, const float* b) {
    for (index_t u = 0; u < nv; ++u) {
      if constexpr (Vectors)
        v[u] = xsimd::fma(fv::load_aligned(a + u * lanes), fv::load_unaligned(b + u * lanes), v[u]);
      else
        v[u] += a[u] * b[u];
    }
  }
  /// The sums start from in[0, 64) (aligned to 64 bytes).
  void load(const float* in) {
    for (index_t u = 0; u < nv; ++u) {
      if constexpr (Vectors)
        v[u] = fv::load_aligned(in + u * lanes);
      else
        v[u] = in[u];
    }
  }
  /// out[0, 64) = the sums (out aligned to 64 bytes).
  void store(float* out) const {
    for (index_t u = 0; u < nv; ++u) {
      if constexpr (Vectors)
        v[u].store_aligned(out + u * lanes);
      else
        out[u] = v[u];
    }
  }
};

using run_acc = run_acc_t<>;

/// dst[0, n) = the precision P's rounding of src[0, n), n <= 64; src holds 64 values (those
/// past n are rounded too, into a buffer, and dropped).
template <class P, class T>
inline void store_run(const float* src, T* dst, index_t n) {
  static_assert(conversion_block == direct_run_width, "a run is one conversion block");
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
  } else if (n == direct_run_width) {
    convert_n<P>(src, dst, static_cast<std::size_t>(n));
  } else {
    T codes[direct_run_width];
    convert_n<P>(src, codes, static_cast<std::size_t>(direct_run_width));
    std::memcpy(dst, codes, static_cast<std::size_t>(n) * sizeof(T));
  }
}

} // namespace direct_host

/// The host forms apply: unit column stride (and, for backward-data, unit row stride), taps
/// reaching at most direct_max_reach columns and direct_max_height rows, at most 64 taps.
inline bool direct_host_applies(const conv2d_params& prm, index_t R, index_t S, bool unit_rows) {
  return prm.stride_w == 1 && (!unit_rows || prm.stride_h == 1) &&
         (S - 1) * prm.dilation_w <= direct_max_reach &&
         (R - 1) * prm.dilation_h + 1 <= direct_max_height && R * S <= 64;
}

namespace direct_host {
/// Output rows per band: as many as a strip's rows hold, for kernel height (R - 1) dh + 1 and
/// row stride sh.
inline index_t band_rows(index_t R, index_t dh, index_t sh) {
  return (direct_strip_rows - ((R - 1) * dh + 1)) / sh + 1;
}
} // namespace direct_host

/// direct_cg1_forward on a host space: one work item per (image, channel) plane, its outputs in
/// runs of 64 columns and bands of rows; a band's input rows (the run's columns plus the taps'
/// reach) are widened into a strip, then each output run sums its taps in registers, each tap
/// one multiply-add of 64 lanes.
template <bool HasBias, class Exec, class XV, class WV, class BV, class YV, class Epi>
void direct_cg1_forward_host(const Exec& exec, const XV& x, const WV& w, const BV& bias,
                             const YV& y, const conv2d_params& prm, float alpha, const Epi& epi) {
  constexpr index_t run = direct_run_width, span = run + direct_max_reach;
  const index_t N = y.extent(0), K = y.extent(1), P = y.extent(2), Q = y.extent(3);
  const index_t H = x.extent(2), W = x.extent(3), R = w.extent(2), S = w.extent(3);
  const index_t Kg = K / prm.groups;
  const index_t sh = prm.stride_h, dh = prm.dilation_h, dw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left, reach = (S - 1) * dw;
  const index_t band = direct_host::band_rows(R, dh, sh);
  using py = typename YV::precision;
  const auto xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  const auto ys0 = y.stride(0), ys1 = y.stride(1), ys2 = y.stride(2);
  const auto ws0 = w.stride(0), ws2 = w.stride(2);
  const auto* const xd = x.data();
  const auto* const wd = w.data();
  auto* const yd = y.data();
  const auto plane = [=](const index_t item) {
    const index_t n = item / K, k = item % K;
    const auto* xc = xd + n * xs0 + (k / Kg) * xs1;
    float wt[64];
    bool finite[64], special = false; // special: a tap's weight is Inf or NaN
    for (index_t t = 0; t < R * S; ++t) {
      wt[t] = to_float(wd[k * ws0 + (t / S) * ws2 + t % S]);
      finite[t] = direct_host::finite_value(wt[t]);
      special = special || !finite[t];
    }
    float b = 0.f;
    if constexpr (HasBias) b = to_float(bias(k));
    alignas(64) float acc[run];
    alignas(64) float strip[direct_strip_rows][span];
    for (index_t q0 = 0; q0 < Q; q0 += run) {
      const index_t qn = Q - q0 < run ? Q - q0 : run;
      for (index_t op0 = 0; op0 < P; op0 += band) {
        const index_t op1 = P - op0 < band ? P : op0 + band;
        // strip[i][j] = x(h0 + i, q0 - pl + j): output (op, q), tap (r, s) reads
        // strip[op sh + r dh - pt - h0][q - q0 + s dw]; rows outside the image are skipped.
        const index_t h0 = op0 * sh - pt, rows = (op1 - 1 - op0) * sh + (R - 1) * dh + 1;
        for (index_t i = 0; i < rows; ++i)
          if (h0 + i >= 0 && h0 + i < H)
            direct_host::widen_segment(xc + (h0 + i) * xs2, W, q0 - pl, run + reach, strip[i]);
        for (index_t op = op0; op < op1; ++op) {
          direct_host::run_acc sum;
          for (index_t r = 0; r < R; ++r) {
            const index_t i = (op - op0) * sh + r * dh, h = h0 + i;
            if (h < 0 || h >= H) continue;
            for (index_t s = 0; s < S; ++s)
              if (finite[r * S + s]) sum.axpy(wt[r * S + s], strip[i] + s * dw);
          }
          sum.store(acc);
          if (special) // non-finite taps over their true pairs only: columns inside the image
            for (index_t r = 0; r < R; ++r) {
              const index_t i = (op - op0) * sh + r * dh, h = h0 + i;
              if (h < 0 || h >= H) continue;
              for (index_t s = 0; s < S; ++s) {
                if (finite[r * S + s]) continue;
                index_t lo, hi;
                valid_output_range(W, Q, 1, s * dw - pl, lo, hi);
                lo = lo > q0 ? lo : q0;
                hi = hi < q0 + qn ? hi : q0 + qn;
                for (index_t q = lo; q < hi; ++q)
                  acc[q - q0] += strip[i][q - q0 + s * dw] * wt[r * S + s];
              }
            }
          for (index_t j = 0; j < qn; ++j) acc[j] = epi(alpha * acc[j] + b);
          direct_host::store_run<py>(acc, yd + n * ys0 + k * ys1 + op * ys2 + q0, qn);
        }
      }
    }
  };
  Kokkos::parallel_for("tessera::conv2d_forward[direct, host]",
                       Kokkos::RangePolicy<Exec>(exec, 0, N * K), plane);
}

/// direct_cg1_backward_data on a host space, unit strides: dx(h, w) = alpha sum over the group's
/// output channels and the taps of dy(h + pt - r dh, w + pl - s dw) w(r, s). One work item per
/// (image, channel) plane of dx, in runs of 64 columns and bands of rows: per output channel of
/// the group a strip of dy rows (the run plus the taps' reach) is widened, then each dx run sums
/// its taps in registers (across channels through a band buffer).
template <class Exec, class DYV, class WV, class DXV>
void direct_cg1_backward_data_host(const Exec& exec, const DYV& dy, const WV& w, const DXV& dx,
                                   const conv2d_params& prm, float alpha) {
  constexpr index_t run = direct_run_width, span = run + direct_max_reach;
  const index_t N = dx.extent(0), C = dx.extent(1), H = dx.extent(2), W = dx.extent(3);
  const index_t K = dy.extent(1), P = dy.extent(2), Q = dy.extent(3);
  const index_t R = w.extent(2), S = w.extent(3), Kg = K / prm.groups;
  const index_t dh = prm.dilation_h, dw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left, reach = (S - 1) * dw;
  const index_t band = direct_host::band_rows(R, dh, 1), ext = (R - 1) * dh;
  using px = typename DXV::precision;
  const auto ys0 = dy.stride(0), ys1 = dy.stride(1), ys2 = dy.stride(2);
  const auto xs0 = dx.stride(0), xs1 = dx.stride(1), xs2 = dx.stride(2);
  const auto ws0 = w.stride(0), ws2 = w.stride(2);
  const auto* const yd = dy.data();
  const auto* const wd = w.data();
  auto* const xd = dx.data();
  const auto plane = [=](const index_t item) {
    const index_t n = item / C, c = item % C;
    alignas(64) float acc[direct_strip_rows][run];
    alignas(64) float strip[direct_strip_rows][span];
    for (index_t w0 = 0; w0 < W; w0 += run) {
      const index_t wn = W - w0 < run ? W - w0 : run;
      for (index_t h0 = 0; h0 < H; h0 += band) {
        const index_t h1 = H - h0 < band ? H : h0 + band;
        // strip[i][j] = dy(u0 + i, w0 + pl - reach + j), u0 = h0 + pt - ext: dx (h, w), tap
        // (r, s) reads strip[h + pt - r dh - u0][w - w0 + reach - s dw].
        const index_t u0 = h0 + pt - ext, rows = h1 - h0 + ext;
        for (index_t j = 0; j < Kg; ++j) {
          const index_t k = c * Kg + j;
          const auto* yc = yd + n * ys0 + k * ys1;
          float wt[64];
          bool finite[64], special = false; // special: a tap's weight is Inf or NaN
          for (index_t t = 0; t < R * S; ++t) {
            wt[t] = to_float(wd[k * ws0 + (t / S) * ws2 + t % S]);
            finite[t] = direct_host::finite_value(wt[t]);
            special = special || !finite[t];
          }
          for (index_t i = 0; i < rows; ++i)
            if (u0 + i >= 0 && u0 + i < P)
              direct_host::widen_segment(yc + (u0 + i) * ys2, Q, w0 + pl - reach, run + reach,
                                         strip[i]);
          for (index_t h = h0; h < h1; ++h) {
            direct_host::run_acc sum;
            if (j > 0) sum.load(acc[h - h0]);
            for (index_t r = 0; r < R; ++r) {
              const index_t i = h - h0 + ext - r * dh, u = u0 + i;
              if (u < 0 || u >= P) continue;
              for (index_t s = 0; s < S; ++s)
                if (finite[r * S + s]) sum.axpy(wt[r * S + s], strip[i] + reach - s * dw);
            }
            sum.store(acc[h - h0]);
            if (special) // non-finite taps over their true pairs only: dy columns in the output
              for (index_t r = 0; r < R; ++r) {
                const index_t i = h - h0 + ext - r * dh, u = u0 + i;
                if (u < 0 || u >= P) continue;
                for (index_t s = 0; s < S; ++s) {
                  if (finite[r * S + s]) continue;
                  index_t lo, hi; // columns w0 + l with 0 <= w0 + l + pl - s dw < Q
                  valid_output_range(Q, wn, 1, w0 + pl - s * dw, lo, hi);
                  for (index_t l = lo; l < hi; ++l)
                    acc[h - h0][l] += strip[i][reach - s * dw + l] * wt[r * S + s];
                }
              }
          }
        }
        for (index_t h = h0; h < h1; ++h) {
          for (index_t l = 0; l < wn; ++l) acc[h - h0][l] *= alpha;
          direct_host::store_run<px>(acc[h - h0], xd + n * xs0 + c * xs1 + h * xs2 + w0, wn);
        }
      }
    }
  };
  Kokkos::parallel_for("tessera::conv2d_backward_data[direct, host]",
                       Kokkos::RangePolicy<Exec>(exec, 0, N * C), plane);
}

/// direct_cg1_backward_weight on a host space, unit column stride: one work item per output
/// channel. Per image, run of 64 columns and band of output rows, the dy rows and the x rows
/// (the run plus the taps' reach) are widened into strips; then each tap sums its products over
/// the band in registers (64 lanes) and adds them to its partial sums, which are added in a
/// fixed order at the end (any order satisfies the same bound). A band whose dy or x values are
/// not all finite multiplies each tap's true pairs only.
template <class Exec, class XV, class DYV, class DWV>
void direct_cg1_backward_weight_host(const Exec& exec, const XV& x, const DYV& dy, const DWV& dwv,
                                     const conv2d_params& prm, float alpha) {
  constexpr index_t run = direct_run_width, span = run + direct_max_reach;
  const index_t N = x.extent(0), H = x.extent(2), W = x.extent(3);
  const index_t K = dy.extent(1), P = dy.extent(2), Q = dy.extent(3);
  const index_t R = dwv.extent(2), S = dwv.extent(3), Kg = K / prm.groups;
  const index_t sh = prm.stride_h, dh = prm.dilation_h, dw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left, reach = (S - 1) * dw;
  const index_t band = direct_host::band_rows(R, dh, sh);
  using pw = typename DWV::precision;
  const auto xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  const auto ys0 = dy.stride(0), ys1 = dy.stride(1), ys2 = dy.stride(2);
  const auto* const xd = x.data();
  const auto* const yd = dy.data();
  const auto channel = [=](const index_t k) {
    alignas(64) float part[64][run];
    alignas(64) float ys[direct_strip_rows][run];
    alignas(64) float xs[direct_strip_rows][span];
    bool in_image[direct_strip_rows];
    for (index_t t = 0; t < R * S; ++t)
      for (index_t l = 0; l < run; ++l) part[t][l] = 0.f;
    for (index_t n = 0; n < N; ++n) {
      const auto* xc = xd + n * xs0 + (k / Kg) * xs1;
      const auto* yc = yd + n * ys0 + k * ys1;
      if (n + 1 < N) {
        direct_host::prefetch_plane(xc + xs0, H, W, xs2);
        direct_host::prefetch_plane(yc + ys0, P, Q, ys2);
      }
      for (index_t q0 = 0; q0 < Q; q0 += run) {
        const index_t qn = Q - q0 < run ? Q - q0 : run;
        for (index_t op0 = 0; op0 < P; op0 += band) {
          const index_t op1 = P - op0 < band ? P : op0 + band;
          // ys[op - op0][l] = dy(op, q0 + l), 0 past the row's end; xs[i][j] = x(h0 + i,
          // q0 - pl + j): tap (r, s) pairs ys[op - op0][l] with xs[op sh + r dh - pt - h0][l + s
          // dw].
          const index_t h0 = op0 * sh - pt, rows = (op1 - 1 - op0) * sh + (R - 1) * dh + 1;
          for (index_t op = op0; op < op1; ++op)
            direct_host::widen_segment(yc + op * ys2, Q, q0, run, ys[op - op0]);
          index_t in_lo = rows, in_hi = 0; // the strip's rows inside the image: [in_lo, in_hi)
          for (index_t i = 0; i < rows; ++i) {
            in_image[i] = h0 + i >= 0 && h0 + i < H;
            if (!in_image[i]) continue;
            in_lo = in_lo < i ? in_lo : i, in_hi = i + 1;
            direct_host::widen_segment(xc + (h0 + i) * xs2, W, q0 - pl, run + reach, xs[i]);
            for (index_t j = run + reach; j < span; ++j) xs[i][j] = 0.f;
          }
          // Whole strips at once: rows are contiguous, and the x rows' columns past the taps'
          // reach hold zeros.
          const bool finite =
              direct_host::all_finite(ys[0], (op1 - op0) * run) &&
              (in_hi <= in_lo || direct_host::all_finite(xs[in_lo], (in_hi - in_lo) * span));
          for (index_t r = 0; r < R; ++r)
            for (index_t s = 0; s < S; ++s) {
              float* const tap = part[r * S + s];
              if (finite) {
                direct_host::run_acc sum;
                sum.load(tap);
                for (index_t op = op0; op < op1; ++op) {
                  const index_t i = (op - op0) * sh + r * dh;
                  if (in_image[i]) sum.fma(ys[op - op0], xs[i] + s * dw);
                }
                sum.store(tap);
                continue;
              }
              index_t lo, hi; // only the true pairs
              valid_output_range(W, Q, 1, s * dw - pl, lo, hi);
              lo = lo > q0 ? lo : q0;
              hi = hi < q0 + qn ? hi : q0 + qn;
              for (index_t op = op0; op < op1; ++op) {
                const index_t i = (op - op0) * sh + r * dh;
                if (!in_image[i]) continue;
                for (index_t q = lo; q < hi; ++q)
                  tap[q - q0] += ys[op - op0][q - q0] * xs[i][q - q0 + s * dw];
              }
            }
        }
      }
    }
    for (index_t t = 0; t < R * S; ++t) {
      float acc = 0.f;
      for (index_t l = 0; l < run; ++l) acc += part[t][l];
      dwv(k, 0, t / S, t % S) = from_float<pw>(alpha * acc);
    }
  };
  Kokkos::parallel_for("tessera::conv2d_backward_weight[direct, host]",
                       Kokkos::RangePolicy<Exec>(exec, 0, K), channel);
}

#endif // !TESSERA_DEVICE_PASS

} // namespace tessera::detail
