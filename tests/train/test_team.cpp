// train/team.hpp: the governor's schedule against scripted step times (a quiet machine, a
// loaded one, a load that starts and stops, the switching margin, an outlier step, bad input),
// then the governor on Kokkos: each step runs on the team the schedule names, with that team's
// threads, and a small model trained through it matches the same training on the whole team.
#include "train_testing.hpp"

#include <tessera/nn/linear.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/train/sgd.hpp>
#include <tessera/train/team.hpp>

#include <catch2/catch.hpp>

#if defined(KOKKOS_ENABLE_OPENMP)
#include <omp.h>
#endif

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

using namespace tessera; // NOLINT: test file
using train::team_schedule;
using train::team_settings;

namespace {

/// Runs `steps` steps of a schedule whose step on the whole team takes full(i) and on the smaller
/// one reduced(i) (i: the step's index); returns which team each step ran on.
std::vector<bool> drive(team_schedule& s, index_t steps, const std::function<double(index_t)>& full,
                        const std::function<double(index_t)>& reduced) {
  std::vector<bool> teams;
  for (index_t i = 0; i < steps; ++i) {
    const bool r = s.reduced();
    teams.push_back(r);
    s.record(r ? reduced(i) : full(i));
  }
  return teams;
}

/// The steps the schedule spends probing with settings s over n steps when the running team
/// always wins: probes after first_period, then 4x further each time, capped at max_period.
index_t probe_steps_when_winning(const team_settings& s, index_t n) {
  index_t probes = 0, at = 0, period = s.first_period;
  while (true) {
    at += period;
    if (at + s.probe_steps > n) break;
    at += s.probe_steps;
    probes += s.probe_steps;
    period = std::min(s.max_period, period * 4);
  }
  return probes;
}

} // namespace

TEST_CASE("team_schedule: on a quiet machine the whole team keeps running, probes grow 4x apart",
          "[train][team]") {
  for (const team_settings s :
       {team_settings{}, team_settings{.first_period = 5, .max_period = 100, .probe_steps = 1},
        team_settings{.first_period = 3, .max_period = 3, .probe_steps = 4}}) {
    team_schedule sch(s);
    const index_t n = 5000;
    const auto teams = drive(
        sch, n, [](index_t) { return 1.0; }, [](index_t) { return 1.8; });
    CHECK(sch.switches() == 0);
    CHECK_FALSE(sch.current());
    const index_t probed = probe_steps_when_winning(s, n);
    CHECK(sch.steps(true) == probed);
    CHECK(sch.steps(false) == n - probed);
    // Every probe is probe_steps consecutive steps on the smaller team.
    index_t run = 0;
    for (index_t i = 0; i < n; ++i) {
      if (teams[static_cast<std::size_t>(i)]) {
        ++run;
      } else {
        CHECK((run == 0 || run == s.probe_steps));
        run = 0;
      }
    }
  }
  // With the default settings a quiet run of 1000 steps spends under 2% of them probing.
  team_schedule sch;
  drive(
      sch, 1000, [](index_t) { return 1.0; }, [](index_t) { return 1.8; });
  CHECK(sch.steps(true) * 50 < 1000);
}

TEST_CASE("team_schedule: under load the smaller team takes over after the first probe and keeps "
          "it",
          "[train][team]") {
  const team_settings s{};
  team_schedule sch(s);
  const index_t n = 3000;
  const auto teams = drive(
      sch, n, [](index_t) { return 1.5; }, [](index_t) { return 1.0; });
  // The first first_period steps on the whole team, then the probe wins: the smaller team runs.
  for (index_t i = 0; i < s.first_period; ++i) CHECK_FALSE(teams[static_cast<std::size_t>(i)]);
  for (index_t i = s.first_period; i < s.first_period + s.probe_steps + 1; ++i)
    CHECK(teams[static_cast<std::size_t>(i)]);
  CHECK(sch.switches() == 1);
  CHECK(sch.current());
  // After the switch the whole team is probed first_period, then 4x further apart.
  CHECK(sch.steps(false) ==
        s.first_period + probe_steps_when_winning(s, n - s.first_period - s.probe_steps));
}

TEST_CASE("team_schedule: a load that starts and stops is followed within one period",
          "[train][team]") {
  const team_settings s{.first_period = 8, .max_period = 128, .probe_steps = 3};
  team_schedule sch(s);
  const index_t start = 1000, stop = 2500, n = 4000;
  auto loaded = [&](index_t i) { return i >= start && i < stop; };
  const auto teams = drive(
      sch, n, [&](index_t i) { return loaded(i) ? 2.7 : 1.0; },
      [&](index_t i) { return loaded(i) ? 1.6 : 1.8; });
  CHECK(sch.switches() == 2);
  CHECK_FALSE(sch.current());
  // Within a period and a probe (+ the probe that saw the change only in part) of each change.
  const index_t lag = s.max_period + 2 * s.probe_steps + 1;
  // Under the load, only probes of the whole team (probe_steps steps each) interrupt the smaller.
  index_t run = 0;
  for (index_t i = start + lag; i < stop; ++i) {
    if (!teams[static_cast<std::size_t>(i)]) {
      ++run;
    } else {
      INFO("step " << i);
      CHECK((run == 0 || run == s.probe_steps));
      run = 0;
    }
  }
  index_t reduced_loaded = 0, reduced_quiet = 0;
  for (index_t i = 0; i < n; ++i)
    (loaded(i) ? reduced_loaded : reduced_quiet) += teams[static_cast<std::size_t>(i)] ? 1 : 0;
  CHECK(reduced_loaded >= (stop - start) - lag - (stop - start) / s.first_period);
  CHECK(reduced_quiet <= lag + probe_steps_when_winning(s, n));
}

TEST_CASE("team_schedule: the other team must win by more than the margin, by its median",
          "[train][team]") {
  // 3% faster: under the 5% margin, no switch.
  {
    team_schedule sch;
    drive(
        sch, 2000, [](index_t) { return 1.0; }, [](index_t) { return 0.97; });
    CHECK(sch.switches() == 0);
  }
  // 10% faster: switch at the first probe.
  {
    team_schedule sch;
    drive(
        sch, 100, [](index_t) { return 1.0; }, [](index_t) { return 0.90; });
    CHECK(sch.switches() == 1);
    CHECK(sch.current());
  }
  // The first probe of a schedule with the default settings, the whole team at 1.0 per item,
  // the probe's steps at `rest` except its step `at`, which takes `outlier`.
  const team_settings defaults{};
  const auto first_probe = [&](index_t at, double outlier, double rest) {
    team_schedule sch(defaults);
    index_t probe_step = 0;
    for (index_t i = 0; i < defaults.first_period + defaults.probe_steps; ++i)
      sch.record(sch.reduced() ? (probe_step++ == at ? outlier : rest) : 1.0);
    CHECK_FALSE(sch.probing()); // the probe is over: decided
    return sch;
  };
  // One slow step in a probe (a first step's allocations, a preempted step) does not decide it:
  // the median of three does.
  CHECK(first_probe(0, 50.0, 0.5).switches() == 1);
  // ... nor does one fast outlier: no switch, the next probe 4 periods away.
  const team_schedule kept = first_probe(1, 0.01, 2.0);
  CHECK(kept.switches() == 0);
  CHECK(kept.period() == 4 * defaults.first_period);
}

TEST_CASE("team_schedule and team_settings: bad input is refused and changes nothing",
          "[train][team]") {
  team_schedule sch;
  for (index_t i = 0; i < 5; ++i) sch.record(1.0);
  for (const double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CHECK_THROWS_AS(sch.record(bad), value_error);
    CHECK_THROWS_WITH(sch.record(bad), Catch::Contains("team_schedule::record") &&
                                           Catch::Contains("finite and >= 0"));
  }
  CHECK(sch.steps(false) == 5);
  CHECK(sch.steps(true) == 0);
  CHECK_THROWS_WITH(team_schedule(team_settings{.first_period = 0}),
                    Catch::Contains("first_period 0"));
  CHECK_THROWS_WITH(team_schedule(team_settings{.first_period = 8, .max_period = 4}),
                    Catch::Contains("max_period 4 is below first_period 8"));
  CHECK_THROWS_WITH(team_schedule(team_settings{.probe_steps = 0}),
                    Catch::Contains("probe_steps 0"));
  CHECK_THROWS_WITH(team_schedule(team_settings{.gain = 1.0}), Catch::Contains("gain"));
  CHECK_THROWS_WITH(team_schedule(team_settings{.gain = std::nan("")}), Catch::Contains("gain"));
  CHECK_THROWS_AS(
      train::team_governor<>(Kokkos::DefaultExecutionSpace(), team_settings{.probe_steps = -2}),
      value_error);
}

namespace {

/// Whether this build's default space has a smaller team (see train/team.hpp).
bool expect_adaptive() {
#if defined(KOKKOS_ENABLE_OPENMP)
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::OpenMP>) {
#if TESSERA_KOKKOS_4 || defined(KOKKOS_ENABLE_SERIAL)
    return Kokkos::DefaultExecutionSpace().concurrency() >= 2;
#endif
  }
#endif
  return false;
}

} // namespace

TEST_CASE("team_governor: every step runs on the team its schedule names, with that team's "
          "threads",
          "[train][team]") {
  const auto exec = testing::exec_space();
  train::team_governor<> gov(
      exec, team_settings{.first_period = 2, .max_period = 2, .probe_steps = 1, .gain = 0.0});
  CHECK(gov.adaptive() == expect_adaptive());
  if (gov.adaptive()) {
    CHECK(gov.threads(false) == tessera::concurrency(exec));
    CHECK(gov.threads(true) >= 1);
    CHECK(gov.threads(true) < gov.threads(false));
  }
  const index_t n = 100000;
  Kokkos::View<double*> v("v", n);
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<>(exec, 0, n), KOKKOS_LAMBDA(index_t i) { v(i) = double(i); });
  exec.fence();
  index_t ran[2] = {0, 0};
  for (int step = 0; step < 40; ++step) {
    const bool want = gov.adaptive() && gov.schedule().reduced();
    gov.run(n, [&](const auto& ex) {
      using space = std::decay_t<decltype(ex)>;
      CHECK(tessera::concurrency(ex) == gov.threads(want));
      double sum = 0;
      Kokkos::parallel_reduce(
          "sum", Kokkos::RangePolicy<space>(ex, 0, n),
          KOKKOS_LAMBDA(index_t i, double& acc) { acc += v(i); }, sum);
      CHECK(sum == double(n) * double(n - 1) / 2);
      ++ran[tessera::concurrency(ex) < tessera::concurrency(exec) ? 1 : 0];
    });
  }
  // Probes every second step alternate the teams whatever the timing: both ran.
  if (gov.adaptive()) {
    CHECK(ran[0] > 0);
    CHECK(ran[1] > 0);
    CHECK(gov.schedule().steps(true) == ran[1]);
  } else {
    CHECK(ran[1] == 0);
  }
  CHECK_THROWS_WITH(gov.run(0, [](const auto&) {}),
                    Catch::Contains("team_governor::run") && Catch::Contains("items 0"));
  // An exception from the step propagates and records nothing.
  const index_t before = gov.schedule().steps(false) + gov.schedule().steps(true);
  CHECK_THROWS_AS(gov.run(1, [](const auto&) { throw std::runtime_error("step failed"); }),
                  std::runtime_error);
  CHECK(gov.schedule().steps(false) + gov.schedule().steps(true) == before);
  // adapt = false: the whole team only.
  train::team_governor<> fixed(exec, {}, false);
  CHECK_FALSE(fixed.adaptive());
  for (int step = 0; step < 20; ++step)
    fixed.run(
        1, [&](const auto& ex) { CHECK(tessera::concurrency(ex) == tessera::concurrency(exec)); });
}

TEST_CASE("team_governor: a model trained through it matches the same training on the whole "
          "team",
          "[train][team]") {
  const auto exec = testing::exec_space();
  constexpr index_t batch = 96;
  Tensor<fp32, extents<dyn, 8>> x{"x", batch};
  Kokkos::View<int*> y{"y", batch};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto hx = Kokkos::create_mirror_view(x.kokkos_view());
  auto hy = Kokkos::create_mirror_view(y);
  for (index_t i = 0; i < x.size(); ++i) hx.data()[i] = u(rng);
  for (index_t i = 0; i < batch; ++i) hy(i) = static_cast<int>(rng() % 5);
  Kokkos::deep_copy(x.kokkos_view(), hx);
  Kokkos::deep_copy(y, hy);

  auto train_with = [&](bool adapt) {
    nn::Linear<8, 32> l1{1};
    nn::Linear<32, 5> l2{2};
    nn::SoftmaxCrossEntropy ce;
    train::sgd opt1{.lr = 0.1f, .momentum = 0.9f}, opt2 = opt1;
    train::team_governor<> gov(
        exec, team_settings{.first_period = 1, .max_period = 1, .probe_steps = 1, .gain = 0.0},
        adapt);
    for (int step = 0; step < 30; ++step)
      gov.run(batch, [&](const auto& ex) {
        const auto h = l1.forward(ex, x);
        const auto [loss, d] = ce.forward_backward(ex, l2.forward(ex, h), y, 1.f);
        l1.backward(ex, l2.backward(ex, d), false);
        opt1.step(ex, l1.parameters());
        opt2.step(ex, l2.parameters());
      });
    INFO("adaptive " << gov.adaptive());
    if (adapt && gov.adaptive()) CHECK(gov.schedule().steps(true) > 0);
    auto w = testing::snapshot(l1.weight().value);
    const auto w2 = testing::snapshot(l2.weight().value);
    w.insert(w.end(), w2.begin(), w2.end());
    return w;
  };
  const auto ref = train_with(false);
  const auto got = train_with(true);
  REQUIRE(got.size() == ref.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  // Only the rounding of sums split over threads may differ.
  CHECK(std::sqrt(num / den) < 1e-5);
}

TEST_CASE("tessera::concurrency: the threads of the instance itself, as its parallel regions run",
          "[train][team][config]") {
  const auto exec = testing::exec_space();
  CHECK(tessera::concurrency(exec) == exec.concurrency()); // the default instance: both agree
#if defined(KOKKOS_ENABLE_OPENMP) && TESSERA_KOKKOS_4
  // Kokkos 4's OpenMP instances of n threads (what the governor's smaller team is): the threads
  // a parallel_for on one really runs equal tessera::concurrency of it.
  for (int n = 1; n <= Kokkos::OpenMP().concurrency(); ++n) {
    const Kokkos::OpenMP part(n);
    CHECK(tessera::concurrency(part) == n);
    int most = 0;
    Kokkos::parallel_reduce(
        "threads", Kokkos::RangePolicy<Kokkos::OpenMP>(part, 0, 1000),
        [](int, int& m) { m = std::max(m, omp_get_num_threads()); }, Kokkos::Max<int>(most));
    CHECK(most <= n);
    if (n == 1) CHECK(most == 1);
  }
#endif
}
