// conv2d_forward, conv2d_backward_data and conv2d_backward_weight (+ bias) against the direct
// double-precision reference (tests/support/reference_conv.hpp) on random shapes, for every
// precision and some mixed-precision combinations, with three workspace budgets: the default
// (several small images per tile: gather / scatter paths), 4 KiB (about one image or a few rows
// per tile) and 1 byte (one output row per tile: the accumulating col2im and beta = 1 paths).
// Tolerances: conv_testing.hpp.
#include "conv_testing.hpp"
#include "support/exec_spaces.hpp"

#include <catch2/catch.hpp>

#include <tuple>
#include <type_traits>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

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

const std::size_t budgets[] = {conv2d_workspace<>::default_column_budget, 4096, 1};

/// A random convolution with 16..64 channels per group, the shapes of the host implicit-GEMM
/// path (detail::use_implicit: >= 16 output channels per group, reduction >= 64, not
/// pointwise): several 224-pixel blocks, micro-panels across output rows, reductions over one
/// or more 256-row slices, channel counts off the 32-channel panels, padding larger than the
/// dilated kernel (a negative padding for backward-data's transposed convolution).
conv_shape random_wide_shape(std::mt19937_64& rng) {
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

} // namespace

TEST_CASE("conv2d fp32: all passes match the reference on random shapes", "[conv][fp32]") {
  random_cases<fp32, fp32, fp32>(1, 150);
}

// Every space that runs on default-memory tensors (each enabled host space in a host build, the
// device space in a device build): 30 random shapes each, beside the 150 above on the default.
TEMPLATE_LIST_TEST_CASE("conv2d fp32 on every enabled execution space matches the reference",
                        "[conv][fp32][spaces]", default_memory_exec_spaces) {
  INFO("execution space " << TestType::name());
  random_cases<fp32, fp32, fp32, TestType>(2, 30);
}

TEST_CASE("conv2d fp32 with 16-64 channels per group (implicit GEMM on the host)",
          "[conv][fp32][implicit]") {
  std::mt19937_64 rng(9);
  for (int i = 0; i < 32; ++i) {
    const auto s = random_wide_shape(rng);
    const std::uint64_t seed = 9000 + static_cast<std::uint64_t>(i);
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, s, seed, budgets[i % 3]);
    if (i % 4 == 0) // a low-precision output from fp32 operands
      check_all_passes<fp32, fp32, bf16>(Kokkos::DefaultExecutionSpace{}, s, seed, budgets[0]);
    // The first host space (Serial where enabled) as well, where it is not the default.
    using first_space = std::tuple_element_t<0, default_memory_exec_spaces>;
    if constexpr (!std::is_same_v<first_space, Kokkos::DefaultExecutionSpace>)
      if (i % 4 == 1) check_all_passes<fp32, fp32, fp32>(first_space{}, s, seed, budgets[0]);
  }
}

TEST_CASE("conv2d bf16: all passes match the reference on random shapes", "[conv][bf16]") {
  random_cases<bf16, bf16, bf16>(3, 60);
}

TEST_CASE("conv2d fp8: all passes match the reference on random shapes", "[conv][fp8]") {
  random_cases<fp8_e4m3, fp8_e4m3, fp8_e4m3>(4, 40);
  random_cases<fp8_e5m2, fp8_e5m2, fp8_e5m2>(5, 40);
}

TEST_CASE("conv2d fp16: all passes match the reference on random shapes", "[conv][fp16]") {
  random_cases<fp16, fp16, fp16>(11, 60);
}

TEST_CASE("conv2d fp16 mixed with fp32, bf16 and fp8, and 16-64 channels per group",
          "[conv][fp16][mixed]") {
  random_cases<fp16, fp16, fp32>(12, 20);     // fp16 operands, fp32 output
  random_cases<fp32, fp16, fp16>(13, 20);     // fp32 activations, fp16 weights
  random_cases<fp16, bf16, fp16>(14, 20);     // fp16 x bf16
  random_cases<fp16, fp8_e4m3, fp16>(15, 20); // fp16 x e4m3
  std::mt19937_64 rng(16);
  for (int i = 0; i < 6; ++i)
    check_all_passes<fp16, fp16, fp16>(Kokkos::DefaultExecutionSpace{}, random_wide_shape(rng),
                                       16000 + static_cast<std::uint64_t>(i), budgets[i % 3]);
}

TEST_CASE("conv2d low precision, reduction C/groups*R*S < 16 and >= 16 output channels",
          "[conv][bf16][fp8]") {
  // A first layer (1 x 3 x 3): backward-weight widens x and dy to fp32 for the implicit path.
  std::mt19937_64 rng(10);
  for (int i = 0; i < 12; ++i) {
    conv_shape s;
    const auto in = [&](index_t lo, index_t hi) {
      return std::uniform_int_distribution<index_t>(lo, hi)(rng);
    };
    s.N = in(1, 3);
    s.prm.groups = in(1, 2);
    s.C = s.prm.groups * in(1, 1 + i % 2);
    s.K = s.prm.groups * in(16, 40);
    s.R = in(1, 3), s.S = in(1, 3);
    s.H = in(s.R, 19), s.W = in(s.S, 19);
    s.prm.stride_h = s.prm.stride_w = in(1, 2);
    s.prm.pad_top = s.prm.pad_bottom = s.prm.pad_left = s.prm.pad_right = in(0, 1);
    const std::uint64_t seed = 10000 + static_cast<std::uint64_t>(i);
    INFO("case " << i);
    check_all_passes<bf16, bf16, bf16>(Kokkos::DefaultExecutionSpace{}, s, seed, budgets[i % 3]);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(Kokkos::DefaultExecutionSpace{}, s, seed,
                                                   budgets[i % 3]);
    check_all_passes<fp16, fp16, fp16>(Kokkos::DefaultExecutionSpace{}, s, seed, budgets[i % 3]);
  }
}

TEST_CASE("conv2d mixed precisions: low-precision operands, fp32 outputs and back",
          "[conv][mixed]") {
  random_cases<bf16, bf16, fp32>(6, 30);         // bf16 activations and weights, fp32 output
  random_cases<fp8_e4m3, fp8_e4m3, bf16>(7, 30); // fp8 forward operands, bf16 gradients
  random_cases<fp32, bf16, fp8_e5m2>(8, 30);     // e5m2 gradients (the usual fp8 training split)
}
