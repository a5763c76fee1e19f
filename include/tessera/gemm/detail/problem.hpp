#pragma once
/// \file gemm/detail/problem.hpp
/// One GEMM call brought to a single form every algorithm takes: the three views, the sizes,
/// alpha/beta with the operand scales folded in, the output scale and the epilogue ops; plus
/// the argument checks (shapes, aliasing, strides) shared by gemm and gemm_batched.

#include <tessera/gemm/epilogue.hpp>
#include <tessera/gemm/options.hpp>

#include <cstdint>
#include <string>

namespace tessera::detail {

/// alpha * acc + beta * C_old, the epilogue ops, amax, the output scale and the cast.
/// Everything an algorithm needs besides the product itself.
template <class VA, class VB, class VC, class Ops, bool ScaledOut>
struct gemm_problem {
  using pa = typename VA::precision;
  using pb = typename VB::precision;
  using pc = typename VC::precision;
  static constexpr bool scaled_out = ScaledOut;
  VA a;
  VB b;
  VC c;
  index_t m = 0, n = 0, k = 0;
  float alpha = 1.f; ///< alpha times the scale_inv of each scaled input
  float beta = 0.f;  ///< beta over the output scale (C_old is payload / scale)
  float out_scale = 1.f;
  Ops ops{};

  /// The value before the cast for accumulator acc at (i, j).
  TESSERA_INLINE float value(float acc, index_t i, index_t j) const noexcept {
    float v = alpha * acc;
    if (beta != 0.f) v += beta * to_float(c(i, j));
    return ops(v, i, j);
  }
  /// Writes the final value v of (i, j) to C.
  TESSERA_INLINE void put(float v, index_t i, index_t j) const noexcept {
    if constexpr (ScaledOut) {
      c(i, j) = from_float<pc, saturate>(v * out_scale);
    } else {
      c(i, j) = from_float<pc>(v);
    }
  }
  /// value + put; returns |v| for the amax (0 when the output is not scaled).
  TESSERA_INLINE float store(float acc, index_t i, index_t j) const noexcept {
    const float v = value(acc, i, j);
    put(v, i, j);
    if constexpr (ScaledOut) {
      const float a = v < 0.f ? -v : v;
      return a == a ? a : 0.f; // NaN does not enter the amax
    } else {
      return 0.f;
    }
  }
};

/// True when the elements of the views x and y share a byte: the exact predicate of
/// tensor/overlap.hpp (operands that only share an allocation, such as two column halves of one
/// matrix, do not overlap).
template <class V1, class V2>
bool overlaps(const V1& x, const V2& y) {
  return regions_overlap(region_of(x), region_of(y));
}

template <class V>
std::string gemm_describe(const char* name, const V& v) {
  std::string s = std::string(name) + " " + shape_string(v.extents()) + " strides (";
  for (std::size_t d = 0; d < V::rank; ++d) s += (d ? ", " : "") + std::to_string(v.stride(d));
  return s + ") " + precision_traits<typename V::precision>::name;
}

/// The run-time checks of gemm: shapes, strides of C, C aliasing A or B, epilogue lengths.
template <class VA, class VB, class VC, class Ops>
void check_gemm_args(const char* who, const VA& a, const VB& b, const VC& c, const Ops& ops) {
  const index_t m = a.extent(0), k = a.extent(1), n = b.extent(1);
  const auto all = [&] {
    return gemm_describe("A", a) + ", " + gemm_describe("B", b) + ", " + gemm_describe("C", c);
  };
  if (b.extent(0) != k || c.extent(0) != m || c.extent(1) != n)
    throw shape_error(std::string(who) + ": " + all() + ": needs A (M, K), B (K, N), C (M, N)");
  if ((c.extent(0) > 1 && c.stride(0) < 0) || (c.extent(1) > 1 && c.stride(1) < 0) ||
      !distinct_elements(region_of(c)))
    throw shape_error(std::string(who) + ": " + all() +
                      ": the strides of C must be non-negative and give every element of C its "
                      "own address");
  if (a.stride(0) < 0 || a.stride(1) < 0 || b.stride(0) < 0 || b.stride(1) < 0)
    throw shape_error(std::string(who) + ": " + all() +
                      ": negative strides of A or B are not supported");
  if (overlaps(c, a))
    throw shape_error(std::string(who) + ": " + all() +
                      ": C overlaps A in memory (aliasing; C must not share memory with an "
                      "operand the GEMM reads)");
  if (overlaps(c, b))
    throw shape_error(std::string(who) + ": " + all() +
                      ": C overlaps B in memory (aliasing; C must not share memory with an "
                      "operand the GEMM reads)");
  ops.check(who, m, n);
  // Epilogue operands (biases, residuals) are read while C is written, partial sums included
  // (host_packed stores them in C between K blocks): none may share memory with C.
  const mem_region rc = region_of(c);
  ops.for_each_operand([&](const char* name, const mem_region& r) {
    if (regions_overlap(rc, r))
      throw shape_error(std::string(who) + ": " + all() + ": the epilogue operand epi::" + name +
                        " overlaps C in memory (aliasing; C must not share memory with an "
                        "operand the GEMM reads)");
  });
}

/// Throws value_error unless each scaled operand's scale is valid (detail::valid_scale:
/// positive, finite, normal), before anything is written.
template <class OA, class OB, class OC>
void check_gemm_scales(const char* who, const OA& oa, const OB& ob, const OC& oc) {
  if constexpr (OA::scaled) require_valid_scale(who, "A", oa.scale);
  if constexpr (OB::scaled) require_valid_scale(who, "B", ob.scale);
  if constexpr (OC::scaled) require_valid_scale(who, "C (the output)", oc.scale);
}

} // namespace tessera::detail
