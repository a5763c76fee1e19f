#pragma once
/// \file gemm/options.hpp
/// The run-time scalars of a GEMM call (gemm_options), the algorithm tags (gemm_algo::*) and
/// scaled operands: an fp8 (or any) view paired with its per-tensor scale.

#include <tessera/tensor.hpp>

#include <type_traits>

namespace tessera {

/// Run-time scalars of a GEMM call: C = alpha * op(A) op(B) + beta * C.
struct gemm_options {
  float alpha = 1.f;
  float beta = 0.f;
};

/// Algorithm tags: pass one as the first argument of gemm / gemm_batched to force an algorithm
/// (tests and benchmarks do; users normally let `automatic` choose).
namespace gemm_algo {
/// Host execution space: `direct` for small problems, else `host_packed`. Other spaces: `portable`.
struct automatic {};
/// BLIS-style cache-blocked, packed GEMM with an AVX-512 / xsimd register-tiled fp32 micro-kernel
/// or, for bf16/fp8 inputs on a CPU with AMX, an AMX tile micro-kernel. Host spaces only.
struct host_packed {};
/// Kokkos TeamPolicy; tiles of A and B staged in team scratch memory; any execution space.
struct portable {};
/// One dot product per output element, K innermost, no packing: the small-size path. Any space.
struct direct {};
/// The naive MDRange loop (the original implementation), kept as a baseline. Any space.
struct reference {};
} // namespace gemm_algo

template <class T>
inline constexpr bool is_gemm_algo_v =
    std::is_same_v<T, gemm_algo::automatic> || std::is_same_v<T, gemm_algo::host_packed> ||
    std::is_same_v<T, gemm_algo::portable> || std::is_same_v<T, gemm_algo::direct> ||
    std::is_same_v<T, gemm_algo::reference>;

/// A view with a per-tensor scale, in Transformer Engine's convention (payload = x * scale):
///  - as an input (A or B), gemm multiplies the product by 1 / scale;
///  - as the output C, gemm stores payload = round_saturate(value * scale) and returns the amax
///    of the values before that scaling (what the next scale is computed from), and reads the old
///    C (beta != 0) as payload / scale.
/// scaled_tensor (tensor/scaled_tensor.hpp) is accepted in the same places; `scaled(view, s)`
/// wraps a view (e.g. a strided sub-matrix of a scaled tensor's payload).
template <class View>
struct scaled_view {
  View view;
  float scale = 1.f;
};

/// Pairs a tensor or view with a scale (see scaled_view).
template <class T>
auto scaled(const T& t, float scale) {
  if constexpr (is_tensor<T>::value) {
    return scaled_view<typename T::view_type>{t.view(), scale};
  } else {
    static_assert(is_tensor_view<T>::value,
                  "tessera::scaled: the first argument must be a tessera::Tensor or TensorView.");
    return scaled_view<T>{t, scale};
  }
}

template <class T>
struct is_scaled_view : std::false_type {};
template <class V>
struct is_scaled_view<scaled_view<V>> : std::true_type {};

namespace detail {

/// A GEMM operand brought to one form: a view and the scale its payload carries (1 if none).
/// Whether it carries a scale is part of the type: a scaled output changes the store (saturating
/// cast, amax), which is chosen at compile time.
template <class V, bool Scaled = false>
struct gemm_operand {
  V view;
  float scale = 1.f;
  static constexpr bool scaled = Scaled;
};

template <class T>
auto to_gemm_operand(const T& t) {
  if constexpr (is_tensor<T>::value) {
    return gemm_operand<typename T::view_type>{t.view(), 1.f};
  } else if constexpr (is_tensor_view<T>::value) {
    return gemm_operand<T>{t, 1.f};
  } else if constexpr (is_scaled_tensor<T>::value) {
    return gemm_operand<decltype(t.data.view()), true>{t.data.view(), t.scale};
  } else if constexpr (is_scaled_view<T>::value) {
    return gemm_operand<decltype(t.view), true>{t.view, t.scale};
  } else {
    static_assert(is_tensor<T>::value,
                  "tessera::gemm: operands must be tessera::Tensor, TensorView, scaled_tensor or "
                  "scaled_view (tessera::scaled(view, scale)).");
    return 0;
  }
}

} // namespace detail
} // namespace tessera
