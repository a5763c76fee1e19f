#pragma once
/// \file tensor/overlap.hpp
/// Whether two strided element sets share memory: the one predicate behind every "an output
/// must not overlap an operand it reads" check (gemm, gemm_batched, the conv2d passes,
/// convert_into, quantize_with_scale, deep_copy).
///
/// A region is a base address, extents, strides in elements (any sign, 0 allowed) and an
/// element size in bytes; element (i0, i1, ...) occupies the bytes
/// [base + (sum_k i_k stride_k) * elem, ... + elem). regions_overlap(a, b) is true when some
/// byte belongs to an element of a and to an element of b:
///
///  - first filter: the byte ranges [lowest element, highest element + elem) are disjoint ->
///    false (separate allocations always end here, in O(rank));
///  - else exact, when at least one of the two is "nested" (after dropping extent-1 and
///    stride-0 dimensions, making strides positive and sorting them, each stride exceeds the
///    largest offset of the dimensions inside it: every row-major, column-major, transposed,
///    sliced or padded view of a tensor is): the rows (innermost dimension) of the other region
///    are walked, and for each, the elements of the nested region inside the row's byte range
///    are enumerated in address order (found by a greedy descent, O(rank)) and tested against
///    the row's arithmetic progression exactly. The cost is O(rows x rank + elements of the
///    nested region inside the rows' byte ranges): O(rows) for interleaved halves of one matrix,
///    and it stops at the first shared byte;
///  - conservative fallback (documented, never silent): when neither region is nested (e.g. two
///    self-overlapping sliding-window views), or when the walk exceeds `budget` steps (2^25 by
///    default: only element-by-element interleavings of two regions of tens of millions of
///    elements get there), the regions are reported as overlapping. A caller then refuses a call
///    that may have been legal, with a message saying the overlap could not be ruled out.
///
///   detail::regions_overlap(detail::region_of(a), detail::region_of(c))

#include <tessera/config/error.hpp>
#include <tessera/tensor/extents.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace tessera::detail {

/// Elements of equal size at base + (sum_k i_k stride_k) * elem, 0 <= i_k < ext_k.
struct mem_region {
  static constexpr std::size_t max_rank = 8;
  std::uintptr_t base = 0;
  std::size_t rank = 0;
  std::int64_t ext[max_rank] = {};
  std::int64_t stride[max_rank] = {}; ///< in elements
  std::int64_t elem = 1;              ///< bytes per element
};

/// The region of a TensorView (or anything with data(), extent(i), stride(i), rank and a
/// storage_type).
template <class V>
mem_region region_of(const V& v) {
  static_assert(V::rank <= mem_region::max_rank, "tessera: overlap checks support rank <= 8.");
  mem_region r;
  r.base = reinterpret_cast<std::uintptr_t>(v.data());
  r.rank = V::rank;
  for (std::size_t k = 0; k < V::rank; ++k) {
    r.ext[k] = v.extent(k);
    r.stride[k] = v.stride(k);
  }
  r.elem = static_cast<std::int64_t>(sizeof(typename V::storage_type));
  return r;
}

/// A region from raw parts (type-erased operands such as GEMM epilogue biases).
inline mem_region region_of(const void* data, std::int64_t elem_bytes,
                            std::initializer_list<std::int64_t> ext,
                            std::initializer_list<std::int64_t> stride) {
  mem_region r;
  r.base = reinterpret_cast<std::uintptr_t>(data);
  r.elem = elem_bytes;
  auto s = stride.begin();
  for (const std::int64_t e : ext) {
    r.ext[r.rank] = e;
    r.stride[r.rank] = *s++;
    ++r.rank;
  }
  return r;
}

namespace overlap_impl {

using wide = __int128;

/// A region with only the dimensions that add addresses (extent > 1, stride != 0), strides in
/// bytes made positive (the base moved to the lowest element) and sorted in decreasing order.
struct flat {
  bool empty = false;
  bool zero_stride = false; ///< a dimension of extent > 1 had stride 0 (repeated elements)
  wide base = 0;            ///< address of the lowest element
  std::size_t n = 0;
  wide ext[mem_region::max_rank] = {};
  wide str[mem_region::max_rank] = {};
  wide inner[mem_region::max_rank] = {}; ///< largest offset of dimensions k+1.. (0 for the last)
  wide span = 0;                         ///< offset of the highest element
  wide elem = 1;
  std::int64_t count = 1; ///< distinct index tuples over the kept dimensions (saturating)
};

inline flat normalize(const mem_region& r) {
  flat f;
  f.base = static_cast<wide>(r.base);
  f.elem = r.elem;
  for (std::size_t k = 0; k < r.rank; ++k) {
    if (r.ext[k] == 0) f.empty = true;
    if (r.ext[k] <= 1) continue;
    wide s = static_cast<wide>(r.stride[k]) * r.elem;
    if (s == 0) {
      f.zero_stride = true;
      continue;
    }
    if (s < 0) {
      f.base += (r.ext[k] - 1) * s;
      s = -s;
    }
    // insertion by decreasing stride
    std::size_t i = f.n++;
    while (i > 0 && f.str[i - 1] < s) {
      f.str[i] = f.str[i - 1];
      f.ext[i] = f.ext[i - 1];
      --i;
    }
    f.str[i] = s;
    f.ext[i] = r.ext[k];
  }
  wide in = 0;
  for (std::size_t k = f.n; k-- > 0;) {
    f.inner[k] = in;
    in += (f.ext[k] - 1) * f.str[k];
  }
  f.span = in;
  for (std::size_t k = 0; k < f.n; ++k)
    f.count = f.count > (std::int64_t{1} << 62) / static_cast<std::int64_t>(f.ext[k])
                  ? (std::int64_t{1} << 62)
                  : f.count * static_cast<std::int64_t>(f.ext[k]);
  return f;
}

/// Each stride exceeds the largest offset inside it: element offsets increase strictly in
/// lexicographic index order.
inline bool nested(const flat& f) {
  for (std::size_t k = 0; k < f.n; ++k)
    if (f.str[k] <= f.inner[k]) return false;
  return true;
}

/// The smallest element offset >= t (relative to f.base) and its index tuple; false if none.
inline bool first_at_least(const flat& f, wide t, wide* idx, wide& off) {
  if (t > f.span) return false;
  off = 0;
  for (std::size_t k = 0; k < f.n; ++k) {
    const wide rem = t - off;
    if (rem <= 0) {
      for (std::size_t j = k; j < f.n; ++j) idx[j] = 0;
      return true;
    }
    wide i = rem / f.str[k];
    if (i > f.ext[k] - 1) i = f.ext[k] - 1;
    if (rem - i * f.str[k] <= f.inner[k]) { // an element >= t lies in block i
      idx[k] = i;
      off += i * f.str[k];
      continue;
    }
    idx[k] = i + 1; // block i ends below t; block i + 1 (exists: see the invariant) starts above
    off += (i + 1) * f.str[k];
    for (std::size_t j = k + 1; j < f.n; ++j) idx[j] = 0;
    return true;
  }
  return true;
}

/// The next index tuple in lexicographic order (its offset in off); false after the last.
inline bool next_index(const flat& f, wide* idx, wide& off) {
  for (std::size_t k = f.n; k-- > 0;) {
    if (idx[k] + 1 < f.ext[k]) {
      ++idx[k];
      off += f.str[k];
      return true;
    }
    off -= idx[k] * f.str[k];
    idx[k] = 0;
  }
  return false;
}

inline wide floor_div(wide a, wide b) { // b > 0
  wide q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

/// Does any element of the nested region q share a byte with the elements r0 + i s (i < cnt,
/// each e bytes)? `budget` is decremented per element looked at.
inline bool row_hits(const flat& q, wide r0, wide s, wide cnt, wide e, std::int64_t& budget) {
  const wide hi = r0 + (cnt - 1) * s + e; // q's element start o must be < hi
  const wide lo = r0 - q.elem + 1;        // and >= lo
  wide idx[mem_region::max_rank];
  wide off = 0;
  if (!first_at_least(q, lo - q.base, idx, off)) return false;
  do {
    const wide o = q.base + off;
    if (o >= hi) return false;
    if (--budget < 0) return true;
    // an i with o - e < r0 + i s < o + q.elem
    if (cnt == 1) {
      if (o - e < r0 && r0 < o + q.elem) return true;
    } else {
      wide i_lo = floor_div(o - e - r0, s) + 1;
      wide i_hi = -floor_div(-(o + q.elem - r0), s) - 1; // ceil - 1
      if (i_lo < 0) i_lo = 0;
      if (i_hi > cnt - 1) i_hi = cnt - 1;
      if (i_lo <= i_hi) return true;
    }
  } while (next_index(q, idx, off));
  return false;
}

} // namespace overlap_impl

/// The default step budget of regions_overlap (see the file comment).
inline constexpr std::int64_t overlap_budget = std::int64_t{1} << 25;

/// True when some byte lies in an element of a and in an element of b (see the file comment:
/// exact when one region is nested and the walk stays within `budget` steps; otherwise true).
inline bool regions_overlap(const mem_region& a, const mem_region& b,
                            std::int64_t budget = overlap_budget) {
  namespace oi = overlap_impl;
  using flat = oi::flat;
  using wide = oi::wide;
  const flat fa = oi::normalize(a), fb = oi::normalize(b);
  if (fa.empty || fb.empty) return false;
  if (fa.base + fa.span + fa.elem <= fb.base || fb.base + fb.span + fb.elem <= fa.base)
    return false;
  const bool na = oi::nested(fa), nb = oi::nested(fb);
  if (!na && !nb) return true; // conservative
  // Walk the rows of `it`, query the nested `q`; when both are nested, walk the smaller.
  const bool walk_a = !na || (nb && fa.count <= fb.count);
  const flat& it = walk_a ? fa : fb;
  const flat& q = walk_a ? fb : fa;
  const std::size_t outer = it.n == 0 ? 0 : it.n - 1;
  const wide s = it.n == 0 ? 0 : it.str[it.n - 1];
  const wide cnt = it.n == 0 ? 1 : it.ext[it.n - 1];
  wide idx[mem_region::max_rank] = {};
  wide off = 0;
  for (;;) {
    if (--budget < 0) return true;
    if (oi::row_hits(q, it.base + off, s, cnt, it.elem, budget)) return true;
    std::size_t k = outer;
    for (; k-- > 0;) {
      if (idx[k] + 1 < it.ext[k]) {
        ++idx[k];
        off += it.str[k];
        break;
      }
      off -= idx[k] * it.str[k];
      idx[k] = 0;
    }
    if (k == static_cast<std::size_t>(-1)) return false; // every row walked
  }
}

/// True when no two elements of r share a byte (a stride-0 dimension of extent > 1 repeats
/// elements and is refused). Exact for nested regions; a region that is not nested is reported
/// as not distinct (conservative).
inline bool distinct_elements(const mem_region& r) {
  const overlap_impl::flat f = overlap_impl::normalize(r);
  if (f.empty) return true;
  if (f.zero_stride) return false;
  for (std::size_t k = 0; k < f.n; ++k)
    if (f.str[k] < f.inner[k] + f.elem) return false;
  return true;
}

/// "x (2, 3, 8, 8) strides (192, 64, 8, 1)": an operand for overlap messages.
template <class V>
std::string describe_region(const char* name, const V& v) {
  std::string s = std::string(name) + " " + shape_string(v.extents()) + " strides (";
  for (std::size_t d = 0; d < V::rank; ++d) s += (d ? ", " : "") + std::to_string(v.stride(d));
  return s + ")";
}

/// Throws shape_error, naming the operation and both operands with their shapes and strides,
/// when the output `out` shares memory with the operand `in` it reads.
template <class VO, class VI>
void require_no_overlap(const char* op, const char* out_name, const VO& out, const char* in_name,
                        const VI& in) {
  if (regions_overlap(region_of(out), region_of(in)))
    throw shape_error(std::string(op) + ": " + describe_region(out_name, out) + " and " +
                      describe_region(in_name, in) + ": the output " + out_name +
                      " overlaps the operand " + in_name +
                      " in memory (or the overlap could not be ruled out); outputs must not share "
                      "memory with the operands the operation reads");
}

/// Throws shape_error, naming the operation and the output with its shape and strides, when two
/// elements of the output share memory (see distinct_elements).
template <class V>
void require_distinct(const char* op, const char* name, const V& out) {
  if (!distinct_elements(region_of(out)))
    throw shape_error(std::string(op) + ": " + describe_region(name, out) +
                      ": two elements of the "
                      "output " +
                      name +
                      " share memory (a stride of 0 or strides that overlap); "
                      "every output element needs its own address");
}

} // namespace tessera::detail
