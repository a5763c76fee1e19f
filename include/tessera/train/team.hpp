#pragma once
/// \file train/team.hpp
/// A training loop that keeps its speed on a shared machine: team_governor runs each step on
/// the whole thread team or on a smaller one, whichever its recent steps measured faster.
///
///   tessera::train::team_governor<Kokkos::DefaultExecutionSpace> team(exec);
///   for (...) {                                            // one step per batch
///     team.run(batch_size, [&](const auto& ex) {           // ex: the team of this step
///       const auto logits = model.forward(ex, x);
///       ...
///       opt.step(ex, params);
///     });
///   }
///
/// Why: a step is dozens of short parallel regions, and each ends in a barrier that waits for
/// every thread of its team. When another process holds one of the cores, the OS runs the
/// team's thread on that core only a time slice at a time, and every region waits for one: on
/// a 2-core machine beside one busy process, 2 threads trained at 0.65 of the speed of 1 thread
/// (docs/performance.md, "A competing process"). No setting of the OpenMP runtime fixes it (a
/// passive wait keeps 2 threads at the 1-thread speed under load but costs 12% on a quiet
/// machine). So the governor measures what the team gets: it times every step (per item, so a
/// short last batch counts right) and, now and then, runs a few steps on the other team; the
/// faster team keeps running. Each probe the running team wins makes the next one 4 times
/// further away (up to team_settings::max_period steps), so a quiet machine pays about 1% for
/// the probes; a load that starts or stops is followed within one period.
///
/// The smaller team: with Kokkos 4's OpenMP, an instance of one thread fewer
/// (Kokkos::OpenMP(n - 1), same type, the step is compiled once); with Kokkos 3.4's OpenMP,
/// whose instances share one pool, Kokkos::Serial when the build enables it (the step is then
/// compiled for both spaces). Every other space (Serial, Threads, a device) and a team of one
/// thread keep one team: run() always uses it.
///
/// Rounding: a pass that splits a sum over threads (the convolutions' backward-weight) rounds
/// differently on another team, so which steps ran on which team changes the last bits of the
/// weights. A run that must be bitwise reproducible turns the governor off (adapt = false).

#include <tessera/config/error.hpp>
#include <tessera/config/kokkos_compat.hpp>
#include <tessera/tensor/extents.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace tessera::train {

/// When the governor probes and what makes it switch.
struct team_settings {
  index_t first_period = 16; ///< steps before the first probe, and after every switch (>= 1)
  index_t max_period = 512;  ///< the most steps between two probes (>= first_period)
  int probe_steps = 3;       ///< steps per probe; their median meets the running team's last ones
  double gain = 0.05;        ///< the other team takes over if faster by more than this fraction

  /// Throws value_error naming the field and the rule unless the settings are usable.
  void validate() const {
    auto bad = [](const std::string& what) {
      throw value_error("tessera::train::team_settings: " + what);
    };
    if (first_period < 1) bad("first_period " + std::to_string(first_period) + " is not >= 1");
    if (max_period < first_period)
      bad("max_period " + std::to_string(max_period) + " is below first_period " +
          std::to_string(first_period));
    if (probe_steps < 1 || probe_steps > 64)
      bad("probe_steps " + std::to_string(probe_steps) + " is not in [1, 64]");
    if (!(gain >= 0.0 && gain < 1.0)) bad("gain " + std::to_string(gain) + " is not in [0, 1)");
  }
};

/// The governor's decisions, apart from any clock or execution space: which team the next step
/// runs on, given the time per item of every step so far. Deterministic; tested on its own.
class team_schedule {
public:
  explicit team_schedule(const team_settings& s = {}) : s_(s), period_(s.first_period) {
    s_.validate();
  }

  /// The team of the next step: false the whole team, true the smaller one.
  bool reduced() const noexcept { return probing_ ? !current_ : current_; }
  /// The team that runs between probes.
  bool current() const noexcept { return current_; }
  /// Whether the next step is part of a probe of the other team.
  bool probing() const noexcept { return probing_; }
  /// Steps between the last decision and the next probe.
  index_t period() const noexcept { return period_; }
  /// Steps recorded on the whole team (reduced == false) or the smaller one.
  index_t steps(bool reduced) const noexcept { return steps_[reduced ? 1 : 0]; }
  /// How often the running team changed.
  index_t switches() const noexcept { return switches_; }

  /// Records the time per item of the step just run on reduced(). Throws value_error, changing
  /// nothing, unless it is finite and >= 0.
  void record(double seconds_per_item) {
    if (!(seconds_per_item >= 0.0) || !std::isfinite(seconds_per_item))
      throw value_error("tessera::train::team_schedule::record: time per item " +
                        std::to_string(seconds_per_item) + " is not finite and >= 0");
    ++steps_[reduced() ? 1 : 0];
    const auto window = static_cast<std::size_t>(s_.probe_steps);
    if (!probing_) {
      recent_.push_back(seconds_per_item);
      if (recent_.size() > window) recent_.erase(recent_.begin());
      if (++count_ >= period_ && recent_.size() == window) {
        probing_ = true;
        probe_.clear();
      }
      return;
    }
    probe_.push_back(seconds_per_item);
    if (probe_.size() < window) return;
    if (median(probe_) < (1.0 - s_.gain) * median(recent_)) {
      current_ = !current_;
      recent_ = probe_;
      period_ = s_.first_period;
      ++switches_;
    } else {
      period_ = std::min(s_.max_period, period_ * 4);
    }
    probing_ = false;
    count_ = 0;
  }

private:
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  }

  team_settings s_;
  bool current_ = false, probing_ = false;
  index_t period_, count_ = 0, switches_ = 0;
  std::array<index_t, 2> steps_{};
  std::vector<double> recent_, probe_;
};

namespace detail {
/// The smaller team of Exec: `type` its space, make() the instance (nullopt: none).
template <class Exec>
struct smaller_team {
  using type = Exec;
  static std::optional<type> make(const Exec&) { return std::nullopt; }
};
#if defined(KOKKOS_ENABLE_OPENMP)
template <>
struct smaller_team<Kokkos::OpenMP> {
#if TESSERA_KOKKOS_4
  using type = Kokkos::OpenMP;
  static std::optional<type> make(const Kokkos::OpenMP& full) {
    const int n = tessera::concurrency(full);
    if (n < 2) return std::nullopt;
    return Kokkos::OpenMP(n - 1);
  }
#elif defined(KOKKOS_ENABLE_SERIAL)
  using type = Kokkos::Serial;
  static std::optional<type> make(const Kokkos::OpenMP& full) {
    if (tessera::concurrency(full) < 2) return std::nullopt;
    return Kokkos::Serial();
  }
#else
  using type = Kokkos::OpenMP;
  static std::optional<type> make(const Kokkos::OpenMP&) {
    return std::nullopt;
  }
#endif
};
#endif
} // namespace detail

/// Runs training steps on Exec's whole team or a smaller one (see the file comment).
template <class Exec = Kokkos::DefaultExecutionSpace>
class team_governor {
public:
  using full_space = Exec;
  using reduced_space = typename detail::smaller_team<Exec>::type;

  /// adapt = false: every step on exec (bitwise reproducible runs). Throws value_error for bad
  /// settings.
  explicit team_governor(const Exec& exec = Exec(), const team_settings& s = {}, bool adapt = true)
      : full_(exec), schedule_(s) {
    if (adapt) reduced_ = detail::smaller_team<Exec>::make(exec);
  }

  /// Whether steps may run on a smaller team (a smaller team exists and adapt was true).
  bool adaptive() const noexcept { return reduced_.has_value(); }
  /// Threads of the whole team and of the smaller one (the whole team's when there is none).
  int threads(bool reduced) const {
    return reduced && reduced_ ? tessera::concurrency(*reduced_) : tessera::concurrency(full_);
  }
  const team_schedule& schedule() const noexcept { return schedule_; }

  /// Calls step(space) on the team the schedule picks, fences it, and records its time per
  /// item; `items` (>= 1) is what the step processes (a batch's samples). step must run all its
  /// work on the space it is given. An exception from step propagates and records nothing.
  template <class Step>
  void run(index_t items, Step&& step) {
    if (items < 1)
      throw value_error("tessera::train::team_governor::run: items " + std::to_string(items) +
                        " is not >= 1");
    if (!reduced_) {
      step(static_cast<const Exec&>(full_));
      full_.fence();
      return;
    }
    const bool reduced = schedule_.reduced();
    const auto t0 = std::chrono::steady_clock::now();
    if (reduced) {
      step(static_cast<const reduced_space&>(*reduced_));
      reduced_->fence();
    } else {
      step(static_cast<const Exec&>(full_));
      full_.fence();
    }
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    schedule_.record(dt.count() / static_cast<double>(items));
  }

private:
  Exec full_;
  std::optional<reduced_space> reduced_;
  team_schedule schedule_;
};

} // namespace tessera::train
