#pragma once
/// \file conv/detail/direct.hpp
/// Direct (loop) kernels for convolutions with one input channel per group and several groups,
/// depthwise convolution being the common case. There each group's GEMM would have a single
/// reduction channel (K/groups x R*S times R*S x P*Q): thousands of tiny GEMM calls, so a direct
/// loop with fp32 accumulation is both simpler and far faster.
/// Private: called by conv2d_* after the argument checks.

#include <tessera/conv/params.hpp>
#include <tessera/tensor.hpp>

namespace tessera::detail {

/// y[n, k, p, q] = epi(alpha * sum_{r,s} x[n, k / Kg, h, w] w[k, 0, r, s] (+ bias[k])).
template <bool HasBias, class Exec, class XV, class WV, class BV, class YV, class Epi>
void direct_cg1_forward(const Exec& exec, const XV& x, const WV& w, const BV& bias, const YV& y,
                        const conv2d_params& prm, float alpha, const Epi& epi) {
  const index_t N = y.extent(0), K = y.extent(1), P = y.extent(2), Q = y.extent(3);
  const index_t H = x.extent(2), W = x.extent(3), R = w.extent(2), S = w.extent(3);
  const index_t Kg = K / prm.groups;
  const conv2d_params p = prm;
  using py = typename YV::precision;
  Kokkos::parallel_for(
      "tessera::conv2d_forward[direct]",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {N, K, P}),
      KOKKOS_LAMBDA(const index_t n, const index_t k, const index_t op) {
        const index_t c = k / Kg;
        float b = 0.f;
        if constexpr (HasBias) b = to_float(bias(k));
        for (index_t q = 0; q < Q; ++q) {
          float acc = 0.f;
          for (index_t r = 0; r < R; ++r) {
            const index_t h = op * p.stride_h - p.pad_top + r * p.dilation_h;
            if (h < 0 || h >= H) continue;
            for (index_t s = 0; s < S; ++s) {
              const index_t ww = q * p.stride_w - p.pad_left + s * p.dilation_w;
              if (ww < 0 || ww >= W) continue;
              acc += to_float(x(n, c, h, ww)) * to_float(w(k, 0, r, s));
            }
          }
          y(n, k, op, q) = from_float<py>(epi(alpha * acc + b));
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
  const conv2d_params p = prm;
  using px = typename DXV::precision;
  Kokkos::parallel_for(
      "tessera::conv2d_backward_data[direct]",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {N, C, H}),
      KOKKOS_LAMBDA(const index_t n, const index_t c, const index_t h) {
        for (index_t ww = 0; ww < W; ++ww) {
          float acc = 0.f;
          for (index_t r = 0; r < R; ++r) {
            const index_t t = h + p.pad_top - r * p.dilation_h;
            if (t < 0 || t % p.stride_h != 0 || t / p.stride_h >= P) continue;
            for (index_t s = 0; s < S; ++s) {
              const index_t u = ww + p.pad_left - s * p.dilation_w;
              if (u < 0 || u % p.stride_w != 0 || u / p.stride_w >= Q) continue;
              for (index_t j = 0; j < Kg; ++j) {
                const index_t k = c * Kg + j;
                acc += to_float(dy(n, k, t / p.stride_h, u / p.stride_w)) * to_float(w(k, 0, r, s));
              }
            }
          }
          dx(n, c, h, ww) = from_float<px>(alpha * acc);
        }
      });
}

/// dw[k, 0, r, s] = alpha * sum_{n,p,q} dy[n, k, p, q] x[n, k / Kg, h, w]: one reduction of
/// length N*P*Q per weight.
template <class Exec, class XV, class DYV, class DWV>
void direct_cg1_backward_weight(const Exec& exec, const XV& x, const DYV& dy, const DWV& dw,
                                const conv2d_params& prm, float alpha) {
  const index_t N = x.extent(0), H = x.extent(2), W = x.extent(3);
  const index_t K = dy.extent(1), P = dy.extent(2), Q = dy.extent(3);
  const index_t R = dw.extent(2), S = dw.extent(3), Kg = K / prm.groups;
  const conv2d_params p = prm;
  using pw = typename DWV::precision;
  Kokkos::parallel_for(
      "tessera::conv2d_backward_weight[direct]",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {K, R, S}),
      KOKKOS_LAMBDA(const index_t k, const index_t r, const index_t s) {
        const index_t c = k / Kg;
        float acc = 0.f;
        for (index_t n = 0; n < N; ++n)
          for (index_t op = 0; op < P; ++op) {
            const index_t h = op * p.stride_h - p.pad_top + r * p.dilation_h;
            if (h < 0 || h >= H) continue;
            for (index_t q = 0; q < Q; ++q) {
              const index_t ww = q * p.stride_w - p.pad_left + s * p.dilation_w;
              if (ww < 0 || ww >= W) continue;
              acc += to_float(dy(n, k, op, q)) * to_float(x(n, c, h, ww));
            }
          }
        dw(k, 0, r, s) = from_float<pw>(alpha * acc);
      });
}

} // namespace tessera::detail
