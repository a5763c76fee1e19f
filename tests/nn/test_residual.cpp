// nn::Residual<Layers...> (nn/residual.hpp): x + f(x) as an nn::Layer.
//  - its declarations: the shape rule (only shapes f maps to themselves), forward_flops when
//    every inner layer declares them, tensor_split replicate;
//  - forward against x + f(x) computed by the inner Sequential alone;
//  - inside a Sequential (Linear -> Residual<Linear, GELU> -> Linear) and on (B, t, D)
//    (Residual<LayerNorm, Linear>): every parameter gradient and dx against finite
//    differences (nn_testing.hpp's check, fp32; GELU's truncation and the LayerNorm's
//    curvature covered by h = 1e-2 and the noise allowance stated below).
#include "nn_testing.hpp"

#include <tessera/nn/activation.hpp>
#include <tessera/nn/residual.hpp>

#include <boost/hana/at.hpp>
#include <boost/hana/length.hpp>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

using Inner = nn::Residual<nn::Linear<5, 5>, nn::GELU>;
static_assert(nn::Layer<Inner>);
static_assert(Inner::accepts<extents<dyn, 5>>);
static_assert(Inner::accepts<extents<dyn, dyn, 5>>);
static_assert(!Inner::accepts<extents<dyn, 4>>); // the first inner layer refuses: false
static_assert(std::is_same_v<Inner::output_extents<extents<dyn, 5>>, extents<dyn, 5>>);
static_assert(nn::layer_traits<Inner>::tensor_split == nn::split_kind::replicate);
// 2 * 5 * 5 (Linear) + 5 (GELU) + 5 (the add).
static_assert(nn::layer_traits<Inner>::forward_flops<extents<dyn, 5>> == 60);

struct no_flops { // an inner layer without a FLOP declaration: none for the residual either
  explicit no_flops(std::uint64_t) {}
  auto parameters() const { return boost::hana::make_tuple(); }
  template <class InExt>
  [[maybe_unused]] static constexpr bool accepts = true; // unused by the checks below (clang)
  template <class InExt>
  using output_extents = InExt;
};
static_assert(!nn::layer_traits<nn::Residual<nn::GELU, no_flops>>::declares_flops<extents<dyn, 5>>);
static_assert(nn::layer_traits<nn::Residual<nn::GELU>>::declares_flops<extents<dyn, 5>>);

using Model = nn::Sequential<nn::Linear<3, 5>, Inner, nn::Linear<5, 2>>;
static_assert(std::is_same_v<Model::output_extents<extents<dyn, 3>>, extents<dyn, 2>>);

} // namespace

TEST_CASE("nn::Residual: x + f(x), exposes its inner layers", "[nn][residual]") {
  Inner res(9);
  auto x = tensor_from<fp32>(uniform_values(4 * 5, 1), extents<dyn, 5>(4));
  const auto y = to_doubles(res.forward(exec_space(), x));
  nn::Sequential<nn::Linear<5, 5>, nn::GELU> f(9); // same seed: the same layers
  CHECK(to_doubles(f.layer<0>().weight().value) == to_doubles(res.layer<0>().weight().value));
  CHECK(to_doubles(res.inner().layer<0>().weight().value) ==
        to_doubles(res.layer<0>().weight().value));
  const auto fx = to_doubles(f.forward(exec_space(), x));
  const auto xv = to_doubles(x);
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == double(float(xv[i] + fx[i])));
  const auto p = res.parameters();
  static_assert(decltype(boost::hana::length(p))::value == 2);
  CHECK(boost::hana::at_c<0>(p).name == "0.weight");
  CHECK_THROWS_AS(Inner(1).backward(exec_space(), x), value_error); // before forward
}

TEST_CASE("nn::Residual inside a Sequential: gradients match finite differences",
          "[nn][residual]") {
  Model model(4);
  const index_t B = 3;
  auto x = tensor_from<fp32>(uniform_values(std::size_t(B * 3), 2), extents<dyn, 3>(B));
  const auto y = model.forward(exec_space(), x);
  const auto r = uniform_values(std::size_t(B * 2), 3);
  const auto dx = to_host(model.backward(exec_space(), tensor_from<fp32>(r, y.extents()), true));
  const auto loss = [&] { return dot(model.forward(exec_space(), x), r); };
  // Outputs are O(1) sums of <= 6 terms through GELU: rounding of L ~ 10 u per output, over
  // 2h = 0.02 -> ~1e-5; GELU's truncation h^2/6 |L'''| <= 2e-5 (nn_testing.hpp).
  const double noise = 1e-4;
  const float h = 0.01f;
  auto& l0 = model.layer<0>();
  auto& inner = model.layer<1>().layer<0>();
  auto& l2 = model.layer<2>();
  const auto g0 = to_host(l0.weight().grad);
  const auto g0b = to_host(l0.bias().grad);
  const auto g1 = to_host(inner.weight().grad);
  const auto g1b = to_host(inner.bias().grad);
  const auto g2 = to_host(l2.weight().grad);
  check_tensor_gradient("0.weight", l0.weight().value, g0, loss, h, noise, 11);
  check_tensor_gradient("0.bias", l0.bias().value, g0b, loss, h, noise, 12);
  check_tensor_gradient("1.0.weight", inner.weight().value, g1, loss, h, noise, 13);
  check_tensor_gradient("1.0.bias", inner.bias().value, g1b, loss, h, noise, 14);
  check_tensor_gradient("2.weight", l2.weight().value, g2, loss, h, noise, 15);
  check_tensor_gradient("dx", x, dx, loss, h, noise, 16);
}

TEST_CASE("nn::Residual on (B, t, D): LayerNorm -> Linear, gradients", "[nn][residual]") {
  nn::Residual<nn::LayerNorm<6>, nn::Linear<6, 6>> res(7);
  auto x = tensor_from<fp32>(uniform_values(2 * 4 * 6, 5, -2, 2), extents<dyn, dyn, 6>(2, 4));
  const auto y = res.forward(exec_space(), x);
  static_assert(std::is_same_v<decltype(y)::extents_type, extents<dyn, dyn, 6>>);
  const auto r = uniform_values(std::size_t(y.size()), 6);
  const auto dx = to_host(res.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  const auto gw = to_host(res.layer<1>().weight().grad);
  const auto gg = to_host(res.layer<0>().gamma().grad);
  const auto loss = [&] { return dot(res.forward(exec_space(), x), r); };
  // LayerNorm's x_hat has curvature ~rstd^2 <= ~4 here: truncation h^2/6 * O(10) ~ 2e-4 at
  // h = 1e-2; fp32 rounding of L over 2h ~ 1e-5.
  check_tensor_gradient("dx", x, dx, loss, 0.01f, 5e-4, 21);
  check_tensor_gradient("1.weight", res.layer<1>().weight().value, gw, loss, 0.01f, 1e-4, 22);
  check_tensor_gradient("0.weight (gamma)", res.layer<0>().gamma().value, gg, loss, 0.01f, 2e-4,
                        23);
}
