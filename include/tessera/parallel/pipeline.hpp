#pragma once
/// \file parallel/pipeline.hpp
/// Pipeline parallelism for nn::Sequential models: the layers cut into P consecutive stages at
/// compile time, and a training step that streams micro-batches through the stages on the
/// GPipe or 1F1B table of parallel/schedule.hpp, sending activations forward and gradients
/// backward between neighbouring ranks.
///
///   using Cut = tessera::parallel::stage_bounds<Model, 2, balanced>;  // {0, k, N}
///   tessera::parallel::pipeline_stage<Model, Cut::value[s], Cut::value[s + 1]> stage(seed);
///   tessera::parallel::run_pipeline_stage<one_f_one_b, /*M=*/4, s, P, In>(
///       exec, stage, mesh.pipeline, x, labels, loss);
///
/// Stages are balanced by a constexpr cost, the forward FLOPs per sample each layer declares
/// for its static input shape (nn/layer.hpp's `forward_flops`: 2 In Out for Linear,
/// 2 OutC P Q InC/groups K^2 for Conv2d, one per element for ReLU/GELU, ...; a layer without
/// the declaration fails to compile here), choosing the cuts that minimise the most expensive
/// stage; or cut where pipeline<P, cut_at<I...>> says (stage k ends before layer I_k).
///
/// Memory: tessera's layers keep the state of their last forward only, so a backward whose
/// forward was not the stage's latest first re-runs that forward from the saved stage input
/// (activation recomputation at stage boundaries, as in GPipe's re-materialisation). Only the
/// stage inputs of the micro-batches in flight are kept: M for GPipe, at most P - s for 1F1B.
/// Parameter gradients are summed over the micro-batches (each micro-batch's loss gradient is
/// scaled by 1/M), so they equal the gradient of the mean loss over the whole batch.
///
/// Interleaved 1F1B (interleaved_1f1b<V>): the model is cut into P V chunks and a rank holds V
/// of them (interleaved_stage); run_interleaved_stage runs its table. Given data-parallel
/// gradient buckets, both runners mark each layer's gradients ready during the last backward
/// that contributes to them, so the all-reduce overlaps the rest of the backward.

#include <tessera/nn/layer.hpp>
#include <tessera/nn/sequential.hpp>
#include <tessera/parallel/communicator.hpp>
#include <tessera/parallel/policies.hpp>
#include <tessera/parallel/schedule.hpp>
#include <tessera/tensor/host_mirror.hpp>
#include <tessera/tensor/random.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/flatten.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tessera::parallel {

template <class Model>
struct model_traits;

/// The static facts about a Sequential the plan transforms need.
template <class... L>
struct model_traits<nn::Sequential<L...>> {
  static constexpr std::size_t size = sizeof...(L);
  template <std::size_t I>
  using layer = std::tuple_element_t<I, std::tuple<L...>>;
};

/// The input extents of layer I of Model (the first layer must fix the model's input shape:
/// nn::Input<...>, nn::Linear).
template <class Model, std::size_t I>
struct layer_input {
  using previous = typename model_traits<Model>::template layer<I - 1>;
  using type = typename previous::template output_extents<typename layer_input<Model, I - 1>::type>;
};
template <class Model>
struct layer_input<Model, 0> {
  using type = typename model_traits<Model>::template layer<0>::input_extents;
};

namespace detail {
template <std::size_t LayerIndex, class LayerType, bool Ok>
inline constexpr bool layer_declares_flops = Ok;
} // namespace detail

/// Forward FLOPs per sample of layer I (of type Layer) on inputs InExt: what the layer declares
/// (`forward_flops<InExt>`, read through nn::layer_traits, nn/layer.hpp). A layer that declares
/// none stops the balanced cut at compile time, naming the layer: a guessed cost would balance
/// the stages silently wrong. Cut such a model with pipeline<P, cut_at<I...>>. (Plans without
/// a pipeline, P = 1, compute no costs.)
template <std::size_t I, class Layer, class InExt>
struct layer_cost {
  static constexpr bool declared = nn::layer_traits<Layer>::template declares_flops<InExt>;
  static_assert(detail::layer_declares_flops<I, Layer, declared>,
                "tessera::parallel::pipeline<P> (balanced): the layer in "
                "layer_declares_flops<index, type, false> declares no forward FLOPs; give it "
                "`template <class InExt> static constexpr double forward_flops = ...;` (per "
                "sample, nn/layer.hpp), specialise nn::layer_traits for it, or cut the stages "
                "by hand with pipeline<P, cut_at<I...>>.");
  static constexpr double value = [] {
    if constexpr (declared)
      return nn::layer_traits<Layer>::template forward_flops<InExt>;
    else
      return 0.0;
  }();
};

/// The per-layer costs of Model, in order.
template <class Model>
constexpr auto layer_costs() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<double, sizeof...(I)>{
        layer_cost<I, typename model_traits<Model>::template layer<I>,
                   typename layer_input<Model, I>::type>::value...};
  }
  (std::make_index_sequence<model_traits<Model>::size>{});
}

namespace detail {
/// Contiguous partition of costs[0..N) into P non-empty parts minimising the largest part
/// (dynamic programming over prefix sums, O(P N^2)); returns the P + 1 boundaries.
template <std::size_t N, std::size_t P>
constexpr std::array<std::size_t, P + 1> balance(const std::array<double, N>& costs) {
  std::array<double, N + 1> prefix{};
  for (std::size_t i = 0; i < N; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[p][i]: the smallest largest part splitting the first i layers into p parts.
  std::array<std::array<double, N + 1>, P + 1> best{};
  std::array<std::array<std::size_t, N + 1>, P + 1> cut{};
  constexpr double inf = 1e300;
  for (auto& row : best)
    for (auto& v : row) v = inf;
  best[0][0] = 0;
  for (std::size_t p = 1; p <= P; ++p)
    for (std::size_t i = p; i <= N; ++i)
      for (std::size_t j = p - 1; j < i; ++j) {
        if (best[p - 1][j] >= inf) continue;
        const double part = prefix[i] - prefix[j];
        const double worst = best[p - 1][j] > part ? best[p - 1][j] : part;
        if (worst < best[p][i]) best[p][i] = worst, cut[p][i] = j;
      }
  std::array<std::size_t, P + 1> bounds{};
  bounds[P] = N;
  for (std::size_t p = P, i = N; p > 0; --p) i = bounds[p - 1] = cut[p][i];
  return bounds;
}
} // namespace detail

/// Stage boundaries of Model in P stages: value[s] is the first layer of stage s, value[P]
/// the layer count. Cuts: balanced (by layer_cost) or cut_at<I...>.
template <class Model, int P, class Cuts = balanced>
struct stage_bounds {
  static constexpr std::size_t layers = model_traits<Model>::size;
  static_assert(std::size_t(P) <= layers,
                "tessera::parallel::pipeline<P>: the model has fewer layers than P stages");
  static constexpr std::array<std::size_t, P + 1> value = [] {
    if constexpr (P == 1) { // one stage: no costs needed (a layer without FLOPs is fine)
      return std::array<std::size_t, P + 1>{0, layers};
    } else if constexpr (std::is_same_v<Cuts, balanced>) {
      return detail::balance<layers, std::size_t(P)>(layer_costs<Model>());
    } else {
      std::array<std::size_t, P + 1> b{};
      for (std::size_t k = 0; k < Cuts::count; ++k) b[k + 1] = Cuts::values[k];
      b[P] = layers;
      return b;
    }
  }();
  static_assert(value[P - 1] < layers,
                "tessera::parallel::pipeline<P, cut_at<I...>>: a cut point is at or past the "
                "model's last layer; each stage needs at least one layer");
};

/// Layers [Begin, End) of Model, initialised exactly as in the whole Model (layer I from
/// counter_rng{seed, I}, I its flat index: nn::flat_seed) and with the same parameter names
/// ("I.weight"), so a stage's parameters are the whole model's, cut.
template <class Model, std::size_t Begin, std::size_t End>
class pipeline_stage {
  static_assert(Begin < End && End <= model_traits<Model>::size,
                "tessera::parallel::pipeline_stage: a stage is a non-empty range of layers");
  template <std::size_t K>
  using layer_t = typename model_traits<Model>::template layer<Begin + K>;
  static constexpr std::size_t N = End - Begin;
  template <std::size_t... K>
  static auto tuple_type(std::index_sequence<K...>) -> boost::hana::tuple<layer_t<K>...>;
  using layers_type = decltype(tuple_type(std::make_index_sequence<N>{}));

public:
  static constexpr std::size_t begin = Begin, end = End;
  using input_extents = typename layer_input<Model, Begin>::type;

  explicit pipeline_stage(std::uint64_t seed)
      : pipeline_stage(seed, std::make_index_sequence<N>{}) {}

  static constexpr std::size_t size() noexcept { return N; }
  template <std::size_t K>
  auto& layer() noexcept {
    return boost::hana::at_c<K>(layers_);
  }

  /// This stage's parameters, named as in the whole model.
  auto parameters() const { return parameters_impl(std::make_index_sequence<N>{}); }

  template <class Exec, class X>
  auto forward(const Exec& exec, const X& x) {
    return forward_from<0>(exec, x);
  }

  /// Backward through the stage's layers; returns dL/d(stage input) when need_input_grad
  /// (every stage but the first sends it upstream), else whatever the first layer that needs
  /// no input gradient returned.
  template <class Exec, class DY>
  auto backward(const Exec& exec, const DY& dy, bool need_input_grad) {
    auto nothing = [](auto&) {};
    return backward_from<N - 1>(exec, dy, need_input_grad, nothing);
  }
  /// backward(), calling on_layer(layer) after each layer's backward, from the last layer to
  /// the first (the layer's parameter gradients are written then).
  template <class Exec, class DY, class OnLayer>
  auto backward(const Exec& exec, const DY& dy, bool need_input_grad, OnLayer&& on_layer) {
    return backward_from<N - 1>(exec, dy, need_input_grad, on_layer);
  }

private:
  // Layer I's flat index (nn::flat_seed: a Recompute segment counts as its layers).
  template <std::size_t I>
  static constexpr std::size_t flat_index = [] {
    std::size_t sum = 0;
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      ((sum += nn::seed_span_v<typename model_traits<Model>::template layer<J>>), ...);
    }
    (std::make_index_sequence<I>{});
    return sum;
  }();
  template <std::size_t... K>
  pipeline_stage(std::uint64_t seed, std::index_sequence<K...>)
      : layers_(nn::detail::make_seeded<layer_t<K>>(seed, flat_index<Begin + K>)...) {}

  template <std::size_t... K>
  auto parameters_impl(std::index_sequence<K...>) const {
    return boost::hana::flatten(boost::hana::make_tuple(
        boost::hana::transform(boost::hana::at_c<K>(layers_).parameters(), [](auto p) {
          p.name = std::to_string(Begin + K) + "." + p.name;
          return p;
        })...));
  }
  template <std::size_t K, class Exec, class X>
  auto forward_from(const Exec& exec, const X& x) {
    if constexpr (K + 1 == N)
      return boost::hana::at_c<K>(layers_).forward(exec, x);
    else
      return forward_from<K + 1>(exec, boost::hana::at_c<K>(layers_).forward(exec, x));
  }
  template <std::size_t K, std::size_t... J>
  static constexpr bool params_before(std::index_sequence<J...>) {
    return (nn::detail::has_parameters<layer_t<J>> || ... || false);
  }
  template <std::size_t K, class Exec, class DY, class OnLayer>
  auto backward_from(const Exec& exec, const DY& dy, bool need_input_grad, OnLayer& on_layer) {
    constexpr bool before = params_before<K>(std::make_index_sequence<K>{});
    auto dx = boost::hana::at_c<K>(layers_).backward(exec, dy, before || need_input_grad);
    on_layer(boost::hana::at_c<K>(layers_));
    if constexpr (K == 0)
      return dx;
    else
      return backward_from<K - 1>(exec, dx, need_input_grad, on_layer);
  }

  layers_type layers_;
};

/// The pipeline_stage type of stage s of Model split in P stages by Cuts.
template <class Model, int P, class Cuts, int s>
using pipeline_stage_t = pipeline_stage<Model, stage_bounds<Model, P, Cuts>::value[s],
                                        stage_bounds<Model, P, Cuts>::value[s + 1]>;

/// Calls f(std::integral_constant<int, s>{}) for the run-time stage index s in [0, P): the
/// bridge from a rank's pipeline coordinate to its compile-time stage type.
template <int P, class F>
void with_stage(int s, F&& f) {
  [&]<int... S>(std::integer_sequence<int, S...>) {
    ((s == S ? (f(std::integral_constant<int, S>{}), 0) : 0), ...);
  }
  (std::make_integer_sequence<int, P>{});
}

/// The tensor type stage s receives when Model's layers are cut at Bounds::value (stage k is
/// layers [value[k], value[k + 1])): X (the model input batch) for stage 0, else the output
/// type of stage s - 1.
template <class Model, class Bounds, int s, class X, class Exec = Kokkos::DefaultExecutionSpace>
struct stage_input_at {
  using previous_input = typename stage_input_at<Model, Bounds, s - 1, X, Exec>::type;
  using previous_stage = pipeline_stage<Model, Bounds::value[s - 1], Bounds::value[s]>;
  using type = std::remove_cvref_t<decltype(std::declval<previous_stage&>().forward(
      std::declval<const Exec&>(), std::declval<const previous_input&>()))>;
};
template <class Model, class Bounds, class X, class Exec>
struct stage_input_at<Model, Bounds, 0, X, Exec> {
  using type = X;
};

/// The tensor type stage s of Model split in P stages by Cuts receives.
template <class Model, int P, class Cuts, int s, class X,
          class Exec = Kokkos::DefaultExecutionSpace>
struct stage_input : stage_input_at<Model, stage_bounds<Model, P, Cuts>, s, X, Exec> {};

namespace detail {
/// An owning copy of rows [first, first + rows) of a (B, ...) tensor.
template <class T, class Exec>
auto copy_rows(const Exec& exec, const T& t, index_t first, index_t rows) {
  using E = typename T::extents_type;
  std::array<index_t, E::rank> all{};
  for (std::size_t d = 0; d < E::rank; ++d) all[d] = t.extent(d);
  all[0] = rows;
  Tensor<typename T::precision, E, layout_right, typename T::memory_space> out =
      Tensor<typename T::precision, E, layout_right, typename T::memory_space>::uninitialized(
          "tessera::parallel::pipeline.rows", E::from_all(all));
  const index_t per_row = rows > 0 ? out.size() / rows : 0;
  Kokkos::deep_copy(
      exec, out.kokkos_view(),
      Kokkos::subview(t.kokkos_view(),
                      Kokkos::pair<index_t, index_t>(first * per_row, (first + rows) * per_row)));
  exec.fence();
  return out;
}

/// An owning copy of rows [first, first + rows) of a model input that is a Kokkos::View (the
/// token ids (B, t) of a language model whose first layer is nn::TokenEmbedding).
template <class V, class Exec>
requires Kokkos::is_view<V>::value auto copy_rows(const Exec& exec, const V& v, index_t first,
                                                  index_t rows) {
  static_assert(V::rank == 2, "tessera::parallel::pipeline: a Kokkos::View model input must be "
                              "(B, t), e.g. token ids");
  typename V::non_const_type out(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "tessera::parallel::pipeline.rows"),
      std::size_t(rows), v.extent(1));
  Kokkos::deep_copy(
      exec, out,
      Kokkos::subview(v, Kokkos::pair<index_t, index_t>(first, first + rows), Kokkos::ALL));
  exec.fence();
  return out;
}

/// Rows [first, end) of labels (B) or (B, t) (a language model's targets), as a subview.
template <class Labels>
auto label_rows(const Labels& labels, index_t first, index_t end) {
  if constexpr (Labels::rank == 1)
    return Kokkos::subview(labels, Kokkos::pair<index_t, index_t>(first, end));
  else
    return Kokkos::subview(labels, Kokkos::pair<index_t, index_t>(first, end), Kokkos::ALL);
}

/// The buckets of a run_pipeline_stage that marks nothing.
struct no_marks {
  template <class Exec, class Param>
  void mark_ready(const Exec&, const Param&) {}
};

/// dst = src converted elementwise (host memory), for gradients sent in the receiver's type.
template <class Dst, class Src>
void convert_into(Dst& dst, const Src& src) {
  using D = typename Dst::storage_type;
  auto* d = dst.data();
  const auto* s = src.data();
  for (index_t i = 0; i < dst.size(); ++i) {
    if constexpr (std::is_same_v<D, typename Src::storage_type>)
      d[i] = s[i];
    else
      d[i] = from_float<typename Dst::precision>(to_float(s[i]));
  }
}
} // namespace detail

/// Where one stage's time went in one run_pipeline_stage call (for benchmarks): wall time of
/// the call, the part spent computing (forwards, recomputed forwards, backwards, gradient
/// accumulation, the loss), and the number of forwards recomputed before a backward.
struct pipeline_stats {
  double wall_seconds = 0;
  double busy_seconds = 0;
  int recomputed = 0;
  /// The stage's idle fraction: 1 - busy / wall.
  double idle_fraction() const noexcept {
    return wall_seconds > 0 ? 1.0 - busy_seconds / wall_seconds : 0.0;
  }
};

namespace detail {

/// A pipeline runner's clock: timed(f) runs f and adds its wall time to the busy time;
/// stats() is the call's pipeline_stats.
class stage_timer {
  using clock = std::chrono::steady_clock;

public:
  template <class F>
  decltype(auto) timed(F&& f) {
    struct add_on_exit {
      double& busy;
      clock::time_point t0;
      ~add_on_exit() { busy += std::chrono::duration<double>(clock::now() - t0).count(); }
    } guard{busy_, clock::now()};
    return f();
  }
  int recomputed = 0; ///< forwards re-run before a backward
  pipeline_stats stats() const {
    return {std::chrono::duration<double>(clock::now() - start_).count(), busy_, recomputed};
  }

private:
  clock::time_point start_ = clock::now();
  double busy_ = 0;
};

/// A received activation or gradient: `rows` samples of T's shape (its first extent dynamic,
/// the others static), uninitialised.
template <class T>
T rows_buffer(const char* label, index_t rows) {
  std::array<index_t, T::extents_type::rank> all{};
  all[0] = rows;
  for (std::size_t d = 1; d < T::extents_type::rank; ++d)
    all[d] = T::extents_type::static_extent(d);
  return T::uninitialized(label, T::extents_type::from_all(all));
}

/// A stage's parameter gradients summed over its micro-batches. After each layer's backward
/// (a pipeline_stage::backward hook), add_layer adds the gradients the layer just wrote into
/// its sums; on the stage's (or chunk's) last backward of the step (`final_pass`, with
/// data-parallel `buckets`) it writes the sum into the gradient instead (grad = sum + grad,
/// the same additions) and marks it ready, so the all-reduce overlaps the rest of the
/// backward. finish() then copies the sums into the gradients not written that way.
template <class Exec>
class micro_batch_sums {
public:
  template <class Params>
  explicit micro_batch_sums(const Params& params) {
    boost::hana::for_each(params, [&](const auto& p) {
      index_.emplace(p.grad.data(), sums_.size());
      sums_.emplace_back(p.name + ".accumulated", std::size_t(p.size()));
    });
    final_.assign(sums_.size(), false);
  }

  template <class Layer, class Buckets>
  void add_layer(const Exec& exec, Layer& layer, bool final_pass, Buckets* buckets) {
    exec.fence(); // the layer's backward has written its gradients
    boost::hana::for_each(layer.parameters(), [&](const auto& p) {
      const std::size_t k = index_.at(p.grad.data());
      auto a = sums_[k];
      float* g = p.grad.data();
      const auto n = index_t(a.extent(0));
      if (final_pass && buckets) {
        Kokkos::parallel_for(
            "tessera::parallel::pipeline.accumulate_final", Kokkos::RangePolicy<Exec>(exec, 0, n),
            KOKKOS_LAMBDA(const index_t j) { g[j] = a(j) + g[j]; });
        final_[k] = true;
        buckets->mark_ready(exec, p); // fences before reading the gradient
      } else {
        Kokkos::parallel_for(
            "tessera::parallel::pipeline.accumulate", Kokkos::RangePolicy<Exec>(exec, 0, n),
            KOKKOS_LAMBDA(const index_t j) { a(j) += g[j]; });
      }
    });
  }

  template <class Params>
  void finish(const Exec& exec, const Params& params) {
    std::size_t k = 0;
    boost::hana::for_each(params, [&](const auto& p) {
      if (!final_[k]) Kokkos::deep_copy(exec, p.grad.kokkos_view(), sums_[k]);
      ++k;
    });
    exec.fence();
  }

private:
  std::vector<Kokkos::View<float*, typename Exec::memory_space>> sums_;
  std::map<const float*, std::size_t> index_; // a parameter's gradient buffer -> its sum
  std::vector<bool> final_;                   // the gradient holds its sum already
};

} // namespace detail

/// One training step of one pipeline stage on the schedule Kind (gpipe or one_f_one_b) with
/// M micro-batches: forwards and backwards in the table's order for stage s of P, activations
/// received from stage s - 1 and sent to s + 1 over `pipe` (the pipeline group; ranks are
/// stage indices), gradients the other way. The first stage reads the batch from `x`
/// (B, ...) (a Tensor, or a Kokkos::View of token ids (B, t)), the last reads `labels` (B, or
/// (B, t) for a sequence model) and applies `loss` (mean per micro-batch, scaled by
/// grad_scale / M). `In` is the type the stage receives (the previous stage's output type;
/// for stage 0, x's type). Afterwards the stage's parameter gradients hold the batch-mean
/// gradient. Returns the mean loss over the batch on the last stage, 0 elsewhere.
///
/// The batch B must be a multiple of M; throws value_error before any communication otherwise.
/// If `stats` is given, it receives where the time went.
///
/// If `buckets` is given (parallel::gradient_buckets over the data group), the last backward of
/// the stage (its last micro-batch's) writes each layer's final gradient (the sum over the
/// micro-batches) as soon as that layer's backward ends and marks it ready there, so the
/// data-parallel all-reduce of the later layers overlaps the backward of the earlier ones (and
/// the wait for the last sends). The caller then calls buckets->finish(exec).
template <class Kind, int M, int s, int P, class In, class Exec, class Stage, Communicator C,
          class X, class Labels, class Loss, class Buckets = detail::no_marks>
float run_pipeline_stage(const Exec& exec, Stage& stage, C& pipe, const X& x, const Labels& labels,
                         Loss& loss, float grad_scale = 1.f, pipeline_stats* stats = nullptr,
                         Buckets* buckets = nullptr) {
  detail::stage_timer timer;
  auto timed = [&](auto&& f) -> decltype(auto) { return timer.timed(f); };
  static_assert(0 <= s && s < P && M >= 1,
                "tessera::parallel::run_pipeline_stage: need 0 <= s < P stages and M >= 1");
  static_assert(is_host_accessible_v<typename In::memory_space>,
                "tessera::parallel::run_pipeline_stage: the stage's activations and gradients "
                "are handed to the communicator, which reads host memory (device-aware MPI is "
                "not assumed): run pipeline plans on tensors in a host-accessible memory space "
                "(a host build of Kokkos, or a HostSpace / pinned / managed memory space).");
  const index_t batch = index_t(labels.extent(0));
  if (batch % M != 0)
    throw value_error("tessera::parallel::run_pipeline_stage: the batch of " +
                      std::to_string(batch) + " samples is not a multiple of the " +
                      std::to_string(M) + " micro-batches");
  const index_t mb = batch / M;
  std::array<step, 2 * M> row{};
  {
    std::vector<step> table(std::size_t(2 * P * M));
    fill_schedule(Kind{}, P, M, table.data());
    for (int k = 0; k < 2 * M; ++k) row[std::size_t(k)] = table[std::size_t(s * 2 * M + k)];
  }
  constexpr bool first = s == 0, last = s + 1 == P;

  std::map<int, In> inputs; // saved stage inputs of micro-batches in flight
  using Out = std::remove_cvref_t<decltype(stage.forward(exec, std::declval<const In&>()))>;
  std::map<int, Out> sent, dys; // activations being sent; last stage's dlogits
  std::map<int, In> grads_sent; // input gradients being sent
  std::vector<request> pending;
  int latest_forward = -1;
  double loss_sum = 0;

  detail::micro_batch_sums<Exec> sums(stage.parameters());
  int last_backward = 0; // the row's last backward step, after which gradients are final
  for (int k = 0; k < 2 * M; ++k)
    if (row[std::size_t(k)].kind == pass::backward) last_backward = k;

  auto run_forward = [&](int i) -> decltype(auto) {
    latest_forward = i;
    return timed([&]() -> decltype(auto) { return stage.forward(exec, inputs.at(i)); });
  };

  for (int at = 0; at < 2 * M; ++at) {
    const step& st = row[std::size_t(at)];
    const int i = st.micro_batch;
    const int tag_act = 2 * i, tag_grad = 2 * i + 1;
    if (st.kind == pass::forward) {
      if constexpr (first) {
        static_assert(std::is_same_v<In, X>,
                      "tessera::parallel::run_pipeline_stage: stage 0 receives the batch x");
        inputs.emplace(i, detail::copy_rows(exec, x, i * mb, mb));
      } else {
        auto buf = detail::rows_buffer<In>("tessera::parallel::pipeline.recv", mb);
        pipe.recv(buf.data(), buf.size(), s - 1, tag_act);
        inputs.emplace(i, std::move(buf));
      }
      const auto& out = run_forward(i);
      if constexpr (last) {
        auto lab = detail::label_rows(labels, i * mb, (i + 1) * mb);
        auto result =
            timed([&] { return loss.forward_backward(exec, out, lab, grad_scale / float(M)); });
        loss_sum += double(result.loss);
        dys.emplace(i, detail::copy_rows(exec, result.dlogits, 0, mb));
      } else {
        auto copy = detail::copy_rows(exec, out, 0, mb);
        pending.push_back(pipe.isend(copy.data(), copy.size(), s + 1, tag_act));
        sent.emplace(i, std::move(copy));
      }
    } else {
      if constexpr (!last) {
        auto buf = detail::rows_buffer<Out>("tessera::parallel::pipeline.grad", mb);
        pipe.recv(buf.data(), buf.size(), s + 1, tag_grad);
        dys.emplace(i, std::move(buf));
      }
      if (latest_forward != i) { // recompute: layers hold one forward's state
        run_forward(i);
        ++timer.recomputed;
      }
      auto dx = timed([&] {
        auto d = stage.backward(exec, dys.at(i), !first, [&](auto& layer) {
          sums.add_layer(exec, layer, at == last_backward, buckets);
        });
        exec.fence();
        return d;
      });
      if constexpr (!first) {
        In g = In::uninitialized("tessera::parallel::pipeline.dx", inputs.at(i).extents());
        detail::convert_into(g, dx);
        pending.push_back(pipe.isend(g.data(), g.size(), s - 1, tag_grad));
        grads_sent.emplace(i, std::move(g));
      }
      inputs.erase(i);
      dys.erase(i);
    }
  }
  for (request& r : pending) r.wait();
  sums.finish(exec, stage.parameters());
  if (stats) *stats = timer.stats();
  return last ? float(loss_sum / M) : 0.f;
}

/// The model chunks rank s holds under interleaved_1f1b<V> (parallel/schedule.hpp): Model cut
/// into P V chunks at Bounds::value (chunk g is layers [value[g], value[g + 1])), of which rank
/// s holds chunks g = c P + s for its local chunks c = 0..V-1 (Narayanan et al. 2021, 2.2).
/// Each chunk is a pipeline_stage initialised as in the whole Model.
template <class Model, class Bounds, int s, int P, int V>
class interleaved_stage {
  static_assert(0 <= s && s < P && V >= 1 && Bounds::value.size() == std::size_t(P * V + 1),
                "tessera::parallel::interleaved_stage: Bounds must cut the model into P V chunks");
  template <int c>
  using chunk_t = pipeline_stage<Model, Bounds::value[c * P + s], Bounds::value[c * P + s + 1]>;
  template <int... c>
  static auto tuple_type(std::integer_sequence<int, c...>) -> boost::hana::tuple<chunk_t<c>...>;
  using chunks_type = decltype(tuple_type(std::make_integer_sequence<int, V>{}));

public:
  using model_type = Model;
  using bounds_type = Bounds;
  static constexpr int stage_index = s, stages = P, chunks = V;

  explicit interleaved_stage(std::uint64_t seed)
      : interleaved_stage(seed, std::make_integer_sequence<int, V>{}) {}

  /// Local chunk c (model chunk c P + s).
  template <int c>
  auto& chunk() noexcept {
    return boost::hana::at_c<c>(chunks_);
  }
  /// f(chunk) for each local chunk, in order.
  template <class F>
  void for_each_chunk(F&& f) {
    boost::hana::for_each(chunks_, f);
  }
  /// The parameters of all chunks, named as in the whole model.
  auto parameters() const {
    return boost::hana::flatten(
        boost::hana::transform(chunks_, [](const auto& ch) { return ch.parameters(); }));
  }

private:
  template <int... c>
  interleaved_stage(std::uint64_t seed, std::integer_sequence<int, c...>)
      : chunks_(chunk_t<c>(seed)...) {}
  chunks_type chunks_;
};

namespace detail {
/// The per-chunk state of run_interleaved_stage: saved inputs, messages in flight.
template <class In, class Out>
struct chunk_state {
  std::map<int, In> inputs, grads_sent;
  std::map<int, Out> sent, dys;
  int latest_forward = -1;
};
} // namespace detail

/// run_pipeline_stage for interleaved_1f1b<V>: one training step of rank s's V model chunks
/// (`stage`, an interleaved_stage) on the interleaved table. Model chunk g = c P + s receives
/// its activation from chunk g - 1 on rank (g - 1) mod P of `pipe` and sends its output to
/// rank (g + 1) mod P (rank P - 1 feeds rank 0 between chunks), gradients the other way; each
/// link and micro-batch has its own tag. Chunk 0 of rank 0 reads `x`, the model's last chunk
/// (rank P - 1's chunk V - 1) reads `labels` and applies `loss`. Parameter gradients are
/// summed over the micro-batches as in run_pipeline_stage; with `buckets`, each chunk's
/// parameters are marked ready during that chunk's last backward. Returns the mean loss on
/// rank P - 1, 0 elsewhere. The batch must be a multiple of M (value_error otherwise), and M
/// a multiple of P (at compile time).
template <class Kind, int M, class Exec, class Stage, Communicator C, class X, class Labels,
          class Loss, class Buckets = detail::no_marks>
float run_interleaved_stage(const Exec& exec, Stage& stage, C& pipe, const X& x,
                            const Labels& labels, Loss& loss, float grad_scale = 1.f,
                            pipeline_stats* stats = nullptr, Buckets* buckets = nullptr) {
  constexpr int s = Stage::stage_index, P = Stage::stages, V = Stage::chunks;
  static_assert(virtual_stages_v<Kind> == V,
                "tessera::parallel::run_interleaved_stage: the schedule's virtual stages must be "
                "the chunks the stage holds");
  static_assert(M >= 1 && M % P == 0,
                "tessera::parallel::run_interleaved_stage: the interleaved schedule runs the "
                "micro-batches in groups of P, so M must be a multiple of the P stages");
  using Model = typename Stage::model_type;
  using Bounds = typename Stage::bounds_type;
  constexpr int G = P * V; // model chunks
  detail::stage_timer timer;
  auto timed = [&](auto&& f) -> decltype(auto) { return timer.timed(f); };
  const index_t batch = index_t(labels.extent(0));
  if (batch % M != 0)
    throw value_error("tessera::parallel::run_interleaved_stage: the batch of " +
                      std::to_string(batch) + " samples is not a multiple of the " +
                      std::to_string(M) + " micro-batches");
  const index_t mb = batch / M;
  constexpr int per_stage = 2 * V * M;
  std::vector<step> row(static_cast<std::size_t>(per_stage));
  {
    std::vector<step> table(std::size_t(P * per_stage));
    fill_schedule(Kind{}, P, M, table.data());
    for (int k = 0; k < per_stage; ++k) row[std::size_t(k)] = table[std::size_t(s * per_stage + k)];
  }
  // The index in the row of each chunk's last backward: its gradients are final after it.
  std::array<int, V> last_backward{};
  for (int k = 0; k < per_stage; ++k)
    if (row[std::size_t(k)].kind == pass::backward) last_backward[row[std::size_t(k)].chunk] = k;

  auto states = [&]<int... c>(std::integer_sequence<int, c...>) {
    return boost::hana::make_tuple([&]<int cc>(std::integral_constant<int, cc>) {
      using In = typename stage_input_at<Model, Bounds, cc * P + s, X, Exec>::type;
      using Out = std::remove_cvref_t<decltype(stage.template chunk<cc>().forward(
          exec, std::declval<const In&>()))>;
      return detail::chunk_state<In, Out>{};
    }(std::integral_constant<int, c>{})...);
  }
  (std::make_integer_sequence<int, V>{});

  std::vector<request> pending;
  double loss_sum = 0;
  detail::micro_batch_sums<Exec> sums(stage.parameters());
  auto tag = [](int link, int i, int grad) { return 2 * (link * M + i) + grad; };

  for (int at = 0; at < per_stage; ++at) {
    const step st = row[std::size_t(at)];
    const int i = st.micro_batch;
    with_stage<V>(st.chunk, [&](auto cc) {
      constexpr int c = decltype(cc)::value, g = c * P + s;
      constexpr bool first = g == 0, last = g == G - 1;
      constexpr int from = (g + G - 1) % P, to = (g + 1) % P; // ranks of chunks g - 1, g + 1
      auto& chunk = stage.template chunk<c>();
      auto& state = boost::hana::at_c<c>(states);
      using In = typename std::remove_cvref_t<decltype(state.inputs)>::mapped_type;
      using Out = typename std::remove_cvref_t<decltype(state.sent)>::mapped_type;
      auto run_forward = [&](int j) -> decltype(auto) {
        state.latest_forward = j;
        return timed([&]() -> decltype(auto) { return chunk.forward(exec, state.inputs.at(j)); });
      };
      if (st.kind == pass::forward) {
        if constexpr (first) {
          state.inputs.emplace(i, detail::copy_rows(exec, x, i * mb, mb));
        } else {
          auto buf = detail::rows_buffer<In>("tessera::parallel::pipeline.recv", mb);
          pipe.recv(buf.data(), buf.size(), from, tag(g - 1, i, 0));
          state.inputs.emplace(i, std::move(buf));
        }
        const auto& out = run_forward(i);
        if constexpr (last) {
          auto lab = detail::label_rows(labels, i * mb, (i + 1) * mb);
          auto result =
              timed([&] { return loss.forward_backward(exec, out, lab, grad_scale / float(M)); });
          loss_sum += double(result.loss);
          state.dys.emplace(i, detail::copy_rows(exec, result.dlogits, 0, mb));
        } else {
          auto copy = detail::copy_rows(exec, out, 0, mb);
          pending.push_back(pipe.isend(copy.data(), copy.size(), to, tag(g, i, 0)));
          state.sent.emplace(i, std::move(copy));
        }
      } else {
        if constexpr (!last) {
          auto buf = detail::rows_buffer<Out>("tessera::parallel::pipeline.grad", mb);
          pipe.recv(buf.data(), buf.size(), to, tag(g, i, 1));
          state.dys.emplace(i, std::move(buf));
        }
        if (state.latest_forward != i) { // recompute: layers hold one forward's state
          run_forward(i);
          ++timer.recomputed;
        }
        const bool final_pass = at == last_backward[std::size_t(c)];
        auto dx = timed([&] {
          auto d = chunk.backward(exec, state.dys.at(i), !first, [&](auto& layer) {
            sums.add_layer(exec, layer, final_pass, buckets);
          });
          exec.fence();
          return d;
        });
        if constexpr (!first) {
          In gin =
              In::uninitialized("tessera::parallel::pipeline.dx", state.inputs.at(i).extents());
          detail::convert_into(gin, dx);
          pending.push_back(pipe.isend(gin.data(), gin.size(), from, tag(g - 1, i, 1)));
          state.grads_sent.emplace(i, std::move(gin));
        }
        state.inputs.erase(i);
        state.dys.erase(i);
      }
    });
  }
  for (request& r : pending) r.wait();
  sums.finish(exec, stage.parameters());
  if (stats) *stats = timer.stats();
  return s == P - 1 ? float(loss_sum / M) : 0.f;
}

} // namespace tessera::parallel
