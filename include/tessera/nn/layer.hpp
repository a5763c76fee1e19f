#pragma once
/// \file nn/layer.hpp
/// What a layer is (the nn::Layer concept and the requirements it is made of) and what a layer
/// may declare about itself for the parallel plans (nn::layer_traits). A new layer is one file:
/// a class meeting these requirements works in nn::Sequential, under data parallelism, in a
/// pipeline stage and under the tensor split without an edit anywhere else.
///
/// Required (checked by nn::Sequential, each with its own error sentence):
///
///   class MyLayer {
///   public:
///     // nn::SeededLayer: Sequential builds layer i from its own seed.
///     explicit MyLayer(std::uint64_t seed);
///     // nn::LayerWithParameters: a boost::hana tuple of nn::parameter (hana::make_tuple()
///     // when there are none).
///     auto parameters() const;
///     // nn::LayerShapeRule<L, InExt>: the input shapes it takes, checked at compile time,
///     // and the shape it then returns.
///     template <class InExt> static constexpr bool accepts = ...;
///     template <class InExt> using output_extents = ...;
///     // nn::LayerForward<L, Exec, X>: the output (of output_extents<X's extents>), kept valid
///     // until the next forward.
///     template <class Exec, class X> auto forward(const Exec&, const X& x);
///     // nn::LayerBackward<L, Exec, DY>: dL/dx of the last forward (an empty tensor when
///     // !need_dx); OVERWRITES the parameters' gradients.
///     template <class Exec, class DY>
///     auto backward(const Exec&, const DY& dy, bool need_dx = true);
///   };
///
/// Optional declarations (read through nn::layer_traits, which users may also specialise for a
/// layer they cannot edit):
///
///   static constexpr nn::split_kind tensor_split = nn::split_kind::per_feature;
///       How the tensor split (parallel/tensor_parallel.hpp) treats the layer. Not declared:
///       split_kind::replicate, the safe default: every rank of a tensor group computes the
///       layer whole on the whole activations, its parameters identical on those ranks.
///   template <class InExt> static constexpr double forward_flops = ...;
///       Forward floating-point operations per sample on inputs InExt, what the balanced
///       pipeline cut (parallel/pipeline.hpp) weighs stages by. Not declared: the balanced cut
///       does not compile (it names the layer); cut by hand with pipeline<P, cut_at<I...>>, or
///       declare it. There is no guessed default, which would balance stages silently wrong.
///   using input_extents = extents<dyn, ...>;
///       The model input shape a first layer fixes (nn::Input, nn::Linear): Sequential then
///       checks the whole chain when the model type is instantiated; pipelines need it.
///   auto fp8_states();
///       The fp8 scaling states of an fp8 layer, for checkpoints (and nn::Recompute, which
///       restores them around a recomputing forward).
///   void count_activations(nn::activation_ledger&) const;
///   void release_activations();
///       What the layer keeps from its last forward for its backward (outputs, input copies,
///       masks, statistics; not parameters or gradients): count adds each kept view to the
///       ledger, release frees them (backward then needs a forward again). nn::Recompute
///       frees a segment's activations with it, nn::saved_activation_bytes counts them. Not
///       declared: the layer keeps nothing (nn::Input, nn::Flatten).
///
/// Dependencies: nn/ includes tensor/, gemm/, conv/ and train/ (parameters, fp8 recipes), never
/// parallel/. parallel/ decides how to treat a layer from the declarations above; only its
/// column/row shard types are written for concrete layers (nn::Linear, nn::Conv2d).

#include <tessera/nn/parameter.hpp>
#include <tessera/tensor.hpp>

#include <boost/hana/core/is_a.hpp>
#include <boost/hana/ext/std/integral_constant.hpp>
#include <boost/hana/fold_left.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace tessera::nn {

/// How the tensor split treats a layer (a layer's optional `tensor_split` declaration).
enum class split_kind : std::uint8_t {
  /// Computed whole on every rank of a tensor group (the default when nothing is declared).
  replicate,
  /// Acts on each feature or channel alone, so it runs on a shard of the features as on the
  /// whole (ReLU, GELU, MaxPool2d, Flatten of channels): it may sit between a column-parallel
  /// and a row-parallel layer.
  per_feature,
  /// A product layer parallel/ has column- and row-parallel shard types for (nn::Linear,
  /// nn::Conv2d with groups == 1). A layer without such types must not declare it: the split
  /// fails to compile, naming the layer.
  splittable,
};

// ---- the requirements ------------------------------------------------------------------------

/// Sequential builds layer i as L(seed_i).
template <class L>
concept SeededLayer = std::constructible_from<L, std::uint64_t>;

namespace detail {
template <class T>
struct is_parameter_tuple : std::false_type {};
template <class... P>
struct is_parameter_tuple<boost::hana::tuple<P...>>
    : std::bool_constant<(Parameter<P> && ... && true)> {};

template <class L>
concept HasParametersCall = requires(const L& l) {
  l.parameters();
};
template <class L>
concept ParametersAreHandles =
    is_parameter_tuple<std::remove_cvref_t<decltype(std::declval<const L&>().parameters())>>::value;

/// L's parameters() holds at least one parameter (read by Sequential's and parallel/'s
/// backward walks: no input gradient is needed before the first layer that has one).
template <class L>
inline constexpr bool has_parameters =
    decltype(boost::hana::length(std::declval<const L&>().parameters()))::value > 0;

template <class L, class InExt>
concept DeclaresAccepts = requires {
  { L::template accepts<InExt> } -> std::convertible_to<bool>;
};
template <class L, class InExt>
concept DeclaresOutputExtents = requires {
  typename L::template output_extents<InExt>;
};
} // namespace detail

/// `parameters() const` returns a boost::hana::tuple of nn::parameter handles (possibly empty).
template <class L>
concept LayerWithParameters = detail::HasParametersCall<L> && detail::ParametersAreHandles<L>;

/// The type-level part of a layer: seeded construction and its parameters.
template <class L>
concept Layer = SeededLayer<L> && LayerWithParameters<L>;

/// L says at compile time whether it takes inputs of extents InExt (`accepts<InExt>`, a
/// constant bool) and, if it does, the extents it returns (`output_extents<InExt>`).
template <class L, class InExt>
concept LayerShapeRule = detail::DeclaresAccepts<L, InExt> &&
    (!L::template accepts<InExt> || detail::DeclaresOutputExtents<L, InExt>);

/// l.forward(exec, x) compiles for a tensor x of type X.
template <class L, class Exec, class X>
concept LayerForward = requires(L& l, const Exec& exec, const X& x) {
  l.forward(exec, x);
};

/// l.backward(exec, dy, need_dx) compiles for a gradient dy of type DY.
template <class L, class Exec, class DY>
concept LayerBackward = requires(L& l, const Exec& exec, const DY& dy, bool need_dx) {
  l.backward(exec, dy, need_dx);
};

// ---- the optional declarations, with their defaults -------------------------------------------

namespace detail {
template <class L>
constexpr split_kind declared_split() {
  if constexpr (requires { L::tensor_split; }) {
    static_assert(std::is_same_v<std::remove_cv_t<decltype(L::tensor_split)>, split_kind>,
                  "tessera::nn: a layer's `tensor_split` declaration must be a "
                  "tessera::nn::split_kind.");
    return L::tensor_split;
  } else {
    return split_kind::replicate;
  }
}
} // namespace detail

/// What parallel/ reads about a layer. Specialise it for a layer type you cannot edit.
template <class L>
struct layer_traits {
  /// The layer's `tensor_split` declaration; split_kind::replicate when it makes none.
  static constexpr split_kind tensor_split = detail::declared_split<L>();

  /// True when the layer declares `forward_flops<InExt>`.
  template <class InExt>
  static constexpr bool declares_flops = requires {
    { L::template forward_flops<InExt> } -> std::convertible_to<double>;
  };

  /// The declared forward FLOPs per sample on inputs InExt (only when declares_flops).
  template <class InExt>
  requires declares_flops<InExt>
  static constexpr double forward_flops = double(L::template forward_flops<InExt>);
};

/// The number of elements of one sample of extents Ext (the product of the static extents
/// after the batch dimension): what an element-wise layer's forward_flops counts.
template <class Ext>
inline constexpr double elements_per_sample = [] {
  double n = 1;
  for (std::size_t d = 1; d < Ext::rank; ++d) n *= double(Ext::static_extent(d));
  return n;
}();

} // namespace tessera::nn
