// The three passes of conv2d (+ bias) against the direct double-precision reference on one shape,
// and the random shapes the conv2d tests draw (test_conv2d.cpp: fp32; test_conv2d_lowp.cpp:
// bf16, fp8, fp16 and mixed precisions). Tolerances: conv_testing.hpp.
#pragma once

#include "conv_testing.hpp"

#include <tessera/tensor/host_mirror.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

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

/// Compares a result holding Inf or NaN with the reference kind by kind: entries finite in the
/// reference within the fp32 bound for L terms, the others of the same kind (NaN where NaN, Inf
/// of the same sign); both kinds must occur.
inline void check_kind_by_kind(const char* what, const std::vector<double>& got,
                               const reference_result& ref, index_t L) {
  INFO(what);
  int finite = 0, nonfinite = 0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double r = ref.value[e], v = got[e];
    INFO("entry " << e << ": " << v << ", reference " << r);
    if (std::isfinite(r)) {
      ++finite;
      REQUIRE(std::abs(v - r) <= error_bound<fp32>(r, ref.abs[e], L));
    } else {
      ++nonfinite;
      REQUIRE(std::isnan(v) == std::isnan(r));
      if (!std::isnan(r)) REQUIRE(v == r);
    }
  }
  CHECK(finite > 0);
  CHECK(nonfinite > 0);
}

/// conv2d_backward_weight (fp32 dW) of x in precision PX with Inf, -Inf or NaN placed at image 2,
/// channel 5, row 7, last column (where dot products over padded rows reach a zero of dy) and at
/// image `second`, channel 9, (0, 0): entries finite in the reference within the fp32 bound,
/// the others of the same kind (NaN where NaN, Inf of the same sign); both kinds must occur.
template <class PX>
void check_dw_with_nonfinite_x(const conv_shape& s, index_t second) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    INFO("x holds " << bad);
    auto x = random_tensor<PX>(77, s.N, s.C, s.H, s.W);
    auto dy = random_tensor<PX>(78, s.N, s.K, s.P(), s.Q());
    auto xh = host_mirror_copy(x);
    xh(2, 5, 7, s.W - 1) = from_float<PX>(bad);
    xh(second, 9, 0, 0) = from_float<PX>(bad);
    copy_from_host(x, xh);
    tensor4<fp32> dw("dw", s.K, s.C, s.R, s.S);
    conv2d_workspace<> ws;
    conv2d_backward_weight(Kokkos::DefaultExecutionSpace{}, x, dy, dw, s.prm, ws);
    check_kind_by_kind("backward_weight", to_doubles(dw),
                       reference_conv2d_backward_weight(s, to_doubles(x), to_doubles(dy)),
                       s.N * s.P() * s.Q() + 2);
  }
}

/// Depthwise shapes for the host forms of the direct kernels (conv/detail/direct_host.hpp):
/// rows shorter than, equal to and longer than a run of 64 outputs (several runs and a partial
/// one), kernels 1..7 wide with dilation up to 3, padding up to 3, row stride 1 or 2, channel
/// multiplier 1 or 2; every fifth shape has column stride 2 (the portable kernels), and one
/// reaches past the buffers' 64 columns ((S - 1) * dilation = 66: portable kernels too).
inline std::vector<conv_shape> depthwise_shapes(std::uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  const auto in = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(rng);
  };
  constexpr index_t widths[] = {1, 5, 17, 63, 64, 65, 70, 129, 130};
  std::vector<conv_shape> shapes;
  for (int i = 0; i < count; ++i) {
    conv_shape s;
    s.N = in(1, 3);
    s.prm.groups = s.C = in(1, 6);
    s.K = s.C * in(1, 2);
    s.R = in(1, 5), s.S = in(1, 7);
    s.prm.dilation_h = in(1, 2), s.prm.dilation_w = in(1, 3);
    s.prm.stride_h = in(1, 2), s.prm.stride_w = i % 5 == 4 ? 2 : 1;
    s.prm.pad_top = in(0, 3), s.prm.pad_bottom = in(0, 3);
    s.prm.pad_left = in(0, 3), s.prm.pad_right = in(0, 3);
    s.W = widths[static_cast<std::size_t>(i) % std::size(widths)];
    s.W = std::max(s.W, (s.S - 1) * s.prm.dilation_w + 1 - s.prm.pad_left - s.prm.pad_right);
    s.H = in(
        std::max<index_t>(1, (s.R - 1) * s.prm.dilation_h + 1 - s.prm.pad_top - s.prm.pad_bottom),
        12);
    shapes.push_back(s);
  }
  conv_shape far; // taps reaching 66 columns
  far.N = 1, far.C = far.K = far.prm.groups = 2, far.H = 4, far.W = 90, far.R = 1, far.S = 3;
  far.prm.dilation_w = 33, far.prm.pad_left = far.prm.pad_right = 5;
  shapes.push_back(far);
  return shapes;
}

/// All three passes of a depthwise convolution (3 x 3 on 70 x 6 images, padding 1, 4 channels)
/// with Inf, -Inf or NaN placed in a weight tap, in x at a row's ends and in dy at a row's ends:
/// each output entry finite in the reference within the fp32 bound, the others of the same kind
/// (NaN where NaN, Inf of the same sign); a padded zero must never meet a non-finite value into
/// NaN where the true sum has no such term. Both kinds must occur in each pass.
template <class P>
void check_depthwise_nonfinite() {
  const float inf = std::numeric_limits<float>::infinity();
  conv_shape s;
  s.N = 2, s.C = s.K = s.prm.groups = 4, s.H = 6, s.W = 70, s.R = s.S = 3;
  s.prm.pad_top = s.prm.pad_bottom = s.prm.pad_left = s.prm.pad_right = 1;
  const Kokkos::DefaultExecutionSpace exec;
  for (const float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    INFO(precision_traits<P>::name << " operands, one value of each holds " << bad);
    auto x = random_tensor<P>(81, s.N, s.C, s.H, s.W);
    auto w = random_tensor<P>(82, s.K, 1, s.R, s.S);
    auto dy = random_tensor<P>(83, s.N, s.K, s.P(), s.Q());
    const auto code = from_float<P, overflow_to_inf_nan>(bad); // fp8 saturates by default
    auto xh = host_mirror_copy(x);
    auto wh = host_mirror_copy(w);
    auto yh = host_mirror_copy(dy);
    wh(1, 0, 0, 2) = code;       // a tap that meets the right padding
    xh(1, 2, 3, s.W - 1) = code; // a row's last column
    xh(0, 3, 0, 0) = code;       // a row's first column
    yh(1, 0, 4, s.Q() - 1) = code;
    yh(0, 2, 5, 0) = code;
    copy_from_host(x, xh), copy_from_host(w, wh), copy_from_host(dy, yh);
    const auto xd = to_doubles(x), wd = to_doubles(w), dyd = to_doubles(dy);

    tensor4<fp32> y("y", s.N, s.K, s.P(), s.Q());
    conv2d_forward(exec, x, w, y, s.prm);
    check_kind_by_kind("forward", to_doubles(y), reference_conv2d_forward(s, xd, wd, {}),
                       s.R * s.S + 2);
    tensor4<fp32> dx("dx", s.N, s.C, s.H, s.W);
    conv2d_backward_data(exec, dy, w, dx, s.prm);
    check_kind_by_kind("backward_data", to_doubles(dx), reference_conv2d_backward_data(s, dyd, wd),
                       s.R * s.S + 2);
    tensor4<fp32> dw("dw", s.K, 1, s.R, s.S);
    conv2d_backward_weight(exec, x, dy, dw, s.prm);
    check_kind_by_kind("backward_weight", to_doubles(dw),
                       reference_conv2d_backward_weight(s, xd, dyd), s.N * s.P() * s.Q() + 2);
  }
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

#if !TESSERA_DEVICE_PASS
// The problem of shape s, as conv2d builds it (for the implicit paths' layout choices).
inline detail::conv2d_problem problem_of(const conv_shape& s) {
  return {.N = s.N,
          .C = s.C,
          .H = s.H,
          .W = s.W,
          .K = s.K,
          .R = s.R,
          .S = s.S,
          .P = s.P(),
          .Q = s.Q(),
          .G = s.prm.groups,
          .Cg = s.Cg(),
          .Kg = s.Kg(),
          .prm = s.prm};
}

/// A layer of the direct implicit paths' tests, with the direct paths it must take (the
/// AVX-512 tile's layouts: test_conv2d.cpp, test_conv2d_lowp.cpp).
struct direct_layer {
  conv_shape s;
  bool fwd_direct, data_direct, weight_direct;
  bool weight_lanes = false; ///< backward-weight with output channels along the lanes (fp32)
};

/// The shape of N images of C channels H x W, K filters R x S, parameters prm.
inline conv_shape make_shape(index_t N, index_t C, index_t K, index_t H, index_t W, index_t R,
                             index_t S, const conv2d_params& prm) {
  conv_shape s;
  s.N = N, s.C = C, s.K = K, s.H = H, s.W = W, s.R = R, s.S = S, s.prm = prm;
  return s;
}

/// N images of C channels H x W through K 1 x 1 filters, parameters prm.
inline conv_shape pointwise_shape(index_t N, index_t C, index_t K, index_t H, index_t W,
                                  const conv2d_params& prm = {}) {
  return make_shape(N, C, K, H, W, 1, 1, prm);
}

/// A 1 x 1 layer of the backward-weight tests and whether its layout puts the channels along
/// the lanes (weight_direct_layout::klanes: fp32 in test_conv2d.cpp, bf16 pairs in
/// test_conv2d_lowp.cpp).
struct pointwise_layer {
  conv_shape s;
  bool lanes;
};

/// Layers chosen to hit each form of the direct paths (conv/detail/implicit.hpp).
inline std::vector<direct_layer> direct_layers() {
  constexpr auto shape = make_shape;
  const conv2d_params pad1{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const bool avx512 =
#if defined(__AVX512F__)
      true;
#else
      false;
#endif
  return {
      // FashionCNN's second layer: 14 output columns, one panel a row.
      {shape(5, 32, 64, 14, 14, 3, 3, pad1), true, true, avx512, avx512},
      // 28 columns, several bands (8 rows each, the last 6), 40 channels (a partial panel).
      {shape(2, 24, 40, 30, 28, 3, 3, pad1), true, true, avx512},
      // Reduction 64 * 9 = 576: two KC slices of the packed weights.
      {shape(4, 64, 48, 14, 14, 3, 3, pad1), true, true, avx512, avx512},
      // 10 columns: linear slots (12 a row: 2 garbage slots per row).
      {shape(6, 20, 32, 10, 10, 3, 3, pad1), true, true, avx512, avx512},
      // Dilation 2 (pad 2): 14 columns.
      {shape(3, 16, 32, 14, 14, 3, 3,
             {.pad_top = 2,
              .pad_bottom = 2,
              .pad_left = 2,
              .pad_right = 2,
              .dilation_h = 2,
              .dilation_w = 2}),
       true, true, avx512},
      // Padding 3 > R - 1: backward-data's geometry has padding -1 (a crop).
      {shape(4, 16, 32, 10, 10, 3, 3,
             {.pad_top = 3, .pad_bottom = 3, .pad_left = 3, .pad_right = 3}),
       true, true, avx512, avx512},
      // Two groups of 24 -> 32 channels.
      {shape(4, 48, 64, 14, 14, 3, 3,
             {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 2}),
       true, true, avx512, avx512},
      // A 7 x 7 stride-2 stem on 3 channels: 14 output columns read 2 apart; backward-data and
      // backward-weight (stride 2) take the packing paths.
      {shape(2, 3, 32, 28, 28, 7, 7,
             {.stride_h = 2,
              .stride_w = 2,
              .pad_top = 3,
              .pad_bottom = 3,
              .pad_left = 3,
              .pad_right = 3}),
       true, false, false},
      // Stride 2 with 12 output columns: a partial panel per row (2 garbage slots).
      {shape(2, 16, 32, 24, 24, 3, 3,
             {.stride_h = 2,
              .stride_w = 2,
              .pad_top = 1,
              .pad_bottom = 1,
              .pad_left = 1,
              .pad_right = 1}),
       true, false, false},
      // A first layer (1 x 3 x 3: no implicit forward), 28 columns: 9 taps, one block of 6 and
      // one of 3.
      {shape(3, 1, 32, 28, 28, 3, 3, pad1), false, false, avx512},
      // 1 x 1 and 3 x 1 without horizontal padding: backward-weight runs a band's rows as one.
      {shape(8, 16, 32, 9, 9, 1, 1, {}), false, false, avx512},
      {shape(7, 32, 24, 9, 11, 3, 1, {.pad_top = 1, .pad_bottom = 1}), true, true, avx512},
      // Many small images (5 x 5): blocks of several images per unit.
      {shape(23, 16, 36, 5, 5, 3, 3, pad1), false, false, avx512},
      // Backward-weight's dot products along rows need 48 vector steps per register block
      // (two images of 14 x 14: 28): with 32 output channels the lanes hold channels instead.
      {shape(2, 32, 32, 14, 14, 3, 3, pad1), true, true, avx512, avx512},
      // Channels along the lanes: 16 output channels (one vector, blocks of 4 runs of taps: 15
      // runs, the last block 3), 80 (blocks of 4 vectors and of 1; 21 runs), and 40 x 40
      // images of 48 channels (two bands of 20 rows in L2).
      {shape(3, 5, 16, 11, 13, 3, 3, pad1), false, false, avx512, avx512},
      {shape(2, 7, 80, 9, 12, 3, 3, pad1), false, false, avx512, avx512},
      {shape(1, 48, 32, 40, 40, 3, 3, pad1), true, true, avx512, avx512},
  };
}
#endif

} // namespace tessera::testing
