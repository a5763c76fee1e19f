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
/// Interleaved 1F1B (Narayanan et al. 2021, section 2.2; interleaved_1f1b<V>): the model is cut
/// into P V chunks and rank s holds chunks s, s + P, ..., s + (V - 1) P (its local chunks
/// 0..V-1). Each rank runs the V M forwards of (chunk, micro-batch) in groups of P micro-batches
/// (k-th forward: local chunk (k mod P V) / P, micro-batch (k / P V) P + k mod P), the
/// backwards in the same order with the chunks reversed, after min(2 (P - s - 1) + (V - 1) P,
/// V M) warm-up forwards (Megatron-LM's counts). M must be a multiple of P (as Megatron
/// requires). With a chunk's forward and backward costing f and b (1/V of a whole stage's),
/// the step takes V M (f + b) + (P - 1)(f + b): the idle time (P - 1)(f + b) is (P - 1)/(V M)
/// of the ideal time V M (f + b), the paper's bubble time fraction, V times smaller than
/// 1F1B's (P - 1)/M, for more messages (V times) and more activations in flight.
///
/// Communication implied by a table: forward(s, i) receives micro-batch i's activation from
/// stage s - 1 and sends its output to stage s + 1; backward(s, i) receives the gradient from
/// stage s + 1 and sends the input gradient to stage s - 1. (Interleaved: model chunk g = c P + s
/// receives from chunk g - 1 on rank (g - 1) mod P, so rank P - 1 feeds rank 0 between its
/// chunks.) Sends are non-blocking (buffered), receives block; simulate() runs that model and
/// reports a deadlock if no stage can move.

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
  int chunk = 0; ///< the rank's local model chunk (interleaved schedules; 0 otherwise)
  friend constexpr bool operator==(const step&, const step&) = default;
};

/// Schedule kinds.
struct gpipe {
  static constexpr int virtual_stages = 1;
};
struct one_f_one_b {
  static constexpr int virtual_stages = 1;
};
/// Interleaved 1F1B with V model chunks (virtual stages) per rank (see the file comment).
template <int V>
struct interleaved_1f1b {
  static_assert(V >= 1, "tessera::parallel::interleaved_1f1b<V>: V, the model chunks per rank, "
                        "must be at least 1");
  static constexpr int virtual_stages = V;
};

/// The model chunks each rank holds under schedule Kind: V for interleaved_1f1b<V>, else 1.
template <class Kind>
inline constexpr int virtual_stages_v = Kind::virtual_stages;

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

/// Interleaved 1F1B: fills out[s * 2 V M + k] (rows of 2 V M steps; M a multiple of stages).
template <int V>
constexpr void fill_schedule(interleaved_1f1b<V>, int stages, int micro_batches, step* out) {
  const int group = stages * V, total = V * micro_batches;
  auto micro_batch = [&](int k) { return (k / group) * stages + k % stages; };
  for (int s = 0; s < stages; ++s) {
    step* row = out + s * 2 * total;
    int warmup = 2 * (stages - s - 1) + (V - 1) * stages;
    warmup = warmup < total ? warmup : total;
    int k = 0, f = 0, b = 0;
    auto forward = [&] {
      row[k++] = {s, micro_batch(f), pass::forward, (f % group) / stages};
      ++f;
    };
    auto backward = [&] {
      row[k++] = {s, micro_batch(b), pass::backward, V - 1 - (b % group) / stages};
      ++b;
    };
    while (f < warmup) forward();
    while (f < total) forward(), backward();
    while (b < total) backward();
  }
}

/// What simulate() found.
struct simulation {
  bool deadlock_free = false;
  long makespan = 0; ///< time of the last step's end, in cost units
  long busy = 0;     ///< summed step costs of one stage: V M * (forward + backward)
  /// Most (chunk, micro-batch) activations a stage holds at once (a chunk's activations are
  /// 1/V of a whole stage's under an interleaved schedule).
  int peak_in_flight = 0;
  /// Idle fraction of the step: 1 - busy / makespan (GPipe, 1F1B: (P - 1)/(M + P - 1)).
  constexpr double bubble() const noexcept {
    return makespan > 0 ? 1.0 - double(busy) / double(makespan) : 0.0;
  }
  /// Idle time over the ideal (busy) time, (makespan - busy) / busy: Narayanan et al.'s
  /// "bubble time fraction" ((P - 1)/M for 1F1B, (P - 1)/(V M) interleaved).
  constexpr double bubble_over_ideal() const noexcept {
    return busy > 0 ? double(makespan - busy) / double(busy) : 0.0;
  }
};

/// Runs a table of S rows of 2 V M steps (V model chunks per stage; row-major) with blocking
/// receives and buffered sends, each forward of a chunk costing `forward_cost` and each
/// backward `backward_cost` time units, every step starting as soon as its stage is free and
/// its input has arrived. `finish` (2 S V M entries) receives each step's end time, indexed
/// like the table. A table in which some stage waits for a message that is never sent reports
/// deadlock_free = false.
constexpr simulation simulate(const step* table, int stages, int chunks, int micro_batches,
                              long* finish, long forward_cost = 1, long backward_cost = 1) {
  const int per_stage = 2 * chunks * micro_batches;
  const int total = stages * per_stage;
  const int last_chunk = stages * chunks - 1; // the model's last chunk, by global index
  for (int k = 0; k < total; ++k) finish[k] = -1;
  // The end time of global chunk g's (micro-batch, kind), or -1 while it has not run.
  auto done = [&](int g, int i, pass kind) -> long {
    const int s = g % stages, c = g / stages;
    for (int k = 0; k < per_stage; ++k) {
      const step& t = table[s * per_stage + k];
      if (t.micro_batch == i && t.kind == kind && t.chunk == c) return finish[s * per_stage + k];
    }
    return -1;
  };
  simulation result;
  result.busy = long(chunks) * micro_batches * (forward_cost + backward_cost);
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
        const int g = t.chunk * stages + s;
        long ready = clock;
        if (t.kind == pass::forward && g > 0) {
          const long in = done(g - 1, t.micro_batch, pass::forward);
          if (in < 0) break;
          ready = ready > in ? ready : in;
        }
        if (t.kind == pass::backward) {
          // The gradient comes from the next chunk; the last chunk needs its own forward.
          const long in = g < last_chunk ? done(g + 1, t.micro_batch, pass::backward)
                                         : done(g, t.micro_batch, pass::forward);
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

/// simulate() of a table with one model chunk per stage (GPipe, 1F1B): S rows of 2M steps.
constexpr simulation simulate(const step* table, int stages, int micro_batches, long* finish,
                              long forward_cost = 1, long backward_cost = 1) {
  return simulate(table, stages, 1, micro_batches, finish, forward_cost, backward_cost);
}

/// True when every (stage, chunk, micro-batch, pass) appears exactly once, in its own stage's
/// row, and each stage runs a chunk's forward of a micro-batch before its backward.
constexpr bool well_formed(const step* table, int stages, int chunks, int micro_batches) {
  const int per_stage = 2 * chunks * micro_batches;
  for (int s = 0; s < stages; ++s)
    for (int c = 0; c < chunks; ++c)
      for (int i = 0; i < micro_batches; ++i) {
        int forward_at = -1, backward_at = -1, count = 0;
        for (int k = 0; k < per_stage; ++k) {
          const step& t = table[s * per_stage + k];
          if (t.stage != s || t.micro_batch < 0 || t.micro_batch >= micro_batches || t.chunk < 0 ||
              t.chunk >= chunks)
            return false;
          if (t.micro_batch != i || t.chunk != c) continue;
          ++count;
          (t.kind == pass::forward ? forward_at : backward_at) = k;
        }
        if (count != 2 || forward_at < 0 || backward_at < 0 || forward_at > backward_at)
          return false;
      }
  return true;
}
constexpr bool well_formed(const step* table, int stages, int micro_batches) {
  return well_formed(table, stages, 1, micro_batches);
}

/// True when, on every link from model chunk g to chunk g + 1, the order in which g's stage
/// sends activations equals the order in which g + 1's stage receives them, and likewise for
/// the gradients going back: messages matched in order per link (as MPI does between one pair
/// of ranks for one tag) meet the right micro-batch.
constexpr bool sends_match_receives(const step* table, int stages, int chunks, int micro_batches) {
  const int per_stage = 2 * chunks * micro_batches;
  auto nth = [&](int g, pass kind, int n) {
    const int s = g % stages, c = g / stages;
    for (int k = 0, seen = 0; k < per_stage; ++k) {
      const step& t = table[s * per_stage + k];
      if (t.kind == kind && t.chunk == c && seen++ == n) return t.micro_batch;
    }
    return -1;
  };
  for (int g = 0; g + 1 < stages * chunks; ++g)
    for (int n = 0; n < micro_batches; ++n) {
      const int sent = nth(g, pass::forward, n), received = nth(g + 1, pass::forward, n);
      const int grad_sent = nth(g + 1, pass::backward, n),
                grad_received = nth(g, pass::backward, n);
      if (sent < 0 || sent != received || grad_sent < 0 || grad_sent != grad_received) return false;
    }
  return true;
}
constexpr bool sends_match_receives(const step* table, int stages, int micro_batches) {
  return sends_match_receives(table, stages, 1, micro_batches);
}

/// The table of a schedule Kind (gpipe, one_f_one_b or interleaved_1f1b<V>) for Stages stages
/// and MicroBatches micro-batches, with its checks evaluated at compile time.
template <class Kind, int Stages, int MicroBatches>
struct schedule {
  static_assert(Stages >= 1 && MicroBatches >= 1,
                "tessera::parallel::schedule: stages and micro-batches must be at least 1");
  static constexpr int stages = Stages;
  static constexpr int micro_batches = MicroBatches;
  /// Model chunks per stage (V of interleaved_1f1b<V>, else 1).
  static constexpr int chunks = virtual_stages_v<Kind>;
  static_assert(chunks == 1 || MicroBatches % Stages == 0,
                "tessera::parallel::schedule<interleaved_1f1b<V>, P, M>: the interleaved "
                "schedule runs the micro-batches in groups of P (one per stage), so M must be a "
                "multiple of the P stages (as Megatron-LM requires); choose M = k P");
  static constexpr int steps_per_stage = 2 * chunks * MicroBatches;

  /// The table, row-major: table[s * steps_per_stage + k] is the k-th step stage s runs.
  static constexpr std::array<step, Stages* steps_per_stage> table = [] {
    std::array<step, Stages * steps_per_stage> t{};
    fill_schedule(Kind{}, Stages, MicroBatches, t.data());
    return t;
  }();

  /// The k-th step of stage s.
  static constexpr const step& at(int s, int k) noexcept { return table[s * steps_per_stage + k]; }

  /// The simulation with forward and backward of equal cost.
  static constexpr simulation simulated = [] {
    std::array<long, Stages * steps_per_stage> finish{};
    return simulate(table.data(), Stages, chunks, MicroBatches, finish.data());
  }();

  static constexpr bool deadlock_free = simulated.deadlock_free;
  static_assert(well_formed(table.data(), Stages, chunks, MicroBatches) &&
                    sends_match_receives(table.data(), Stages, chunks, MicroBatches) &&
                    deadlock_free,
                "tessera::parallel::schedule: the generated table is inconsistent (a bug)");

  /// The idle fraction of the step, idle / makespan: (P - 1)/(M + P - 1) for GPipe and 1F1B,
  /// (P - 1)/(V M + P - 1) interleaved.
  static constexpr double bubble_fraction =
      double(Stages - 1) / double(chunks * MicroBatches + Stages - 1);
  /// The idle time over the ideal time (Narayanan et al.'s bubble time fraction): (P - 1)/M for
  /// GPipe and 1F1B, (P - 1)/(V M) interleaved.
  static constexpr double bubble_over_ideal = double(Stages - 1) / double(chunks * MicroBatches);
};

} // namespace tessera::parallel
