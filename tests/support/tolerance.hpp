#pragma once
// Error bounds for results accumulated in fp32 and stored in a precision P, used to compare a
// kernel against a double reference (tests/support/reference_gemm.hpp).
//
// Accumulation (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5): a
// sum of L rounded products and sums formed in fp32, in any order and blocking, with or without
// FMA, is within
//   gamma_L * sum |terms|,   gamma_L = L u / (1 - L u),   u = 2^-24 (fp32 unit roundoff),
// of the exact sum. The inputs are exactly representable (they are the stored values, widened),
// so input rounding does not enter; the reference gives the exact sum and sum |terms|.
// L counts the longest chain of roundings a term goes through: see gemm_rounding_steps.
// One more absolute L * FLT_MIN covers kernels that flush fp32 subnormal products or sums to
// zero (AMX TDPBF16PS and AVX-512 BF16 dot products do).
//
// Output: a result stored in a precision P narrower than fp32 is rounded once more, to nearest:
//   + u_P * |value| (value within the accumulation bound of the exact one)
//   + min_subnormal_P / 2 for results in P's subnormal range.
#include <tessera/precision.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

namespace tessera::testing {

/// The rounding steps of one element of C = alpha * op(A) op(B) + beta * C, inner dimension k:
/// k for the products and the sum over k (Higham's bound for an inner product of length k),
/// 1 for alpha times the sum, 1 for beta times C, 1 for adding the two, and 2 for folding the
/// scales of scaled (fp8) operands into alpha (alpha * scale_inv_a * scale_inv_b).
inline std::int64_t gemm_rounding_steps(std::int64_t k) {
  return k + 5;
}

/// gamma_L = L u / (1 - L u) with u the fp32 unit roundoff.
inline double gamma_fp32(std::int64_t steps) {
  const double lu = static_cast<double>(steps) * precision_traits<fp32>::unit_roundoff;
  return lu / (1.0 - lu);
}

/// Bound on |fp32 result - exact| for an fp32 accumulation of `steps` roundings whose terms
/// have magnitudes summing to abs_terms.
inline double fp32_accumulation_bound(double abs_terms, std::int64_t steps) {
  return gamma_fp32(steps) * abs_terms + static_cast<double>(steps) * FLT_MIN;
}

/// Bound on |stored - exact| when an fp32 value within `acc_bound` of `exact` is rounded to
/// precision P to nearest (no saturation involved).
template <Precision P>
double store_bound(double exact, double acc_bound) {
  if constexpr (std::is_same_v<P, fp32>) {
    return acc_bound;
  } else {
    return acc_bound + precision_traits<P>::unit_roundoff * (std::abs(exact) + acc_bound) +
           precision_traits<P>::min_subnormal / 2.0;
  }
}

/// The whole bound for one element of a GEMM with inner dimension k stored in precision P.
template <Precision P>
double gemm_error_bound(double exact, double abs_terms, std::int64_t k) {
  return store_bound<P>(exact, fp32_accumulation_bound(abs_terms, gemm_rounding_steps(k)));
}

/// The exact value as P holds it when the store saturates (fp8) or not (fp32, bf16).
template <Precision P>
double saturated(double v) {
  if constexpr (precision_traits<P>::scaled) {
    const double m = precision_traits<P>::max_finite;
    return std::clamp(v, -m, m);
  } else {
    return v;
  }
}

} // namespace tessera::testing
