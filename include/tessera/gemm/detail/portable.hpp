#pragma once
/// \file gemm/detail/portable.hpp
/// gemm_algo::portable: a team-tiled GEMM for any Kokkos execution space (host, CUDA, HIP, SYCL).
///
/// One team per portable_tm x portable_tn (64 x 64) tile of C. The team walks K in slices of
/// portable_tk (16): it loads the A slice (64 x 16) and the B slice (16 x 64) into team scratch
/// memory converted to float (a bf16/fp8 element is decoded once per tile, not once per
/// multiply-add; rows/columns past the edge of C are filled with 0 and never stored), passes a
/// team_barrier, and each thread updates its 4 x 4 micro-tiles of C with 16 register
/// accumulators, 8 scratch loads per 16 multiply-adds. A 64 x 64 tile has 256 micro-tiles, one
/// per thread of a 256-thread GPU team; where a team is smaller (host spaces run 1 thread per
/// team) each thread takes several, so the accumulators live in a third scratch array between
/// slices. After the last slice every element goes through the problem's store (alpha, beta,
/// epilogue, output scale) and its |value| enters a Max reduction (the amax).
///
/// Why these sizes: the scratch is (64 x 16 + 16 x 64 + 64 x 64) floats = 24 KiB, inside the
/// 48 KiB of shared memory every CUDA/HIP GPU offers per block and the 32 KiB of local memory
/// SYCL guarantees, and inside a host core's L1/L2; 64 x 64 reuses each loaded A element 64
/// times and each B element 64 times; 16-deep slices keep the two operand slices at 8 KiB.
///
/// Determinism: C(i, j) is summed in one order (p = 0, 1, ..., K - 1, starting from 0) whatever
/// the team size or thread count; no atomics. K == 0 gives the same as gemm_direct: each element
/// is store(0) (beta * C with the epilogue); M == 0 or N == 0 writes nothing.
///
/// Device rules: the kernel uses only KOKKOS_LAMBDA, the problem's TESSERA_INLINE accessors and
/// Kokkos APIs present in Kokkos 3.4 and 4.x (TeamPolicy, set_scratch_size/PerTeam, team_scratch,
/// TeamThreadRange, team_barrier, parallel_reduce with Kokkos::Max).

#include <tessera/gemm/detail/problem.hpp>

#include <Kokkos_Core.hpp>

namespace tessera::detail {

inline constexpr index_t portable_tm = 64; ///< rows of C per team
inline constexpr index_t portable_tn = 64; ///< columns of C per team
inline constexpr index_t portable_tk = 16; ///< depth of one K slice in scratch
inline constexpr index_t portable_rm = 4;  ///< rows of a thread's micro-tile
inline constexpr index_t portable_rn = 4;  ///< columns of a thread's micro-tile

template <class Exec, class Prob>
float gemm_portable(const Exec& exec, const Prob& pr) {
  float amax = 0.f;
  if (pr.m == 0 || pr.n == 0) return amax;
  constexpr index_t tm = portable_tm, tn = portable_tn, tk = portable_tk;
  constexpr index_t rm = portable_rm, rn = portable_rn;
  constexpr index_t micro_rows = tm / rm, micro_cols = tn / rn;
  constexpr index_t n_micro = micro_rows * micro_cols;
  static_assert(tm % rm == 0 && tn % rn == 0, "tile sizes must be multiples of the micro-tile");

  using policy_t = Kokkos::TeamPolicy<Exec>;
  using member_t = typename policy_t::member_type;
  using scratch_view = Kokkos::View<float*, typename Exec::scratch_memory_space,
                                    Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  const index_t tiles_m = (pr.m + tm - 1) / tm, tiles_n = (pr.n + tn - 1) / tn;
  const index_t m = pr.m, n = pr.n, k = pr.k;
  // Load the operand slices with consecutive threads on the operand's unit-stride direction
  // (coalesced on a GPU): along K when A is row-major, along M when it is column-major.
  const bool a_k_fast = pr.a.stride(1) <= pr.a.stride(0);
  const bool b_n_fast = pr.b.stride(1) <= pr.b.stride(0);

  const std::size_t scratch_bytes = scratch_view::shmem_size(tk * tm) +
                                    scratch_view::shmem_size(tk * tn) +
                                    scratch_view::shmem_size(tm * tn);
  const int league = static_cast<int>(tiles_m * tiles_n);
  const policy_t policy =
      policy_t(exec, league, Kokkos::AUTO).set_scratch_size(0, Kokkos::PerTeam(scratch_bytes));

  const auto body = KOKKOS_LAMBDA(const member_t& team, float& mx) {
    const index_t t = team.league_rank();
    const index_t i0 = (t / tiles_n) * tm, j0 = (t % tiles_n) * tn;
    const scratch_view as(team.team_scratch(0), tk * tm); // as[p * tm + i]: A(i0 + i, k0 + p)
    const scratch_view bs(team.team_scratch(0), tk * tn); // bs[p * tn + j]: B(k0 + p, j0 + j)
    const scratch_view cs(team.team_scratch(0), tm * tn); // accumulators, by micro-tile

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tm * tn),
                         [&](const index_t e) { cs(e) = 0.f; });
    // (Each slice starts with a barrier, so the zeros are visible to the micro-tile owners.)

    for (index_t k0 = 0; k0 < k; k0 += tk) {
      const index_t kn = k - k0 < tk ? k - k0 : tk;
      team.team_barrier(); // the previous slice is consumed
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tm * tk), [&](const index_t e) {
        const index_t i = a_k_fast ? e / tk : e % tm, p = a_k_fast ? e % tk : e / tm;
        as(p * tm + i) = (i0 + i < m && p < kn) ? to_float(pr.a(i0 + i, k0 + p)) : 0.f;
      });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk * tn), [&](const index_t e) {
        const index_t j = b_n_fast ? e % tn : e / tk, p = b_n_fast ? e / tn : e % tk;
        bs(p * tn + j) = (j0 + j < n && p < kn) ? to_float(pr.b(k0 + p, j0 + j)) : 0.f;
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n_micro), [&](const index_t u) {
        const index_t ui = (u % micro_rows) * rm, uj = (u / micro_rows) * rn;
        float* const acc_out = &cs(u * rm * rn);
        float acc[rm][rn];
        for (index_t r = 0; r < rm; ++r)
          for (index_t c = 0; c < rn; ++c) acc[r][c] = acc_out[r * rn + c];
        for (index_t p = 0; p < kn; ++p) {
          float av[rm], bv[rn];
          for (index_t r = 0; r < rm; ++r) av[r] = as(p * tm + ui + r);
          for (index_t c = 0; c < rn; ++c) bv[c] = bs(p * tn + uj + c);
          for (index_t r = 0; r < rm; ++r)
            for (index_t c = 0; c < rn; ++c) acc[r][c] += av[r] * bv[c];
        }
        for (index_t r = 0; r < rm; ++r)
          for (index_t c = 0; c < rn; ++c) acc_out[r * rn + c] = acc[r][c];
      });
    }

    team.team_barrier(); // the accumulators are final (and zeroed when K == 0)
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n_micro), [&](const index_t u) {
      const index_t ui = (u % micro_rows) * rm, uj = (u / micro_rows) * rn;
      for (index_t r = 0; r < rm; ++r)
        for (index_t c = 0; c < rn; ++c) {
          const index_t i = i0 + ui + r, j = j0 + uj + c;
          if (i < m && j < n) {
            const float a = pr.store(cs(u * rm * rn + r * rn + c), i, j);
            mx = a > mx ? a : mx;
          }
        }
    });
  };
  Kokkos::parallel_reduce("tessera::gemm[portable]", policy, body, Kokkos::Max<float>(amax));
  exec.fence();
  return amax;
}

} // namespace tessera::detail
