#pragma once
/// \file gemm/gemm.hpp
/// tessera::gemm: C = epilogue(alpha * op(A) op(B) + beta * C), fp32 accumulation; and
/// tessera::gemm_batched for strided batches.
///
/// Operands. A (M, K), B (K, N), C (M, N): rank-2 Tensors or TensorViews. A and B are each of any
/// tessera precision (independently: e4m3 x e5m2, fp16 x bf16 are fine), with any non-negative
/// strides: pass transpose(x.view()) for op(x) = x^T, a strided sub-view for a leading dimension
/// larger than the extent. A or B may be a scaled_tensor (fp8 payload + scale, see
/// tensor/scaled_tensor.hpp) or tessera::scaled(view, scale): the product is multiplied by
/// 1 / scale of each. C is of any precision; an fp8 C may be a scaled output (a scaled_tensor or
/// tessera::scaled(view, scale)): C = saturate(value * scale), and gemm returns the amax of the
/// values before that scaling (what the next scale is computed from, e.g. with
/// scale_for_amax<P>(amax)). For any other C gemm returns 0. A plain fp8 C (no scale) is
/// accepted as scale 1, rounding with overflow to inf/NaN like from_float (conv2d relies on it).
///
/// beta == 0 ignores C's old contents (NaN in C does not leak), as BLAS does. C must not overlap
/// A, B or an epilogue operand (bias, residual), exactly (views that only share an allocation,
/// such as two column halves of one matrix, are fine: tensor/overlap.hpp), and its strides
/// must give every element its own address (tessera::shape_error otherwise, naming the operands
/// and shapes; C is left untouched). Every scale of a scaled operand must be positive, finite
/// and normal (tessera::value_error otherwise, before anything is written).
///
///   tessera::gemm(exec, a, b, c);                                      // C = A B
///   tessera::gemm(exec, a, transpose(b.view()), c, {.alpha = 2.f, .beta = 1.f});
///   namespace epi = tessera::epi;
///   tessera::gemm(exec, x, transpose(w.view()), y,                     // y = relu(x w^T + b)
///                 tessera::epilogue<epi::bias_col<>, epi::relu>{.ops = {epi::bias_col{b}, {}}});
///   auto yq = tessera::scaled(y8.view(), scale);                       // fp8 output
///   float amax = tessera::gemm(exec, xq, wq_t, yq);                    // xq, wq: scaled_tensor
///   tessera::gemm(tessera::gemm_algo::portable{}, exec, a, b, c);      // force an algorithm
///
/// Options: gemm_options{.alpha, .beta} or an epilogue<ops...> (gemm/epilogue.hpp: bias_row,
/// bias_col, relu, gelu_tanh, gelu_erf, residual, scale, applied in order after
/// alpha * AB + beta * C, before the cast).
///
/// gemm_batched(exec, A, B, C, opts): rank-3 (batch, rows, cols) operands, C[b] = A[b] B[b]
/// with the same options; a batch stride of 0 on A or B shares that operand across the batch.
///
/// Algorithms (gemm_algo in gemm/options.hpp): on a host space `automatic` takes `direct` when
/// min(M, N) < 16 or M N K < 32^3 and `host_packed` otherwise; on other spaces `portable`.
/// Results are deterministic for a given algorithm and thread count (no atomics; each C element
/// is reduced over K in one fixed order).
///
/// Static extents are checked at compile time (a static A (4, 3) with a static B (5, 2) does not
/// compile: a static_assert names the rule), dynamic ones at run time (tessera::shape_error).
/// Then the operands become dynamic-extent strided views (detail::gemm_matrix), so a program's
/// GEMM code is instantiated once per precision combination and epilogue, whatever the static
/// shapes and layouts of its tensors.

#include <tessera/gemm/detail/host.hpp>
#include <tessera/gemm/detail/portable.hpp>
#include <tessera/gemm/detail/problem.hpp>
#include <tessera/gemm/detail/reference.hpp>
#include <tessera/gemm/epilogue.hpp>
#include <tessera/gemm/options.hpp>
#include <tessera/tensor.hpp>

#include <string>
#include <type_traits>

namespace tessera {

namespace detail {

/// automatic on a host takes gemm_direct when M or N is below direct_thin or M N K is below
/// direct_threshold^3, and host_packed otherwise. Measured (1 thread, thread CPU time, fp32 and
/// bf16): packing pays already from a few 10^4 multiply-adds when both M and N allow a micro-tile
/// (32 x 4096 x 9: 25 us packed, 48 direct; 64 x 128 x 10: 1.1 against 2.0; 1000 x 32 x 32: 11
/// against 84), while a C with fewer than 16 rows or columns wastes most of the packed
/// micro-tile (MR 14, NR 32) and the direct dot-product form wins (32 x 9 x 50000, the conv
/// weight gradient: 450 us direct, 1020 packed).
inline constexpr index_t direct_threshold = 32;
inline constexpr index_t direct_thin = 16;

template <class Algo, class Exec, class Prob>
float run_gemm(const Exec& exec, const Prob& pr) {
  if constexpr (std::is_same_v<Algo, gemm_algo::reference>) {
    return gemm_reference(exec, pr);
  } else if constexpr (std::is_same_v<Algo, gemm_algo::direct>) {
    return gemm_direct(exec, pr);
  } else if constexpr (std::is_same_v<Algo, gemm_algo::portable>) {
    return gemm_portable(exec, pr);
  } else if constexpr (std::is_same_v<Algo, gemm_algo::host_packed>) {
    static_assert(is_host_exec_v<Exec>,
                  "tessera::gemm: gemm_algo::host_packed runs on host execution spaces only; use "
                  "gemm_algo::portable (or automatic) on a device.");
    return gemm_host(exec, pr);
  } else {
    if constexpr (is_host_exec_v<Exec>) {
      const index_t d = direct_threshold;
      if (pr.m < direct_thin || pr.n < direct_thin ||
          static_cast<double>(pr.m) * pr.n * pr.k < static_cast<double>(d) * d * d)
        return gemm_direct(exec, pr);
      return gemm_host(exec, pr);
    } else {
      return gemm_portable(exec, pr);
    }
  }
}

/// True when two extents are both static and differ (a dynamic one is checked at run time).
constexpr bool static_extents_differ(index_t x, index_t y) {
  return x != dyn && y != dyn && x != y;
}

/// The shape rule A (M, K), B (K, N), C (M, N) on the static extents of three views whose
/// matrix dimensions start at dimension D (0 for gemm, 1 after gemm_batched's batch).
template <std::size_t D, class VA, class VB, class VC>
constexpr void check_static_shapes() {
  using EA = typename VA::extents_type;
  using EB = typename VB::extents_type;
  using EC = typename VC::extents_type;
  static_assert(!static_extents_differ(EA::static_extent(D + 1), EB::static_extent(D)),
                "tessera::gemm: the inner dimensions must agree: A is (M, K) and B is (K, N), "
                "but the static extents give A's columns and B's rows different K.");
  static_assert(!static_extents_differ(EA::static_extent(D), EC::static_extent(D)),
                "tessera::gemm: C must be (M, N) for A (M, K): the static extents give C a "
                "different number of rows than A.");
  static_assert(!static_extents_differ(EB::static_extent(D + 1), EC::static_extent(D + 1)),
                "tessera::gemm: C must be (M, N) for B (K, N): the static extents give C a "
                "different number of columns than B.");
}

template <class VA, class VB, class VC>
void check_gemm_types() {
  static_assert(VA::rank == 2 && VB::rank == 2 && VC::rank == 2,
                "tessera::gemm: A, B and C must be rank-2 (matrices).");
  if constexpr (VA::rank == 2 && VB::rank == 2 && VC::rank == 2)
    check_static_shapes<0, VA, VB, VC>();
}

/// The one view type every algorithm sees for a matrix of precision P in memory space M:
/// dynamic extents and run-time strides (every TensorView keeps its strides at run time, so
/// nothing a kernel could use is lost). gemm brings its operands to it after the compile-time
/// checks, so the checks, the algorithm choice, the host driver and the kernels are
/// instantiated once per precision combination (and epilogue), not once per static shape or
/// layout of the user's views.
template <class P, class M>
using gemm_matrix = TensorView<P, dextents<2>, layout_stride, M>;

/// A rank-2 view as a gemm_matrix: the same memory, extents and strides.
template <class V>
gemm_matrix<typename V::precision, typename V::memory_space> as_gemm_matrix(const V& v) {
  return {v.data(), dextents<2>(v.extent(0), v.extent(1)), {v.stride(0), v.stride(1)}};
}

/// An operand with its view made a gemm_matrix (its scale kept).
template <class O>
auto as_gemm_matrix_operand(const O& o) {
  auto m = as_gemm_matrix(o.view);
  return gemm_operand<decltype(m), O::scaled>{m, o.scale};
}

template <class Exec, class V>
void check_space() {
  static_assert(Kokkos::SpaceAccessibility<Exec, typename V::memory_space>::accessible,
                "tessera::gemm: every operand must live in a memory space the execution space "
                "can access.");
}

template <class OA, class OB, class OC, class Epi>
auto make_problem(const OA& oa, const OB& ob, const OC& oc, const Epi& e) {
  using VA = decltype(oa.view);
  using VB = decltype(ob.view);
  using VC = decltype(oc.view);
  constexpr bool scaled_out = OC::scaled;
  gemm_problem<VA, VB, VC, decltype(e.ops), scaled_out> pr{oa.view, ob.view, oc.view};
  pr.m = oa.view.extent(0);
  pr.k = oa.view.extent(1);
  pr.n = ob.view.extent(1);
  pr.alpha = e.alpha / oa.scale / ob.scale;
  pr.out_scale = oc.scale;
  pr.beta = e.beta / oc.scale;
  pr.ops = e.ops;
  return pr;
}

} // namespace detail

/// C = epilogue(alpha * A B + beta * C) with algorithm Algo (see the file comment). Returns the
/// amax of the output values before scaling for a scaled C, else 0.
template <class Algo, class Exec, class TA, class TB, class TC, class Opts = gemm_options>
requires is_gemm_algo_v<Algo>
float gemm(Algo, const Exec& exec, const TA& a_in, const TB& b_in, const TC& c_in,
           const Opts& opts = {}) {
  const auto ua = detail::to_gemm_operand(a_in);
  const auto ub = detail::to_gemm_operand(b_in);
  const auto uc = detail::to_gemm_operand(c_in);
  using VA = decltype(ua.view);
  using VB = decltype(ub.view);
  using VC = decltype(uc.view);
  detail::check_gemm_types<VA, VB, VC>();
  detail::check_space<Exec, VA>();
  detail::check_space<Exec, VB>();
  detail::check_space<Exec, VC>();
  // From here on the user's view types are gone (see gemm_matrix): static extents have been
  // checked above, dynamic ones are checked by check_gemm_args.
  const auto oa = detail::as_gemm_matrix_operand(ua);
  const auto ob = detail::as_gemm_matrix_operand(ub);
  const auto oc = detail::as_gemm_matrix_operand(uc);
  const auto e = detail::as_epilogue(opts);
  detail::check_gemm_args("tessera::gemm", oa.view, ob.view, oc.view, e.ops);
  detail::check_gemm_scales("tessera::gemm", oa, ob, oc);
  return detail::run_gemm<Algo>(exec, detail::make_problem(oa, ob, oc, e));
}

/// C = epilogue(alpha * A B + beta * C), algorithm chosen automatically.
template <class Exec, class TA, class TB, class TC, class Opts = gemm_options>
requires(!is_gemm_algo_v<Exec>) float gemm(const Exec& exec, const TA& a, const TB& b, const TC& c,
                                           const Opts& opts = {}) {
  return gemm(gemm_algo::automatic{}, exec, a, b, c, opts);
}

namespace detail {

/// Matrix `i` of a rank-3 view (batch, rows, cols): the same memory, strides (s1, s2).
template <class V>
auto batch_matrix(const V& v, index_t i) {
  return gemm_matrix<typename V::precision, typename V::memory_space>(
      v.data() + i * v.stride(0), dextents<2>(v.extent(1), v.extent(2)),
      {v.stride(1), v.stride(2)});
}

template <class O>
auto batch_operand(const O& o, index_t i) {
  auto m = batch_matrix(o.view, i);
  return gemm_operand<decltype(m), O::scaled>{m, o.scale};
}

} // namespace detail

/// Strided-batched GEMM: C[i] = epilogue(alpha * A[i] B[i] + beta * C[i]) for every i of the
/// leading dimension. A (batch, M, K), B (batch, K, N), C (batch, M, N), rank-3, any strides; A
/// or B may have batch stride 0 (one matrix shared by the batch) and then any batch extent equal
/// to C's or 1. Epilogue ops see (i, j) within each matrix (a bias is shared by the batch).
/// Returns the largest amax over the batch for a scaled C (else 0).
template <class Algo, class Exec, class TA, class TB, class TC, class Opts = gemm_options>
requires is_gemm_algo_v<Algo>
float gemm_batched(Algo, const Exec& exec, const TA& a_in, const TB& b_in, const TC& c_in,
                   const Opts& opts = {}) {
  const auto oa = detail::to_gemm_operand(a_in);
  const auto ob = detail::to_gemm_operand(b_in);
  const auto oc = detail::to_gemm_operand(c_in);
  using VA = decltype(oa.view);
  using VB = decltype(ob.view);
  using VC = decltype(oc.view);
  static_assert(VA::rank == 3 && VB::rank == 3 && VC::rank == 3,
                "tessera::gemm_batched: A, B and C must be rank-3 (batch, rows, cols).");
  if constexpr (VA::rank == 3 && VB::rank == 3 && VC::rank == 3)
    detail::check_static_shapes<1, VA, VB, VC>();
  const auto e = detail::as_epilogue(opts);
  const index_t nb = oc.view.extent(0);
  const auto batch_ok = [&](const auto& v) {
    return v.extent(0) == nb || (v.extent(0) == 1 && nb >= 1) || v.stride(0) == 0;
  };
  if (!batch_ok(oa.view) || !batch_ok(ob.view))
    throw shape_error("tessera::gemm_batched: " + detail::gemm_describe("A", oa.view) + ", " +
                      detail::gemm_describe("B", ob.view) + ", " +
                      detail::gemm_describe("C", oc.view) +
                      ": A and B need C's batch extent (or 1, or batch stride 0)");
  if (!detail::distinct_elements(detail::region_of(oc.view)))
    throw shape_error("tessera::gemm_batched: " + detail::gemm_describe("C", oc.view) +
                      ": two elements of C share memory (the matrices of C overlap, e.g. a batch "
                      "stride too small, or the strides of C are not nested)");
  // Whole-batch aliasing: C[i] must not overlap A[j] or B[j] for any i, j.
  if (detail::overlaps(oc.view, oa.view) || detail::overlaps(oc.view, ob.view))
    throw shape_error("tessera::gemm_batched: " + detail::gemm_describe("A", oa.view) + ", " +
                      detail::gemm_describe("B", ob.view) + ", " +
                      detail::gemm_describe("C", oc.view) +
                      ": C overlaps A or B in memory (aliasing)");
  detail::check_gemm_scales("tessera::gemm_batched", oa, ob, oc);
  float amax = 0.f;
  if (nb == 0) return amax;
  // Check every matrix before writing any (the output is unchanged on error).
  const auto pick = [](const auto& o, index_t i) {
    return detail::batch_operand(o, o.view.extent(0) == 1 ? 0 : i);
  };
  for (index_t i = 0; i < nb; ++i) {
    const auto a = pick(oa, i); // three declarations: a, b and c may have different types
    const auto b = pick(ob, i);
    const auto c = detail::batch_operand(oc, i);
    detail::check_gemm_args("tessera::gemm_batched", a.view, b.view, c.view, e.ops);
  }
  for (index_t i = 0; i < nb; ++i) {
    const auto pr = detail::make_problem(pick(oa, i), pick(ob, i), detail::batch_operand(oc, i), e);
    const float m = detail::run_gemm<Algo>(exec, pr);
    amax = m > amax ? m : amax;
  }
  return amax;
}

/// Strided-batched GEMM, algorithm chosen automatically.
template <class Exec, class TA, class TB, class TC, class Opts = gemm_options>
requires(!is_gemm_algo_v<Exec>) float gemm_batched(const Exec& exec, const TA& a, const TB& b,
                                                   const TC& c, const Opts& opts = {}) {
  return gemm_batched(gemm_algo::automatic{}, exec, a, b, c, opts);
}

} // namespace tessera
