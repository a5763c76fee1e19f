// nn::LayerNorm (nn/layernorm.hpp), the layer added as one file to prove the nn::Layer concept:
//  - its declarations, and the defaults a layer without declarations gets (nn/layer.hpp);
//  - forward against an independent double-precision reference over odd shapes, ranks 2 and 3,
//    rows with a large mean, and x in fp32, bf16 and fp8;
//  - the analytic backward (dx, dgamma, dbeta) against central differences of the double
//    reference;
//  - LayerNorm inside nn::Sequential: forward and every parameter gradient of
//    Linear -> LayerNorm -> ReLU -> Linear against finite differences of a double model.
// Only <tessera/nn/layernorm.hpp> and <tessera/nn/sequential.hpp> are included: the layer
// needs no other header to list it.
#include <tessera/nn/activation.hpp>
#include <tessera/nn/layernorm.hpp>
#include <tessera/nn/linear.hpp>
#include <tessera/nn/sequential.hpp>

#include <boost/hana/at.hpp>
#include <boost/hana/length.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace nn = tessera::nn;
using tessera::dextents;
using tessera::dyn;
using tessera::extents;
using tessera::index_t;
using tessera::Tensor;

namespace {

constexpr double u32 = 1.0 / 16777216.0; // 2^-24, the fp32 unit roundoff

// ---- static properties -------------------------------------------------------------------------

static_assert(nn::Layer<nn::LayerNorm<8>>);
static_assert(nn::LayerShapeRule<nn::LayerNorm<8>, extents<dyn, 8>>);
static_assert(nn::LayerNorm<8>::accepts<extents<dyn, 8>>);
static_assert(nn::LayerNorm<8>::accepts<extents<dyn, 3, 8>>);
static_assert(nn::LayerNorm<8>::accepts<dextents<2>>); // checked at forward
static_assert(!nn::LayerNorm<8>::accepts<extents<dyn, 7>>);
static_assert(!nn::LayerNorm<8>::accepts<extents<8>>); // no batch dimension
static_assert(
    std::is_same_v<nn::LayerNorm<8>::output_extents<extents<dyn, 3, 8>>, extents<dyn, 3, 8>>);
static_assert(nn::LayerNorm<8>::eps == 1e-5f);
static_assert(nn::LayerNorm<8, std::ratio<1, 1000>>::eps == 1e-3f);
// Declared: 8 FLOPs per element. Not declared: the tensor split, so the default (replicate).
static_assert(nn::layer_traits<nn::LayerNorm<8>>::declares_flops<extents<dyn, 3, 8>>);
static_assert(nn::layer_traits<nn::LayerNorm<8>>::forward_flops<extents<dyn, 3, 8>> == 8 * 24);
static_assert(nn::layer_traits<nn::LayerNorm<8>>::tensor_split == nn::split_kind::replicate);

// What the other layers declare, read through the same traits.
static_assert(nn::layer_traits<nn::Linear<3, 5>>::tensor_split == nn::split_kind::splittable);
static_assert(nn::layer_traits<nn::Linear<3, 5>>::forward_flops<extents<dyn, 3>> == 30);
static_assert(nn::layer_traits<nn::ReLU>::tensor_split == nn::split_kind::per_feature);

// A minimal layer that declares nothing optional: a Layer, replicated, without FLOPs.
struct bare_layer {
  explicit bare_layer(std::uint64_t) {}
  auto parameters() const { return boost::hana::make_tuple(); }
  template <class InExt>
  [[maybe_unused]] static constexpr bool accepts = true; // unused by the checks below (clang)
  template <class InExt>
  using output_extents = InExt;
};
static_assert(nn::Layer<bare_layer>);
static_assert(nn::layer_traits<bare_layer>::tensor_split == nn::split_kind::replicate);
static_assert(!nn::layer_traits<bare_layer>::declares_flops<extents<dyn, 4>>);

// Types that miss a requirement are not Layers.
struct no_seed {
  auto parameters() const { return boost::hana::make_tuple(); }
};
struct bad_parameters {
  explicit bad_parameters(std::uint64_t) {}
  int parameters() const { return 0; }
};
static_assert(!nn::SeededLayer<no_seed> && !nn::Layer<no_seed>);
static_assert(nn::SeededLayer<bad_parameters> && !nn::LayerWithParameters<bad_parameters>);
static_assert(!nn::LayerShapeRule<no_seed, extents<dyn, 4>>);

// ---- the double-precision reference
// --------------------------------------------------------------

struct ln_ref {
  int D;
  double eps;
  std::vector<double> gamma, beta;

  // y of x (rows of D), in double.
  std::vector<double> forward(const std::vector<double>& x) const {
    std::vector<double> y(x.size());
    const std::size_t rows = x.size() / std::size_t(D);
    for (std::size_t r = 0; r < rows; ++r) {
      const double* xr = &x[r * D];
      double mean = 0;
      for (int j = 0; j < D; ++j) mean += xr[j];
      mean /= D;
      double var = 0;
      for (int j = 0; j < D; ++j) var += (xr[j] - mean) * (xr[j] - mean);
      var /= D; // biased, as PyTorch
      const double rstd = 1 / std::sqrt(var + eps);
      for (int j = 0; j < D; ++j) y[r * D + j] = gamma[j] * (xr[j] - mean) * rstd + beta[j];
    }
    return y;
  }
  double loss(const std::vector<double>& x, const std::vector<double>& r) const {
    const auto y = forward(x);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  }
};

std::vector<double> uniform(std::size_t n, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<float>(d(g)); // exactly representable in fp32
  return v;
}

template <class P, class Ext>
Tensor<P, Ext> tensor_from(const std::vector<double>& v, const Ext& e) {
  Tensor<P, Ext> t("t", e);
  auto h = tessera::to_host(t);
  for (index_t i = 0; i < h.size(); ++i)
    h.data()[i] = tessera::from_float<P>(static_cast<float>(v[std::size_t(i)]));
  Kokkos::deep_copy(t.kokkos_view(), h.kokkos_view());
  return t;
}

template <class T>
std::vector<double> values(const T& t) {
  const auto h = tessera::to_host(t);
  std::vector<double> v(std::size_t(h.size()));
  for (index_t i = 0; i < h.size(); ++i) v[std::size_t(i)] = tessera::to_float(h.data()[i]);
  return v;
}

template <class Param>
void set_values(const Param& p, const std::vector<double>& v) {
  auto h = tessera::to_host(p.value);
  for (index_t i = 0; i < h.size(); ++i) h.data()[i] = static_cast<float>(v[std::size_t(i)]);
  Kokkos::deep_copy(p.value.kokkos_view(), h.kokkos_view());
}

// ---- forward ---------------------------------------------------------------------------------

// Error of the fp32 forward, per element (Higham eq. 3.5, u = 2^-24): the mean of D values is
// within (D + 1) u max|x| of the exact one, which moves x_hat by that times rstd = 1/std; the
// variance (a sum of D squares) is within (D + 3) u relative, which moves rstd (a square root
// and a division) by (D + 3) u / 2 + 2 u relative and x_hat by that times |x_hat|; the affine
// map adds 2 u (|gamma x_hat| + |beta|). Doubled for the terms this leaves out (products of
// two errors, the rounding of x - mean). A wrong variance (unbiased instead of biased) moves
// x_hat by |x_hat| / 2D, which is above this bound for every D tested here with a mean of 3.
double forward_bound(int D, double max_abs_x, double stdev, double xhat, double g, double b) {
  const double dh =
      (D + 1) * u32 * max_abs_x / stdev + ((D + 3) * u32 / 2 + 2 * u32) * std::abs(xhat);
  return 2 * (std::abs(g) * dh + 2 * u32 * (std::abs(g * xhat) + std::abs(b)));
}

template <class P, index_t D, class Ext>
void check_forward(const Ext& e, std::uint64_t seed, double offset) {
  Kokkos::DefaultExecutionSpace exec;
  nn::LayerNorm<D> norm;
  const std::size_t n = std::size_t(e.size());
  // x rounded to P first: the reference sees the values the layer sees.
  auto xv = uniform(n, seed, offset - 1, offset + 1);
  const auto x = tensor_from<P>(xv, e);
  xv = values(x);
  ln_ref ref{int(D), double(norm.eps), uniform(D, seed + 1, 0.5, 1.5), uniform(D, seed + 2, -1, 1)};
  set_values(norm.gamma(), ref.gamma);
  set_values(norm.beta(), ref.beta);
  const auto y = norm.forward(exec, x);
  static_assert(std::is_same_v<typename decltype(y)::precision, P>);
  static_assert(std::is_same_v<typename decltype(y)::extents_type, Ext>);
  const auto got = values(y);
  const auto want = ref.forward(xv);
  const std::size_t rows = n / std::size_t(D);
  int bad = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0, max_abs = 0;
    for (index_t j = 0; j < D; ++j)
      mean += xv[r * D + j], max_abs = std::max(max_abs, std::abs(xv[r * D + j]));
    mean /= D;
    for (index_t j = 0; j < D; ++j) var += (xv[r * D + j] - mean) * (xv[r * D + j] - mean);
    const double stdev = std::sqrt(var / D + ref.eps);
    for (index_t j = 0; j < D; ++j) {
      const std::size_t i = r * D + j;
      const double xhat = (xv[i] - mean) / stdev;
      double tol = forward_bound(int(D), max_abs, stdev, xhat, ref.gamma[j], ref.beta[j]);
      // The output is rounded once more to P (nearest): u_P relative, half a subnormal step.
      if constexpr (!std::is_same_v<P, tessera::fp32>)
        tol += double(tessera::precision_traits<P>::unit_roundoff) * (std::abs(want[i]) + tol) +
               double(tessera::precision_traits<P>::min_subnormal) / 2;
      if (std::abs(got[i] - want[i]) > tol && ++bad <= 5)
        FAIL_CHECK("row " << r << " j " << j << ": " << got[i] << " vs " << want[i] << " (tol "
                          << tol << ")");
    }
  }
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("LayerNorm forward matches a double reference over odd shapes", "[nn][layernorm]") {
  SECTION("rank 2") {
    check_forward<tessera::fp32, 1>(extents<dyn, 1>(5), 11, 0.0); // one feature: y = beta
    check_forward<tessera::fp32, 3>(extents<dyn, 3>(1), 12, 0.0);
    check_forward<tessera::fp32, 7>(extents<dyn, 7>(5), 13, 3.0);
    check_forward<tessera::fp32, 33>(extents<dyn, 33>(3), 14, 3.0);
    check_forward<tessera::fp32, 257>(extents<dyn, 257>(2), 15, 3.0);
    check_forward<tessera::fp32, 7>(dextents<2>(9, 7), 16, -3.0);
  }
  SECTION("rank 3: every (b, t) row normalised") {
    check_forward<tessera::fp32, 17>(extents<dyn, 3, 17>(2), 17, 1.0);
  }
  SECTION("bf16 and fp8 inputs, outputs in the input's precision") {
    check_forward<tessera::bf16, 33>(extents<dyn, 33>(3), 18, 0.0);
    check_forward<tessera::fp8_e4m3, 7>(extents<dyn, 7>(4), 19, 0.0);
    check_forward<tessera::fp8_e5m2, 5>(extents<dyn, 2, 5>(3), 20, 0.0);
  }
  SECTION("a known row: x = (1, 2, 3, 4), mean 2.5, biased variance 1.25") {
    Kokkos::DefaultExecutionSpace exec;
    nn::LayerNorm<4, std::ratio<1, 4>> norm; // eps = 0.25: var + eps = 1.5
    const auto x = tensor_from<tessera::fp32>({1, 2, 3, 4}, extents<dyn, 4>(1));
    const auto y = values(norm.forward(exec, x));
    for (int j = 0; j < 4; ++j)
      CHECK(y[std::size_t(j)] == Approx((j + 1 - 2.5) / std::sqrt(1.5)).epsilon(1e-6));
  }
}

namespace {
// LayerNorm<D, Eps, Out>: y in Out is the fp32-output layer's y rounded to Out (one rounding of
// the same fp32 values: bit for bit), the saved statistics are the same (so is the backward),
// on the host path (vectorised rounding of whole rows) and for every row of odd shapes.
template <class Out, index_t D, class Ext>
void check_output_precision(const Ext& e, std::uint64_t seed) {
  Kokkos::DefaultExecutionSpace exec;
  nn::LayerNorm<D> wide;
  nn::LayerNorm<D, std::ratio<1, 100000>, Out> narrow;
  const std::size_t n = std::size_t(e.size());
  const auto x = tensor_from<tessera::fp32>(uniform(n, seed, -3, 5), e);
  const auto gamma = uniform(D, seed + 1, 0.5, 1.5), beta = uniform(D, seed + 2, -1, 1);
  set_values(wide.gamma(), gamma);
  set_values(wide.beta(), beta);
  set_values(narrow.gamma(), gamma);
  set_values(narrow.beta(), beta);
  const auto y32 = wide.forward(exec, x);
  const auto y = narrow.forward(exec, x);
  static_assert(std::is_same_v<typename decltype(y)::precision, Out>);
  static_assert(std::is_same_v<typename decltype(y)::extents_type, Ext>);
  auto ym = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y.kokkos_view());
  auto y32m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, y32.kokkos_view());
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto want = tessera::from_float<Out>(y32m(i));
    if (std::memcmp(&want, &ym(i), sizeof want) != 0 && ++bad <= 5)
      FAIL_CHECK("element " << i << ": " << tessera::to_float(ym(i)) << " vs "
                            << tessera::to_float(want));
  }
  CHECK(bad == 0);
  // The same dy (in Out) gives the same gradients: the statistics saved are the same.
  const auto dy = tensor_from<Out>(uniform(n, seed + 3, -1, 1), e);
  const auto dx32 = values(wide.backward(exec, dy));
  const auto dx = values(narrow.backward(exec, dy));
  CHECK(dx == dx32);
  CHECK(values(narrow.gamma().grad) == values(wide.gamma().grad));
  CHECK(values(narrow.beta().grad) == values(wide.beta().grad));
}
} // namespace

TEST_CASE("LayerNorm<D, Eps, bf16> rounds the fp32 layer's output once", "[nn][layernorm]") {
  check_output_precision<tessera::bf16, 1>(extents<dyn, 1>(3), 31);
  check_output_precision<tessera::bf16, 7>(extents<dyn, 7>(5), 32);
  check_output_precision<tessera::bf16, 33>(extents<dyn, 33>(4), 33);
  check_output_precision<tessera::bf16, 128>(extents<dyn, 3, 128>(2), 34);
  check_output_precision<tessera::bf16, 257>(dextents<2>(3, 257), 35);
  check_output_precision<tessera::fp16, 19>(extents<dyn, 19>(6), 36);
  check_output_precision<tessera::fp32, 19>(extents<dyn, 19>(6), 37); // Out = fp32 explicitly
}

TEST_CASE("LayerNorm checks its input and call order", "[nn][layernorm]") {
  Kokkos::DefaultExecutionSpace exec;
  nn::LayerNorm<8> norm;
  Tensor<tessera::fp32, dextents<2>> wrong("x", 3, 9);
  CHECK_THROWS_AS(norm.forward(exec, wrong), tessera::shape_error);
  Tensor<tessera::fp32, extents<dyn, 8>> dy("dy", 3);
  CHECK_THROWS_AS(norm.backward(exec, dy), tessera::value_error); // before any forward
  Tensor<tessera::fp32, extents<dyn, 8>> x("x", 3);
  (void)norm.forward(exec, x);
  Tensor<tessera::fp32, extents<dyn, 8>> dy4("dy", 4);
  CHECK_THROWS_AS(norm.backward(exec, dy4), tessera::shape_error);
}

// ---- backward --------------------------------------------------------------------------------

namespace {

// Central difference of the double reference: truncation h^2/6 |L'''| with h = 1e-3 and
// |L'''| <= ~10^2 for these sizes (rstd <= 2), so ~2e-5 at most; double rounding ~1e-16 / h.
// The analytic gradient is fp32: each is a sum of at most max(rows, D) products of O(1)
// values, so within ~max(rows, D) * 4 u (sum of |terms|) of exact (Higham eq. 3.5, the 4
// covering the rounding of x_hat and of the products). tol: 1e-4 of |g| plus 1e-4 absolute,
// far below the error a wrong formula makes (a missing term of dx is O(|g|), a transposed
// sum of dgamma mixes features of unrelated scale).
void check_close(const char* what, const std::vector<double>& got, const std::vector<double>& fd) {
  REQUIRE(got.size() == fd.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - fd[i]) > 1e-4 * std::abs(fd[i]) + 1e-4 && ++bad <= 5)
      FAIL_CHECK(what << "[" << i << "]: analytic " << got[i] << ", finite difference " << fd[i]);
  CHECK(bad == 0);
}

template <index_t D, class Ext>
void check_backward(const Ext& e, std::uint64_t seed) {
  Kokkos::DefaultExecutionSpace exec;
  nn::LayerNorm<D> norm;
  const std::size_t n = std::size_t(e.size());
  auto xv = uniform(n, seed, -2, 2);
  const auto r = uniform(n, seed + 3, -1, 1); // L = sum r y, so dL/dy = r
  ln_ref ref{int(D), double(norm.eps), uniform(D, seed + 1, 0.5, 1.5), uniform(D, seed + 2, -1, 1)};
  set_values(norm.gamma(), ref.gamma);
  set_values(norm.beta(), ref.beta);
  (void)norm.forward(exec, tensor_from<tessera::fp32>(xv, e));
  const auto dx = values(norm.backward(exec, tensor_from<tessera::fp32>(r, e)));
  const auto dgamma = values(norm.gamma().grad), dbeta = values(norm.beta().grad);

  const double h = 1e-3;
  const auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double lp = ref.loss(xv, r);
    v[i] = keep - h;
    const double lm = ref.loss(xv, r);
    v[i] = keep;
    return (lp - lm) / (2 * h);
  };
  std::vector<double> fd_x(n), fd_g(D), fd_b(D);
  for (std::size_t i = 0; i < n; ++i) fd_x[i] = fd(xv, i); // the loss reads xv itself
  for (std::size_t j = 0; j < std::size_t(D); ++j) {
    fd_g[j] = fd(ref.gamma, j);
    fd_b[j] = fd(ref.beta, j);
  }
  check_close("dx", dx, fd_x);
  check_close("dgamma", dgamma, fd_g);
  check_close("dbeta", dbeta, fd_b);

  // need_dx = false: the same parameter gradients, an empty dx.
  (void)norm.forward(exec, tensor_from<tessera::fp32>(xv, e));
  const auto none = norm.backward(exec, tensor_from<tessera::fp32>(r, e), false);
  CHECK(none.size() == 0);
  CHECK(values(norm.gamma().grad) == dgamma);
  CHECK(values(norm.beta().grad) == dbeta);
}

} // namespace

TEST_CASE("LayerNorm backward matches finite differences of a double reference",
          "[nn][layernorm]") {
  check_backward<7>(extents<dyn, 7>(3), 31);
  check_backward<1>(extents<dyn, 1>(4), 32); // x_hat = 0: dx = 0, dgamma = 0, dbeta = sum dy
  check_backward<13>(extents<dyn, 2, 13>(3), 33);
  check_backward<64>(dextents<2>(5, 64), 34);
}

// ---- in a Sequential -------------------------------------------------------------------------

namespace {

using LNModel = nn::Sequential<nn::Linear<5, 7>, nn::LayerNorm<7>, nn::ReLU, nn::Linear<7, 3>>;
static_assert(std::is_same_v<LNModel::output_extents<extents<dyn, 5>>, extents<dyn, 3>>);

// The same model in double: Linear(W1, b1) -> LayerNorm(g, be) -> ReLU -> Linear(W2, b2).
struct model_ref {
  std::vector<double> w1, b1, g, be, w2, b2;
  int B;
  std::vector<double> forward(const std::vector<double>& x) const {
    std::vector<double> h(std::size_t(B) * 7);
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < 7; ++o) {
        double s = b1[o];
        for (int i = 0; i < 5; ++i) s += w1[o * 5 + i] * x[b * 5 + i];
        h[b * 7 + o] = s;
      }
    const auto z = ln_ref{7, 1e-5, g, be}.forward(h);
    std::vector<double> y(std::size_t(B) * 3);
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < 3; ++o) {
        double s = b2[o];
        for (int i = 0; i < 7; ++i) s += w2[o * 7 + i] * std::max(z[b * 7 + i], 0.0);
        y[b * 3 + o] = s;
      }
    return y;
  }
};

} // namespace

TEST_CASE("LayerNorm in a Sequential: forward and every gradient", "[nn][layernorm]") {
  Kokkos::DefaultExecutionSpace exec;
  LNModel model(5);
  const int B = 4;
  // Parameters: (0.weight, 0.bias, 1.weight, 1.bias, 3.weight, 3.bias); LayerNorm's gamma
  // and beta set away from their initial 1 and 0 so that their gradients matter.
  auto params = model.parameters();
  static_assert(decltype(boost::hana::length(params))::value == 6);
  CHECK(boost::hana::at_c<2>(params).name == "1.weight");
  CHECK(boost::hana::at_c<3>(params).name == "1.bias");
  set_values(model.layer<1>().gamma(), uniform(7, 41, 0.5, 1.5));
  set_values(model.layer<1>().beta(), uniform(7, 42, -0.5, 0.5));
  model_ref ref{values(model.layer<0>().weight().value),
                values(model.layer<0>().bias().value),
                values(model.layer<1>().gamma().value),
                values(model.layer<1>().beta().value),
                values(model.layer<3>().weight().value),
                values(model.layer<3>().bias().value),
                B};
  auto xv = uniform(std::size_t(B) * 5, 43, -1, 1);
  const auto r = uniform(std::size_t(B) * 3, 44, -1, 1);
  const auto y = model.forward(exec, tensor_from<tessera::fp32>(xv, extents<dyn, 5>(B)));
  const auto want = ref.forward(xv);
  const auto got = values(y);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-5));
  const auto dx =
      values(model.backward(exec, tensor_from<tessera::fp32>(r, extents<dyn, 3>(B)), true));

  const double h = 1e-4;
  const auto loss = [&](const std::vector<double>& x) {
    const auto yv = ref.forward(x);
    double s = 0;
    for (std::size_t i = 0; i < yv.size(); ++i) s += r[i] * yv[i];
    return s;
  };
  const auto fd_of = [&](std::vector<double>& v) {
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double keep = v[i];
      v[i] = keep + h;
      const double lp = loss(xv);
      v[i] = keep - h;
      const double lm = loss(xv);
      v[i] = keep;
      out[i] = (lp - lm) / (2 * h);
    }
    return out;
  };
  check_close("0.weight", values(model.layer<0>().weight().grad), fd_of(ref.w1));
  check_close("0.bias", values(model.layer<0>().bias().grad), fd_of(ref.b1));
  check_close("1.weight (gamma)", values(model.layer<1>().gamma().grad), fd_of(ref.g));
  check_close("1.bias (beta)", values(model.layer<1>().beta().grad), fd_of(ref.be));
  check_close("3.weight", values(model.layer<3>().weight().grad), fd_of(ref.w2));
  check_close("3.bias", values(model.layer<3>().bias().grad), fd_of(ref.b2));
  const auto fd_x = fd_of(xv); // the loss reads xv itself
  check_close("dx", dx, fd_x);
}
