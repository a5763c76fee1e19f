#pragma once
// Shared by the conv tests: tensors from/to std::vector<double>, random shapes, and the error
// bound every comparison uses.
//
// Error bound (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5): a sum
// of L products formed in fp32, in any order, with or without FMA, is within
//   gamma_L * sum |terms|,   gamma_L = L u / (1 - L u),   u = 2^-24 (fp32 unit roundoff)
// of the exact sum. The reference gives the exact sum (double, on the same rounded inputs) and
// sum |terms|. An output of lower precision P is then rounded once more: + u_P |value| and, for
// results in P's subnormal range, + half P's smallest subnormal. L counts the reduction (e.g.
// C/groups*R*S for forward) plus 2 for the bias addition and the epilogue. One more absolute
// L * FLT_MIN covers kernels that flush fp32 subnormal products to zero (AVX-512 BF16 dot
// products do). fp8 outputs saturate, so the expected value is clamped to the largest finite.
#include "support/reference_conv.hpp"

#include <tessera/conv.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tessera::testing {

template <class P>
using tensor4 = Tensor<P, dextents<4>>; // (N, C, H, W) or (K, C/g, R, S), default memory space
template <class P>
using tensor1 = Tensor<P, dextents<1>>;

/// The elements of a tensor (any precision, any memory space) widened exactly to double.
template <class T>
std::vector<double> to_doubles(const T& t) {
  const auto h = to_host(t);
  std::vector<double> v(static_cast<std::size_t>(h.size()));
  for (index_t i = 0; i < h.size(); ++i) v[i] = to_float(h.data()[i]);
  return v;
}

/// A tensor of precision P with elements uniform in [-1, 1), rounded to P.
template <class P, class... I>
auto random_tensor(std::uint64_t seed, I... extents) {
  using T = std::conditional_t<sizeof...(I) == 4, tensor4<P>, tensor1<P>>;
  T t("t", extents...);
  fill_uniform(t, seed, -1.f, 1.f);
  return t;
}

/// The bound on |got - exact| for an output of precision P (see the file comment).
template <class P>
double error_bound(double exact, double abs_terms, index_t L) {
  const double u = precision_traits<fp32>::unit_roundoff;
  const double lu = static_cast<double>(L) * u;
  const double e32 = lu / (1 - lu) * abs_terms + static_cast<double>(L) * FLT_MIN;
  if constexpr (std::is_same_v<P, fp32>) {
    return e32;
  } else {
    return e32 + precision_traits<P>::unit_roundoff * (std::abs(exact) + e32) +
           precision_traits<P>::min_subnormal / 2.0;
  }
}

/// The exact value as P would hold it when it saturates (fp8) or not.
template <class P>
double clamp_to(double v) {
  if constexpr (precision_traits<P>::scaled) {
    const double m = precision_traits<P>::max_finite;
    return std::clamp(v, -m, m);
  } else {
    return v;
  }
}

/// Checks every element of got (precision P) against the reference; reports the first misses.
template <class T>
void require_within_bound(const std::string& what, const T& got, const reference_result& ref,
                          index_t L) {
  using P = typename T::precision;
  const auto g = to_doubles(got);
  REQUIRE(g.size() == ref.value.size());
  index_t bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double want = clamp_to<P>(ref.value[i]);
    const double tol = error_bound<P>(ref.value[i], ref.abs[i], L);
    if (!(std::abs(g[i] - want) <= tol)) {
      if (bad < 5)
        UNSCOPED_INFO(what << ": element " << i << " got " << g[i] << " want " << want
                           << " (|diff| " << std::abs(g[i] - want) << " > bound " << tol << ")");
      ++bad;
    }
  }
  CHECK(bad == 0);
}

/// A random convolution within the ranges: batch 1..4; channels 1, 3 and primes, with
/// groups 1, 2, 3 or depthwise; H, W 1..33; kernels 1..7 (non-square); strides and dilations
/// 1..3; padding 0..3 per side; every tenth or so a 1x1 stride-1 unpadded (pointwise) case.
/// The multiply-add count is capped (max_terms) to keep the double reference fast.
inline conv_shape random_conv_shape(std::mt19937_64& rng, index_t max_terms = 200000) {
  const auto pick = [&](std::initializer_list<index_t> l) {
    return *(l.begin() + std::uniform_int_distribution<std::size_t>(0, l.size() - 1)(rng));
  };
  const auto in = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(rng);
  };
  for (;;) {
    conv_shape s;
    s.N = in(1, 4);
    const index_t kind = in(0, 9);
    if (kind < 2) { // depthwise, with channel multiplier 1 or 2
      s.prm.groups = pick({2, 3, 5, 8, 13});
      s.C = s.prm.groups;
      s.K = s.C * pick({1, 2});
    } else if (kind < 4) {
      s.prm.groups = pick({2, 3});
      s.C = s.prm.groups * pick({1, 2, 3, 5});
      s.K = s.prm.groups * pick({1, 2, 3, 7});
    } else {
      s.C = pick({1, 2, 3, 5, 7, 11, 13, 16});
      s.K = pick({1, 3, 4, 5, 8, 17});
    }
    s.H = in(1, 33), s.W = in(1, 33);
    if (kind == 9) { // pointwise: im2col skipped
      s.R = s.S = 1;
    } else {
      s.R = in(1, 7), s.S = in(1, 7);
      s.prm.stride_h = in(1, 3), s.prm.stride_w = in(1, 3);
      s.prm.dilation_h = in(1, 3), s.prm.dilation_w = in(1, 3);
      s.prm.pad_top = in(0, 3), s.prm.pad_bottom = in(0, 3);
      s.prm.pad_left = in(0, 3), s.prm.pad_right = in(0, 3);
    }
    const index_t span_h =
        s.H + s.prm.pad_top + s.prm.pad_bottom - s.prm.dilation_h * (s.R - 1) - 1;
    const index_t span_w =
        s.W + s.prm.pad_left + s.prm.pad_right - s.prm.dilation_w * (s.S - 1) - 1;
    if (span_h < 0 || span_w < 0) continue; // empty output: tested separately
    if (s.N * s.K * s.P() * s.Q() * s.Cg() * s.R * s.S > max_terms) continue;
    return s;
  }
}

inline std::string describe(const conv_shape& s) {
  return "x (" + std::to_string(s.N) + ", " + std::to_string(s.C) + ", " + std::to_string(s.H) +
         ", " + std::to_string(s.W) + ") w (" + std::to_string(s.K) + ", " +
         std::to_string(s.Cg()) + ", " + std::to_string(s.R) + ", " + std::to_string(s.S) + ") " +
         s.prm.to_string();
}

} // namespace tessera::testing
