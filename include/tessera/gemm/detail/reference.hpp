#pragma once
/// \file gemm/detail/reference.hpp
/// gemm_algo::reference (one work item per C element, an MDRange) and gemm_algo::direct (one
/// work item per row of C, the row's outputs accumulated together over K so that B's rows are
/// read contiguously when B is row-major): the paths for small problems, on any space. On a host
/// space gemm_direct takes raw-pointer forms with contiguous, vectorised inner loops when the
/// strides allow (gemm_direct_host_rows when B's rows are contiguous, gemm_direct_host_dots when
/// A's rows and B's columns are); the generic loop stays for every other case and on devices.

#include <tessera/config/kokkos_compat.hpp>
#include <tessera/gemm/detail/problem.hpp>

#include <type_traits>

namespace tessera::detail {

template <class Exec, class Prob>
float gemm_reference(const Exec& exec, const Prob& pr) {
  float amax = 0.f;
  if (pr.m == 0 || pr.n == 0) return amax;
  const auto body = KOKKOS_LAMBDA(const index_t i, const index_t j, float& mx) {
    float acc = 0.f;
    for (index_t p = 0; p < pr.k; ++p) acc += to_float(pr.a(i, p)) * to_float(pr.b(p, j));
    const float a = pr.store(acc, i, j);
    mx = a > mx ? a : mx;
  };
  Kokkos::parallel_reduce("tessera::gemm[reference]",
                          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {pr.m, pr.n}),
                          body, Kokkos::Max<float>(amax));
  exec.fence();
  return amax;
}

/// Columns of one row handled together by gemm_direct: 16 fp32 accumulators fit a register file
/// of 16 (AVX2) or 32 (AVX-512) vector registers as one or two vectors.
inline constexpr index_t direct_block = 16;

/// Stores acc[0, nj) as C(i, j0 + j) through the problem's store; returns the larger of mx and
/// their amax. A plain problem (fp32 C with unit column stride, no epilogue ops, no output
/// scale) takes a contiguous loop the compiler vectorises: per-element stores cost more than
/// the products of a K = 9 row.
template <class Prob>
TESSERA_INLINE float direct_store_row(const Prob& pr, const float* acc, index_t i, index_t j0,
                                      index_t nj, float mx) {
  constexpr bool plain = std::is_same_v<typename Prob::pc, fp32> &&
                         std::is_same_v<decltype(Prob::ops), op_pack<>> && !Prob::scaled_out;
  if constexpr (plain) {
    if (pr.c.stride(1) == 1) {
      float* const crow = pr.c.data() + i * pr.c.stride(0) + j0;
      const float al = pr.alpha, be = pr.beta;
      if (be == 0.f) {
        for (index_t j = 0; j < nj; ++j) crow[j] = al * acc[j];
      } else {
        for (index_t j = 0; j < nj; ++j) crow[j] = al * acc[j] + be * crow[j];
      }
      return mx;
    }
  }
  for (index_t j = 0; j < nj; ++j) {
    const float a = pr.store(acc[j], i, j0 + j);
    mx = a > mx ? a : mx;
  }
  return mx;
}

/// Host form of gemm_direct when B's rows are contiguous (B(p, j) at b[p * ldb + j]): one work
/// item per row of C and direct_rows_block columns, C(i, j0:j0+W) += A(i, p) * B(p, j0:j0+W)
/// over p, a contiguous inner loop the compiler vectorises (the conv forward, 32 x 4096 x 9, and
/// Linear's backward). 64 columns: 4 AVX-512 vectors of accumulators, and M = 32 rows of 4096
/// columns still give 2048 work items to share between threads.
inline constexpr index_t direct_rows_block = 64;

template <class Exec, class Prob>
float gemm_direct_host_rows(const Exec& exec, const Prob& pr) {
  constexpr index_t w = direct_rows_block;
  float amax = 0.f;
  const index_t n = pr.n, k = pr.k, ldb = pr.b.stride(0);
  const index_t nblk = (n + w - 1) / w;
  const auto* const b = pr.b.data();
  const auto body = KOKKOS_LAMBDA(const index_t item, float& mx) {
    const index_t i = item / nblk, j0 = (item % nblk) * w;
    const index_t nj = n - j0 < w ? n - j0 : w;
    float acc[w];
    for (index_t j = 0; j < w; ++j) acc[j] = 0.f;
    if (nj == w) {
      for (index_t p = 0; p < k; ++p) {
        const float av = to_float(pr.a(i, p));
        const auto* const br = b + p * ldb + j0;
        for (index_t j = 0; j < w; ++j) acc[j] += av * to_float(br[j]);
      }
    } else {
      for (index_t p = 0; p < k; ++p) {
        const float av = to_float(pr.a(i, p));
        const auto* const br = b + p * ldb + j0;
        for (index_t j = 0; j < nj; ++j) acc[j] += av * to_float(br[j]);
      }
    }
    mx = direct_store_row(pr, acc, i, j0, nj, mx); // (mx is memory C's stores could alias)
  };
  Kokkos::parallel_reduce("tessera::gemm[direct rows]",
                          Kokkos::RangePolicy<Exec>(exec, 0, pr.m * nblk), body,
                          Kokkos::Max<float>(amax));
  exec.fence();
  return amax;
}

/// Host form of gemm_direct when A's rows and B's columns are contiguous (C(i, j) is a dot
/// product of two contiguous vectors: the conv weight gradient, 32 x 9 x 50000, and Linear's
/// forward x W^T). One work item per 4 x 4 block of C, 16 lanes of partial sums per element
/// (the inner loop over the lanes vectorises, 16 vector accumulators); the lanes are added in a
/// fixed order at the end, so the result does not depend on the thread count. Rows and columns
/// past the edge of C repeat the last one and are not stored.
inline constexpr index_t direct_dot_rows = 4, direct_dot_cols = 4, direct_dot_lanes = 16;

template <class Exec, class Prob>
float gemm_direct_host_dots(const Exec& exec, const Prob& pr) {
  constexpr index_t rb = direct_dot_rows, cb = direct_dot_cols, nl = direct_dot_lanes;
  float amax = 0.f;
  const index_t m = pr.m, n = pr.n, k = pr.k, lda = pr.a.stride(0), ldb = pr.b.stride(1);
  const index_t mblk = (m + rb - 1) / rb, nblk = (n + cb - 1) / cb;
  const auto* const a = pr.a.data();
  const auto* const b = pr.b.data();
  const index_t kv = k - k % nl;
  static_assert(rb == 4 && cb == 4, "the row and column pointers below are written out for 4");
  const auto body = KOKKOS_LAMBDA(const index_t item, float& mx) {
    const index_t i0 = (item / nblk) * rb, j0 = (item % nblk) * cb;
    const decltype(a) ar[rb] = {
        a + (i0 + 0 < m ? i0 + 0 : m - 1) * lda, a + (i0 + 1 < m ? i0 + 1 : m - 1) * lda,
        a + (i0 + 2 < m ? i0 + 2 : m - 1) * lda, a + (i0 + 3 < m ? i0 + 3 : m - 1) * lda};
    const decltype(b) bc[cb] = {
        b + (j0 + 0 < n ? j0 + 0 : n - 1) * ldb, b + (j0 + 1 < n ? j0 + 1 : n - 1) * ldb,
        b + (j0 + 2 < n ? j0 + 2 : n - 1) * ldb, b + (j0 + 3 < n ? j0 + 3 : n - 1) * ldb};
    float acc[rb][cb][nl];
    for (index_t r = 0; r < rb; ++r)
      for (index_t c = 0; c < cb; ++c)
        for (index_t l = 0; l < nl; ++l) acc[r][c][l] = 0.f;
    for (index_t p = 0; p < kv; p += nl) {
      float av[rb][nl], bv[cb][nl];
      for (index_t r = 0; r < rb; ++r)
        for (index_t l = 0; l < nl; ++l) av[r][l] = to_float(ar[r][p + l]);
      for (index_t c = 0; c < cb; ++c)
        for (index_t l = 0; l < nl; ++l) bv[c][l] = to_float(bc[c][p + l]);
      for (index_t r = 0; r < rb; ++r)
        for (index_t c = 0; c < cb; ++c)
          for (index_t l = 0; l < nl; ++l) acc[r][c][l] += av[r][l] * bv[c][l];
    }
    float top = mx;
    for (index_t r = 0; r < rb; ++r)
      for (index_t c = 0; c < cb; ++c) {
        float s = 0.f;
        for (index_t l = 0; l < nl; ++l) s += acc[r][c][l];
        for (index_t p = kv; p < k; ++p) s += to_float(ar[r][p]) * to_float(bc[c][p]);
        if (i0 + r < m && j0 + c < n) {
          const float v = pr.store(s, i0 + r, j0 + c);
          top = v > top ? v : top;
        }
      }
    mx = top;
  };
  Kokkos::parallel_reduce("tessera::gemm[direct dots]",
                          Kokkos::RangePolicy<Exec>(exec, 0, mblk * nblk), body,
                          Kokkos::Max<float>(amax));
  exec.fence();
  return amax;
}

template <class Exec, class Prob>
float gemm_direct(const Exec& exec, const Prob& pr) {
  float amax = 0.f;
  if (pr.m == 0 || pr.n == 0) return amax;
  if constexpr (is_host_exec_v<Exec>) {
    // Raw pointers and contiguous inner loops where the operands allow them.
    if (pr.b.stride(1) == 1 && pr.n > 1) return gemm_direct_host_rows(exec, pr);
    if (pr.a.stride(1) == 1 && pr.b.stride(0) == 1 && pr.k > 1)
      return gemm_direct_host_dots(exec, pr);
  }
  const index_t nblk = (pr.n + direct_block - 1) / direct_block;
  const auto body = KOKKOS_LAMBDA(const index_t w, float& mx) {
    const index_t i = w / nblk, j0 = (w % nblk) * direct_block;
    const index_t nj = pr.n - j0 < direct_block ? pr.n - j0 : direct_block;
    float acc[direct_block];
    for (index_t j = 0; j < direct_block; ++j) acc[j] = 0.f;
    if (nj == direct_block) {
      for (index_t p = 0; p < pr.k; ++p) {
        const float av = to_float(pr.a(i, p));
        for (index_t j = 0; j < direct_block; ++j) acc[j] += av * to_float(pr.b(p, j0 + j));
      }
    } else {
      for (index_t p = 0; p < pr.k; ++p) {
        const float av = to_float(pr.a(i, p));
        for (index_t j = 0; j < nj; ++j) acc[j] += av * to_float(pr.b(p, j0 + j));
      }
    }
    for (index_t j = 0; j < nj; ++j) {
      const float a = pr.store(acc[j], i, j0 + j);
      mx = a > mx ? a : mx;
    }
  };
  Kokkos::parallel_reduce("tessera::gemm[direct]", Kokkos::RangePolicy<Exec>(exec, 0, pr.m * nblk),
                          body, Kokkos::Max<float>(amax));
  exec.fence();
  return amax;
}

} // namespace tessera::detail
