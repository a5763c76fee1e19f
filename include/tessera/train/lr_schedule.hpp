#pragma once
/// \file train/lr_schedule.hpp
/// Learning-rate schedules: linear warm-up then cosine decay to a floor (the GPT recipe), as a
/// small value type, and a scheduler that remembers its position (checkpointed).
///
///   tessera::train::warmup_cosine sched{.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 100,
///                                       .total_steps = 2000};
///   sched.validate();                        // value_error for inconsistent arguments
///   opt.set_lr(sched.lr_at(step));           // step = 0, 1, ... (the step about to be taken)
///
/// lr_at(s), computed in double and rounded to float once:
///
///     s <  warmup_steps:                lr * (s + 1) / (warmup_steps + 1)
///     warmup_steps <= s < total_steps:  min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
///                                       p = (s - warmup_steps) / (total_steps - warmup_steps)
///     s >= total_steps:                 min_lr
///
/// so the warm-up rises linearly from lr / (warmup + 1) (never 0: a zero first step would be a
/// wasted step) and reaches lr at s = warmup_steps, where the cosine starts; the cosine reaches
/// min_lr at s = total_steps ("the value after the last step is min_lr"). With warmup_steps = 0
/// the cosine starts at s = 0 with lr.

#include <tessera/config/error.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>

namespace tessera::train {

/// Linear warm-up from lr / (warmup_steps + 1) to lr over warmup_steps steps, then cosine decay
/// from lr to min_lr at total_steps, constant min_lr afterwards. An aggregate value type.
struct warmup_cosine {
  double lr = 1e-3;              ///< peak learning rate (finite, >= 0)
  double min_lr = 1e-4;          ///< floor reached at total_steps (finite, in [0, lr])
  std::int64_t warmup_steps = 0; ///< linear warm-up length (>= 0, <= total_steps)
  std::int64_t total_steps = 1;  ///< where the decay ends (>= 1)

  /// Throws value_error naming the field, its value and the rule unless lr and min_lr are finite
  /// with 0 <= min_lr <= lr, total_steps >= 1 and 0 <= warmup_steps <= total_steps.
  void validate() const {
    const auto bad = [](const std::string& what) {
      throw value_error("tessera::train::warmup_cosine: " + what);
    };
    constexpr double dmax = std::numeric_limits<double>::max();
    if (!(lr >= 0.0 && lr <= dmax)) bad("lr must be finite and >= 0, got " + std::to_string(lr));
    if (!(min_lr >= 0.0 && min_lr <= lr))
      bad("min_lr must be in [0, lr] = [0, " + std::to_string(lr) + "], got " +
          std::to_string(min_lr));
    if (total_steps < 1) bad("total_steps must be >= 1, got " + std::to_string(total_steps));
    if (warmup_steps < 0 || warmup_steps > total_steps)
      bad("warmup_steps must be in [0, total_steps] = [0, " + std::to_string(total_steps) +
          "], got " + std::to_string(warmup_steps));
  }

  /// The learning rate for step `step` (0-based: the step about to be taken). Throws
  /// value_error for a negative step or invalid fields.
  float lr_at(std::int64_t step) const {
    validate();
    if (step < 0)
      throw value_error("tessera::train::warmup_cosine::lr_at: step must be >= 0, got " +
                        std::to_string(step));
    if (step < warmup_steps)
      return static_cast<float>(lr * static_cast<double>(step + 1) /
                                static_cast<double>(warmup_steps + 1));
    if (step >= total_steps) return static_cast<float>(min_lr);
    const double p =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return static_cast<float>(min_lr +
                              (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
  }

  friend bool operator==(const warmup_cosine&, const warmup_cosine&) = default;
};

/// A schedule and its position: the number of optimizer steps attempted so far (skipped steps,
/// which the loss scaler refuses, count too: the schedule follows the iteration, as PyTorch's
/// scheduler.step() after every GradScaler step does). Checkpoints save the schedule and the
/// position (train/checkpoint.hpp, records sched/...).
///
///   tessera::train::lr_scheduler sch{.schedule = {...}};
///   opt.set_lr(sch.next());   // lr for this step, then position + 1
struct lr_scheduler {
  warmup_cosine schedule{};
  std::int64_t position = 0; ///< steps taken (>= 0)

  /// The learning rate of the next step, without advancing.
  float current() const { return schedule.lr_at(position); }
  /// The learning rate of the next step; advances the position by one.
  float next() {
    const float v = schedule.lr_at(position);
    ++position;
    return v;
  }
};

} // namespace tessera::train
