#pragma once
// Slow, obviously correct 2-D convolution in double precision, for the conv tests.
//
// All three passes walk the same seven loops (n, k, p, q, c, r, s) over every (output pixel,
// kernel tap) pair whose input pixel lies inside the image; the forward pass gathers
// x * w into y, backward-data scatters dy * w into dx, backward-weight scatters dy * x into dw.
// Each pass also returns, per output element, the sum of the magnitudes of the terms it added
// (the quantity rounding-error bounds are proportional to).
//
// Tensors are plain std::vector<double> in NCHW / KCRS row-major order, so this file depends on
// nothing in tessera except conv2d_params.
#include <tessera/conv/params.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

namespace tessera::testing {

/// The sizes of a convolution: x (N, C, H, W), w (K, C/G, R, S), y (N, K, P, Q).
struct conv_shape {
  index_t N = 1, C = 1, H = 1, W = 1, K = 1, R = 1, S = 1;
  conv2d_params prm{};
  index_t P() const {
    return (H + prm.pad_top + prm.pad_bottom - prm.dilation_h * (R - 1) - 1) / prm.stride_h + 1;
  }
  index_t Q() const {
    return (W + prm.pad_left + prm.pad_right - prm.dilation_w * (S - 1) - 1) / prm.stride_w + 1;
  }
  index_t Cg() const { return C / prm.groups; }
  index_t Kg() const { return K / prm.groups; }
  index_t x_size() const { return N * C * H * W; }
  index_t w_size() const { return K * Cg() * R * S; }
  index_t y_size() const { return N * K * P() * Q(); }
};

/// A pass's result and, per element, the sum of |term| over the terms that formed it.
struct reference_result {
  std::vector<double> value, abs;
};

/// Calls f(x_index, w_index, y_index) for every (n, k, p, q, c, r, s) whose input pixel is inside
/// the image (the seven loops of a direct convolution).
template <class F>
void for_each_conv_term(const conv_shape& s, F&& f) {
  const index_t P = s.P(), Q = s.Q(), Cg = s.Cg(), Kg = s.Kg();
  const auto& p = s.prm;
  for (index_t n = 0; n < s.N; ++n)
    for (index_t k = 0; k < s.K; ++k)
      for (index_t op = 0; op < P; ++op)
        for (index_t oq = 0; oq < Q; ++oq)
          for (index_t cl = 0; cl < Cg; ++cl)
            for (index_t r = 0; r < s.R; ++r)
              for (index_t t = 0; t < s.S; ++t) {
                const index_t h = op * p.stride_h - p.pad_top + r * p.dilation_h;
                const index_t w = oq * p.stride_w - p.pad_left + t * p.dilation_w;
                if (h < 0 || h >= s.H || w < 0 || w >= s.W) continue;
                const index_t c = (k / Kg) * Cg + cl; // input channel of group k / Kg
                f(((n * s.C + c) * s.H + h) * s.W + w, ((k * Cg + cl) * s.R + r) * s.S + t,
                  ((n * s.K + k) * P + op) * Q + oq);
              }
}

/// y = conv(x, w) + bias (bias may be empty).
inline reference_result reference_conv2d_forward(const conv_shape& s, const std::vector<double>& x,
                                                 const std::vector<double>& w,
                                                 const std::vector<double>& bias) {
  reference_result r{std::vector<double>(static_cast<std::size_t>(s.y_size())),
                     std::vector<double>(static_cast<std::size_t>(s.y_size()))};
  for_each_conv_term(s, [&](index_t xi, index_t wi, index_t yi) {
    r.value[yi] += x[xi] * w[wi];
    r.abs[yi] += std::abs(x[xi] * w[wi]);
  });
  if (!bias.empty())
    for (index_t i = 0; i < s.y_size(); ++i) {
      const double b = bias[(i / (s.P() * s.Q())) % s.K];
      r.value[i] += b;
      r.abs[i] += std::abs(b);
    }
  return r;
}

/// dx = dL/dx given dy = dL/dy.
inline reference_result reference_conv2d_backward_data(const conv_shape& s,
                                                       const std::vector<double>& dy,
                                                       const std::vector<double>& w) {
  reference_result r{std::vector<double>(static_cast<std::size_t>(s.x_size())),
                     std::vector<double>(static_cast<std::size_t>(s.x_size()))};
  for_each_conv_term(s, [&](index_t xi, index_t wi, index_t yi) {
    r.value[xi] += dy[yi] * w[wi];
    r.abs[xi] += std::abs(dy[yi] * w[wi]);
  });
  return r;
}

/// dw = dL/dw given dy = dL/dy.
inline reference_result reference_conv2d_backward_weight(const conv_shape& s,
                                                         const std::vector<double>& x,
                                                         const std::vector<double>& dy) {
  reference_result r{std::vector<double>(static_cast<std::size_t>(s.w_size())),
                     std::vector<double>(static_cast<std::size_t>(s.w_size()))};
  for_each_conv_term(s, [&](index_t xi, index_t wi, index_t yi) {
    r.value[wi] += dy[yi] * x[xi];
    r.abs[wi] += std::abs(dy[yi] * x[xi]);
  });
  return r;
}

/// dbias[k] = sum over n, p, q of dy[n, k, p, q].
inline reference_result reference_conv2d_backward_bias(const conv_shape& s,
                                                       const std::vector<double>& dy) {
  reference_result r{std::vector<double>(static_cast<std::size_t>(s.K)),
                     std::vector<double>(static_cast<std::size_t>(s.K))};
  for (index_t i = 0; i < s.y_size(); ++i) {
    const index_t k = (i / (s.P() * s.Q())) % s.K;
    r.value[k] += dy[i];
    r.abs[k] += std::abs(dy[i]);
  }
  return r;
}

} // namespace tessera::testing
