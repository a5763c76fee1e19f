#pragma once
/// \file tensor/ops.hpp
/// Whole-tensor operations: deep_copy, fill, random fills, cast, reshape, amax.
/// Each takes an optional execution space first; without one, the memory space's default
/// execution space runs it. Element i of a random fill depends only on (seed, i).

#include <tessera/config/kokkos_compat.hpp> // is_host_exec_v: Exec runs on the host
#include <tessera/precision/vector_convert.hpp>
#include <tessera/tensor/overlap.hpp>
#include <tessera/tensor/random.hpp>
#include <tessera/tensor/tensor.hpp>

#include <string>
#include <type_traits>

namespace tessera {

namespace detail {
template <class T>
using default_exec_t = typename T::memory_space::execution_space;

template <class A, class B>
void require_same_shape(const char* op, const A& a, const char* an, const B& b, const char* bn) {
  bool same = A::rank == B::rank;
  if (same)
    for (std::size_t i = 0; i < A::rank; ++i) same = same && a.extent(i) == b.extent(i);
  if (!same)
    throw shape_error(std::string(op) + ": " + an + " has shape " + shape_string(a.extents()) +
                      " but " + bn + " has shape " + shape_string(b.extents()) +
                      "; they must be equal");
}
} // namespace detail

/// Copies elements between tensors of the same precision, shape and layout, across memory
/// spaces. Throws shape_error naming both shapes otherwise, or when dst and src share memory
/// without being the same elements (a copy of a tensor onto itself is allowed: it changes
/// nothing).
template <class P, class E1, class E2, class L, class M1, class M2>
void deep_copy(const Tensor<P, E1, L, M1>& dst, const Tensor<P, E2, L, M2>& src) {
  static_assert(E1::rank == E2::rank, "tessera::deep_copy: dst and src must have the same rank.");
  detail::require_same_shape("tessera::deep_copy", dst, "dst", src, "src");
  // Addresses are compared only within one memory space (another space's pointers may coincide
  // numerically without sharing memory).
  if constexpr (std::is_same_v<M1, M2>)
    if (static_cast<const void*>(dst.data()) != static_cast<const void*>(src.data()))
      detail::require_no_overlap("tessera::deep_copy", "dst", dst.view(), "src", src.view());
  Kokkos::deep_copy(dst.kokkos_view(), src.kokkos_view());
}

/// deep_copy between precisions does not exist: it would have to round. This overload only
/// turns "no matching function" into a sentence.
template <class P1, class E1, class L1, class M1, class P2, class E2, class L2, class M2>
requires(!std::is_same_v<P1, P2>) void deep_copy(const Tensor<P1, E1, L1, M1>&,
                                                 const Tensor<P2, E2, L2, M2>&) {
  static_assert(std::is_same_v<P1, P2>,
                "tessera::deep_copy: dst and src must have the same precision (deep_copy copies "
                "elements bit for bit); to change precision use tessera::convert_into(exec, dst, "
                "src) or tessera::cast<To>(src), which round to nearest.");
}

/// A host copy of any tensor (for inspection and tests).
template <class P, class E, class L, class M>
Tensor<P, E, L, Kokkos::HostSpace> to_host(const Tensor<P, E, L, M>& t) {
  auto h = Tensor<P, E, L, Kokkos::HostSpace>::uninitialized(t.label() + "_host", t.extents());
  Kokkos::deep_copy(h.kokkos_view(), t.kokkos_view());
  return h;
}

/// Sets every element to value (rounded to the tensor's precision).
template <class Exec, class P, class E, class L, class M>
void fill(const Exec& exec, const Tensor<P, E, L, M>& t, float value) {
  const auto v = from_float<P>(value);
  Kokkos::deep_copy(exec, t.kokkos_view(), v);
  exec.fence();
}
template <class P, class E, class L, class M>
void fill(const Tensor<P, E, L, M>& t, float value) {
  fill(detail::default_exec_t<Tensor<P, E, L, M>>{}, t, value);
}

/// Uniform on [lo, hi): lo + (hi - lo) * u with u uniform on the 2^24 multiples of 2^-24 in
/// [0, 1), then rounded to the tensor's precision. The float arithmetic and the rounding may
/// produce hi itself, so results lie in [lo, hi].
template <class Exec, class P, class E, class L, class M>
void fill_uniform(const Exec& exec, const Tensor<P, E, L, M>& t, std::uint64_t seed, float lo,
                  float hi) {
  auto* d = t.data();
  const counter_rng rng{seed, 0};
  Kokkos::parallel_for(
      "tessera::fill_uniform", Kokkos::RangePolicy<Exec>(exec, 0, t.size()),
      KOKKOS_LAMBDA(const index_t i) {
        d[i] = from_float<P>(lo + (hi - lo) * rng.uniform01(static_cast<std::uint64_t>(i)));
      });
  exec.fence();
}
template <class P, class E, class L, class M>
void fill_uniform(const Tensor<P, E, L, M>& t, std::uint64_t seed, float lo = 0.f, float hi = 1.f) {
  fill_uniform(detail::default_exec_t<Tensor<P, E, L, M>>{}, t, seed, lo, hi);
}

/// Normal with the given mean and standard deviation, rounded to the tensor's precision.
template <class Exec, class P, class E, class L, class M>
void fill_normal(const Exec& exec, const Tensor<P, E, L, M>& t, std::uint64_t seed, float mean,
                 float stddev) {
  auto* d = t.data();
  const counter_rng rng{seed, 1};
  Kokkos::parallel_for(
      "tessera::fill_normal", Kokkos::RangePolicy<Exec>(exec, 0, t.size()),
      KOKKOS_LAMBDA(const index_t i) {
        d[i] = from_float<P>(mean + stddev * rng.normal(static_cast<std::uint64_t>(i)));
      });
  exec.fence();
}
template <class P, class E, class L, class M>
void fill_normal(const Tensor<P, E, L, M>& t, std::uint64_t seed, float mean = 0.f,
                 float stddev = 1.f) {
  fill_normal(detail::default_exec_t<Tensor<P, E, L, M>>{}, t, seed, mean, stddev);
}

namespace detail {
/// dst[i] = convert<To, Policy>(src[i]) for n elements on a host space: the vectorised
/// conversion (convert_n) in parallel chunks. Not fenced.
template <Precision To, class Policy, class Exec, class From>
void convert_host_chunks(const Exec& exec, const From* src, storage_t<To>* dst, index_t n) {
  // 16 Ki elements per chunk: large enough to amortise scheduling, small enough to balance.
  constexpr index_t chunk = 16384;
  Kokkos::parallel_for("tessera::cast", Kokkos::RangePolicy<Exec>(exec, 0, (n + chunk - 1) / chunk),
                       [=](const index_t c) {
                         const index_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
                         convert_n<To, Policy>(src + b, dst + b, static_cast<std::size_t>(e - b));
                       });
}

/// max over src[0, n) of |to_float(x)|'s bit pattern and, if Quantize, dst[i] =
/// from_float<To, saturate>(to_float(src[i]) * scale), on a host space: the vectorised kernel
/// (detail::amax_quantize_n) in parallel chunks. Not fenced (the reduction's result is final).
template <class To, bool Quantize, class Exec, class From>
std::uint32_t amax_quantize_host_chunks(const Exec& exec, const From* src, storage_t<To>* dst,
                                        index_t n, float scale) {
  constexpr index_t chunk = 16384;
  std::uint32_t result = 0;
  Kokkos::parallel_reduce(
      Quantize ? "tessera::quantize_with_scale" : "tessera::amax",
      Kokkos::RangePolicy<Exec>(exec, 0, (n + chunk - 1) / chunk),
      [=](const index_t c, std::uint32_t& m) {
        const index_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
        const std::uint32_t a = amax_quantize_n<To, Quantize>(
            src + b, Quantize ? dst + b : nullptr, static_cast<std::size_t>(e - b), scale);
        m = a > m ? a : m;
      },
      Kokkos::Max<std::uint32_t>(result));
  return result;
}
} // namespace detail

/// Converts src into dst (same shape and layout, any precisions), rounding to nearest even with
/// the given overflow policy. dst must not share memory with src (shape_error, nothing written). On
/// host spaces it runs the vectorised conversion in parallel chunks; elsewhere a scalar kernel.
/// Both give identical bits.
// Policy is a plain `class` (void = the destination's default policy): a constrained parameter
// defaulting to void could never be left out, since void is not an OverflowPolicy.
template <class Policy = void, class Exec, class P1, class E1, class L, class M1, class P2,
          class E2, class M2>
void convert_into(const Exec& exec, const Tensor<P1, E1, L, M1>& dst,
                  const Tensor<P2, E2, L, M2>& src) {
  static_assert(std::is_void_v<Policy> || OverflowPolicy<Policy>,
                "tessera::convert_into: the overflow policy must be tessera::saturate or "
                "tessera::overflow_to_inf_nan.");
  using policy = std::conditional_t<std::is_void_v<Policy>, default_overflow_t<P1>, Policy>;
  detail::require_same_shape("tessera::convert_into", dst, "dst", src, "src");
  if constexpr (std::is_same_v<M1, M2>)
    detail::require_no_overlap("tessera::convert_into", "dst", dst.view(), "src", src.view());
  auto* out = dst.data();
  const auto* in = src.data();
  const index_t n = src.size();
  if constexpr (detail::is_host_exec_v<Exec> && !TESSERA_DEVICE_PASS) {
    detail::convert_host_chunks<P1, policy>(exec, in, out, n);
  } else {
    Kokkos::parallel_for(
        "tessera::cast", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(const index_t i) { out[i] = convert<P1, policy>(in[i]); });
  }
  exec.fence();
}

/// A new tensor in precision To holding src's values, rounded to nearest even.
///   auto wb = tessera::cast<tessera::bf16>(w);
template <Precision To, OverflowPolicy Policy = default_overflow_t<To>, class Exec, class P,
          class E, class L, class M>
Tensor<To, E, L, M> cast(const Exec& exec, const Tensor<P, E, L, M>& src) {
  auto dst = Tensor<To, E, L, M>::uninitialized(src.label() + "_" + precision_traits<To>::name,
                                                src.extents());
  convert_into<Policy>(exec, dst, src);
  return dst;
}
template <Precision To, OverflowPolicy Policy = default_overflow_t<To>, class P, class E, class L,
          class M>
Tensor<To, E, L, M> cast(const Tensor<P, E, L, M>& src) {
  return cast<To, Policy>(detail::default_exec_t<Tensor<P, E, L, M>>{}, src);
}

/// The same elements seen with another shape of the same size (shares memory). Sizes known at
/// compile time are checked at compile time; the rest throw shape_error.
///   auto flat = tessera::reshape<tessera::extents<tessera::dyn, 784>>(x, x.extent(0));
template <class NewExt, class P, class E, class L, class M, class... I>
Tensor<P, NewExt, L, M> reshape(const Tensor<P, E, L, M>& t, I... dynamic_extents) {
  static_assert(is_extents<NewExt>::value,
                "tessera::reshape: the target shape must be tessera::extents<...>.");
  static_assert(!(NewExt::all_static && E::all_static) || NewExt::static_size() == E::static_size(),
                "tessera::reshape: the new shape must have as many elements as the old one.");
  static_assert(sizeof...(I) == NewExt::rank_dynamic,
                "tessera::reshape: give one size per dyn extent of the new shape.");
  NewExt ne;
  if constexpr (sizeof...(I) > 0) ne = NewExt(static_cast<index_t>(dynamic_extents)...);
  if (ne.size() != t.size())
    throw shape_error("tessera::reshape: tensor '" + t.label() + "' of shape " +
                      shape_string(t.extents()) + " has " + std::to_string(t.size()) +
                      " elements; shape " + shape_string(ne) + " has " + std::to_string(ne.size()));
  return Tensor<P, NewExt, L, M>(t.kokkos_view(), ne);
}

/// max |x| over the tensor, widened to float; NaN if any element is NaN (then the bit pattern
/// of some NaN). Reduces the magnitudes' bit patterns as unsigned integers: for non-negative
/// floats their order is the numeric order, and NaN patterns lie above +inf, so a NaN cannot be
/// lost in the reduction's joins the way it is with a floating-point max.
template <class Exec, class P, class E, class L, class M>
float amax(const Exec& exec, const Tensor<P, E, L, M>& t) {
  const auto* d = t.data();
  std::uint32_t result = 0;
  if constexpr (detail::is_host_exec_v<Exec> && !TESSERA_DEVICE_PASS) {
    // The precision argument only names a codec; nothing is written.
    return detail::bit_cast<float>(
        detail::amax_quantize_host_chunks<fp8_e4m3, false>(exec, d, nullptr, t.size(), 1.f));
  }
  Kokkos::parallel_reduce(
      "tessera::amax", Kokkos::RangePolicy<Exec>(exec, 0, t.size()),
      KOKKOS_LAMBDA(const index_t i, std::uint32_t& m) {
        const std::uint32_t a = detail::bit_cast<std::uint32_t>(to_float(d[i])) & 0x7fffffffu;
        m = a > m ? a : m;
      },
      Kokkos::Max<std::uint32_t>(result));
  return detail::bit_cast<float>(result);
}
template <class P, class E, class L, class M>
float amax(const Tensor<P, E, L, M>& t) {
  return amax(detail::default_exec_t<Tensor<P, E, L, M>>{}, t);
}

} // namespace tessera
