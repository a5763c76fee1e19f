// nn::Sequential: compile-time shape propagation, parameter list (names, order, sharing), seeds,
// and a finite-difference gradient check of a whole small CNN under the cross-entropy loss.
#include "nn_testing.hpp"

#include <tessera/train/checkpoint.hpp>

#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

template <class P = fp32>
using FashionCNN =
    nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Conv2d<32, 64, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Flatten, nn::Linear<3136, 128, P>, nn::ReLU,
                   nn::Linear<128, 10, P>>;

// Shapes are propagated at compile time, layer by layer.
using in_t = extents<dyn, 1, 28, 28>;
static_assert(std::is_same_v<FashionCNN<>::output_extents<in_t>, extents<dyn, 10>>);
static_assert(std::is_same_v<
              nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}>,
                             nn::MaxPool2d<2>>::output_extents<in_t>,
              extents<dyn, 32, 14, 14>>);
static_assert(std::is_same_v<nn::Sequential<nn::Conv2d<3, 8, 5, nn::conv_options{.stride = 2}>,
                                            nn::Flatten>::output_extents<extents<dyn, 3, 31, 20>>,
                             extents<dyn, 8 * 14 * 8>>);
// A mismatch gives void (and, on instantiation, the sequential_link static_assert; see
// tests/compile_fail/nn_sequential_mismatch.cpp).
static_assert(!nn::Linear<100, 10>::accepts<extents<dyn, 128>>);
static_assert(!nn::Conv2d<3, 8, 3>::accepts<extents<dyn, 1, 28, 28>>);
static_assert(!nn::Conv2d<3, 8, 7>::accepts<extents<dyn, 3, 5, 5>>); // kernel larger than image

// Smooth end to end (GELU, no max-pool kinks) so that central differences apply everywhere;
// MaxPool2d's gradient is checked on its own in test_activations.cpp.
using Small =
    nn::Sequential<nn::Input<2, 7, 6>, nn::Conv2d<2, 3, 3, nn::conv_options{.stride = 2, .pad = 1}>,
                   nn::GELU, nn::Flatten, nn::Linear<36, 5>, nn::GELU, nn::Linear<5, 4>>;

} // namespace

TEST_CASE("nn::Sequential: parameters are named, ordered and shared", "[nn][sequential]") {
  FashionCNN<> model(3);
  const auto params = model.parameters();
  static_assert(decltype(boost::hana::length(params))::value == 8);
  std::vector<std::string> names;
  std::vector<index_t> sizes;
  boost::hana::for_each(params, [&](const auto& p) {
    names.push_back(p.name);
    sizes.push_back(p.size());
  });
  CHECK(names == std::vector<std::string>{"1.weight", "1.bias", "4.weight", "4.bias", "8.weight",
                                          "8.bias", "10.weight", "10.bias"});
  CHECK(sizes == std::vector<index_t>{32 * 9, 32, 64 * 32 * 9, 64, 128 * 3136, 128, 1280, 10});
  // Handles share the layers' storage.
  CHECK(boost::hana::at_c<0>(params).value.data() == model.layer<1>().weight().value.data());
  CHECK(boost::hana::at_c<7>(params).grad.data() == model.layer<10>().bias().grad.data());
  // Layer i is initialised from (seed, i): the same as a standalone layer with that seed.
  nn::Linear<128, 10> alone(counter_rng{3, 10}.bits(0));
  CHECK(to_doubles(alone.weight().value) == to_doubles(model.layer<10>().weight().value));
  FashionCNN<> again(3), other(4);
  CHECK(to_doubles(again.layer<4>().weight().value) == to_doubles(model.layer<4>().weight().value));
  CHECK(to_doubles(other.layer<4>().weight().value) != to_doubles(model.layer<4>().weight().value));
}

TEST_CASE("nn::Sequential: forward output shape, dynamic batch, input check", "[nn][sequential]") {
  FashionCNN<> model(1);
  for (index_t B : {1, 3, 64}) {
    Tensor<fp32, in_t> x("x", B);
    fill_uniform(x, 5, -1.f, 1.f);
    const auto y = model.forward(exec_space(), x);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(y)>::extents_type, extents<dyn, 10>>);
    CHECK(y.extent(0) == B);
  }
  Tensor<fp32, dextents<4>> wrong("x", 2, 1, 28, 27);
  CHECK_THROWS_AS(model.forward(exec_space(), wrong), shape_error);
}

TEST_CASE("nn::Sequential: gradients of a small CNN under cross-entropy match finite "
          "differences",
          "[nn][sequential]") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    Small model(seed);
    nn::SoftmaxCrossEntropy ce;
    const index_t B = 3;
    auto x = tensor_from<fp32>(uniform_values(B * 2 * 7 * 6, seed + 10),
                               extents<dyn, 2, 7, 6>(B)); // (B, 2, 7, 6)
    Kokkos::View<int*> y("y", B);
    for (index_t i = 0; i < B; ++i) y(i) = static_cast<int>((seed + i) % 4);
    const auto [l, d] = ce.forward_backward(exec_space(), model.forward(exec_space(), x), y);
    const auto dx = to_host(model.backward(exec_space(), d, /*need_input_grad=*/true));
    const auto loss = [&] {
      return double(ce.forward(exec_space(), model.forward(exec_space(), x), y));
    };
    // The loss is smooth: truncation h^2/6 |L'''| ~ 1e-7 with h = 1e-3. The loss is an fp32 value
    // ~2: its rounding (~2.4e-7), divided by 2h, is 1.2e-4 on each side; 4e-4 covers both and the
    // sums' rounding inside the layers.
    const float h = 1e-3f;
    const double noise = 4e-4;
    check_tensor_gradient("input", x, dx, loss, h, noise, seed, 1e-2);
    int k = 0;
    boost::hana::for_each(model.parameters(), [&](const auto& p) {
      const auto g = to_host(p.grad);
      check_tensor_gradient(p.name, p.value, g, loss, h, noise, seed + 20 + k++, 1e-2);
    });
  }
}

TEST_CASE("nn::Sequential: backward overwrites gradients (no accumulation)", "[nn][sequential]") {
  Small model(9);
  nn::SoftmaxCrossEntropy ce;
  auto x = tensor_from<fp32>(uniform_values(4 * 84, 1), extents<dyn, 2, 7, 6>(4));
  Kokkos::View<int*> y("y", 4);
  const auto once = [&] {
    const auto [l, d] = ce.forward_backward(exec_space(), model.forward(exec_space(), x), y);
    model.backward(exec_space(), d);
    return to_doubles(model.layer<1>().weight().grad);
  };
  const auto g1 = once();
  const auto g2 = once();
  CHECK(g1 == g2);
}

TEST_CASE("nn::Sequential: fp8_states reach every fp8 slot and round-trip through a checkpoint",
          "[nn][sequential][fp8]") {
  using R = train::delayed_scaling;
  using M8 =
      nn::Sequential<nn::Input<2, 7, 6>,
                     nn::Conv2d<2, 3, 3, nn::conv_options{.stride = 2, .pad = 1}, nn::fp8<R>>,
                     nn::ReLU, nn::Flatten, nn::Linear<36, 5, nn::fp8<R>>>;
  // Three slots (weights, input, output gradient) per fp8 layer, none for fp32 layers.
  M8 model(11);
  auto states = model.fp8_states();
  static_assert(decltype(boost::hana::length(states))::value == 6);
  static_assert(decltype(boost::hana::length(FashionCNN<>(1).fp8_states()))::value == 0);
  std::vector<const void*> seen;
  boost::hana::for_each(states, [&](auto* m) { seen.push_back(m); });
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end()); // six distinct states

  Tensor<fp32, extents<dyn, 2, 7, 6>> x("x", 3);
  fill_normal(x, 5);
  Tensor<fp32, extents<dyn, 5>> dy("dy", 3);
  fill_normal(dy, 6);
  const auto step = [&](float gain) {
    Tensor<fp32, extents<dyn, 2, 7, 6>> xs("xs", 3);
    for (index_t i = 0; i < xs.size(); ++i) xs.data()[i] = gain * x.data()[i];
    model.forward(exec_space(), xs);
    model.backward(exec_space(), cast<bf16>(dy));
  };
  const auto snapshot = [&] {
    std::vector<std::vector<float>> out;
    boost::hana::for_each(states, [&](auto* m) {
      auto h = m->history();
      h.push_back(m->scale_amax());
      out.push_back(h);
    });
    return out;
  };
  step(1.f);
  step(3.f);
  const auto saved = snapshot();
  for (const auto& h : saved) CHECK(h.size() == 3); // two amaxes + the scale amax
  train::sgd opt{.lr = 0.1f};
  train::static_scaler scaler;
  train::run_state run;
  const std::string path = "nn_sequential_fp8_states.ckpt";
  train::save_checkpoint(path, model.parameters(), opt, scaler, run, states);
  step(100.f); // new amaxes enter every history
  CHECK(snapshot() != saved);
  train::load_checkpoint(path, model.parameters(), opt, scaler, run, states);
  CHECK(snapshot() == saved);
  std::remove(path.c_str());
}

TEMPLATE_TEST_CASE("nn::Sequential: Conv2d + ReLU run fused, with the unfused layers' values",
                   "[nn][sequential]", fp32, bf16) {
  // The model's forward stores max(v, 0) in each convolution's output store and ReLU adopts
  // it; running the same layers one by one (unfused: ReLU reads and writes the output again)
  // must give the same outputs and gradients, bit for bit.
  FashionCNN<TestType> model(5);
  nn::SoftmaxCrossEntropy ce;
  const index_t B = 5;
  auto x = tensor_from<fp32>(uniform_values(B * 28 * 28, 6), extents<dyn, 1, 28, 28>(B));
  Kokkos::View<int*> labels("labels", B);
  for (index_t i = 0; i < B; ++i) labels(i) = static_cast<int>(i * 3 % 10);
  const auto gradients = [&] {
    std::vector<std::vector<double>> g;
    boost::hana::for_each(model.parameters(),
                          [&](const auto& p) { g.push_back(to_doubles(p.grad)); });
    return g;
  };
  const auto fused_y = to_doubles(model.forward(exec_space(), x));
  {
    // The fused ReLUs keep no output of their own.
    nn::activation_ledger relu1, relu2;
    model.template layer<2>().count_activations(relu1);
    model.template layer<5>().count_activations(relu2);
    CHECK(relu1.bytes() == 0);
    CHECK(relu2.bytes() == 0);
  }
  const auto [l1, d1] = ce.forward_backward(exec_space(), model.forward(exec_space(), x), labels);
  model.backward(exec_space(), d1);
  const auto fused_g = gradients();

  const auto e = exec_space();
  const auto unfused_forward = [&] {
    auto& m = model;
    auto a0 = m.template layer<0>().forward(e, x);
    auto a1 = m.template layer<2>().forward(e, m.template layer<1>().forward(e, a0));
    auto a2 = m.template layer<3>().forward(e, a1);
    auto a3 = m.template layer<5>().forward(e, m.template layer<4>().forward(e, a2));
    auto a4 = m.template layer<7>().forward(e, m.template layer<6>().forward(e, a3));
    auto a5 = m.template layer<9>().forward(e, m.template layer<8>().forward(e, a4));
    return m.template layer<10>().forward(e, a5);
  };
  CHECK(to_doubles(unfused_forward()) == fused_y);
  {
    nn::activation_ledger relu1;
    model.template layer<2>().count_activations(relu1);
    CHECK(relu1.bytes() > 0); // the unfused ReLU writes its own output
  }
  const auto [l2, d2] = ce.forward_backward(exec_space(), unfused_forward(), labels);
  CHECK(l2 == l1);
  auto& m = model;
  auto g9 = m.template layer<9>().backward(e, m.template layer<10>().backward(e, d2));
  auto g7 = m.template layer<7>().backward(e, m.template layer<8>().backward(e, g9));
  auto g5 = m.template layer<5>().backward(e, m.template layer<6>().backward(e, g7));
  auto g3 = m.template layer<3>().backward(e, m.template layer<4>().backward(e, g5));
  m.template layer<1>().backward(e, m.template layer<2>().backward(e, g3), false);
  const auto unfused_g = gradients();
  REQUIRE(unfused_g.size() == fused_g.size());
  for (std::size_t i = 0; i < fused_g.size(); ++i) {
    INFO("parameter " << i);
    CHECK(unfused_g[i] == fused_g[i]);
  }
}

namespace {

// Conv2d, ReLU, MaxPool2d<2> in a Sequential (pooled in the convolution's store where it can)
// against the same layers run one by one (the convolution's full output, ReLU, then pooling):
// outputs, dx and the gradients bit for bit. `fused` says whether the store must have pooled
// (the convolution's full-resolution output then never allocated).
template <class Model, index_t C>
void conv_relu_pool_case(index_t B, index_t H, index_t W, bool fused, std::uint64_t seed) {
  INFO("B " << B << ", C " << C << ", H " << H << ", W " << W);
  Model model(seed);
  const auto e = exec_space();
  auto x = tensor_from<fp32>(uniform_values(static_cast<std::size_t>(B * C * H * W), seed + 1),
                             extents<dyn, C, dyn, dyn>(B, H, W));
  const auto y = model.forward(e, x);
  const auto fused_y = to_doubles(y);
  const auto conv_bytes = [&] {
    nn::activation_ledger l;
    model.template layer<0>().count_activations(l);
    return l.bytes();
  };
  const std::size_t kept = conv_bytes();
  auto dy = tensor_from<typename std::remove_cvref_t<decltype(y)>::precision>(
      uniform_values(static_cast<std::size_t>(y.size()), seed + 2), y.extents());
  const auto fused_dx = to_doubles(model.backward(e, dy, true));
  std::vector<std::vector<double>> fused_g;
  boost::hana::for_each(model.parameters(),
                        [&](const auto& p) { fused_g.push_back(to_doubles(p.grad)); });

  auto& conv = model.template layer<0>();
  auto& relu = model.template layer<1>();
  auto& pool = model.template layer<2>();
  CHECK(to_doubles(pool.forward(e, relu.forward(e, conv.forward(e, x)))) == fused_y);
  // The full-resolution output exists only now, when the store pooled.
  CHECK((conv_bytes() > kept) == fused);
  CHECK(to_doubles(conv.backward(e, relu.backward(e, pool.backward(e, dy)))) == fused_dx);
  std::size_t i = 0;
  boost::hana::for_each(model.parameters(), [&](const auto& p) {
    INFO("parameter " << i);
    CHECK(to_doubles(p.grad) == fused_g[i++]);
  });
}

template <class P>
using NarrowCRP =
    nn::Sequential<nn::Conv2d<3, 16, 3, nn::conv_options{.pad = 1}, P>, nn::ReLU, nn::MaxPool2d<2>>;
template <class P>
using DirectCRP =
    nn::Sequential<nn::Conv2d<8, 16, 3, nn::conv_options{.pad = 1}, P>, nn::ReLU, nn::MaxPool2d<2>>;
template <class P>
using StridedCRP = nn::Sequential<nn::Conv2d<8, 16, 3, nn::conv_options{.stride = 2, .pad = 1}, P>,
                                  nn::ReLU, nn::MaxPool2d<2>>;

} // namespace

TEMPLATE_TEST_CASE("nn::Sequential<Conv2d, ReLU, MaxPool2d<2>>: pooled in the convolution's "
                   "store, the layers' values bit for bit",
                   "[nn][sequential][pool]", fp32, bf16, nn::fp8<>) {
  namespace ic = tessera::detail::implicit_conv;
  const bool simd = tessera::detail::hostgemm::have_simd;
  // Whether the direct path runs for this precision: always for fp32; for bf16 and fp8
  // operands in their bf16 pairs form (AVX512_BF16 CPUs), or, in a build without a bf16 dot
  // product (AVX2), in the fp32 form on the widened values.
  bool direct_runs =
      std::is_same_v<TestType, fp32> ||
      tessera::detail::implicit_widened_v<std::remove_cvref_t<decltype(exec_space())>, bf16, bf16>;
#if TESSERA_GEMM_AVX512BF16
  if (!direct_runs) direct_runs = ic::pairs_cpu();
#endif
  // The narrow path (3 x 3 x 3 reduction): odd H and W, one band, two bands of 39 output rows
  // made 40 (every band must start at an even row), a tiny image.
  conv_relu_pool_case<NarrowCRP<TestType>, 3>(2, 28, 28, simd, 1);
  conv_relu_pool_case<NarrowCRP<TestType>, 3>(3, 15, 13, simd, 2);
  conv_relu_pool_case<NarrowCRP<TestType>, 3>(1, 77, 40, simd, 3);
  conv_relu_pool_case<NarrowCRP<TestType>, 3>(2, 2, 3, simd, 4);
  // The direct path: 14 wide (rows contiguous), 20 wide (22 slots a row: garbage columns
  // between rows), bands of 9 and 11 rows made 10 and 12, odd H; stride 2.
  conv_relu_pool_case<DirectCRP<TestType>, 8>(2, 14, 14, simd && direct_runs, 5);
  conv_relu_pool_case<DirectCRP<TestType>, 8>(2, 27, 20, simd && direct_runs, 6);
  conv_relu_pool_case<DirectCRP<TestType>, 8>(1, 33, 14, simd && direct_runs, 7);
  // 15 x 14 out: stride 2 takes the direct path when 14 columns fill its rows of MR slots
  // (AVX-512: MR = 14; with AVX2's MR the waste rule sends it to the packed path).
  conv_relu_pool_case<StridedCRP<TestType>, 8>(2, 29, 27, simd && direct_runs && ic::MR == 14, 8);
  // Not pooled in the store (3 columns: more than 25% of a row's slots wasted, the packed
  // path): the layers run one after the other, the same values.
  conv_relu_pool_case<DirectCRP<TestType>, 8>(2, 9, 3, false, 9);
  // Bad input still names the operation.
  DirectCRP<TestType> m(1);
  CHECK_THROWS_AS(m.forward(exec_space(), Tensor<fp32, extents<dyn, 8, dyn, dyn>>("x", 1, 1, 1)),
                  shape_error);
}
