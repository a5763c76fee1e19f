#pragma once
/// \file conv/detail/direct.hpp
/// Direct (loop) kernels for convolutions with one input channel per group and several groups,
/// depthwise convolution being the common case. There each group's GEMM would have a single
/// reduction channel (K/groups x R*S times R*S x P*Q): thousands of tiny GEMM calls, so direct
/// loops with fp32 accumulation are both simpler and far faster.
///
/// Each thread owns a row of outputs and accumulates a chunk of it in a local array, kernel tap
/// by kernel tap, over the range of positions the tap keeps inside the image: the innermost loops
/// are branch-free and unit-stride for stride 1, so they vectorise. On host spaces, unit column
/// strides take the forms of conv/detail/direct_host.hpp (rows widened once into padded
/// buffers, full-width vector taps).
/// Private: called by conv2d_* after the argument checks (operands are row-major within each
/// image / filter, see detail::require_rowmajor).

#include <tessera/conv/detail/direct_host.hpp>
#include <tessera/conv/im2col.hpp>
#include <tessera/conv/params.hpp>
#include <tessera/tensor.hpp>

namespace tessera::detail {

/// Accumulators per thread: 64 floats, four AVX-512 vectors (256 bytes of stack or registers).
inline constexpr index_t direct_chunk = 64;

/// y[n, k, p, q] = epi(alpha * sum_{r,s} x[n, k / Kg, h, w] w[k, 0, r, s] (+ bias[k])).
template <bool HasBias, class Exec, class XV, class WV, class BV, class YV, class Epi>
void direct_cg1_forward(const Exec& exec, const XV& x, const WV& w, const BV& bias, const YV& y,
                        const conv2d_params& prm, float alpha, const Epi& epi) {
  const index_t N = y.extent(0), K = y.extent(1), P = y.extent(2), Q = y.extent(3);
  const index_t H = x.extent(2), W = x.extent(3), R = w.extent(2), S = w.extent(3);
  const index_t Kg = K / prm.groups;
  const index_t sh = prm.stride_h, sw = prm.stride_w, dh = prm.dilation_h, dw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left;
#if !TESSERA_DEVICE_PASS
  if constexpr (is_host_exec_v<Exec>)
    if (direct_host_applies(prm, w.extent(2), w.extent(3), false)) {
      direct_cg1_forward_host<HasBias>(exec, x, w, bias, y, prm, alpha, epi);
      return;
    }
#endif
  using py = typename YV::precision;
  Kokkos::parallel_for(
      "tessera::conv2d_forward[direct]",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {N, K, P}),
      KOKKOS_LAMBDA(const index_t n, const index_t k, const index_t op) {
        const auto* xc = x.data() + n * x.stride(0) + (k / Kg) * x.stride(1);
        const auto* wk = w.data() + k * w.stride(0);
        auto* yr = y.data() + n * y.stride(0) + k * y.stride(1) + op * y.stride(2);
        float b = 0.f;
        if constexpr (HasBias) b = to_float(bias(k));
        for (index_t q0 = 0; q0 < Q; q0 += direct_chunk) {
          const index_t qn = Q - q0 < direct_chunk ? Q - q0 : direct_chunk;
          float acc[direct_chunk];
          for (index_t i = 0; i < qn; ++i) acc[i] = 0.f;
          for (index_t r = 0; r < R; ++r) {
            const index_t h = op * sh - pt + r * dh;
            if (h < 0 || h >= H) continue;
            const auto* xr = xc + h * x.stride(2);
            for (index_t s = 0; s < S; ++s) {
              const index_t off = s * dw - pl;
              index_t lo, hi;
              valid_output_range(W, Q, sw, off, lo, hi);
              lo = lo > q0 ? lo : q0;
              hi = hi < q0 + qn ? hi : q0 + qn;
              const float wv = to_float(wk[r * w.stride(2) + s]);
              if (sw == 1) {
                for (index_t q = lo; q < hi; ++q) acc[q - q0] += to_float(xr[q + off]) * wv;
              } else {
                for (index_t q = lo; q < hi; ++q) acc[q - q0] += to_float(xr[q * sw + off]) * wv;
              }
            }
          }
          for (index_t i = 0; i < qn; ++i) yr[q0 + i] = from_float<py>(epi(alpha * acc[i] + b));
        }
      });
}

/// dx[n, c, h, w] = alpha * sum over the Kg output channels of group c and the taps (r, s) that
/// read (h, w) of dy[n, k, p, q] w[k, 0, r, s]. A gather: each dx element is written once.
template <class Exec, class DYV, class WV, class DXV>
void direct_cg1_backward_data(const Exec& exec, const DYV& dy, const WV& w, const DXV& dx,
                              const conv2d_params& prm, float alpha) {
  const index_t N = dx.extent(0), C = dx.extent(1), H = dx.extent(2), W = dx.extent(3);
  const index_t K = dy.extent(1), P = dy.extent(2), Q = dy.extent(3);
  const index_t R = w.extent(2), S = w.extent(3), Kg = K / prm.groups;
  const index_t sh = prm.stride_h, sw = prm.stride_w, dh = prm.dilation_h, dw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left;
#if !TESSERA_DEVICE_PASS
  if constexpr (is_host_exec_v<Exec>)
    if (direct_host_applies(prm, R, S, true)) {
      direct_cg1_backward_data_host(exec, dy, w, dx, prm, alpha);
      return;
    }
#endif
  using px = typename DXV::precision;
  Kokkos::parallel_for(
      "tessera::conv2d_backward_data[direct]",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {N, C, H}),
      KOKKOS_LAMBDA(const index_t n, const index_t c, const index_t h) {
        auto* xr = dx.data() + n * dx.stride(0) + c * dx.stride(1) + h * dx.stride(2);
        for (index_t w0 = 0; w0 < W; w0 += direct_chunk) {
          const index_t wn = W - w0 < direct_chunk ? W - w0 : direct_chunk;
          float acc[direct_chunk];
          for (index_t i = 0; i < wn; ++i) acc[i] = 0.f;
          for (index_t j = 0; j < Kg; ++j) {
            const index_t k = c * Kg + j;
            const auto* dyk = dy.data() + n * dy.stride(0) + k * dy.stride(1);
            const auto* wk = w.data() + k * w.stride(0);
            for (index_t r = 0; r < R; ++r) {
              const index_t u = h + pt - r * dh;
              if (u < 0 || u % sh != 0 || u / sh >= P) continue;
              const auto* dyr = dyk + (u / sh) * dy.stride(2);
              for (index_t s = 0; s < S; ++s) {
                // Output columns q whose input column q*sw + off lies in this chunk.
                const index_t off = s * dw - pl - w0;
                index_t lo, hi;
                valid_output_range(wn, Q, sw, off, lo, hi);
                const float wv = to_float(wk[r * w.stride(2) + s]);
                if (sw == 1) {
                  for (index_t q = lo; q < hi; ++q) acc[q + off] += to_float(dyr[q]) * wv;
                } else {
                  for (index_t q = lo; q < hi; ++q) acc[q * sw + off] += to_float(dyr[q]) * wv;
                }
              }
            }
          }
          for (index_t i = 0; i < wn; ++i) xr[w0 + i] = from_float<px>(alpha * acc[i]);
        }
      });
}

/// dw[k, 0, r, s] = alpha * sum_{n,p,q} dy[n, k, p, q] x[n, k / Kg, h, w], one work item per
/// weight (kernels of more than direct_max_taps taps): one reduction of length N*P*Q per weight,
/// each output row summed in 16 interleaved partial sums (one AVX-512 vector; any summation order
/// satisfies the same error bound).
template <class Exec, class XV, class DYV, class DWV>
void direct_cg1_backward_weight_per_tap(const Exec& exec, const XV& x, const DYV& dy, const DWV& dw,
                                        const conv2d_params& prm, float alpha) {
  const index_t N = x.extent(0), H = x.extent(2), W = x.extent(3);
  const index_t K = dy.extent(1), P = dy.extent(2), Q = dy.extent(3);
  const index_t R = dw.extent(2), S = dw.extent(3), Kg = K / prm.groups;
  const index_t sh = prm.stride_h, sw = prm.stride_w, dh = prm.dilation_h, dlw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left;
  using pw = typename DWV::precision;
  constexpr index_t lanes = 16;
  Kokkos::parallel_for(
      "tessera::conv2d_backward_weight[direct]",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {K, R, S}),
      KOKKOS_LAMBDA(const index_t k, const index_t r, const index_t s) {
        const index_t off = s * dlw - pl;
        index_t lo, hi;
        valid_output_range(W, Q, sw, off, lo, hi);
        float part[lanes];
        for (index_t i = 0; i < lanes; ++i) part[i] = 0.f;
        for (index_t n = 0; n < N; ++n) {
          const auto* xc = x.data() + n * x.stride(0) + (k / Kg) * x.stride(1);
          const auto* dyk = dy.data() + n * dy.stride(0) + k * dy.stride(1);
          for (index_t op = 0; op < P; ++op) {
            const index_t h = op * sh - pt + r * dh;
            if (h < 0 || h >= H) continue;
            const auto* xr = xc + h * x.stride(2);
            const auto* dyr = dyk + op * dy.stride(2);
            index_t q = lo;
            if (sw == 1) { // unit stride: one vector load of each operand per step
              for (; q + lanes <= hi; q += lanes)
                for (index_t i = 0; i < lanes; ++i)
                  part[i] += to_float(dyr[q + i]) * to_float(xr[q + i + off]);
            } else {
              for (; q + lanes <= hi; q += lanes)
                for (index_t i = 0; i < lanes; ++i)
                  part[i] += to_float(dyr[q + i]) * to_float(xr[(q + i) * sw + off]);
            }
            for (; q < hi; ++q) part[q % lanes] += to_float(dyr[q]) * to_float(xr[q * sw + off]);
          }
        }
        float acc = 0.f;
        for (index_t i = 0; i < lanes; ++i) acc += part[i];
        dw(k, 0, r, s) = from_float<pw>(alpha * acc);
      });
}

/// Kernels up to 64 taps (8x8) keep one accumulator per tap in a work item.
inline constexpr index_t direct_max_taps = 64;

/// dw[k, 0, r, s] = alpha * sum_{n,p,q} dy[n, k, p, q] x[n, k / Kg, h, w]. One work item per
/// output channel k computes all R*S taps in one sweep over its dy and x planes, so each row of
/// them is read from memory once and reused from L1 by every tap (instead of once per tap).
/// Each tap accumulates in 8 interleaved partial sums (an AVX2 / half an AVX-512 vector, 2 KiB
/// for 64 taps), reduced once at the end; any summation order satisfies the same error bound.
template <class Exec, class XV, class DYV, class DWV>
void direct_cg1_backward_weight(const Exec& exec, const XV& x, const DYV& dy, const DWV& dw,
                                const conv2d_params& prm, float alpha) {
  const index_t R = dw.extent(2), S = dw.extent(3);
#if !TESSERA_DEVICE_PASS
  if constexpr (is_host_exec_v<Exec>)
    if (direct_host_applies(prm, R, S, false)) {
      direct_cg1_backward_weight_host(exec, x, dy, dw, prm, alpha);
      return;
    }
#endif
  if (R * S > direct_max_taps) {
    direct_cg1_backward_weight_per_tap(exec, x, dy, dw, prm, alpha);
    return;
  }
  const index_t N = x.extent(0), H = x.extent(2), W = x.extent(3);
  const index_t K = dy.extent(1), P = dy.extent(2), Q = dy.extent(3), Kg = K / prm.groups;
  const index_t sh = prm.stride_h, sw = prm.stride_w, dh = prm.dilation_h, dlw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left;
  using pw = typename DWV::precision;
  constexpr index_t lanes = 8;
  Kokkos::parallel_for(
      "tessera::conv2d_backward_weight[direct]", Kokkos::RangePolicy<Exec>(exec, 0, K),
      KOKKOS_LAMBDA(const index_t k) {
        float part[direct_max_taps][lanes];
        index_t lo[direct_max_taps], hi[direct_max_taps];
        for (index_t s = 0; s < S; ++s) valid_output_range(W, Q, sw, s * dlw - pl, lo[s], hi[s]);
        for (index_t t = 0; t < R * S; ++t)
          for (index_t i = 0; i < lanes; ++i) part[t][i] = 0.f;
        for (index_t n = 0; n < N; ++n) {
          const auto* xc = x.data() + n * x.stride(0) + (k / Kg) * x.stride(1);
          const auto* dyk = dy.data() + n * dy.stride(0) + k * dy.stride(1);
          for (index_t op = 0; op < P; ++op) {
            const auto* dyr = dyk + op * dy.stride(2);
            for (index_t r = 0; r < R; ++r) {
              const index_t h = op * sh - pt + r * dh;
              if (h < 0 || h >= H) continue;
              const auto* xr = xc + h * x.stride(2);
              for (index_t s = 0; s < S; ++s) {
                const index_t off = s * dlw - pl;
                float* tap = part[r * S + s];
                index_t q = lo[s];
                if (sw == 1) {
                  for (; q + lanes <= hi[s]; q += lanes)
                    for (index_t i = 0; i < lanes; ++i)
                      tap[i] += to_float(dyr[q + i]) * to_float(xr[q + i + off]);
                }
                for (; q < hi[s]; ++q)
                  tap[q % lanes] += to_float(dyr[q]) * to_float(xr[q * sw + off]);
              }
            }
          }
        }
        for (index_t t = 0; t < R * S; ++t) {
          float acc = 0.f;
          for (index_t i = 0; i < lanes; ++i) acc += part[t][i];
          dw(k, 0, t / S, t % S) = from_float<pw>(alpha * acc);
        }
      });
}

} // namespace tessera::detail
