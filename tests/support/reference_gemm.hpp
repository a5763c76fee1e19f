#pragma once
// Slow, obviously correct matrix multiply in double precision, for the gemm tests (and anyone
// who needs C = alpha * A B + beta * C to compare against).
//
// Matrices are plain row-major std::vector<double>; the caller widens its (exactly
// representable) inputs to double first, so the only rounding here is double's, which is
// 2^29 times finer than fp32's and negligible in every tolerance the tests use. Besides the
// result, every element also gets the sum of the magnitudes of the terms that formed it, the
// quantity floating-point error bounds are proportional to (see tests/support/tolerance.hpp).
//
// This file depends on nothing in tessera.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera::testing {

/// A dense row-major matrix of doubles.
struct dmatrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> v; ///< rows * cols values, element (i, j) at i * cols + j

  dmatrix() = default;
  dmatrix(std::int64_t r, std::int64_t c, double fill = 0.0)
      : rows(r), cols(c), v(static_cast<std::size_t>(r * c), fill) {}
  double& operator()(std::int64_t i, std::int64_t j) {
    return v[static_cast<std::size_t>(i * cols + j)];
  }
  double operator()(std::int64_t i, std::int64_t j) const {
    return v[static_cast<std::size_t>(i * cols + j)];
  }
};

/// A reference result and, per element, sum |term| over the terms that formed it.
struct gemm_reference {
  dmatrix value, abs;
};

/// value = alpha * A B + beta * C_old and abs = |alpha| * sum_p |a_ip b_pj| + |beta c_ij|,
/// for A (M, K), B (K, N), C_old (M, N). beta == 0 ignores C_old entirely (as BLAS does: NaN
/// in C_old does not reach the result); C_old may then be empty. The loop order i, p, j walks
/// rows of B contiguously, nothing more clever.
inline gemm_reference reference_gemm(const dmatrix& a, const dmatrix& b, double alpha = 1.0,
                                     double beta = 0.0, const dmatrix& c_old = {}) {
  const std::int64_t m = a.rows, k = a.cols, n = b.cols;
  gemm_reference r{dmatrix(m, n), dmatrix(m, n)};
  std::vector<double> sum(static_cast<std::size_t>(n)), mag(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) sum[j] = mag[j] = 0.0;
    for (std::int64_t p = 0; p < k; ++p) {
      const double aip = a(i, p);
      for (std::int64_t j = 0; j < n; ++j) {
        const double t = aip * b(p, j);
        sum[j] += t;
        mag[j] += std::abs(t);
      }
    }
    for (std::int64_t j = 0; j < n; ++j) {
      double value = alpha * sum[j], abs = std::abs(alpha) * mag[j];
      if (beta != 0.0) {
        value += beta * c_old(i, j);
        abs += std::abs(beta * c_old(i, j));
      }
      r.value(i, j) = value;
      r.abs(i, j) = abs;
    }
  }
  return r;
}

/// The transpose of a matrix (for building op(X) = X^T references).
inline dmatrix transposed(const dmatrix& x) {
  dmatrix t(x.cols, x.rows);
  for (std::int64_t i = 0; i < x.rows; ++i)
    for (std::int64_t j = 0; j < x.cols; ++j) t(j, i) = x(i, j);
  return t;
}

} // namespace tessera::testing
