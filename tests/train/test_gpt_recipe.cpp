// Issue 14's training machinery: the warm-up + cosine schedule at chosen steps against
// hand-computed values; global-norm clipping of a known vector (norm 13) and its handling of
// non-finite gradients; gradient accumulation over micro-batches equal to one big batch within
// fp32 rounding; AdamW's decay on matrices only; checkpoints of the schedule position and the
// accumulation state (round trip, bit-identical resume, refusals).
#include "support/messages.hpp"
#include "train_testing.hpp"

#include <tessera/train.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/grad_accumulation.hpp>
#include <tessera/train/grad_clip.hpp>
#include <tessera/train/lr_schedule.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT
namespace fs = std::filesystem;
namespace hana = boost::hana;

namespace {

// Parameters in the default memory space, run on each space of train_exec_spaces (every host
// space in a host build, the device space in a device one); values go through host copies
// (upload, snapshot).
template <class Ext>
using dparam = nn::parameter<Ext>;

train::warmup_cosine gpt_schedule() {
  return {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 100, .total_steps = 2000};
}

} // namespace

TEST_CASE("warmup_cosine: hand-computed values at chosen steps", "[train][schedule]") {
  const auto s = gpt_schedule();
  // warm-up: lr * (step + 1) / (warmup + 1)
  CHECK(s.lr_at(0) == static_cast<float>(1e-3 / 101.0));
  CHECK(s.lr_at(49) == static_cast<float>(1e-3 * 50.0 / 101.0));
  CHECK(s.lr_at(99) == static_cast<float>(1e-3 * 100.0 / 101.0));
  // the cosine starts at the peak
  CHECK(s.lr_at(100) == 1e-3f);
  // a quarter of the decay: cos(pi / 4) = 0.70710678...; 1e-4 + 9e-4 * 0.85355339 = 8.68198e-4
  CHECK(s.lr_at(575) == Approx(8.6819805e-4).epsilon(1e-6));
  // half way: (lr + min_lr) / 2
  CHECK(s.lr_at(1050) == Approx(5.5e-4).epsilon(1e-6));
  // three quarters: 1e-4 + 9e-4 * 0.14644661 = 2.3180195e-4
  CHECK(s.lr_at(1525) == Approx(2.3180195e-4).epsilon(1e-6));
  // the floor at the end and after it
  CHECK(s.lr_at(2000) == 1e-4f);
  CHECK(s.lr_at(1'000'000) == 1e-4f);
  // monotone decay after the warm-up
  for (std::int64_t k = 100; k < 2000; ++k) CHECK(s.lr_at(k + 1) <= s.lr_at(k));
  // no warm-up: the cosine from step 0
  const train::warmup_cosine nw{.lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4};
  CHECK(nw.lr_at(0) == 2.f);
  CHECK(nw.lr_at(2) == Approx(1.0).epsilon(1e-7));
  CHECK(nw.lr_at(4) == 0.f);
}

TEST_CASE("warmup_cosine and lr_scheduler refuse bad arguments", "[train][schedule]") {
  auto s = gpt_schedule();
  s.min_lr = 2e-3;
  CHECK_THROWS_MATCHES(s.lr_at(0), value_error, what_contains({"warmup_cosine", "min_lr"}));
  s = gpt_schedule();
  s.warmup_steps = 2001;
  CHECK_THROWS_MATCHES(s.validate(), value_error, what_contains({"warmup_steps", "2001"}));
  s = gpt_schedule();
  s.total_steps = 0;
  CHECK_THROWS_MATCHES(s.validate(), value_error, what_contains({"total_steps", "0"}));
  s = gpt_schedule();
  s.lr = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_MATCHES(s.validate(), value_error, what_contains({"lr must be finite"}));
  s = gpt_schedule();
  s.lr = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(s.validate(), value_error);
  CHECK_THROWS_MATCHES(gpt_schedule().lr_at(-1), value_error, what_contains({"lr_at", "-1"}));

  train::lr_scheduler sch{.schedule = gpt_schedule()};
  CHECK(sch.next() == gpt_schedule().lr_at(0));
  CHECK(sch.next() == gpt_schedule().lr_at(1));
  CHECK(sch.position == 2);
  CHECK(sch.current() == gpt_schedule().lr_at(2));
}

TEMPLATE_LIST_TEST_CASE("clip_grad_norm: a known vector of norm 13", "[train][clip]",
                        train_exec_spaces) {
  INFO("execution space " << TestType::name());
  const TestType exec{};
  dparam<extents<2>> a("a", {});
  dparam<extents<1, 1>> b("b", {});
  const auto params = hana::make_tuple(a, b);
  const auto set = [&](float x, float y, float z) {
    upload(a.grad, {x, y});
    upload(b.grad, {z});
  };
  SECTION("clipped to 1: every element times 1 / (13 + 1e-6)") {
    set(3.f, 4.f, 12.f);
    const double n = train::clip_grad_norm(exec, params, 1.0);
    CHECK(n == 13.0);
    const float c = static_cast<float>(1.0 / (13.0 + 1e-6));
    CHECK(snapshot(a.grad) == std::vector<float>{3.f * c, 4.f * c});
    CHECK(snapshot(b.grad) == std::vector<float>{12.f * c});
    CHECK(train::grad_norm(exec, params) == Approx(1.0).epsilon(1e-6));
  }
  SECTION("below the bound: unchanged") {
    set(3.f, 4.f, 12.f);
    CHECK(train::clip_grad_norm(exec, params, 13.5) == 13.0);
    CHECK(snapshot(a.grad) == std::vector<float>{3.f, 4.f});
    CHECK(snapshot(b.grad) == std::vector<float>{12.f});
  }
  SECTION("a non-finite gradient: the norm is returned, the gradients are untouched") {
    set(3.f, std::numeric_limits<float>::quiet_NaN(), 12.f);
    CHECK(std::isnan(train::clip_grad_norm(exec, params, 1.0)));
    CHECK(snapshot(a.grad)[0] == 3.f);
    CHECK(snapshot(b.grad) == std::vector<float>{12.f});
    set(std::numeric_limits<float>::infinity(), 4.f, 12.f);
    CHECK(std::isinf(train::clip_grad_norm(exec, params, 1.0)));
    CHECK(snapshot(a.grad)[1] == 4.f);
  }
  SECTION("bad max_norm") {
    CHECK_THROWS_MATCHES(train::clip_grad_norm(exec, params, 0.0), value_error,
                         what_contains({"clip_grad_norm", "max_norm"}));
    CHECK_THROWS_AS(train::clip_grad_norm(exec, params, std::nan("")), value_error);
  }
}

TEMPLATE_LIST_TEST_CASE("grad_norm is accumulated in double", "[train][clip]", train_exec_spaces) {
  INFO("execution space " << TestType::name());
  // 2^24 + 1 elements: one 1 and 2^24 of 2^-12 (squares 2^-24): the float sum of squares
  // 1 + 2^24 * 2^-24 = 2 cannot be formed in float one element at a time (1 + 2^-24 rounds to
  // 1), the double sum is exact: norm sqrt(2).
  const TestType exec{};
  constexpr index_t n = (index_t{1} << 24) + 1;
  dparam<extents<n>> g("g", {});
  std::vector<float> v(n, 0x1p-12f);
  v[0] = 1.f;
  upload(g.grad, v);
  CHECK(train::grad_norm(exec, hana::make_tuple(g)) == Approx(std::sqrt(2.0)).epsilon(1e-12));
}

TEMPLATE_LIST_TEST_CASE("clipped_step: skips non-finite steps, clips then steps finite ones",
                        "[train][clip]", train_exec_spaces) {
  INFO("execution space " << TestType::name());
  const TestType exec{};
  dparam<extents<2>> w("w", {});
  const auto params = hana::make_tuple(w);
  upload(w.value, {1.f, 1.f});
  train::sgd opt{.lr = 1.f};
  train::dynamic_scaler<> scaler(train::dynamic_scaler_config{.init_scale = 4.f});
  // scaled gradient (12, 16) -> unscaled (3, 4), norm 5 -> clipped to norm 1: (0.6, 0.8)
  upload(w.grad, {12.f, 16.f});
  auto r = train::clipped_step(exec, opt, scaler, params, 1.0);
  CHECK(r.applied);
  CHECK(r.norm == 5.0);
  const float c = static_cast<float>(1.0 / (5.0 + 1e-6));
  CHECK(snapshot(w.value) == std::vector<float>{1.f - 3.f * c, 1.f - 4.f * c});
  const auto before = snapshot(w.value);
  upload(w.grad, {std::numeric_limits<float>::infinity(), 1.f});
  r = train::clipped_step(exec, opt, scaler, params, 1.0);
  CHECK_FALSE(r.applied);
  CHECK(std::isnan(r.norm));
  CHECK(bitwise_equal(snapshot(w.value), before));
  CHECK(opt.steps() == 1);
  CHECK(scaler.scale() == 2.f);
}

TEMPLATE_LIST_TEST_CASE("grad_accumulator: 4 micro-batches of 2 equal one batch of 8",
                        "[train][accum]", train_exec_spaces) {
  INFO("execution space " << TestType::name());
  // y = W x, loss = mean over samples of 0.5 * ||W x - t||^2: dL/dW = mean_s (W x_s - t_s) x_s^T.
  // Each micro-batch's "backward" overwrites W.grad with its own mean gradient (as layers do).
  const TestType exec{};
  constexpr int out = 3, in = 5, samples = 8;
  dparam<extents<out, in>> w("w", {});
  dparam<extents<out>> bias("b", {});
  const auto params = hana::make_tuple(w, bias);
  const counter_rng rng{11, 0};
  std::vector<float> wv(out * in), x(samples * in), t(samples * out);
  for (int i = 0; i < out * in; ++i) wv[i] = rng.uniform01(i) - 0.5f;
  for (int i = 0; i < samples * in; ++i) x[i] = 2.f * rng.uniform01(1000 + i) - 1.f;
  for (int i = 0; i < samples * out; ++i) t[i] = rng.uniform01(2000 + i);
  const auto grads = [&](int first, int count) {
    std::vector<double> gw(out * in, 0.0), gb(out, 0.0);
    for (int s = first; s < first + count; ++s)
      for (int o = 0; o < out; ++o) {
        double r = -t[s * out + o];
        for (int i = 0; i < in; ++i) r += double(wv[o * in + i]) * x[s * in + i];
        for (int i = 0; i < in; ++i) gw[o * in + i] += r * x[s * in + i] / count;
        gb[o] += r / count;
      }
    return std::pair{std::vector<float>(gw.begin(), gw.end()),
                     std::vector<float>(gb.begin(), gb.end())};
  };
  train::grad_accumulator acc;
  CHECK_THROWS_MATCHES(acc.finish(exec, params), value_error,
                       what_contains({"grad_accumulator::finish", "no micro-batch"}));
  for (int m = 0; m < 4; ++m) {
    const auto [gw, gb] = grads(2 * m, 2);
    upload(w.grad, gw);
    upload(bias.grad, gb);
    acc.accumulate(exec, params);
  }
  CHECK(acc.count() == 4);
  acc.finish(exec, params);
  CHECK(acc.count() == 0);
  const auto [fw, fb] = grads(0, samples);
  const auto gw = snapshot(w.grad), gb = snapshot(bias.grad);
  for (int i = 0; i < out * in; ++i) CHECK(gw[i] == Approx(fw[i]).margin(1e-6).epsilon(1e-5));
  for (int i = 0; i < out; ++i) CHECK(gb[i] == Approx(fb[i]).margin(1e-6).epsilon(1e-5));
  // the sums were cleared: one more micro-batch alone gives its own gradient
  const auto [g0w, g0b] = grads(0, 2);
  upload(w.grad, g0w);
  upload(bias.grad, g0b);
  acc.accumulate(exec, params);
  acc.finish(exec, params);
  CHECK(snapshot(w.grad) == g0w);
  // other parameters refused
  dparam<extents<out>> other("other", {});
  CHECK_THROWS_AS(acc.accumulate(exec, hana::make_tuple(w, other)), shape_error);
}

TEMPLATE_LIST_TEST_CASE("adamw decay_rule::matrices decays rank >= 2 parameters only",
                        "[train][optim]", train_exec_spaces) {
  INFO("execution space " << TestType::name());
  const TestType exec{};
  for (const auto rule : {train::decay_rule::all, train::decay_rule::matrices}) {
    dparam<extents<2, 2>> w("w", {});
    dparam<extents<2>> b("b", {});
    const auto params = hana::make_tuple(w, b);
    upload(w.value, {1.f, 2.f, 3.f, 4.f});
    upload(b.value, {5.f, 6.f});
    // zero gradients: m = v = 0, the Adam term is 0 / eps = 0, only the decay moves the weights
    train::adamw opt{.lr = 0.1f, .weight_decay = 0.5f, .decay_on = rule};
    opt.step(exec, params);
    const float d = static_cast<float>(1.0 - 0.1f * 0.5f);
    CHECK(snapshot(w.value) == std::vector<float>{1.f * d, 2.f * d, 3.f * d, 4.f * d});
    if (rule == train::decay_rule::all)
      CHECK(snapshot(b.value) == std::vector<float>{5.f * d, 6.f * d});
    else
      CHECK(snapshot(b.value) == std::vector<float>{5.f, 6.f});
  }
  // the default is unchanged: every parameter decays
  CHECK(train::adamw{}.decay_on == train::decay_rule::all);
}

namespace {

/// A run with every piece: AdamW (matrices-only decay), the schedule, clipping and accumulation
/// of 2 micro-batches per step on a least-squares problem; gradients computed on the host.
struct gpt_like_run {
  static constexpr int out = 3, in = 4, micro = 2, per_micro = 3;
  Kokkos::DefaultExecutionSpace exec;
  dparam<extents<out, in>> w{"w", {}};
  dparam<extents<out>> b{"b", {}};
  train::adamw opt{
      .lr = 0.f, .beta2 = 0.95f, .weight_decay = 0.1f, .decay_on = train::decay_rule::matrices};
  train::static_scaler scaler{};
  train::lr_scheduler sched{
      .schedule = {.lr = 0.05, .min_lr = 0.005, .warmup_steps = 3, .total_steps = 12}};
  train::grad_accumulator acc;
  train::run_state run{.precision = "fp32"};

  gpt_like_run() {
    const counter_rng r{3, 0};
    std::vector<float> wv(out * in);
    for (int i = 0; i < out * in; ++i) wv[i] = r.uniform01(i) - 0.5f;
    upload(w.value, wv);
  }
  auto params() const { return hana::make_tuple(w, b); }

  /// One micro-batch's gradient into w.grad / b.grad (overwriting), samples from the step.
  void backward(std::int64_t step, int m) {
    const auto wv = snapshot(w.value), bv = snapshot(b.value);
    std::vector<float> gw(out * in, 0.f), gb(out, 0.f);
    const counter_rng r{5, static_cast<std::uint64_t>(step * micro + m)};
    for (int s = 0; s < per_micro; ++s) {
      float x[in];
      for (int i = 0; i < in; ++i) x[i] = 2.f * r.uniform01(s * in + i) - 1.f;
      for (int o = 0; o < out; ++o) {
        float y = bv[o];
        for (int i = 0; i < in; ++i) y += wv[o * in + i] * x[i];
        const float res = y - (0.3f * static_cast<float>(o) + x[(o + 1) % in] * 2.f);
        for (int i = 0; i < in; ++i) gw[o * in + i] += res * x[i] / per_micro;
        gb[o] += res / per_micro;
      }
    }
    upload(w.grad, gw);
    upload(b.grad, gb);
  }
  void micro_batch(int m) {
    backward(run.step, m);
    acc.accumulate(exec, params());
  }
  void finish_step() {
    acc.finish(exec, params());
    opt.set_lr(sched.next());
    train::clipped_step(exec, opt, scaler, params(), 0.5);
    ++run.step;
  }
  void steps(int n) {
    for (int k = 0; k < n; ++k) {
      for (int m = 0; m < micro; ++m) micro_batch(m);
      finish_step();
    }
  }
  void save(const fs::path& p) const {
    train::save_checkpoint(p, params(), opt, scaler, run, sched, acc);
  }
  void load(const fs::path& p) {
    train::load_checkpoint(p, params(), opt, scaler, run, sched, acc);
  }
};

fs::path scratch(const std::string& tag) {
  return fs::temp_directory_path() /
         ("tessera_gpt_recipe_" + tag + "_" + std::to_string(::getpid()) + ".tsr");
}

} // namespace

TEST_CASE("checkpoint: schedule position and accumulation state round trip and resume",
          "[train][checkpoint]") {
  const fs::path file = scratch("resume");
  SECTION("resume at a step boundary is bit-identical") {
    gpt_like_run full;
    full.steps(10);
    gpt_like_run first;
    first.steps(4);
    first.save(file);
    gpt_like_run second;
    second.load(file);
    CHECK(second.sched.position == 4);
    CHECK(second.run.step == 4);
    second.steps(6);
    CHECK(bitwise_equal(snapshot(second.w.value), snapshot(full.w.value)));
    CHECK(bitwise_equal(snapshot(second.b.value), snapshot(full.b.value)));
    CHECK(second.sched.position == 10);
  }
  SECTION("a checkpoint between micro-batches restores the sums: bit-identical") {
    gpt_like_run full;
    full.steps(6);
    gpt_like_run first;
    first.steps(3);
    first.micro_batch(0); // half of step 3
    first.save(file);
    gpt_like_run second;
    second.load(file);
    CHECK(second.acc.count() == 1);
    CHECK(bitwise_equal(snapshot_view(second.acc.state().slots[0][0]),
                        snapshot_view(first.acc.state().slots[0][0])));
    second.micro_batch(1);
    second.finish_step();
    second.steps(2);
    CHECK(bitwise_equal(snapshot(second.w.value), snapshot(full.w.value)));
    CHECK(bitwise_equal(snapshot(second.b.value), snapshot(full.b.value)));
  }
  SECTION("refusals: another schedule; a file without scheduler records") {
    gpt_like_run a;
    a.steps(2);
    a.save(file);
    gpt_like_run other;
    other.sched.schedule.total_steps = 13;
    CHECK_THROWS_MATCHES(other.load(file), value_error,
                         what_contains({"sched/warmup_cosine", "differs from the caller's"}));
    CHECK(other.sched.position == 0);
    CHECK(other.run.step == 0);
    // saved without the scheduler and the accumulator (as before issue 14)
    train::save_checkpoint(file, a.params(), a.opt, a.scaler, a.run);
    gpt_like_run c;
    CHECK_THROWS_MATCHES(c.load(file), value_error, what_contains({"no record 'sched/"}));
    // ...which still loads into a caller that passes neither
    train::load_checkpoint(file, c.params(), c.opt, c.scaler, c.run);
    CHECK(bitwise_equal(snapshot(c.w.value), snapshot(a.w.value)));
    // and a file with them is refused by a caller without them
    a.save(file);
    gpt_like_run d;
    CHECK_THROWS_MATCHES(train::load_checkpoint(file, d.params(), d.opt, d.scaler, d.run),
                         value_error, what_contains({"sched/", "no such entry"}));
  }
  std::error_code ec;
  fs::remove(file, ec);
}
