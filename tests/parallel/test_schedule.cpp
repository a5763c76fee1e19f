// Pipeline schedules: tables well formed, sends match receives, no deadlock, bubble and
// activation memory as the papers state.
#include <tessera/parallel/schedule.hpp>

#include <catch2/catch.hpp>

#include <vector>

namespace tp = tessera::parallel;

static_assert(tp::schedule<tp::gpipe, 4, 8>::deadlock_free);
static_assert(tp::schedule<tp::one_f_one_b, 4, 8>::bubble_fraction == 3.0 / 11.0);
static_assert(tp::schedule<tp::one_f_one_b, 3, 2>::at(0, 0) == tp::step{0, 0, tp::pass::forward});
static_assert(tp::schedule<tp::one_f_one_b, 3, 2>::at(2, 1) ==
              tp::step{2, 0, tp::pass::backward}); // the last stage has no warm-up

namespace {

struct table {
  int stages, micro_batches;
  std::vector<tp::step> steps;
  int chunks = 1;
  int per() const { return 2 * chunks * micro_batches; }
  const tp::step& at(int s, int k) const { return steps[s * per() + k]; }
  // The table index of (stage s, local chunk c, micro-batch i, kind).
  int index(int s, int i, tp::pass kind, int c = 0) const {
    for (int k = 0; k < per(); ++k)
      if (at(s, k).micro_batch == i && at(s, k).kind == kind && at(s, k).chunk == c)
        return s * per() + k;
    return -1;
  }
};

template <class Kind>
table make(int s, int m) {
  constexpr int v = tp::virtual_stages_v<Kind>;
  table t{s, m, std::vector<tp::step>(2 * v * s * m), v};
  tp::fill_schedule(Kind{}, s, m, t.steps.data());
  return t;
}

// Checks a simulated run against the dependency rules directly (independently of how
// simulate() orders its sweeps): on each stage steps run one at a time in table order; a
// forward starts after the previous stage's forward of that micro-batch ended; a backward
// after the next stage's backward (or, on the last stage, its own forward).
// Interleaved: model chunk g = c P + s (stage s, local chunk c) follows chunk g - 1, which
// lives on stage (g - 1) mod P as its chunk (g - 1) / P.
void check_timeline(const table& t, const std::vector<long>& finish, long f_cost, long b_cost) {
  const int per = t.per(), P = t.stages, G = P * t.chunks;
  for (int s = 0; s < P; ++s)
    for (int k = 0; k < per; ++k) {
      const tp::step& st = t.at(s, k);
      const int g = st.chunk * P + s;
      const long end = finish[s * per + k];
      const long start = end - (st.kind == tp::pass::forward ? f_cost : b_cost);
      CHECK(start >= 0);
      if (k > 0) CHECK(start >= finish[s * per + k - 1]);
      if (st.kind == tp::pass::forward && g > 0)
        CHECK(start >=
              finish[t.index((g - 1) % P, st.micro_batch, tp::pass::forward, (g - 1) / P)]);
      if (st.kind == tp::pass::backward) {
        const int dep = g + 1 < G
                            ? t.index((g + 1) % P, st.micro_batch, tp::pass::backward, (g + 1) / P)
                            : t.index(s, st.micro_batch, tp::pass::forward, st.chunk);
        CHECK(start >= finish[dep]);
      }
    }
}

int peak_alive(const table& t, int s) {
  int alive = 0, peak = 0;
  for (int k = 0; k < t.per(); ++k) {
    alive += t.at(s, k).kind == tp::pass::forward ? 1 : -1;
    peak = alive > peak ? alive : peak;
  }
  return peak;
}

template <class Kind>
void check_schedule(const char* name) {
  for (int s = 1; s <= 8; ++s)
    for (int m = 1; m <= 17; ++m) {
      INFO(name << ": " << s << " stages, " << m << " micro-batches");
      const table t = make<Kind>(s, m);
      REQUIRE(tp::well_formed(t.steps.data(), s, m));
      REQUIRE(tp::sends_match_receives(t.steps.data(), s, m));
      for (long b_cost : {1L, 2L, 3L}) { // backward about twice a forward in practice
        std::vector<long> finish(t.steps.size());
        const tp::simulation r = tp::simulate(t.steps.data(), s, m, finish.data(), 1, b_cost);
        REQUIRE(r.deadlock_free);
        check_timeline(t, finish, 1, b_cost);
        // GPipe section 2.2: the step takes (M + P - 1) slots of forward + backward.
        CHECK(r.makespan == (m + s - 1) * (1 + b_cost));
        CHECK(r.bubble() == Approx(double(s - 1) / (m + s - 1)));
      }
      for (int stage = 0; stage < s; ++stage) {
        if constexpr (std::is_same_v<Kind, tp::gpipe>)
          CHECK(peak_alive(t, stage) == m);
        else // 1F1B keeps at most P - s micro-batches alive (PipeDream-Flush)
          CHECK(peak_alive(t, stage) == std::min(s - stage, m));
      }
    }
}

} // namespace

TEST_CASE("schedule: GPipe tables", "[parallel]") {
  check_schedule<tp::gpipe>("gpipe");
}
TEST_CASE("schedule: 1F1B tables", "[parallel]") {
  check_schedule<tp::one_f_one_b>("1F1B");
}

namespace {

// Interleaved 1F1B (Narayanan et al. 2021, section 2.2), checked against the paper: with a
// chunk's forward costing f and backward b (1/V of a stage's), the step ends at
// V M (f + b) + (P - 1)(f + b), so idle / ideal = (P - 1)/(V M), the paper's bubble time
// fraction; the order is Megatron-LM's (groups of P micro-batches per chunk).
template <int V>
void check_interleaved() {
  using Kind = tp::interleaved_1f1b<V>;
  for (int s = 1; s <= 8; ++s)
    for (int m = s; m <= 4 * s; m += s) { // M a multiple of P
      INFO("interleaved V=" << V << ": " << s << " stages, " << m << " micro-batches");
      const table t = make<Kind>(s, m);
      REQUIRE(tp::well_formed(t.steps.data(), s, V, m));
      REQUIRE(tp::sends_match_receives(t.steps.data(), s, V, m));
      for (int stage = 0; stage < s; ++stage) {
        // Every stage starts with micro-batch 0 on its first chunk, and runs each chunk's
        // micro-batches in order, forwards and backwards alike.
        CHECK(t.at(stage, 0) == tp::step{stage, 0, tp::pass::forward, 0});
        for (int c = 0; c < V; ++c)
          for (tp::pass kind : {tp::pass::forward, tp::pass::backward}) {
            int next = 0;
            for (int k = 0; k < t.per(); ++k)
              if (t.at(stage, k).chunk == c && t.at(stage, k).kind == kind)
                CHECK(t.at(stage, k).micro_batch == next++);
          }
        // The forwards of the k-th group of P micro-batches go through chunks 0..V-1 in turn.
        int f = 0;
        for (int k = 0; k < t.per(); ++k)
          if (t.at(stage, k).kind == tp::pass::forward) {
            CHECK(t.at(stage, k).chunk == (f % (s * V)) / s);
            ++f;
          }
        // Activations alive: Megatron's warm-up 2 (P - s - 1) + (V - 1) P forwards, plus one.
        CHECK(peak_alive(t, stage) == std::min(2 * (s - stage - 1) + (V - 1) * s + 1, V * m));
      }
      for (long b_cost : {1L, 2L, 3L}) {
        std::vector<long> finish(t.steps.size());
        const tp::simulation r = tp::simulate(t.steps.data(), s, V, m, finish.data(), 1, b_cost);
        REQUIRE(r.deadlock_free);
        check_timeline(t, finish, 1, b_cost);
        CHECK(r.busy == V * m * (1 + b_cost));
        CHECK(r.makespan == (V * m + s - 1) * (1 + b_cost));
        CHECK(r.bubble_over_ideal() == Approx(double(s - 1) / (V * m)));
        CHECK(r.bubble() == Approx(double(s - 1) / (V * m + s - 1)));
      }
    }
}

static_assert(tp::schedule<tp::interleaved_1f1b<2>, 4, 8>::deadlock_free);
static_assert(tp::schedule<tp::interleaved_1f1b<2>, 4, 8>::bubble_over_ideal == 3.0 / 16.0);
static_assert(tp::schedule<tp::interleaved_1f1b<2>, 4, 8>::simulated.makespan == 2 * (16 + 3));
static_assert(tp::schedule<tp::one_f_one_b, 4, 8>::simulated.makespan == 2 * (8 + 3));
static_assert(tp::schedule<tp::interleaved_1f1b<3>, 2, 4>::steps_per_stage == 24);
// P = 2, V = 2, M = 2: stage 1 warms up with (V - 1) P = 2 forwards (chunks 0 then 1 of
// micro-batch 0 and 1: g = 1 and g = 3, the model's last chunk), then alternates.
static_assert(tp::schedule<tp::interleaved_1f1b<2>, 2, 2>::at(1, 2) ==
              tp::step{1, 0, tp::pass::forward, 1});
static_assert(tp::schedule<tp::interleaved_1f1b<2>, 2, 2>::at(1, 3) ==
              tp::step{1, 0, tp::pass::backward, 1});

} // namespace

TEST_CASE("schedule: interleaved 1F1B tables, bubble (P - 1)/(V M) of the ideal time",
          "[parallel]") {
  check_interleaved<1>();
  check_interleaved<2>();
  check_interleaved<3>();
  check_interleaved<4>();
}

TEST_CASE("schedule: interleaving divides 1F1B's bubble by V", "[parallel]") {
  for (int s = 2; s <= 8; ++s)
    for (int m = s; m <= 3 * s; m += s) {
      const table one = make<tp::one_f_one_b>(s, m), two = make<tp::interleaved_1f1b<2>>(s, m);
      std::vector<long> f1(one.steps.size()), f2(two.steps.size());
      // A stage's forward costs 2 units, backward 4; a chunk of V = 2 half of that.
      const tp::simulation r1 = tp::simulate(one.steps.data(), s, m, f1.data(), 2, 4);
      const tp::simulation r2 = tp::simulate(two.steps.data(), s, 2, m, f2.data(), 1, 2);
      CHECK(r1.busy == r2.busy); // the same work
      CHECK(2 * (r2.makespan - r2.busy) == r1.makespan - r1.busy);
    }
}

TEST_CASE("schedule: the checks reject broken tables", "[parallel]") {
  using tp::pass;
  // Well formed, but stage 0 waits for B0 before it sends F1, while stage 1 runs F1 before
  // B0 (it wants B1 first): a cycle of waits, a deadlock only the simulation finds.
  table dead{2,
             2,
             {{0, 0, pass::forward},
              {0, 0, pass::backward},
              {0, 1, pass::forward},
              {0, 1, pass::backward},
              {1, 0, pass::forward},
              {1, 1, pass::forward},
              {1, 1, pass::backward},
              {1, 0, pass::backward}}};
  CHECK(tp::well_formed(dead.steps.data(), 2, 2));
  std::vector<long> finish(8);
  CHECK_FALSE(tp::simulate(dead.steps.data(), 2, 2, finish.data()).deadlock_free);
  // Gradients sent B1, B0 by stage 1 but received B0, B1 by stage 0.
  CHECK_FALSE(tp::sends_match_receives(dead.steps.data(), 2, 2));

  table backward_first = make<tp::gpipe>(2, 2);
  std::swap(backward_first.steps[0], backward_first.steps[2]); // B0 before F0 on stage 0
  CHECK_FALSE(tp::well_formed(backward_first.steps.data(), 2, 2));

  table missing = make<tp::one_f_one_b>(3, 3);
  missing.steps[4].micro_batch = 0; // stage 0 runs micro-batch 0 twice, another never
  CHECK_FALSE(tp::well_formed(missing.steps.data(), 3, 3));
}
