// Everything about conv besides the random reference comparison: output sizes and the errors bad
// arguments raise (outputs untouched); im2col / col2im against their definitions and each other;
// empty batches; strided views; gradients by finite differences; PyTorch fixtures.
#include "conv_testing.hpp"

#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

using exec_t = Kokkos::DefaultExecutionSpace;

conv2d_params pad1() {
  return {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
}

/// Runs f, which must throw E whose message contains every string of `parts`.
template <class E, class F>
void require_throws_naming(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    FAIL("no exception");
  } catch (const E& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& p : parts) CHECK(msg.find(p) != std::string::npos);
  }
}

/// True if every element of t still equals v.
template <class T>
bool all_equal(const T& t, double v) {
  for (double e : to_doubles(t))
    if (e != v) return false;
  return true;
}

} // namespace

TEST_CASE("conv2d_params::output_hw", "[conv]") {
  CHECK(conv2d_params{}.output_hw(5, 7, 3, 3) == std::array<index_t, 2>{3, 5});
  const conv2d_params stem{
      .stride_h = 2, .stride_w = 2, .pad_top = 3, .pad_bottom = 3, .pad_left = 3, .pad_right = 3};
  CHECK(stem.output_hw(224, 224, 7, 7) == std::array<index_t, 2>{112, 112});
  // Asymmetric padding and dilation: (9 + 1 + 0 - 2*2 - 1) / 2 + 1 = 3; (11 + 2 + 1 - 1 - 1)/3 + 1
  // = 5.
  const conv2d_params odd{
      .stride_h = 2, .stride_w = 3, .pad_top = 1, .pad_left = 2, .pad_right = 1, .dilation_h = 2};
  CHECK(odd.output_hw(9, 11, 3, 2) == std::array<index_t, 2>{3, 5});
  // A kernel that exactly fits, and one that is one too large (with -1 / stride truncating to 0).
  CHECK(conv2d_params{.stride_h = 2}.output_hw(3, 3, 3, 3) == std::array<index_t, 2>{1, 1});
  require_throws_naming<shape_error>(
      [] { (void)conv2d_params{.stride_h = 2, .dilation_w = 2}.output_hw(4, 4, 3, 3); },
      {"input 4x4", "kernel 3x3", "stride (2, 1)", "padding (top 0", "dilation (1, 2)", "empty"});
  require_throws_naming<value_error>(
      [] { (void)conv2d_params{.stride_w = 0}.output_hw(4, 4, 1, 1); }, {"stride (1, 0)"});
  require_throws_naming<value_error>(
      [] { (void)conv2d_params{.pad_left = -1}.output_hw(4, 4, 1, 1); }, {"left -1"});
  require_throws_naming<value_error>([] { (void)conv2d_params{}.output_hw(4, 4, 0, 1); },
                                     {"kernel 0x1"});
}

TEST_CASE("conv2d rejects bad arguments, naming them, and leaves outputs untouched", "[conv]") {
  const exec_t exec;
  auto x = random_tensor<fp32>(1, 2, 6, 5, 5); // (2, 6, 5, 5)
  auto w = random_tensor<fp32>(2, 4, 3, 3, 3); // (4, 3, 3, 3): groups 2
  auto b = random_tensor<fp32>(3, 4);
  const conv2d_params g2{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 2};
  tensor4<fp32> y("y", 2, 4, 5, 5), dx("dx", 2, 6, 5, 5), dw("dw", 4, 3, 3, 3);
  tensor1<fp32> db("db", 4);
  fill(y, 3.f), fill(dx, 3.f), fill(dw, 3.f), fill(db, 3.f);
  conv2d_forward(exec, x, w, b, y, g2); // the valid call works
  fill(y, 3.f);

  SECTION("channel count of w does not match x / groups") {
    require_throws_naming<shape_error>(
        [&] { conv2d_forward(exec, x, w, b, y, pad1()); },
        {"conv2d_forward", "x (2, 6, 5, 5)", "w (4, 3, 3, 3)", "6 channels in 1 groups"});
    require_throws_naming<shape_error>(
        [&] { conv2d_backward_data(exec, y, w, dx, pad1()); },
        {"conv2d_backward_data", "dx (2, 6, 5, 5)", "w (4, 3, 3, 3)"});
    require_throws_naming<shape_error>(
        [&] { conv2d_backward_weight(exec, x, y, dw, db, pad1()); },
        {"conv2d_backward_weight", "x (2, 6, 5, 5)", "dw (4, 3, 3, 3)"});
  }
  SECTION("groups that do not divide C or K") {
    auto g4 = g2;
    g4.groups = 4; // divides K = 4, not C = 6
    require_throws_naming<shape_error>([&] { conv2d_forward(exec, x, w, y, g4); },
                                       {"groups 4 must divide both C = 6 and K = 4"});
    tensor4<fp32> w5("w5", 5, 3, 3, 3), y5("y5", 2, 5, 5, 5);
    require_throws_naming<shape_error>([&] { conv2d_forward(exec, x, w5, y5, g2); },
                                       {"groups 2 must divide both C = 6 and K = 5"});
  }
  SECTION("outputs, gradients and biases of the wrong shape") {
    tensor4<fp32> y_bad("y", 2, 4, 4, 5);
    require_throws_naming<shape_error>([&] { conv2d_forward(exec, x, w, b, y_bad, g2); },
                                       {"y (2, 4, 4, 5)", "must be (N, K, P, Q) = (2, 4, 5, 5)"});
    tensor4<fp32> dy_bad("dy", 1, 4, 5, 5);
    require_throws_naming<shape_error>([&] { conv2d_backward_data(exec, dy_bad, w, dx, g2); },
                                       {"dy (1, 4, 5, 5)", "(2, 4, 5, 5)"});
    require_throws_naming<shape_error>([&] { conv2d_backward_weight(exec, x, dy_bad, dw, g2); },
                                       {"dy (1, 4, 5, 5)"});
    tensor1<fp32> b3("b", 3);
    require_throws_naming<shape_error>([&] { conv2d_forward(exec, x, w, b3, y, g2); },
                                       {"bias (3)", "K = 4"});
    require_throws_naming<shape_error>([&] { conv2d_backward_weight(exec, x, y, dw, b3, g2); },
                                       {"dbias (3)", "K = 4"});
  }
  SECTION("invalid parameters and empty outputs") {
    auto bad = g2;
    bad.dilation_h = 0;
    require_throws_naming<value_error>([&] { conv2d_forward(exec, x, w, y, bad); },
                                       {"conv2d_forward", "dilation (0, 1)"});
    tensor4<fp32> tiny("x", 2, 6, 1, 1);
    require_throws_naming<shape_error>(
        [&] { conv2d_forward(exec, tiny, w, y, conv2d_params{.groups = 2}); },
        {"input 1x1", "kernel 3x3", "empty"});
  }
  SECTION("views that are not row-major within an image") {
    const auto v = x.view();
    const TensorView<fp32, dextents<4>, layout_stride> cols(
        v.data(), dextents<4>(2, 6, 5, 5), {150, 25, 1, 5}); // (H, W) planes transposed
    require_throws_naming<shape_error>([&] { conv2d_forward(exec, cols, w, y, g2); },
                                       {"x (2, 6, 5, 5) has strides (150, 25, 1, 5)", "row-major"});
  }
  CHECK(all_equal(y, 3.0));
  CHECK(all_equal(dx, 3.0));
  CHECK(all_equal(dw, 3.0));
  CHECK(all_equal(db, 3.0));
}

TEST_CASE("conv2d on batch slices, and empty batches", "[conv]") {
  const exec_t exec;
  const conv_shape s{.N = 4, .C = 3, .H = 6, .W = 7, .K = 5, .R = 3, .S = 3, .prm = pad1()};
  auto x = random_tensor<fp32>(11, 4, 3, 6, 7);
  auto w = random_tensor<fp32>(12, 5, 3, 3, 3);
  tensor4<fp32> y("y", 4, 5, 6, 7);
  conv2d_forward(exec, x.slice(1, 3), w, y.slice(1, 3), s.prm); // images 1 and 2 only
  const auto yd = to_doubles(y);
  const auto ref = reference_conv2d_forward(s, to_doubles(x), to_doubles(w), {});
  const index_t img = 5 * 6 * 7;
  for (index_t i = 0; i < 4 * img; ++i) {
    if (i / img == 1 || i / img == 2) {
      REQUIRE(std::abs(yd[i] - ref.value[i]) <= error_bound<fp32>(ref.value[i], ref.abs[i], 29));
    } else {
      REQUIRE(yd[i] == 0.0); // untouched
    }
  }
  // N == 0: nothing to compute; the weight gradient of an empty batch is zero.
  tensor4<fp32> x0("x0", 0, 3, 6, 7), y0("y0", 0, 5, 6, 7), dw("dw", 5, 3, 3, 3);
  tensor1<fp32> db("db", 5);
  fill(dw, 1.f), fill(db, 1.f);
  conv2d_forward(exec, x0, w, y0, s.prm);
  conv2d_backward_data(exec, y0, w, x0, s.prm);
  conv2d_backward_weight(exec, x0, y0, dw, db, s.prm);
  CHECK(all_equal(dw, 0.0));
  CHECK(all_equal(db, 0.0));
}

TEST_CASE("conv2d_workspace is reused and bounds the column buffer", "[conv]") {
  const exec_t exec;
  // (C/g R S) x Q x 4 bytes = 27 * 32 * 4 = 3456 bytes per output row of columns. 4 output
  // channels: im2col + GEMM (the narrow rows of a short reduction take >= 8).
  auto x = random_tensor<fp32>(1, 3, 3, 32, 32);
  auto w = random_tensor<fp32>(2, 4, 3, 3, 3);
  tensor4<fp32> y("y", 3, 4, 32, 32);
  conv2d_workspace<> ws(4 * 3456);
  conv2d_forward(exec, x, w, y, pad1(), ws);
  const auto cap = ws.capacity();
  CHECK(cap == 4 * 3456); // four rows per tile, whatever the batch size
  conv2d_forward(exec, x, w, y, pad1(), ws);
  CHECK(ws.capacity() == cap); // no reallocation on the second call

  // Small images are grouped into tiles of at most detail::target_tile_columns columns, so the
  // workspace of a batch of 64 is that of a batch of 20 (20 x 14 x 14 = 3920 <= 4096 columns).
  auto w2 = random_tensor<fp32>(3, 8, 8, 3, 3);
  const auto capacity_for = [&](index_t n) {
    conv2d_workspace<> fresh;
    tensor4<fp32> xs("xs", n, 8, 14, 14), ys("ys", n, 8, 14, 14);
    conv2d_forward(exec, xs, w2, ys, pad1(), fresh);
    conv2d_backward_weight(exec, xs, ys, w2, pad1(), fresh);
    return fresh.capacity();
  };
  CHECK(capacity_for(64) == capacity_for(20));
  CHECK(capacity_for(2) < capacity_for(20));

  // 32 channels (the host implicit-GEMM path for fp32): packed weights and per-thread blocks,
  // whatever the batch size (once there are more 224-pixel blocks than threads: 4 per image).
  auto w3 = random_tensor<fp32>(4, 32, 32, 3, 3);
  const auto implicit_capacity = [&](index_t n) {
    conv2d_workspace<> fresh;
    tensor4<fp32> xs("xs", n, 32, 28, 28), ys("ys", n, 32, 28, 28);
    conv2d_forward(exec, xs, w3, ys, pad1(), fresh);
    conv2d_backward_data(exec, ys, w3, xs, pad1(), fresh);
    return fresh.capacity();
  };
  CHECK(implicit_capacity(32) == implicit_capacity(64));
}

TEST_CASE("im2col and col2im match their definitions and are adjoint", "[conv]") {
  const exec_t exec;
  std::mt19937_64 rng(21);
  for (int i = 0; i < 25; ++i) {
    auto s = random_conv_shape(rng);
    INFO(describe(s));
    const index_t P = s.P(), Q = s.Q(), rows = s.C * s.R * s.S;
    auto x = random_tensor<bf16>(100 + i, s.N, s.C, s.H, s.W);
    Tensor<fp32, dextents<3>> col("col", s.N, rows, P * Q), c("c", s.N, rows, P * Q);
    im2col(exec, x, col, s.R, s.S, s.prm);
    fill_uniform(c, 200 + i, -1.f, 1.f);
    tensor4<fp32> back("back", s.N, s.C, s.H, s.W);
    col2im(exec, c, back, s.R, s.S, s.prm);
    const auto xd = to_doubles(x), cold = to_doubles(col), cd = to_doubles(c),
               bd = to_doubles(back);
    // im2col: every entry by its definition; col2im: the sum of the entries copied from a pixel.
    std::vector<double> want_back(xd.size()), abs_back(xd.size());
    index_t wrong = 0;
    for (index_t n = 0; n < s.N; ++n)
      for (index_t row = 0; row < rows; ++row)
        for (index_t p = 0; p < P; ++p)
          for (index_t q = 0; q < Q; ++q) {
            const index_t c_ = row / (s.R * s.S), r = row / s.S % s.R, t = row % s.S;
            const index_t h = p * s.prm.stride_h - s.prm.pad_top + r * s.prm.dilation_h;
            const index_t w = q * s.prm.stride_w - s.prm.pad_left + t * s.prm.dilation_w;
            const bool in = h >= 0 && h < s.H && w >= 0 && w < s.W;
            const index_t ci = (n * rows + row) * P * Q + p * Q + q;
            const index_t xi = ((n * s.C + c_) * s.H + h) * s.W + w;
            wrong += cold[ci] != (in ? xd[xi] : 0.0);
            if (in) want_back[xi] += cd[ci], abs_back[xi] += std::abs(cd[ci]);
          }
    CHECK(wrong == 0);
    require_within_bound("col2im", back, {want_back, abs_back}, s.R * s.S + 1);
    // Adjointness: <im2col(x), c> == <x, col2im(c)>.
    double lhs = 0, rhs = 0, mag = 0;
    for (std::size_t k = 0; k < cd.size(); ++k)
      lhs += cold[k] * cd[k], mag += std::abs(cold[k] * cd[k]);
    for (std::size_t k = 0; k < xd.size(); ++k) rhs += xd[k] * bd[k];
    CHECK(std::abs(lhs - rhs) <= error_bound<fp32>(lhs, mag, s.R * s.S + 1));
  }
  Tensor<fp32, dextents<3>> wrong_col("col", 1, 5, 9);
  tensor4<fp32> x("x", 1, 1, 3, 3);
  require_throws_naming<shape_error>([&] { im2col(exec, x, wrong_col, 3, 3, pad1()); },
                                     {"x (1, 1, 3, 3)", "needs col (1, 9, 9)", "col is (1, 5, 9)"});
}

TEST_CASE("conv2d gradients agree with finite differences of the forward pass", "[conv]") {
  // L = sum y * g over the outputs of conv2d_forward(x, w, b). L is linear in each of x, w, b,
  // so the central difference has no truncation error: it differs from the gradient only by the
  // fp32 rounding of the two forward passes, at most 2 sum_j |g_j| gamma_L abs_j / (2h) with
  // abs_j bounded by the reference on |x| + h, |w| + h.
  const exec_t exec;
  std::mt19937_64 rng(31);
  // A large step: L is linear, so it adds no error, and the rounding noise shrinks as 1/h. x + h
  // may round in fp32; the step actually taken is measured and used.
  const double h = 0.5;
  for (int i = 0; i < 6; ++i) {
    const auto s = random_conv_shape(rng, 20000);
    INFO(describe(s));
    auto x = random_tensor<fp32>(300 + i, s.N, s.C, s.H, s.W);
    auto w = random_tensor<fp32>(400 + i, s.K, s.Cg(), s.R, s.S);
    auto b = random_tensor<fp32>(500 + i, s.K);
    auto g = random_tensor<fp32>(600 + i, s.N, s.K, s.P(), s.Q());
    const auto gd = to_doubles(g);
    tensor4<fp32> y("y", s.N, s.K, s.P(), s.Q()), dx("dx", s.N, s.C, s.H, s.W),
        dw("dw", s.K, s.Cg(), s.R, s.S);
    tensor1<fp32> db("db", s.K);
    conv2d_backward_data(exec, g, w, dx, s.prm);
    conv2d_backward_weight(exec, x, g, dw, db, s.prm);
    const auto loss = [&] {
      conv2d_forward(exec, x, w, b, y, s.prm);
      const auto yd = to_doubles(y);
      double l = 0;
      for (std::size_t j = 0; j < yd.size(); ++j) l += yd[j] * gd[j];
      return l;
    };
    std::vector<double> xa = to_doubles(x), wa = to_doubles(w), ba = to_doubles(b);
    for (auto* v : {&xa, &wa, &ba})
      for (double& e : *v) e = std::abs(e) + h;
    const auto abs_y = reference_conv2d_forward(s, xa, wa, ba).value;
    double noise = 0;
    for (std::size_t j = 0; j < gd.size(); ++j) noise += std::abs(gd[j]) * abs_y[j];
    noise *= error_bound<fp32>(0, 1, s.Cg() * s.R * s.S + 2) / h; // 2 passes / (2h)

    // The gradient's own fp32 error: gamma_L times its sum of |terms| (from the reference).
    const auto xd = to_doubles(x), wd = to_doubles(w);
    const auto check = [&](const char* what, auto& param, const auto& grad,
                           const std::vector<double>& grad_abs, index_t L_grad) {
      const auto gr = to_doubles(grad);
      index_t bad = 0;
      for (index_t k = 0; k < param.size(); k += 1 + param.size() / 40) { // <= 40 probes
        const float v = param.data()[k];
        param.data()[k] = v + static_cast<float>(h);
        const double lp = loss();
        const double hp = static_cast<double>(param.data()[k]) - v; // the step actually taken
        param.data()[k] = v - static_cast<float>(h);
        const double lm = loss();
        const double hm = v - static_cast<double>(param.data()[k]);
        param.data()[k] = v;
        const double fd = (lp - lm) / (hp + hm);
        const double tol = noise + error_bound<fp32>(gr[k], grad_abs[k], L_grad);
        if (!(std::abs(fd - gr[k]) <= tol)) {
          UNSCOPED_INFO(what << "[" << k << "]: finite difference " << fd << ", gradient " << gr[k]
                             << ", bound " << tol);
          ++bad;
        }
      }
      CHECK(bad == 0);
    };
    const index_t L_weight = s.N * s.P() * s.Q() + 2;
    check("dx", x, dx, reference_conv2d_backward_data(s, gd, wd).abs, s.Kg() * s.R * s.S + 2);
    check("dw", w, dw, reference_conv2d_backward_weight(s, xd, gd).abs, L_weight);
    check("db", b, db, reference_conv2d_backward_bias(s, gd).abs, L_weight);
  }
}

namespace {

struct fixture {
  conv_shape shape;
  std::map<std::string, std::vector<double>> arrays;
};

fixture read_fixture(const std::string& name) {
  std::ifstream in(std::string(TESSERA_CONV_FIXTURE_DIR) + "/" + name + ".txt");
  REQUIRE(in.good());
  fixture f;
  std::string word;
  while (in >> word) {
    if (word[0] == '#') {
      std::getline(in, word);
    } else if (word == "params") {
      auto& s = f.shape;
      auto& p = s.prm;
      in >> s.N >> s.C >> s.H >> s.W >> s.K >> s.R >> s.S >> p.stride_h >> p.stride_w >>
          p.pad_top >> p.pad_bottom >> p.pad_left >> p.pad_right >> p.dilation_h >> p.dilation_w >>
          p.groups;
    } else {
      std::size_t n = 0;
      in >> n;
      auto& v = f.arrays[word];
      v.resize(n);
      for (auto& e : v) in >> e;
    }
  }
  REQUIRE(f.arrays.size() == 8);
  return f;
}

template <class T>
T tensor_from(const std::vector<double>& v, T t) {
  REQUIRE(static_cast<index_t>(v.size()) == t.size());
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(v[i]);
  return t;
}

} // namespace

TEST_CASE("conv2d matches PyTorch on the committed fixtures", "[conv][pytorch]") {
  const exec_t exec;
  for (const char* name : {"basic_3x3", "strided_dilated", "depthwise", "pointwise", "stem_7x7"}) {
    auto f = read_fixture(name);
    const auto& s = f.shape;
    INFO(name << ": " << describe(s));
    auto& a = f.arrays;
    const auto x = tensor_from(a["x"], tensor4<fp32>("x", s.N, s.C, s.H, s.W));
    const auto w = tensor_from(a["w"], tensor4<fp32>("w", s.K, s.Cg(), s.R, s.S));
    const auto b = tensor_from(a["b"], tensor1<fp32>("b", s.K));
    const auto dy = tensor_from(a["dy"], tensor4<fp32>("dy", s.N, s.K, s.P(), s.Q()));
    tensor4<fp32> y("y", s.N, s.K, s.P(), s.Q()), dx("dx", s.N, s.C, s.H, s.W),
        dw("dw", s.K, s.Cg(), s.R, s.S);
    tensor1<fp32> db("db", s.K);
    conv2d_forward(exec, x, w, b, y, s.prm);
    conv2d_backward_data(exec, dy, w, dx, s.prm);
    conv2d_backward_weight(exec, x, dy, dw, db, s.prm);
    // PyTorch's float64 results against tessera's fp32, with the magnitudes from the reference;
    // and the reference itself against PyTorch (both double: agreement to 1e-12 relative).
    const auto check = [&](const char* what, const auto& got, const reference_result& ref,
                           index_t L) {
      const auto& torch = a[what];
      REQUIRE(torch.size() == ref.value.size());
      for (std::size_t i = 0; i < torch.size(); ++i)
        REQUIRE(std::abs(ref.value[i] - torch[i]) <= 1e-12 * (ref.abs[i] + 1e-300));
      require_within_bound(what, got, {torch, ref.abs}, L);
    };
    check("y", y, reference_conv2d_forward(s, a["x"], a["w"], a["b"]), s.Cg() * s.R * s.S + 2);
    check("dx", dx, reference_conv2d_backward_data(s, a["dy"], a["w"]), s.Kg() * s.R * s.S + 2);
    check("dw", dw, reference_conv2d_backward_weight(s, a["x"], a["dy"]), s.N * s.P() * s.Q() + 2);
    check("db", db, reference_conv2d_backward_bias(s, a["dy"]), s.N * s.P() * s.Q() + 2);
  }
}

TEST_CASE("conv2d takes scaled fp8 inputs: the scales multiply the fp32 accumulator",
          "[conv][fp8]") {
  // The reference runs on the values the scaled tensors represent, payload * scale_inv (exact in
  // double). The product of the two scale_inv factors is rounded once in fp32 (+1 in L).
  const exec_t exec;
  std::mt19937_64 rng(41);
  for (int i = 0; i < 8; ++i) {
    const auto s = random_conv_shape(rng, 50000);
    INFO(describe(s));
    auto x = random_tensor<fp32>(700 + i, s.N, s.C, s.H, s.W);
    auto w = random_tensor<fp32>(800 + i, s.K, s.Cg(), s.R, s.S);
    auto b = random_tensor<fp32>(900 + i, s.K);
    auto dy = random_tensor<fp32>(1000 + i, s.N, s.K, s.P(), s.Q());
    fill_uniform(exec, x, 700 + i, -30.f, 30.f); // magnitudes the scales must undo
    const auto xq = quantize<fp8_e4m3>(exec, x), wq = quantize<fp8_e4m3>(exec, w);
    const auto dyq = quantize<fp8_e5m2>(exec, dy);
    const auto values = [](const auto& q) {
      auto v = to_doubles(q.data);
      for (double& e : v) e *= static_cast<double>(q.scale_inv());
      return v;
    };
    const auto xd = values(xq), wd = values(wq), dyd = values(dyq), bd = to_doubles(b);
    tensor4<fp32> y("y", s.N, s.K, s.P(), s.Q()), dx("dx", s.N, s.C, s.H, s.W),
        dw("dw", s.K, s.Cg(), s.R, s.S);
    tensor1<fp32> db("db", s.K);
    conv2d_forward(exec, xq, wq, b, y, s.prm);
    conv2d_backward_data(exec, dyq, wq, dx, s.prm);
    conv2d_backward_weight(exec, xq, dyq, dw, db, s.prm);
    require_within_bound("forward", y, reference_conv2d_forward(s, xd, wd, bd),
                         s.Cg() * s.R * s.S + 3);
    require_within_bound("backward_data", dx, reference_conv2d_backward_data(s, dyd, wd),
                         s.Kg() * s.R * s.S + 3);
    const index_t L_weight = s.N * s.P() * s.Q() + 3;
    require_within_bound("backward_weight", dw, reference_conv2d_backward_weight(s, xd, dyd),
                         L_weight);
    require_within_bound("backward_bias", db, reference_conv2d_backward_bias(s, dyd), L_weight);
  }
}

TEST_CASE("conv2d_forward applies a fused epilogue after the bias, before rounding",
          "[conv][epilogue]") {
  // ReLU is 1-Lipschitz, so relu(reference) is within the same bound of the result.
  const exec_t exec;
  std::mt19937_64 rng(51);
  const auto relu = KOKKOS_LAMBDA(float v) {
    return v > 0.f ? v : 0.f;
  };
  for (int i = 0; i < 12; ++i) {
    const auto s = random_conv_shape(rng, 50000);
    INFO(describe(s));
    auto x = random_tensor<bf16>(1100 + i, s.N, s.C, s.H, s.W);
    auto w = random_tensor<bf16>(1200 + i, s.K, s.Cg(), s.R, s.S);
    auto b = random_tensor<fp32>(1300 + i, s.K);
    conv2d_workspace<> ws(i % 2 ? 1 : conv2d_workspace<>::default_column_budget);
    tensor4<bf16> y("y", s.N, s.K, s.P(), s.Q());
    tensor4<fp32> y32("y32", s.N, s.K, s.P(), s.Q());
    const bool with_bias = i % 3 != 0;
    auto ref = reference_conv2d_forward(s, to_doubles(x), to_doubles(w),
                                        with_bias ? to_doubles(b) : std::vector<double>{});
    for (double& v : ref.value) v = v > 0 ? v : 0;
    if (with_bias) {
      conv2d_forward(exec, x, w, b, y, s.prm, ws, relu);
      conv2d_forward(exec, x, w, b, y32, s.prm, ws, relu);
    } else {
      conv2d_forward(exec, x, w, y, s.prm, ws, relu);
      conv2d_forward(exec, x, w, y32, s.prm, ws, relu);
    }
    require_within_bound("relu bf16", y, ref, s.Cg() * s.R * s.S + 2);
    require_within_bound("relu fp32", y32, ref, s.Cg() * s.R * s.S + 2);
  }
}

namespace {
/// A default-constructible epilogue functor (unlike a lambda): conv2d_forward fuses it into the
/// GEMM's store instead of a pass over y.
struct leaky_relu {
  float slope = 0.25f;
  KOKKOS_INLINE_FUNCTION float operator()(float v) const { return v > 0.f ? v : slope * v; }
};
} // namespace

TEST_CASE("conv2d_forward epilogues on every path (implicit GEMM, GEMM store, y pass)",
          "[conv][epilogue]") {
  // 3x3 with 16-48 channels: the host implicit-GEMM path; 1x1: the GEMM with the epilogue fused
  // into its store (a functor) or a pass over y (a lambda); 7x7 with 2 channels: im2col + GEMM.
  // Both epilogues are 1-Lipschitz: applied to the reference, they keep its bound.
  const exec_t exec;
  const auto relu = KOKKOS_LAMBDA(float v) {
    return v > 0.f ? v : 0.f;
  };
  struct layer {
    index_t N, C, H, W, K, R;
    conv2d_params prm;
  };
  const conv2d_params p0{}, p3{.pad_top = 3, .pad_bottom = 2, .pad_left = 1, .pad_right = 3};
  const layer layers[] = {{2, 16, 15, 17, 33, 3, pad1()},
                          {3, 48, 9, 7, 16, 3, pad1()},
                          {2, 24, 13, 11, 40, 1, p0},
                          {2, 2, 12, 10, 6, 7, p3}};
  int i = 0;
  for (const auto& l : layers) {
    const conv_shape s{
        .N = l.N, .C = l.C, .H = l.H, .W = l.W, .K = l.K, .R = l.R, .S = l.R, .prm = l.prm};
    INFO(describe(s));
    auto x = random_tensor<fp32>(2100 + i, s.N, s.C, s.H, s.W);
    auto w = random_tensor<fp32>(2200 + i, s.K, s.Cg(), s.R, s.S);
    auto b = random_tensor<fp32>(2300 + i, s.K);
    ++i;
    const auto ref = reference_conv2d_forward(s, to_doubles(x), to_doubles(w), to_doubles(b));
    auto want_relu = ref, want_leaky = ref;
    for (double& v : want_relu.value) v = v > 0 ? v : 0;
    for (double& v : want_leaky.value) v = v > 0 ? v : 0.25 * v;
    conv2d_workspace<> ws;
    const index_t L = s.Cg() * s.R * s.S + 2;
    tensor4<fp32> y("y", s.N, s.K, s.P(), s.Q());
    tensor4<bf16> yb("yb", s.N, s.K, s.P(), s.Q());
    conv2d_forward(exec, x, w, b, y, s.prm, ws, relu);
    require_within_bound("relu", y, want_relu, L);
    conv2d_forward(exec, x, w, b, y, s.prm, ws, leaky_relu{});
    require_within_bound("leaky relu", y, want_leaky, L);
    conv2d_forward(exec, x, w, b, yb, s.prm, ws, leaky_relu{});
    require_within_bound("leaky relu bf16", yb, want_leaky, L);
    conv2d_forward(exec, x, w, b, yb, s.prm, ws, relu);
    require_within_bound("relu bf16", yb, want_relu, L);
  }
}

TEST_CASE("depthwise convolution with a kernel of more than 64 taps", "[conv]") {
  // Past detail::direct_max_taps the weight gradient takes its one-item-per-tap path.
  const exec_t exec;
  const conv_shape s{.N = 2,
                     .C = 3,
                     .H = 12,
                     .W = 11,
                     .K = 6,
                     .R = 9,
                     .S = 8,
                     .prm = {.stride_w = 2,
                             .pad_top = 2,
                             .pad_bottom = 1,
                             .pad_left = 3,
                             .pad_right = 2,
                             .groups = 3}};
  auto x = random_tensor<fp32>(1401, s.N, s.C, s.H, s.W);
  auto dy = random_tensor<fp32>(1402, s.N, s.K, s.P(), s.Q());
  tensor4<fp32> dw("dw", s.K, 1, s.R, s.S);
  conv2d_backward_weight(exec, x, dy, dw, s.prm);
  require_within_bound("backward_weight", dw,
                       reference_conv2d_backward_weight(s, to_doubles(x), to_doubles(dy)),
                       s.N * s.P() * s.Q() + 2);
}

TEST_CASE("conv2d with compile-time parameters equals the run-time form", "[conv]") {
  const exec_t exec;
  // stride 2 x 1, padding 1 x 2, dilation 1 x 2, groups 3: every field differs from its default.
  using sp = conv2d_static_params<2, 1, 1, 2, 1, 2, 3>;
  const conv2d_params rp{.stride_h = 2,
                         .stride_w = 1,
                         .pad_top = 1,
                         .pad_bottom = 1,
                         .pad_left = 2,
                         .pad_right = 2,
                         .dilation_h = 1,
                         .dilation_w = 2,
                         .groups = 3};
  STATIC_REQUIRE(sp::output_extent(9, 3, 0) == (9 + 2 - 2 - 1) / 2 + 1);
  STATIC_REQUIRE(sp::output_extent(8, 3, 1) == (8 + 4 - 4 - 1) / 1 + 1);
  STATIC_REQUIRE(sp::output_extent(dyn, 3, 0) == dyn);
  STATIC_REQUIRE(sp::output_extent(1, 5, 1) == -1); // the dilated kernel (9 wide) cannot fit
  const auto pq = rp.output_hw(9, 8, 3, 3);
  REQUIRE(pq[0] == 5);
  REQUIRE(pq[1] == 8);

  using xe = extents<dyn, 6, 9, 8>;
  using we = extents<9, 2, 3, 3>;
  using ye = extents<dyn, 9, 5, 8>;
  Tensor<fp32, xe> x("x", 2), dxs("dxs", 2), dxr("dxr", 2);
  Tensor<fp32, we> w("w"), dws("dws"), dwr("dwr");
  Tensor<fp32, ye> ys("ys", 2), yr("yr", 2);
  fill_uniform(x, 31, -1.f, 1.f);
  fill_uniform(w, 32, -1.f, 1.f);
  conv2d_forward(exec, x, w, ys, sp{});
  conv2d_forward(exec, x, w, yr, rp);
  REQUIRE(to_doubles(ys) == to_doubles(yr));
  conv2d_backward_data(exec, ys, w, dxs, sp{});
  conv2d_backward_data(exec, yr, w, dxr, rp);
  REQUIRE(to_doubles(dxs) == to_doubles(dxr));
  conv2d_backward_weight(exec, x, ys, dws, sp{});
  conv2d_backward_weight(exec, x, yr, dwr, rp);
  REQUIRE(to_doubles(dws) == to_doubles(dwr));
  // And against the direct reference, so that both forms are not wrong together.
  const conv_shape s{.N = 2, .C = 6, .H = 9, .W = 8, .K = 9, .R = 3, .S = 3, .prm = rp};
  const auto ref = reference_conv2d_forward(s, to_doubles(x), to_doubles(w), {});
  const auto yd = to_doubles(ys);
  for (std::size_t i = 0; i < yd.size(); ++i)
    REQUIRE(std::abs(yd[i] - ref.value[i]) <= error_bound<fp32>(ref.value[i], ref.abs[i], 18));
}
