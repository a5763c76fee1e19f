#pragma once
/// \file tensor/scaled_tensor.hpp
/// scaled_tensor<P, ...>: an fp8 payload plus one fp32 scale per tensor. The convention is
/// Transformer Engine's: payload = round(x * scale), so x ~= payload * scale_inv with
/// scale_inv = 1 / scale. quantize picks scale = max_finite / amax / 2^margin so that the
/// largest magnitude lands on (or, with a margin, below) the format's largest finite value.
///
///   auto q = tessera::quantize<tessera::fp8_e4m3>(x);   // x: fp32 tensor
///   auto back = tessera::dequantize(q);                  // fp32 again, within fp8 rounding

#include <tessera/tensor/ops.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace tessera {

// P is checked by a static_assert (not a constraint) so that quantize<bf16>(x) reports one
// sentence.
template <class P, class Ext, class L = layout_right,
          class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct scaled_tensor {
  static_assert(Fp8Precision<P>, "tessera::scaled_tensor / quantize: the payload precision must be "
                                 "an fp8 precision (tessera::fp8_e4m3 or tessera::fp8_e5m2).");
  using precision = P;
  using extents_type = Ext;
  using layout = L;
  using memory_space = MemorySpace;
  static constexpr std::size_t rank = Ext::rank;

  Tensor<P, Ext, L, MemorySpace> data; ///< the fp8 payload
  float scale = 1.f;                   ///< payload = round(x * scale)

  float scale_inv() const noexcept { return 1.f / scale; }
  const Ext& extents() const noexcept { return data.extents(); }
  index_t extent(std::size_t i) const noexcept { return data.extent(i); }
};

/// True for a scaled_tensor (what gemm and conv2d accept beside Tensor and TensorView).
template <class T>
struct is_scaled_tensor : std::false_type {};
template <class P, class E, class L, class M>
struct is_scaled_tensor<scaled_tensor<P, E, L, M>> : std::true_type {};

namespace detail {
/// A per-tensor scale is usable when it is a positive, finite, normal float:
/// FLT_MIN (2^-126) <= scale <= FLT_MAX. Then 1 / scale is finite and non-zero, so neither the
/// payload (x * scale) nor the values read back (payload / scale) turn into 0, inf or NaN
/// because of the scale. 0, negative values, NaN, +-inf and subnormals are refused.
inline bool valid_scale(float s) noexcept {
  return s >= std::numeric_limits<float>::min() && s <= std::numeric_limits<float>::max();
}

/// Throws value_error naming the operation, the operand and the rule unless valid_scale(s).
/// The one check every scale entering an operation goes through (quantize_with_scale,
/// dequantize, gemm's scaled operands, conv2d's scaled inputs).
inline void require_valid_scale(const char* op, const char* operand, float s) {
  if (!valid_scale(s))
    throw value_error(std::string(op) + ": the scale of " + operand + " is " + std::to_string(s) +
                      " (bits " + std::to_string(detail::bit_cast<std::uint32_t>(s)) +
                      "); a scale must be positive, finite and normal (>= 2^-126), so that 1 / "
                      "scale is finite");
}
} // namespace detail

/// The scale that maps amax to max_finite / 2^margin. A zero, infinite or NaN amax gives no
/// information, so the previous scale is kept (what delayed-scaling recipes do); so is a result
/// that is not a valid scale (detail::valid_scale: e.g. 0 after a huge margin).
template <Fp8Precision P>
float scale_for_amax(float amax, int margin = 0, float previous = 1.f) noexcept {
  if (!(amax > 0.f) || !std::isfinite(amax)) return previous;
  const float s = precision_traits<P>::max_finite / amax / std::ldexp(1.f, margin);
  return detail::valid_scale(s) ? s : previous;
}

/// Quantizes an fp32 (or bf16) tensor to scaled fp8: computes amax, picks the scale, converts
/// with saturation.
template <class P, class Exec, class SrcP, class E, class L, class M>
scaled_tensor<P, E, L, M> quantize(const Exec& exec, const Tensor<SrcP, E, L, M>& x,
                                   int margin = 0) {
  scaled_tensor<P, E, L, M> q{
      Tensor<P, E, L, M>::uninitialized(x.label() + "_" + precision_traits<P>::name, x.extents()),
      scale_for_amax<P>(amax(exec, x), margin, 1.f)};
  const auto* in = x.data();
  auto* out = q.data.data();
  const float s = q.scale;
  Kokkos::parallel_for(
      "tessera::quantize", Kokkos::RangePolicy<Exec>(exec, 0, x.size()),
      KOKKOS_LAMBDA(const index_t i) { out[i] = from_float<P, saturate>(to_float(in[i]) * s); });
  exec.fence();
  return q;
}
template <class P, class SrcP, class E, class L, class M>
scaled_tensor<P, E, L, M> quantize(const Tensor<SrcP, E, L, M>& x, int margin = 0) {
  return quantize<P>(detail::default_exec_t<Tensor<SrcP, E, L, M>>{}, x, margin);
}

/// Quantizes x into an existing fp8 payload with a given scale (payload = round(x * scale),
/// saturating), in one pass that also returns the amax of x (NaN if x holds a NaN), which
/// delayed-scaling recipes record for the next step. Throws shape_error if the shapes differ or
/// the payload shares memory with x, value_error for an invalid scale (detail::valid_scale), in
/// both cases before writing anything.
///   float seen = tessera::quantize_with_scale(exec, x, q.data, q.scale);
template <class Exec, class P, class SrcP, class E1, class E2, class L, class M>
float quantize_with_scale(const Exec& exec, const Tensor<SrcP, E1, L, M>& x,
                          const Tensor<P, E2, L, M>& payload, float scale) {
  static_assert(Fp8Precision<P>, "tessera::quantize_with_scale: the payload precision must be an "
                                 "fp8 precision (tessera::fp8_e4m3 or tessera::fp8_e5m2).");
  detail::require_same_shape("tessera::quantize_with_scale", payload, "payload", x, "x");
  detail::require_no_overlap("tessera::quantize_with_scale", "payload", payload.view(), "x",
                             x.view());
  detail::require_valid_scale("tessera::quantize_with_scale", "the payload", scale);
  const auto* in = x.data();
  auto* out = payload.data();
  std::uint32_t result = 0;
  if constexpr (detail::is_host_exec_v<Exec> && !TESSERA_DEVICE_PASS) {
    // The same in vectorised chunks, bit for bit.
    return detail::bit_cast<float>(
        detail::amax_quantize_host_chunks<P, true>(exec, in, out, x.size(), scale));
  }
  // The magnitudes' bit patterns are reduced as unsigned integers, as amax does (NaN survives).
  Kokkos::parallel_reduce(
      "tessera::quantize_with_scale", Kokkos::RangePolicy<Exec>(exec, 0, x.size()),
      KOKKOS_LAMBDA(const index_t i, std::uint32_t& m) {
        const float v = to_float(in[i]);
        out[i] = from_float<P, saturate>(v * scale);
        const std::uint32_t a = detail::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
        m = a > m ? a : m;
      },
      Kokkos::Max<std::uint32_t>(result));
  return detail::bit_cast<float>(result);
}

/// payload * scale_inv as an fp32 tensor. Throws value_error for an invalid q.scale
/// (detail::valid_scale) before allocating anything.
template <class Exec, class P, class E, class L, class M>
Tensor<fp32, E, L, M> dequantize(const Exec& exec, const scaled_tensor<P, E, L, M>& q) {
  detail::require_valid_scale("tessera::dequantize", "q", q.scale);
  auto y = Tensor<fp32, E, L, M>::uninitialized(q.data.label() + "_dequant", q.extents());
  const auto* in = q.data.data();
  auto* out = y.data();
  const float si = q.scale_inv();
  Kokkos::parallel_for(
      "tessera::dequantize", Kokkos::RangePolicy<Exec>(exec, 0, y.size()),
      KOKKOS_LAMBDA(const index_t i) { out[i] = to_float(in[i]) * si; });
  exec.fence();
  return y;
}
template <class P, class E, class L, class M>
Tensor<fp32, E, L, M> dequantize(const scaled_tensor<P, E, L, M>& q) {
  return dequantize(detail::default_exec_t<Tensor<P, E, L, M>>{}, q);
}

} // namespace tessera
