// Issue 12: every hyper-parameter of SGD, AdamW, the loss scalers and the fp8 recipes is checked
// against 0, -1, NaN, +inf, -inf (and a subnormal where it matters) at every entry point
// (step, validate, set_lr, constructors, restore); a refused value throws value_error naming the
// hyper-parameter, before any master weight, gradient or state buffer is written.
#include "support/messages.hpp"
#include "train_testing.hpp"

#include <tessera/train/adamw.hpp>
#include <tessera/train/fp8_recipe.hpp>
#include <tessera/train/loss_scaler.hpp>
#include <tessera/train/sgd.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

constexpr float nan_v = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_v = std::numeric_limits<float>::infinity();
constexpr float denorm_v = std::numeric_limits<float>::denorm_min();

auto make_params() {
  return boost::hana::make_tuple(nn::parameter<extents<5>>("a", {}),
                                 nn::parameter<extents<3, 4>>("b", {}));
}

/// Runs opt.step after one good step; with `set` applied to a copy of opt the step must throw
/// value_error naming `field`, leaving parameters, state and step count as they were; validate()
/// must throw too.
template <class Opt, class Set>
void expect_refused(const Opt& good, const char* field, float value, Set set) {
  const auto exec = exec_space(); // the default space, where the parameters live
  auto params = make_params();
  randomize_params(params, 5);
  Opt opt = good;
  opt.step(exec, params); // state exists
  const auto before = snapshot_params(params);
  const auto state_before = snapshot_state(opt.state);
  set(opt, value);
  INFO(field << " = " << value);
  CHECK_THAT(message_of<value_error>([&] { opt.step(exec, params); }),
             Catch::Contains(field) && Catch::Contains("step"));
  CHECK_THAT(message_of<value_error>([&] { opt.validate(); }), Catch::Contains(field));
  CHECK(snapshot_params(params) == before);
  CHECK(snapshot_state(opt.state) == state_before);
  CHECK(opt.steps() == 1);
  // A fresh optimizer with the bad value refuses its first step and creates no state.
  Opt fresh = good;
  set(fresh, value);
  auto p2 = make_params();
  randomize_params(p2, 6);
  const auto p2_before = snapshot_params(p2);
  CHECK_THROWS_AS(fresh.step(exec, p2), value_error);
  CHECK_FALSE(fresh.state.created);
  CHECK(snapshot_params(p2) == p2_before);
}

} // namespace

TEST_CASE("sgd refuses non-finite and out-of-range hyper-parameters at step, validate and "
          "set_lr",
          "[train][optim][hyper]") {
  const train::sgd good{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
  for (const float v : {-1.f, nan_v, inf_v, -inf_v}) {
    expect_refused(good, "lr", v, [](auto& o, float x) { o.lr = x; });
    expect_refused(good, "momentum", v, [](auto& o, float x) { o.momentum = x; });
    expect_refused(good, "weight_decay", v, [](auto& o, float x) { o.weight_decay = x; });
    expect_refused(good, "dampening", v, [](auto& o, float x) { o.dampening = x; });
  }
  expect_refused(good, "dampening", 1.5f, [](auto& o, float x) { o.dampening = x; });
  // set_lr: refused values leave lr as it was; a valid one is taken.
  train::sgd opt = good;
  for (const float v : {-1.f, nan_v, inf_v, -inf_v}) {
    INFO("set_lr(" << v << ")");
    CHECK_THAT(message_of<value_error>([&] { opt.set_lr(v); }),
               Catch::Contains("tessera::train::sgd::set_lr") && Catch::Contains("lr"));
    CHECK(opt.lr == 0.1f);
  }
  opt.set_lr(0.f);
  CHECK(opt.lr == 0.f);
  opt.set_lr(denorm_v); // a tiny learning rate is legal (the update is just tiny)
  CHECK(opt.lr == denorm_v);
  // The boundary values pass: lr 0, momentum 0, dampening 0 and 1, weight_decay 0.
  CHECK_NOTHROW(train::sgd{.lr = 0.f, .momentum = 0.f, .weight_decay = 0.f}.validate());
  CHECK_NOTHROW(train::sgd{.lr = 0.1f, .momentum = 0.5f, .dampening = 1.f}.validate());
}

TEST_CASE("adamw refuses non-finite and out-of-range hyper-parameters at step, validate and "
          "set_lr",
          "[train][optim][hyper]") {
  const train::adamw good{.lr = 1e-2f};
  for (const float v : {-1.f, nan_v, inf_v, -inf_v}) {
    expect_refused(good, "lr", v, [](auto& o, float x) { o.lr = x; });
    expect_refused(good, "weight_decay", v, [](auto& o, float x) { o.weight_decay = x; });
    expect_refused(good, "eps", v, [](auto& o, float x) { o.eps = x; });
    expect_refused(good, "beta1", v, [](auto& o, float x) { o.beta1 = x; });
    expect_refused(good, "beta2", v, [](auto& o, float x) { o.beta2 = x; });
  }
  expect_refused(good, "eps", 0.f, [](auto& o, float x) { o.eps = x; }); // 0 / 0 for zero grads
  expect_refused(good, "beta1", 1.f, [](auto& o, float x) { o.beta1 = x; });
  expect_refused(good, "beta2", 1.f, [](auto& o, float x) { o.beta2 = x; });
  expect_refused(good, "weight_decay", 200.f, [](auto& o, float x) { o.weight_decay = x; });
  train::adamw opt = good;
  for (const float v : {-1.f, nan_v, inf_v, -inf_v, 1000.f /* lr * weight_decay > 1 */}) {
    INFO("set_lr(" << v << ")");
    CHECK_THAT(message_of<value_error>([&] { opt.set_lr(v); }),
               Catch::Contains("tessera::train::adamw::set_lr"));
    CHECK(opt.lr == 1e-2f);
  }
  opt.set_lr(3e-4f);
  CHECK(opt.lr == 3e-4f);
  CHECK_NOTHROW(train::adamw{.eps = denorm_v}.validate()); // tiny but positive eps is legal
  // With a valid eps, a parameter whose gradients are all zero stays finite (eps 0 gave NaN).
  const auto exec = exec_space(); // the default space, where the parameters live
  auto params = make_params();
  randomize_params(params, 8);
  boost::hana::for_each(params, [](const auto& p) { fill(p.grad, 0.f); });
  train::adamw a{.eps = 1e-8f};
  a.step(exec, params);
  boost::hana::for_each(params, [](const auto& p) {
    for (const float v : snapshot(p.value)) CHECK(std::isfinite(v));
  });
}

TEST_CASE("loss scalers refuse zero, negative, non-finite and subnormal scales and factors",
          "[train][scaler][hyper]") {
  using cfg = train::dynamic_scaler_config;
  for (const float v : {0.f, -1.f, nan_v, inf_v, -inf_v, denorm_v}) {
    INFO("value " << v);
    CHECK_THAT(message_of<value_error>([&] { train::static_scaler s(v); }),
               Catch::Contains("tessera::train::static_scaler") && Catch::Contains("scale"));
    train::static_scaler s(4.f);
    CHECK_THROWS_AS(s.restore(v), value_error);
    CHECK(s.scale() == 4.f);
    CHECK_THROWS_AS(train::dynamic_scaler<>(cfg{.init_scale = v}), value_error);
    CHECK_THROWS_AS(train::dynamic_scaler<>(cfg{.growth_factor = v}), value_error);
    if (v != denorm_v) // (a subnormal backoff is legal: the floor catches it)
      CHECK_THROWS_AS(train::dynamic_scaler<>(cfg{.backoff_factor = v}), value_error);
    CHECK_THAT(message_of<value_error>([&] { train::dynamic_scaler<>(cfg{.min_scale = v}); }),
               Catch::Contains("min_scale"));
    CHECK_THAT(message_of<value_error>(
                   [&] { train::dynamic_scaler<>(cfg{.init_scale = 1.f, .max_scale = v}); }),
               Catch::Contains("max_scale"));
    train::dynamic_scaler<> d(cfg{.init_scale = 1024.f});
    CHECK_THROWS_AS(d.restore(v, 0, 0), value_error);
    CHECK(d.scale() == 1024.f);
  }
  // A subnormal floor would let 1 / scale overflow to inf when unscaling: refused above; the
  // smallest normal one is accepted.
  CHECK_NOTHROW(train::static_scaler(std::numeric_limits<float>::min()));
}

TEST_CASE("fp8 recipes refuse invalid margins, history lengths and amax algorithms",
          "[train][fp8][hyper]") {
  using namespace tessera::train;
  for (const int m : {-1, 65, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    INFO("margin " << m);
    CHECK_THAT(message_of<value_error>([&] { fp8_meta<current_scaling>({.margin = m}); }),
               Catch::Contains("margin"));
    CHECK_THROWS_AS(fp8_meta<delayed_scaling>({.margin = m}), value_error);
  }
  for (const int h : {0, -1, std::numeric_limits<int>::min()})
    CHECK_THAT(message_of<value_error>([&] { fp8_meta<delayed_scaling>({.history_len = h}); }),
               Catch::Contains("history_len"));
  CHECK_THAT(message_of<value_error>(
                 [&] { fp8_meta<delayed_scaling>({.amax_algo = static_cast<amax_algorithm>(7)}); }),
             Catch::Contains("amax_algo"));
  // restore: NaN, inf, negative and subnormal-sized scale amaxes are refused, state unchanged.
  fp8_meta<delayed_scaling> meta({.history_len = 4});
  meta.record(2.f);
  for (const float v : {-1.f, nan_v, inf_v, -inf_v, denorm_v}) {
    INFO("scale amax " << v);
    CHECK_THROWS_AS(meta.restore({1.f}, v), value_error);
    CHECK(meta.scale_amax() == 2.f);
    CHECK(meta.history() == std::vector<float>{2.f});
  }
  // The scale it produces is always a valid one (even for an amax near FLT_MAX and margin 64).
  fp8_meta<current_scaling> big({.margin = 64});
  const float s = big.scale<fp8_e4m3>(3e38f);
  CHECK(s >= std::numeric_limits<float>::min());
  CHECK(std::isfinite(s));
}
