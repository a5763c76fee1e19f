// nn::Recompute<Segment> (nn/recompute.hpp): activation recomputation.
//  - declarations: shape rule, input_extents and FLOPs of the segment, tensor_split;
//  - an MLP, a FashionCNN-shaped conv stack and a GPT block (Residual(LayerNorm, attention),
//    Residual(LayerNorm, Linear, GELU, Linear)) in fp32, bf16 and fp8 (delayed scaling: the
//    states carry an amax history): over 3 training steps (SGD updates between them), the
//    wrapped model's outputs, every parameter gradient and the input gradient are bit-identical
//    to the unwrapped model's (same weights), and for fp8 every scaling state (scale amax, amax
//    history) is identical after the steps: a recomputing forward that recorded its amaxes a
//    second time would leave longer / different histories;
//  - the saved-activation bytes after each forward, for both models, against what each layer
//    keeps computed here from the shapes and the precisions' storage sizes;
//  - the same models with recomputation switched off (nn::set_recompute(model, false)):
//    bit-identical and keeping the unwrapped model's activations, also switched every step;
//  - seeds: a model with Recompute segments starts from the unwrapped model's weights.
#include "nn_testing.hpp"

#include <tessera/nn/recompute.hpp>

#include <boost/hana/at.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>

#include <cstring>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

using fp8d = nn::fp8<train::delayed_scaling>;

// ---- declarations -------------------------------------------------------------------------

using Seg = nn::Sequential<nn::Linear<6, 8>, nn::ReLU, nn::Linear<8, 4>>;
using RSeg = nn::Recompute<Seg>;
static_assert(nn::Layer<RSeg>);
static_assert(RSeg::accepts<extents<dyn, 6>>);
static_assert(!RSeg::accepts<extents<dyn, 5>>);
static_assert(std::is_same_v<RSeg::output_extents<extents<dyn, 6>>, extents<dyn, 4>>);
static_assert(std::is_same_v<RSeg::input_extents, extents<dyn, 6>>);
// 2*6*8 + 8 + 2*8*4: the layers' sum.
static_assert(nn::layer_traits<RSeg>::forward_flops<extents<dyn, 6>> == 96 + 8 + 64);
static_assert(nn::layer_traits<RSeg>::tensor_split == nn::split_kind::replicate);
static_assert(nn::layer_traits<nn::Recompute<nn::ReLU>>::tensor_split ==
              nn::split_kind::per_feature);
static_assert(nn::layer_traits<nn::Recompute<nn::Linear<4, 4>>>::tensor_split ==
              nn::split_kind::replicate);
// It nests in a Sequential, whose static shape check then starts from its input_extents.
static_assert(std::is_same_v<nn::Sequential<RSeg, nn::ReLU>::output_extents<extents<dyn, 6>>,
                             extents<dyn, 4>>);

// ---- helpers -------------------------------------------------------------------------------

template <class T>
bool bits_equal(const T& a, const T& b) {
  if (a.size() != b.size()) return false;
  const auto ha = to_host(a);
  const auto hb = to_host(b);
  return std::memcmp(ha.data(), hb.data(), sizeof(*ha.data()) * std::size_t(ha.size())) == 0;
}

template <class Model>
void sgd_step(const Model& m, float lr) {
  boost::hana::for_each(m.parameters(), [&](const auto& p) {
    float* v = p.value.data();
    const float* g = p.grad.data();
    Kokkos::parallel_for(
        "sgd", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, p.value.size()),
        KOKKOS_LAMBDA(const index_t i) { v[i] -= lr * g[i]; });
  });
  Kokkos::fence();
}

template <class A, class B>
void check_same_gradients(const A& u, const B& w) {
  const auto pu = u.parameters();
  const auto pw = w.parameters();
  constexpr std::size_t n = decltype(boost::hana::length(pu))::value;
  static_assert(n == decltype(boost::hana::length(pw))::value);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto one = [](const auto& a, const auto& b) {
      INFO(a.name << " vs " << b.name);
      CHECK(bits_equal(a.value, b.value));
      CHECK(bits_equal(a.grad, b.grad));
    };
    (one(boost::hana::at_c<I>(pu), boost::hana::at_c<I>(pw)), ...);
  }
  (std::make_index_sequence<n>{});
}

template <class A, class B>
void check_same_fp8_states(A& u, B& w) {
  const auto su = u.fp8_states();
  const auto sw = w.fp8_states();
  constexpr std::size_t n = decltype(boost::hana::length(su))::value;
  static_assert(n == decltype(boost::hana::length(sw))::value);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto one = [](const auto* a, const auto* b) {
      CHECK(a->history_size() == b->history_size());
      CHECK(a->history() == b->history());
      CHECK(a->scale_amax() == b->scale_amax());
    };
    (void)one; // (no states outside fp8)
    (one(boost::hana::at_c<I>(su), boost::hana::at_c<I>(sw)), ...);
  }
  (std::make_index_sequence<n>{});
}

/// Every parameter's name suffix, shape and values bit for bit equal (a Recompute segment's
/// parameters are named "<segment>.<layer>.<name>", the unwrapped model's "<layer>.<name>").
template <class A, class B>
void check_same_initial_weights(const A& u, const B& w) {
  const auto pu = u.parameters();
  const auto pw = w.parameters();
  constexpr std::size_t n = decltype(boost::hana::length(pu))::value;
  static_assert(n == decltype(boost::hana::length(pw))::value);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto one = [](const auto& a, const auto& b) {
      INFO(a.name << " vs " << b.name);
      const std::string leaf_a = a.name.substr(a.name.rfind('.'));
      const std::string leaf_b = b.name.substr(b.name.rfind('.'));
      CHECK(leaf_a == leaf_b);
      CHECK(bits_equal(a.value, b.value));
    };
    (one(boost::hana::at_c<I>(pu), boost::hana::at_c<I>(pw)), ...);
  }
  (std::make_index_sequence<n>{});
}

/// Runs `steps` training steps on both models (built from the same seed: the same weights,
/// checked first; the same data) and checks outputs, gradients, dx (and fp8 states at the
/// end); the saved bytes after each forward must be want_u / want_w. Returns nothing: every
/// check is a CHECK.
template <class P, class U, class W, class InExt>
void compare_runs(U& u, W& w, const InExt& in_ext, std::size_t want_u, std::size_t want_w,
                  int steps = 3) {
  check_same_initial_weights(u, w);
  using act = nn::activation_t<P>;
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    const auto x = tensor_from<act>(uniform_values(std::size_t(in_ext.size()), 100 + s), in_ext);
    const auto yu = u.forward(exec_space(), x);
    const auto yw = w.forward(exec_space(), x);
    CHECK(bits_equal(yu, yw));
    CHECK(nn::saved_activation_bytes(u) == want_u);
    CHECK(nn::saved_activation_bytes(w) == want_w);
    const auto dy = tensor_from<typename decltype(yu)::precision>(
        uniform_values(std::size_t(yu.size()), 200 + s), yu.extents());
    const auto dxu = u.backward(exec_space(), dy, true);
    const auto dxw = w.backward(exec_space(), dy, true);
    REQUIRE(dxu.size() == x.size());
    CHECK(bits_equal(dxu, dxw));
    check_same_gradients(u, w);
    sgd_step(u, 0.05f);
    sgd_step(w, 0.05f);
  }
  check_same_fp8_states(u, w);
}

template <class P>
constexpr std::size_t bytes_of = sizeof(storage_t<P>);

/// What a Linear-like operand slot stores per element, and whether an input of the
/// activation precision is referenced rather than copied (fp32 and bf16: the operand precision
/// is the activation precision; fp8: an E4M3 copy).
template <class P>
struct sizes {
  using act = nn::activation_t<P>;
  using op = typename nn::detail::operand_precision<P, false>::type;
  static constexpr std::size_t a = bytes_of<act>;
  static constexpr std::size_t o = bytes_of<op>;
  static constexpr bool ref = std::is_same_v<act, op>;
  static constexpr std::size_t scratch = std::is_same_v<act, fp32> ? 0 : 4; // Linear's acc
};

// ---- MLP ---------------------------------------------------------------------------------

template <class P>
void mlp_case() {
  constexpr index_t B = 5, In = 12, H = 16, O = 3;
  using U = nn::Sequential<nn::Linear<In, H, P>, nn::ReLU, nn::Linear<H, H, P>, nn::ReLU,
                           nn::Linear<H, O, P>>;
  using W = nn::Sequential<nn::Recompute<nn::Sequential<nn::Linear<In, H, P>, nn::ReLU>>,
                           nn::Recompute<nn::Sequential<nn::Linear<H, H, P>, nn::ReLU>>,
                           nn::Linear<H, O, P>>;
  using S = sizes<P>;
  const std::size_t a = S::a, o = S::o, sc = S::scratch;
  // Unwrapped: the input (referenced by the first Linear) or its operand copy; each Linear's
  // output and fp32 scratch; each ReLU's output; the later Linears' operand copies (none
  // when they reference the ReLU outputs, already counted).
  const std::size_t want_u = B * In * (S::ref ? a : o) + B * H * (a + sc) + B * H * a +
                             B * H * (a + sc) + (S::ref ? 0 : B * H * o) + B * H * a +
                             B * O * (a + sc) + (S::ref ? 0 : B * H * o);
  // Wrapped: the two kept inputs (x; the first segment's output), the second segment's output
  // kept alive by the last Linear's reference (or that Linear's operand copy), and that
  // Linear's own output and scratch.
  const std::size_t want_w = B * In * a + B * H * a + B * H * (S::ref ? a : o) + B * O * (a + sc);
  REQUIRE(want_w < want_u);
  U u(1);
  W w(1);
  compare_runs<P>(u, w, extents<dyn, In>(B), want_u, want_w);
  // Recomputation switched off: the unwrapped model's bits and its saved activations.
  U u2(1);
  W w2(1);
  nn::set_recompute(w2, false);
  CHECK_FALSE(w2.template layer<0>().enabled());
  CHECK_FALSE(w2.template layer<1>().enabled());
  compare_runs<P>(u2, w2, extents<dyn, In>(B), want_u, want_u);
}

// ---- FashionCNN-shaped conv stack ---------------------------------------------------------

template <class P>
void cnn_case() {
  constexpr index_t B = 3;
  using C1 = nn::Conv2d<1, 4, 3, nn::conv_options{.pad = 1}, P>;
  using C2 = nn::Conv2d<4, 8, 3, nn::conv_options{.pad = 1}, P>;
  using L = nn::Linear<8 * 3 * 3, 10, P>;
  using U = nn::Sequential<nn::Input<1, 12, 12>, C1, nn::ReLU, nn::MaxPool2d<2>, C2, nn::ReLU,
                           nn::MaxPool2d<2>, nn::Flatten, L>;
  using W = nn::Sequential<
      nn::Recompute<nn::Sequential<nn::Input<1, 12, 12>, C1, nn::ReLU, nn::MaxPool2d<2>>>,
      nn::Recompute<nn::Sequential<C2, nn::ReLU, nn::MaxPool2d<2>>>, nn::Flatten, L>;
  using S = sizes<P>;
  const std::size_t a = S::a, o = S::o, sc = S::scratch;
  const std::size_t x = B * 1 * 12 * 12, c1 = B * 4 * 12 * 12, p1 = B * 4 * 6 * 6,
                    c2 = B * 8 * 6 * 6, p2 = B * 8 * 3 * 3, out = B * 10;
  // Conv2d: output + input operand (the input itself when referenced); ReLU after a Conv2d:
  // nothing (Sequential fuses it into the convolution's store; ReLU reads that output);
  // MaxPool2d: output + one byte per output (the maximum's position); Flatten: nothing;
  // Linear: output, scratch, input operand. The second convolution (4 -> 8 channels, a
  // reduction of 36: the narrow path, at least 8 output channels) pools in its store on a host
  // space with the SIMD kernels (Conv2d::forward_pooled): its full-resolution output is never
  // kept; the first (4 output channels) keeps it.
#if TESSERA_DEVICE_PASS
  constexpr bool pooled2 = false;
#else
  constexpr bool pooled2 = tessera::detail::is_host_exec_v<Kokkos::DefaultExecutionSpace> &&
                           tessera::detail::hostgemm::have_simd;
#endif
  const std::size_t want_u = x * (S::ref ? a : o) + c1 * a + p1 * a + p1 + (S::ref ? 0 : p1 * o) +
                             (pooled2 ? 0 : c2 * a) + p2 * a + p2 + (S::ref ? 0 : p2 * o) +
                             out * (a + sc);
  // Wrapped: kept x and first segment output, the second segment's output (referenced by the
  // Linear through Flatten) or the Linear's copy of it, the Linear's output and scratch.
  const std::size_t want_w = x * a + p1 * a + p2 * (S::ref ? a : o) + out * (a + sc);
  REQUIRE(want_w < want_u);
  U u(3);
  W w(3);
  compare_runs<P>(u, w, extents<dyn, 1, 12, 12>(B), want_u, want_w);
  // Recomputation switched off: the unwrapped model's bits and its saved activations.
  U u2(3);
  W w2(3);
  nn::set_recompute(w2, false);
  compare_runs<P>(u2, w2, extents<dyn, 1, 12, 12>(B), want_u, want_u);
}

// ---- GPT block ---------------------------------------------------------------------------

template <class P>
void gpt_case() {
  constexpr index_t B = 2, T = 9, D = 16, Hd = 2;
  using Attn = nn::Residual<nn::LayerNorm<D>, nn::CausalSelfAttention<D, Hd, P>>;
  using Mlp =
      nn::Residual<nn::LayerNorm<D>, nn::Linear<D, 4 * D, P>, nn::GELU, nn::Linear<4 * D, D, P>>;
  using U = nn::Sequential<Attn, Mlp>;
  using W = nn::Sequential<nn::Recompute<Attn>, nn::Recompute<Mlp>>;
  using S = sizes<P>;
  const std::size_t n = B * T * D;
  // Wrapped: the two kept inputs (x and the first block's output), the second output is the
  // caller's. Unwrapped: at least every layer output (LayerNorm, qkv (3D), attention o,
  // projection, the first residual's y, LayerNorm, Linear (4D), GELU (4D), Linear, y) and the
  // LayerNorms' fp32 normalised inputs.
  const std::size_t want_w = 2 * n * S::a;
  const std::size_t at_least_u = n * S::a * (1 + 3 + 1 + 1 + 1 + 1 + 4 + 4 + 1 + 1) + 2 * n * 4;
  U u(5);
  W w(5);
  check_same_initial_weights(u, w);
  const auto x = tensor_from<nn::activation_t<P>>(uniform_values(n, 7), extents<dyn, T, D>(B));
  (void)u.forward(exec_space(), x);
  const std::size_t got_u = nn::saved_activation_bytes(u);
  CHECK(got_u >= at_least_u);
  // The unwrapped count, once measured, is what compare_runs then checks at every step.
  Kokkos::fence();
  U u2(5);
  W w2(5);
  compare_runs<P>(u2, w2, extents<dyn, T, D>(B), got_u, want_w);
}

} // namespace

TEST_CASE("nn::Recompute: MLP gradients bit-identical, fewer saved bytes", "[nn][recompute]") {
  SECTION("fp32") {
    mlp_case<fp32>();
  }
  SECTION("bf16") {
    mlp_case<bf16>();
  }
  SECTION("fp8") {
    mlp_case<fp8d>();
  }
}

TEST_CASE("nn::Recompute: conv stack gradients bit-identical, fewer saved bytes",
          "[nn][recompute]") {
  SECTION("fp32") {
    cnn_case<fp32>();
  }
  SECTION("bf16") {
    cnn_case<bf16>();
  }
  SECTION("fp8") {
    cnn_case<fp8d>();
  }
}

TEST_CASE("nn::Recompute: GPT block gradients bit-identical, fewer saved bytes",
          "[nn][recompute]") {
  SECTION("fp32") {
    gpt_case<fp32>();
  }
  SECTION("bf16") {
    gpt_case<bf16>();
  }
  SECTION("fp8") {
    gpt_case<fp8d>();
  }
}

TEST_CASE("nn::Recompute: fp8 amax histories advance once per step", "[nn][recompute]") {
  // Independent of the unwrapped model: after 3 steps each forward slot (weights, input) of
  // each Linear recorded 3 amaxes, each gradient slot 3.
  using W = nn::Sequential<nn::Recompute<nn::Sequential<nn::Linear<4, 6, fp8d>, nn::ReLU>>,
                           nn::Linear<6, 2, fp8d>>;
  W w(1);
  for (int s = 0; s < 3; ++s) {
    const auto x = tensor_from<bf16>(uniform_values(3 * 4, 10 + s), extents<dyn, 4>(3));
    const auto y = w.forward(exec_space(), x);
    const auto dy = tensor_from<bf16>(uniform_values(std::size_t(y.size()), 20 + s), y.extents());
    (void)w.backward(exec_space(), dy, true);
  }
  boost::hana::for_each(w.fp8_states(), [](const auto* m) { CHECK(m->history_size() == 3); });
}

TEST_CASE("nn::Recompute: backward needs its own forward", "[nn][recompute]") {
  RSeg r(1);
  const auto x = tensor_from<fp32>(uniform_values(2 * 6, 1), extents<dyn, 6>(2));
  const auto dy = tensor_from<fp32>(uniform_values(2 * 4, 2), extents<dyn, 4>(2));
  CHECK_THROWS_AS(r.backward(exec_space(), dy), value_error);
  (void)r.forward(exec_space(), x);
  // Inside the segment nothing is kept: a backward of the segment alone would be refused.
  CHECK_THROWS_AS(r.segment().backward(exec_space(), dy), value_error);
  CHECK_NOTHROW(r.backward(exec_space(), dy));
  CHECK_THROWS_AS(r.backward(exec_space(), dy), value_error); // a second one: no forward
}

TEST_CASE("nn::Recompute: seeds pass through to the segment's layers", "[nn][recompute]") {
  // Layer k of the flat model and the same layer inside a segment get the same seed, also
  // after a segment (the Linear after two segments is flat layer 4, not outer layer 2).
  using U =
      nn::Sequential<nn::Linear<3, 5>, nn::ReLU, nn::Linear<5, 4>, nn::ReLU, nn::Linear<4, 2>>;
  using W =
      nn::Sequential<nn::Recompute<nn::Sequential<nn::Linear<3, 5>, nn::ReLU>>,
                     nn::Recompute<nn::Sequential<nn::Linear<5, 4>, nn::ReLU>>, nn::Linear<4, 2>>;
  static_assert(nn::Recompute<nn::Sequential<nn::Linear<3, 5>, nn::ReLU>>::seed_span == 2);
  static_assert(nn::Recompute<nn::ReLU>::seed_span == 1);
  const U u(9);
  const W w(9);
  check_same_initial_weights(u, w);
  // Independent of the wrapper code: the last Linear is what Linear(counter_rng{9, 4}) makes.
  const nn::Linear<4, 2> last(counter_rng{9, 4}.bits(0));
  CHECK(bits_equal(boost::hana::at_c<4>(w.parameters()).value,
                   boost::hana::at_c<0>(last.parameters()).value));
  const auto names = [](const auto& m) {
    std::string out;
    boost::hana::for_each(m.parameters(), [&](const auto& p) { out += p.name + " "; });
    return out;
  };
  CHECK(names(w) == "0.0.weight 0.0.bias 1.0.weight 1.0.bias 2.weight 2.bias ");
}

TEST_CASE("nn::Recompute: switched off between steps, the same bits", "[nn][recompute]") {
  // Alternating the switch every step changes no bit against the unwrapped model, and each
  // forward keeps what the switch says.
  using U = nn::Sequential<nn::Linear<6, 8>, nn::ReLU, nn::Linear<8, 4>>;
  using W = nn::Sequential<nn::Recompute<U>>;
  U u(4);
  W w(4);
  check_same_initial_weights(u, w);
  for (int s = 0; s < 4; ++s) {
    INFO("step " << s);
    const bool on = s % 2 == 0;
    nn::set_recompute(w, on);
    const auto x = tensor_from<fp32>(uniform_values(3 * 6, 30 + s), extents<dyn, 6>(3));
    const auto yu = u.forward(exec_space(), x);
    const auto yw = w.forward(exec_space(), x);
    CHECK(bits_equal(yu, yw));
    if (on)
      CHECK(nn::saved_activation_bytes(w) == 3 * 6 * 4); // the kept x only
    else
      CHECK(nn::saved_activation_bytes(w) == nn::saved_activation_bytes(u));
    const auto dy = tensor_from<fp32>(uniform_values(3 * 4, 40 + s), yu.extents());
    const auto dxu = u.backward(exec_space(), dy, true);
    const auto dxw = w.backward(exec_space(), dy, true);
    CHECK(bits_equal(dxu, dxw));
    check_same_gradients(u, w);
    sgd_step(u, 0.1f);
    sgd_step(w, 0.1f);
  }
}
