#pragma once
/// \file tensor/tensor_view.hpp
/// TensorView<P, Extents, Layout, MemorySpace>: a non-owning, trivially copyable view (pointer,
/// extents, strides), the form kernels capture. Obtained from a Tensor (view()), by slicing, by
/// transposing, or by wrapping memory the caller owns (a Kokkos::View or a raw pointer).
///
///   auto v = t.view();              // (B, 3, 28, 28)
///   auto first = v.slice(0, 16);    // (16, 3, 28, 28), same memory
///   auto at = transpose(a.view());  // (K, M) view of an (M, K) matrix

#include <tessera/precision/traits.hpp>
#include <tessera/tensor/extents.hpp>
#include <tessera/tensor/layout.hpp>

#include <limits>
#include <string>

namespace tessera {

// Parameters are checked by static_asserts, as Tensor's are: one sentence per misuse.
template <class P, class Ext, class L = layout_right,
          class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class TensorView {
  static_assert(Precision<P>,
                "tessera::TensorView: the first template argument must be a precision tag "
                "(one of tessera::known_precisions), not a storage type such as float.");
  static_assert(is_extents<Ext>::value,
                "tessera::TensorView: the second template argument must be tessera::extents<...>.");
  static_assert(Layout<L>, "tessera::TensorView: the third template argument must be a layout "
                           "(tessera::layout_right, layout_left or layout_stride).");

public:
  using precision = P;
  using extents_type = Ext;
  using layout = L;
  using memory_space = MemorySpace;
  using storage_type = storage_t<P>;
  static constexpr std::size_t rank = Ext::rank;

  TensorView() = default;

  /// Wraps memory with packed strides (layout_right / layout_left).
  TensorView(storage_type* data, const Ext& e)
    requires(L::contiguous)
      : data_(data), ext_(e) {
    packed_strides<L>(e, strides_);
    check_span();
  }

  /// Wraps memory with explicit strides (in elements).
  TensorView(storage_type* data, const Ext& e, const std::array<index_t, rank>& strides)
      : data_(data), ext_(e) {
    for (std::size_t i = 0; i < rank; ++i) strides_[i] = strides[i];
    check_span();
    if constexpr (L::contiguous) {
      index_t packed[rank == 0 ? 1 : rank];
      packed_strides<L>(e, packed);
      for (std::size_t i = 0; i < rank; ++i)
        if (strides_[i] != packed[i] && e.extent(i) > 1)
          throw shape_error("tessera::TensorView: strides are not packed for a contiguous layout");
    }
  }

  TESSERA_INLINE storage_type* data() const noexcept { return data_; }
  TESSERA_INLINE const Ext& extents() const noexcept { return ext_; }
  TESSERA_INLINE index_t extent(std::size_t i) const noexcept { return ext_.extent(i); }
  TESSERA_INLINE index_t stride(std::size_t i) const noexcept { return strides_[i]; }
  TESSERA_INLINE index_t size() const noexcept { return ext_.size(); }
  std::array<index_t, rank> strides() const {
    std::array<index_t, rank> s{};
    for (std::size_t i = 0; i < rank; ++i) s[i] = strides_[i];
    return s;
  }
  /// True if the elements occupy one dense block in this layout's order.
  bool is_contiguous() const noexcept {
    if constexpr (L::contiguous) {
      return true;
    } else {
      index_t packed[rank == 0 ? 1 : rank];
      packed_strides<layout_right>(ext_, packed);
      for (std::size_t i = 0; i < rank; ++i)
        if (strides_[i] != packed[i] && ext_.extent(i) > 1) return false;
      return true;
    }
  }

  template <class... I>
    requires(sizeof...(I) == rank && (std::is_integral_v<I> && ...))
  TESSERA_INLINE storage_type& operator()(I... idx) const noexcept {
    const index_t ii[] = {static_cast<index_t>(idx)..., 0};
    index_t off = 0;
    for (std::size_t k = 0; k < rank; ++k) off += ii[k] * strides_[k];
    return data_[off];
  }

  /// Rows [begin, end) along the leading dimension (dimension 0): same memory, same strides.
  auto slice(index_t begin, index_t end) const {
    static_assert(rank >= 1, "tessera::TensorView::slice: a rank-0 tensor has nothing to slice.");
    if (begin < 0 || end < begin || end > ext_.extent(0))
      throw shape_error("tessera::slice: range [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") is outside dimension 0 of a tensor of shape " +
                        shape_string(ext_));
    using out_ext = replace_first_with_dyn_t<Ext>;
    std::array<index_t, rank> e = ext_.to_array();
    e[0] = end - begin;
    using out_layout = std::conditional_t<std::is_same_v<L, layout_left>, layout_stride, L>;
    return TensorView<P, out_ext, out_layout, MemorySpace>(data_ + begin * strides_[0],
                                                           out_ext::from_all(e), strides());
  }

  /// The same elements with the layout forgotten (strides kept): accepted wherever a strided
  /// operand is.
  TensorView<P, Ext, layout_stride, MemorySpace> as_strided() const {
    return {data_, ext_, strides()};
  }

private:
  /// The element offsets (sum of (extent - 1) * |stride|, and its bytes) must fit in int64:
  /// checked with overflow-checked arithmetic, so that indexing a view cannot overflow.
  void check_span() const {
    if (ext_.size() == 0) return;
    index_t span = 0;
    for (std::size_t i = 0; i < rank; ++i) {
      index_t t = 0;
      const index_t s = strides_[i] < 0 ? -strides_[i] : strides_[i];
      if (strides_[i] == std::numeric_limits<index_t>::min() ||
          !detail::checked_mul(ext_.extent(i) - 1, s, t) || !detail::checked_add(span, t, span) ||
          !detail::fits_bytes(span, sizeof(storage_type))) {
        std::string st;
        for (std::size_t k = 0; k < rank; ++k) st += (k ? ", " : "") + std::to_string(strides_[k]);
        throw shape_error("tessera::TensorView: shape " + shape_string(ext_) + " with strides (" +
                          st + ") spans more bytes than a 64-bit offset can address");
      }
    }
  }

  template <class E>
  struct replace_first;
  template <index_t E0, index_t... Es>
  struct replace_first<tessera::extents<E0, Es...>> {
    using type = tessera::extents<dyn, Es...>;
  };
  template <class E>
  using replace_first_with_dyn_t = typename replace_first<E>::type;

  storage_type* data_ = nullptr;
  Ext ext_{};
  index_t strides_[rank == 0 ? 1 : rank] = {};
};

/// Transpose of a rank-2 view: (M, K) -> (K, M), no copy.
template <Precision P, index_t E0, index_t E1, Layout L, class M>
TensorView<P, extents<E1, E0>, layout_stride, M>
transpose(const TensorView<P, extents<E0, E1>, L, M>& v) {
  auto e = extents<E1, E0>::from_all({v.extent(1), v.extent(0)});
  return {v.data(), e, {v.stride(1), v.stride(0)}};
}

template <class T>
struct is_tensor_view : std::false_type {};
template <class P, class E, class L, class M>
struct is_tensor_view<TensorView<P, E, L, M>> : std::true_type {};

} // namespace tessera
