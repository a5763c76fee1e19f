#pragma once
/// \file tensor/layout.hpp
/// Layouts map a multi-index to an offset. layout_right: row-major (last index fastest),
/// layout_left: column-major (first index fastest), layout_stride: any strides (transposes,
/// leading dimensions larger than the extent, sub-views).

#include <tessera/tensor/extents.hpp>

#include <Kokkos_Core.hpp>

namespace tessera {

struct layout_right {
  using kokkos_layout = Kokkos::LayoutRight;
  static constexpr bool contiguous = true;
};
struct layout_left {
  using kokkos_layout = Kokkos::LayoutLeft;
  static constexpr bool contiguous = true;
};
struct layout_stride {
  using kokkos_layout = Kokkos::LayoutStride;
  static constexpr bool contiguous = false;
};

template <class L>
concept Layout = std::is_same_v<L, layout_right> || std::is_same_v<L, layout_left> ||
                 std::is_same_v<L, layout_stride>;

/// Packed strides of a contiguous layout.
template <class L, class Ext>
constexpr void packed_strides(const Ext& e, index_t* strides) noexcept {
  constexpr std::size_t r = Ext::rank;
  if constexpr (r > 0) {
    if constexpr (std::is_same_v<L, layout_left>) {
      index_t s = 1;
      for (std::size_t i = 0; i < r; ++i) {
        strides[i] = s;
        s *= e.extent(i);
      }
    } else {
      index_t s = 1;
      for (std::size_t i = r; i-- > 0;) {
        strides[i] = s;
        s *= e.extent(i);
      }
    }
  }
}

} // namespace tessera
