// Loss scaling: unscaling, skipped steps on injected inf/NaN gradients (masters, optimizer state
// and step counter bit-identical), PyTorch GradScaler's backoff and growth rules, the bounds,
// and the hysteresis policies.
#include "support/host_access.hpp"
#include "train_testing.hpp"

#include <tessera/train.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

const float inf = std::numeric_limits<float>::infinity();
const float qnan = std::numeric_limits<float>::quiet_NaN();

auto make_params() {
  return boost::hana::make_tuple(nn::parameter<extents<5>>("a", {}),
                                 nn::parameter<extents<31, 3>>("b", {}),
                                 nn::parameter<extents<20011>>("c", {}));
}

// Sets element i of the k-th parameter's gradient (through a host mirror: the gradients live
// in the default memory space).
template <class Params>
void poke_grad(const Params& params, std::size_t k, index_t i, float v) {
  std::size_t j = 0;
  boost::hana::for_each(params, [&](const auto& p) {
    if (j++ == k) set_element(p.grad, i, v);
  });
}

} // namespace

TEMPLATE_LIST_TEST_CASE("unscale_and_check divides by the scale and detects inf and NaN",
                        "[train][scaler]", train_exec_spaces) {
  const TestType exec{};
  auto params = make_params();
  randomize_params(params, 3);
  const auto before = snapshot_params(params);

  SECTION("a power-of-two scale unscales exactly") {
    train::static_scaler s{1024.f};
    REQUIRE(s.unscale_and_check(exec, params));
    const auto after = snapshot_params(params);
    for (std::size_t t = 1; t < after.size(); t += 2) // grads
      for (std::size_t i = 0; i < after[t].size(); ++i)
        REQUIRE(after[t][i] == before[t][i] / 1024.f);
    for (std::size_t t = 0; t < after.size(); t += 2) REQUIRE(bitwise_equal(after[t], before[t]));
  }
  SECTION("a scale that is not a power of two: within one rounding of g / s") {
    train::static_scaler s{3.f};
    REQUIRE(s.unscale_and_check(exec, params));
    const auto after = snapshot_params(params);
    // g * fl(1/3): fl(1/3) is within u of 1/3 and the product rounds once more: 2u relative,
    // u = 2^-24.
    for (std::size_t t = 1; t < after.size(); t += 2)
      for (std::size_t i = 0; i < after[t].size(); ++i)
        REQUIRE(std::abs(after[t][i] - before[t][i] / 3.0) <=
                2 * 0x1p-24 * std::abs(before[t][i] / 3.0));
  }
  SECTION("scale 1 only checks") {
    train::static_scaler s{};
    REQUIRE(s.unscale_and_check(exec, params));
    REQUIRE(snapshot_params(params) == before);
  }
  SECTION("inf or NaN anywhere is found") {
    struct spot {
      std::size_t param;
      index_t index;
    };
    for (const spot sp :
         {spot{0, 0}, spot{0, 4}, spot{1, 46}, spot{2, 0}, spot{2, 12345}, spot{2, 20010}}) {
      for (const float bad : {inf, -inf, qnan}) {
        INFO("parameter " << sp.param << ", element " << sp.index << ", value " << bad);
        randomize_params(params, 3);
        poke_grad(params, sp.param, sp.index, bad);
        train::static_scaler s{2.f};
        REQUIRE_FALSE(s.unscale_and_check(exec, params));
        train::dynamic_scaler<> d;
        poke_grad(params, sp.param, sp.index, bad);
        REQUIRE_FALSE(d.unscale_and_check(exec, params));
      }
    }
  }
  SECTION("a finite gradient that overflows when unscaled counts as an overflow") {
    train::dynamic_scaler<> d({.init_scale = 0.25f, .min_scale = 0.125f});
    poke_grad(params, 1, 7, 2e38f); // 2e38 * 4 > FLT_MAX
    REQUIRE_FALSE(d.unscale_and_check(exec, params));
  }
}

TEMPLATE_LIST_TEST_CASE("a skipped step leaves masters, optimizer state and step counter "
                        "bit-identical and halves the scale",
                        "[train][scaler]", train_exec_spaces) {
  const TestType exec{};
  auto check_optimizer = [&](auto opt) {
    auto params = make_params();
    randomize_params(params, 8);
    train::dynamic_scaler<> scaler;
    REQUIRE(scaler.scale() == 65536.f); // PyTorch's initial 2^16
    // Two clean steps so the optimizer has state to protect.
    for (int s = 0; s < 2; ++s) {
      randomize_params(params, 100 + s); // fresh values and grads (scaled grads, say)
      REQUIRE(train::step(exec, opt, scaler, params));
    }
    REQUIRE(opt.steps() == 2);
    REQUIRE(scaler.growth_tracker() == 2);
    for (const float bad : {inf, -inf, qnan}) {
      INFO("injected " << bad);
      randomize_params(params, 200);
      poke_grad(params, 2, 777, bad);
      const auto masters = snapshot_params(params);
      const auto state = snapshot_state(opt.state);
      const float scale = scaler.scale();
      REQUIRE_FALSE(train::step(exec, opt, scaler, params));
      const auto after = snapshot_params(params);
      for (std::size_t t = 0; t < after.size(); t += 2) // values: bit-identical
        REQUIRE(bitwise_equal(after[t], masters[t]));
      REQUIRE(snapshot_state(opt.state) == state);
      for (std::size_t b = 0; b < state.size(); ++b)
        REQUIRE(bitwise_equal(snapshot_state(opt.state)[b], state[b]));
      REQUIRE(opt.steps() == 2);
      REQUIRE(scaler.scale() == scale * 0.5f);
      REQUIRE(scaler.growth_tracker() == 0);
    }
    // And the next clean step is applied.
    randomize_params(params, 300);
    const auto masters = snapshot_params(params);
    REQUIRE(train::step(exec, opt, scaler, params));
    REQUIRE(opt.steps() == 3);
    REQUIRE_FALSE(snapshot_params(params)[0] == masters[0]);
  };
  check_optimizer(train::sgd{.lr = 0.1f, .momentum = 0.9f});
  check_optimizer(
      train::sgd{.lr = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 0.01f});
  check_optimizer(train::adamw{});
}

TEST_CASE("a skipped first step creates no optimizer state", "[train][scaler]") {
  const auto exec = exec_space(); // the default space, where the parameters live
  auto params = make_params();
  randomize_params(params, 4);
  poke_grad(params, 0, 0, qnan);
  train::adamw opt{};
  train::static_scaler s{};
  REQUIRE_FALSE(train::step(exec, opt, s, params));
  REQUIRE(opt.steps() == 0);
  REQUIRE_FALSE(opt.state.created);
}

TEST_CASE("dynamic scaler: growth after the interval, backoff, reset of the count",
          "[train][scaler]") {
  train::dynamic_scaler<> s({.init_scale = 1024.f, .growth_interval = 3});
  // Script of step outcomes and the scale after each, by the GradScaler rules:
  // clean steps count up; the 3rd consecutive clean step doubles; an overflow halves and
  // restarts the count.
  struct event {
    bool finite;
    float scale;
    std::int64_t tracker;
  };
  const std::vector<event> script = {
      {true, 1024.f, 1}, {true, 1024.f, 2},  {true, 2048.f, 0}, // grow at the 3rd
      {true, 2048.f, 1}, {false, 1024.f, 0},                    // overflow: halve, restart
      {true, 1024.f, 1}, {true, 1024.f, 2},  {false, 512.f, 0}, // restarted before growing
      {false, 256.f, 0}, {true, 256.f, 1},   {true, 256.f, 2},  {true, 512.f, 0},
  };
  for (std::size_t k = 0; k < script.size(); ++k) {
    INFO("event " << k);
    s.update(script[k].finite);
    REQUIRE(s.scale() == script[k].scale);
    REQUIRE(s.growth_tracker() == script[k].tracker);
  }
  // PyTorch's defaults: 2000 clean steps to double.
  train::dynamic_scaler<> d;
  for (int k = 0; k < 1999; ++k) d.update(true);
  REQUIRE(d.scale() == 65536.f);
  d.update(true);
  REQUIRE(d.scale() == 131072.f);
}

TEST_CASE("dynamic scaler: never above 2^127, never below the floor", "[train][scaler]") {
  SECTION("upper bound") {
    train::dynamic_scaler<> s({.init_scale = 0x1p125f, .growth_interval = 1});
    s.update(true);
    REQUIRE(s.scale() == 0x1p126f);
    s.update(true);
    REQUIRE(s.scale() == 0x1p127f);
    for (int k = 0; k < 10; ++k) {
      s.update(true);
      REQUIRE(s.scale() == 0x1p127f);
      REQUIRE(std::isfinite(s.scale()));
    }
    // A growth factor that jumps past the ceiling is clamped to it.
    train::dynamic_scaler<> t(
        {.init_scale = 0x1p120f, .growth_factor = 1024.f, .growth_interval = 1});
    t.update(true);
    REQUIRE(t.scale() == 0x1p127f);
  }
  SECTION("lower bound (default floor 1, and a configured one)") {
    train::dynamic_scaler<> s({.init_scale = 8.f});
    for (const float expected : {4.f, 2.f, 1.f, 1.f, 1.f}) {
      s.update(false);
      REQUIRE(s.scale() == expected);
    }
    train::dynamic_scaler<> t({.init_scale = 1.f, .min_scale = 0x1p-10f});
    for (int k = 1; k <= 14; ++k) {
      t.update(false);
      REQUIRE(t.scale() == std::ldexp(1.f, std::max(-k, -10)));
    }
  }
  SECTION("inconsistent configurations are refused") {
    using cfg = train::dynamic_scaler_config;
    REQUIRE_THROWS_AS(train::dynamic_scaler<>(cfg{.init_scale = 0.5f}), value_error); // < floor
    REQUIRE_THROWS_AS(train::dynamic_scaler<>(cfg{.growth_factor = 1.f}), value_error);
    REQUIRE_THROWS_AS(train::dynamic_scaler<>(cfg{.backoff_factor = 1.f}), value_error);
    REQUIRE_THROWS_AS(train::dynamic_scaler<>(cfg{.growth_interval = 0}), value_error);
    REQUIRE_THROWS_AS(train::dynamic_scaler<>(cfg{.min_scale = 0.f}), value_error);
    REQUIRE_THROWS_AS(train::dynamic_scaler<>(cfg{.max_scale = inf}), value_error);
    REQUIRE_THROWS_AS(train::static_scaler(0.f), value_error);
    REQUIRE_THROWS_AS(train::static_scaler(qnan), value_error);
  }
}

TEST_CASE("hysteresis: back off only after N consecutive overflows", "[train][scaler]") {
  train::dynamic_scaler<train::hysteresis_policy<3>> s(
      {.init_scale = 1024.f, .growth_interval = 100});
  s.update(false);
  s.update(false);
  REQUIRE(s.scale() == 1024.f); // two overflows tolerated
  s.update(true);               // a clean step refills the budget
  s.update(false);
  s.update(false);
  REQUIRE(s.scale() == 1024.f);
  s.update(false); // the third consecutive one backs off
  REQUIRE(s.scale() == 512.f);
  s.update(false); // and every further consecutive one
  REQUIRE(s.scale() == 256.f);
  REQUIRE(s.policy().state() == 1);
  s.update(true);
  REQUIRE(s.policy().state() == 3);
  s.update(false);
  REQUIRE(s.scale() == 256.f);
  // An overflow still restarts the growth count.
  REQUIRE(s.growth_tracker() == 0);
}

TEST_CASE("hysteresis refilled only at growth (Megatron-LM)", "[train][scaler]") {
  train::dynamic_scaler<train::hysteresis_policy<2, train::hysteresis_reset::on_growth>> s(
      {.init_scale = 64.f, .growth_interval = 2});
  s.update(false); // budget 2 -> 1, no backoff
  REQUIRE(s.scale() == 64.f);
  s.update(true);  // clean, but no refill
  s.update(false); // budget exhausted: back off
  REQUIRE(s.scale() == 32.f);
  s.update(true);
  s.update(true); // growth: 64, budget refilled
  REQUIRE(s.scale() == 64.f);
  s.update(false);
  REQUIRE(s.scale() == 64.f);
  // torch_policy backs off at once, for comparison.
  train::dynamic_scaler<train::torch_policy> t({.init_scale = 64.f});
  t.update(false);
  REQUIRE(t.scale() == 32.f);
}

TEST_CASE("scaler restore validates before changing anything", "[train][scaler]") {
  train::dynamic_scaler<train::hysteresis_policy<4>> s(
      {.init_scale = 256.f, .growth_interval = 10});
  s.restore(2048.f, 7, 2);
  REQUIRE(s.scale() == 2048.f);
  REQUIRE(s.growth_tracker() == 7);
  REQUIRE(s.policy().state() == 2);
  REQUIRE_THROWS_AS(s.restore(0.5f, 1, 1), value_error);   // below the floor
  REQUIRE_THROWS_AS(s.restore(512.f, 10, 1), value_error); // tracker >= interval
  REQUIRE_THROWS_AS(s.restore(512.f, 1, 5), value_error);  // policy state > N
  REQUIRE(s.scale() == 2048.f);
  REQUIRE(s.growth_tracker() == 7);
  REQUIRE(s.policy().state() == 2);
}
