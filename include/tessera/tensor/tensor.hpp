#pragma once
/// \file tensor/tensor.hpp
/// Tensor<P, Extents, Layout, MemorySpace>: owns its elements in a Kokkos::View of P's storage
/// type. Copies are shallow and reference-counted, like Kokkos::View; deep_copy copies elements.
/// Precision and static shape are part of the type.
///
///   using batch_t = tessera::Tensor<tessera::bf16, tessera::extents<tessera::dyn, 1, 28, 28>>;
///   batch_t x("x", 64);                                   // (64, 1, 28, 28) bf16, zeroed
///   tessera::Tensor<tessera::fp32, tessera::extents<128, 64>> w("w"); // all static

#include <tessera/tensor/tensor_view.hpp>

#include <string>

namespace tessera {

/// True when host code may dereference pointers into memory space M (Kokkos'
/// SpaceAccessibility from HostSpace): HostSpace, HIPHostPinnedSpace, HIPManagedSpace,
/// CudaUVMSpace, CudaHostPinnedSpace; false for HIPSpace and CudaSpace. The one predicate every
/// tessera function asks before host code touches tensor memory (see tensor/host_mirror.hpp).
template <class M>
inline constexpr bool is_host_accessible_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible;

// The parameters are checked by static_asserts (not by constraints on the template head) so
// that a misuse reports one sentence instead of a concept-satisfaction trace.
template <class P, class Ext, class L = layout_right,
          class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class Tensor {
  static_assert(Precision<P>,
                "tessera::Tensor: the first template argument must be a precision tag "
                "(one of tessera::known_precisions), not a storage type such as float.");
  static_assert(is_extents<Ext>::value,
                "tessera::Tensor: the second template argument must be tessera::extents<...>.");
  static_assert(Layout<L>, "tessera::Tensor: the third template argument must be a layout "
                           "(tessera::layout_right or tessera::layout_left).");
  static_assert(L::contiguous,
                "tessera::Tensor: an owning tensor is contiguous (layout_right or layout_left); "
                "use TensorView for strided access.");

public:
  using precision = P;
  using extents_type = Ext;
  using layout = L;
  using memory_space = MemorySpace;
  using storage_type = storage_t<P>;
  using view_type = TensorView<P, Ext, L, MemorySpace>;
  using kokkos_view_type = Kokkos::View<storage_type*, MemorySpace>;
  static constexpr std::size_t rank = Ext::rank;

  Tensor() = default;

  /// Allocates a zero-filled tensor; exactly one size per dynamic extent (checked at compile
  /// time, with a message), e.g. Tensor<fp32, extents<dyn, 3>>("x", 64) is (64, 3).
  template <class... I>
    requires(std::is_convertible_v<I, index_t> && ...)
  explicit Tensor(const std::string& label, I... dynamic_extents)
      : Tensor(label, make_ext(dynamic_extents...)) {}

  /// Allocates a zero-filled tensor of the given extents.
  /// Throws shape_error, allocating nothing, when the byte count does not fit in a ptrdiff_t.
  Tensor(const std::string& label, const Ext& e) : ext_(e), data_(label, alloc_count(label, e)) {}

  /// Allocates without initialising the elements (the caller overwrites them all).
  static Tensor uninitialized(const std::string& label, const Ext& e) {
    Tensor t;
    t.ext_ = e;
    t.data_ = kokkos_view_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, label),
                               alloc_count(label, e));
    return t;
  }

  /// Adopts an existing 1-D Kokkos::View holding exactly e.size() elements (shares it).
  Tensor(kokkos_view_type data, const Ext& e) : ext_(e), data_(std::move(data)) {
    if (static_cast<index_t>(data_.extent(0)) != e.size())
      throw shape_error("tessera::Tensor: view '" + data_.label() + "' holds " +
                        std::to_string(data_.extent(0)) + " elements, shape " + shape_string(e) +
                        " needs " + std::to_string(e.size()));
  }

  view_type view() const { return view_type(data_.data(), ext_); }
  operator view_type() const { return view(); } // NOLINT: a tensor is usable where a view is
  auto slice(index_t begin, index_t end) const { return view().slice(begin, end); }

  /// The first element (device-callable, like Kokkos::View::data()).
  TESSERA_INLINE storage_type* data() const noexcept { return data_.data(); }
  const kokkos_view_type& kokkos_view() const noexcept { return data_; }
  const Ext& extents() const noexcept { return ext_; }
  index_t extent(std::size_t i) const noexcept { return ext_.extent(i); }
  index_t size() const noexcept { return ext_.size(); }
  std::string label() const { return data_.label(); }
  bool is_allocated() const noexcept { return data_.data() != nullptr || ext_.size() == 0; }

  /// Element access from host code, for a tensor whose memory the host can reach
  /// (is_host_accessible_v; on a host build of Kokkos every tensor's). It is a host function:
  /// kernels capture view() and index that (TensorView::operator() is device-callable), so
  /// this refusal never concerns code running on a device. A tensor in device memory is read
  /// on the host through host_mirror_copy(t) and written through host_mirror(t) +
  /// copy_from_host (tensor/host_mirror.hpp); calling t(i...) on it does not compile.
  template <class... I>
    requires(sizeof...(I) == rank && (std::is_integral_v<I> && ...))
  storage_type& operator()(I... idx) const noexcept {
    static_assert(is_host_accessible_v<MemorySpace>,
                  "tessera::Tensor::operator(): element access from host code needs memory the "
                  "host can reach, and this tensor's memory space is a device's; read it with "
                  "tessera::host_mirror_copy(t) (tensor/host_mirror.hpp), write it through "
                  "tessera::host_mirror(t) and tessera::copy_from_host(t, h), or index t.view() "
                  "inside a kernel.");
    return view()(idx...);
  }

private:
  /// e.size() as the element count to allocate, after checking that its bytes are addressable
  /// (the extents themselves already checked that the count fits in int64).
  static std::size_t alloc_count(const std::string& label, const Ext& e) {
    if (!detail::fits_bytes(e.size(), sizeof(storage_type)))
      throw shape_error("tessera::Tensor: tensor '" + label + "' of shape " + shape_string(e) +
                        " would need " + std::to_string(e.size()) + " elements of " +
                        std::to_string(sizeof(storage_type)) +
                        " bytes, more bytes than a 64-bit address range holds");
    return static_cast<std::size_t>(e.size());
  }

  template <class... I>
  static Ext make_ext(I... d) {
    static_assert(sizeof...(I) == Ext::rank_dynamic,
                  "tessera::Tensor: pass exactly one size per tessera::dyn extent of the shape; "
                  "static extents are part of the type and are not passed.");
    if constexpr (sizeof...(I) == 0 || sizeof...(I) != Ext::rank_dynamic) {
      return Ext{};
    } else {
      return Ext(static_cast<index_t>(d)...);
    }
  }

  Ext ext_{};
  kokkos_view_type data_;
};

template <class T>
struct is_tensor : std::false_type {};
template <class P, class E, class L, class M>
struct is_tensor<Tensor<P, E, L, M>> : std::true_type {};

/// A tensor of the same shape and layout in another precision or memory space.
template <Precision P2, class T, class Space2 = typename T::memory_space>
using rebind_tensor_t = Tensor<P2, typename T::extents_type, typename T::layout, Space2>;

/// A host tensor with the same precision, shape and layout (for reading results).
template <class T>
using host_tensor_t =
    Tensor<typename T::precision, typename T::extents_type, typename T::layout, Kokkos::HostSpace>;

} // namespace tessera
