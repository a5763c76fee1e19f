#pragma once
/// \file tensor/extents.hpp
/// extents<E...>: the shape of a tensor, each dimension static (a number) or dynamic (`dyn`).
/// Rank and static sizes are part of the type; dynamic sizes are stored.
///
///   tessera::extents<tessera::dyn, 3, 28, 28> e{64};   // (64, 3, 28, 28), batch dynamic
///   static_assert(decltype(e)::static_extent(1) == 3);

#include <tessera/config/checked.hpp>
#include <tessera/config/error.hpp>
#include <tessera/config/macros.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace tessera {

using index_t = std::int64_t;

/// Marks a dimension whose size is known only at run time.
inline constexpr index_t dyn = -1;

template <index_t... Es>
struct extents {
  static_assert(((Es >= 0 || Es == dyn) && ...),
                "tessera::extents: a static extent must be >= 0 (or tessera::dyn).");

  static_assert(
      [] {
        [[maybe_unused]] std::int64_t p = 1;
        return ((Es == dyn || Es == 0 || detail::checked_mul(p, Es, p)) && ... && true);
      }(),
      "tessera::extents: the product of the static extents overflows 64-bit integers.");

  static constexpr std::size_t rank = sizeof...(Es);
  static constexpr std::size_t rank_dynamic = ((Es == dyn ? 1 : 0) + ... + 0);
  static constexpr bool all_static = rank_dynamic == 0;

  /// The static size of dimension i, or dyn.
  static constexpr index_t static_extent(std::size_t i) noexcept {
    constexpr index_t s[rank + 1] = {Es..., 0};
    return s[i];
  }
  /// Product of the static sizes (meaningful when all_static).
  static constexpr index_t static_size() noexcept { return ((Es == dyn ? 1 : Es) * ... * 1); }

  /// Static extents as given, dynamic ones 0 (as std::mdspan's extents).
  constexpr extents() noexcept : e_{} {
    for (std::size_t i = 0; i < rank; ++i) e_[i] = static_extent(i) == dyn ? 0 : static_extent(i);
  }

  /// The dynamic extents, in order (one value per `dyn`).
  template <class... I>
    requires(sizeof...(I) == rank_dynamic && rank_dynamic > 0 &&
             (std::is_convertible_v<I, index_t> && ...))
  explicit constexpr extents(I... dynamic) : e_{} {
    const index_t d[] = {static_cast<index_t>(dynamic)...};
    std::size_t k = 0;
    for (std::size_t i = 0; i < rank; ++i) e_[i] = static_extent(i) == dyn ? d[k++] : static_extent(i);
    check_valid();
  }

  /// All extents (rank values); static ones must match or shape_error is thrown.
  static constexpr extents from_all(const std::array<index_t, rank>& all) {
    extents r(uninit{});
    for (std::size_t i = 0; i < rank; ++i) {
      if (static_extent(i) != dyn && static_extent(i) != all[i])
        throw shape_error("tessera::extents: dimension " + std::to_string(i) + " is static " +
                          std::to_string(static_extent(i)) + " but " + std::to_string(all[i]) +
                          " was given");
      r.e_[i] = all[i];
    }
    r.check_valid();
    return r;
  }

  TESSERA_INLINE constexpr index_t extent(std::size_t i) const noexcept { return e_[i]; }
  TESSERA_INLINE constexpr index_t size() const noexcept {
    index_t s = 1;
    for (std::size_t i = 0; i < rank; ++i) s *= e_[i];
    return s;
  }
  std::array<index_t, rank> to_array() const {
    std::array<index_t, rank> a{};
    for (std::size_t i = 0; i < rank; ++i) a[i] = e_[i];
    return a;
  }
  friend constexpr bool operator==(const extents& a, const extents& b) noexcept {
    for (std::size_t i = 0; i < rank; ++i)
      if (a.e_[i] != b.e_[i]) return false;
    return true;
  }

private:
  struct uninit {};
  constexpr explicit extents(uninit) noexcept : e_{} {}
  /// Every extent >= 0, and the product of the non-zero extents fits in int64: then the element
  /// count (which size() returns unchecked) and every partial product (the packed strides of
  /// either layout) fit too. Checked once here, so that no later size() or stride computation
  /// can overflow; an empty shape such as (0, 2^40, 2^40) is refused as well (its strides would
  /// overflow).
  constexpr void check_valid() const {
    for (std::size_t i = 0; i < rank; ++i)
      if (e_[i] < 0)
        throw shape_error("tessera::extents: dimension " + std::to_string(i) +
                          " has negative size " + std::to_string(e_[i]));
    std::int64_t p = 1;
    for (std::size_t i = 0; i < rank; ++i)
      if (e_[i] != 0 && !detail::checked_mul(p, e_[i], p)) {
        std::string s = "(";
        for (std::size_t k = 0; k < rank; ++k) s += (k ? ", " : "") + std::to_string(e_[k]);
        throw shape_error("tessera::extents: shape " + s +
                          ") has more elements than a 64-bit index can count (the product of "
                          "the extents overflows)");
      }
  }
  index_t e_[rank == 0 ? 1 : rank];
};

namespace detail {
template <std::size_t R, class Seq = void>
struct dextents_impl;
template <std::size_t R, std::size_t... I>
struct dextents_impl<R, std::index_sequence<I...>> {
  using type = extents<((void)I, dyn)...>;
};
} // namespace detail

/// All-dynamic extents of rank R.
template <std::size_t R>
using dextents = typename detail::dextents_impl<R, std::make_index_sequence<R>>::type;

template <class T>
struct is_extents : std::false_type {};
template <index_t... Es>
struct is_extents<extents<Es...>> : std::true_type {};

/// "(64, 3, 28, 28)": for error messages.
template <class Ext>
std::string shape_string(const Ext& e) {
  std::string s = "(";
  for (std::size_t i = 0; i < Ext::rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(e.extent(i));
  }
  return s + ")";
}

} // namespace tessera
