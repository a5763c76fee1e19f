#pragma once
/// \file tensor/host_mirror.hpp
/// Host access to tensor memory, in one place: the one predicate every tessera function asks
/// before host code touches a memory space, and the host mirrors that stage a tensor through
/// the host when its memory is the device's.
///
///   tessera::is_host_accessible_v<M>     host code may read and write memory of space M directly
///                                         (HostSpace; HIP / CUDA host-pinned and managed memory)
///   tessera::host_mirror_t<T>            T when its memory is host-accessible, else T's
///                                         HostSpace twin (host_tensor_t<T>)
///   tessera::host_mirror(t)              t itself (shared) or a new host tensor of t's shape,
///                                         contents not copied (to fill, then copy_from_host)
///   tessera::host_mirror_copy(t)         the same holding t's elements (to read)
///   tessera::copy_from_host(t, h)        h's elements into t (nothing to do when h is t)
///
/// On a host build (OpenMP, Serial, Threads) every memory space is host-accessible: the mirror
/// is the tensor itself and the copies are a fence. On a device build (HIP, CUDA) they are one
/// Kokkos::deep_copy each way. A function that must read tensor memory on the host and does
/// not stage it this way refuses device memory at compile time with
/// static_assert(is_host_accessible_v<M>, "<function>: ... what the caller must do"), as
/// Tensor::operator() (host element access) does.
///
///   auto h = tessera::host_mirror(batch);        // fill on the host
///   for (index_t i = 0; i < h.size(); ++i) h.data()[i] = ...;
///   tessera::copy_from_host(batch, h);           // and hand it to the device
///   const auto l = tessera::host_mirror_copy(logits);  // read results on the host

#include <tessera/tensor/tensor.hpp>

#include <type_traits>

namespace tessera {

// is_host_accessible_v<M> is defined in tensor/tensor.hpp (Tensor::operator() asks it too).

/// The tensor host_mirror(t) returns for a T: T itself when the host can reach its memory,
/// else the HostSpace tensor of the same precision, shape and layout.
template <class T>
using host_mirror_t =
    std::conditional_t<is_host_accessible_v<typename T::memory_space>, T, host_tensor_t<T>>;

/// A tensor of t's shape whose elements host code may touch: t itself (no allocation, no copy)
/// when its memory is host-accessible, else a new uninitialised host tensor. Its contents are
/// t's only in the first case; use host_mirror_copy to read t, copy_from_host to write t.
template <class P, class E, class L, class M>
host_mirror_t<Tensor<P, E, L, M>> host_mirror(const Tensor<P, E, L, M>& t) {
  if constexpr (is_host_accessible_v<M>) {
    return t;
  } else {
    return host_tensor_t<Tensor<P, E, L, M>>::uninitialized(t.label() + ".host", t.extents());
  }
}

/// host_mirror(t) holding t's elements, after every kernel writing them has finished (a
/// device-to-host copy when t's memory is the device's, else only the fence).
template <class P, class E, class L, class M>
host_mirror_t<Tensor<P, E, L, M>> host_mirror_copy(const Tensor<P, E, L, M>& t) {
  auto h = host_mirror(t);
  if constexpr (is_host_accessible_v<M>) {
    Kokkos::fence(); // managed or pinned memory: kernels may still be writing it
  } else {
    Kokkos::deep_copy(h.kokkos_view(), t.kokkos_view());
  }
  return h;
}

/// Copies a host mirror's elements (host_mirror(t), filled by host code) into t; when the
/// mirror is t itself there is nothing to copy. Throws shape_error if the shapes differ.
template <class P, class E, class L, class M>
void copy_from_host(const Tensor<P, E, L, M>& t, const host_mirror_t<Tensor<P, E, L, M>>& h) {
  bool same = true;
  for (std::size_t i = 0; i < E::rank; ++i) same = same && t.extent(i) == h.extent(i);
  if (!same)
    throw shape_error("tessera::copy_from_host: tensor '" + t.label() + "' has shape " +
                      shape_string(t.extents()) + " but its host mirror '" + h.label() +
                      "' has shape " + shape_string(h.extents()) + "; they must be equal");
  if constexpr (!std::is_same_v<host_mirror_t<Tensor<P, E, L, M>>, Tensor<P, E, L, M>>) {
    Kokkos::deep_copy(t.kokkos_view(), h.kokkos_view());
  } else if (h.data() != t.data()) {
    Kokkos::deep_copy(t.kokkos_view(), h.kokkos_view());
  }
}

} // namespace tessera
