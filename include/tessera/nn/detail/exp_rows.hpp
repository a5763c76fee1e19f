#pragma once
/// \file nn/detail/exp_rows.hpp
/// exp over a row of fp32 scores, the inner loop of softmax-like kernels (attention's online
/// softmax and its backward): xsimd batches in host passes, a scalar loop in device passes.
/// Device-callable. The results are within a few ulp of libm's expf; the sum is accumulated
/// per SIMD lane and then across lanes, so it differs from a left-to-right sum in the last bits
/// (deterministic: the same on every run and every thread count).
///
///   const float sum = tessera::nn::detail::exp_shifted(row, n, row_max); // row[c] = exp(row[c] -
///   row_max)

#include <tessera/nn/detail/common.hpp>
#include <tessera/simd/lanes.hpp> // xsimd, host passes only

namespace tessera::nn::detail {

/// x[c] = exp(x[c] - shift) for 0 <= c < n; returns the sum of the new values.
KOKKOS_INLINE_FUNCTION float exp_shifted(float* x, index_t n, float shift) {
  float sum = 0.f;
  index_t c = 0;
#if !TESSERA_DEVICE_PASS
  if constexpr (tessera::detail::simd::available) {
    using B = xsimd::batch<float, xsimd::default_arch>;
    constexpr index_t w = index_t(B::size);
    if (n >= w) {
      const B s(shift);
      B acc(0.f);
      for (; c + w <= n; c += w) {
        const B p = xsimd::exp(B::load_unaligned(x + c) - s);
        p.store_unaligned(x + c);
        acc += p;
      }
      sum = xsimd::hadd(acc);
    }
  }
#endif
  for (; c < n; ++c) {
    const float p = kmath::exp(x[c] - shift);
    x[c] = p;
    sum += p;
  }
  return sum;
}

} // namespace tessera::nn::detail
