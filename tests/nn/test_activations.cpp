// nn::ReLU, GELU, MaxPool2d, Flatten: finite-difference gradient checks (inputs kept away from
// kinks, see nn_testing.hpp), values against direct definitions; SoftmaxCrossEntropy against a
// double-precision reference (loss value, and dlogits against central differences of that
// reference), its stability for huge logits, and its errors.
#include "nn_testing.hpp"

#include <algorithm>
#include <numeric>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

// Element-wise layers: perturbing x_i changes y_i only; its fp32 rounding (2^-24 |y_i|, |y| <= 2)
// on L+ and L-, divided by 2h = 0.02, stays below 1e-5.
constexpr double elementwise_noise = 1e-5;

/// Values uniform in +-[0.1, 1]: |x| >= 0.1 keeps ReLU's kink 10 h away.
std::vector<double> away_from_zero(std::size_t n, std::uint64_t seed) {
  auto v = uniform_values(n, seed, 0.1, 1.0);
  std::mt19937_64 g(seed + 1);
  for (auto& x : v) x = (g() & 1) ? x : -x;
  return v;
}

template <class Layer>
void elementwise_gradients(const char* name, index_t B, index_t C, index_t H, index_t W,
                           std::uint64_t seed) {
  INFO(name << " on (" << B << ", " << C << ", " << H << ", " << W << ")");
  Layer layer;
  const auto n = static_cast<std::size_t>(B * C * H * W);
  auto x = tensor_from<fp32>(away_from_zero(n, seed), dextents<4>(B, C, H, W));
  const auto y = layer.forward(exec_space(), x);
  const auto r = uniform_values(n, seed + 2);
  const auto dx = to_host(layer.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  check_tensor_gradient(
      name, x, dx, [&] { return dot(layer.forward(exec_space(), x), r); }, 0.01f, elementwise_noise,
      seed + 3);
}

template <index_t K>
void maxpool_case(index_t B, index_t C, index_t H, index_t W, std::uint64_t seed) {
  INFO("MaxPool2d<" << K << "> on (" << B << ", " << C << ", " << H << ", " << W << ")");
  nn::MaxPool2d<K> pool;
  const auto n = static_cast<std::size_t>(B * C * H * W);
  // Distinct values 0.05 apart (a shuffled ramp): no window has two maxima within 2h = 0.02.
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  for (auto& e : v) e = -1 + 0.05 * e;
  auto x = tensor_from<fp32>(v, dextents<4>(B, C, H, W));
  const auto y = pool.forward(exec_space(), x);
  const index_t P = H / K, Q = W / K;
  REQUIRE(y.extent(2) == P);
  REQUIRE(y.extent(3) == Q);
  // Values: the maximum of each window, by definition.
  const auto yh = to_doubles(y);
  for (index_t bc = 0; bc < B * C; ++bc)
    for (index_t p = 0; p < P; ++p)
      for (index_t q = 0; q < Q; ++q) {
        double m = -1e30;
        for (index_t i = 0; i < K; ++i)
          for (index_t j = 0; j < K; ++j)
            m = std::max(m, v[static_cast<std::size_t>((bc * H + p * K + i) * W + q * K + j)]);
        REQUIRE(yh[static_cast<std::size_t>((bc * P + p) * Q + q)] == static_cast<float>(m));
      }
  const auto r = uniform_values(static_cast<std::size_t>(y.size()), seed + 2);
  const auto dx = to_host(pool.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  REQUIRE(dx.extent(2) == H);
  check_tensor_gradient(
      "MaxPool2d dx", x, dx, [&] { return dot(pool.forward(exec_space(), x), r); }, 0.01f,
      elementwise_noise, seed + 3);
}

/// -mean log softmax in double, the independent reference.
double reference_ce(const std::vector<double>& l, const std::vector<int>& y, index_t C) {
  const index_t B = static_cast<index_t>(y.size());
  double total = 0;
  for (index_t i = 0; i < B; ++i) {
    double m = -1e300;
    for (index_t j = 0; j < C; ++j) m = std::max(m, l[static_cast<std::size_t>(i * C + j)]);
    double s = 0;
    for (index_t j = 0; j < C; ++j) s += std::exp(l[static_cast<std::size_t>(i * C + j)] - m);
    total += m + std::log(s) - l[static_cast<std::size_t>(i * C + y[static_cast<std::size_t>(i)])];
  }
  return total / double(B);
}

Kokkos::View<int*> labels_view(const std::vector<int>& y) {
  Kokkos::View<int*> v("labels", y.size());
  for (std::size_t i = 0; i < y.size(); ++i) v(i) = y[i];
  return v;
}

} // namespace

TEST_CASE("nn::ReLU and nn::GELU: values and gradients", "[nn][activation]") {
  std::mt19937_64 g(21);
  for (int rep = 0; rep < 4; ++rep) {
    const index_t B = 1 + index_t(g() % 4), C = 1 + index_t(g() % 5), H = 1 + index_t(g() % 7),
                  W = 1 + index_t(g() % 7);
    elementwise_gradients<nn::ReLU>("ReLU", B, C, H, W, g() % 1000);
    elementwise_gradients<nn::GELU>("GELU", B, C, H, W, g() % 1000);
  }
  // Values: ReLU is max(x, 0); GELU x * Phi(x) against std::erf in double, within fp32 rounding
  // of a few operations (8 u |x| + 1e-7 absolute for erf's own error near 0).
  const std::vector<double> v = {-3, -1.5, -0.25, 0, 0.125, 0.5, 1, 2.5, 7};
  auto x = tensor_from<fp32>(v, extents<dyn, 3>(3));
  nn::ReLU relu;
  nn::GELU gelu;
  const auto r = to_doubles(relu.forward(exec_space(), x)),
             ge = to_doubles(gelu.forward(exec_space(), x));
  for (std::size_t i = 0; i < v.size(); ++i) {
    CHECK(r[i] == std::max(v[i], 0.0));
    const double want = v[i] * 0.5 * (1 + std::erf(v[i] / std::sqrt(2.0)));
    CHECK(std::abs(ge[i] - want) <= 8 * u32 * std::abs(v[i]) + 1e-7);
  }
}

TEST_CASE("nn::GELU over many values: x Phi(x) and the kept derivative against double, every "
          "precision's storage path",
          "[nn][activation]") {
  // 5003 values (prime: full SIMD batches of any width, then a tail; several 256-value blocks):
  // a grid over [-12, 12] plus special points. Forward against x Phi(x) in double within
  // 8 u |x| + 1e-7 (as above); the kept derivative Phi(x) + x phi(x), read back through
  // backward with dy = 1, within 8 u (|x| phi(x) + 1) + 1e-7.
  std::vector<double> v;
  for (int i = 0; i < 5000; ++i) v.push_back(-12.0 + 24.0 * i / 4999.0);
  for (double s : {0.0, -0.0, 1e-30}) v.push_back(s);
  const index_t n = index_t(v.size());
  auto x = tensor_from<fp32>(v, extents<dyn>(n));
  nn::GELU gelu;
  const auto y = to_doubles(gelu.forward(exec_space(), x));
  const auto d = to_doubles(gelu.backward(
      exec_space(), tensor_from<fp32>(std::vector<double>(v.size(), 1.0), extents<dyn>(n))));
  const double inv_sqrt_2pi = 0.3989422804014327;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double xv = double(float(v[i])), phi = inv_sqrt_2pi * std::exp(-0.5 * xv * xv);
    const double cdf = 0.5 * (1 + std::erf(xv / std::sqrt(2.0)));
    INFO("x = " << xv);
    CHECK(std::abs(y[i] - xv * cdf) <= 8 * u32 * std::abs(xv) + 1e-7);
    CHECK(std::abs(d[i] - (cdf + xv * phi)) <= 8 * u32 * (std::abs(xv) * phi + 1) + 1e-7);
    // The left tail relative to its own size (Phi(x) = erfc(-x / sqrt 2) / 2, no cancellation
    // against 1): x Phi(x) to 2^-12 down to x = -9 (Phi(-9) ~ 1e-19), where 0.5 (1 + erf(x /
    // sqrt 2)) in float has no correct digit left beyond x ~ -5.5.
    if (xv < 0 && xv >= -9) {
      const double tail = xv * 0.5 * std::erfc(-xv / std::sqrt(2.0));
      CHECK(std::abs(y[i] - tail) <= std::abs(tail) * std::ldexp(1.0, -12));
    }
  }
  // bf16 storage (widened and rounded around the fp32 batches): each output is the fp32 result
  // rounded once: half a bf16 ulp (2^-9 relative) plus the fp32 error, checked as 2^-8.
  auto xb = tensor_from<bf16>(v, extents<dyn>(n));
  nn::GELU gelu_b;
  const auto yb = to_doubles(gelu_b.forward(exec_space(), xb));
  const auto xr = to_doubles(xb);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double want = xr[i] * 0.5 * (1 + std::erf(xr[i] / std::sqrt(2.0)));
    INFO("bf16 x = " << xr[i]);
    CHECK(std::abs(yb[i] - want) <= std::abs(want) * std::ldexp(1.0, -8) + 1e-7);
  }
}

TEST_CASE("nn::MaxPool2d: window maxima and gradients routed to them", "[nn][pool]") {
  std::mt19937_64 g(22);
  for (int rep = 0; rep < 4; ++rep) {
    const index_t B = 1 + index_t(g() % 3), C = 1 + index_t(g() % 3), H = 3 + index_t(g() % 6),
                  W = 3 + index_t(g() % 6);
    maxpool_case<2>(B, C, H, W, g() % 1000);
    maxpool_case<3>(B, C, H, W, g() % 1000);
  }
  nn::MaxPool2d<2> pool;
  CHECK_THROWS_AS(pool.forward(exec_space(), Tensor<fp32, dextents<4>>("x", 1, 1, 1, 5)),
                  shape_error);
}

namespace {

/// MaxPool2d<2> in precision P against its definition, element by element and bit for bit, on
/// inputs full of ties (values from {-1, -0, 0, 1}), NaNs and wide rows (W up to 71: several
/// 16-window SIMD steps and their tails): the first maximum in row-major window order wins, a
/// NaN wins over any number and is then kept; dx is dy at that position, +0 elsewhere
/// (including the rows and columns no window covers).
template <class P>
void maxpool2_exact_case(index_t B, index_t C, index_t H, index_t W, std::mt19937_64& g) {
  INFO("MaxPool2d<2> exact, " << precision_traits<P>::name << ", (" << B << ", " << C << ", " << H
                              << ", " << W << ")");
  const index_t n = B * C * H * W, P2 = H / 2, Q = W / 2;
  std::vector<double> v(static_cast<std::size_t>(n));
  const double pool[] = {-1.0, -0.0, 0.0, 1.0, 0.5};
  for (auto& e : v) e = g() % 23 == 0 ? std::nan("") : pool[g() % 5];
  auto x = tensor_from<P>(v, dextents<4>(B, C, H, W));
  nn::MaxPool2d<2> layer;
  const auto y = to_doubles(layer.forward(exec_space(), x));
  const auto dyv = uniform_values(static_cast<std::size_t>(B * C * P2 * Q), g() % 1000);
  const auto dy = tensor_from<P>(dyv, dextents<4>(B, C, P2, Q));
  const auto dyr = to_doubles(dy); // dy as rounded to P
  const auto dx = to_doubles(layer.backward(exec_space(), dy));
  std::vector<double> want_dx(static_cast<std::size_t>(n), 0.0);
  int bad = 0;
  for (index_t bc = 0; bc < B * C; ++bc)
    for (index_t p = 0; p < P2; ++p)
      for (index_t q = 0; q < Q; ++q) {
        std::size_t at = 0;
        double best = 0;
        bool first = true;
        for (index_t i = 0; i < 2; ++i)
          for (index_t j = 0; j < 2; ++j) {
            const auto k = static_cast<std::size_t>((bc * H + 2 * p + i) * W + 2 * q + j);
            const double e = v[k];
            if (first || e > best || (std::isnan(e) && !std::isnan(best))) {
              best = e;
              at = k;
              first = false;
            }
          }
        const auto o = static_cast<std::size_t>((bc * P2 + p) * Q + q);
        const bool same = std::isnan(best)
                              ? std::isnan(y[o])
                              : (y[o] == best && std::signbit(y[o]) == std::signbit(best));
        if (!same && bad++ < 5) FAIL_CHECK("y[" << o << "] = " << y[o] << ", want " << best);
        want_dx[at] = dyr[o];
      }
  for (std::size_t k = 0; k < want_dx.size(); ++k)
    if ((dx[k] != want_dx[k] || std::signbit(dx[k]) != std::signbit(want_dx[k])) && bad++ < 5)
      FAIL_CHECK("dx[" << k << "] = " << dx[k] << ", want " << want_dx[k]);
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("nn::MaxPool2d<2>: exact on ties, NaN and wide rows, fp32 and bf16", "[nn][pool]") {
  std::mt19937_64 g(24);
  for (int rep = 0; rep < 12; ++rep) {
    const index_t B = 1 + index_t(g() % 3), C = 1 + index_t(g() % 4), H = 2 + index_t(g() % 9),
                  W = 2 + index_t(g() % 70);
    maxpool2_exact_case<fp32>(B, C, H, W, g);
    maxpool2_exact_case<bf16>(B, C, H, W, g);
  }
  std::mt19937_64 g2(25); // the FashionCNN shapes
  maxpool2_exact_case<fp32>(3, 5, 28, 28, g2);
  maxpool2_exact_case<bf16>(3, 5, 14, 14, g2);
}

namespace {

/// nn::Sequential<ReLU, MaxPool2d<2>> runs both backwards as one pass (backward_after_relu):
/// its dx must equal, bit for bit, the ReLU's backward applied to the pooling's backward (the
/// layers run one by one), and the definition: dy at each window's first maximum of relu(x)
/// where that maximum is > 0, +0 elsewhere. Inputs full of ties at 0 (windows all 0 after the
/// ReLU), negatives, NaN (the ReLU makes them 0), dy with NaN and -0.
template <class P>
void relu_pool_case(index_t B, index_t C, index_t H, index_t W, std::mt19937_64& g) {
  INFO("ReLU + MaxPool2d<2>, " << precision_traits<P>::name << ", (" << B << ", " << C << ", " << H
                               << ", " << W << ")");
  const index_t n = B * C * H * W, P2 = H / 2, Q = W / 2;
  std::vector<double> v(static_cast<std::size_t>(n));
  const double values[] = {-1.0, -0.0, 0.0, 1.0, 0.5, -2.0};
  for (auto& e : v) e = g() % 29 == 0 ? std::nan("") : values[g() % 6];
  auto dyv = uniform_values(static_cast<std::size_t>(B * C * P2 * Q), g() % 1000);
  for (auto& e : dyv) e = g() % 31 == 0 ? std::nan("") : g() % 17 == 0 ? -0.0 : e;
  const auto x = tensor_from<P>(v, dextents<4>(B, C, H, W));
  const auto dy = tensor_from<P>(dyv, dextents<4>(B, C, P2, Q));
  const auto dyr = to_doubles(dy);

  nn::Sequential<nn::ReLU, nn::MaxPool2d<2>> fused;
  const auto yf = to_doubles(fused.forward(exec_space(), x));
  const auto dxf = to_doubles(fused.backward(exec_space(), dy, /*need_input_grad=*/true));

  nn::ReLU relu;
  nn::MaxPool2d<2> pool;
  const auto y = to_doubles(pool.forward(exec_space(), relu.forward(exec_space(), x)));
  const auto dx = to_doubles(relu.backward(exec_space(), pool.backward(exec_space(), dy)));

  std::vector<double> want(static_cast<std::size_t>(n), 0.0);
  for (index_t bc = 0; bc < B * C; ++bc)
    for (index_t p = 0; p < P2; ++p)
      for (index_t q = 0; q < Q; ++q) {
        std::size_t at = 0;
        double best = -1;
        for (index_t i = 0; i < 2; ++i)
          for (index_t j = 0; j < 2; ++j) {
            const auto k = static_cast<std::size_t>((bc * H + 2 * p + i) * W + 2 * q + j);
            const double r = v[k] > 0 ? v[k] : 0.0; // relu; NaN -> 0
            if (r > best) {
              best = r;
              at = k;
            }
          }
        if (best > 0) want[at] = dyr[static_cast<std::size_t>((bc * P2 + p) * Q + q)];
      }
  const auto same = [](double a, double b) {
    return std::isnan(a) ? std::isnan(b) : (a == b && std::signbit(a) == std::signbit(b));
  };
  int bad = 0;
  for (std::size_t k = 0; k < yf.size(); ++k)
    if (!same(yf[k], y[k]) && bad++ < 5) FAIL_CHECK("y[" << k << "] = " << yf[k] << " vs " << y[k]);
  for (std::size_t k = 0; k < want.size(); ++k) {
    if (!same(dxf[k], dx[k]) && bad++ < 5)
      FAIL_CHECK("fused dx[" << k << "] = " << dxf[k] << ", layer by layer " << dx[k]);
    if (!same(dxf[k], want[k]) && bad++ < 5)
      FAIL_CHECK("fused dx[" << k << "] = " << dxf[k] << ", want " << want[k]);
  }
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("nn::Sequential<ReLU, MaxPool2d<2>>: one backward pass, the layers' dx bit for bit",
          "[nn][pool]") {
  std::mt19937_64 g(26);
  for (int rep = 0; rep < 10; ++rep) {
    const index_t B = 1 + index_t(g() % 3), C = 1 + index_t(g() % 4), H = 2 + index_t(g() % 9),
                  W = 2 + index_t(g() % 70);
    relu_pool_case<fp32>(B, C, H, W, g);
    relu_pool_case<bf16>(B, C, H, W, g);
    relu_pool_case<fp8_e4m3>(B, C, H, W, g); // the portable loops
  }
  std::mt19937_64 g2(27); // more rows than one work item of 64, odd H
  relu_pool_case<fp32>(2, 9, 29, 28, g2);
  relu_pool_case<bf16>(3, 5, 15, 14, g2);
  // A backward before any forward names the operation.
  nn::MaxPool2d<2> pool;
  CHECK_THROWS_AS(
      pool.backward_after_relu(exec_space(), Tensor<fp32, dextents<4>>("dy", 1, 1, 1, 1)),
      value_error);
}

TEST_CASE("nn::Flatten: shares memory, backward restores the shape", "[nn][flatten]") {
  nn::Flatten flat;
  auto x = tensor_from<fp32>(uniform_values(2 * 3 * 4 * 5, 3), extents<dyn, 3, 4, 5>(2));
  const auto y = flat.forward(exec_space(), x);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(y)>::extents_type, extents<dyn, 60>>);
  CHECK(y.data() == x.data());
  const auto dx = flat.backward(exec_space(), y);
  CHECK(dx.extent(0) == 2);
  CHECK(dx.extent(1) == 3);
  CHECK(dx.extent(3) == 5);
  CHECK_THROWS_AS(flat.backward(exec_space(), Tensor<fp32, extents<dyn, 60>>("dy", 3)),
                  shape_error);
}

TEST_CASE("nn::SoftmaxCrossEntropy: loss and gradient against a double reference", "[nn][loss]") {
  std::mt19937_64 g(23);
  for (int rep = 0; rep < 20; ++rep) {
    const index_t B = 1 + index_t(g() % 70), C = 1 + index_t(g() % 12);
    const double spread = rep % 4 == 3 ? 30.0 : 3.0; // also confident predictions
    INFO("B " << B << ", C " << C << ", logits in +-" << spread);
    const auto l = uniform_values(static_cast<std::size_t>(B * C), g(), -spread, spread);
    std::vector<int> y(static_cast<std::size_t>(B));
    for (auto& e : y) e = static_cast<int>(g() % static_cast<std::uint64_t>(C));
    const auto logits = tensor_from<fp32>(l, dextents<2>(B, C));
    nn::SoftmaxCrossEntropy ce;
    const float scale = rep % 2 ? 1.f : 1024.f; // a loss scale multiplies the gradient only
    const auto [loss, d] = ce.forward_backward(exec_space(), logits, labels_view(y), scale);
    const double want = reference_ce(l, y, C);
    // Per row: C exps and a sum in fp32, relative error <= (C + 4) u of the row's terms (at
    // most 2 spread + log C); the mean of rows is exact in double, then rounded to float.
    const double row_bound = double(C + 4) * u32 * (2 * spread + std::log(double(C)) + 1);
    CHECK(std::abs(loss - want) <= row_bound + u32 * std::abs(want));
    CHECK(ce.forward(exec_space(), logits, labels_view(y)) == loss);
    // dlogits against central differences of the double reference (h = 1e-4: truncation
    // h^2 / 6 |L'''| <= 1e-9, rounding 1e-16 / 1e-4): the fp32 kernel's error dominates, a
    // few u per element of a value <= 1/B, times the scale.
    const auto dh = to_doubles(d);
    int misses = 0;
    for (index_t i = 0; i < B * C; ++i) {
      auto lp = l, lm = l;
      lp[static_cast<std::size_t>(i)] += 1e-4;
      lm[static_cast<std::size_t>(i)] -= 1e-4;
      const double fd = scale * (reference_ce(lp, y, C) - reference_ce(lm, y, C)) / 2e-4;
      const double tol = scale * (double(C + 8) * u32 / double(B) + 1e-8);
      if (std::abs(dh[static_cast<std::size_t>(i)] - fd) > tol && misses++ < 5)
        FAIL_CHECK("dlogits[" << i << "] " << dh[static_cast<std::size_t>(i)] << " vs " << fd);
    }
    CHECK(misses == 0);
  }
}

TEST_CASE("nn::SoftmaxCrossEntropy: wide rows (across the host path's 256-logit chunks), fp32 "
          "and bf16 logits, against the softmax in double",
          "[nn][loss]") {
  std::mt19937_64 g(25);
  for (const index_t C : {255, 256, 257, 700, 1031}) {
    const index_t B = 3 + index_t(g() % 5);
    INFO("B " << B << ", C " << C);
    const auto l = uniform_values(static_cast<std::size_t>(B * C), g(), -6, 6);
    std::vector<int> y(static_cast<std::size_t>(B));
    // Labels in the first, a middle and the last chunk.
    for (std::size_t i = 0; i < y.size(); ++i)
      y[i] = i % 3 == 0 ? 0 : i % 3 == 1 ? static_cast<int>(C / 2) : static_cast<int>(C - 1);
    const auto check = [&]<class P>() {
      INFO(precision_traits<P>::name);
      const auto logits = tensor_from<P>(l, dextents<2>(B, C));
      const auto lv = to_doubles(logits); // the values as P holds them
      nn::SoftmaxCrossEntropy ce;
      const auto [loss, d] = ce.forward_backward(exec_space(), logits, labels_view(y), 8.f);
      const double want = reference_ce(lv, y, C);
      const double row_bound = double(C + 4) * u32 * (12 + std::log(double(C)) + 1);
      CHECK(std::abs(loss - want) <= row_bound + u32 * std::abs(want));
      // dlogits = (softmax - onehot) 8 / B, each element within C u of the softmax (fp32) and
      // then rounded once to P.
      const auto dh = to_doubles(d);
      const double u_out = std::is_same_v<P, bf16> ? 1.0 / 256 : u32; // unit roundoff
      int misses = 0;
      for (index_t i = 0; i < B; ++i) {
        const auto row = lv.begin() + i * C;
        const double m = *std::max_element(row, row + C);
        double z = 0;
        for (index_t j = 0; j < C; ++j) z += std::exp(row[j] - m);
        for (index_t j = 0; j < C; ++j) {
          const double p = std::exp(row[j] - m) / z;
          const double want_d = (p - (j == y[std::size_t(i)] ? 1 : 0)) * 8.0 / double(B);
          const double got = dh[std::size_t(i * C + j)];
          // p has C exps summed in fp32 behind it ((C + 8) u relative), then the product by
          // 8 / B and the rounding to P (u_out relative).
          const double tol = 8.0 / double(B) * (double(C + 8) * u32 * p + 1e-30) +
                             std::abs(want_d) * (u_out + u32);
          if (!(std::abs(got - want_d) <= tol) && misses++ < 5)
            FAIL_CHECK("dlogits[" << i << ", " << j << "] " << got << " vs " << want_d);
        }
      }
      CHECK(misses == 0);
    };
    check.template operator()<fp32>();
    check.template operator()<bf16>();
  }
}

TEST_CASE("nn::SoftmaxCrossEntropy: stable for huge logits, bf16 logits, bad labels",
          "[nn][loss]") {
  nn::SoftmaxCrossEntropy ce;
  // exp(1e4) overflows float: a naive softmax gives inf / NaN. Row 0 is confidently right (loss
  // exp(-2e4) ~ 0), row 1 confidently wrong by 2e4.
  const std::vector<double> l = {1e4, -1e4, 1e4, -1e4};
  const auto logits = tensor_from<fp32>(l, dextents<2>(2, 2));
  const auto [loss, d] = ce.forward_backward(exec_space(), logits, labels_view({0, 1}));
  CHECK(loss == Approx(1e4).epsilon(1e-6)); // (0 + 2e4) / 2
  const auto dh = to_doubles(d);
  CHECK(dh == std::vector<double>{0, 0, 0.5, -0.5});

  const auto lb = tensor_from<bf16>({0.5, -0.25, 2}, dextents<2>(1, 3));
  const auto [lossb, db] = ce.forward_backward(exec_space(), lb, labels_view({2}));
  CHECK(std::abs(lossb - reference_ce({0.5, -0.25, 2}, {2}, 3)) < 1e-6);
  CHECK(std::is_same_v<typename std::remove_cvref_t<decltype(db)>::precision, bf16>);

  CHECK_THROWS_AS(ce.forward_backward(exec_space(), logits, labels_view({0, 2})), value_error);
  CHECK_THROWS_AS(ce.forward_backward(exec_space(), logits, labels_view({-1, 0})), value_error);
  CHECK_THROWS_AS(ce.forward_backward(exec_space(), logits, labels_view({0})), shape_error);
}

TEST_CASE("nn::SoftmaxCrossEntropy on sequences: logits (B, t, V), labels (B, t), mean over B t",
          "[nn][loss]") {
  std::mt19937_64 g(24);
  for (int rep = 0; rep < 6; ++rep) {
    const index_t B = 1 + index_t(g() % 4), t = 1 + index_t(g() % 9), V = 1 + index_t(g() % 11);
    INFO("B " << B << ", t " << t << ", V " << V);
    const auto l = uniform_values(static_cast<std::size_t>(B * t * V), g(), -4, 4);
    std::vector<int> y(static_cast<std::size_t>(B * t));
    for (auto& e : y) e = static_cast<int>(g() % static_cast<std::uint64_t>(V));
    Kokkos::View<std::int32_t**> yv("labels", std::size_t(B), std::size_t(t));
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < t; ++i) yv(b, i) = y[static_cast<std::size_t>(b * t + i)];
    Kokkos::View<const std::int32_t**> yc = yv;
    nn::SoftmaxCrossEntropy ce, flat;
    const auto logits = tensor_from<fp32>(l, dextents<3>(B, t, V));
    const auto [loss, d] = ce.forward_backward(exec_space(), logits, yc, 2.f);
    static_assert(std::remove_cvref_t<decltype(d)>::extents_type::rank == 3);
    // The reference: the mean over the B t rows of the flattened problem, in double.
    const double want = reference_ce(l, y, V);
    const double row_bound = double(V + 4) * u32 * (8 + std::log(double(V)) + 1);
    CHECK(std::abs(loss - want) <= row_bound + u32 * std::abs(want));
    CHECK(ce.forward(exec_space(), logits, yc) == loss);
    // dlogits: exactly those of the (B t, V) form (the same per-row arithmetic, divided by B t).
    const auto [lf, df] = flat.forward_backward(
        exec_space(), tensor_from<fp32>(l, dextents<2>(B * t, V)), labels_view(y), 2.f);
    CHECK(to_doubles(d) == to_doubles(df));
    CHECK(std::abs(lf - loss) <= row_bound + u32 * std::abs(want));
  }
  // Errors: labels of another shape, out of range (nothing written), the wrong rank.
  nn::SoftmaxCrossEntropy ce;
  const auto logits = tensor_from<fp32>(uniform_values(2 * 3 * 4, 5), dextents<3>(2, 3, 4));
  Kokkos::View<std::int32_t**> short_t("labels", 2, 2), bad("labels", 2, 3);
  CHECK_THROWS_AS(ce.forward(exec_space(), logits, short_t), shape_error);
  bad(1, 2) = 4;
  CHECK_THROWS_AS(ce.forward_backward(exec_space(), logits, bad), value_error);
  bad(1, 2) = -1;
  CHECK_THROWS_AS(ce.forward_backward(exec_space(), logits, bad), value_error);
}

TEST_CASE("nn::GELU on (B, t, D): gradients match finite differences", "[nn][activation]") {
  nn::GELU gelu;
  const auto xv = uniform_values(3 * 5 * 8, 61, -3, 3);
  auto x = tensor_from<fp32>(xv, extents<dyn, dyn, 8>(3, 5));
  const auto y = gelu.forward(exec_space(), x);
  static_assert(std::is_same_v<decltype(y)::extents_type, extents<dyn, dyn, 8>>);
  const auto yh = to_doubles(y);
  for (std::size_t i = 0; i < xv.size(); ++i)
    CHECK(std::abs(yh[i] - xv[i] * 0.5 * (1 + std::erf(xv[i] / std::sqrt(2.0)))) <=
          8 * u32 * std::abs(xv[i]) + 1e-7);
  const auto r = uniform_values(xv.size(), 62);
  const auto dx = to_host(gelu.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  check_tensor_gradient(
      "GELU (B, t, D) dx", x, dx, [&] { return dot(gelu.forward(exec_space(), x), r); }, 0.01f,
      elementwise_noise, 63);
}
