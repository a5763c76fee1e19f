#pragma once
// Shared by the train tests: small parameter sets, host snapshots and bitwise comparisons.
#include "support/exec_spaces.hpp"

#include <tessera/nn/parameter.hpp>
#include <tessera/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace tessera::testing {

/// Execution spaces the train tests run over: every space that can run on the default memory
/// space (every enabled host space in a host build, the default device space in a device one).
using train_exec_spaces = tessera::testing::default_memory_exec_spaces;

/// A copy of a Kokkos view of floats on the host.
template <class View>
std::vector<float> snapshot_view(const View& v) {
  std::vector<float> out(v.extent(0));
  Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(out.data(),
                                                                                     out.size());
  Kokkos::deep_copy(h, v);
  return out;
}
template <class T>
std::vector<float> snapshot(const T& tensor) {
  return snapshot_view(tensor.kokkos_view());
}

/// Writes host values into a tensor.
template <class T>
void upload(const T& tensor, const std::vector<float>& values) {
  Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
      values.data(), values.size());
  Kokkos::deep_copy(tensor.kokkos_view(), h);
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Values and grads of every parameter, in order: [value0, grad0, value1, grad1, ...].
template <class Params>
std::vector<std::vector<float>> snapshot_params(const Params& params) {
  std::vector<std::vector<float>> out;
  boost::hana::for_each(params, [&](const auto& p) {
    out.push_back(snapshot(p.value));
    out.push_back(snapshot(p.grad));
  });
  return out;
}

/// Every buffer of an optimizer's state, in order, as host vectors.
template <class State>
std::vector<std::vector<float>> snapshot_state(const State& s) {
  std::vector<std::vector<float>> out;
  for (const auto& slot : s.slots)
    for (const auto& buf : slot) out.push_back(snapshot_view(buf));
  return out;
}

/// Fills every parameter value with uniform [lo, hi) values from seed, and grads from seed + 1.
template <class Params>
void randomize_params(const Params& params, std::uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::uint64_t k = 0;
  boost::hana::for_each(params, [&](const auto& p) {
    fill_uniform(p.value, seed * 1000 + 2 * k, lo, hi);
    fill_uniform(p.grad, seed * 1000 + 2 * k + 1, lo, hi);
    ++k;
  });
}

} // namespace tessera::testing
