#pragma once
// The naive reference for nn::CausalSelfAttention, in double: the whole layer (QKV projection,
// per-head scores materialised as a t x t matrix, causal mask, softmax, output projection) and
// its backward written out from the definitions, independent of the tiled kernels:
//   s_ij = q_i . k_j / sqrt(d) for j <= i,  P_i = softmax(s_i),  o_i = sum_j P_ij v_j
//   dv_j = sum_i P_ij do_i,  dP_ij = do_i . v_j,  ds_ij = P_ij (dP_ij - sum_k P_ik dP_ik),
//   dq_i = sum_j ds_ij k_j / sqrt(d),  dk_j = sum_i ds_ij q_i / sqrt(d).
// Weights as nn::Linear stores them: wqkv (3D, D) row-major (rows [0, D) q, [D, 2D) k,
// [2D, 3D) v), wo (D, D); x and y (B, t, D) row-major.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tessera::testing {

struct naive_attention {
  int B, t, D, H;
  std::vector<double> wqkv, bqkv, wo, bo;
  // Saved by forward for backward.
  std::vector<double> x, qkv, P, o;

  int hd() const { return D / H; }
  std::size_t at(int b, int i, int c, int width) const {
    return (std::size_t(b) * std::size_t(t) + std::size_t(i)) * std::size_t(width) + std::size_t(c);
  }
  std::size_t pat(int b, int h, int i, int j) const {
    return ((std::size_t(b) * std::size_t(H) + std::size_t(h)) * std::size_t(t) + std::size_t(i)) *
               std::size_t(t) +
           std::size_t(j);
  }

  std::vector<double> forward(const std::vector<double>& xin) {
    x = xin;
    const int d = hd(), D3 = 3 * D;
    qkv.assign(std::size_t(B * t * D3), 0.0);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < t; ++i)
        for (int r = 0; r < D3; ++r) {
          double s = bqkv[std::size_t(r)];
          for (int c = 0; c < D; ++c) s += wqkv[std::size_t(r * D + c)] * x[at(b, i, c, D)];
          qkv[at(b, i, r, D3)] = s;
        }
    P.assign(std::size_t(B * H * t * t), 0.0);
    o.assign(std::size_t(B * t * D), 0.0);
    const double scale = 1 / std::sqrt(double(d));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < t; ++i) {
          std::vector<double> s(std::size_t(i + 1));
          double m = -1e300;
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int e = 0; e < d; ++e)
              dot += qkv[at(b, i, h * d + e, D3)] * qkv[at(b, j, D + h * d + e, D3)];
            s[std::size_t(j)] = dot * scale;
            m = std::max(m, s[std::size_t(j)]);
          }
          double z = 0;
          for (int j = 0; j <= i; ++j) z += std::exp(s[std::size_t(j)] - m);
          for (int j = 0; j <= i; ++j) P[pat(b, h, i, j)] = std::exp(s[std::size_t(j)] - m) / z;
          for (int e = 0; e < d; ++e) {
            double acc = 0;
            for (int j = 0; j <= i; ++j)
              acc += P[pat(b, h, i, j)] * qkv[at(b, j, 2 * D + h * d + e, D3)];
            o[at(b, i, h * d + e, D)] = acc;
          }
        }
    std::vector<double> y(std::size_t(B * t * D));
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < t; ++i)
        for (int r = 0; r < D; ++r) {
          double s = bo[std::size_t(r)];
          for (int c = 0; c < D; ++c) s += wo[std::size_t(r * D + c)] * o[at(b, i, c, D)];
          y[at(b, i, r, D)] = s;
        }
    return y;
  }

  struct grads {
    std::vector<double> dx, dwqkv, dbqkv, dwo, dbo;
  };

  grads backward(const std::vector<double>& dy) const {
    const int d = hd(), D3 = 3 * D;
    const double scale = 1 / std::sqrt(double(d));
    grads g;
    g.dwo.assign(std::size_t(D * D), 0.0);
    g.dbo.assign(std::size_t(D), 0.0);
    std::vector<double> dout(std::size_t(B * t * D), 0.0);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < t; ++i)
        for (int r = 0; r < D; ++r) {
          const double gy = dy[at(b, i, r, D)];
          g.dbo[std::size_t(r)] += gy;
          for (int c = 0; c < D; ++c) {
            g.dwo[std::size_t(r * D + c)] += gy * o[at(b, i, c, D)];
            dout[at(b, i, c, D)] += gy * wo[std::size_t(r * D + c)];
          }
        }
    std::vector<double> dqkv(std::size_t(B * t * D3), 0.0);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < t; ++i) {
          std::vector<double> dP(std::size_t(i + 1));
          double rowdot = 0;
          for (int j = 0; j <= i; ++j) {
            double s = 0;
            for (int e = 0; e < d; ++e)
              s += dout[at(b, i, h * d + e, D)] * qkv[at(b, j, 2 * D + h * d + e, D3)];
            dP[std::size_t(j)] = s;
            rowdot += P[pat(b, h, i, j)] * s;
          }
          for (int j = 0; j <= i; ++j) {
            const double p = P[pat(b, h, i, j)];
            const double ds = p * (dP[std::size_t(j)] - rowdot);
            for (int e = 0; e < d; ++e) {
              dqkv[at(b, j, 2 * D + h * d + e, D3)] += p * dout[at(b, i, h * d + e, D)];
              dqkv[at(b, i, h * d + e, D3)] += ds * scale * qkv[at(b, j, D + h * d + e, D3)];
              dqkv[at(b, j, D + h * d + e, D3)] += ds * scale * qkv[at(b, i, h * d + e, D3)];
            }
          }
        }
    g.dx.assign(std::size_t(B * t * D), 0.0);
    g.dwqkv.assign(std::size_t(D3 * D), 0.0);
    g.dbqkv.assign(std::size_t(D3), 0.0);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < t; ++i)
        for (int r = 0; r < D3; ++r) {
          const double gq = dqkv[at(b, i, r, D3)];
          g.dbqkv[std::size_t(r)] += gq;
          for (int c = 0; c < D; ++c) {
            g.dwqkv[std::size_t(r * D + c)] += gq * x[at(b, i, c, D)];
            g.dx[at(b, i, c, D)] += gq * wqkv[std::size_t(r * D + c)];
          }
        }
    return g;
  }
};

} // namespace tessera::testing
