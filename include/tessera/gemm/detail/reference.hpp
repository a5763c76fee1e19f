#pragma once
/// \file gemm/detail/reference.hpp
/// gemm_algo::reference (one work item per C element, an MDRange) and gemm_algo::direct (one
/// work item per row of C, the row's outputs accumulated together over K so that B's rows are
/// read contiguously when B is row-major): the paths for small problems, on any space.

#include <tessera/gemm/detail/problem.hpp>

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

template <class Exec, class Prob>
float gemm_direct(const Exec& exec, const Prob& pr) {
  float amax = 0.f;
  if (pr.m == 0 || pr.n == 0) return amax;
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
