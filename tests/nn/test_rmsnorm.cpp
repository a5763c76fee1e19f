// nn::RMSNorm (nn/rmsnorm.hpp): forward against a double reference (ranks 2 and 3, bf16
// input), backward (dx, dgamma) against central differences of the double reference, and its
// errors.
#include "nn_testing.hpp"

#include <tessera/nn/rmsnorm.hpp>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

static_assert(nn::Layer<nn::RMSNorm<8>>);
static_assert(nn::RMSNorm<8>::accepts<extents<dyn, dyn, 8>>);
static_assert(!nn::RMSNorm<8>::accepts<extents<dyn, 7>>);
static_assert(nn::layer_traits<nn::RMSNorm<8>>::forward_flops<extents<dyn, 3, 8>> == 96);

struct rms_ref {
  int D;
  double eps;
  std::vector<double> gamma;
  std::vector<double> forward(const std::vector<double>& x) const {
    std::vector<double> y(x.size());
    for (std::size_t r = 0; r < x.size() / std::size_t(D); ++r) {
      double sq = 0;
      for (int j = 0; j < D; ++j) sq += x[r * D + j] * x[r * D + j];
      const double rstd = 1 / std::sqrt(sq / D + eps);
      for (int j = 0; j < D; ++j) y[r * D + j] = gamma[std::size_t(j)] * x[r * D + j] * rstd;
    }
    return y;
  }
  /// sum_i r_i y_i, without a temporary (GCC 12 reports a false -Wfree-nonheap-object on the
  /// inlined vector of a lambda that returns forward()'s result).
  double loss(const std::vector<double>& x, const std::vector<double>& r) const {
    double s = 0;
    for (std::size_t row = 0; row < x.size() / std::size_t(D); ++row) {
      double sq = 0;
      for (int j = 0; j < D; ++j) sq += x[row * D + j] * x[row * D + j];
      const double rstd = 1 / std::sqrt(sq / D + eps);
      for (int j = 0; j < D; ++j)
        s += r[row * D + j] * gamma[std::size_t(j)] * x[row * D + j] * rstd;
    }
    return s;
  }
};

template <index_t D, class Ext>
void check(const Ext& e, std::uint64_t seed) {
  INFO("RMSNorm<" << D << "> on " << shape_string(e));
  nn::RMSNorm<D> norm;
  const std::size_t n = std::size_t(e.size());
  auto xv = uniform_values(n, seed, -2, 2);
  rms_ref ref{int(D), double(norm.eps), uniform_values(std::size_t(D), seed + 1, 0.5, 1.5)};
  {
    auto h = to_host(norm.gamma().value);
    for (index_t j = 0; j < D; ++j) h.data()[j] = float(ref.gamma[std::size_t(j)]);
    Kokkos::deep_copy(norm.gamma().value.kokkos_view(), h.kokkos_view());
  }
  const auto y = to_doubles(norm.forward(exec_space(), tensor_from<fp32>(xv, e)));
  const auto want = ref.forward(xv);
  // fp32: the sum of D squares within (D + 2) u relative, rstd within that / 2 + 2 u, the two
  // products 2 u: within (D + 8) u |y| (doubled).
  for (std::size_t i = 0; i < n; ++i)
    CHECK(std::abs(y[i] - want[i]) <= 2 * double(D + 8) * u32 * std::abs(want[i]) + 1e-7);
  const auto r = uniform_values(n, seed + 2);
  const auto dx = to_doubles(norm.backward(exec_space(), tensor_from<fp32>(r, e)));
  const auto dg = to_doubles(norm.gamma().grad);
  const auto loss = [&](const rms_ref& m, const std::vector<double>& x) { return m.loss(x, r); };
  // Central differences of the double reference, h = 1e-4: truncation h^2/6 |L'''| < 1e-7
  // for rows with rms >= ~0.5; the fp32 gradient within ~1e-5 (sums of <= D or rows terms).
  const double h = 1e-4;
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    auto p = xv, m = xv;
    p[i] += h;
    m[i] -= h;
    const double fd = (loss(ref, p) - loss(ref, m)) / (2 * h);
    if (std::abs(fd - dx[i]) > 1e-4 * std::abs(fd) + 1e-4 && bad++ < 5)
      FAIL_CHECK("dx[" << i << "] " << dx[i] << " vs " << fd);
  }
  for (std::size_t j = 0; j < std::size_t(D); ++j) {
    auto p = ref, m = ref;
    p.gamma[j] += h;
    m.gamma[j] -= h;
    const double fd = (loss(p, xv) - loss(m, xv)) / (2 * h);
    if (std::abs(fd - dg[j]) > 1e-4 * std::abs(fd) + 1e-4 && bad++ < 5)
      FAIL_CHECK("dgamma[" << j << "] " << dg[j] << " vs " << fd);
  }
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("nn::RMSNorm: forward and gradients against a double reference", "[nn][rmsnorm]") {
  check<7>(extents<dyn, 7>(3), 1);
  check<1>(extents<dyn, 1>(4), 2);
  check<13>(extents<dyn, dyn, 13>(2, 5), 3);
  check<64>(extents<dyn, 3, 64>(2), 4);
  // bf16 input: the output is x's precision, within bf16 rounding of the fp32 result.
  nn::RMSNorm<16> norm;
  const auto xv = uniform_values(3 * 16, 5, -2, 2);
  const auto yb = norm.forward(exec_space(), tensor_from<bf16>(xv, extents<dyn, 16>(3)));
  static_assert(std::is_same_v<decltype(yb)::precision, bf16>);
  const auto want = rms_ref{16, 1e-5, std::vector<double>(16, 1.0)}.forward(
      to_doubles(tensor_from<bf16>(xv, extents<dyn, 16>(3))));
  const auto got = to_doubles(yb);
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK(std::abs(got[i] - want[i]) <= 4e-3 * std::abs(want[i]) + 1e-6);
  CHECK_THROWS_AS(norm.forward(exec_space(), Tensor<fp32, dextents<2>>("x", 2, 15)), shape_error);
  nn::RMSNorm<16> fresh;
  CHECK_THROWS_AS(fresh.backward(exec_space(), Tensor<fp32, extents<dyn, 16>>("dy", 2)),
                  value_error);
}
