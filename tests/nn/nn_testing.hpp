#pragma once
// Shared by the nn tests: random tensors, host access, and the finite-difference gradient check.
//
// Gradient check. For a layer f and a fixed random r (uniform in [-1, 1)), the scalar
//   L(theta) = sum_i r_i y_i,  y = f(x; theta),
// is formed in double from the fp32 outputs; backward(dy = r) must give dL/dtheta. For a
// sample of coordinates t (of x, of each weight and bias), the central difference
//   fd = (L(t + h) - L(t - h)) / 2h
// is compared with the analytic value g: |fd - g| <= tol_rel * |g| + noise, where
//  - the truncation error is zero for Linear and Conv2d (L is linear in each single
//    coordinate) and for ReLU / MaxPool2d when no input is within h of a kink (the tests keep
//    inputs |x| >= 0.1 and window values 0.05 apart, h = 0.01), and h^2/6 max|L'''| <= 2e-5
//    for GELU with h = 1e-2 (|GELU'''| <= 1.2);
//  - noise bounds the fp32 rounding of the outputs that the perturbation changes: each is a
//    sum of at most k products (k the reduction length) with |terms| summing to at most A, so
//    its error is <= gamma_k A ~ k u A (Higham eq. 3.5, u = 2^-24); L+ and L- each carry it for
//    every changed output, times |r| <= 1, and the difference is divided by 2h:
//      noise = 2 * changed * k * u * A / (2h).
// tol_rel = 1e-4 covers the fp32 rounding of g itself (a sum of at most a few hundred terms).
#include "support/exec_spaces.hpp"

#include <tessera/nn.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace tessera::testing {

inline constexpr double u32 = 1.0 / 16777216.0; // 2^-24, fp32 unit roundoff

/// The elements of a tensor widened to double (host copy).
template <class T>
std::vector<double> to_doubles(const T& t) {
  const auto h = to_host(t);
  std::vector<double> v(static_cast<std::size_t>(h.size()));
  for (index_t i = 0; i < h.size(); ++i) v[static_cast<std::size_t>(i)] = to_float(h.data()[i]);
  return v;
}

/// sum r_i y_i in double.
template <class T>
double dot(const T& y, const std::vector<double>& r) {
  const auto v = to_doubles(y);
  REQUIRE(v.size() == r.size());
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

/// A tensor in default memory holding r (rounded to P).
template <class P, class Ext>
Tensor<P, Ext> tensor_from(const std::vector<double>& r, const Ext& e) {
  Tensor<P, Ext> t("t", e);
  auto h = to_host(t);
  for (index_t i = 0; i < h.size(); ++i)
    h.data()[i] = from_float<P>(static_cast<float>(r[static_cast<std::size_t>(i)]));
  Kokkos::deep_copy(t.kokkos_view(), h.kokkos_view());
  return t;
}

inline std::vector<double> uniform_values(std::size_t n, std::uint64_t seed, double lo = -1,
                                          double hi = 1) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<float>(d(g)); // exactly representable in fp32
  return v;
}

/// Adds delta to element i of an fp32 tensor living in host-accessible memory.
template <class T>
void bump(const T& t, index_t i, float delta) {
  t.data()[i] += delta;
}

/// Sampled coordinates of a tensor of n elements: all if n <= max, else max random ones
/// (always including the first and the last).
inline std::vector<index_t> sample(index_t n, std::size_t max, std::uint64_t seed) {
  std::vector<index_t> s;
  if (static_cast<std::size_t>(n) <= max) {
    for (index_t i = 0; i < n; ++i) s.push_back(i);
    return s;
  }
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<index_t> d(0, n - 1);
  s.push_back(0);
  s.push_back(n - 1);
  while (s.size() < max) s.push_back(d(g));
  return s;
}

/// Compares the analytic gradient of one tensor with central differences of loss().
/// t: the fp32 tensor perturbed (host-accessible); grad: the analytic gradient (any precision);
/// noise: the absolute rounding allowance (see the file comment).
template <class T, class G>
void check_tensor_gradient(const std::string& what, const T& t, const G& grad,
                           const std::function<double()>& loss, float h, double noise,
                           std::uint64_t seed, double tol_rel = 1e-4) {
  INFO(what << ": h " << h << ", noise allowance " << noise);
  const auto g = to_doubles(grad);
  REQUIRE(static_cast<index_t>(g.size()) == t.size());
  int misses = 0;
  for (index_t i : sample(t.size(), 40, seed)) {
    const float orig = t.data()[i];
    t.data()[i] = orig + h;
    const double lp = loss();
    t.data()[i] = orig - h;
    const double lm = loss();
    t.data()[i] = orig;
    // (orig + h) - (orig - h) as actually stored in fp32, not 2h.
    const double step = static_cast<double>(orig + h) - static_cast<double>(orig - h);
    const double fd = (lp - lm) / step;
    const double gi = g[static_cast<std::size_t>(i)];
    if (std::abs(fd - gi) > tol_rel * std::abs(gi) + noise && misses++ < 5)
      FAIL_CHECK(what << "[" << i << "]: finite difference " << fd << ", analytic " << gi);
  }
  CHECK(misses == 0);
}

} // namespace tessera::testing
