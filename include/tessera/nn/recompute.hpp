#pragma once
/// \file nn/recompute.hpp
/// nn::Recompute<Segment>: activation recomputation (gradient checkpointing). A layer that runs
/// Segment (any nn::Layer: an nn::Sequential of layers, an nn::Residual, a single layer) and
/// keeps only a copy of the segment's input between forward and backward:
///
///   using Block = tessera::nn::Sequential<tessera::nn::Linear<784, 512>, tessera::nn::ReLU,
///                                         tessera::nn::Linear<512, 512>, tessera::nn::ReLU>;
///   using Model = tessera::nn::Sequential<tessera::nn::Recompute<Block>,
///                                         tessera::nn::Linear<512, 10>>;
///
/// forward copies x into memory of its own, runs the segment on the copy and then has every
/// layer of the segment free what it kept for backward (`release_activations`, nn/layer.hpp):
/// the output it returns stays valid (it holds its memory) while its reader holds it. backward
/// re-runs the segment's forward from the kept copy, then the segment's backward, then frees
/// the segment's activations and the copy again. The gradients are bit-identical to the
/// unwrapped segment's: the same kernels run on the same values.
///
/// State a forward advances runs once: the fp8 scaling states of the segment (train::fp8_meta,
/// reached through `fp8_states()`: amax histories, delayed scales) are saved before the first
/// forward, restored before the recomputing forward (which so quantises with the first
/// forward's scales and reproduces it bit for bit) and set back afterwards to what the first
/// forward left, so the histories record each step once. tessera's layers have no other
/// forward state (no dropout, no batch statistics); a layer that gains some must expose it the
/// same way.
///
/// Run-time switch: set_enabled(false) (or nn::set_recompute(model, false) over a whole model)
/// makes the segment run as if unwrapped: its layers keep their activations and backward runs
/// without a recomputing forward; the results are bit-identical either way. So a model type
/// written with Recompute segments serves both, and the choice is not training state.
///
/// Seeds: Recompute declares seed_span (its segment's layers, nn::flat_seed, nn/sequential.hpp),
/// so in a Sequential the segment's layers get the seeds they have without the wrapper: a
/// model with Recompute segments starts from the same weights as the same layers unwrapped.
///
/// Memory: nn::saved_activation_bytes(model) counts what the layers keep between a forward and
/// its backward (nn::activation_ledger; each allocation once). A Recompute holds its input's
/// copy only, so a model cut into k segments keeps about the k segment inputs plus the largest
/// segment's activations during its backward, instead of every layer's.
///
/// Layer declarations (nn/layer.hpp): shape rule, input_extents and forward_flops are the
/// segment's (a Sequential segment's FLOPs are its layers' sum; the recomputing forward is not
/// counted); tensor_split is split_kind::per_feature when the segment declares it, otherwise
/// split_kind::replicate: the tensor split leaves a Recompute whole (computed on every rank of
/// a tensor group), it does not split the Linear layers inside.

#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/layer.hpp>
#include <tessera/nn/residual.hpp>
#include <tessera/nn/sequential.hpp>
#include <tessera/tensor/ops.hpp>

#include <boost/hana/at.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

namespace tessera::nn {

namespace detail {

/// Whether segment S accepts inputs InExt: its own `accepts`, or for a Sequential whether the
/// chain of its layers does (without a hard error for a refused shape).
template <class S, class InExt>
struct segment_accepts {
  static constexpr bool value = [] {
    if constexpr (LayerShapeRule<S, InExt>)
      return bool(S::template accepts<InExt>);
    else
      return false;
  }();
};
template <class... Ls, class InExt>
struct segment_accepts<Sequential<Ls...>, InExt> {
  static constexpr bool value = residual_chain<InExt, Ls...>::ok;
};

/// The segment's forward FLOPs per sample: its declaration, or a Sequential's layers' sum.
template <class S, class InExt>
struct segment_flops {
  static constexpr bool declared = layer_traits<S>::template declares_flops<InExt>;
  static constexpr double value = [] {
    if constexpr (declared)
      return layer_traits<S>::template forward_flops<InExt>;
    else
      return 0.0;
  }();
};
template <class... Ls, class InExt>
struct segment_flops<Sequential<Ls...>, InExt> : residual_flops<InExt, Ls...> {};

/// input_extents when the segment fixes the model input (itself, or its first layer).
template <class S>
struct segment_input {};
template <class S>
requires FixesInput<S>
struct segment_input<S> {
  using input_extents = typename S::input_extents;
};
template <class F, class... Rest>
requires FixesInput<F>
struct segment_input<Sequential<F, Rest...>> {
  using input_extents = typename F::input_extents;
};

/// The flat layers a segment stands for (nn::flat_seed): a Sequential's summed, else its own.
template <class S>
struct segment_span {
  static constexpr std::size_t value = seed_span_v<S>;
};
template <class... Ls>
struct segment_span<Sequential<Ls...>> {
  static constexpr std::size_t value = (seed_span_v<Ls> + ...);
};
/// A segment built as the flat layers from s.first on: a Sequential from s itself, a layer
/// standing for several from s, any other layer as Sequential builds layer s.first.
template <class S>
S make_seeded(flat_seed s) {
  if constexpr (std::is_constructible_v<S, flat_seed>)
    return S(s);
  else
    return make_seeded<S>(s.seed, s.first);
}

template <class S>
auto fp8_states_of(S& s) {
  if constexpr (requires { s.fp8_states(); })
    return s.fp8_states();
  else
    return boost::hana::make_tuple();
}
/// Copies of the segment's fp8 scaling states (values, not pointers).
template <class S>
auto fp8_snapshot(S& s) {
  return boost::hana::transform(fp8_states_of(s), [](auto* p) { return *p; });
}
template <class S, class Snapshot>
void fp8_restore(S& s, const Snapshot& snap) {
  auto states = fp8_states_of(s);
  constexpr std::size_t n = decltype(boost::hana::length(states))::value;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((*boost::hana::at_c<I>(states) = boost::hana::at_c<I>(snap)), ...);
  }
  (std::make_index_sequence<n>{});
}

} // namespace detail

template <class Segment>
class Recompute : public detail::segment_input<Segment> {
  static_assert(Layer<Segment>, "tessera::nn::Recompute<Segment>: the segment must be an "
                                "nn::Layer (nn/layer.hpp), e.g. an nn::Sequential of layers.");
  using M = detail::default_memory_space;
  using snapshot_type = decltype(detail::fp8_snapshot(std::declval<Segment&>()));

public:
  using segment_type = Segment;

  template <class InExt>
  static constexpr bool accepts = detail::segment_accepts<Segment, InExt>::value;
  template <class InExt>
  using output_extents = typename Segment::template output_extents<InExt>;
  /// nn/layer.hpp: the segment's FLOPs (see the file comment).
  template <class InExt>
  requires(detail::segment_flops<Segment, InExt>::declared) static constexpr double forward_flops =
      detail::segment_flops<Segment, InExt>::value;
  static constexpr split_kind tensor_split =
      layer_traits<Segment>::tensor_split == split_kind::per_feature ? split_kind::per_feature
                                                                     : split_kind::replicate;

  /// The flat layers the segment stands for (nn::flat_seed): a Sequential segment's layers,
  /// else 1. In a Sequential (or a pipeline stage) the segment's layers get the seeds they have
  /// in the same model without the Recompute: the same initial weights.
  static constexpr std::size_t seed_span = detail::segment_span<Segment>::value;

  /// The segment is built as Segment(seed).
  explicit Recompute(std::uint64_t seed = 0) : segment_(seed), x_("recompute.x") {}
  /// The segment's layers built as layers s.first, s.first + 1, ... of a flat model seeded with
  /// s.seed (what a Sequential gives its layer: see nn::flat_seed).
  explicit Recompute(flat_seed s) : segment_(detail::make_seeded<Segment>(s)), x_("recompute.x") {}

  /// Whether forward keeps only the segment's input and backward recomputes (default), or the
  /// segment runs as if unwrapped (its layers keep their activations, backward runs directly):
  /// the results are bit-identical either way. A run-time switch (nn::set_recompute sets it
  /// over a model); change it between a backward and the next forward.
  bool enabled() const noexcept { return enabled_; }
  void set_enabled(bool on) noexcept { enabled_ = on; }

  Segment& segment() noexcept { return segment_; }
  const Segment& segment() const noexcept { return segment_; }
  /// The segment's parameters (its names).
  auto parameters() const { return segment_.parameters(); }
  /// The segment's fp8 scaling states (empty unless it computes in fp8).
  auto fp8_states() { return detail::fp8_states_of(segment_); }

  /// The segment's output for x; keeps a copy of x only (when enabled).
  template <class Exec, class P, class E>
  auto forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    static_assert(accepts<E>,
                  "tessera::nn::Recompute::forward: the segment does not accept the input.");
    rerun_ = nullptr;
    x_.release();
    if (!enabled_) {
      ran_unwrapped_ = true;
      return segment_.forward(exec, x);
    }
    ran_unwrapped_ = false;
    fp8_before_ = detail::fp8_snapshot(segment_);
    auto kept = x_.template get<P>(x.extents());
    tessera::deep_copy(kept, x);
    auto y = segment_.forward(exec, kept);
    detail::release_activations_of(segment_);
    rerun_ = [exec, kept](Segment& s) { (void)s.forward(exec, kept); };
    return y;
  }

  /// Re-runs the segment's forward from the kept input (fp8 states as before the first
  /// forward, then as that forward left them), then its backward; frees both afterwards. After
  /// a forward with recomputation disabled, the segment's backward alone.
  template <class Exec, class DY>
  auto backward(const Exec& exec, const DY& dy, bool need_dx = true) {
    if (ran_unwrapped_) {
      ran_unwrapped_ = false;
      return segment_.backward(exec, dy, need_dx);
    }
    if (!rerun_)
      throw value_error("tessera::nn::Recompute::backward: called before forward (each backward "
                        "needs its own forward: the segment's activations are recomputed once)");
    const auto after = detail::fp8_snapshot(segment_);
    detail::fp8_restore(segment_, fp8_before_);
    rerun_(segment_);
    detail::fp8_restore(segment_, after);
    rerun_ = nullptr;
    auto dx = segment_.backward(exec, dy, need_dx);
    detail::release_activations_of(segment_);
    x_.release();
    return dx;
  }

  /// nn/layer.hpp: the kept input and whatever the segment holds (nothing between a forward
  /// and its backward).
  void count_activations(activation_ledger& l) const {
    x_.count(l);
    detail::count_activations_of(segment_, l);
  }
  /// nn/layer.hpp: frees the kept input and the segment's activations.
  void release_activations() {
    detail::release_activations_of(segment_);
    x_.release();
    rerun_ = nullptr;
    ran_unwrapped_ = false;
  }

private:
  Segment segment_;
  detail::any_buffer x_;
  std::function<void(Segment&)> rerun_;
  snapshot_type fp8_before_{};
  bool enabled_ = true;
  bool ran_unwrapped_ = false; // the last forward ran with recomputation disabled
};

namespace detail {
template <class L>
void set_recompute_in(L& layer, bool on);
template <class L, std::size_t... K>
void set_recompute_layers(L& model, bool on, std::index_sequence<K...>) {
  (set_recompute_in(model.template layer<K>(), on), ...);
}
template <class L>
void set_recompute_in(L& layer, bool on) {
  if constexpr (requires { layer.set_enabled(on), layer.segment(); }) {
    layer.set_enabled(on);
    set_recompute_in(layer.segment(), on);
  } else if constexpr (requires {
                         L::size();
                         layer.template layer<0>();
                       }) {
    set_recompute_layers(layer, on, std::make_index_sequence<L::size()>{});
  }
}
} // namespace detail

/// Switches recomputation on or off in every nn::Recompute of `model` (an nn::Sequential, a
/// pipeline stage, or anything with size() and layer<K>(); Recompute segments nested in
/// segments included): see Recompute::set_enabled. Nothing else changes: weights, optimizer
/// and fp8 states are the same either way, so the switch is free to differ between a run and
/// its resume.
template <class Model>
void set_recompute(Model& model, bool on) {
  detail::set_recompute_in(model, on);
}

/// The bytes of activations `model` keeps now (after a forward: what its backward will read),
/// each allocation once: see nn::activation_ledger.
template <class L>
std::size_t saved_activation_bytes(const L& model) {
  activation_ledger l;
  detail::count_activations_of(model, l);
  return l.bytes();
}

} // namespace tessera::nn
