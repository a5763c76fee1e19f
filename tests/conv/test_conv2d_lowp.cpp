// conv2d_forward, conv2d_backward_data and conv2d_backward_weight (+ bias) in bf16, fp8, fp16 and
// mixed precisions against the direct double-precision reference on random shapes, with the three
// workspace budgets of test_conv2d.cpp (conv_passes.hpp). A program of its own so that the fp32
// one, which the portability builds compile for every Kokkos and compiler, stays small.
#include "conv_passes.hpp"

#include <tessera/tensor/host_mirror.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

TEST_CASE("conv2d bf16: all passes match the reference on random shapes", "[conv][bf16]") {
  random_cases<bf16, bf16, bf16>(3, 60);
}

TEST_CASE("conv2d fp8: all passes match the reference on random shapes", "[conv][fp8]") {
  random_cases<fp8_e4m3, fp8_e4m3, fp8_e4m3>(4, 40);
  random_cases<fp8_e5m2, fp8_e5m2, fp8_e5m2>(5, 40);
}

TEST_CASE("depthwise conv2d bf16, fp8 and mixed: runs of 64 columns, padding, dilation",
          "[conv][depthwise]") {
  // The host forms of the direct kernels widen bf16 and fp8 rows with convert_n and round the
  // outputs with it (conv/detail/direct_host.hpp).
  int i = 0;
  for (const conv_shape& s : depthwise_shapes(62, 24)) {
    const std::uint64_t seed = 6200 + static_cast<std::uint64_t>(4 * i);
    check_all_passes<bf16, bf16, bf16>(Kokkos::DefaultExecutionSpace{}, s, seed, budgets[0]);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(Kokkos::DefaultExecutionSpace{}, s, seed + 1,
                                                   budgets[0]);
    if (i % 2 == 0)
      check_all_passes<fp32, bf16, fp8_e4m3>(Kokkos::DefaultExecutionSpace{}, s, seed + 2,
                                             budgets[0]);
    ++i;
  }
}

TEST_CASE("depthwise conv2d bf16 and fp8 with Inf and NaN: only true pairs are multiplied",
          "[conv][depthwise]") {
  check_depthwise_nonfinite<bf16>();
  check_depthwise_nonfinite<fp8_e5m2>(); // e4m3 has no infinity
}

TEST_CASE("conv2d fp16: all passes match the reference on random shapes", "[conv][fp16]") {
  random_cases<fp16, fp16, fp16>(11, 60);
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

TEST_CASE("conv2d_backward_weight of first layers in bf16, fp8 and fp16: widened band by band",
          "[conv][bf16][fp8][implicit]") {
  // A reduction under 16 with stride 1 on AVX-512: the dot products along rows in fp32, each
  // unit widening its band of x and its rows of dy as it copies them (run_weight_direct<true>);
  // rows with padded columns run one by one, their tails masked, rows without (S = 1, no
  // horizontal padding) as one linear run. Mixed precisions widen only what is not fp32.
  namespace ic = detail::implicit_conv;
  using exec = Kokkos::DefaultExecutionSpace;
  constexpr auto shape = make_shape;
  const conv2d_params pad1{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  conv2d_params dilated = pad1;
  dilated.pad_top = dilated.pad_right = 2, dilated.dilation_h = dilated.dilation_w = 2;
  const std::vector<conv_shape> shapes = {
      shape(4, 1, 32, 28, 28, 3, 3, pad1), // FashionCNN's first layer
      shape(3, 2, 17, 23, 31, 2, 3, {.pad_top = 1, .pad_left = 2, .pad_right = 0}),
      shape(5, 1, 16, 9, 40, 3, 1, {.pad_top = 1, .pad_bottom = 1}), // rows without padding
      shape(2, 2, 34, 20, 19, 3, 3,
            {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 2}),
      shape(3, 1, 20, 17, 70, 3, 3, dilated), // asymmetric padding, dilation 2
  };
  int i = 0;
  for (const conv_shape& s : shapes) {
    INFO(describe(s));
#if defined(__AVX512F__)
    const auto g = detail::forward_geometry(problem_of(s), 1.f);
    CHECK(ic::weight_direct_layout_for(g, exec{}.concurrency(), false, true).ok);
#endif
    const std::uint64_t seed = 9800 + static_cast<std::uint64_t>(10 * i);
    check_all_passes<bf16, bf16, bf16>(exec{}, s, seed, budgets[0]);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(exec{}, s, seed + 1, budgets[0]);
    check_all_passes<fp8_e5m2, bf16, fp8_e4m3>(exec{}, s, seed + 2, budgets[0]);
    check_all_passes<fp16, fp16, fp16>(exec{}, s, seed + 3, budgets[0]);
    check_all_passes<fp32, fp32, bf16>(exec{}, s, seed + 4, budgets[0]); // fp32 x, bf16 dy
    check_all_passes<bf16, fp32, fp32>(exec{}, s, seed + 5, budgets[0]); // bf16 x, fp32 dy
    ++i;
  }
  // Inf and NaN in x (at a row's last column: the padded column past it meets zeros of no
  // true pair) and in dy (inside: every tap meets a true value): only true pairs are
  // multiplied. (A non-finite dy at a border meets the padding's zeros; there every path, the
  // GEMM's im2col columns too, multiplies it by them.)
  const conv_shape s = shapes[0];
  const auto nonfinite = [&]<class P>(P, float bad) {
    INFO("x and dy in " << precision_traits<P>::name << " hold " << bad);
    auto x = random_tensor<P>(31, s.N, s.C, s.H, s.W);
    auto dy = random_tensor<P>(32, s.N, s.K, s.P(), s.Q());
    auto xh = host_mirror_copy(x);
    auto dyh = host_mirror_copy(dy);
    xh(1, 0, 5, s.W - 1) = from_float<P>(bad);
    dyh(2, 7, 6, 9) = from_float<P>(bad);
    copy_from_host(x, xh);
    copy_from_host(dy, dyh);
    tensor4<fp32> dw("dw", s.K, s.C, s.R, s.S);
    conv2d_workspace<> ws;
    conv2d_backward_weight(exec{}, x, dy, dw, s.prm, ws);
    check_kind_by_kind("backward_weight", to_doubles(dw),
                       reference_conv2d_backward_weight(s, to_doubles(x), to_doubles(dy)),
                       s.N * s.P() * s.Q() + 2);
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()})
    nonfinite(bf16{}, bad);
  nonfinite(fp8_e5m2{}, std::numeric_limits<float>::quiet_NaN());
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

TEST_CASE("conv2d mixed precisions: low-precision operands, fp32 outputs and back",
          "[conv][mixed]") {
  random_cases<bf16, bf16, fp32>(6, 30);         // bf16 activations and weights, fp32 output
  random_cases<fp8_e4m3, fp8_e4m3, bf16>(7, 30); // fp8 forward operands, bf16 gradients
  random_cases<fp32, bf16, fp8_e5m2>(8, 30);     // e5m2 gradients (the usual fp8 training split)
}

#if !TESSERA_DEVICE_PASS
namespace {
/// True where the host's direct paths of operands exact in bf16 run on AMX tiles (the build
/// targets AMX and this CPU and OS let the process use it).
bool amx_tiles_here() {
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
  return detail::implicit_conv::pairs_amx_cpu();
#else
  return false;
#endif
}
} // namespace

TEST_CASE("conv2d bf16 and fp8 direct paths: channel pairs in the padded band",
          "[conv][bf16][fp8][implicit]") {
  // Operands exact in bf16 take the direct path's bf16 pairs form (VDPBF16PS on pairs of input
  // channels) on CPUs with AVX512_BF16 and no AMX, for the layouts the fp32 direct path takes;
  // elsewhere im2col and the GEMM (builds without AVX512_BF16: the fp32 implicit paths on the
  // widened values, see the last test case). All must match the reference.
  namespace ic = detail::implicit_conv;
  using exec = Kokkos::DefaultExecutionSpace;
  const bool amx = amx_tiles_here();
  const bool pairs = detail::implicit_pairs_capable_v<exec, bf16, bf16> && !amx &&
                     cpu::has_avx512bf16() && ic::MR == 14;
  if (!pairs) WARN("no bf16 pairs path on this build and CPU: numerical checks only");
  std::vector<direct_layer> layers = direct_layers();
  const auto shape = [](index_t N, index_t C, index_t K, index_t H, index_t W, conv2d_params prm) {
    conv_shape s;
    s.N = N, s.C = C, s.K = K, s.H = H, s.W = W, s.R = 3, s.S = 3, s.prm = prm;
    return s;
  };
  const conv2d_params pad1{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  // Odd channel counts (the last pair's high half is zero), per group too, and a reduction of
  // 120 / 2 * 9 = 540 pair steps: two KC slices of packed pairs.
  layers.push_back({shape(3, 17, 32, 14, 14, pad1), true, true, false});
  layers.push_back(
      {shape(2, 34, 64, 14, 14,
             {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 2}),
       true, true, false});
  layers.push_back({shape(2, 120, 33, 10, 10, pad1), true, true, false});
  // Backward-weight's bf16 dot products (32 columns a vector) need a reduction of 32 and 48
  // vector steps per register block before the threads split the images: of the shared layers
  // only 2 images of 30 x 30 padded columns (28 steps each) and the image of 40 x 40 (42
  // columns, 20-row bands) have them; 16 images of 14 x 14
  // (7 steps each, blocks of 14 images) do; a first layer (reduction 9: widened to fp32) not.
  const std::size_t shared = layers.size();
  layers.push_back({shape(16, 32, 64, 14, 14, pad1), true, true, true});
  layers.push_back({shape(16, 1, 32, 14, 14, pad1), false, false, false});
  const auto weight_pairs = [&](std::size_t li) {
    return li < shared ? li == 1 || layers[li].s.H == 40 : layers[li].weight_direct;
  };
  int i = 0;
  for (const direct_layer& l : layers) {
    INFO(describe(l.s));
    const bool wp =
        ic::weight_direct_layout_for(detail::forward_geometry(problem_of(l.s), 1.f),
                                     Kokkos::DefaultExecutionSpace{}.concurrency(), true)
            .ok;
    if (pairs) CHECK(wp == weight_pairs(static_cast<std::size_t>(i)));
    const auto pb = problem_of(l.s);
    const auto fg = detail::forward_geometry(pb, 1.f);
    const bool fwd = detail::use_implicit(pb, pb.Kg, pb.crs()) && ic::pairs_direct_for(fg);
    if (pairs) CHECK(fwd == l.fwd_direct); // the CPU-side choice; off for device spaces
    if (l.s.prm.stride_h == 1 && l.s.prm.stride_w == 1) {
      const bool data = detail::use_implicit(pb, pb.Cg, detail::crs_of(pb, pb.Kg)) &&
                        ic::pairs_direct_for(detail::backward_data_geometry(pb, 1.f));
      if (pairs) CHECK(data == l.data_direct);
    }
    const std::uint64_t seed = 9700 + static_cast<std::uint64_t>(i);
    check_all_passes<bf16, bf16, bf16>(exec{}, l.s, seed, budgets[0]);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(exec{}, l.s, seed, budgets[0]);
    if (i % 3 == 0) { // mixed: bf16 x with e5m2 weights, an fp32 output; e4m3 x, bf16 weights
      check_all_passes<bf16, fp8_e5m2, fp32>(exec{}, l.s, seed, budgets[0]);
      check_all_passes<fp8_e4m3, bf16, bf16>(exec{}, l.s, seed, budgets[0]);
    }
    ++i;
  }
}
#endif

#if !TESSERA_DEVICE_PASS
TEST_CASE("conv2d bf16 and fp8 stems: few input channels, strides 1-3 (AMX segments)",
          "[conv][bf16][fp8][implicit][amx]") {
  // On a CPU with usable AMX the forward pass of these layers takes the segments form of the
  // direct path (each output pixel's reduction built as rows of 8-tap input segments); the
  // other passes and other CPUs take their own paths. All must match the reference.
  namespace ic = detail::implicit_conv;
  using exec = Kokkos::DefaultExecutionSpace;
  const bool amx = amx_tiles_here();
  if (!amx) WARN("no usable AMX on this build and CPU: the segments form is not run");
  const auto shape = [](index_t N, index_t C, index_t K, index_t H, index_t W, index_t R,
                        index_t stride, index_t pad) {
    conv_shape s;
    s.N = N, s.C = C, s.K = K, s.H = H, s.W = W, s.R = R, s.S = R;
    s.prm = {.stride_h = stride,
             .stride_w = stride,
             .pad_top = pad,
             .pad_bottom = pad,
             .pad_left = pad,
             .pad_right = pad};
    return s;
  };
  const conv_shape stems[] = {
      shape(2, 3, 32, 29, 27, 7, 2, 3), // a ResNet stem on odd sizes
      shape(1, 3, 48, 40, 40, 7, 2, 3), // 20 x 20 outputs: two bands of 10 rows
      shape(3, 3, 16, 17, 21, 5, 1, 2), // 5 x 5 stride 1: 15 segments in 4 steps
      shape(2, 2, 24, 22, 25, 7, 3, 1), // stride 3, 14 segments
  };
  int i = 0;
  for (const conv_shape& s : stems) {
    INFO(describe(s));
    const auto pb = problem_of(s);
    const auto g = detail::forward_geometry(pb, 1.f);
    const auto d = ic::pairs_layout_for(g);
    // Backward-weight of the 7 x 7 stride-2 stems: the stride-1 pass over x's phases on AMX
    // tiles (conv/detail/phases.hpp); the stride-3 one has too many phase taps (im2col + GEMM).
    const auto ps = ic::phase_split_for(g);
    CHECK(ps.ok == (s.prm.stride_h == 2));
    if (amx) {
      CHECK(detail::use_implicit(pb, pb.Kg, pb.crs()));
      CHECK((d.ok && d.seg));
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
      if (ps.ok) CHECK(ic::weight_amx_layout_for(ps.g, exec{}.concurrency()).ok);
#endif
    }
    const std::uint64_t seed = 9900 + static_cast<std::uint64_t>(i);
    check_all_passes<bf16, bf16, bf16>(exec{}, s, seed, budgets[i % 3]);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(exec{}, s, seed, budgets[i % 3]);
    check_all_passes<fp8_e5m2, bf16, fp32>(exec{}, s, seed, budgets[0]);
    ++i;
  }
  // The phase copy in chunks of images within the workspace's column budget: 3 images of 5,040
  // bytes of phases each, in chunks of 1 (budget 1 byte) and of 2 + 1 (10,080 bytes), their sums
  // added per tap.
  const conv_shape three = shape(3, 3, 32, 29, 27, 7, 2, 3);
  for (const std::size_t budget : {std::size_t{1}, std::size_t{10080}}) {
    INFO("column budget " << budget);
    const auto ps = ic::phase_split_for(detail::forward_geometry(problem_of(three), 1.f));
    CHECK(ps.ns() * 2 == 5040);
    check_all_passes<bf16, bf16, bf16>(exec{}, three, 9950, budget);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(exec{}, three, 9951, budget);
  }
  // Inf and NaN in x of a stem split into phases: the sums they reach are Inf or NaN as in the
  // reference, the others finite (the AMX bands holding them take exact loops).
  conv_shape stem = shape(3, 10, 32, 29, 27, 7, 2, 3);
  CHECK(ic::phase_split_for(detail::forward_geometry(problem_of(stem), 1.f)).ok);
  check_dw_with_nonfinite_x<bf16>(stem, 1);
}
#endif

#if !TESSERA_DEVICE_PASS
TEST_CASE("conv2d_backward_weight bf16 and fp8: output channels along the lanes, pairs of grid "
          "positions",
          "[conv][bf16][fp8][implicit]") {
  namespace ic = detail::implicit_conv;
  using exec = Kokkos::DefaultExecutionSpace;
  const conv2d_params pad1{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const auto shape = [&](index_t N, index_t C, index_t K, index_t H, index_t W) {
    conv_shape s;
    s.N = N, s.C = C, s.K = K, s.H = H, s.W = W, s.R = 3, s.S = 3, s.prm = pad1;
    return s;
  };
  const conv_shape shapes[] = {
      shape(16, 32, 48, 13, 13), // 13 x 15 grid positions: the last pair's second half past it
      shape(16, 24, 80, 11, 11), // blocks of 4 channel vectors and of 1; 72 taps: 24 runs
      shape(12, 16, 16, 15, 15), // one vector of channels, blocks of 4 runs (48 runs)
  };
  int i = 0;
  for (const conv_shape& s : shapes) {
    INFO(describe(s));
    if (ic::pairs_cpu()) {
      const auto wl = ic::weight_direct_layout_for(detail::forward_geometry(problem_of(s), 1.f),
                                                   exec{}.concurrency(), true);
      CHECK(wl.ok);
      CHECK(wl.klanes);
    }
    check_all_passes<bf16, bf16, bf16>(exec{}, s, 9900 + i, budgets[0]);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(exec{}, s, 9950 + i, budgets[0]);
    ++i;
  }
}

TEST_CASE("conv2d_backward_weight bf16 and fp8 of 1 x 1 layers: input channels along the lanes",
          "[conv][bf16][fp8][implicit]") {
  // Fewer input than output channels (32 or more, a multiple of 16): x's band (rows made even,
  // so that every channel starts on a whole pair) is transposed by pairs of positions, dy's
  // pairs are broadcast from its grid, and the sums are output-channel major; a band holding
  // Inf or NaN runs the dot products along rows into the same sums. Odd widths, several
  // images per unit, several bands, groups, padding and the blocks of 2, 3 and 4 channel
  // vectors (the last block of output channels short); as many channels in as out keeps the
  // dot products. (Small images come in batches that give the dot products' 48 vector steps
  // per register block, which the layout asks of every bf16 form.)
  namespace ic = detail::implicit_conv;
  using exec = Kokkos::DefaultExecutionSpace;
  const pointwise_layer layers[] = {
      {pointwise_shape(16, 32, 64, 9, 7), true},  // rows of 7 made 8; 2 x 12 blocks, the last of 4
      {pointwise_shape(24, 48, 80, 5, 11), true}, // 3 x 8 blocks
      {pointwise_shape(24, 64, 272, 6, 6), true}, // 4 x 6 blocks, the last of 2 output channels
      {pointwise_shape(48, 32, 64, 3, 3), true},  // many small images per unit
      {pointwise_shape(1, 32, 64, 40, 40), true}, // one image in several bands
      {pointwise_shape(24, 32, 64, 6, 6,
                       {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1}),
       true},
      {pointwise_shape(24, 64, 128, 7, 7, {.groups = 2}), true}, // 32 -> 64 channels per group
      {pointwise_shape(4, 64, 64, 28, 28), false},               // as many in as out: dot products
  };
  int i = 0;
  for (const pointwise_layer& l : layers) {
    INFO(describe(l.s));
    if (ic::pairs_cpu()) {
      const auto wl = ic::weight_direct_layout_for(detail::forward_geometry(problem_of(l.s), 1.f),
                                                   exec{}.concurrency(), true);
      CHECK(wl.ok);
      CHECK(wl.klanes == l.lanes);
    }
    check_all_passes<bf16, bf16, bf16>(exec{}, l.s, 9300 + i, budgets[0]);
    check_all_passes<fp8_e4m3, fp8_e4m3, fp8_e5m2>(exec{}, l.s, 9350 + i, budgets[0]);
    ++i;
  }
  // Inf and NaN in x: the units whose bands hold them take the dot products along rows, the
  // others x's pairs along the lanes, into the same sums.
  const conv_shape bad = pointwise_shape(16, 32, 64, 9, 9);
  if (ic::pairs_cpu())
    CHECK(ic::weight_direct_layout_for(detail::forward_geometry(problem_of(bad), 1.f),
                                       exec{}.concurrency(), true)
              .klanes);
  check_dw_with_nonfinite_x<bf16>(bad, 3);
}

TEST_CASE("conv2d_backward_weight bf16 with Inf and NaN in x: only true pairs are multiplied",
          "[conv][bf16][implicit]") {
  // As the fp32 case (test_conv2d.cpp): the bf16 dot products run over padded rows whose extra
  // columns meet zeros of dy; a band holding Inf or NaN runs row by row with masked tails (the
  // others with the channels along the lanes: both forms in one call).
  conv_shape s;
  s.N = 16, s.C = 16, s.K = 32, s.H = 14, s.W = 14, s.R = 3, s.S = 3;
  s.prm = {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  // On AMX: dW^T tiles over the band's grid (conv/detail/amx_weight.hpp), whose garbage slots
  // meet zeros of dy; a band holding Inf or NaN takes exact loops.
  namespace ic = detail::implicit_conv;
  const auto g = detail::forward_geometry(problem_of(s), 1.f);
  const index_t threads = Kokkos::DefaultExecutionSpace{}.concurrency();
  bool fast = ic::pairs_cpu() && ic::weight_direct_layout_for(g, threads, true).ok;
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
  if (ic::pairs_amx_cpu()) fast = ic::weight_amx_layout_for(g, threads).ok;
#endif
  if (!fast)
    WARN("no bf16 dot products or AMX tiles on this build and CPU: the GEMM path is checked");
  check_dw_with_nonfinite_x<bf16>(s, 9);
}
#endif

namespace {
/// Forward (and, stride 1, backward-data) of PX x / PW w (PY dy) with fp32 outputs against the
/// same passes of their values widened to fp32. Where conv2d widens such operands on the fp32
/// implicit paths (implicit_widened_v: a build without a bf16 dot product) both run the same
/// kernel over the same values in the same order, so the results are equal bit for bit; on
/// other builds (im2col + the low-precision GEMM, or the bf16 pairs forms) the reference bound.
template <class PX, class PW, class PY>
void check_widened_like_fp32(const conv_shape& s, std::uint64_t seed) {
  using exec = Kokkos::DefaultExecutionSpace;
  constexpr bool widened = detail::implicit_widened_v<exec, PX, PW>;
  INFO(describe(s) << ", x " << precision_traits<PX>::name << " w " << precision_traits<PW>::name
                   << " dy " << precision_traits<PY>::name << (widened ? ", widened" : ""));
  conv2d_workspace<> ws;
  const auto x = random_tensor<PX>(seed, s.N, s.C, s.H, s.W);
  const auto w = random_tensor<PW>(seed + 1, s.K, s.Cg(), s.R, s.S);
  const auto dy = random_tensor<PY>(seed + 2, s.N, s.K, s.P(), s.Q());
  const auto xf = cast<fp32>(x), wf = cast<fp32>(w), dyf = cast<fp32>(dy);
  const auto xd = to_doubles(x), wd = to_doubles(w), dyd = to_doubles(dy);
  const auto same = [&](const char* what, const tensor4<fp32>& got, const tensor4<fp32>& f32,
                        const reference_result& ref, index_t L) {
    require_within_bound(what, got, ref, L);
    if constexpr (widened) {
      const auto a = to_doubles(got), b = to_doubles(f32);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i] ? 1 : 0;
      INFO(what << ": " << differ << " of " << a.size() << " differ from the fp32 pass");
      CHECK(differ == 0);
    }
  };
  tensor4<fp32> y("y", s.N, s.K, s.P(), s.Q()), yf("yf", s.N, s.K, s.P(), s.Q());
  conv2d_forward(exec{}, x, w, y, s.prm, ws);
  conv2d_forward(exec{}, xf, wf, yf, s.prm, ws);
  same("forward", y, yf, reference_conv2d_forward(s, xd, wd, {}), s.Cg() * s.R * s.S + 2);
  if (s.prm.stride_h == 1 && s.prm.stride_w == 1) {
    tensor4<fp32> dx("dx", s.N, s.C, s.H, s.W), dxf("dxf", s.N, s.C, s.H, s.W);
    conv2d_backward_data(exec{}, dy, w, dx, s.prm, ws);
    conv2d_backward_data(exec{}, dyf, wf, dxf, s.prm, ws);
    same("backward_data", dx, dxf, reference_conv2d_backward_data(s, dyd, wd),
         s.Kg() * s.R * s.S + 2);
  }
}
} // namespace

TEST_CASE("conv2d low-precision operands widened on the fp32 implicit paths (no bf16 dot)",
          "[conv][bf16][fp8][fp16][implicit]") {
  // Builds without AVX512_BF16 (AVX2, AVX-512 without the bf16 dot) run bf16, fp8 and fp16
  // forward and backward-data on the fp32 direct or packed implicit forms, widening the band
  // or panel as it is filled, instead of im2col + a GEMM that widens the same values.
  const auto shape = [](index_t N, index_t C, index_t K, index_t H, index_t W, index_t R,
                        conv2d_params prm) {
    conv_shape s;
    s.N = N, s.C = C, s.K = K, s.H = H, s.W = W, s.R = R, s.S = R, s.prm = prm;
    return s;
  };
  const conv2d_params pad1{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const std::vector<conv_shape> shapes = {
      shape(2, 32, 32, 14, 14, 3, pad1), // a FashionCNN layer
      shape(1, 64, 64, 28, 28, 3, pad1), // several bands
      shape(3, 17, 33, 9, 10, 5, {.pad_top = 2, .pad_bottom = 1, .pad_left = 0, .pad_right = 2}),
      shape(2, 34, 64, 13, 11, 3, // 2 groups
            {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 2}),
      shape(1, 20, 40, 15, 13, 3, // stride 2
            {.stride_h = 2,
             .stride_w = 2,
             .pad_top = 1,
             .pad_bottom = 1,
             .pad_left = 1,
             .pad_right = 1}),
      shape(1, 24, 24, 15, 15, 3, // dilation 2
            {.pad_top = 2,
             .pad_bottom = 2,
             .pad_left = 2,
             .pad_right = 2,
             .dilation_h = 2,
             .dilation_w = 2}),
      shape(2, 3, 64, 23, 23, 7, // a stem, stride 2
            {.stride_h = 2,
             .stride_w = 2,
             .pad_top = 3,
             .pad_bottom = 3,
             .pad_left = 3,
             .pad_right = 3}),
  };
  std::uint64_t seed = 31000;
  for (const conv_shape& s : shapes) {
    check_widened_like_fp32<bf16, bf16, bf16>(s, seed += 10);
    check_widened_like_fp32<fp8_e4m3, fp8_e4m3, fp8_e5m2>(s, seed += 10);
    check_widened_like_fp32<fp16, fp16, fp16>(s, seed += 10);
    check_widened_like_fp32<bf16, fp8_e5m2, bf16>(s, seed += 10);
  }
}
