// conv2d_forward, conv2d_backward_data and conv2d_backward_weight (+ bias) in fp32 against the
// direct double-precision reference (tests/support/reference_conv.hpp) on random shapes, on every
// enabled execution space, with three workspace budgets (conv_passes.hpp): the default (several
// small images per tile: gather / scatter paths), 4 KiB (about one image or a few rows per tile)
// and 1 byte (one output row per tile: the accumulating col2im and beta = 1 paths). The other
// precisions: test_conv2d_lowp.cpp. Tolerances: conv_testing.hpp.
#include "conv_passes.hpp"
#include "support/exec_spaces.hpp"

#include <tessera/tensor/host_mirror.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

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

TEST_CASE("depthwise conv2d fp32: runs of 64 columns, padding, dilation and strides",
          "[conv][fp32][depthwise]") {
  // The host forms of the direct kernels (conv/detail/direct_host.hpp) and, for column stride 2
  // and a reach past 64 columns, the portable ones, on every enabled execution space.
  int i = 0;
  for (const conv_shape& s : depthwise_shapes(61, 40)) {
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, s, 6100 + i, budgets[0]);
    using first_space = std::tuple_element_t<0, default_memory_exec_spaces>;
    if constexpr (!std::is_same_v<first_space, Kokkos::DefaultExecutionSpace>)
      if (i % 3 == 0) check_all_passes<fp32, fp32, fp32>(first_space{}, s, 6100 + i, budgets[0]);
    ++i;
  }
}

TEST_CASE("depthwise conv2d fp32 with Inf and NaN: only true pairs are multiplied",
          "[conv][fp32][depthwise]") {
  check_depthwise_nonfinite<fp32>();
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

#if !TESSERA_DEVICE_PASS
TEST_CASE("conv2d fp32 direct implicit paths: padded bands, per-row and linear slots, dot "
          "products for backward-weight",
          "[conv][fp32][implicit]") {
  namespace ic = detail::implicit_conv;
  int i = 0;
  for (const direct_layer& l : direct_layers()) {
    INFO(describe(l.s));
    const auto pb = problem_of(l.s);
    const auto fg = detail::forward_geometry(pb, 1.f);
    // The expected paths are those of the AVX-512 tile (14 pixel rows: the slot layouts and
    // their waste depend on it); builds with another tile run the numerical checks only.
    if constexpr (ic::MR == 14) {
      const bool fwd_implicit = detail::use_implicit(pb, pb.Kg, pb.crs());
      CHECK((fwd_implicit && ic::direct_layout_for(fg).ok) == l.fwd_direct);
      if (l.s.prm.stride_h == 1 && l.s.prm.stride_w == 1) {
        const bool data_implicit = detail::use_implicit(pb, pb.Cg, detail::crs_of(pb, pb.Kg));
        CHECK((data_implicit &&
               ic::direct_layout_for(detail::backward_data_geometry(pb, 1.f)).ok) == l.data_direct);
      }
    }
    for (const index_t threads : {1, 2, 3}) {
      const auto wl = ic::weight_direct_layout_for(fg, threads);
      CHECK(wl.ok == l.weight_direct);
      CHECK(wl.klanes == l.weight_lanes);
    }
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, l.s, 9500 + i, budgets[0]);
    if (i % 3 == 0) // a bf16 output: the store's rounding on contiguous rows
      check_all_passes<fp32, fp32, bf16>(Kokkos::DefaultExecutionSpace{}, l.s, 9600 + i,
                                         budgets[0]);
    ++i;
  }
}

TEST_CASE("conv2d fp32 narrow forward (reduction under 64, stride 1): vectors along output rows",
          "[conv][fp32][implicit]") {
  // First layers (1-3 input channels per group): rows longer and shorter than a column block
  // (2 vectors), several channel blocks and a partial one, groups, dilation, padding up to 2,
  // 1 x 1 with padding, and a tall wide image split into bands.
  namespace nc = detail::narrow_conv;
  std::mt19937_64 rng(31);
  const auto in = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(rng);
  };
  std::vector<conv_shape> shapes;
  for (int i = 0; i < 24; ++i) {
    conv_shape s;
    s.N = in(1, 4);
    s.prm.groups = in(1, 2);
    s.C = s.prm.groups * in(1, 3);
    s.K = s.prm.groups * in(8, 40);
    s.R = in(1, 3), s.S = in(1, 3);
    s.prm.dilation_h = s.prm.dilation_w = in(1, 2);
    s.prm.pad_top = s.prm.pad_bottom = in(0, 2);
    s.prm.pad_left = s.prm.pad_right = in(0, 2);
    if (s.R == 1 && s.S == 1) s.prm.pad_left = s.prm.pad_right = 1; // not pointwise
    s.H = in((s.R - 1) * s.prm.dilation_h + 1, 20);
    s.W = in((s.S - 1) * s.prm.dilation_w + 1, 70);
    shapes.push_back(s);
  }
  conv_shape tall;
  tall.N = 1, tall.C = 3, tall.K = 16, tall.H = 64, tall.W = 130, tall.R = tall.S = 3;
  tall.prm = {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  shapes.push_back(tall);
  int i = 0;
  for (const conv_shape& s : shapes) {
    INFO(describe(s));
    const auto d = nc::layout_for(detail::forward_geometry(problem_of(s), 1.f));
    CHECK(d.ok == (detail::hostgemm::have_simd && s.Kg() >= 8));
    if (&s == &shapes.back()) CHECK(d.bands > 1);
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, s, 9800 + i, budgets[0]);
    if (i % 4 == 0) // a bf16 output
      check_all_passes<fp32, fp32, bf16>(Kokkos::DefaultExecutionSpace{}, s, 9900 + i, budgets[0]);
    ++i;
  }
}

TEST_CASE("conv2d_backward_weight fp32: three adjacent taps cut from two loads (3-wide kernel "
          "rows)",
          "[conv][fp32][implicit]") {
  // weight_block_runs serves register blocks of two runs of three adjacent taps (a 3-wide
  // kernel row, dilation 1) over linear runs; a last block of one run (odd input channels),
  // taller kernels, 16-column rows (aligned loads), other widths (split loads and a masked
  // tail) and a dilated kernel (not runs) must all give the reference's dW.
  const auto shape = [](index_t N, index_t C, index_t K, index_t H, index_t W, index_t R,
                        conv2d_params prm) {
    conv_shape s;
    s.N = N, s.C = C, s.K = K, s.H = H, s.W = W, s.R = R, s.S = 3, s.prm = prm;
    return s;
  };
  const conv2d_params pad1{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const conv_shape shapes[] = {
      shape(6, 5, 16, 12, 12, 3, pad1),  // reduction 45: the last block holds one run
      shape(4, 32, 64, 14, 14, 3, pad1), // rows of 16 columns: aligned loads, no tail
      shape(3, 7, 24, 20, 17, 5, pad1),  // 5 x 3 kernel, rows of 17: a tail in every run
      shape(5, 9, 8, 9, 30, 1, pad1),    // 1 x 3 kernel
      shape(4, 12, 16, 16, 16, 3,
            {.pad_top = 2,
             .pad_bottom = 2,
             .pad_left = 2,
             .pad_right = 2,
             .dilation_h = 2,
             .dilation_w = 2}), // dilated: adjacent taps are 2 apart, the plain blocks
  };
  int i = 0;
  for (const conv_shape& s : shapes) {
    INFO(describe(s));
#if defined(__AVX512F__)
    const auto fg = detail::forward_geometry(problem_of(s), 1.f);
    CHECK(detail::implicit_conv::weight_direct_layout_for(fg, 1).ok);
#endif
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, s, 9700 + i++, budgets[0]);
  }
}

TEST_CASE("conv2d_backward_weight fp32 of 1 x 1 layers: channels along the lanes, x in place",
          "[conv][fp32][implicit]") {
  // A 1 x 1 layer's taps are its input channels: register blocks of 4 x 6, 3 x 8, 2 x 12 and
  // 1 x 12 (channel vectors x taps; a reduction of 32 or more), the last block of taps short (runs
  // repeating the last tap, not added). Fewer input than output channels (a multiple of 16)
  // transpose x rather than dy and keep the sums output-channel major; without padding x is read
  // where it lies. Odd pixel counts (the transposes' scalar tails), several images per unit,
  // several bands of one image, groups, padding (x copied into bands), and a reduction under 32
  // (dot products along rows, x in place) must all give the reference's dW.
  const pointwise_layer layers[] = {
      {pointwise_shape(3, 32, 64, 9, 7), true},   // x transposed; 2 x 12 blocks, the last of 4 taps
      {pointwise_shape(2, 48, 80, 5, 11), true},  // 3 x 8 blocks, 10 of them
      {pointwise_shape(2, 64, 272, 6, 6), true},  // 4 x 6 blocks, the last of 2 taps
      {pointwise_shape(2, 80, 48, 6, 10), true},  // dy transposed: 3 x 8 blocks over 80 taps
      {pointwise_shape(3, 64, 64, 5, 5), true},   // as many channels in as out: dy transposed
      {pointwise_shape(2, 96, 16, 7, 9), true},   // one vector of output channels, 1 x 12 blocks
      {pointwise_shape(23, 32, 64, 3, 3), true},  // many small images per unit
      {pointwise_shape(1, 32, 64, 40, 40), true}, // one image in several bands
      {pointwise_shape(2, 32, 64, 6, 6,
                       {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1}),
       true}, // padding: x copied into bands, dy transposed
      {pointwise_shape(2, 64, 128, 7, 7, {.groups = 2}), true}, // 32 -> 64 channels per group
      {pointwise_shape(4, 16, 64, 16, 16), false}, // a reduction of 16: dot products, x in place
      {pointwise_shape(3, 40, 40, 16, 16), false}, // 40 outputs: dot products, x in place
  };
  int i = 0;
  for (const pointwise_layer& l : layers) {
    INFO(describe(l.s));
#if defined(__AVX512F__)
    const auto pb = problem_of(l.s);
    const auto fg = detail::forward_geometry(pb, 1.f);
    for (const index_t threads : {1, 2}) {
      const auto wl = detail::implicit_conv::weight_direct_layout_for(fg, threads);
      CHECK(wl.ok);
      CHECK(wl.klanes == l.lanes);
    }
#endif
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, l.s, 9750 + i, budgets[0]);
    if (i % 4 == 0) // the first host space as well (Serial where enabled): one unit at a time
      check_all_passes<fp32, fp32, fp32>(std::tuple_element_t<0, default_memory_exec_spaces>{}, l.s,
                                         9770 + i, budgets[0]);
    ++i;
  }
  // Inf and NaN in x: every form multiplies true pairs only.
  check_dw_with_nonfinite_x<fp32>(pointwise_shape(4, 32, 64, 9, 9), 3);
  check_dw_with_nonfinite_x<fp32>(pointwise_shape(4, 64, 32, 9, 9), 3);
}

TEST_CASE("conv2d_backward_weight fp32 with Inf and NaN in x: only true pairs are multiplied",
          "[conv][fp32][implicit]") {
  // The dot products run over each band's padded rows, whose extra columns meet zeros of dy
  // there; an Inf in x at a row's end would turn such a 0 into NaN, where the true sum has no
  // such term. A band holding Inf or NaN is run row by row instead: every dW entry must be what
  // the reference gives, finite where it is finite, NaN where it is NaN, Inf of its sign.
  conv_shape s;
  s.N = 6, s.C = 16, s.K = 32, s.H = 14, s.W = 14, s.R = 3, s.S = 3;
  s.prm = {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  check_dw_with_nonfinite_x<fp32>(s, 4);
}
#endif
