#pragma once
/// \file nn/residual.hpp
/// nn::Residual<Layers...>: y = x + f(x), f the layers applied in order (an nn::Sequential of
/// them), itself an nn::Layer, so a transformer block is two of them inside a Sequential:
///
///   using Block = tessera::nn::Sequential<
///       tessera::nn::Residual<tessera::nn::LayerNorm<128>,
///                             tessera::nn::CausalSelfAttention<128, 4>>,
///       tessera::nn::Residual<tessera::nn::LayerNorm<128>, tessera::nn::Linear<128, 512>,
///                             tessera::nn::GELU, tessera::nn::Linear<512, 128>>>;
///
/// f must give back its input's shape: checked at compile time for every input shape the
/// residual is asked to accept (a static_assert sentence naming residual_shape_check), which is
/// when nn::Sequential checks its links. The sum is taken in fp32 and rounded once to x's
/// precision; backward returns dx = dy + df/dx^T dy in dy's precision.
///
/// The inner layers stay reachable (`inner()`, the nn::Sequential; `layer<I>()`, its layer I),
/// e.g. for the attention's decode during generation. Parameters are named
/// "<inner index>.<name>" ("1.weight"), so inside a Sequential "3.1.weight".
///
/// Layer declarations (nn/layer.hpp): forward_flops, the inner layers' sum plus one add per
/// element, declared only when every inner layer declares its own; tensor_split replicate.

#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/layer.hpp>
#include <tessera/nn/sequential.hpp>

#include <cstdint>
#include <type_traits>

namespace tessera::nn {

namespace detail {

/// True when extents A and B have the same rank and no static extent that differs.
template <class A, class B>
constexpr bool same_shape_rule() {
  if constexpr (A::rank != B::rank) {
    return false;
  } else {
    for (std::size_t i = 0; i < A::rank; ++i)
      if (A::static_extent(i) != dyn && B::static_extent(i) != dyn &&
          A::static_extent(i) != B::static_extent(i))
        return false;
    return true;
  }
}

template <class Out, class In, bool Ok>
inline constexpr bool residual_shape_check = Ok;

/// Whether the chain of layers accepts InExt (without instantiating the chain past the first
/// layer that refuses, so a refused shape gives false, not a hard error) and, if so, f's shape.
template <class InExt, class... Ls>
struct residual_chain {
  static constexpr bool ok = true;
  using type = InExt;
};
template <class InExt, class L, class... Rest>
struct residual_chain<InExt, L, Rest...> {
  static constexpr bool first_ok = [] {
    if constexpr (LayerShapeRule<L, InExt>)
      return bool(L::template accepts<InExt>);
    else
      return false;
  }();
  template <bool Ok, class E>
  struct next {
    static constexpr bool ok = false;
    using type = void;
  };
  template <class E>
  struct next<true, E> {
    using rest = residual_chain<typename L::template output_extents<E>, Rest...>;
    static constexpr bool ok = rest::ok;
    using type = typename rest::type;
  };
  static constexpr bool ok = next<first_ok, InExt>::ok;
  using type = typename next<first_ok, InExt>::type;
};

/// The sum of the declared forward FLOPs along the chain (only when all declare them).
template <class InExt, class... Ls>
struct residual_flops {
  static constexpr bool declared = true;
  static constexpr double value = 0;
};
template <class InExt, class L, class... Rest>
struct residual_flops<InExt, L, Rest...> {
  using rest = residual_flops<typename L::template output_extents<InExt>, Rest...>;
  static constexpr bool declared =
      layer_traits<L>::template declares_flops<InExt> && rest::declared;
  static constexpr double value = [] {
    if constexpr (declared)
      return layer_traits<L>::template forward_flops<InExt> + rest::value;
    else
      return 0.0;
  }();
};

/// out = a + b element by element (a, b of out's size, any precisions): each sum in fp32,
/// rounded once to out's precision. Fences.
template <class Exec, class A, class B, class O>
void add_rounded(const Exec& exec, const char* label, const A& a, const B& b, const O& out) {
  using P = typename O::precision;
  zip_rounded<P>(
      exec, label, out.size(), a.data(), b.data(), out.data(),
      KOKKOS_LAMBDA(const float x, const float y) { return x + y; });
  exec.fence();
}

} // namespace detail

template <class... Layers>
class Residual {
  static_assert(sizeof...(Layers) >= 1, "tessera::nn::Residual: give at least one layer.");
  using M = detail::default_memory_space;
  using inner_type = Sequential<Layers...>;

  template <class InExt>
  static constexpr bool check() {
    using chain = detail::residual_chain<InExt, Layers...>;
    if constexpr (!chain::ok) {
      return false;
    } else {
      constexpr bool same = detail::same_shape_rule<typename chain::type, InExt>();
      static_assert(detail::residual_shape_check<typename chain::type, InExt, same>,
                    "tessera::nn::Residual: the inner layers must give back their input's shape "
                    "(x + f(x) needs f(x) of x's shape): residual_shape_check<f's output shape, "
                    "input shape, false> names both.");
      return same;
    }
  }

public:
  /// Accepted: every shape the inner chain accepts and maps to itself (a chain that accepts
  /// a shape but changes it is a compile error, not a silent false).
  template <class InExt>
  static constexpr bool accepts = check<InExt>();
  template <class InExt>
  using output_extents = InExt;
  /// nn/layer.hpp: the inner layers' FLOPs plus one add per element, when all declare theirs.
  template <class InExt>
  requires(
      detail::residual_flops<InExt, Layers...>::declared) static constexpr double forward_flops =
      detail::residual_flops<InExt, Layers...>::value + elements_per_sample<InExt>;
  static constexpr split_kind tensor_split = split_kind::replicate;

  /// The inner layers are built as nn::Sequential<Layers...>(seed).
  explicit Residual(std::uint64_t seed = 0) : inner_(seed), y_("residual.y"), dx_("residual.dx") {}

  inner_type& inner() noexcept { return inner_; }
  const inner_type& inner() const noexcept { return inner_; }
  template <std::size_t I>
  auto& layer() noexcept {
    return inner_.template layer<I>();
  }
  auto parameters() const { return inner_.parameters(); }
  auto fp8_states() { return inner_.fp8_states(); }

  /// y = x + f(x), in x's precision.
  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    static_assert(accepts<E>, "tessera::nn::Residual::forward: the inner layers do not accept x.");
    const auto f = inner_.forward(exec, x);
    if (f.size() != x.size())
      throw shape_error("tessera::nn::Residual::forward: f(x) has shape " +
                        shape_string(f.extents()) + " but x has " + shape_string(x.extents()));
    auto y = y_.template get<P>(x.extents());
    detail::add_rounded(exec, "tessera::nn::Residual::forward", x, f, y);
    shape_.save(x.extents());
    return y;
  }

  /// dx = dy + (df/dx)^T dy in dy's precision (empty when !need_dx; the inner parameters'
  /// gradients are written either way).
  template <class Exec, class DP, class DE>
  Tensor<DP, DE, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    detail::require_saved_like("tessera::nn::Residual::backward", dy, shape_);
    const auto df = inner_.backward(exec, dy, need_dx);
    if (!need_dx) return {};
    auto dx = dx_.template get<DP>(dy.extents());
    detail::add_rounded(exec, "tessera::nn::Residual::backward", dy, df, dx);
    return dx;
  }

  /// nn/layer.hpp: the inner layers' kept activations and the output y.
  void count_activations(activation_ledger& l) const {
    inner_.count_activations(l);
    y_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() {
    inner_.release_activations();
    y_.release();
    shape_ = {};
  }

private:
  inner_type inner_;
  detail::any_buffer y_, dx_;
  detail::saved_shape shape_;
};

} // namespace tessera::nn
