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
#include <tessera/precision/vector_convert.hpp> // convert_n (host forms)
#include <tessera/simd/lanes.hpp>               // xsimd (host forms)

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

#if !TESSERA_DEVICE_PASS
/// Host form of gemm_direct when B's rows are contiguous (B(p, j) at b[p * ldb + j]): the conv
/// forward (32 x 4096 x 9), the first convolution's col2im GEMM (9 x 50176 x 32), Linear's
/// backward. A work item is up to direct_rows_group rows of C (M split into equal groups: M = 9
/// is one group) and direct_rows_block columns (4 AVX-512 vectors of accumulators). B's block is
/// read once per group, not once per row of C (a row at a time streamed all of B from memory M
/// times), in panels of direct_rows_depth rows: fp32 rows are read in place; narrower storage is
/// widened once per group by convert_n (vectorised, the same values as to_float) into an
/// L1-resident float panel: decoding fp8 per element inside the FMA loop, once per row, cost 20x
/// the products (the col2im GEMM in fp8: 0.9 GFLOP/s against bf16's 17). Each row of the group then
/// runs over the panel with its accumulators in vector registers. Every C element is the sum over p
/// in order of fused multiply-adds, as before. Host only (a plain lambda: convert_n and xsimd have
/// no device form).
inline constexpr index_t direct_rows_block = 64, direct_rows_group = 16, direct_rows_depth = 64;

template <class Exec, class Prob>
float gemm_direct_host_rows(const Exec& exec, const Prob& pr) {
  constexpr index_t w = direct_rows_block, g = direct_rows_group, kc = direct_rows_depth;
  using sb = std::remove_cv_t<std::remove_pointer_t<decltype(pr.b.data())>>;
  float amax = 0.f;
  const index_t m = pr.m, n = pr.n, k = pr.k, ldb = pr.b.stride(0);
  const index_t nblk = (n + w - 1) / w, ngrp = (m + g - 1) / g, rows = (m + ngrp - 1) / ngrp;
  const sb* const b = pr.b.data();
  const auto body = [=](const index_t item, float& mx) {
    const index_t i0 = (item / nblk) * rows, j0 = (item % nblk) * w;
    const index_t nj = n - j0 < w ? n - j0 : w, ni = m - i0 < rows ? m - i0 : rows;
    alignas(64) float acc[g][w];
    alignas(64) float panel[kc][w];
    const float* brow[kc];
    if (k == 0) // no panel to start the sums: C = beta C
      for (index_t r = 0; r < ni; ++r)
        for (index_t j = 0; j < w; ++j) acc[r][j] = 0.f;
    if (nj < w) // columns past C's edge: multiplied, never stored
      for (index_t p = 0; p < kc; ++p)
        for (index_t j = nj; j < w; ++j) panel[p][j] = 0.f;
    for (index_t p0 = 0; p0 < k; p0 += kc) {
      const index_t kn = k - p0 < kc ? k - p0 : kc;
      for (index_t p = 0; p < kn; ++p) {
        const sb* const src = b + (p0 + p) * ldb + j0;
        if constexpr (std::is_same_v<sb, float>) {
          if (nj == w) {
            brow[p] = src;
            continue;
          }
          std::memcpy(panel[p], src, static_cast<std::size_t>(nj) * sizeof(float));
        } else {
          convert_n<fp32>(src, panel[p], static_cast<std::size_t>(nj));
        }
        brow[p] = panel[p];
      }
      for (index_t r = 0; r < ni; ++r) {
        // The row's accumulators in vector registers (written out with xsimd: GCC 12 unrolls a
        // plain loop over them into scalar FMAs).
        float* const ar = acc[r];
        if constexpr (simd::available) {
          using fv = xsimd::batch<float>;
          constexpr index_t nv = w / static_cast<index_t>(fv::size);
          static_assert(nv * static_cast<index_t>(fv::size) == w, "a block is whole vectors");
          fv v[nv];
          for (index_t u = 0; u < nv; ++u)
            v[u] = p0 == 0 ? fv(0.f) : fv::load_aligned(ar + u * fv::size);
          for (index_t p = 0; p < kn; ++p) {
            const fv av(to_float(pr.a(i0 + r, p0 + p)));
            for (index_t u = 0; u < nv; ++u)
              v[u] = xsimd::fma(av, fv::load_unaligned(brow[p] + u * fv::size), v[u]);
          }
          for (index_t u = 0; u < nv; ++u) v[u].store_aligned(ar + u * fv::size);
        } else {
          if (p0 == 0)
            for (index_t j = 0; j < w; ++j) ar[j] = 0.f;
          for (index_t p = 0; p < kn; ++p) {
            const float av = to_float(pr.a(i0 + r, p0 + p));
            for (index_t j = 0; j < w; ++j) ar[j] += av * brow[p][j];
          }
        }
      }
    }
    for (index_t r = 0; r < ni; ++r) mx = direct_store_row(pr, acc[r], i0 + r, j0, nj, mx);
  };
  Kokkos::parallel_reduce("tessera::gemm[direct rows]",
                          Kokkos::RangePolicy<Exec>(exec, 0, ngrp * nblk), body,
                          Kokkos::Max<float>(amax));
  exec.fence();
  return amax;
}
#endif

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
#if !TESSERA_DEVICE_PASS
    if (pr.b.stride(1) == 1 && pr.n > 1) return gemm_direct_host_rows(exec, pr);
#endif
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
