#pragma once
/// \file gemm/epilogue.hpp
/// Epilogues fused into the GEMM store, composed at compile time from the ops in tessera::epi.
///
/// The value written to C(i, j) is, in this order:
///   v = alpha * sum_p A(i, p) B(p, j) + beta * C_old(i, j)
///   v = op_1(v, i, j); v = op_2(v, i, j); ...            (the ops, in the listed order)
///   C(i, j) = cast(v)     (for a scaled output: cast(v * scale), saturating; amax over |v|)
///
///   namespace epi = tessera::epi;
///   tessera::epilogue<epi::bias_col<bf16>, epi::relu> e{.alpha = 1.f, .beta = 0.f,
///                                                       .ops = {epi::bias_col{bias}, {}}};
///   tessera::gemm(exec, x, transpose(w.view()), y, e);        // y = relu(x w^T + bias)
///   // or, deducing the op list:
///   tessera::gemm(exec, x, w_t, y, tessera::make_epilogue({.alpha = 1.f}, epi::bias_col{bias},
///                                                         epi::gelu_tanh{}));
///
/// Ops holding data (bias_row<P>, bias_col<P>, residual<P>) keep a pointer and strides of what
/// they were built from (any tessera precision, any strides); P, its precision, is deduced by
/// epi::bias_col{b} and is part of the type, so loads widen without a run-time switch. The
/// memory must be reachable from the execution space the GEMM runs on and outlive the call. Their
/// lengths are checked against C's shape when gemm is called (tessera::shape_error), and so is
/// their memory: it must not overlap C (the GEMM may store partial sums in C before it reads them).

#include <tessera/gemm/options.hpp>
#include <tessera/tensor.hpp>

#include <string>
#include <type_traits>

namespace tessera {

namespace epi {

namespace detail {

template <class T>
auto as_view_of(const T& t) {
  if constexpr (is_tensor<T>::value) {
    return t.view();
  } else {
    static_assert(is_tensor_view<T>::value,
                  "tessera::epi: a bias or residual must be a tessera::Tensor or TensorView.");
    return t;
  }
}

/// The precision of a tensor or view T.
template <class T>
using precision_of_arg = typename decltype(as_view_of(std::declval<const T&>()))::precision;

/// A rank-1 array of precision P and any stride. P is part of the type: loads convert at
/// compile time, no switch per element.
template <class P>
struct vector_arg {
  const storage_t<P>* data = nullptr;
  index_t length = -1; ///< -1: not set
  index_t stride = 1;

  vector_arg() = default;
  template <class T>
  explicit vector_arg(const T& t) {
    const auto v = as_view_of(t);
    using V = decltype(v);
    static_assert(V::rank == 1, "tessera::epi: a bias must be a rank-1 tensor (a vector).");
    data = v.data();
    length = v.extent(0);
    stride = v.stride(0);
  }
  TESSERA_INLINE float operator[](index_t i) const noexcept { return to_float(data[i * stride]); }
  /// The memory it reads (for the overlap check against C).
  ::tessera::detail::mem_region region() const {
    return ::tessera::detail::region_of(data, sizeof(storage_t<P>), {length < 0 ? 0 : length},
                                        {stride});
  }
};

/// A rank-2 array of precision P and any strides.
template <class P>
struct matrix_arg {
  const storage_t<P>* data = nullptr;
  index_t rows = -1, cols = -1; ///< -1: not set
  index_t s0 = 0, s1 = 0;

  matrix_arg() = default;
  template <class T>
  explicit matrix_arg(const T& t) {
    const auto v = as_view_of(t);
    using V = decltype(v);
    static_assert(V::rank == 2, "tessera::epi::residual: the residual must be a rank-2 tensor.");
    data = v.data();
    rows = v.extent(0);
    cols = v.extent(1);
    s0 = v.stride(0);
    s1 = v.stride(1);
  }
  TESSERA_INLINE float operator()(index_t i, index_t j) const noexcept {
    return to_float(data[i * s0 + j * s1]);
  }
  /// The memory it reads (for the overlap check against C).
  ::tessera::detail::mem_region region() const {
    return ::tessera::detail::region_of(data, sizeof(storage_t<P>),
                                        {rows < 0 ? 0 : rows, cols < 0 ? 0 : cols}, {s0, s1});
  }
};

inline std::string len_string(index_t n) {
  return std::to_string(n);
}

} // namespace detail

/// Adds bias[i] to row i of C (a vector of length M: e.g. per output channel of a conv GEMM).
template <class P = fp32>
struct bias_row {
  detail::vector_arg<P> bias;
  bias_row() = default;
  template <class T>
  explicit bias_row(const T& t) : bias(t) {}
  TESSERA_INLINE float operator()(float v, index_t i, index_t) const noexcept {
    return v + bias[i];
  }
  void check(const char* who, index_t m, index_t) const {
    if (bias.length != m)
      throw shape_error(std::string(who) + ": epi::bias_row has length " +
                        detail::len_string(bias.length) + ", C has " + detail::len_string(m) +
                        " rows (needs one bias per row of C)");
  }
  template <class F>
  void for_each_operand(F&& f) const {
    f("bias_row", bias.region());
  }
};

/// Adds bias[j] to column j of C (a vector of length N: e.g. per output feature of y = x W^T).
template <class P = fp32>
struct bias_col {
  detail::vector_arg<P> bias;
  bias_col() = default;
  template <class T>
  explicit bias_col(const T& t) : bias(t) {}
  TESSERA_INLINE float operator()(float v, index_t, index_t j) const noexcept {
    return v + bias[j];
  }
  void check(const char* who, index_t, index_t n) const {
    if (bias.length != n)
      throw shape_error(std::string(who) + ": epi::bias_col has length " +
                        detail::len_string(bias.length) + ", C has " + detail::len_string(n) +
                        " columns (needs one bias per column of C)");
  }
  template <class F>
  void for_each_operand(F&& f) const {
    f("bias_col", bias.region());
  }
};

/// max(v, 0). NaN stays NaN.
struct relu {
  TESSERA_INLINE float operator()(float v, index_t, index_t) const noexcept {
    return v < 0.f ? 0.f : v;
  }
  void check(const char*, index_t, index_t) const {}
};

/// GELU, tanh approximation: 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))).
struct gelu_tanh {
  TESSERA_INLINE float operator()(float v, index_t, index_t) const noexcept {
    constexpr float k0 = 0.7978845608028654f; // sqrt(2 / pi)
    constexpr float k1 = 0.044715f;           // the cubic coefficient of Hendrycks & Gimpel
#if KOKKOS_VERSION >= 40000
    return 0.5f * v * (1.f + Kokkos::tanh(k0 * (v + k1 * v * v * v)));
#else
    return 0.5f * v * (1.f + Kokkos::Experimental::tanh(k0 * (v + k1 * v * v * v)));
#endif
  }
  void check(const char*, index_t, index_t) const {}
};

/// GELU, exact form: 0.5 v (1 + erf(v / sqrt(2))).
struct gelu_erf {
  TESSERA_INLINE float operator()(float v, index_t, index_t) const noexcept {
    constexpr float r = 0.7071067811865476f; // 1 / sqrt(2)
#if KOKKOS_VERSION >= 40000
    return 0.5f * v * (1.f + Kokkos::erf(v * r));
#else
    return 0.5f * v * (1.f + Kokkos::Experimental::erf(v * r));
#endif
  }
  void check(const char*, index_t, index_t) const {}
};

/// Adds R(i, j) of an (M, N) tensor (a skip connection). R must not share memory with C
/// (shape_error): C may hold partial sums before R is read. For C += R, pass beta = 1 instead.
template <class P = fp32>
struct residual {
  detail::matrix_arg<P> r;
  residual() = default;
  template <class T>
  explicit residual(const T& t) : r(t) {}
  TESSERA_INLINE float operator()(float v, index_t i, index_t j) const noexcept {
    return v + r(i, j);
  }
  void check(const char* who, index_t m, index_t n) const {
    if (r.rows != m || r.cols != n)
      throw shape_error(std::string(who) + ": epi::residual has shape (" +
                        detail::len_string(r.rows) + ", " + detail::len_string(r.cols) +
                        "), C has (" + detail::len_string(m) + ", " + detail::len_string(n) +
                        ") (needs the same shape as C)");
  }
  template <class F>
  void for_each_operand(F&& f) const {
    f("residual", r.region());
  }
};

// A bias or residual op takes the precision of the tensor it is built from: epi::bias_col{b}.
template <class T>
bias_row(const T&) -> bias_row<detail::precision_of_arg<T>>;
template <class T>
bias_col(const T&) -> bias_col<detail::precision_of_arg<T>>;
template <class T>
residual(const T&) -> residual<detail::precision_of_arg<T>>;

/// Multiplies by a constant (e.g. 1 / sqrt(d) after a residual, or a loss scale).
struct scale {
  float factor = 1.f;
  TESSERA_INLINE float operator()(float v, index_t, index_t) const noexcept { return v * factor; }
  void check(const char*, index_t, index_t) const {}
};

} // namespace epi

namespace detail {

/// The ops of an epilogue, applied in order (a device-callable replacement for std::tuple).
template <class... Ops>
struct op_pack;
template <>
struct op_pack<> {
  TESSERA_INLINE float operator()(float v, index_t, index_t) const noexcept { return v; }
  void check(const char*, index_t, index_t) const {}
  template <class F>
  void for_each_operand(F&&) const {}
};
template <class O, class... R>
struct op_pack<O, R...> {
  O head{};
  op_pack<R...> tail{};
  op_pack() = default;
  op_pack(const O& h, const R&... r) : head(h), tail(r...) {} // NOLINT: {a, b} initialisation
  TESSERA_INLINE float operator()(float v, index_t i, index_t j) const noexcept {
    return tail(head(v, i, j), i, j);
  }
  void check(const char* who, index_t m, index_t n) const {
    head.check(who, m, n);
    tail.check(who, m, n);
  }
  /// f(name, mem_region) for every memory operand the ops read (ops without one have no
  /// for_each_operand member).
  template <class F>
  void for_each_operand(F&& f) const {
    if constexpr (requires { head.for_each_operand(f); }) head.for_each_operand(f);
    tail.for_each_operand(f);
  }
};

} // namespace detail

/// alpha, beta and a compile-time list of epilogue ops (see the file comment).
template <class... Ops>
struct epilogue {
  float alpha = 1.f;
  float beta = 0.f;
  detail::op_pack<Ops...> ops{};
  static constexpr bool empty = sizeof...(Ops) == 0;
};

/// Builds an epilogue, deducing the op list: make_epilogue({.alpha = 2}, epi::relu{}).
template <class... Ops>
epilogue<Ops...> make_epilogue(gemm_options o, const Ops&... ops) {
  return {o.alpha, o.beta, detail::op_pack<Ops...>(ops...)};
}

template <class T>
struct is_epilogue : std::false_type {};
template <class... Ops>
struct is_epilogue<epilogue<Ops...>> : std::true_type {};

namespace detail {
template <class Opts>
auto as_epilogue(const Opts& o) {
  if constexpr (std::is_same_v<Opts, gemm_options>) {
    return epilogue<>{o.alpha, o.beta, {}};
  } else {
    static_assert(is_epilogue<Opts>::value,
                  "tessera::gemm: the options must be tessera::gemm_options{.alpha, .beta} or a "
                  "tessera::epilogue<ops...>.");
    return o;
  }
}
} // namespace detail

} // namespace tessera
