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
#include <vector>

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

  /// One update of every parameter from its gradient, then one fence: on a host space one
  /// kernel for all parameters (chunks of 4096 elements; one parallel region per step), on
  /// others one kernel per parameter. Throws value_error for invalid hyper-parameters
  /// (validate()) and shape_error if params are not the parameters of the first step (count,
  /// names, sizes), changing nothing.
  template <class Exec, class Params>
  void step(const Exec& exec, const Params& params) {
    detail::require_accessible<Exec, MemorySpace>();
    check_hyperparameters("tessera::train::sgd::step");
    state.bind("tessera::train::sgd::step", params);
    const bool use_momentum = momentum != 0.f;
    const bool first = use_momentum && state.ensure_slot(0, slot_names[0]);
    const update_args a{.lr = lr, .mom = momentum, .wd = weight_decay, .damp1 = 1.f - dampening};
    const bool nest = nesterov;
    std::vector<span> spans;
    detail::for_each_parameter(params, [&](const auto& p, std::size_t k) {
      static_assert(Kokkos::SpaceAccessibility<
                        Exec, typename std::remove_cvref_t<decltype(p)>::memory_space>::accessible,
                    "tessera::train::sgd::step: the execution space cannot access the "
                    "parameters' memory space.");
      spans.push_back({p.value.data(), p.grad.data(),
                       use_momentum ? state.slots[0][k].data() : nullptr, p.size()});
    });
    // One kernel per combination of the step's switches (weight decay, momentum, its first
    // step, Nesterov): the element loop carries no branch.
    using yes = std::true_type;
    using no = std::false_type;
    const auto with_decay = [&](auto decay) {
      if (!use_momentum)
        launch(exec, spans, a, decay, no{}, no{}, no{});
      else if (first)
        nest ? launch(exec, spans, a, decay, yes{}, yes{}, yes{})
             : launch(exec, spans, a, decay, yes{}, yes{}, no{});
      else
        nest ? launch(exec, spans, a, decay, yes{}, no{}, yes{})
             : launch(exec, spans, a, decay, yes{}, no{}, no{});
    };
    weight_decay != 0.f ? with_decay(yes{}) : with_decay(no{});
    exec.fence();
    ++state.step;
  }

private:
  struct update_args {
    float lr, mom, wd, damp1;
  };
  /// One parameter's memory: value, gradient, momentum buffer (or null), size.
  struct span {
    float* w;
    const float* g;
    float* b;
    index_t n;
  };

  template <bool WD, bool BUF, bool FIRST, bool NEST>
  static TESSERA_INLINE void update(const update_args& a, float* w, const float* gr, float* buf,
                                    const index_t i) {
    float g = gr[i];
    if constexpr (WD) g = g + a.wd * w[i];
    if constexpr (BUF) {
      const float b = FIRST ? g : a.mom * buf[i] + a.damp1 * g;
      buf[i] = b;
      g = NEST ? g + a.mom * b : b;
    }
    w[i] = w[i] - a.lr * g;
  }

  template <class Exec, class WD, class BUF, class FIRST, class NEST>
  static void launch(const Exec& exec, const std::vector<span>& spans, const update_args a, WD, BUF,
                     FIRST, NEST) {
    constexpr bool wd = WD::value, with_buf = BUF::value, first = FIRST::value, nest = NEST::value;
    if constexpr (tessera::detail::is_host_exec_v<Exec>) {
      // Chunks of 4096 elements of all parameters, one work item each, the pointers in locals
      // (the loop vectorises: stores to w and buf cannot alias a local).
      constexpr index_t chunk = 4096;
      std::vector<index_t> starts; // the first chunk of each parameter, then the total
      index_t chunks = 0;
      for (const span& sp : spans) {
        starts.push_back(chunks);
        chunks += (sp.n + chunk - 1) / chunk;
      }
      starts.push_back(chunks);
      const span* sps = spans.data();
      const index_t* st = starts.data();
      const auto count = static_cast<index_t>(spans.size());
      Kokkos::parallel_for("tessera::train::sgd", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
                           [=](const index_t c) {
                             index_t k = 0;
                             while (k + 1 < count && st[k + 1] <= c) ++k;
                             const span sp = sps[k];
                             float* w = sp.w;
                             const float* g = sp.g;
                             float* b = sp.b;
                             const index_t begin = (c - st[k]) * chunk;
                             const index_t end = sp.n - begin < chunk ? sp.n : begin + chunk;
                             for (index_t i = begin; i < end; ++i)
                               update<wd, with_buf, first, nest>(a, w, g, b, i);
                           });
      exec.fence(); // starts lives until the kernel is done
    } else {
      for (const span& sp : spans) {
        float* w = sp.w;
        const float* g = sp.g;
        float* b = sp.b;
        Kokkos::parallel_for(
            "tessera::train::sgd", Kokkos::RangePolicy<Exec>(exec, 0, sp.n),
            KOKKOS_LAMBDA(const index_t i) { update<wd, with_buf, first, nest>(a, w, g, b, i); });
      }
    }
  }

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
