#pragma once
/// \file precision/vector_convert.hpp
/// Whole-array conversions on the host, bit-identical to the scalar ones in convert.hpp.
///
///   tessera::convert_n<tessera::bf16>(src_floats, dst_bf16, n);

#include <tessera/precision/convert.hpp>

#include <cstddef>

namespace tessera {

/// Converts n elements (storage of any precision) to storage of precision To on the host.
/// Rounding and overflow exactly as convert<To, Policy> element by element.
template <Precision To, OverflowPolicy Policy = default_overflow_t<To>, class From>
void convert_n(const From* src, storage_t<To>* dst, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = convert<To, Policy>(src[i]);
}

} // namespace tessera
