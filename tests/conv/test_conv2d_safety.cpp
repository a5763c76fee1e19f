// Issue 12 for the conv2d passes: an output sharing memory with an input it reads (y = x,
// dx = dy, dw inside x, dbias inside dw or dy, a bias inside y) or with itself (batch stride 0)
// is refused before anything is written, while views of one allocation that share no element
// (channel halves of one buffer) are computed right; scaled inputs with invalid scales are
// refused; parameters whose size arithmetic overflows are refused without allocating.
// Every pass runs on the default execution space over tensors (and strided views into them) in
// the default memory space; values are checked through host mirrors, so the test runs on a
// device build of Kokkos too.
#include "conv_testing.hpp"
#include "support/host_access.hpp"
#include "support/messages.hpp"

#include <limits>

using namespace tessera;
using namespace tessera::testing;
using Catch::Matchers::Contains;

namespace {

using exec = Kokkos::DefaultExecutionSpace;
using mem = tensor4<fp32>::memory_space; // the default memory space
using sview4 = TensorView<fp32, dextents<4>, layout_stride, mem>;
using sview1 = TensorView<fp32, dextents<1>, layout_stride, mem>;

/// The values of channels [c0, c0 + C) of an (N, Ctot, H, W) buffer, in NCHW order (read
/// through a host mirror of the whole buffer).
std::vector<double> channel_values(const tensor4<fp32>& buf, index_t c0, index_t C) {
  const auto h = host_mirror_copy(buf);
  std::vector<double> out;
  for (index_t n = 0; n < h.extent(0); ++n)
    for (index_t c = c0; c < c0 + C; ++c)
      for (index_t y = 0; y < h.extent(2); ++y)
        for (index_t x = 0; x < h.extent(3); ++x) out.push_back(h(n, c, y, x));
  return out;
}

/// (N, C, H, W) channels [c0, c0 + C) of an (N, Ctot, H, W) buffer.
sview4 channels(float* buf, index_t N, index_t Ctot, index_t c0, index_t C, index_t H, index_t W) {
  return sview4(buf + c0 * H * W, dextents<4>(N, C, H, W), {Ctot * H * W, H * W, W, 1});
}

conv_shape shape_3x3() {
  conv_shape s;
  s.N = 2, s.C = 16, s.H = 12, s.W = 12, s.K = 16, s.R = 3, s.S = 3; // implicit-GEMM size
  s.prm = {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  return s;
}

} // namespace

TEST_CASE("conv2d passes refuse outputs that overlap their inputs, writing nothing",
          "[conv][safety]") {
  for (const index_t C : {3, 16}) { // the im2col path and the implicit-GEMM path
    conv_shape s = shape_3x3();
    s.C = s.K = C;
    INFO(describe(s));
    auto x = random_tensor<fp32>(1, s.N, s.C, s.H, s.W);
    auto w = random_tensor<fp32>(2, s.K, s.C, s.R, s.S);
    auto b = random_tensor<fp32>(3, s.K);
    auto dy = random_tensor<fp32>(4, s.N, s.K, s.H, s.W); // P, Q == H, W
    auto dw = random_tensor<fp32>(5, s.K, s.C, s.R, s.S);
    auto db = random_tensor<fp32>(6, s.K);
    const auto x0 = bytes_of(x), w0 = bytes_of(w), b0 = bytes_of(b), dy0 = bytes_of(dy),
               dw0 = bytes_of(dw), db0 = bytes_of(db);
    const auto all_same = [&] {
      return same_bytes(x, x0) && same_bytes(w, w0) && same_bytes(b, b0) && same_bytes(dy, dy0) &&
             same_bytes(dw, dw0) && same_bytes(db, db0);
    };
    const std::string xs = "(2, " + std::to_string(C) + ", 12, 12)";

    // y = x: the brief's case (3x3, pad 1, y the same shape as x).
    CHECK_THAT(message_of<shape_error>([&] { conv2d_forward(exec{}, x, w, b, x, s.prm); }),
               Contains("tessera::conv2d_forward") && Contains("y " + xs) && Contains("x " + xs) &&
                   Contains("overlaps"));
    CHECK_THAT(message_of<shape_error>([&] { conv2d_forward(exec{}, x, w, x, s.prm); }),
               Contains("tessera::conv2d_forward"));
    // y starting one image later than x, in x's memory (x = images 0-1 of a 3-image buffer)
    tensor4<fp32> buf("buf", 3, s.C, s.H, s.W);
    const auto y_late = buf.view().slice(1, 3);
    CHECK_THROWS_AS(conv2d_forward(exec{}, buf.view().slice(0, 2), w, y_late, s.prm), shape_error);
    // the bias inside y
    const sview1 b_in_y(dy.data() + 5, dextents<1>(s.K), {1});
    CHECK_THAT(message_of<shape_error>([&] { conv2d_forward(exec{}, x, w, b_in_y, dy, s.prm); }),
               Contains("tessera::conv2d_forward") && Contains("bias"));
    // dx = dy
    CHECK_THAT(message_of<shape_error>([&] { conv2d_backward_data(exec{}, dy, w, dy, s.prm); }),
               Contains("tessera::conv2d_backward_data") && Contains("dx " + xs) &&
                   Contains("dy " + xs));
    // dw in x's memory; dw = w is fine (w is not read by backward-weight) but dw in dy is not
    const sview4 dw_in_x(x.data() + 7, dextents<4>(s.K, s.C, s.R, s.S), {s.C * 9, 9, 3, 1});
    CHECK_THAT(
        message_of<shape_error>([&] { conv2d_backward_weight(exec{}, x, dy, dw_in_x, s.prm); }),
        Contains("tessera::conv2d_backward_weight") && Contains("dw") && Contains("x "));
    const sview4 dw_in_dy(dy.data(), dextents<4>(s.K, s.C, s.R, s.S), {s.C * 9, 9, 3, 1});
    CHECK_THROWS_AS(conv2d_backward_weight(exec{}, x, dy, dw_in_dy, db, s.prm), shape_error);
    // dbias inside dw, inside dy, inside x
    const sview1 db_in_dw(dw.data() + 2, dextents<1>(s.K), {1});
    const sview1 db_in_dy(dy.data() + 100, dextents<1>(s.K), {1});
    const sview1 db_in_x(x.data() + 100, dextents<1>(s.K), {3});
    CHECK_THAT(message_of<shape_error>(
                   [&] { conv2d_backward_weight(exec{}, x, dy, dw, db_in_dw, s.prm); }),
               Contains("tessera::conv2d_backward_weight") && Contains("dbias"));
    CHECK_THROWS_AS(conv2d_backward_weight(exec{}, x, dy, dw, db_in_dy, s.prm), shape_error);
    CHECK_THROWS_AS(conv2d_backward_weight(exec{}, x, dy, dw, db_in_x, s.prm), shape_error);
    // An output whose images share memory (batch stride 0).
    const sview4 y_bcast(dy.data(), dextents<4>(s.N, s.K, s.H, s.W), {0, s.H * s.W, s.W, 1});
    CHECK_THAT(message_of<shape_error>([&] { conv2d_forward(exec{}, x, w, y_bcast, s.prm); }),
               Contains("tessera::conv2d_forward") && Contains("share memory"));
    CHECK(all_same());
  }
}

TEST_CASE("conv2d passes accept inputs and outputs that are disjoint channel halves of one "
          "buffer, and compute them right",
          "[conv][safety]") {
  for (const index_t C : {3, 16}) {
    conv_shape s = shape_3x3();
    s.C = s.K = C;
    INFO(describe(s));
    const index_t N = s.N, H = s.H, W = s.W;
    // One (N, 2C, H, W) buffer: channels [0, C) are x (or dy), [C, 2C) y (or dx); byte ranges
    // interleave image by image, no element is shared.
    tensor4<fp32> buf("buf", N, 2 * C, H, W);
    fill_uniform(buf, 11, -1.f, 1.f);
    const auto lo = channels(buf.data(), N, 2 * C, 0, C, H, W);
    const auto hi = channels(buf.data(), N, 2 * C, C, C, H, W);
    auto w = random_tensor<fp32>(12, s.K, s.C, s.R, s.S);
    auto b = random_tensor<fp32>(13, s.K);
    const auto lo_vals = channel_values(buf, 0, C);
    const index_t L = s.Cg() * s.R * s.S + 2;

    REQUIRE_NOTHROW(conv2d_forward(exec{}, lo, w, b, hi, s.prm));
    {
      const auto ref = reference_conv2d_forward(s, lo_vals, to_doubles(w), to_doubles(b));
      const auto got = channel_values(buf, C, C);
      index_t bad = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        bad += !(std::abs(got[i] - ref.value[i]) <= error_bound<fp32>(ref.value[i], ref.abs[i], L));
      CHECK(bad == 0);
      CHECK(channel_values(buf, 0, C) == lo_vals); // the input half is untouched
    }
    // backward-data: dy in the low half, dx in the high half.
    fill_uniform(buf, 14, -1.f, 1.f);
    const auto dy_vals = channel_values(buf, 0, C);
    REQUIRE_NOTHROW(conv2d_backward_data(exec{}, lo, w, hi, s.prm));
    {
      const auto ref = reference_conv2d_backward_data(s, dy_vals, to_doubles(w));
      const auto got = channel_values(buf, C, C);
      index_t bad = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        bad += !(std::abs(got[i] - ref.value[i]) <=
                 error_bound<fp32>(ref.value[i], ref.abs[i], s.Kg() * s.R * s.S + 2));
      CHECK(bad == 0);
      CHECK(channel_values(buf, 0, C) == dy_vals);
    }
    // backward-weight: x low half, dy high half, dw and dbias separate.
    fill_uniform(buf, 15, -1.f, 1.f);
    const auto xv = channel_values(buf, 0, C), dyv = channel_values(buf, C, C);
    tensor4<fp32> dw("dw", s.K, s.C, s.R, s.S);
    tensor1<fp32> db("db", s.K);
    REQUIRE_NOTHROW(conv2d_backward_weight(exec{}, lo, hi, dw, db, s.prm));
    const auto ref = reference_conv2d_backward_weight(s, xv, dyv);
    require_within_bound("backward-weight from halves", dw, ref, N * H * W + 2);
    require_within_bound("dbias from a half", db, reference_conv2d_backward_bias(s, dyv),
                         N * H * W + 2);
  }
}

TEST_CASE("conv2d passes refuse scaled inputs whose scale is not positive, finite and normal",
          "[conv][safety]") {
  conv_shape s = shape_3x3();
  auto x = random_tensor<fp32>(21, s.N, s.C, s.H, s.W);
  auto w = random_tensor<fp32>(22, s.K, s.C, s.R, s.S);
  auto dy = random_tensor<fp32>(23, s.N, s.K, s.H, s.W);
  auto xq = quantize<fp8_e4m3>(x);
  auto wq = quantize<fp8_e4m3>(w);
  auto dyq = quantize<fp8_e5m2>(dy);
  tensor4<fp32> y("y", s.N, s.K, s.H, s.W), dx("dx", s.N, s.C, s.H, s.W),
      dw("dw", s.K, s.C, s.R, s.S);
  tensor1<fp32> db("db", s.K);
  fill(y, 7.f), fill(dx, 7.f), fill(dw, 7.f), fill(db, 7.f);
  const auto y0 = bytes_of(y), dx0 = bytes_of(dx), dw0 = bytes_of(dw), db0 = bytes_of(db);
  const float good_x = xq.scale, good_w = wq.scale, good_dy = dyq.scale;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {0.f, -1.f, nan, inf, -inf, std::numeric_limits<float>::denorm_min()}) {
    INFO("scale " << bad);
    xq.scale = bad;
    CHECK_THAT(message_of<value_error>([&] { conv2d_forward(exec{}, xq, wq, y, s.prm); }),
               Contains("tessera::conv2d_forward") && Contains("scale of x"));
    CHECK_THAT(
        message_of<value_error>([&] { conv2d_backward_weight(exec{}, xq, dyq, dw, db, s.prm); }),
        Contains("tessera::conv2d_backward_weight") && Contains("scale of x"));
    xq.scale = good_x;
    wq.scale = bad;
    CHECK_THAT(message_of<value_error>([&] { conv2d_forward(exec{}, xq, wq, y, s.prm); }),
               Contains("scale of w"));
    CHECK_THAT(message_of<value_error>([&] { conv2d_backward_data(exec{}, dyq, wq, dx, s.prm); }),
               Contains("tessera::conv2d_backward_data") && Contains("scale of w"));
    wq.scale = good_w;
    dyq.scale = bad;
    CHECK_THAT(message_of<value_error>([&] { conv2d_backward_data(exec{}, dyq, wq, dx, s.prm); }),
               Contains("scale of dy"));
    CHECK_THAT(message_of<value_error>([&] { conv2d_backward_weight(exec{}, xq, dyq, dw, s.prm); }),
               Contains("scale of dy"));
    dyq.scale = good_dy;
    CHECK(same_bytes(y, y0));
    CHECK(same_bytes(dx, dx0));
    CHECK(same_bytes(dw, dw0));
    CHECK(same_bytes(db, db0));
  }
  CHECK_NOTHROW(conv2d_forward(exec{}, xq, wq, y, s.prm)); // valid scales still work
}

TEST_CASE("conv2d size arithmetic that overflows is refused before any allocation",
          "[conv][safety][overflow]") {
  const index_t big = std::numeric_limits<index_t>::max() / 2 + 1;
  // Paddings whose sum with H overflows; a dilation times (R - 1) that overflows.
  conv2d_params pads{.pad_top = big, .pad_bottom = big};
  CHECK_THAT(message_of<shape_error>([&] { (void)pads.output_hw(8, 8, 3, 3); }),
             Contains("tessera::conv2d_params::output_hw") && Contains("overflows") &&
                 Contains("bottom " + std::to_string(big)));
  conv2d_params dil{.dilation_h = big};
  CHECK_THAT(message_of<shape_error>([&] { (void)dil.output_hw(8, 8, 3, 3); }),
             Contains("overflows") && Contains("kernel 3x3"));
  CHECK_THROWS_AS(conv2d_params{}.output_hw(8, 8, 3, big), shape_error); // S - 1 fine, W + 0 - ...
  // Negative and absurd parameters: value_error.
  CHECK_THROWS_AS((conv2d_params{.stride_h = -1}.output_hw(8, 8, 3, 3)), value_error);
  CHECK_THROWS_AS((conv2d_params{.pad_left = -5}.output_hw(8, 8, 3, 3)), value_error);
  CHECK_THROWS_AS((conv2d_params{.groups = 0}.output_hw(8, 8, 3, 3)), value_error);
  CHECK_THROWS_AS(
      (conv2d_params{.dilation_w = std::numeric_limits<index_t>::min()}.output_hw(8, 8, 3, 3)),
      value_error);

  // Through conv2d_forward: x, w, y views over 16 floats claiming a huge shape. The scratch
  // sizes (C/g R S x N P Q columns, 8 bytes each) overflow; refused before any allocation or
  // access.
  const tensor1<fp32> m16("mem", 16);
  float* const m = m16.data();
  const index_t n = index_t{1} << 20;
  const sview4 x(m, dextents<4>(n, 1, n, n), {n * n, n * n, n, 1});
  const sview4 w(m, dextents<4>(1, 1, 1, 1), {1, 1, 1, 1});
  const sview4 y(m + 8, dextents<4>(n, 1, n, n), {n * n, n * n, n, 1});
  conv2d_workspace<mem> ws;
  CHECK_THAT(message_of<shape_error>([&] { conv2d_forward(exec{}, x, w, y, conv2d_params{}, ws); }),
             Contains("tessera::conv2d_forward") && Contains("scratch") && Contains("overflow") &&
                 Contains("(1048576, 1, 1048576, 1048576)"));
  CHECK(ws.capacity() == 0);
  // The same with a huge padding through the public call.
  const sview4 x8(m, dextents<4>(1, 1, 2, 2), {4, 4, 2, 1});
  CHECK_THAT(message_of<shape_error>([&] {
               conv2d_forward(exec{}, x8, w, x8, conv2d_params{.pad_left = big, .pad_right = big},
                              ws);
             }),
             Contains("tessera::conv2d_forward") && Contains("overflows"));
  CHECK(ws.capacity() == 0);
}

TEST_CASE("im2col and col2im refuse an output sharing memory with their input", "[conv][safety]") {
  using sview3 = TensorView<fp32, dextents<3>, layout_stride, mem>;
  const conv2d_params p{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  auto x = random_tensor<fp32>(31, 1, 2, 4, 4); // col (1, 18, 16)
  Tensor<fp32, dextents<3>> col("col", 1, 18, 16);
  fill(col, 3.f);
  const auto x0 = bytes_of(x), c0 = bytes_of(col);
  // col over x's memory (x has 32 elements, col 288: col starts inside x)
  const tensor1<fp32> m400("mem", 400);
  fill(m400, 1.f);
  const sview4 xm(m400.data() + 8, dextents<4>(1, 2, 4, 4), {32, 16, 4, 1});
  const sview3 cm(m400.data(), dextents<3>(1, 18, 16), {288, 16, 1});
  const auto mem0 = bytes_of(m400);
  CHECK_THAT(message_of<shape_error>([&] { im2col(exec{}, xm, cm, 3, 3, p); }),
             Contains("tessera::im2col") && Contains("col (1, 18, 16)") &&
                 Contains("x (1, 2, 4, 4)"));
  CHECK_THAT(message_of<shape_error>([&] { col2im(exec{}, cm, xm, 3, 3, p); }),
             Contains("tessera::col2im") && Contains("overlaps"));
  CHECK(same_bytes(m400, mem0));
  // Separate memory: works (and round-trips the shape checks).
  CHECK_NOTHROW(im2col(exec{}, x, col, 3, 3, p));
  CHECK(same_bytes(x, x0));
  CHECK_FALSE(same_bytes(col, c0));
  // Kernel sizes whose product overflows: shape_error (the output-size check passes for a
  // huge padding only when the sizes fit, so use a kernel that fits the padded input).
  const index_t big = index_t{1} << 40;
  const auto c1 = bytes_of(col);
  CHECK_THROWS_AS(
      im2col(exec{}, x, col, big, big,
             conv2d_params{.pad_top = big, .pad_bottom = big, .pad_left = big, .pad_right = big}),
      shape_error);
  CHECK(same_bytes(col, c1));
}
