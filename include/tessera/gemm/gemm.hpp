#pragma once
/// \file gemm/gemm.hpp
/// tessera::gemm: C = alpha * A * B + beta * C with fp32 accumulation.
///
/// A is (M, K), B is (K, N), C is (M, N): rank-2 tensors or views of any precision and any
/// strides (pass transpose(x.view()) for op(x) = x^T). beta == 0 ignores C's old contents
/// (NaN in C does not leak), as BLAS does.
///
///   tessera::gemm(exec, a, b, c);                           // C = A B
///   tessera::gemm(exec, a, transpose(b.view()), c, {.alpha = 2.f, .beta = 1.f});
///
/// NOTE: this first version is the portable reference path (one dot product per C element); the
/// blocked host and team-tiled algorithms replace its body behind the same signature.

#include <tessera/tensor.hpp>

#include <string>

namespace tessera {

/// Run-time scalars of a GEMM call.
struct gemm_options {
  float alpha = 1.f;
  float beta = 0.f;
};

namespace detail {

template <class T>
auto as_view(const T& t) {
  if constexpr (is_tensor<T>::value) {
    return t.view();
  } else {
    static_assert(is_tensor_view<T>::value,
                  "tessera::gemm: operands must be tessera::Tensor or tessera::TensorView.");
    return t;
  }
}

} // namespace detail

template <class Exec, class TA, class TB, class TC>
void gemm(const Exec& exec, const TA& a_in, const TB& b_in, const TC& c_in,
          gemm_options opts = {}) {
  const auto a = detail::as_view(a_in);
  const auto b = detail::as_view(b_in);
  const auto c = detail::as_view(c_in);
  using va = decltype(a);
  using vb = decltype(b);
  using vc = decltype(c);
  static_assert(va::rank == 2 && vb::rank == 2 && vc::rank == 2,
                "tessera::gemm: A, B and C must be rank-2 (matrices).");
  const index_t m = a.extent(0), k = a.extent(1), n = b.extent(1);
  if (b.extent(0) != k || c.extent(0) != m || c.extent(1) != n)
    throw shape_error("tessera::gemm: A " + shape_string(a.extents()) + " times B " +
                      shape_string(b.extents()) + " into C " + shape_string(c.extents()) +
                      ": needs A (M, K), B (K, N), C (M, N)");
  using pc = typename vc::precision;
  const float alpha = opts.alpha, beta = opts.beta;
  Kokkos::parallel_for(
      "tessera::gemm[reference]",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {m, n}),
      KOKKOS_LAMBDA(const index_t i, const index_t j) {
        float acc = 0.f;
        for (index_t p = 0; p < k; ++p) acc += to_float(a(i, p)) * to_float(b(p, j));
        const float old = beta == 0.f ? 0.f : beta * to_float(c(i, j));
        c(i, j) = from_float<pc>(alpha * acc + old);
      });
  exec.fence();
}

} // namespace tessera
