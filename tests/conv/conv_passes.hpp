// The three passes of conv2d (+ bias) against the direct double-precision reference on one shape,
// and the random shapes the conv2d tests draw (test_conv2d.cpp: fp32; test_conv2d_lowp.cpp:
// bf16, fp8, fp16 and mixed precisions). Tolerances: conv_testing.hpp.
#pragma once

#include "conv_testing.hpp"

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <random>

namespace tessera::testing {

// Runs all three passes on shape s with x, w, y (and their gradients) in precisions PX, PW, PY;
// bias and dbias in PW; budget: the workspace's column budget in bytes.
template <class PX, class PW, class PY, class Exec>
void check_all_passes(const Exec& exec, const conv_shape& s, std::uint64_t seed,
                      std::size_t budget) {
  INFO(describe(s) << ", column budget " << budget << ", x " << precision_traits<PX>::name << " w "
                   << precision_traits<PW>::name << " y " << precision_traits<PY>::name);
  const index_t P = s.P(), Q = s.Q();
  conv2d_workspace<> ws(budget);

  auto x = random_tensor<PX>(seed, s.N, s.C, s.H, s.W);        // (N, C, H, W)
  auto w = random_tensor<PW>(seed + 1, s.K, s.Cg(), s.R, s.S); // (K, C/g, R, S)
  auto b = random_tensor<PW>(seed + 2, s.K);                   // (K)
  auto dy = random_tensor<PY>(seed + 3, s.N, s.K, P, Q);       // (N, K, P, Q)
  const auto xd = to_doubles(x), wd = to_doubles(w), bd = to_doubles(b), dyd = to_doubles(dy);
  const index_t L_fwd = s.Cg() * s.R * s.S + 2, L_data = s.Kg() * s.R * s.S + 2,
                L_weight = s.N * P * Q + 2;

  tensor4<PY> y("y", s.N, s.K, P, Q);
  conv2d_forward(exec, x, w, b, y, s.prm, ws);
  require_within_bound("forward+bias", y, reference_conv2d_forward(s, xd, wd, bd), L_fwd);
  conv2d_forward(exec, x, w, y, s.prm, ws);
  require_within_bound("forward", y, reference_conv2d_forward(s, xd, wd, {}), L_fwd);

  tensor4<PX> dx("dx", s.N, s.C, s.H, s.W);
  fill(dx, 7.f); // overwritten, not accumulated
  conv2d_backward_data(exec, dy, w, dx, s.prm, ws);
  require_within_bound("backward_data", dx, reference_conv2d_backward_data(s, dyd, wd), L_data);

  tensor4<PW> dw("dw", s.K, s.Cg(), s.R, s.S);
  tensor1<PW> db("db", s.K);
  fill(dw, 7.f), fill(db, 7.f);
  conv2d_backward_weight(exec, x, dy, dw, db, s.prm, ws);
  require_within_bound("backward_weight", dw, reference_conv2d_backward_weight(s, xd, dyd),
                       L_weight);
  require_within_bound("backward_bias", db, reference_conv2d_backward_bias(s, dyd), L_weight);
}

inline const std::size_t budgets[] = {conv2d_workspace<>::default_column_budget, 4096, 1};

/// A random convolution with 16..64 channels per group, the shapes of the host implicit-GEMM
/// path (detail::use_implicit: >= 16 output channels per group, reduction >= 64, not
/// pointwise): several 224-pixel blocks, micro-panels across output rows, reductions over one
/// or more 256-row slices, channel counts off the 32-channel panels, padding larger than the
/// dilated kernel (a negative padding for backward-data's transposed convolution).
inline conv_shape random_wide_shape(std::mt19937_64& rng) {
  const auto in = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(rng);
  };
  for (;;) {
    conv_shape s;
    s.N = in(1, 3);
    s.prm.groups = in(1, 2);
    s.C = s.prm.groups * in(8, 40);
    s.K = s.prm.groups * in(16, 70);
    s.H = in(1, 26), s.W = in(1, 26);
    s.R = in(1, 5), s.S = in(1, 5);
    s.prm.stride_h = in(1, 2), s.prm.stride_w = in(1, 2);
    s.prm.dilation_h = in(1, 2), s.prm.dilation_w = in(1, 2);
    s.prm.pad_top = in(0, 4), s.prm.pad_bottom = in(0, 4);
    s.prm.pad_left = in(0, 4), s.prm.pad_right = in(0, 4);
    if (in(0, 3) == 0) // stride 1 (backward-data's implicit path) more often
      s.prm.stride_h = s.prm.stride_w = 1;
    const index_t span_h =
        s.H + s.prm.pad_top + s.prm.pad_bottom - s.prm.dilation_h * (s.R - 1) - 1;
    const index_t span_w =
        s.W + s.prm.pad_left + s.prm.pad_right - s.prm.dilation_w * (s.S - 1) - 1;
    if (span_h < 0 || span_w < 0) continue;
    if (s.N * s.K * s.P() * s.Q() * s.Cg() * s.R * s.S > 1000000) continue;
    return s;
  }
}

template <class PX, class PW, class PY, class Exec = Kokkos::DefaultExecutionSpace>
void random_cases(std::uint64_t seed, int cases) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const auto s = random_conv_shape(rng);
    check_all_passes<PX, PW, PY>(Exec{}, s, seed * 1000 + static_cast<std::uint64_t>(i),
                                 budgets[i % 3]);
  }
}

} // namespace tessera::testing
