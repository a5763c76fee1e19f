#pragma once
/// \file parallel/zero.hpp
/// ZeRO stages 1 and 2 (Rajbhandari et al. 2020, "ZeRO: memory optimizations toward training
/// trillion parameter models") for the data-parallel split: plan<data<D, zero<S>>, ...>.
///
///   using Plan = plan<data<dyn, zero<2>>, tensor<2>>;
///   with_plan_stage<Plan, Model>(mesh, seed, bucket_bytes, [&](auto& stage) {
///     auto opt = stage.make_optimizer(train::adamw{.lr = 1e-3f});  // sharded_optimizer
///     stage.forward_backward(exec, x, labels, loss, scaler.scale());
///     opt.step(exec, scaler, mesh.world);        // or opt.step(exec) without a loss scaler
///     const zero_memory m = stage.memory(opt);   // bytes this rank holds
///   });
///
/// The parameters this rank holds (its tensor shard of its pipeline stage: the same shapes on
/// every rank of its data group) are flattened in parameter order into N elements and split
/// into D contiguous, balanced shards (shard_layout: rank r owns [floor(r N / D),
/// floor((r + 1) N / D)), sizes differing by at most one, any D). Each rank's optimizer runs on
/// its shard only, as "pieces": 1-D parameters aliasing the shard's slices of the nn::parameter
/// values and gradients (2-D for pieces of a matrix, so AdamW's decay_rule::matrices still sees
/// which parameters are matrices), so its state (AdamW's m and v, SGD's momentum buffer) is
/// allocated for the shard alone.
///
///   stage 1  gradients reduce-scattered (gradient_buckets, bucket_reduction::reduce_scatter:
///            bucket by bucket as backward finishes them, overlapped with the rest of
///            backward, each bucket staged in a buffer of its own: the whole gradient); each
///            rank updates its shard of the fp32 masters; the updated shards all-gathered
///            into every rank's parameter values. Per step each rank sends the gradient once
///            (reduce-scatter) and receives the parameters once (all-gather): the data
///            parallel all-reduce's volume, as the ZeRO paper counts it, not that plus the
///            all-gather.
///   stage 2  as stage 1 through two bucket-sized staging buffers used in turn
///            (bucket_reduction::reduce_scatter_staged): no buffer of the whole gradient; the
///            reduced shard lands in the parameters' own gradient buffers.
///   stage 0  the optimizer steps the whole parameters (the unsharded reference, same API;
///            the buckets all-reduce).
///
/// The sharded optimizer reads its shard of the gradients as the plan stage's buckets left
/// them: plan_stage::make_optimizer builds it with them, and a stage 1 or 2 optimizer refuses
/// to be built without reduce-scatter buckets over the same parameters and group.
///
/// In tessera the fp32 master IS the parameter value (layers cast their compute-precision copy
/// from it at each forward: train/parameter.hpp), so "parameters all-gathered" gathers the fp32
/// values; a separate master shard would duplicate the shard's values for nothing.
///
/// Results. The update is elementwise with the same scalar factors; stages 1 and 2 differ
/// from stage 0 only in how MPI orders the sum over ranks (MPI_Ireduce_scatter instead of
/// MPI_Iallreduce): bit-identical for D <= 2 (a sum of two floats commutes), else within the
/// fp32 rounding of a D-term sum per gradient (tests/parallel/test_mpi_zero.cpp states and
/// checks the bound). Stages 1 and 2 compute the same thing and differ only in memory.
///
/// Loss scaling: step(exec, scaler, world) unscales and checks this rank's gradient shard and
/// agrees across `world` (every rank of the mesh) whether all are finite: all skip, or all step.
/// Gradient clipping: grad_norm / clip_grad_norm all-reduce the squared norms of the shards.
///
/// Memory per rank (zero_memory; the ZeRO paper's Psi = N parameters; tessera trains fp32
/// masters that are the parameters, so its K counts only the optimizer's slots):
///
///                       tessera, bytes / parameter        paper (mixed precision, fp16 copies)
///   unsharded           4 + 4 + K                          2 + 2 + (4 + K)
///   stage 1             4 + 4 + K / D                      2 + 2 + (4 + K) / D
///   stage 2             4 + (4 + K) / D                    2 + (2 + 4 + K) / D
///
/// with K = 8 for AdamW (m, v: 16, 8 + 8/D, 4 + 12/D; the paper's 16, 4 + 12/D, 2 + 14/D), 4
/// for SGD with momentum (12, 8 + 4/D, 4 + 8/D; paper 12, 4 + 8/D, 2 + 10/D), 0 for plain SGD.
/// The terms are: the parameter values (whole on every rank), the reduced gradients kept for
/// the step (the gradient buckets' buffers at stages 0 and 1, whole; at stage 2 this rank's
/// shard of them, which lands in the layers' gradient buffers), and the optimizer state. Not
/// in the formula, and printed beside it: the layers' own gradient buffers
/// (nn::parameter::grad, 4 bytes per parameter at every stage: tessera's backward accumulates
/// into whole gradients) and the transient communication buffers of one step (stage 2's two
/// bucket-sized staging buffers, the all-gather's).

#include <tessera/parallel/communicator.hpp>
#include <tessera/parallel/data_parallel.hpp> // gradient_buckets, shard_layout
#include <tessera/train/detail/optimizer_state.hpp>
#include <tessera/train/grad_clip.hpp>
#include <tessera/train/parameter.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/tuple.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tessera::parallel {

/// Bytes one rank holds for training (see the file comment for what each term is).
struct zero_memory {
  int stage = 0;                        ///< the ZeRO stage
  int data = 1;                         ///< D
  std::int64_t parameters = 0;          ///< N, the elements of this rank's parameters
  std::size_t parameter_bytes = 0;      ///< the fp32 parameter values (masters), whole
  std::size_t gradient_bytes = 0;       ///< the reduced gradients kept for the step
  std::size_t optimizer_bytes = 0;      ///< the optimizer state (measured from its buffers)
  std::size_t local_gradient_bytes = 0; ///< the layers' gradient buffers (not in the formula)
  /// The host staging buffers of the reduce-scatter (stage 2: D x chunk floats) and the
  /// all-gather (stages 1 and 2: (D + 1) x chunk floats), allocated once (not in the formula).
  std::size_t staging_bytes = 0;

  /// Parameters + reduced gradients + optimizer state.
  std::size_t total() const noexcept { return parameter_bytes + gradient_bytes + optimizer_bytes; }
  /// total() / N.
  double per_parameter() const noexcept {
    return parameters > 0 ? double(total()) / double(parameters) : 0.0;
  }
};

/// The formula of the file comment: bytes per parameter at ZeRO `stage` over `data` ranks for an
/// optimizer keeping `state_bytes` (K) bytes per parameter, as tessera stores them (fp32
/// parameters that are the masters, fp32 gradients).
constexpr double zero_bytes_per_parameter(int stage, int data, int state_bytes) noexcept {
  const double d = data, k = state_bytes;
  return stage == 0 ? 4 + 4 + k : stage == 1 ? 4 + 4 + k / d : 4 + (4 + k) / d;
}
/// The ZeRO paper's formula (mixed precision: fp16 parameters and gradients, fp32 master and
/// state): 2 + 2 + (4 + K), 2 + 2 + (4 + K) / D, 2 + (2 + 4 + K) / D.
constexpr double zero_paper_bytes_per_parameter(int stage, int data, int state_bytes) noexcept {
  const double d = data, k = 4 + state_bytes;
  return stage == 0 ? 2 + 2 + k : stage == 1 ? 2 + 2 + k / d : 2 + (2 + k) / d;
}
/// The formulas as text: "4 + 4 + 8/D" (tessera) or, with paper = true, "2 + 2 + 12/D".
inline std::string zero_formula_text(int stage, int state_bytes, bool paper = false) {
  const std::string p = paper ? "2" : "4", g = paper ? "2" : "4";
  const int k = paper ? 4 + state_bytes : state_bytes;
  const std::string kk = std::to_string(k);
  if (stage == 0) return std::to_string((paper ? 4 : 8) + k);
  if (stage == 1) return p + " + " + g + " + " + kk + "/D";
  return p + " + " + std::to_string(k + (paper ? 2 : 4)) + "/D";
}

/// The optimizer of a ZeRO stage over a data-parallel group (see the file comment). Optimizer
/// is train::basic_adamw or train::basic_sgd (anything with step(exec, params) and a `state`
/// of train::detail::optimizer_state); C the group's communicator.
template <int Stage, class Optimizer, Communicator C>
class sharded_optimizer {
  static_assert(Stage >= 0 && Stage <= 2,
                "tessera::parallel::sharded_optimizer<Stage>: the ZeRO stage is 0, 1 or 2");

public:
  using optimizer_type = Optimizer;
  using state_type = std::remove_cvref_t<decltype(std::declval<Optimizer&>().state)>;
  using memory_space = typename state_type::memory_space;
  static constexpr int stage = Stage;
  /// The optimizer's fp32 buffers per parameter element (AdamW 2, SGD 1; SGD without
  /// momentum allocates none: memory() measures what was allocated).
  static constexpr int slot_count = int(state_type::slot_count);

  /// The gradient buckets a stage 1 or 2 optimizer takes its reduced gradient shard from.
  using buckets_type = gradient_buckets<C, memory_space, float>;

  /// Shards the parameters `params` (a parameter sequence, the same shapes on every rank of
  /// `group`) over `group`; `opt` is the optimizer with its hyper-parameters and no steps yet
  /// (value_error otherwise: its state would be the unsharded one). `buckets`: the gradient
  /// buckets that reduce these parameters' gradients over `group` (plan_stage::make_optimizer
  /// passes its own); stages 1 and 2 need them, reduce-scattering over the same N elements
  /// and D ranks (value_error otherwise: the shard would not be reduced). At stage 0 they
  /// only count in memory().
  template <class Params>
  sharded_optimizer(C group, const Params& params, Optimizer opt,
                    const buckets_type* buckets = nullptr)
      : group_(std::move(group)), opt_(std::move(opt)), buckets_(buckets) {
    if (opt_.state.created)
      throw value_error("tessera::parallel::sharded_optimizer: the optimizer has already "
                        "stepped or loaded a checkpoint; its state is not sharded. Give it "
                        "before the first step");
    std::int64_t n = 0;
    train::detail::for_each_parameter(params, [&](const auto& p, std::size_t) {
      using P = std::remove_cvref_t<decltype(p)>;
      static_assert(std::is_same_v<typename P::memory_space, memory_space>,
                    "tessera::parallel::sharded_optimizer: the parameters live in another "
                    "memory space than the optimizer's");
      whole_.push_back(
          {p.name, p.value.kokkos_view(), p.grad.kokkos_view(), n, P::extents_type::rank >= 2});
      n += p.size();
    });
    layout_ = {n, Stage == 0 ? 1 : group_.size()};
    if constexpr (Stage >= 1) {
      const bool fits = buckets_ && buckets_->reduction() != bucket_reduction::all_reduce &&
                        buckets_->layout().elements == n &&
                        buckets_->layout().ranks == group_.size();
      if (!fits)
        throw value_error(
            "tessera::parallel::sharded_optimizer<" + std::to_string(Stage) +
            ">: ZeRO stages 1 and 2 step the shard of the gradients that reduce-scattering "
            "gradient buckets over the same " +
            std::to_string(n) + " parameter elements and " + std::to_string(group_.size()) +
            " ranks left reduced; " +
            (buckets_ ? std::string("the buckets given ") +
                            (buckets_->reduction() == bucket_reduction::all_reduce
                                 ? "all-reduce"
                                 : "cover " + std::to_string(buckets_->layout().elements) +
                                       " elements over " +
                                       std::to_string(buckets_->layout().ranks) + " ranks")
                      : std::string("none were given")) +
            " (plan_stage::make_optimizer builds it with its own)");
    }
    const int r = Stage == 0 ? 0 : group_.rank();
    const std::int64_t lo = layout_.begin(r), hi = layout_.end(r);
    auto& vectors = boost::hana::at_c<0>(pieces_);
    auto& matrices = boost::hana::at_c<1>(pieces_);
    for (const slot& s : whole_) {
      const std::int64_t a = std::max(lo, s.offset),
                         b = std::min(hi, s.offset + std::int64_t(s.value.extent(0)));
      if (a >= b) continue;
      const auto range = Kokkos::make_pair(std::size_t(a - s.offset), std::size_t(b - s.offset));
      const view v = Kokkos::subview(s.value, range), g = Kokkos::subview(s.grad, range);
      const std::string name =
          s.name + "[" + std::to_string(a - s.offset) + ":" + std::to_string(b - s.offset) + "]";
      if (s.matrix) {
        matrix_piece m;
        m.name = name;
        m.value = typename matrix_piece::tensor_type(v, extents<1, dyn>(b - a));
        m.grad = typename matrix_piece::tensor_type(g, extents<1, dyn>(b - a));
        matrices.push_back(std::move(m));
      } else {
        vector_piece m;
        m.name = name;
        m.value = typename vector_piece::tensor_type(v, extents<dyn>(b - a));
        m.grad = typename vector_piece::tensor_type(g, extents<dyn>(b - a));
        vectors.push_back(std::move(m));
      }
    }
    // The all-gather's staging buffers, allocated once; their padding (past the last
    // element, chunk x D > N) is never written and stays zero.
    const std::size_t chunk = std::size_t(layout_.chunk()), d = std::size_t(layout_.ranks);
    if constexpr (Stage >= 1) {
      mine_.assign(chunk, 0.f);
      all_.assign(chunk * d, 0.f);
    }
  }

  /// The wrapped optimizer (hyper-parameters, set_lr, steps(); its state is this rank's shard).
  Optimizer& optimizer() noexcept { return opt_; }
  const Optimizer& optimizer() const noexcept { return opt_; }
  const C& group() const noexcept { return group_; }
  /// The split of the N parameter elements over the group (one shard of all at stage 0).
  const shard_layout& layout() const noexcept { return layout_; }
  /// This rank's slices of the parameters: what the optimizer steps (a parameter sequence).
  const auto& pieces() const noexcept { return pieces_; }
  std::int64_t steps() const noexcept { return opt_.steps(); }
  void set_lr(float lr) { opt_.set_lr(lr); }

  /// One optimizer step: the optimizer on this rank's shard (its gradients reduced by the
  /// buckets), the updated shards all-gathered into every rank's parameter values.
  template <class Exec>
  void step(const Exec& exec) {
    opt_.step(exec, pieces_);
    gather(exec);
  }

  /// The mixed-precision step (train::step's contract) with the finite check agreed across
  /// `world` (every rank of the mesh: tensor and pipeline ranks hold other gradients): unscale
  /// this rank's gradient shard and check it, all ranks step or all skip, then
  /// scaler.update(finite). Returns whether the step was applied.
  template <class Exec, class Scaler, Communicator W>
  bool step(const Exec& exec, Scaler& scaler, W& world) {
    const bool finite = world.all_of(scaler.unscale_and_check(exec, pieces_));
    if (finite) {
      opt_.step(exec, pieces_);
      gather(exec);
    }
    scaler.update(finite);
    return finite;
  }

  /// The L2 norm of the group-averaged gradients of this rank's parameters: the shards'
  /// squared norms (double) all-reduced over the group, carried
  /// as two floats (hi + lo) so the sum keeps ~48 bits. At stage 0 the local norm.
  template <class Exec>
  double grad_norm(const Exec& exec) {
    const double local_norm = train::grad_norm(exec, pieces_);
    if constexpr (Stage == 0) {
      return local_norm;
    } else {
      const double sq = local_norm * local_norm;
      float parts[2] = {float(sq), 0.f};
      parts[1] = float(sq - double(parts[0]));
      group_.all_reduce_sum(parts, 2);
      return std::sqrt(double(parts[0]) + double(parts[1]));
    }
  }

  /// train::clip_grad_norm over the whole (sharded) gradient: the global norm; if finite and
  /// above max_norm, this rank's shard scaled by max_norm / (norm + 1e-6). Returns the norm.
  template <class Exec>
  double clip_grad_norm(const Exec& exec, double max_norm) {
    const double norm = grad_norm(exec);
    if (std::isfinite(norm) && norm > max_norm)
      train::scale_grads(exec, pieces_, float(max_norm / (norm + 1e-6)));
    return norm;
  }

  /// Bytes this rank holds (zero_memory): the reduced gradients are the buckets' buffers at
  /// stages 0 and 1 (none counted at stage 0 without buckets), this rank's shard at stage 2
  /// (the buckets' two staging buffers count as transient).
  zero_memory memory() const {
    zero_memory m;
    m.stage = Stage;
    m.data = group_.size();
    m.parameters = layout_.elements;
    for (const slot& s : whole_) {
      m.parameter_bytes += s.value.extent(0) * sizeof(float);
      m.local_gradient_bytes += s.grad.extent(0) * sizeof(float);
    }
    const std::size_t bucket_bytes = buckets_ ? buckets_->buffer_bytes() : 0;
    m.gradient_bytes =
        Stage == 2 ? std::size_t(layout_.size(group_.rank())) * sizeof(float) : bucket_bytes;
    m.staging_bytes =
        (mine_.size() + all_.size()) * sizeof(float) + (Stage == 2 ? bucket_bytes : 0);
    for (const auto& slot_buffers : opt_.state.slots)
      for (const auto& b : slot_buffers) m.optimizer_bytes += b.extent(0) * sizeof(float);
    return m;
  }

private:
  using view = Kokkos::View<float*, memory_space>;
  using host_unmanaged =
      Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using vector_piece = train::parameter<extents<dyn>, memory_space>;
  using matrix_piece = train::parameter<extents<1, dyn>, memory_space>;

  struct slot {
    std::string name;
    view value, grad;
    std::int64_t offset; // of its first element in the flattened sequence
    bool matrix;         // rank >= 2 (AdamW's decay_rule::matrices)
  };

  static host_unmanaged host_at(float* p, std::int64_t n) {
    return host_unmanaged(p, std::size_t(n));
  }
  static Kokkos::pair<std::size_t, std::size_t> local(const slot& s, std::int64_t a,
                                                      std::int64_t b) {
    return {std::size_t(a - s.offset), std::size_t(b - s.offset)};
  }

  /// All-gathers the updated shards of the parameter values (stages 1 and 2).
  template <class Exec>
  void gather(const Exec& exec) {
    if constexpr (Stage >= 1) {
      const int r = group_.rank();
      const std::int64_t chunk = layout_.chunk(), lo = layout_.begin(r), hi = layout_.end(r);
      float* mine = mine_.data(); // chunk floats (allocated once)
      float* all = all_.data();   // d x chunk floats
      for (const slot& s : whole_) {
        const std::int64_t a = std::max(lo, s.offset),
                           b = std::min(hi, s.offset + std::int64_t(s.value.extent(0)));
        if (a < b)
          Kokkos::deep_copy(exec, host_at(mine + (a - lo), b - a),
                            Kokkos::subview(s.value, local(s, a, b)));
      }
      exec.fence();
      group_.all_gather(mine, all, chunk);
      for (const slot& s : whole_)
        layout_.for_each_owner(s.offset, s.offset + std::int64_t(s.value.extent(0)),
                               [&](int q, std::int64_t a, std::int64_t b) {
                                 if (q != r)
                                   Kokkos::deep_copy(
                                       exec, Kokkos::subview(s.value, local(s, a, b)),
                                       host_at(all + q * chunk + (a - layout_.begin(q)), b - a));
                               });
      exec.fence();
    } else {
      (void)exec;
    }
  }

  C group_;
  Optimizer opt_;
  std::vector<slot> whole_;
  shard_layout layout_;
  boost::hana::tuple<std::vector<vector_piece>, std::vector<matrix_piece>> pieces_;
  const buckets_type* buckets_; // the plan stage's; stages 1 and 2 read their reduced shard
  // Host staging of the all-gather (stages 1, 2): members sized once in the constructor, not
  // allocated per step.
  std::vector<float> mine_, all_;
};

} // namespace tessera::parallel
