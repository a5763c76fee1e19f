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
  const tp::step& at(int s, int k) const { return steps[s * 2 * micro_batches + k]; }
  int index(int s, int i, tp::pass kind) const {
    for (int k = 0; k < 2 * micro_batches; ++k)
      if (at(s, k).micro_batch == i && at(s, k).kind == kind) return s * 2 * micro_batches + k;
    return -1;
  }
};

template <class Kind>
table make(int s, int m) {
  table t{s, m, std::vector<tp::step>(2 * s * m)};
  tp::fill_schedule(Kind{}, s, m, t.steps.data());
  return t;
}

// Checks a simulated run against the dependency rules directly (independently of how
// simulate() orders its sweeps): on each stage steps run one at a time in table order; a
// forward starts after the previous stage's forward of that micro-batch ended; a backward
// after the next stage's backward (or, on the last stage, its own forward).
void check_timeline(const table& t, const std::vector<long>& finish, long f_cost, long b_cost) {
  const int per = 2 * t.micro_batches;
  for (int s = 0; s < t.stages; ++s)
    for (int k = 0; k < per; ++k) {
      const tp::step& st = t.at(s, k);
      const long end = finish[s * per + k];
      const long start = end - (st.kind == tp::pass::forward ? f_cost : b_cost);
      CHECK(start >= 0);
      if (k > 0) CHECK(start >= finish[s * per + k - 1]);
      if (st.kind == tp::pass::forward && s > 0)
        CHECK(start >= finish[t.index(s - 1, st.micro_batch, tp::pass::forward)]);
      if (st.kind == tp::pass::backward) {
        const int dep = s + 1 < t.stages ? t.index(s + 1, st.micro_batch, tp::pass::backward)
                                         : t.index(s, st.micro_batch, tp::pass::forward);
        CHECK(start >= finish[dep]);
      }
    }
}

int peak_alive(const table& t, int s) {
  int alive = 0, peak = 0;
  for (int k = 0; k < 2 * t.micro_batches; ++k) {
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
