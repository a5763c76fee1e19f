#pragma once
// A memory space the host cannot reach, for tests on a host-only Kokkos: Kokkos'
// SpaceAccessibility<HostSpace, M> is false for any memory space other than HostSpace that does
// not declare otherwise, which is what a GPU's memory (HIPSpace, CudaSpace) reports. Nothing is
// ever allocated in it: tests only name tensor types over it and check what compiles.
#include <Kokkos_Core.hpp>

#include <cstddef>

namespace tessera::testing {

struct fake_device_space {
  using memory_space = fake_device_space;
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  using device_type = Kokkos::Device<execution_space, memory_space>;
  using size_type = std::size_t;
  static constexpr const char* name() { return "fake_device_space"; }
};

} // namespace tessera::testing
