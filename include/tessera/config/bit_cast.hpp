#pragma once
/// \file config/bit_cast.hpp
/// A device-callable, constexpr bit_cast. std::bit_cast is not guaranteed in device code, and
/// Kokkos::bit_cast exists only from Kokkos 4; the builtin is what both lower to.

#include <tessera/config/macros.hpp>

#include <type_traits>

namespace tessera::detail {

template <class To, class From>
  requires(sizeof(To) == sizeof(From) && std::is_trivially_copyable_v<To> &&
           std::is_trivially_copyable_v<From>)
TESSERA_INLINE constexpr To bit_cast(const From& from) noexcept {
  return __builtin_bit_cast(To, from);
}

} // namespace tessera::detail
