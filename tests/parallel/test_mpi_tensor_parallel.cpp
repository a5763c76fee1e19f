// Tensor-parallel layers on 2 ranks against the whole layers in one process: the forward
// output, the input gradient (so the column-parallel all-reduce of backward runs for Linear and
// Conv2d) and every parameter gradient, gathered whole by name. fp32: only the order of the
// fp32 sums differs, so a relative 1e-5 of the largest magnitude bounds the difference (a
// missing all-reduce or a shard taken from the wrong place is off by O(1)).
#include <tessera/nn.hpp>
#include <tessera/parallel/mpi.hpp>
#include <tessera/parallel/tensor_parallel.hpp>

#include <catch2/catch.hpp>

#include <boost/hana/for_each.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace tp = tessera::parallel;
namespace nn = tessera::nn;
using tessera::dyn;
using tessera::index_t;

namespace {

template <class T>
std::vector<float> values(const T& t) {
  std::vector<float> v(static_cast<std::size_t>(t.size()));
  for (index_t i = 0; i < t.size(); ++i) v[std::size_t(i)] = tessera::to_float(t.data()[i]);
  return v;
}

void require_close(const char* what, const std::vector<float>& got,
                   const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  float scale = 0, diff = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    diff = std::max(diff, std::fabs(got[i] - want[i]));
  }
  INFO(what << ": max |got - want| = " << diff << ", max |want| = " << scale);
  CHECK(scale > 0);
  CHECK(diff <= 1e-5f * scale);
}

template <class Model, class X, class DY>
void check_split(const X& x, const DY& dy) {
  auto world = tp::mpi_communicator::world();
  REQUIRE(world.size() == 2);
  Kokkos::DefaultExecutionSpace exec;
  Model whole(11);
  tp::tensor_split_t<Model, 2> split(11);
  const tp::tensor_group group(world);
  tp::bind_tensor_group(split, group);

  const auto yw = values(whole.forward(exec, x));
  const auto ys = values(split.forward(exec, x));
  require_close("forward", ys, yw);
  const auto dxw = values(whole.backward(exec, dy, true));
  const auto dxs = values(split.backward(exec, dy, true));
  require_close("input gradient", dxs, dxw);

  const auto grads = tp::gather_gradients(split, group);
  std::size_t n = 0;
  boost::hana::for_each(whole.parameters(), [&](const auto& p) {
    INFO(p.name);
    require_close("parameter gradient", grads.at(p.name), values(p.grad));
    ++n;
  });
  CHECK(grads.size() == n);
}

template <class X>
void fill(X& x, std::uint64_t seed) {
  tessera::fill_uniform(x, seed, -1.f, 1.f);
}

} // namespace

TEST_CASE("tensor parallel: Linear pair (column, GELU, row)", "[parallel]") {
  using Model = nn::Sequential<nn::Linear<7, 6>, nn::GELU, nn::Linear<6, 5>>;
  tessera::Tensor<tessera::fp32, tessera::extents<dyn, 7>> x("x", 3);
  tessera::Tensor<tessera::fp32, tessera::extents<dyn, 5>> dy("dy", 3);
  fill(x, 1);
  fill(dy, 2);
  check_split<Model>(x, dy);
}

TEST_CASE("tensor parallel: Conv2d pair, then Flatten into a Linear pair", "[parallel]") {
  using Model =
      nn::Sequential<nn::Input<3, 6, 6>, nn::Conv2d<3, 4, 3, nn::conv_options{.pad = 1}>, nn::ReLU,
                     nn::MaxPool2d<2>, nn::Conv2d<4, 6, 3, nn::conv_options{.pad = 1}>, nn::Flatten,
                     nn::Linear<54, 4>, nn::GELU, nn::Linear<4, 3>>;
  static_assert(tp::tensor_split_roles<Model>[1] == tp::split_role::column &&
                tp::tensor_split_roles<Model>[4] == tp::split_role::row &&
                tp::tensor_split_roles<Model>[6] == tp::split_role::column &&
                tp::tensor_split_roles<Model>[8] == tp::split_role::row);
  tessera::Tensor<tessera::fp32, tessera::extents<dyn, 3, 6, 6>> x("x", 2);
  tessera::Tensor<tessera::fp32, tessera::extents<dyn, 3>> dy("dy", 2);
  fill(x, 3);
  fill(dy, 4);
  check_split<Model>(x, dy);
}

TEST_CASE("tensor parallel: Conv2d column then Flatten into a row Linear", "[parallel]") {
  // The flat features of a channel shard are a contiguous block of the whole flat features.
  using Model = nn::Sequential<nn::Input<2, 5, 5>, nn::Conv2d<2, 4, 3>, nn::ReLU, nn::Flatten,
                               nn::Linear<36, 3>>;
  static_assert(tp::tensor_split_roles<Model>[1] == tp::split_role::column &&
                tp::tensor_split_roles<Model>[4] == tp::split_role::row);
  tessera::Tensor<tessera::fp32, tessera::extents<dyn, 2, 5, 5>> x("x", 3);
  tessera::Tensor<tessera::fp32, tessera::extents<dyn, 3>> dy("dy", 3);
  fill(x, 5);
  fill(dy, 6);
  check_split<Model>(x, dy);
}
