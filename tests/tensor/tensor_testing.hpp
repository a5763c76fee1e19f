#pragma once
// Shared by the tensor tests: the execution spaces and precisions they are instantiated over, and
// bitwise comparison of storage values.
#include "support/exec_spaces.hpp"

#include <tessera/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <cstdint>
#include <tuple>

namespace tessera::testing {

/// Host execution spaces every kernel-running test is instantiated over: every host space this
/// Kokkos enables (Serial: one thread; OpenMP, Threads or HPX: all the threads Kokkos has).
using host_exec_spaces = host_execution_spaces;

/// Every precision tessera has (tessera::known_precisions), as a Hana tuple of types for
/// hana::for_each.
inline constexpr auto all_precisions = []<class... Ps>(precision_list<Ps...>) {
  return boost::hana::tuple_t<Ps...>;
}(known_precisions{});
inline constexpr auto fp8_precisions = boost::hana::tuple_t<fp8_e4m3, fp8_e5m2>;

/// Calls f.template operator()<P>() for each type P in a Hana tuple of types.
template <class Types, class F>
void for_each_type(Types types, F&& f) {
  boost::hana::for_each(types,
                        [&](auto t) { f.template operator()<typename decltype(t)::type>(); });
}

/// The bit pattern of a storage value, for bitwise comparisons (NaN == NaN, -0 != +0).
inline std::uint32_t bits_of(float x) {
  return detail::bit_cast<std::uint32_t>(x);
}
/// The code of any storage type with a `bits` member (bfloat16, float16, float8_e4m3, ...).
template <class S>
requires requires(S s) {
  s.bits;
}
std::uint32_t bits_of(S x) {
  return x.bits;
}

/// Index of the first element where two host tensors of the same size differ bitwise, or -1.
template <class A, class B>
index_t first_bitwise_difference(const A& a, const B& b) {
  for (index_t i = 0; i < a.size(); ++i)
    if (bits_of(a.data()[i]) != bits_of(b.data()[i])) return i;
  return -1;
}

} // namespace tessera::testing
