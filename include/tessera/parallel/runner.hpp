#pragma once
/// \file parallel/runner.hpp
/// One training step of any plan<data<D>, tensor<T>, pipeline<P>> (D may be dyn: the mesh's
/// shape.data at run time): the part of a model this
/// rank holds (its pipeline stage of the tensor-split model) with the data-parallel gradient
/// buckets over its data group.
///
///   auto m = tessera::parallel::make_mesh_or_abort<Plan>(world);
///   tessera::parallel::with_plan_stage<Plan, Model, one_f_one_b, /*micro-batches=*/2>(
///       m, seed, /*bucket_bytes=*/1 << 20, [&](auto& stage) {
///         for (...) {
///           float l = stage.forward_backward(exec, x, labels, loss); // x, labels: my data share
///           opt.step(exec, stage.parameters());
///         }
///         auto whole = stage.gather_parameters();  // by name, as the single-process model's
///       });
///
/// Under a ZeRO stage (plan<data<D, zero<S>>, ...>: parallel/zero.hpp) the optimizer is made by
/// the stage, `auto z = stage.make_optimizer(train::adamw{...}); z.step(exec);` (it works for
/// zero<0> too, unsharded). At stages 1 and 2 forward_backward reduce-scatters the gradients:
/// only this rank's shard of them holds the group average, which z.step steps, so a plain
/// opt.step(exec, stage.parameters()) would be wrong.
///
/// The stage type depends on the rank's pipeline coordinate, a run-time value: with_plan_stage
/// instantiates every stage and calls f with the one of this rank (f is a generic lambda).
///
/// Stage cuts are computed on the unsplit Model (parallel/pipeline.hpp: balanced FLOPs or
/// cut_at), then applied to tensor_split_t<Model, T> (parallel/tensor_parallel.hpp), which has
/// the same layers at the same indices. Each rank passes its data share of the global batch:
/// x is read on the first stage, labels on the last (their size everywhere).

#include <tessera/parallel/data_parallel.hpp>
#include <tessera/parallel/fp8_sync.hpp>
#include <tessera/parallel/mesh.hpp>
#include <tessera/parallel/pipeline.hpp>
#include <tessera/parallel/tensor_parallel.hpp>
#include <tessera/parallel/zero.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace tessera::parallel {

/// The loss and accuracy counts of an evaluation over the global batch.
struct evaluation {
  double loss_sum = 0; ///< sum over the samples of the loss
  index_t correct = 0; ///< samples whose largest logit is the label
  index_t count = 0;   ///< samples
};

namespace detail {
/// The layers stage S of P holds: chunks S, S + P, ... of the model cut at Bounds (V chunks
/// per stage, interleaved_1f1b<V>), or for V = 1 the consecutive layers of stage S.
template <class SplitModel, class Bounds, int S, int P, int V>
struct plan_stage_type {
  using type = interleaved_stage<SplitModel, Bounds, S, P, V>;
};
template <class SplitModel, class Bounds, int S, int P>
struct plan_stage_type<SplitModel, Bounds, S, P, 1> {
  using type = pipeline_stage<SplitModel, Bounds::value[S], Bounds::value[S + 1]>;
};
} // namespace detail

/// Stage S of Plan for Model on communicator type C (see the file comment).
template <Plan P, class Model, class Schedule, int MicroBatches, Communicator C, int S,
          class Wire = float>
class plan_stage {
  static_assert(MicroBatches >= 1, "tessera::parallel::plan_stage: at least one micro-batch");
  static_assert(P::zero_stage == 0 || std::is_same_v<Wire, float>,
                "tessera::parallel::plan_stage: ZeRO stages 1 and 2 reduce-scatter fp32 "
                "gradients; a bf16 gradient wire is only for the all-reduce without ZeRO");
  // Spelt through S so that only an instantiation, not the inclusion of this header, refuses.
  static_assert(is_host_accessible_v<std::conditional_t<S >= 0, nn::detail::default_memory_space,
                                                        Kokkos::HostSpace>>,
                "tessera::parallel::plan_stage: a stage hands activations, gradients and logits "
                "to the communicator and reads the logits on the host (device-aware MPI is not "
                "assumed): plans need a host-accessible default memory space (a host build of "
                "Kokkos).");

public:
  static constexpr int stage_index = S;
  static constexpr int stages = P::pipeline_size;
  static constexpr int micro_batches = MicroBatches;
  /// Model chunks per stage: V under interleaved_1f1b<V> (the model cut into P V chunks, this
  /// rank holding chunks S, S + P, ...), else 1.
  static constexpr int virtual_stages = virtual_stages_v<Schedule>;
  static_assert(virtual_stages == 1 || std::is_same_v<typename P::cuts, balanced>,
                "tessera::parallel::plan_stage: interleaved_1f1b<V> cuts the model into P V "
                "balanced chunks; pipeline<P, cut_at<...>> names P - 1 cuts, not P V - 1");
  static_assert(virtual_stages == 1 || MicroBatches % P::pipeline_size == 0,
                "tessera::parallel::plan_stage: the interleaved schedule runs the micro-batches "
                "in groups of P, so MicroBatches must be a multiple of the P pipeline stages");
  static constexpr bool first = S == 0, last = S + 1 == stages;
  using plan_type = P;
  using split_model = tensor_split_t<Model, P::tensor_size>;
  using bounds = stage_bounds<Model, P::pipeline_size * virtual_stages, typename P::cuts>;
  /// A pipeline_stage (consecutive layers), or under interleaved_1f1b<V> an interleaved_stage
  /// (V chunks).
  using stage_type =
      typename detail::plan_stage_type<split_model, bounds, S, stages, virtual_stages>::type;
  using memory_space = nn::detail::default_memory_space;
  using buckets_type = gradient_buckets<C, memory_space, Wire>;
  /// The ZeRO stage of the plan's data split.
  static constexpr int zero_stage = P::zero_stage;

  /// Layers initialised as Model(seed)'s, sliced for this rank's tensor coordinate.
  plan_stage(parallel::mesh<P, C>& m, std::uint64_t seed, std::size_t bucket_bytes)
      : mesh_(&m), group_(m.tensor), stage_(seed) {
    buckets_.emplace(m.data, stage_.parameters(), bucket_bytes,
                     zero_stage == 0   ? bucket_reduction::all_reduce
                     : zero_stage == 1 ? bucket_reduction::reduce_scatter
                                       : bucket_reduction::reduce_scatter_staged);
    amax_groups_.data = &m.data;
    amax_groups_.tensor = &group_;
    for_each_chunk([&](auto& chunk) {
      bind_tensor_group(chunk, group_);
      defer_fp8_records(chunk); // one amax per step, synchronised: parallel/fp8_sync.hpp
      reduce_current_amaxes(chunk, amax_groups_); // current scaling: the whole tensor's amax
    });
  }
  // The layers keep pointers to group_ and amax_groups_: a stage stays where it was built.
  plan_stage(const plan_stage&) = delete;
  plan_stage& operator=(const plan_stage&) = delete;

  stage_type& stage() noexcept { return stage_; }
  /// The plan's mesh this stage runs on.
  parallel::mesh<P, C>& mesh() noexcept { return *mesh_; }
  /// The gradient buckets over the data group: all-reduce, or at ZeRO stages 1 and 2
  /// reduce-scatter (parallel/zero.hpp).
  buckets_type& buckets() noexcept { return *buckets_; }
  const tensor_group& tensor() const noexcept { return group_; }
  /// Where this stage's time went in the last forward_backward on the pipeline path (more than
  /// one stage or micro-batch; zeros otherwise).
  const pipeline_stats& last_pipeline_stats() const noexcept { return stats_; }
  /// This rank's parameters (shards), named as the single-process model's.
  auto parameters() const { return stage_.parameters(); }

  /// The optimizer of the plan's ZeRO stage over this rank's data group, wrapping `opt` (its
  /// hyper-parameters; no steps yet): parallel::sharded_optimizer (parallel/zero.hpp).
  template <class Optimizer>
  auto make_optimizer(Optimizer opt) const {
    return sharded_optimizer<zero_stage, Optimizer, C>(mesh_->data, stage_.parameters(),
                                                       std::move(opt), &*buckets_);
  }
  /// The bytes this rank holds for training with `opt` (from make_optimizer): zero_memory.
  template <class Optimizer>
  zero_memory memory(const sharded_optimizer<zero_stage, Optimizer, C>& opt) const {
    return opt.memory();
  }

  /// Forward and backward of this rank's share (B samples, B a multiple of MicroBatches) on the
  /// schedule, gradients then averaged over the data group: afterwards every parameter's grad
  /// is its part of the gradient of the mean loss over the global batch (times grad_scale; at
  /// ZeRO stages 1 and 2 only this rank's shard of the gradients: they are reduce-scattered).
  /// Returns that mean loss, on every rank. The gradient reductions overlap the backward:
  /// without a pipeline and with one micro-batch through backward_overlapped, on the pipeline
  /// path during the stage's last micro-batch's backward (run_pipeline_stage's buckets). fp8
  /// layers record one amax per tensor per call, the maximum over micro-batches and ranks
  /// (parallel/fp8_sync.hpp).
  template <class Exec, class X, class Labels, class Loss>
  float forward_backward(const Exec& exec, const X& x, const Labels& labels, Loss& loss,
                         float grad_scale = 1.f) {
    float l = 0;
    if constexpr (virtual_stages > 1) {
      l = run_interleaved_stage<Schedule, MicroBatches>(exec, stage_, mesh_->pipeline, x, labels,
                                                        loss, grad_scale, &stats_, &*buckets_);
    } else if constexpr (stages == 1 && MicroBatches == 1) {
      const auto y = stage_.forward(exec, x);
      const auto result = loss.forward_backward(exec, y, labels, grad_scale);
      l = result.loss;
      backward_overlapped(exec, stage_, result.dlogits, *buckets_);
    } else {
      using In = typename stage_input_at<split_model, bounds, S, X, Exec>::type;
      // The last micro-batch's backward marks each layer's summed gradient ready: the
      // reduction overlaps the rest of it.
      l = run_pipeline_stage<Schedule, MicroBatches, S, stages, In>(
          exec, stage_, mesh_->pipeline, x, labels, loss, grad_scale, &stats_, &*buckets_);
    }
    buckets_->finish(exec);
    for_each_chunk([&](auto& chunk) { sync_fp8_states(chunk, mesh_->data, group_); });
    return global_mean(l);
  }

  /// Gradient accumulation outside the pipeline: K accumulation steps, each a forward and
  /// backward of this rank's share `batch(k)` (a pair (x, labels), B samples each, the same B
  /// for every k; on the schedule as forward_backward) WITHOUT the data-parallel reduction (as
  /// DDP's no_sync), their gradients summed in `acc` (train::grad_accumulator, empty before),
  /// then divided by K and reduced over the data group ONCE (the gradient buckets: all-reduced,
  /// or reduce-scattered at ZeRO stages 1 and 2). Afterwards every
  /// parameter's grad is its part of the gradient of the mean loss over the K global batches
  /// (times grad_scale), as forward_backward on their union would leave it up to the order of
  /// the fp32 sums. fp8 layers record one amax per tensor per accumulation step (the maximum
  /// over its micro-batches and ranks). Returns that mean loss, on every rank.
  template <class Exec, class BatchOf, class Loss, class Accumulator>
  float forward_backward_accumulated(const Exec& exec, int K, BatchOf&& batch, Loss& loss,
                                     Accumulator& acc, float grad_scale = 1.f) {
    if (K < 1)
      throw value_error("tessera::parallel::plan_stage::forward_backward_accumulated: K = " +
                        std::to_string(K) + " accumulation steps; give at least 1");
    float sum = 0;
    for (int k = 0; k < K; ++k) {
      const auto [x, labels] = batch(k);
      if constexpr (virtual_stages > 1) {
        sum += run_interleaved_stage<Schedule, MicroBatches>(exec, stage_, mesh_->pipeline, x,
                                                             labels, loss, grad_scale, &stats_);
      } else if constexpr (stages == 1 && MicroBatches == 1) {
        const auto y = stage_.forward(exec, x);
        const auto result = loss.forward_backward(exec, y, labels, grad_scale);
        sum += result.loss;
        stage_.backward(exec, result.dlogits, false);
      } else {
        using In = typename stage_input_at<split_model, bounds, S, std::remove_cvref_t<decltype(x)>,
                                           Exec>::type;
        sum += run_pipeline_stage<Schedule, MicroBatches, S, stages, In>(
            exec, stage_, mesh_->pipeline, x, labels, loss, grad_scale, &stats_);
      }
      acc.accumulate(exec, stage_.parameters());
      // fp8: one amax per tensor per accumulation step, as the single process records on the
      // same micro-batches (without it the deferred records would never be committed).
      for_each_chunk([&](auto& chunk) { sync_fp8_states(chunk, mesh_->data, group_); });
    }
    acc.finish(exec, stage_.parameters()); // grad = sum / K
    buckets_->finish(exec);                // the one reduction of this step
    return global_mean(sum / float(K));
  }

  /// Forward only (one micro-batch): the loss sum (the loss times this rank's samples, summed)
  /// and correct predictions (classification outputs (B, classes) only; 0 for a language
  /// model's (B, t, V)) over the global batch, on every rank. Under interleaved_1f1b<V> the
  /// batch goes once around the ranks per chunk: model chunk g (rank g mod P) receives from
  /// chunk g - 1 and sends to chunk g + 1.
  template <class Exec, class X, class Labels, class Loss>
  evaluation evaluate(const Exec& exec, const X& x, const Labels& labels, Loss& loss) {
    const index_t batch = index_t(labels.extent(0));
    float stats[2] = {0, 0}; // loss sum, correct
    if constexpr (virtual_stages == 1) {
      evaluate_chunk<S>(exec, stage_, x, labels, loss, stats);
    } else {
      [&]<int... v>(std::integer_sequence<int, v...>) {
        (evaluate_chunk<v * stages + S>(exec, stage_.template chunk<v>(), x, labels, loss, stats),
         ...);
      }
      (std::make_integer_sequence<int, virtual_stages>{});
    }
    if constexpr (stages > 1) mesh_->pipeline.broadcast(stats, 2, stages - 1);
    const int data = mesh_->shape.data;
    if (data > 1) mesh_->data.all_reduce_sum(stats, 2);
    for_each_chunk([&](auto& chunk) { sync_fp8_states(chunk, mesh_->data, group_); });
    return {double(stats[0]), index_t(stats[1]), batch * data};
  }

  /// The whole values of this stage's parameters by name (gathered over the tensor group).
  std::map<std::string, std::vector<float>> gather_parameters() {
    std::map<std::string, std::vector<float>> all;
    for_each_chunk([&](auto& chunk) { all.merge(parallel::gather_parameters(chunk, group_)); });
    return all;
  }
  /// Sets this stage's parameters from whole values by name (each rank takes its shard).
  void scatter_parameters(const std::map<std::string, std::vector<float>>& whole) {
    for_each_chunk([&](auto& chunk) { parallel::scatter_parameters(chunk, group_, whole); });
  }

private:
  /// evaluate's forward of model chunk g (of stages x virtual_stages; `chunk` this rank's
  /// layers of it): its input from x (g = 0) or from chunk g - 1's rank, its output to chunk
  /// g + 1's rank, or for the model's last chunk the loss sum and correct predictions in stats.
  template <int g, class Exec, class Chunk, class X, class Labels, class Loss>
  void evaluate_chunk(const Exec& exec, Chunk& chunk, const X& x, const Labels& labels, Loss& loss,
                      float* stats) {
    constexpr int chunks = stages * virtual_stages;
    const index_t batch = index_t(labels.extent(0));
    auto finish = [&](const auto& out) {
      if constexpr (g + 1 == chunks) {
        // The loss is the mean over the sample's positions for a language model's logits
        // (B, t, V) and targets (B, t); predictions are counted for classification only.
        stats[0] = loss.forward(exec, out, labels) * float(batch);
        stats[1] = count_correct(out, labels);
      } else {
        const auto copy = detail::copy_rows(exec, out, 0, batch);
        mesh_->pipeline.send(copy.data(), copy.size(), (g + 1) % stages, g + 1);
      }
    };
    if constexpr (g == 0) {
      finish(chunk.forward(exec, x));
    } else {
      using In = typename stage_input_at<split_model, bounds, g, X, Exec>::type;
      std::array<index_t, In::extents_type::rank> all{};
      all[0] = batch;
      for (std::size_t d = 1; d < In::extents_type::rank; ++d)
        all[d] = In::extents_type::static_extent(d);
      In in("tessera::parallel::plan_stage.evaluate", In::extents_type::from_all(all));
      mesh_->pipeline.recv(in.data(), in.size(), (g - 1) % stages, g);
      finish(chunk.forward(exec, in));
    }
  }

  /// evaluate's correct predictions: the rows of `out` (B, classes) whose largest logit is at
  /// the label; 0 for other outputs (a language model's (B, t, V)). A function template, so
  /// that labels(i) is only instantiated for classification (clang checks the non-dependent
  /// expressions of a generic lambda's discarded branch).
  template <class Out, class Labels>
  static float count_correct(const Out& out, const Labels& labels) {
    float correct = 0;
    if constexpr (Out::extents_type::rank == 2) {
      const index_t batch = out.extent(0), classes = out.extent(1);
      for (index_t i = 0; i < batch; ++i) {
        index_t best = 0;
        for (index_t j = 1; j < classes; ++j)
          if (to_float(out(i, j)) > to_float(out(i, best))) best = j;
        correct += best == index_t(labels(i)) ? 1.f : 0.f;
      }
    }
    return correct;
  }

  /// f(chunk) for each run of consecutive layers this rank holds: the stage, or its V chunks.
  template <class F>
  void for_each_chunk(F&& f) {
    if constexpr (virtual_stages == 1)
      f(stage_);
    else
      stage_.for_each_chunk(f);
  }

  float global_mean(float l) {
    if constexpr (stages > 1) mesh_->pipeline.broadcast(&l, 1, stages - 1);
    if (mesh_->shape.data > 1) {
      mesh_->data.all_reduce_sum(&l, 1);
      l /= float(mesh_->shape.data);
    }
    return l;
  }

  parallel::mesh<P, C>* mesh_;
  tensor_group group_;
  detail::amax_groups<C> amax_groups_{};
  stage_type stage_;
  std::optional<buckets_type> buckets_; // built in the constructor
  pipeline_stats stats_{};
};

/// Builds this rank's plan_stage of Model (seeded as Model(seed)) and calls f(stage).
template <Plan P, class Model, class Schedule = one_f_one_b, int MicroBatches = 1,
          class Wire = float, Communicator C, class F>
void with_plan_stage(mesh<P, C>& m, std::uint64_t seed, std::size_t bucket_bytes, F&& f) {
  with_stage<P::pipeline_size>(m.at.pipeline, [&](auto s) {
    plan_stage<P, Model, Schedule, MicroBatches, C, decltype(s)::value, Wire> stage(m, seed,
                                                                                    bucket_bytes);
    f(stage);
  });
}

} // namespace tessera::parallel
