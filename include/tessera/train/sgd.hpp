#pragma once
/// \file train/sgd.hpp
/// Stochastic gradient descent with momentum, Nesterov momentum and (L2) weight decay, with
/// PyTorch's torch.optim.SGD semantics, updating fp32 master weights in one fused kernel per
/// parameter on the given execution space.
///
///   tessera::train::sgd opt{.lr = 0.05f, .momentum = 0.9f};
///   opt.step(exec, model.parameters());  // after backward has written the gradients
///
/// Per element, with g the gradient and w the master weight (all fp32):
///
///     g = g + weight_decay * w                         if weight_decay != 0
///     b = g                                            first step (buffer created from g)
///     b = momentum * b + (1 - dampening) * g           later steps
///     g = nesterov ? g + momentum * b : b              if momentum != 0
///     w = w - lr * g
///
/// State (fp32, created at the first step, sized from the parameters): the momentum buffers
/// (only when momentum != 0) and the number of completed steps. A step the caller skips (see
/// train::step) touches none of it.

#include <tessera/train/detail/optimizer_state.hpp>

#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace tessera::train {

/// SGD over parameters in MemorySpace; `train::sgd` is the one for the default space.
/// An aggregate: set the hyper-parameters with designated initializers, in this order.
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct basic_sgd {
  float lr = 0.01f;         ///< learning rate (finite, >= 0)
  float momentum = 0.f;     ///< momentum factor (finite, >= 0; 0 keeps no buffer)
  bool nesterov = false;    ///< Nesterov momentum (needs momentum > 0 and dampening 0)
  float weight_decay = 0.f; ///< L2 penalty added to the gradient (finite, >= 0)
  float dampening = 0.f;    ///< dampening of the gradient in the momentum update, in [0, 1]

  /// Optimizer state: step counter and momentum buffers. Read by checkpoints; not to be
  /// modified by hand.
  detail::optimizer_state<MemorySpace, 1> state{};

  static constexpr const char* kind = "sgd";
  static constexpr std::array<const char*, 1> slot_names = {"momentum_buffer"};

  /// Completed steps.
  std::int64_t steps() const noexcept { return state.step; }

  /// Throws value_error naming the hyper-parameter, its value and the rule unless every
  /// hyper-parameter is valid: lr, momentum and weight_decay finite and >= 0 (NaN, +-inf and
  /// negative values refused), dampening in [0, 1], Nesterov only with momentum > 0 and
  /// dampening 0. step() calls it before touching anything; call it after setting fields.
  void validate() const { check_hyperparameters("tessera::train::sgd"); }

  /// Sets the learning rate (for schedules); throws value_error, changing nothing, unless it is
  /// finite and >= 0.
  void set_lr(float new_lr) {
    const float old = std::exchange(lr, new_lr);
    try {
      check_hyperparameters("tessera::train::sgd::set_lr");
    } catch (...) {
      lr = old;
      throw;
    }
  }

  /// One update of every parameter from its gradient: one kernel per parameter on exec, then
  /// one fence. Throws value_error for invalid hyper-parameters (validate()) and shape_error if
  /// params are not the parameters of the first step (count, names, sizes), changing nothing.
  template <class Exec, class Params>
  void step(const Exec& exec, const Params& params) {
    detail::require_accessible<Exec, MemorySpace>();
    check_hyperparameters("tessera::train::sgd::step");
    state.bind("tessera::train::sgd::step", params);
    const bool use_momentum = momentum != 0.f;
    const bool first = use_momentum && state.ensure_slot(0, slot_names[0]);
    const float lr_ = lr, mom = momentum, wd = weight_decay, damp1 = 1.f - dampening;
    const bool nest = nesterov;
    detail::for_each_parameter(params, [&](const auto& p, std::size_t k) {
      static_assert(Kokkos::SpaceAccessibility<
                        Exec, typename std::remove_cvref_t<decltype(p)>::memory_space>::accessible,
                    "tessera::train::sgd::step: the execution space cannot access the "
                    "parameters' memory space.");
      float* w = p.value.data();
      const float* gr = p.grad.data();
      float* buf = use_momentum ? state.slots[0][k].data() : nullptr;
      // One kernel per combination of the step's switches (weight decay, momentum, its first
      // step, Nesterov): the element loop carries no branch, and on host spaces it runs over
      // chunks of 4096 with its pointers in locals, so it vectorises (stores to w and buf cannot
      // alias a local).
      const auto launch = [&](auto decay, auto with_buffer, auto first_step, auto nesterov_) {
        constexpr bool WD = decltype(decay)::value, BUF = decltype(with_buffer)::value,
                       FIRST = decltype(first_step)::value, NEST = decltype(nesterov_)::value;
        const auto update = KOKKOS_LAMBDA(float* wl, const float* gl, float* bl, const index_t i) {
          float g = gl[i];
          if constexpr (WD) g = g + wd * wl[i];
          if constexpr (BUF) {
            const float b = FIRST ? g : mom * bl[i] + damp1 * g;
            bl[i] = b;
            g = NEST ? g + mom * b : b;
          }
          wl[i] = wl[i] - lr_ * g;
        };
        const index_t n = p.size();
        if constexpr (tessera::detail::is_host_exec_v<Exec>) {
          constexpr index_t chunk = 4096;
          Kokkos::parallel_for("tessera::train::sgd",
                               Kokkos::RangePolicy<Exec>(exec, 0, (n + chunk - 1) / chunk),
                               [=](const index_t c) {
                                 float* wl = w;
                                 const float* gl = gr;
                                 float* bl = buf;
                                 const index_t end = n - c * chunk < chunk ? n : c * chunk + chunk;
                                 for (index_t i = c * chunk; i < end; ++i) update(wl, gl, bl, i);
                               });
        } else {
          Kokkos::parallel_for(
              "tessera::train::sgd", Kokkos::RangePolicy<Exec>(exec, 0, n),
              KOKKOS_LAMBDA(const index_t i) { update(w, gr, buf, i); });
        }
      };
      using yes = std::true_type;
      using no = std::false_type;
      const auto with_decay = [&](auto decay) {
        if (!buf)
          launch(decay, no{}, no{}, no{});
        else if (first)
          nest ? launch(decay, yes{}, yes{}, yes{}) : launch(decay, yes{}, yes{}, no{});
        else
          nest ? launch(decay, yes{}, no{}, yes{}) : launch(decay, yes{}, no{}, no{});
      };
      wd != 0.f ? with_decay(yes{}) : with_decay(no{});
    });
    exec.fence();
    ++state.step;
  }

private:
  void check_hyperparameters(const char* who) const {
    const auto bad = [who](const std::string& what) {
      throw value_error(std::string(who) + ": " + what);
    };
    // finite and >= 0: NaN fails the comparison, +inf the upper bound
    const auto ok = [](float v) { return v >= 0.f && v <= std::numeric_limits<float>::max(); };
    if (!ok(lr)) bad("lr must be finite and >= 0, got " + std::to_string(lr));
    if (!ok(momentum)) bad("momentum must be finite and >= 0, got " + std::to_string(momentum));
    if (!ok(weight_decay))
      bad("weight_decay must be finite and >= 0, got " + std::to_string(weight_decay));
    if (!(dampening >= 0.f && dampening <= 1.f))
      bad("dampening must be in [0, 1], got " + std::to_string(dampening));
    if (nesterov && (momentum <= 0.f || dampening != 0.f))
      bad("Nesterov momentum needs momentum > 0 and dampening 0 (PyTorch's rule), got momentum " +
          std::to_string(momentum) + " and dampening " + std::to_string(dampening));
  }
};

/// SGD on the default execution space's memory space (where nn::parameter lives by default).
using sgd = basic_sgd<>;

} // namespace tessera::train
