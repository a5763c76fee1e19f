#pragma once
/// \file nn/detail/row_math.hpp
/// exp over a row of fp32 scores, the inner loop of softmax-like kernels (attention's online
/// softmax and its backward): xsimd batches in host passes, a scalar loop in device passes.
/// Device-callable. The results are within a few ulp of libm's expf (a tail shorter than a
/// batch goes through one padded batch, not the scalar exp); the sum is accumulated
/// per SIMD lane and then across lanes, so it differs from a left-to-right sum in the last bits
/// (deterministic: the same on every run and every thread count).
///
///   const float sum = tessera::nn::detail::exp_shifted(row, n, row_max); // row[c] = exp(row[c] -
///   row_max)

#include <tessera/config/kokkos_compat.hpp> // is_host_exec_v
#include <tessera/nn/detail/common.hpp>
#include <tessera/simd/lanes.hpp> // xsimd, host passes only

#include <type_traits>

namespace tessera::nn::detail {

#if !TESSERA_DEVICE_PASS && defined(__AVX512F__)
namespace avx512 {
/// The first k lanes: none for k <= 0, all 16 from k = 16.
inline __mmask16 first_lanes(index_t k) noexcept {
  return k <= 0    ? __mmask16(0)
         : k >= 16 ? __mmask16(0xffff)
                   : static_cast<__mmask16>((1u << k) - 1u);
}
/// exp of 16 lanes by xsimd (the same function as every other host path here).
[[gnu::always_inline]] inline __m512 exp16(__m512 x) noexcept {
  using B = xsimd::batch<float, xsimd::default_arch>;
  static_assert(B::size == 16);
  return xsimd::exp(B(x));
}
} // namespace avx512
#endif

/// x[c] = exp(x[c] - shift) for 0 <= c < n and x[c] = 0 for n <= c < nz (n <= nz; n may be
/// <= 0); returns the sum of the exps. On AVX-512 hosts the row's last partial batch is a
/// masked load and store (nothing outside [0, nz) is read or written).
KOKKOS_INLINE_FUNCTION float exp_shifted(float* x, index_t n, index_t nz, float shift) {
  float sum = 0.f;
  index_t c = 0;
#if !TESSERA_DEVICE_PASS
#if defined(__AVX512F__)
  if constexpr (tessera::detail::simd::available) {
    const __m512 s = _mm512_set1_ps(shift);
    __m512 acc = _mm512_setzero_ps();
    for (; c + 16 <= n; c += 16) {
      const __m512 p = avx512::exp16(_mm512_sub_ps(_mm512_loadu_ps(x + c), s));
      _mm512_storeu_ps(x + c, p);
      acc = _mm512_add_ps(acc, p);
    }
    for (; c < nz; c += 16) {
      // The lanes below n: exp; from n to nz: zero; the rest untouched.
      const __mmask16 live = avx512::first_lanes(n - c), keep = avx512::first_lanes(nz - c);
      const __m512 p = _mm512_maskz_mov_ps(
          live, avx512::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, x + c), s)));
      _mm512_mask_storeu_ps(x + c, keep, p);
      acc = _mm512_add_ps(acc, p);
    }
    return _mm512_reduce_add_ps(acc);
  }
#else
  if constexpr (tessera::detail::simd::available) {
    using B = xsimd::batch<float, xsimd::default_arch>;
    constexpr index_t w = index_t(B::size);
    {
      const B s(shift);
      B acc(0.f);
      for (; c + w <= n; c += w) {
        const B p = xsimd::exp(B::load_unaligned(x + c) - s);
        p.store_unaligned(x + c);
        acc += p;
      }
      if (c < n) {
        // The tail as one padded batch: the padding's exp(-1e30 - shift) is 0.
        alignas(64) float tail[w];
        for (index_t l = 0; l < w; ++l) tail[l] = c + l < n ? x[c + l] : -1.0e30f;
        const B p = xsimd::exp(B::load_aligned(tail) - s);
        p.store_aligned(tail);
        for (index_t l = 0; c + l < n; ++l) x[c + l] = tail[l];
        acc += p;
        c = n;
      }
      sum = xsimd::hadd(acc);
    }
  }
#endif
#endif
  for (; c < n; ++c) {
    const float p = kmath::exp(x[c] - shift);
    x[c] = p;
    sum += p;
  }
  for (c = c < 0 ? 0 : c; c < nz; ++c) x[c] = 0.f;
  return sum;
}

/// x[c] = exp(x[c] - shift) for 0 <= c < n; returns the sum of the new values.
KOKKOS_INLINE_FUNCTION float exp_shifted(float* x, index_t n, float shift) {
  return exp_shifted(x, n, n, shift);
}

/// The largest of x[0 .. n) (n >= 1): AVX-512 batches with a masked tail and a horizontal
/// maximum on AVX-512 hosts, xsimd batches on other hosts (a tail shorter than a batch padded
/// with x[0]), a scalar loop in device passes. Exact: the maximum does not depend on
/// the order.
KOKKOS_INLINE_FUNCTION float row_max(const float* x, index_t n) {
  float mx = x[0];
  index_t c = 1;
#if !TESSERA_DEVICE_PASS
#if defined(__AVX512F__)
  if constexpr (tessera::detail::simd::available) {
    __m512 m = _mm512_set1_ps(mx);
    for (c = 0; c + 16 <= n; c += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + c));
    if (c < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, avx512::first_lanes(n - c), x + c));
    return _mm512_reduce_max_ps(m);
  }
#else
  if constexpr (tessera::detail::simd::available) {
    using B = xsimd::batch<float, xsimd::default_arch>;
    constexpr index_t w = index_t(B::size);
    B m(mx);
    for (c = 0; c + w <= n; c += w) m = xsimd::max(m, B::load_unaligned(x + c));
    if (c < n) {
      alignas(64) float tail[w];
      for (index_t l = 0; l < w; ++l) tail[l] = c + l < n ? x[c + l] : mx;
      m = xsimd::max(m, B::load_aligned(tail));
    }
    alignas(64) float lanes[w]; // xsimd 8 has no horizontal maximum
    m.store_aligned(lanes);
    for (index_t l = 0; l < w; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    return mx;
  }
#endif
#endif
  for (; c < n; ++c) mx = x[c] > mx ? x[c] : mx;
  return mx;
}

/// The sum of f(j) over 0 <= j < n: f(j) goes to partial sum j % 16, and the 16 partial sums
/// are added pairwise (0 + 8, 1 + 9, ..., then 0 + 4, ...). Independent chains: the loop
/// vectorises without reassociating anything; the fp32 error grows with n / 16 + 4 terms.
/// Len: index_t, or std::integral_constant<index_t, N> (lane_sum<N>: the trip counts known).
template <class Len, class F>
KOKKOS_INLINE_FUNCTION float lane_sum_over(const Len n, const F& f) {
  constexpr index_t L = 16;
  float part[L] = {};
  index_t j = 0;
  for (; j + L <= index_t(n); j += L)
    for (index_t l = 0; l < L; ++l) part[l] += f(j + l);
  for (index_t l = 0; j + l < index_t(n); ++l) part[l] += f(j + l);
  for (index_t w = L / 2; w > 0; w /= 2)
    for (index_t l = 0; l < w; ++l) part[l] += part[l + w];
  return part[0];
}

/// lane_sum_over a run-time length n.
template <class F>
KOKKOS_INLINE_FUNCTION float lane_sum(const index_t n, const F& f) {
  return lane_sum_over(n, f);
}

/// lane_sum_over a compile-time length N (the loops' trip counts known to the compiler).
template <index_t N, class F>
KOKKOS_INLINE_FUNCTION float lane_sum(const F& f) {
  return lane_sum_over(std::integral_constant<index_t, N>{}, f);
}

/// Adjacent columns per work item of for_column_blocks on execution space Exec: 32 on the host
/// (a block of a row is two cache lines of fp32; the per-column sums vectorise across it), one
/// elsewhere (a device wants the parallel width).
template <class Exec>
inline constexpr index_t column_block = tessera::detail::is_host_exec_v<Exec> ? 32 : 1;

/// f(j0, w) for the blocks [j0, j0 + w) of column_block<Exec> adjacent columns covering 0..n,
/// in parallel. f sums its columns over the rows in row order (so each column's sum is the one
/// a work item per column would give) into at most column_block<Exec> accumulators. A full
/// block's w is std::integral_constant<index_t, column_block<Exec>> (f takes `auto w`): loops
/// to w then have a compile-time trip count, so the accumulators stay in registers across
/// the rows (with a run-time w the compiler keeps them in memory: a store-to-load chain per
/// row); the last, partial block gets an index_t.
template <class Exec, class F>
void for_column_blocks(const Exec& exec, const char* label, index_t n, const F& f) {
  constexpr index_t cols = column_block<Exec>;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, (n + cols - 1) / cols),
      KOKKOS_LAMBDA(const index_t c) {
        const index_t j0 = c * cols;
        if (n - j0 >= cols)
          f(j0, std::integral_constant<index_t, cols>{});
        else
          f(j0, n - j0);
      });
}

} // namespace tessera::nn::detail
