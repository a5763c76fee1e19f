#pragma once
/// \file parallel/schedule.hpp
/// Pipeline schedules as constexpr tables: for every stage, the ordered list of the
/// (micro-batch, forward/backward) steps it runs.
///
///   using S = tessera::parallel::schedule<tessera::parallel::one_f_one_b, 4, 8>;
///   static_assert(S::deadlock_free);
///   for (int k = 0; k < S::steps_per_stage; ++k) run(S::at(stage, k));  // in order
///
/// GPipe (Huang et al. 2019): each stage runs all M forwards, then all M backwards. 1F1B
/// (PipeDream-Flush, Narayanan et al. 2021): stage s runs min(P - s - 1, M) warm-up forwards,
/// then alternates one forward and one backward, then drains the remaining backwards; the same
/// bubble as GPipe with at most P - s micro-batches of activations alive instead of M.
///
/// Communication implied by a table: forward(s, i) receives micro-batch i's activation from
/// stage s - 1 and sends its output to stage s + 1; backward(s, i) receives the gradient from
/// stage s + 1 and sends the input gradient to stage s - 1. Sends are non-blocking (buffered),
/// receives block; simulate() runs that model and reports a deadlock if no stage can move.

#include <array>
#include <cstdint>

namespace tessera::parallel {

/// Forward or backward pass of one micro-batch on one stage.
enum class pass : std::uint8_t { forward, backward };

/// One entry of a schedule table.
struct step {
  int stage = 0;
  int micro_batch = 0;
  pass kind = pass::forward;
  friend constexpr bool operator==(const step&, const step&) = default;
};

/// Schedule kinds.
struct gpipe {};
struct one_f_one_b {};

/// Fills out[s * 2M + k] with the k-th step of stage s (S stages, M micro-batches).
constexpr void fill_schedule(gpipe, int stages, int micro_batches, step* out) {
  for (int s = 0; s < stages; ++s) {
    step* row = out + s * 2 * micro_batches;
    for (int i = 0; i < micro_batches; ++i) {
      row[i] = {s, i, pass::forward};
      row[micro_batches + i] = {s, i, pass::backward};
    }
  }
}

/// 1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards.
constexpr void fill_schedule(one_f_one_b, int stages, int micro_batches, step* out) {
  for (int s = 0; s < stages; ++s) {
    step* row = out + s * 2 * micro_batches;
    const int warmup = stages - s - 1 < micro_batches ? stages - s - 1 : micro_batches;
    int k = 0, f = 0, b = 0;
    for (; f < warmup; ++f) row[k++] = {s, f, pass::forward};
    for (; f < micro_batches; ++f, ++b) {
      row[k++] = {s, f, pass::forward};
      row[k++] = {s, b, pass::backward};
    }
    for (; b < micro_batches; ++b) row[k++] = {s, b, pass::backward};
  }
}

/// What simulate() found.
struct simulation {
  bool deadlock_free = false;
  long makespan = 0;      ///< time of the last step's end, in cost units
  long busy = 0;          ///< summed step costs of one stage: M * (forward + backward)
  int peak_in_flight = 0; ///< most micro-batches whose activations a stage holds at once
  /// Idle fraction of the step: 1 - busy / makespan.
  constexpr double bubble() const noexcept {
    return makespan > 0 ? 1.0 - double(busy) / double(makespan) : 0.0;
  }
};

/// Runs a table (S rows of 2M steps, row-major) with blocking receives and buffered sends,
/// each forward costing `forward_cost` and each backward `backward_cost` time units, every
/// step starting as soon as its stage is free and its input has arrived. `finish` (2 S M
/// entries) receives each step's end time, indexed like the table. A table in which some
/// stage waits for a message that is never sent reports deadlock_free = false.
constexpr simulation simulate(const step* table, int stages, int micro_batches, long* finish,
                              long forward_cost = 1, long backward_cost = 1) {
  const int per_stage = 2 * micro_batches;
  const int total = stages * per_stage;
  for (int k = 0; k < total; ++k) finish[k] = -1;
  // The end time of (stage, micro-batch, kind), or -1 while it has not run.
  auto done = [&](int s, int i, pass kind) -> long {
    for (int k = 0; k < per_stage; ++k) {
      const step& t = table[s * per_stage + k];
      if (t.micro_batch == i && t.kind == kind) return finish[s * per_stage + k];
    }
    return -1;
  };
  simulation result;
  result.busy = micro_batches * (forward_cost + backward_cost);
  int remaining = total;
  // Each sweep runs, on every stage, the steps whose inputs are ready; a sweep that runs
  // nothing while steps remain is a deadlock (every stage blocked in a receive).
  for (bool progress = true; progress && remaining > 0;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      long clock = 0;
      for (int k = 0; k < per_stage; ++k) {
        const int at = s * per_stage + k;
        if (finish[at] >= 0) {
          clock = finish[at];
          continue;
        }
        const step& t = table[at];
        long ready = clock;
        if (t.kind == pass::forward && s > 0) {
          const long in = done(s - 1, t.micro_batch, pass::forward);
          if (in < 0) break;
          ready = ready > in ? ready : in;
        }
        if (t.kind == pass::backward) {
          // The gradient comes from the next stage; the last stage needs its own forward.
          const long in = s + 1 < stages ? done(s + 1, t.micro_batch, pass::backward)
                                         : done(s, t.micro_batch, pass::forward);
          if (in < 0) break;
          ready = ready > in ? ready : in;
        }
        finish[at] = ready + (t.kind == pass::forward ? forward_cost : backward_cost);
        clock = finish[at];
        --remaining;
        progress = true;
        result.makespan = result.makespan > clock ? result.makespan : clock;
      }
    }
  }
  result.deadlock_free = remaining == 0;
  for (int s = 0; s < stages; ++s) {
    int alive = 0;
    for (int k = 0; k < per_stage; ++k) {
      alive += table[s * per_stage + k].kind == pass::forward ? 1 : -1;
      result.peak_in_flight = result.peak_in_flight > alive ? result.peak_in_flight : alive;
    }
  }
  return result;
}

/// True when every (stage, micro-batch, pass) appears exactly once, in its own stage's row,
/// and each stage runs a micro-batch's forward before its backward.
constexpr bool well_formed(const step* table, int stages, int micro_batches) {
  const int per_stage = 2 * micro_batches;
  for (int s = 0; s < stages; ++s)
    for (int i = 0; i < micro_batches; ++i) {
      int forward_at = -1, backward_at = -1, count = 0;
      for (int k = 0; k < per_stage; ++k) {
        const step& t = table[s * per_stage + k];
        if (t.stage != s || t.micro_batch < 0 || t.micro_batch >= micro_batches) return false;
        if (t.micro_batch != i) continue;
        ++count;
        (t.kind == pass::forward ? forward_at : backward_at) = k;
      }
      if (count != 2 || forward_at < 0 || backward_at < 0 || forward_at > backward_at) return false;
    }
  return true;
}

/// True when, on every link between stages s and s + 1, the order in which s sends
/// activations equals the order in which s + 1 receives them, and the order in which s + 1
/// sends gradients equals the order in which s receives them: messages matched in order (as
/// MPI does between one pair of ranks) meet the right micro-batch.
constexpr bool sends_match_receives(const step* table, int stages, int micro_batches) {
  const int per_stage = 2 * micro_batches;
  auto nth = [&](int s, pass kind, int n) {
    for (int k = 0, seen = 0; k < per_stage; ++k) {
      const step& t = table[s * per_stage + k];
      if (t.kind == kind && seen++ == n) return t.micro_batch;
    }
    return -1;
  };
  for (int s = 0; s + 1 < stages; ++s)
    for (int n = 0; n < micro_batches; ++n) {
      const int sent = nth(s, pass::forward, n), received = nth(s + 1, pass::forward, n);
      const int grad_sent = nth(s + 1, pass::backward, n),
                grad_received = nth(s, pass::backward, n);
      if (sent < 0 || sent != received || grad_sent < 0 || grad_sent != grad_received) return false;
    }
  return true;
}

/// The table of a schedule Kind (gpipe or one_f_one_b) for Stages stages and MicroBatches
/// micro-batches, with its checks evaluated at compile time.
template <class Kind, int Stages, int MicroBatches>
struct schedule {
  static_assert(Stages >= 1 && MicroBatches >= 1,
                "tessera::parallel::schedule: stages and micro-batches must be at least 1");
  static constexpr int stages = Stages;
  static constexpr int micro_batches = MicroBatches;
  static constexpr int steps_per_stage = 2 * MicroBatches;

  /// The table, row-major: table[s * steps_per_stage + k] is the k-th step stage s runs.
  static constexpr std::array<step, 2 * Stages* MicroBatches> table = [] {
    std::array<step, 2 * Stages * MicroBatches> t{};
    fill_schedule(Kind{}, Stages, MicroBatches, t.data());
    return t;
  }();

  /// The k-th step of stage s.
  static constexpr const step& at(int s, int k) noexcept { return table[s * steps_per_stage + k]; }

  /// The simulation with forward and backward of equal cost.
  static constexpr simulation simulated = [] {
    std::array<long, 2 * Stages * MicroBatches> finish{};
    return simulate(table.data(), Stages, MicroBatches, finish.data());
  }();

  static constexpr bool deadlock_free = simulated.deadlock_free;
  static_assert(well_formed(table.data(), Stages, MicroBatches) &&
                    sends_match_receives(table.data(), Stages, MicroBatches) && deadlock_free,
                "tessera::parallel::schedule: the generated table is inconsistent (a bug)");

  /// (P - 1) / (M + P - 1), the idle fraction of a GPipe or 1F1B step.
  static constexpr double bubble_fraction = double(Stages - 1) / double(MicroBatches + Stages - 1);
};

} // namespace tessera::parallel
