// What parallel/ makes of a layer from its declarations alone (nn/layer.hpp): a layer that
// declares nothing optional is replicated by the tensor split, needs no FLOPs when the plan has
// no pipeline or its cuts are given, and breaks a column/row pair it sits in; the declarations
// of tessera's own layers give the split roles and costs parallel/ used to hard-code.
#include <tessera/nn.hpp>
#include <tessera/parallel/pipeline.hpp>
#include <tessera/parallel/tensor_parallel.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>

namespace nn = tessera::nn;
namespace tp = tessera::parallel;
using tessera::dyn;
using tessera::extents;

namespace {

// An identity layer with no optional declaration.
struct plain_identity {
  explicit plain_identity(std::uint64_t) {}
  auto parameters() const { return boost::hana::make_tuple(); }
  template <class InExt>
  static constexpr bool accepts = true;
  template <class InExt>
  using output_extents = InExt;
  template <class Exec, class X>
  X forward(const Exec&, const X& x) {
    return x;
  }
  template <class Exec, class DY>
  DY backward(const Exec&, const DY& dy, bool = true) {
    return dy;
  }
};

using with_plain =
    nn::Sequential<nn::Linear<4, 8>, plain_identity, nn::ReLU, nn::Linear<8, 6>, nn::Linear<6, 2>>;

// The split: plain_identity is replicated and breaks the pair 0-3, so 3 pairs with 4.
constexpr auto roles = tp::tensor_split_roles<with_plain>;
static_assert(roles == std::array{tp::split_role::replicate, tp::split_role::replicate,
                                  tp::split_role::replicate, tp::split_role::column,
                                  tp::split_role::row});
static_assert(nn::layer_traits<plain_identity>::tensor_split == nn::split_kind::replicate);

// No FLOPs needed for one stage, or for stages cut by hand.
static_assert(tp::stage_bounds<with_plain, 1>::value == std::array<std::size_t, 2>{0, 5});
static_assert(tp::stage_bounds<with_plain, 2, tp::cut_at<2>>::value ==
              std::array<std::size_t, 3>{0, 2, 5});

// tessera's layers declare what parallel/ used to specialise on: Linear / Conv2d costs and
// splits, one operation per element for activations, K^2 per output for pooling.
using cnn = nn::Sequential<nn::Input<1, 8, 8>, nn::Conv2d<1, 4, 3, nn::conv_options{.pad = 1}>,
                           nn::ReLU, nn::MaxPool2d<2>, nn::Flatten, nn::Linear<64, 10>>;
constexpr auto costs = tp::layer_costs<cnn>();
static_assert(costs[0] == 0);                       // Input: a view
static_assert(costs[1] == 2.0 * 4 * 8 * 8 * 1 * 9); // 2 OutC P Q InC K^2
static_assert(costs[2] == 4 * 8 * 8);               // ReLU: one per element
static_assert(costs[3] == 4.0 * 4 * 4 * 4);         // MaxPool2d<2>: 4 comparisons per output
static_assert(costs[4] == 0);                       // Flatten: a view
static_assert(costs[5] == 2.0 * 64 * 10);           // 2 In Out
static_assert(tp::tensor_split_roles<cnn>[1] == tp::split_role::column &&
              tp::tensor_split_roles<cnn>[5] == tp::split_role::row);
static_assert(nn::layer_traits<nn::Conv2d<4, 4, 3, nn::conv_options{.groups = 2}>>::tensor_split ==
              nn::split_kind::replicate);

} // namespace

TEST_CASE("a layer with only the required members runs in a Sequential", "[parallel][layer]") {
  Kokkos::DefaultExecutionSpace exec;
  with_plain model(3);
  tessera::Tensor<tessera::fp32, extents<dyn, 4>> x("x", 2);
  tessera::fill(x, 0.5f);
  const auto y = model.forward(exec, x);
  CHECK(y.extent(0) == 2);
  CHECK(y.extent(1) == 2);
  tessera::Tensor<tessera::fp32, extents<dyn, 2>> dy("dy", 2);
  tessera::fill(dy, 1.f);
  const auto dx = model.backward(exec, dy, true);
  CHECK(dx.extent(1) == 4);
  // The gradient reached the first layer through plain_identity: its weight gradient is dy's
  // path times x = 0.5, not all zero.
  const auto g = tessera::to_host(model.layer<0>().weight().grad);
  bool any = false;
  for (tessera::index_t i = 0; i < g.size(); ++i) any = any || g.data()[i] != 0.f;
  CHECK(any);
}
