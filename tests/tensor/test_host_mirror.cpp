// tensor/host_mirror.hpp: the host-accessibility predicate, and host mirrors that share a
// host-accessible tensor's memory and copy a device tensor's, checked for tensors in HostSpace
// and in the default memory space (a device's in a device build) against an independent read
// (to_host, which always copies into fresh host memory) and kernel-written references.
#include "support/fake_device_space.hpp"
#include "tensor_testing.hpp"

#include <tessera/tensor/host_mirror.hpp>

#include <catch2/catch.hpp>

#include <type_traits>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

using dev_space = Kokkos::DefaultExecutionSpace::memory_space;

static_assert(is_host_accessible_v<Kokkos::HostSpace>);
static_assert(!is_host_accessible_v<fake_device_space>);
using fake_tensor = Tensor<fp32, extents<dyn, 4>, layout_right, fake_device_space>;
static_assert(std::is_same_v<host_mirror_t<fake_tensor>,
                             Tensor<fp32, extents<dyn, 4>, layout_right, Kokkos::HostSpace>>);
using host_tensor = Tensor<bf16, extents<3, dyn>, layout_left, Kokkos::HostSpace>;
static_assert(std::is_same_v<host_mirror_t<host_tensor>, host_tensor>);

// Element i = 0.25 i - 7 written by a kernel in the tensor's own space.
template <class T>
void fill_ramp(const T& t) {
  using exec = typename T::memory_space::execution_space;
  auto* p = t.data();
  Kokkos::parallel_for(
      "ramp", Kokkos::RangePolicy<exec>(0, t.size()),
      KOKKOS_LAMBDA(const index_t i) { p[i] = 0.25f * static_cast<float>(i) - 7.f; });
  Kokkos::fence();
}

template <class M>
void check_space() {
  using T = Tensor<fp32, extents<dyn, 5>, layout_right, M>;
  const T t("t", 13);
  fill_ramp(t);

  // host_mirror: t itself when the host reaches its memory, else fresh host memory.
  const auto m = host_mirror(t);
  REQUIRE(m.extent(0) == 13);
  REQUIRE(m.extent(1) == 5);
  if constexpr (is_host_accessible_v<M>)
    REQUIRE(static_cast<const void*>(m.data()) == static_cast<const void*>(t.data()));
  else
    REQUIRE(static_cast<const void*>(m.data()) != static_cast<const void*>(t.data()));

  // host_mirror_copy holds t's elements.
  const auto h = host_mirror_copy(t);
  for (index_t i = 0; i < t.size(); ++i)
    REQUIRE(h.data()[i] == 0.25f * static_cast<float>(i) - 7.f);

  // Written on the host and copied back: to_host (a separate copy) sees the new values.
  const auto w = host_mirror(t);
  for (index_t i = 0; i < t.size(); ++i) w.data()[i] = static_cast<float>(3 * i + 1);
  copy_from_host(t, w);
  const auto check = to_host(t);
  REQUIRE(static_cast<const void*>(check.data()) != static_cast<const void*>(t.data()));
  for (index_t i = 0; i < t.size(); ++i) REQUIRE(check.data()[i] == static_cast<float>(3 * i + 1));

  // A mirror of another shape is refused, naming both shapes, and t is unchanged.
  const auto other = host_mirror(T("other", 2));
  REQUIRE_THROWS_WITH(copy_from_host(t, other), Catch::Contains("tessera::copy_from_host") &&
                                                    Catch::Contains("(13, 5)") &&
                                                    Catch::Contains("(2, 5)"));
  REQUIRE(to_host(t).data()[4] == 13.f);
}

} // namespace

TEST_CASE("host mirrors of HostSpace tensors share their memory and copy nothing",
          "[tensor][memory]") {
  check_space<Kokkos::HostSpace>();
}

TEST_CASE("host mirrors of default-space tensors read and write the tensor's elements",
          "[tensor][memory]") {
  check_space<dev_space>();
}

TEST_CASE("a host mirror of a separate host tensor of the same type is copied, not aliased",
          "[tensor][memory]") {
  using T = Tensor<fp32, dextents<1>, layout_right, Kokkos::HostSpace>;
  const T t("t", 6), h("h", 6);
  for (index_t i = 0; i < 6; ++i) h.data()[i] = static_cast<float>(i * i);
  copy_from_host(t, h);
  for (index_t i = 0; i < 6; ++i) REQUIRE(t.data()[i] == static_cast<float>(i * i));
  h.data()[0] = 99.f; // still two tensors
  REQUIRE(t.data()[0] == 0.f);
}
