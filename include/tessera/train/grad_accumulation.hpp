#pragma once
/// \file train/grad_accumulation.hpp
/// Gradient accumulation over micro-batches: a batch too large for one pass is split into k
/// micro-batches of equal size; the optimizer steps once on the mean of their gradients.
///
///   tessera::train::grad_accumulator acc;
///   for (int m = 0; m < k; ++m) {
///     ... forward / backward of micro-batch m (writes p.grad) ...
///     acc.accumulate(exec, model.parameters());   // sums += grad
///   }
///   acc.finish(exec, model.parameters());          // grad = sums / k; sums cleared
///   tessera::train::clipped_step(exec, opt, scaler, model.parameters(), 1.0);
///
/// Layers' backward passes overwrite the parameter gradients, so the accumulator keeps its own
/// fp32 sum per parameter (created at the first accumulate, bound to those parameters' names and
/// sizes like an optimizer state). With every micro-batch loss a mean over its own samples and
/// equal micro-batch sizes, the mean of the k gradients is the gradient of the whole batch's mean
/// loss, up to fp32 rounding. Loss scaling composes: the sums of scaled gradients are divided by k
/// before the scaler unscales and checks them; a non-finite micro-batch gradient makes the sum
/// non-finite and the scaler then skips the step.
///
/// The state (micro-batches summed so far and, when that is > 0, the sums) is saved by
/// train/checkpoint.hpp (records accum/...), so a run may be checkpointed between micro-batches.

#include <tessera/train/detail/optimizer_state.hpp>

#include <string>

namespace tessera::train {

template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class basic_grad_accumulator {
public:
  using memory_space = MemorySpace;
  using state_type = detail::optimizer_state<MemorySpace, 1>;

  /// Micro-batches summed since the last finish().
  std::int64_t count() const noexcept { return count_; }

  /// sums += grad for every parameter (fp32). Throws shape_error, changing nothing, if params
  /// are not the parameters of the first call (count, names, sizes).
  template <class Exec, class Params>
  void accumulate(const Exec& exec, const Params& params) {
    detail::require_accessible<Exec, MemorySpace>();
    state_.bind("tessera::train::grad_accumulator::accumulate", params);
    state_.ensure_slot(0, "grad_sum");
    detail::for_each_parameter(params, [&](const auto& p, std::size_t k) {
      const float* g = p.grad.data();
      float* s = state_.slots[0][k].data();
      Kokkos::parallel_for(
          "tessera::train::grad_accumulator::accumulate",
          Kokkos::RangePolicy<Exec>(exec, 0, p.size()),
          KOKKOS_LAMBDA(const index_t i) { s[i] += g[i]; });
    });
    exec.fence();
    ++count_;
  }

  /// grad = sums / count() (an fp32 division per element) for every parameter, then clears the
  /// sums and the count. Throws value_error if nothing was accumulated, shape_error for other
  /// parameters; changes nothing then.
  template <class Exec, class Params>
  void finish(const Exec& exec, const Params& params) {
    detail::require_accessible<Exec, MemorySpace>();
    if (count_ < 1)
      throw value_error("tessera::train::grad_accumulator::finish: no micro-batch was "
                        "accumulated since the last finish (call accumulate after each "
                        "micro-batch's backward)");
    state_.check_same("tessera::train::grad_accumulator::finish", params);
    const float n = static_cast<float>(count_);
    detail::for_each_parameter(params, [&](const auto& p, std::size_t k) {
      float* g = p.grad.data();
      float* s = state_.slots[0][k].data();
      Kokkos::parallel_for(
          "tessera::train::grad_accumulator::finish", Kokkos::RangePolicy<Exec>(exec, 0, p.size()),
          KOKKOS_LAMBDA(const index_t i) {
            g[i] = s[i] / n;
            s[i] = 0.f;
          });
    });
    exec.fence();
    count_ = 0;
  }

  /// Forgets the sums (zeroes them) and the count; the parameter binding stays.
  void reset() {
    for (auto& s : state_.slots[0]) Kokkos::deep_copy(s, 0.f);
    count_ = 0;
  }

  /// The state, for checkpoints: not to be modified by hand.
  const state_type& state() const noexcept { return state_; }
  /// Replaces the state (checkpoints): `sums` empty (count 0) or one buffer per parameter.
  void restore(state_type s, std::int64_t count) {
    if (count < 0 || (count > 0 && s.slots[0].size() != s.names.size()))
      throw value_error("tessera::train::grad_accumulator::restore: count " +
                        std::to_string(count) + " with " + std::to_string(s.slots[0].size()) +
                        " sums for " + std::to_string(s.names.size()) + " parameters");
    state_ = std::move(s);
    count_ = count;
  }

private:
  state_type state_{};
  std::int64_t count_ = 0;
};

/// The accumulator for parameters in the default memory space.
using grad_accumulator = basic_grad_accumulator<>;

template <class T>
struct is_grad_accumulator : std::false_type {};
template <class M>
struct is_grad_accumulator<basic_grad_accumulator<M>> : std::true_type {};

} // namespace tessera::train
