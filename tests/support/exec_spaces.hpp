#pragma once
// The execution spaces a test runs over, from what this Kokkos enables (Serial, OpenMP, Threads,
// HPX; a device space), so that the same suite runs with any backend.
#include <tessera/config/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <tuple>
#include <type_traits>
#include <utility>

namespace tessera::testing {

/// The spaces that can run on tensors in the default memory space: every enabled host space
/// when the default execution space is a host space, else the default (device) space alone.
using default_memory_exec_spaces =
    std::conditional_t<is_host_execution_space_v<Kokkos::DefaultExecutionSpace>,
                       host_execution_spaces, std::tuple<Kokkos::DefaultExecutionSpace>>;

/// Every enabled execution space, each to run on tensors in its own memory space
/// (Exec::memory_space), values checked through host mirrors: the host spaces, then the default
/// space when it is a device space (HIP, CUDA, SYCL).
using enabled_exec_spaces = std::conditional_t<
    is_host_execution_space_v<Kokkos::DefaultExecutionSpace>, host_execution_spaces,
    decltype(std::tuple_cat(std::declval<host_execution_spaces>(),
                            std::declval<std::tuple<Kokkos::DefaultExecutionSpace>>()))>;

/// The last enabled host space: the threaded one (OpenMP, Threads or HPX) where there is one.
using threaded_host_space =
    std::tuple_element_t<std::tuple_size_v<host_execution_spaces> - 1, host_execution_spaces>;

/// The default execution space, a new object each call: a space object made at file scope would
/// be constructed before Kokkos::initialize (undefined; Kokkos 4 aborts).
inline Kokkos::DefaultExecutionSpace exec_space() {
  return {};
}

} // namespace tessera::testing
