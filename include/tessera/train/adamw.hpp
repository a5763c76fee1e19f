#pragma once
/// \file train/adamw.hpp
/// AdamW (Loshchilov & Hutter, "Decoupled weight decay regularization", ICLR 2019) with
/// PyTorch's torch.optim.AdamW semantics: bias-corrected moments and weight decay applied to
/// the weights, not added to the gradient. One fused kernel per parameter (xsimd batches on
/// host spaces).
///
///   tessera::train::adamw opt{.lr = 1e-3f, .weight_decay = 0.01f};
///   opt.step(exec, model.parameters());
///
/// At step t = 1, 2, ... per element (fp32 state m, v; scalar factors computed on the host in
/// double and rounded to float once, as PyTorch does):
///
///     w = w * (1 - lr * weight_decay)
///     m = beta1 * m + (1 - beta1) * g
///     v = beta2 * v + (1 - beta2) * g * g
///     w = w - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
///
/// State (created at the first step, zero): m and v per parameter, and the step counter t.
///
/// Weight decay applies to every parameter (`decay_on = decay_rule::all`, the default and
/// PyTorch's) or only to matrices (`decay_rule::matrices`: parameters of rank >= 2 — Linear
/// weights, embeddings, convolution kernels — and not biases or normalisation gains, the usual
/// GPT recipe); the others then step with decay factor 1 (plain Adam).

#include <tessera/config/kokkos_compat.hpp> // is_host_exec_v
#include <tessera/simd/lanes.hpp>           // xsimd, host passes only
#include <tessera/train/detail/optimizer_state.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace tessera::train {

/// Which parameters AdamW's weight decay applies to.
enum class decay_rule {
  all,     ///< every parameter (PyTorch's default)
  matrices ///< parameters of rank >= 2 only (not biases, LayerNorm gamma / beta)
};

/// AdamW over parameters in MemorySpace; `train::adamw` is the one for the default space.
/// An aggregate: set the hyper-parameters with designated initializers, in this order.
/// Defaults are PyTorch's (lr 1e-3, betas 0.9 / 0.999, eps 1e-8, weight decay 1e-2).
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct basic_adamw {
  float lr = 1e-3f;           ///< learning rate (finite, >= 0)
  float beta1 = 0.9f;         ///< decay of the first moment, in [0, 1)
  float beta2 = 0.999f;       ///< decay of the second moment, in [0, 1)
  float eps = 1e-8f;          ///< added to the denominator (finite, > 0)
  float weight_decay = 1e-2f; ///< decoupled weight decay (finite, >= 0; lr * weight_decay <= 1)
  decay_rule decay_on = decay_rule::all; ///< which parameters weight_decay applies to

  /// Optimizer state: step counter, first and second moments. Read by checkpoints; not to be
  /// modified by hand.
  detail::optimizer_state<MemorySpace, 2> state{};

  static constexpr const char* kind = "adamw";
  static constexpr std::array<const char*, 2> slot_names = {"exp_avg", "exp_avg_sq"};

  /// Completed steps.
  std::int64_t steps() const noexcept { return state.step; }

  /// Throws value_error naming the hyper-parameter, its value and the rule unless: lr and
  /// weight_decay are finite and >= 0, lr * weight_decay <= 1 (else the decay factor
  /// 1 - lr * weight_decay flips the weights' sign), beta1 and beta2 in [0, 1), eps finite and
  /// > 0 (eps = 0 gives 0 / 0 = NaN for a parameter whose gradients are all zero). NaN and
  /// +-inf are refused everywhere. step() calls it before touching anything.
  void validate() const { check_hyperparameters("tessera::train::adamw"); }

  /// Sets the learning rate (for schedules); throws value_error, changing nothing, unless the
  /// hyper-parameters stay valid with it.
  void set_lr(float new_lr) {
    const float old = std::exchange(lr, new_lr);
    try {
      check_hyperparameters("tessera::train::adamw::set_lr");
    } catch (...) {
      lr = old;
      throw;
    }
  }

  /// One update of every parameter: one kernel per parameter on exec, then one fence. Throws
  /// value_error for invalid hyper-parameters (validate()) and shape_error if params are not
  /// the parameters of the first step, changing nothing.
  template <class Exec, class Params>
  void step(const Exec& exec, const Params& params) {
    detail::require_accessible<Exec, MemorySpace>();
    check_hyperparameters("tessera::train::adamw::step");
    state.bind("tessera::train::adamw::step", params);
    state.ensure_slot(0, slot_names[0]);
    state.ensure_slot(1, slot_names[1]);
    const double t = static_cast<double>(state.step + 1);
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
    const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
    const float step_size = static_cast<float>(lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const float b1 = beta1, b2 = beta2, one_b1 = 1.f - beta1, one_b2 = 1.f - beta2, e = eps;
    detail::for_each_parameter(params, [&](const auto& p, std::size_t k) {
      static_assert(Kokkos::SpaceAccessibility<
                        Exec, typename std::remove_cvref_t<decltype(p)>::memory_space>::accessible,
                    "tessera::train::adamw::step: the execution space cannot access the "
                    "parameters' memory space.");
      using P = std::remove_cvref_t<decltype(p)>;
      const bool decays = decay_on == decay_rule::all || P::extents_type::rank >= 2;
      const float dec = decays ? decay : 1.f;
      float* w = p.value.data();
      const float* gr = p.grad.data();
      float* m = state.slots[0][k].data();
      float* v = state.slots[1][k].data();
#if !TESSERA_DEVICE_PASS
      if constexpr (tessera::detail::is_host_exec_v<Exec> && tessera::detail::simd::available) {
        // Host: xsimd batches (a scalar sqrtf keeps errno and does not vectorise), chunks of
        // 4096 elements in parallel; the last partial batch goes through the same batch code
        // (padded), so every element gets the same instructions wherever it sits (a ZeRO shard
        // steps its elements exactly as the whole parameter would).
        using V = xsimd::batch<float, xsimd::default_arch>;
        constexpr index_t wd = index_t(V::size), chunk = 4096;
        const index_t n = p.size();
        const auto update = [=](const V& g, V& mv, V& vv, V& wv) {
          mv = xsimd::fma(V(b1), mv, V(one_b1) * g);
          vv = xsimd::fma(V(b2), vv, V(one_b2) * g * g);
          const V denom = xsimd::sqrt(vv) / V(bc2_sqrt) + V(e);
          wv = wv * V(dec) - V(step_size) * mv / denom;
        };
        Kokkos::parallel_for(
            "tessera::train::adamw", Kokkos::RangePolicy<Exec>(exec, 0, (n + chunk - 1) / chunk),
            [=](const index_t c) {
              const index_t end = n - c * chunk < chunk ? n : (c + 1) * chunk;
              index_t i = c * chunk;
              for (; i + wd <= end; i += wd) {
                V mv = V::load_unaligned(m + i), vv = V::load_unaligned(v + i),
                  wv = V::load_unaligned(w + i);
                update(V::load_unaligned(gr + i), mv, vv, wv);
                mv.store_unaligned(m + i);
                vv.store_unaligned(v + i);
                wv.store_unaligned(w + i);
              }
              if (i < end) {
                alignas(64) float tg[wd] = {}, tm[wd] = {}, tv[wd] = {}, tw[wd] = {};
                for (index_t l = 0; i + l < end; ++l) {
                  tg[l] = gr[i + l];
                  tm[l] = m[i + l];
                  tv[l] = v[i + l];
                  tw[l] = w[i + l];
                }
                V mv = V::load_aligned(tm), vv = V::load_aligned(tv), wv = V::load_aligned(tw);
                update(V::load_aligned(tg), mv, vv, wv);
                mv.store_aligned(tm);
                vv.store_aligned(tv);
                wv.store_aligned(tw);
                for (index_t l = 0; i + l < end; ++l) {
                  m[i + l] = tm[l];
                  v[i + l] = tv[l];
                  w[i + l] = tw[l];
                }
              }
            });
        return;
      }
#endif
      Kokkos::parallel_for(
          "tessera::train::adamw", Kokkos::RangePolicy<Exec>(exec, 0, p.size()),
          KOKKOS_LAMBDA(const index_t i) {
            const float g = gr[i];
            const float mi = b1 * m[i] + one_b1 * g;
            const float vi = b2 * v[i] + one_b2 * g * g;
            m[i] = mi;
            v[i] = vi;
            const float denom = ::sqrtf(vi) / bc2_sqrt + e;
            w[i] = w[i] * dec - step_size * mi / denom;
          });
    });
    exec.fence();
    ++state.step;
  }

private:
  void check_hyperparameters(const char* who) const {
    const auto bad = [who](const std::string& what) {
      throw value_error(std::string(who) + ": " + what);
    };
    constexpr float fmax = std::numeric_limits<float>::max();
    if (!(lr >= 0.f && lr <= fmax)) bad("lr must be finite and >= 0, got " + std::to_string(lr));
    if (!(beta1 >= 0.f && beta1 < 1.f))
      bad("beta1 must be in [0, 1), got " + std::to_string(beta1));
    if (!(beta2 >= 0.f && beta2 < 1.f))
      bad("beta2 must be in [0, 1), got " + std::to_string(beta2));
    if (!(eps > 0.f && eps <= fmax)) bad("eps must be finite and > 0, got " + std::to_string(eps));
    if (!(weight_decay >= 0.f && weight_decay <= fmax))
      bad("weight_decay must be finite and >= 0, got " + std::to_string(weight_decay));
    if (!(static_cast<double>(lr) * weight_decay <= 1.0))
      bad("lr * weight_decay must be <= 1 (the decay factor 1 - lr * weight_decay must not be "
          "negative), got lr " +
          std::to_string(lr) + " and weight_decay " + std::to_string(weight_decay));
  }
};

/// AdamW on the default execution space's memory space.
using adamw = basic_adamw<>;

} // namespace tessera::train
