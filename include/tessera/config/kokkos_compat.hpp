#pragma once
/// \file config/kokkos_compat.hpp
/// The one place where tessera meets the differences between Kokkos 3.4 and 4.x, and the
/// questions it asks of an execution space:
///
///   tessera::host_execution_spaces          std::tuple of the host execution spaces this
///                                            Kokkos enables (Serial, OpenMP, Threads, HPX: those
///                                            present, in that order)
///   tessera::is_host_execution_space_v<E>   E runs on the host (one of the above), so host-only
///                                            code (xsimd, intrinsics, std:: calls) may run in it
///   tessera::concurrency(exec)              the threads of the instance exec itself
///
/// "Runs on the host" is a property of the execution space, not of its memory: a device space
/// whose memory the host can reach (CUDA UVM, HIP managed or pinned memory) is not a host space.

#include <Kokkos_Core.hpp>

#include <tuple>
#include <type_traits>

// KOKKOS_VERSION is MAJOR * 10000 + MINOR * 100 + PATCH in 3.x and 4.x alike.
#if !defined(KOKKOS_VERSION) || KOKKOS_VERSION < 30400
#error "tessera needs Kokkos 3.4 or newer"
#endif
#define TESSERA_KOKKOS_4 (KOKKOS_VERSION >= 40000)

// 1 when Kokkos has a device backend (its default memory space may then be a GPU's).
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) ||    \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
#define TESSERA_KOKKOS_DEVICE 1
#else
#define TESSERA_KOKKOS_DEVICE 0
#endif

namespace tessera {

/// The threads of the instance exec (not of its space's default instance). Kokkos 4 built with
/// its deprecated code (KOKKOS_ENABLE_DEPRECATED_CODE_4) declares OpenMP::concurrency as a static
/// function of an instance that defaults to the default one, so `exec.concurrency()` on a smaller
/// instance (Kokkos::OpenMP(n), partition_space) answers the whole pool's size; the static form
/// is given the instance here. Kokkos 3.4's spaces have one pool and a static concurrency().
template <class Exec>
int concurrency(const Exec& exec) {
  if constexpr (requires { Exec::concurrency(exec); })
    return Exec::concurrency(exec);
  else
    return exec.concurrency();
}

namespace detail {
template <class... A>
struct space_cat {
  using type = std::tuple<A...>;
};
template <class... A, class... B, class... R>
struct space_cat<std::tuple<A...>, std::tuple<B...>, R...>
    : space_cat<std::tuple<A..., B...>, R...> {};
template <class... A>
struct space_cat<std::tuple<A...>> {
  using type = std::tuple<A...>;
};
} // namespace detail

/// The host execution spaces this Kokkos build enables (3.4 and 4.x name them alike; Threads was
/// spelled KOKKOS_ENABLE_THREADS in both).
using host_execution_spaces = typename detail::space_cat<
#ifdef KOKKOS_ENABLE_SERIAL
    std::tuple<Kokkos::Serial>,
#else
    std::tuple<>,
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    std::tuple<Kokkos::OpenMP>,
#else
    std::tuple<>,
#endif
#ifdef KOKKOS_ENABLE_THREADS
    std::tuple<Kokkos::Threads>,
#else
    std::tuple<>,
#endif
#ifdef KOKKOS_ENABLE_HPX
    std::tuple<Kokkos::Experimental::HPX>
#else
    std::tuple<>
#endif
    >::type;

namespace detail {
template <class E, class Spaces>
struct is_one_of;
template <class E, class... S>
struct is_one_of<E, std::tuple<S...>> : std::bool_constant<(std::is_same_v<E, S> || ...)> {};
} // namespace detail

/// True when the execution space E runs its kernels on the host (see the file comment).
template <class E>
inline constexpr bool is_host_execution_space_v =
    detail::is_one_of<std::remove_cvref_t<E>, host_execution_spaces>::value;

namespace detail {
/// tessera's internal spelling (gemm, conv, nn and tensor dispatch on it).
template <class Exec>
inline constexpr bool is_host_exec_v = is_host_execution_space_v<Exec>;
} // namespace detail

} // namespace tessera
