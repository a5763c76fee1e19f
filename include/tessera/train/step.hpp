#pragma once
/// \file train/step.hpp
/// One mixed-precision optimizer step with loss scaling, and zeroing gradients.
///
///   // backward ran with the loss gradient multiplied by scaler.scale()
///   const bool applied = tessera::train::step(exec, opt, scaler, model.parameters());
///   tessera::train::zero_grad(exec, model.parameters());

#include <tessera/train/loss_scaler.hpp>

namespace tessera::train {

/// unscale -> check -> step or skip -> update: divides the gradients by scaler.scale(), and if
/// every one is finite runs opt.step(exec, params); then scaler.update(finite). Returns whether
/// the step was applied.
///
/// Guarantee: a skipped step (some gradient inf or NaN after unscaling) leaves the master
/// weights, the optimizer state and its step counter bit-identical; only the gradients (now
/// unscaled) and the scaler (backed off, per its policy) change.
template <class Exec, class Optimizer, class Scaler, class Params>
bool step(const Exec& exec, Optimizer& opt, Scaler& scaler, const Params& params) {
  const bool finite = scaler.unscale_and_check(exec, params);
  if (finite) opt.step(exec, params);
  scaler.update(finite);
  return finite;
}

/// Sets every parameter's gradient to zero (one fill per parameter on exec, then one fence).
template <class Exec, class Params>
void zero_grad(const Exec& exec, const Params& params) {
  detail::for_each_parameter(params, [&](const auto& p, std::size_t) {
    Kokkos::deep_copy(exec, p.grad.kokkos_view(), 0.f);
  });
  exec.fence();
}

} // namespace tessera::train
