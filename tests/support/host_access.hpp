#pragma once
// Host reads and writes of tensors in any memory space, for tests: every test that checks or
// sets elements of a tensor the library computed on the default execution space goes through
// here (tessera::host_mirror_copy to read, host_mirror + copy_from_host to write), so that the
// same test runs on a host build and on a device build (HIP, CUDA) of Kokkos.
#include <tessera/tensor.hpp>
#include <tessera/tensor/host_mirror.hpp>

#include <cstring>
#include <type_traits>
#include <vector>

namespace tessera::testing {

/// The bytes of a tensor's elements, in storage order, read after every kernel writing them.
template <class T>
std::vector<unsigned char> bytes_of(const T& t) {
  const auto h = host_mirror_copy(t);
  std::vector<unsigned char> b(static_cast<std::size_t>(h.size()) * sizeof(*h.data()));
  if (!b.empty()) std::memcpy(b.data(), h.data(), b.size());
  return b;
}

/// True when a tensor's elements are bit for bit the bytes b (taken with bytes_of).
template <class T>
bool same_bytes(const T& t, const std::vector<unsigned char>& b) {
  return bytes_of(t) == b;
}

/// Sets element i (in storage order) of t to v, leaving the others as they are.
template <class T>
void set_element(const T& t, index_t i, typename T::storage_type v) {
  const auto h = host_mirror_copy(t);
  h.data()[i] = v;
  copy_from_host(t, h);
}

/// Element i (in storage order) of t.
template <class T>
typename T::storage_type element(const T& t, index_t i) {
  return host_mirror_copy(t).data()[i];
}

/// Sets every element i (in storage order) of t to f(i), computed on the host.
template <class T, class F>
void fill_on_host(const T& t, F f) {
  const auto h = host_mirror(t);
  for (index_t i = 0; i < h.size(); ++i) h.data()[i] = f(i);
  copy_from_host(t, h);
}

} // namespace tessera::testing
