// SGD (momentum, Nesterov, weight decay, dampening) and AdamW (bias correction, decoupled weight
// decay) against steps worked by hand and against straightforward double-precision
// re-implementations of PyTorch's update rules, over parameter sets of many shapes.
#include "support/host_access.hpp"
#include "train_testing.hpp"

#include <tessera/train/adamw.hpp>
#include <tessera/train/sgd.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

// ---- double-precision references (PyTorch's torch.optim.SGD / AdamW, written out) ----------

struct sgd_ref {
  double lr, momentum, weight_decay, dampening;
  bool nesterov;
  std::vector<double> buf{};
  bool has_buf = false;
  void step(std::vector<double>& w, const std::vector<double>& grad) {
    if (!has_buf) buf.assign(w.size(), 0.0);
    for (std::size_t i = 0; i < w.size(); ++i) {
      double g = grad[i] + weight_decay * w[i];
      if (momentum != 0.0) {
        buf[i] = has_buf ? momentum * buf[i] + (1.0 - dampening) * g : g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      w[i] -= lr * g;
    }
    has_buf = true;
  }
};

struct adamw_ref {
  double lr, beta1, beta2, eps, weight_decay;
  std::vector<double> m{}, v{};
  int t = 0;
  void step(std::vector<double>& w, const std::vector<double>& grad) {
    if (t == 0) m.assign(w.size(), 0.0), v.assign(w.size(), 0.0);
    ++t;
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] *= 1.0 - lr * weight_decay;
      m[i] = beta1 * m[i] + (1.0 - beta1) * grad[i];
      v[i] = beta2 * v[i] + (1.0 - beta2) * grad[i] * grad[i];
      const double m_hat = m[i] / (1.0 - std::pow(beta1, t));
      const double v_hat = v[i] / (1.0 - std::pow(beta2, t));
      w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

// Tolerance of an fp32 optimizer against the double reference after `steps` steps, relative to
// (1 + |w|): each step rounds each of its at most 8 float operations once, u = 2^-24 relative to
// operands of magnitude <= 1 + |w| (weights, gradients and updates are all O(1) here with
// lr <= 0.1), so 8 u ~ 4.8e-7 per step; 1e-6 per step leaves a factor 2 for propagation through
// the momentum / moment buffers.
double tolerance(int steps, double w) {
  return 1e-6 * steps * (1.0 + std::abs(w));
}

std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// A set of parameters of odd, prime, tiny and larger shapes.
auto make_params() {
  return boost::hana::make_tuple(
      nn::parameter<extents<1>>("tiny", {}), nn::parameter<extents<7>>("prime", {}),
      nn::parameter<extents<13, 17>>("w13x17", {}), nn::parameter<extents<3, 5, 11>>("rank3", {}),
      nn::parameter<extents<4099>>("large", {}));
}

// Runs `steps` steps of opt and of the reference on the same random data; compares every
// parameter after every step.
template <class Exec, class Opt, class Ref>
void compare_with_reference(Opt opt, Ref ref_proto, int steps, std::uint64_t seed) {
  const Exec exec{};
  auto params = make_params();
  randomize_params(params, seed);
  std::vector<std::vector<double>> w;
  std::vector<Ref> refs;
  boost::hana::for_each(params, [&](const auto& p) {
    w.push_back(to_double(snapshot(p.value)));
    refs.push_back(ref_proto);
  });
  for (int s = 1; s <= steps; ++s) {
    std::size_t k = 0;
    boost::hana::for_each(params, [&](const auto& p) {
      fill_uniform(p.grad, seed * 7919 + static_cast<std::uint64_t>(s * 31 + k), -1.f, 1.f);
      refs[k].step(w[k], to_double(snapshot(p.grad)));
      ++k;
    });
    opt.step(exec, params);
    REQUIRE(opt.steps() == s);
    k = 0;
    boost::hana::for_each(params, [&](const auto& p) {
      const auto got = snapshot(p.value);
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::abs(got[i] - w[k][i]) > tolerance(s, w[k][i])) {
          INFO("step " << s << ", parameter " << p.name << ", element " << i << ": got " << got[i]
                       << ", reference " << w[k][i]);
          REQUIRE(std::abs(got[i] - w[k][i]) <= tolerance(s, w[k][i]));
        }
      }
      ++k;
    });
  }
}

} // namespace

// ---- hand-computed steps: every value below is exact in float (dyadic), so equality ----------

TEMPLATE_LIST_TEST_CASE(
    "sgd: hand-computed steps (plain, momentum, Nesterov, weight decay, dampening)",
    "[train][optim]", train_exec_spaces) {
  const TestType exec{};
  auto run = [&](train::sgd opt, int steps) {
    // Default-memory parameters, written and read through host copies.
    auto params = boost::hana::make_tuple(nn::parameter<extents<1>>("w", {}));
    auto& p = boost::hana::at_c<0>(params);
    set_element(p.value, 0, 1.f);
    std::vector<float> ws;
    for (int s = 0; s < steps; ++s) {
      set_element(p.grad, 0, 0.25f);
      opt.step(exec, params);
      ws.push_back(element(p.value, 0));
    }
    return ws;
  };
  // w = 1, g = 0.25, lr = 0.5.
  // plain: w = 1 - 0.5 * 0.25 = 0.875, then 0.75.
  REQUIRE(run({.lr = 0.5f}, 2) == std::vector<float>{1.f - 0.5f * 0.25f, 0.875f - 0.5f * 0.25f});
  // momentum 0.5: step 1 buf = g = 0.25, w = 0.875; step 2 buf = 0.5 * 0.25 + 0.25 = 0.375,
  // w = 0.875 - 0.5 * 0.375 = 0.6875.
  REQUIRE(run({.lr = 0.5f, .momentum = 0.5f}, 2) == std::vector<float>{0.875f, 0.6875f});
  // Nesterov: step 1 buf = 0.25, g = 0.25 + 0.5 * 0.25 = 0.375, w = 1 - 0.1875 = 0.8125;
  // step 2 buf = 0.375, g = 0.25 + 0.5 * 0.375 = 0.4375, w = 0.8125 - 0.21875 = 0.59375.
  REQUIRE(run({.lr = 0.5f, .momentum = 0.5f, .nesterov = true}, 2) ==
          std::vector<float>{0.8125f, 0.59375f});
  // weight decay 0.5: g = 0.25 + 0.5 * 1 = 0.75, w = 1 - 0.375 = 0.625; then
  // g = 0.25 + 0.5 * 0.625 = 0.5625, w = 0.625 - 0.28125 = 0.34375.
  REQUIRE(run({.lr = 0.5f, .weight_decay = 0.5f}, 2) == std::vector<float>{0.625f, 0.34375f});
  // dampening 0.5 with momentum 0.5: the first step takes the gradient undamped (buf = 0.25,
  // w = 0.875), the second buf = 0.5 * 0.25 + 0.5 * 0.25 = 0.25, w = 0.75.
  REQUIRE(run({.lr = 0.5f, .momentum = 0.5f, .dampening = 0.5f}, 2) ==
          std::vector<float>{0.875f, 0.75f});
}

TEMPLATE_LIST_TEST_CASE("adamw: hand-computed first steps (bias correction, decoupled decay)",
                        "[train][optim]", train_exec_spaces) {
  const TestType exec{};
  // Default-memory parameters, written and read through host copies.
  auto params = boost::hana::make_tuple(nn::parameter<extents<2>>("w", {}));
  auto& p = boost::hana::at_c<0>(params);
  set_element(p.value, 0, 1.f);
  set_element(p.value, 1, -2.f);
  train::adamw opt{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.5f};
  // Step 1: bias correction makes m_hat = g and v_hat = g^2, so the update is
  // lr * g / (|g| + eps) ~= lr * sign(g), applied after decaying w by (1 - lr * wd) = 0.95.
  set_element(p.grad, 0, 3.f);
  set_element(p.grad, 1, -0.001f);
  opt.step(exec, params);
  const double u1_0 = 0.1 * 3.0 / (3.0 + 1e-8), u1_1 = 0.1 * -0.001 / (0.001 + 1e-8);
  REQUIRE(element(p.value, 0) == Approx(1.0 * 0.95 - u1_0).epsilon(1e-6));
  REQUIRE(element(p.value, 1) == Approx(-2.0 * 0.95 - u1_1).epsilon(1e-6));
  // Step 2 with g = 1 for element 0: m = 0.9 * 0.3 + 0.1 = 0.37, v = 0.999 * 0.009 + 0.001 =
  // 0.009991; m_hat = 0.37 / 0.19, v_hat = 0.009991 / 0.001999.
  set_element(p.grad, 0, 1.f);
  set_element(p.grad, 1, 0.f);
  const double w0 = element(p.value, 0);
  opt.step(exec, params);
  const double m_hat = 0.37 / (1 - 0.9 * 0.9), v_hat = 0.009991 / (1 - 0.999 * 0.999);
  REQUIRE(element(p.value, 0) ==
          Approx(w0 * 0.95 - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8)).epsilon(1e-6));
  REQUIRE(opt.steps() == 2);
}

TEMPLATE_LIST_TEST_CASE("sgd matches a double reference over many shapes and steps",
                        "[train][optim]", train_exec_spaces) {
  SECTION("plain") {
    compare_with_reference<TestType>(
        train::sgd{.lr = 0.1f},
        sgd_ref{.lr = 0.1, .momentum = 0, .weight_decay = 0, .dampening = 0, .nesterov = false}, 6,
        1);
  }
  SECTION("momentum + weight decay") {
    compare_with_reference<TestType>(
        train::sgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f},
        sgd_ref{
            .lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2, .dampening = 0, .nesterov = false},
        6, 2);
  }
  SECTION("Nesterov + weight decay") {
    compare_with_reference<TestType>(
        train::sgd{.lr = 0.05f, .momentum = 0.9f, .nesterov = true, .weight_decay = 5e-4f},
        sgd_ref{
            .lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .dampening = 0, .nesterov = true},
        6, 3);
  }
  SECTION("Nesterov, no weight decay") { // each switch combination is its own kernel
    compare_with_reference<TestType>(
        train::sgd{.lr = 0.05f, .momentum = 0.7f, .nesterov = true},
        sgd_ref{.lr = 0.05, .momentum = 0.7, .weight_decay = 0, .dampening = 0, .nesterov = true},
        6, 5);
  }
  SECTION("weight decay, no momentum") {
    compare_with_reference<TestType>(
        train::sgd{.lr = 0.1f, .weight_decay = 1e-2f},
        sgd_ref{.lr = 0.1, .momentum = 0, .weight_decay = 1e-2, .dampening = 0, .nesterov = false},
        6, 6);
  }
  SECTION("dampening") {
    compare_with_reference<TestType>(
        train::sgd{.lr = 0.1f, .momentum = 0.8f, .dampening = 0.3f},
        sgd_ref{.lr = 0.1, .momentum = 0.8, .weight_decay = 0, .dampening = 0.3, .nesterov = false},
        6, 4);
  }
}

TEMPLATE_LIST_TEST_CASE("adamw matches a double reference over many shapes and steps",
                        "[train][optim]", train_exec_spaces) {
  SECTION("defaults") {
    compare_with_reference<TestType>(
        train::adamw{},
        adamw_ref{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2}, 8,
        5);
  }
  SECTION("large lr, no decay, other betas") {
    compare_with_reference<TestType>(
        train::adamw{.lr = 0.1f, .beta1 = 0.5f, .beta2 = 0.9f, .eps = 1e-6f, .weight_decay = 0.f},
        adamw_ref{.lr = 0.1, .beta1 = 0.5, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.0}, 8, 6);
  }
}

// Bitwise reproducibility is promised for the same execution space and thread count (what
// resuming from a checkpoint needs). Across spaces results may differ in the last bit: with
// -march=native the compiler may contract a*b + c*d into an FMA on either product, differently
// in vectorised and scalar code; the reference comparisons above bound that difference.
TEMPLATE_LIST_TEST_CASE("optimizers are bitwise repeatable on one execution space",
                        "[train][optim]", train_exec_spaces) {
  auto run = [](auto opt) {
    auto params = make_params();
    randomize_params(params, 11);
    for (int s = 0; s < 4; ++s) {
      std::uint64_t k = 0;
      boost::hana::for_each(params,
                            [&](const auto& p) { fill_normal(p.grad, 100 + 10 * s + k++); });
      opt.step(TestType{}, params);
    }
    return snapshot_params(params);
  };
  const train::sgd nesterov{.lr = 0.1f, .momentum = 0.9f, .nesterov = true};
  REQUIRE(run(nesterov) == run(nesterov));
  REQUIRE(run(train::adamw{}) == run(train::adamw{}));
}

TEST_CASE("optimizers refuse other parameters and bad hyper-parameters, changing nothing",
          "[train][optim]") {
  const Kokkos::DefaultExecutionSpace exec{}; // the parameters' (default) memory space
  auto params = make_params();
  randomize_params(params, 21);
  train::sgd opt{.lr = 0.1f, .momentum = 0.9f};
  opt.step(exec, params);
  const auto before = snapshot_params(params);
  const auto state_before = snapshot_state(opt.state);

  // Fewer parameters, another name, another size.
  auto fewer = boost::hana::make_tuple(boost::hana::at_c<0>(params));
  REQUIRE_THROWS_AS(opt.step(exec, fewer), shape_error);
  auto renamed = make_params();
  boost::hana::at_c<2>(renamed).name = "other";
  REQUIRE_THROWS_AS(opt.step(exec, renamed), shape_error);
  auto resized =
      boost::hana::make_tuple(boost::hana::at_c<0>(params), boost::hana::at_c<1>(params),
                              nn::parameter<extents<13, 16>>("w13x17", {}),
                              boost::hana::at_c<3>(params), boost::hana::at_c<4>(params));
  REQUIRE_THROWS_WITH(opt.step(exec, resized), Catch::Contains("w13x17") &&
                                                   Catch::Contains("208") &&
                                                   Catch::Contains("221"));
  // Bad hyper-parameters.
  opt.lr = -1.f;
  REQUIRE_THROWS_AS(opt.step(exec, params), value_error);
  opt.lr = 0.1f;
  opt.momentum = 0.f;
  opt.nesterov = true;
  REQUIRE_THROWS_WITH(opt.step(exec, params), Catch::Contains("Nesterov"));

  REQUIRE(snapshot_params(params) == before);
  REQUIRE(snapshot_state(opt.state) == state_before);
  REQUIRE(opt.steps() == 1);

  train::adamw a{.beta2 = 1.f};
  REQUIRE_THROWS_AS(a.step(exec, params), value_error);
  REQUIRE(a.steps() == 0);
  REQUIRE(snapshot_params(params) == before);

  // Duplicate names are refused at the first step.
  auto dup = boost::hana::make_tuple(nn::parameter<extents<2>>("same", {}),
                                     nn::parameter<extents<3>>("same", {}));
  train::sgd fresh{};
  REQUIRE_THROWS_WITH(fresh.step(exec, dup), Catch::Contains("same"));
  REQUIRE_FALSE(fresh.state.created);
}

TEST_CASE("a copied optimizer owns its state", "[train][optim]") {
  const Kokkos::DefaultExecutionSpace exec{}; // the parameters' (default) memory space
  auto params = make_params();
  randomize_params(params, 31);
  train::adamw opt{.lr = 0.01f};
  opt.step(exec, params);
  const auto state_at_copy = snapshot_state(opt.state);
  train::adamw copy = opt;
  opt.step(exec, params);
  opt.step(exec, params);
  REQUIRE(copy.steps() == 1);
  REQUIRE(snapshot_state(copy.state) == state_at_copy);
  REQUIRE_FALSE(snapshot_state(opt.state) == state_at_copy);
}
