#pragma once
/// \file config/checked.hpp
/// Overflow-checked 64-bit integer arithmetic, the one place products and sums of sizes are
/// formed before anything is allocated or indexed: extents (element counts), strided views
/// (address spans), reshape, the output size of a convolution and the scratch sizes derived from
/// it. Each function reports overflow instead of wrapping (signed overflow is undefined
/// behaviour); callers turn a report into a tessera::shape_error naming the operation and the
/// sizes.
///
///   std::int64_t n;
///   if (!tessera::detail::checked_mul(rows, cols, n)) throw shape_error("... overflows");

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>

namespace tessera::detail {

/// r = a * b; false (r unspecified) if the exact product does not fit in int64.
constexpr bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& r) noexcept {
  return !__builtin_mul_overflow(a, b, &r);
}

/// r = a + b; false (r unspecified) if the exact sum does not fit in int64.
constexpr bool checked_add(std::int64_t a, std::int64_t b, std::int64_t& r) noexcept {
  return !__builtin_add_overflow(a, b, &r);
}

/// r = the product of all factors (1 for none); false if it, or any partial product, does not
/// fit in int64. With non-negative factors a partial product overflowing implies the full one
/// does, unless a later factor is 0: {2^40, 2^40, 0} is reported as an overflow too (a shape
/// whose other extents overflow is refused even when it is empty).
constexpr bool checked_product(std::initializer_list<std::int64_t> factors,
                               std::int64_t& r) noexcept {
  std::int64_t p = 1;
  for (const std::int64_t f : factors)
    if (!checked_mul(p, f, p)) return false;
  r = p;
  return true;
}

/// The largest byte count tessera allocates or addresses: PTRDIFF_MAX (pointer differences and
/// index_t offsets in bytes must be representable).
inline constexpr std::int64_t max_bytes = std::numeric_limits<std::ptrdiff_t>::max();

/// True when `count` elements of `elem_bytes` bytes each are at most max_bytes.
constexpr bool fits_bytes(std::int64_t count, std::size_t elem_bytes) noexcept {
  std::int64_t b = 0;
  return count >= 0 && checked_mul(count, static_cast<std::int64_t>(elem_bytes), b) &&
         b <= max_bytes;
}

} // namespace tessera::detail
