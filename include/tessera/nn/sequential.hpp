#pragma once
/// \file nn/sequential.hpp
/// nn::Sequential<Layers...>: layers applied in order, a compile-time list (a boost::hana
/// tuple). Every layer must be an nn::Layer (nn/layer.hpp); a type that misses a requirement
/// fails with the sentence of that requirement, and the assertion's expression names the index
/// and the type (layer_requirement<index, type, false>). When the first layer fixes the input
/// shape (nn::Input<Dims...> or nn::Linear), the static shapes are checked layer to layer when
/// the model type is instantiated; otherwise at the first forward, from the input's type. A
/// mismatch fails with "layer_accepts_its_input<index, false>" (the index of the layer that
/// does not fit) and detail::sequential_link<I, Previous, Next, Shape> in the instantiation
/// names both layers and the shape.
///
///   using Model = tessera::nn::Sequential<tessera::nn::Input<784>,
///                                         tessera::nn::Linear<784, 128>, tessera::nn::ReLU,
///                                         tessera::nn::Linear<128, 10>>;
///   Model model(/*seed=*/42);                  // layer i initialised from (42, i)
///   auto logits = model.forward(exec, x);      // (B, 10), batch size dynamic
///   model.backward(exec, dlogits);             // every parameter's grad written (overwritten)
///   boost::hana::for_each(model.parameters(), [](auto& p) { /* "1.weight", "1.bias", ... */ });
///
/// Layers keep what their backward needs (inputs of Linear/Conv2d in compute precision, ReLU
/// masks, pooling positions) and nothing else; backward skips the input gradient of the first
/// layer with parameters (nothing before it needs it).

#include <tessera/nn/activation.hpp>
#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/layer.hpp>
#include <tessera/nn/pooling.hpp>

#include <boost/hana/at.hpp>
#include <boost/hana/flatten.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tessera::nn {

namespace detail {

/// `Ok` under a name that carries the layer's index and type: compilers print a failed
/// static_assert's expression with the template arguments, so the error names the index.
template <std::size_t LayerIndex, class LayerType, bool Ok>
inline constexpr bool layer_requirement = Ok;
template <std::size_t LayerIndex, bool Ok>
inline constexpr bool layer_accepts_its_input = Ok;

/// Checked for every layer type: the nn::Layer requirements, one sentence each.
template <std::size_t I, class L>
struct sequential_layer_check {
  static_assert(layer_requirement<I, L, SeededLayer<L>>,
                "tessera::nn::Sequential: this layer (index and type in "
                "layer_requirement<index, type, false>) is not an nn::Layer: it has no "
                "constructor from a std::uint64_t seed (nn::SeededLayer, nn/layer.hpp).");
  static_assert(layer_requirement<I, L, LayerWithParameters<L>>,
                "tessera::nn::Sequential: this layer (index and type in "
                "layer_requirement<index, type, false>) is not an nn::Layer: it has no "
                "`parameters() const` returning a boost::hana::tuple of nn::parameter "
                "(nn::LayerWithParameters, nn/layer.hpp; a layer without parameters returns "
                "boost::hana::make_tuple()).");
  static constexpr bool ok = Layer<L>;
};

/// Checked for each pair of consecutive layers: Next must declare its shape rule and accept
/// Shape, the output shape of Previous (layer I - 1; for I == 0, Previous is void and Shape the
/// model input's shape).
template <std::size_t I, class Previous, class Next, class Shape>
struct sequential_link {
  static constexpr bool has_rule = LayerShapeRule<Next, Shape>;
  static_assert(layer_requirement<I, Next, has_rule>,
                "tessera::nn::Sequential: this layer (index and type in "
                "layer_requirement<index, type, false>) is not an nn::Layer: it declares no "
                "shape rule (template <class InExt> static constexpr bool accepts, and "
                "template <class InExt> using output_extents; nn::LayerShapeRule, nn/layer.hpp).");
  static constexpr bool ok = [] {
    if constexpr (has_rule)
      return bool(Next::template accepts<Shape>);
    else
      return false;
  }();
  static constexpr bool fits = !has_rule || ok; // (no rule: reported above)
  static_assert(layer_accepts_its_input<I, fits>,
                "tessera::nn::Sequential: the layer at the index in "
                "layer_accepts_its_input<index, false> does not accept the output shape of the "
                "layer before it (sequential_link<index, layer before, layer, shape>, in the "
                "instantiation above, names both layers and the shape).");
};

template <bool Ok, class L, class Shape>
struct next_shape {
  using type = void; // stop after the first mismatch: one error, not a cascade
};
template <class L, class Shape>
struct next_shape<true, L, Shape> {
  using type = typename L::template output_extents<Shape>;
};

/// The shape after the layers, checking each link; void after a mismatch.
template <std::size_t I, class Previous, class Shape, class... Ls>
struct shape_chain {
  using type = Shape;
};
template <std::size_t I, class Previous, class Next, class... Rest>
struct shape_chain<I, Previous, void, Next, Rest...> {
  using type = void;
};
template <std::size_t I, class Previous, class Shape, class Next, class... Rest>
requires(!std::is_void_v<Shape>) struct shape_chain<I, Previous, Shape, Next, Rest...> {
  static constexpr bool ok = sequential_link<I, Previous, Next, Shape>::ok;
  using type =
      typename shape_chain<I + 1, Next, typename next_shape<ok, Next, Shape>::type, Rest...>::type;
};

template <class L>
concept FixesInput = requires {
  typename L::input_extents;
};

template <class L>
constexpr bool is_input_layer() {
  if constexpr (requires { L::is_input; }) {
    return L::is_input;
  } else {
    return false;
  }
}

template <class First, class... Rest>
struct first_of {
  using type = First;
};

/// True unless the first layer fixes the input shape and the chain from it breaks.
template <class... Ls>
struct static_shape_check {
  static constexpr bool value = true;
};
template <class First, class... Rest>
requires FixesInput<First>
struct static_shape_check<First, Rest...> {
  static constexpr bool value = !std::is_void_v<
      typename shape_chain<0, void, typename First::input_extents, First, Rest...>::type>;
};

} // namespace detail

/// The seed of a layer that stands for several consecutive layers of a flat model (an
/// nn::Recompute segment): the model's seed and the flat index of its first layer. A layer type
/// that declares `static constexpr std::size_t seed_span` (the number of flat layers it stands
/// for) and a constructor from flat_seed is built by Sequential (and a pipeline stage) from
/// flat_seed{model seed, its first flat index}; every other layer counts as one flat layer and
/// gets counter_rng{model seed, its flat index}.bits(0). So a model whose layers are grouped
/// into Recompute segments starts from the same weights as the same layers ungrouped.
struct flat_seed {
  std::uint64_t seed = 0;
  std::size_t first = 0;
};

/// The number of flat layers L stands for (see flat_seed): its seed_span, else 1.
template <class L>
inline constexpr std::size_t seed_span_v = [] {
  if constexpr (requires { L::seed_span; })
    return std::size_t(L::seed_span);
  else
    return std::size_t(1);
}();

namespace detail {
/// The flat index of layer I of the list Ls (the spans of the layers before it, summed).
template <std::size_t I, class... Ls>
inline constexpr std::size_t flat_offset = [] {
  constexpr std::size_t spans[] = {seed_span_v<Ls>..., 0};
  std::size_t sum = 0;
  for (std::size_t k = 0; k < I; ++k) sum += spans[k];
  return sum;
}();
/// Layer type L built for flat index `index` of a model seeded with `seed` (see flat_seed).
template <class L>
L make_seeded(std::uint64_t seed, std::size_t index) {
  if constexpr (requires { L::seed_span; })
    return L(flat_seed{seed, index});
  else
    return L(counter_rng{seed, index}.bits(0));
}
} // namespace detail

template <class... Layers>
class Sequential {
  static_assert(sizeof...(Layers) >= 1, "tessera::nn::Sequential: give at least one layer.");
  static constexpr std::size_t N = sizeof...(Layers);
  using first_layer = typename detail::first_of<Layers...>::type;

  template <class Shape>
  using chain_t = typename detail::shape_chain<0, void, Shape, Layers...>::type;

  template <std::size_t... I>
  static constexpr bool all_layers(std::index_sequence<I...>) {
    return (detail::sequential_layer_check<I, Layers>::ok && ...);
  }
  static constexpr bool layers_ok = all_layers(std::index_sequence_for<Layers...>{});

  // Instantiating the model type runs the layer-to-layer checks when the input is fixed.
  // (After a missing requirement, no shape check: one error, not a cascade.)
  static_assert(
      std::conditional_t<layers_ok, detail::static_shape_check<Layers...>, std::true_type>::value,
      "tessera::nn::Sequential: the layers' static shapes do not fit (see the "
      "sequential_link error above).");

public:
  /// The model's output shape for inputs of shape InExt (void if a layer does not fit).
  template <class InExt>
  using output_extents = chain_t<InExt>;

  /// Layer i gets the seed counter_rng{seed, i}.bits(0): a seed fixes the whole model. (i
  /// counts flat layers: a Recompute segment before layer i counts as its layers, flat_seed.)
  explicit Sequential(std::uint64_t seed = 0)
      : Sequential(flat_seed{seed, 0}, std::make_index_sequence<sizeof...(Layers)>{}) {}
  /// The layers as layers s.first, s.first + 1, ... of a flat model seeded with s.seed (a
  /// Recompute segment's, flat_seed).
  explicit Sequential(flat_seed s) : Sequential(s, std::make_index_sequence<sizeof...(Layers)>{}) {}

  /// Layer I (a reference into the model).
  template <std::size_t I>
  auto& layer() noexcept {
    return boost::hana::at_c<I>(layers_);
  }
  template <std::size_t I>
  const auto& layer() const noexcept {
    return boost::hana::at_c<I>(layers_);
  }
  static constexpr std::size_t size() noexcept { return N; }

  /// Every parameter of every layer, in order, as a boost::hana::tuple of handles named
  /// "<layer index>.<name>" ("0.weight", "0.bias", "3.weight", ...).
  auto parameters() const { return parameters_impl(std::make_index_sequence<N>{}); }

  /// Every fp8 scaling state of every layer (train::fp8_meta pointers, layer by layer) as a
  /// boost::hana::tuple, empty unless layers compute in nn::fp8: pass it to
  /// train::save_checkpoint / load_checkpoint so that a resumed fp8 run continues exactly.
  auto fp8_states() { return fp8_states_impl(std::make_index_sequence<N>{}); }

  /// The layers' forwards in order; returns the last layer's output (owned by that layer).
  template <class Exec, class X>
  auto forward(const Exec& exec, const X& x) {
    using out = chain_t<typename X::extents_type>;
    static_assert(!std::is_void_v<out>,
                  "tessera::nn::Sequential::forward: the input does not fit the layers (see the "
                  "sequential_link error above).");
    if constexpr (std::is_void_v<out>) {
      return;
    } else {
      return forward_from<0>(exec, x);
    }
  }

  /// The layers' backwards in reverse order from dy = dL/d(output) of the last forward; every
  /// parameter's grad is overwritten. Returns dL/d(input) if need_input_grad, else an empty
  /// tensor.
  template <class Exec, class DY>
  auto backward(const Exec& exec, const DY& dy, bool need_input_grad = false) {
    return backward_from<N - 1>(exec, dy, need_input_grad);
  }

  /// nn/layer.hpp: every layer's kept activations (see nn::activation_ledger).
  void count_activations(activation_ledger& l) const {
    boost::hana::for_each(layers_,
                          [&](const auto& layer) { detail::count_activations_of(layer, l); });
  }
  /// nn/layer.hpp: every layer frees its kept activations; backward then needs a forward.
  void release_activations() {
    boost::hana::for_each(layers_, [](auto& layer) { detail::release_activations_of(layer); });
  }

private:
  template <std::size_t... I>
  Sequential(flat_seed s, std::index_sequence<I...>)
      : layers_(
            detail::make_seeded<Layers>(s.seed, s.first + detail::flat_offset<I, Layers...>)...) {}

  template <std::size_t... I>
  auto parameters_impl(std::index_sequence<I...>) const {
    return boost::hana::flatten(boost::hana::make_tuple(
        boost::hana::transform(boost::hana::at_c<I>(layers_).parameters(), [](auto p) {
          p.name = std::to_string(I) + "." + p.name;
          return p;
        })...));
  }

  template <std::size_t... I>
  auto fp8_states_impl(std::index_sequence<I...>) {
    const auto of = [](auto& layer) {
      if constexpr (requires { layer.fp8_states(); }) {
        return layer.fp8_states();
      } else {
        return boost::hana::make_tuple();
      }
    };
    return boost::hana::flatten(boost::hana::make_tuple(of(boost::hana::at_c<I>(layers_))...));
  }

  template <std::size_t I, class Exec, class X>
  auto forward_from(const Exec& exec, const X& x) {
    using L = std::tuple_element_t<I, std::tuple<Layers...>>;
    static_assert(detail::layer_requirement<I, L, LayerForward<L, Exec, X>>,
                  "tessera::nn::Sequential::forward: this layer (index and type in "
                  "layer_requirement<index, type, false>) has no forward(exec, x) for the tensor "
                  "the layer before it returns (nn::LayerForward, nn/layer.hpp).");
    if constexpr (I + 1 == N) {
      return boost::hana::at_c<I>(layers_).forward(exec, x);
    } else if constexpr (fuses_relu_pool<I, Exec, X>()) {
      // Layer I stores max(v, 0) and layer I + 2 pools it in the same store (the full-resolution
      // output only where the convolution cannot: then the ReLU adopts it).
      auto& relu = boost::hana::at_c<I + 1>(layers_);
      relu.release_activations();
      auto y = boost::hana::at_c<I>(layers_).forward_pooled(
          exec, x, detail::relu_store{}, boost::hana::at_c<I + 2>(layers_),
          [&](const auto& full) { relu.adopt_output(full); });
      if constexpr (I + 3 == N) {
        return y;
      } else {
        return forward_from<I + 3>(exec, y);
      }
    } else if constexpr (fuses_relu<I, Exec, X>()) {
      // Layer I stores max(v, 0) (ReLU's function) in its output's store; ReLU adopts it.
      auto y = boost::hana::at_c<I>(layers_).forward(exec, x, detail::no_reduction{},
                                                     detail::relu_store{});
      boost::hana::at_c<I + 1>(layers_).adopt_output(y);
      if constexpr (I + 2 == N) {
        return y;
      } else {
        return forward_from<I + 2>(exec, y);
      }
    } else {
      return forward_from<I + 1>(exec, boost::hana::at_c<I>(layers_).forward(exec, x));
    }
  }

  /// True when layer I + 1 is an nn::ReLU and layer I takes a store epilogue in its forward
  /// (nn::Conv2d): the pair then runs as one pass, the ReLU applied before the output's
  /// rounding (the same values: detail::relu_store), and no separate read and write of the
  /// activations.
  template <std::size_t I, class Exec, class X>
  static constexpr bool fuses_relu() {
    if constexpr (I + 1 >= N) {
      return false;
    } else {
      using L = std::tuple_element_t<I, std::tuple<Layers...>>;
      using Next = std::tuple_element_t<I + 1, std::tuple<Layers...>>;
      return std::is_same_v<Next, ReLU> && requires(L & l, const Exec& e, const X& x) {
        l.forward(e, x, detail::no_reduction{}, detail::relu_store{});
      };
    }
  }

  /// True when layers I, I + 1, I + 2 are a layer with forward_pooled (nn::Conv2d), an nn::ReLU
  /// and an nn::MaxPool2d<2>: the three forwards then run as one pass where the convolution
  /// allows (Conv2d::forward_pooled), the ReLU's output never written at full resolution (its
  /// backward is the pooling's backward_after_relu, which needs only the pooled values).
  template <std::size_t I, class Exec, class X>
  static constexpr bool fuses_relu_pool() {
    if constexpr (I + 2 >= N) {
      return false;
    } else {
      using L = std::tuple_element_t<I, std::tuple<Layers...>>;
      using Next = std::tuple_element_t<I + 1, std::tuple<Layers...>>;
      using Pool = std::tuple_element_t<I + 2, std::tuple<Layers...>>;
      if constexpr (!std::is_same_v<Next, ReLU> || !std::is_same_v<Pool, MaxPool2d<2>>) {
        return false;
      } else {
        return requires(L & l, const Exec& e, const X& x, Pool& p) {
          l.forward_pooled(e, x, detail::relu_store{}, p, [](const auto&) {});
        };
      }
    }
  }

  /// True if a layer before I has parameters (then layer I must produce its input gradient).
  template <std::size_t I, std::size_t... J>
  static constexpr bool params_before(std::index_sequence<J...>) {
    return (detail::has_parameters<std::tuple_element_t<J, std::tuple<Layers...>>> || ... || false);
  }

  template <std::size_t I, class Exec, class DY>
  auto backward_from(const Exec& exec, const DY& dy, bool need_input_grad) {
    using L = std::tuple_element_t<I, std::tuple<Layers...>>;
    static_assert(detail::layer_requirement<I, L, LayerBackward<L, Exec, DY>>,
                  "tessera::nn::Sequential::backward: this layer (index and type in "
                  "layer_requirement<index, type, false>) has no backward(exec, dy, need_dx) for "
                  "the gradient the layer after it returns (nn::LayerBackward, nn/layer.hpp).");
    constexpr bool before = params_before<I>(std::make_index_sequence<I>{});
    if constexpr (pools_after_relu<I, Exec, DY>()) {
      // Layer I - 1 is a ReLU, layer I pools its output: both backwards in one pass.
      auto dx =
          boost::hana::at_c<I>(layers_).backward_after_relu(exec, dy, before || need_input_grad);
      if constexpr (I == 1) {
        return dx;
      } else {
        return backward_from<I - 2>(exec, dx, need_input_grad);
      }
    } else {
      auto dx = boost::hana::at_c<I>(layers_).backward(exec, dy, before || need_input_grad);
      if constexpr (I == 0) {
        return dx;
      } else {
        return backward_from<I - 1>(exec, dx, need_input_grad);
      }
    }
  }

  /// Layers I - 1 and I are an nn::ReLU and a pooling with backward_after_relu
  /// (nn::detail::pools_after_relu, nn/pooling.hpp).
  template <std::size_t I, class Exec, class DY>
  static constexpr bool pools_after_relu() {
    if constexpr (I == 0) {
      return false;
    } else {
      return detail::pools_after_relu<std::tuple_element_t<I - 1, std::tuple<Layers...>>,
                                      std::tuple_element_t<I, std::tuple<Layers...>>, Exec, DY>();
    }
  }

  boost::hana::tuple<Layers...> layers_;
};

} // namespace tessera::nn
