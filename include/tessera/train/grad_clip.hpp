#pragma once
/// \file train/grad_clip.hpp
/// Global-norm gradient clipping over a model's parameters (torch.nn.utils.clip_grad_norm_).
///
///   const double norm = tessera::train::clip_grad_norm(exec, model.parameters(), 1.0);
///
/// The norm ||g||_2 over every element of every parameter's gradient is accumulated in double
/// (squares of fp32 values summed in double: exact products, rounding ~1e-16 relative per
/// addition, no overflow for any finite fp32 gradient). If it exceeds max_norm, every gradient
/// is multiplied by the float max_norm / (norm + 1e-6) (PyTorch's coefficient).
///
/// ## Non-finite gradients
/// If some gradient is inf or NaN the norm is inf or NaN: clip_grad_norm then returns it and
/// leaves every gradient unchanged (PyTorch instead multiplies by a NaN coefficient, which turns
/// every gradient into NaN). The step must then be skipped: `train::clipped_step` (below)
/// unscales and checks with the loss scaler first, skips the step and backs the scale off as
/// train::step does, and only clips gradients that are all finite — a finite fp32 gradient set
/// always has a finite double norm, so a clipped step never sees a non-finite norm. Whoever
/// calls clip_grad_norm alone must test std::isfinite on its result before the optimizer step.

#include <tessera/train/step.hpp>

#include <boost/hana/length.hpp>

#include <cmath>
#include <limits>
#include <string>

namespace tessera::train {

/// The global L2 norm of the gradients of params, in double (one reduction per parameter).
template <class Exec, class Params>
double grad_norm(const Exec& exec, const Params& params) {
  double sum = 0.0;
  detail::for_each_parameter(params, [&](const auto& p, std::size_t) {
    static_assert(Kokkos::SpaceAccessibility<
                      Exec, typename std::remove_cvref_t<decltype(p)>::memory_space>::accessible,
                  "tessera::train::grad_norm: the execution space cannot access the "
                  "parameters' memory space.");
    const float* g = p.grad.data();
    double part = 0.0;
    Kokkos::parallel_reduce(
        "tessera::train::grad_norm", Kokkos::RangePolicy<Exec>(exec, 0, p.size()),
        KOKKOS_LAMBDA(const index_t i, double& s) {
          const double v = static_cast<double>(g[i]);
          s += v * v;
        },
        part);
    sum += part;
  });
  return std::sqrt(sum);
}

/// Multiplies every gradient by the float `factor` (one kernel per parameter, then a fence).
template <class Exec, class Params>
void scale_grads(const Exec& exec, const Params& params, float factor) {
  detail::for_each_parameter(params, [&](const auto& p, std::size_t) {
    float* g = p.grad.data();
    Kokkos::parallel_for(
        "tessera::train::scale_grads", Kokkos::RangePolicy<Exec>(exec, 0, p.size()),
        KOKKOS_LAMBDA(const index_t i) { g[i] = g[i] * factor; });
  });
  exec.fence();
}

/// Clips the gradients to global L2 norm max_norm and returns the norm before clipping. Throws
/// value_error unless max_norm is finite and > 0. A non-finite norm leaves the gradients
/// unchanged (see the file comment).
template <class Exec, class Params>
double clip_grad_norm(const Exec& exec, const Params& params, double max_norm) {
  if (!(max_norm > 0.0 && max_norm <= std::numeric_limits<double>::max()))
    throw value_error("tessera::train::clip_grad_norm: max_norm must be finite and > 0, got " +
                      std::to_string(max_norm));
  const double norm = grad_norm(exec, params);
  if (!std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) scale_grads(exec, params, static_cast<float>(coef));
  return norm;
}

/// What clipped_step did.
struct step_result {
  bool applied = false; ///< the optimizer step ran (all gradients finite after unscaling)
  double norm = std::numeric_limits<double>::quiet_NaN(); ///< pre-clip norm; NaN if skipped
};

/// unscale -> check -> clip -> step or skip -> update: train::step with clipping of the
/// unscaled, finite gradients to max_norm between the check and the optimizer step. A skipped
/// step has train::step's guarantee (weights and optimizer state bit-identical).
template <class Exec, class Optimizer, class Scaler, class Params>
step_result clipped_step(const Exec& exec, Optimizer& opt, Scaler& scaler, const Params& params,
                         double max_norm) {
  if (!(max_norm > 0.0 && max_norm <= std::numeric_limits<double>::max()))
    throw value_error("tessera::train::clipped_step: max_norm must be finite and > 0, got " +
                      std::to_string(max_norm));
  step_result r;
  r.applied = scaler.unscale_and_check(exec, params);
  if (r.applied) {
    r.norm = clip_grad_norm(exec, params, max_norm);
    opt.step(exec, params);
  }
  scaler.update(r.applied);
  return r;
}

} // namespace tessera::train
