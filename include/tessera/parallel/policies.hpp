#pragma once
/// \file parallel/policies.hpp
/// The three ways to split a training step across processes, as compile-time policies:
///
///   tessera::parallel::data<D>      D replicas, each on 1/D of the global batch; gradients are
///                                   averaged across them (all-reduce). data<tessera::dyn>: D
///                                   taken at run time, the world size / (T * P).
///   data<D, zero<S>>                the same split with the ZeRO stage S (Rajbhandari et al.
///                                   2020) of the optimizer: 1 shards the optimizer state and
///                                   its update over the D replicas, 2 also the reduced
///                                   gradients (parallel/zero.hpp). zero<0> (the default) keeps
///                                   everything replicated.
///   tessera::parallel::tensor<T>    each layer's weights split T ways (Megatron column/row
///                                   halves for Linear pairs, output channels for Conv2d).
///   tessera::parallel::pipeline<P>  the layers cut into P consecutive stages, micro-batches
///                                   streamed through them; balanced by FLOPs, or cut at given
///                                   layer indices with pipeline<P, cut_at<I...>>.
///
/// A plan<Policies...> (parallel/plan.hpp) composes them; each is optional and given at most
/// once. Sizes must be at least 1: a zero fails to compile with a sentence. Only the data degree
/// may be tessera::dyn (the tensor and pipeline degrees shape the layer types, so they are
/// compile-time numbers).

#include <tessera/tensor/extents.hpp>

#include <cstddef>
#include <type_traits>

namespace tessera::parallel {

/// The mesh axis a policy splits along. The values are the axis' position in plan::axes.
enum class axis : int { tensor = 0, data = 1, pipeline = 2 };

/// Explicit pipeline cut points: stage k ends before layer I_k (layer indices of the
/// Sequential, strictly increasing, each in [1, layer count - 1]). P stages need P - 1 cuts.
template <std::size_t... I>
struct cut_at {
  static constexpr std::size_t count = sizeof...(I);
  static constexpr std::size_t values[count + 1] = {I..., 0}; // +1: a zero-size array is invalid
};

/// Stages balanced by the constexpr FLOP cost of the layers (the default of pipeline<P>).
struct balanced {};

namespace detail {
template <class T>
struct is_cut_at : std::false_type {};
template <std::size_t... I>
struct is_cut_at<cut_at<I...>> : std::true_type {};

template <int P, class Cuts>
constexpr bool cut_count_matches() {
  if constexpr (is_cut_at<Cuts>::value)
    return P < 1 || Cuts::count + 1 == static_cast<std::size_t>(P);
  else
    return true;
}
template <class Cuts>
constexpr bool cuts_increasing() {
  if constexpr (is_cut_at<Cuts>::value) {
    for (std::size_t k = 0; k < Cuts::count; ++k)
      if (Cuts::values[k] < 1 || (k > 0 && Cuts::values[k] <= Cuts::values[k - 1])) return false;
  }
  return true;
}
} // namespace detail

/// The ZeRO stage of the data-parallel split (Rajbhandari et al. 2020, "ZeRO: memory
/// optimizations toward training trillion parameter models"): 0 replicates the optimizer on
/// every data-parallel rank, 1 shards the optimizer state and update, 2 also the reduced
/// gradients. A modifier of data<D, zero<S>>, not a policy of its own: it splits nothing else.
template <int S>
struct zero {
  static_assert(S >= 0 && S <= 2,
                "tessera::parallel::zero<S>: the ZeRO stage S must be 0 (nothing sharded), 1 "
                "(optimizer state sharded) or 2 (optimizer state and gradients sharded); stage 3 "
                "(sharded parameters) is not implemented");
  static constexpr int stage = S;
};

namespace detail {
template <class T>
struct is_zero : std::false_type {};
template <int S>
struct is_zero<zero<S>> : std::true_type {};
} // namespace detail

/// Data parallelism over D replicas (D >= 1), or over as many as the world holds: data<dyn>
/// (tessera::dyn), D = world size / (tensor x pipeline), read by parallel::mesh at run time.
/// Z = zero<S> picks the ZeRO stage of the optimizer over those replicas (default zero<0>).
template <int D, class Z = zero<0>>
struct data {
  static_assert(detail::is_zero<Z>::value,
                "tessera::parallel::data<D, Z>: Z must be tessera::parallel::zero<S> (S = 0, 1 "
                "or 2)");
  static_assert(D >= 1 || D == dyn,
                "tessera::parallel::data<D>: the data-parallel size D must be at least 1, or "
                "tessera::dyn to take it from the world size at run time");
  /// D, or dyn (-1) for data<dyn>.
  static constexpr int size = D;
  static constexpr parallel::axis axis = parallel::axis::data;
  /// The ZeRO stage (0, 1 or 2).
  static constexpr int zero_stage = Z::stage;
};

/// Tensor (intra-layer) parallelism over T ranks (T >= 1).
template <int T>
struct tensor {
  static_assert(T != dyn,
                "tessera::parallel::tensor<T>: only the data degree may be dyn; the "
                "tensor-parallel size shapes the layer types and is a compile-time number");
  static_assert(T >= 1 || T == dyn,
                "tessera::parallel::tensor<T>: the tensor-parallel size T must be at least 1");
  static constexpr int size = T;
  static constexpr parallel::axis axis = parallel::axis::tensor;
};

/// Pipeline (inter-layer) parallelism over P stages (P >= 1). Cuts is `balanced` (stages of
/// about equal FLOPs) or cut_at<I...> with exactly P - 1 strictly increasing layer indices.
template <int P, class Cuts = balanced>
struct pipeline {
  static_assert(P != dyn, "tessera::parallel::pipeline<P>: only the data degree may be dyn; the "
                          "number of stages shapes the stage types and is a compile-time number");
  static_assert(
      P >= 1 || P == dyn,
      "tessera::parallel::pipeline<P>: the number of pipeline stages P must be at least 1");
  static_assert(std::is_same_v<Cuts, balanced> || detail::is_cut_at<Cuts>::value,
                "tessera::parallel::pipeline<P, Cuts>: Cuts must be balanced or cut_at<I...>");
  static_assert(
      detail::cut_count_matches<P, Cuts>(),
      "tessera::parallel::pipeline<P, cut_at<I...>>: P stages need exactly P - 1 cut points");
  static_assert(detail::cuts_increasing<Cuts>(),
                "tessera::parallel::pipeline<P, cut_at<I...>>: the cut points must be strictly "
                "increasing layer indices, each at least 1");
  static constexpr int size = P;
  static constexpr parallel::axis axis = parallel::axis::pipeline;
  using cuts = Cuts;
};

template <class T>
struct is_policy : std::false_type {};
template <int D, class Z>
struct is_policy<data<D, Z>> : std::true_type {};
template <int T>
struct is_policy<tensor<T>> : std::true_type {};
template <int P, class C>
struct is_policy<pipeline<P, C>> : std::true_type {};

/// data<D>, tensor<T> or pipeline<P, ...>.
template <class T>
concept Policy = is_policy<T>::value;

} // namespace tessera::parallel
