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
namespace {
// The problem of shape s, as conv2d builds it (for the implicit paths' layout choices).
detail::conv2d_problem problem_of(const conv_shape& s) {
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
} // namespace

TEST_CASE("conv2d fp32 direct implicit paths: padded bands, per-row and linear slots, dot "
          "products for backward-weight",
          "[conv][fp32][implicit]") {
  namespace ic = detail::implicit_conv;
  struct layer {
    conv_shape s;
    bool fwd_direct, data_direct, weight_direct; // which direct paths the layer must take
  };
  const auto shape = [](index_t N, index_t C, index_t K, index_t H, index_t W, index_t R, index_t S,
                        conv2d_params prm) {
    conv_shape s;
    s.N = N, s.C = C, s.K = K, s.H = H, s.W = W, s.R = R, s.S = S, s.prm = prm;
    return s;
  };
  const conv2d_params pad1{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const bool avx512 =
#if defined(__AVX512F__)
      true;
#else
      false;
#endif
  const layer layers[] = {
      // FashionCNN's second layer: 14 output columns, one panel a row.
      {shape(5, 32, 64, 14, 14, 3, 3, pad1), true, true, avx512},
      // 28 columns, several bands (8 rows each, the last 6), 40 channels (a partial panel).
      {shape(2, 24, 40, 30, 28, 3, 3, pad1), true, true, avx512},
      // Reduction 64 * 9 = 576: two KC slices of the packed weights.
      {shape(4, 64, 48, 14, 14, 3, 3, pad1), true, true, avx512},
      // 10 columns: linear slots (12 a row: 2 garbage slots per row).
      {shape(6, 20, 32, 10, 10, 3, 3, pad1), true, true, avx512},
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
       true, true, avx512},
      // Two groups of 24 -> 32 channels.
      {shape(4, 48, 64, 14, 14, 3, 3,
             {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 2}),
       true, true, avx512},
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
      // Backward-weight's dot products need 48 vector steps per register block: two images
      // of 14 x 14 (28) take run_weight's gathers and transposes.
      {shape(2, 32, 32, 14, 14, 3, 3, pad1), true, true, false},
  };
  int i = 0;
  for (const layer& l : layers) {
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
    for (const index_t threads : {1, 2, 3})
      CHECK(ic::weight_direct_layout_for(fg, threads).ok == l.weight_direct);
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, l.s, 9500 + i, budgets[0]);
    if (i % 3 == 0) // a bf16 output: the store's rounding on contiguous rows
      check_all_passes<fp32, fp32, bf16>(Kokkos::DefaultExecutionSpace{}, l.s, 9600 + i,
                                         budgets[0]);
    ++i;
  }
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
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    INFO("x holds " << bad);
    auto x = random_tensor<fp32>(77, s.N, s.C, s.H, s.W);
    auto dy = random_tensor<fp32>(78, s.N, s.K, s.P(), s.Q());
    auto xh = host_mirror_copy(x);
    xh(2, 5, 7, s.W - 1) = bad; // the last column: the dot products' extra columns reach it
    xh(4, 9, 0, 0) = bad;
    copy_from_host(x, xh);
    tensor4<fp32> dw("dw", s.K, s.C, s.R, s.S);
    conv2d_workspace<> ws;
    conv2d_backward_weight(Kokkos::DefaultExecutionSpace{}, x, dy, dw, s.prm, ws);
    const auto ref = reference_conv2d_backward_weight(s, to_doubles(x), to_doubles(dy));
    const auto got = to_doubles(dw);
    int finite = 0, nonfinite = 0;
    for (std::size_t e = 0; e < got.size(); ++e) {
      const double r = ref.value[e], v = got[e];
      if (std::isfinite(r)) {
        ++finite;
        REQUIRE(std::abs(v - r) <= error_bound<fp32>(r, ref.abs[e], s.N * s.P() * s.Q() + 2));
      } else {
        ++nonfinite;
        REQUIRE(std::isnan(v) == std::isnan(r));
        if (!std::isnan(r)) REQUIRE(v == r);
      }
    }
    CHECK(finite > 0);
    CHECK(nonfinite > 0);
  }
}
#endif
