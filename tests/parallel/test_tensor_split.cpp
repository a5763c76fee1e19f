// The tensor split as a type transform (roles, layer types, shapes, T = 1 identity), the shard
// layout helpers, and the errors of unbound or mis-bound layers, in one process. The numerics
// of the split layers across ranks are in test_mpi_tensor_parallel.cpp and test_mpi_plans_*.
#include <tessera/parallel/tensor_parallel.hpp>

#include <catch2/catch.hpp>

#include <boost/hana/at.hpp>
#include <boost/hana/for_each.hpp>

#include <array>
#include <numeric>
#include <type_traits>
#include <vector>

namespace tp = tessera::parallel;
namespace nn = tessera::nn;
using tessera::bf16;
using tessera::fp32;
using R = tp::split_role;

template <class P>
using CNN =
    nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Conv2d<32, 64, 3, nn::conv_options{.pad = 1}, P>,
                   nn::ReLU, nn::MaxPool2d<2>, nn::Flatten, nn::Linear<3136, 128, P>, nn::ReLU,
                   nn::Linear<128, 10, P>>;
using MLP =
    nn::Sequential<nn::Linear<23, 36>, nn::ReLU, nn::Linear<36, 20>, nn::GELU, nn::Linear<20, 10>>;

// Pairs: conv 1 with conv 4 (through ReLU, MaxPool2d), linear 8 with linear 10; the MLP's third
// Linear has no partner and is replicated.
static_assert(tp::tensor_split_roles<CNN<fp32>> ==
              std::array{R::replicate, R::column, R::replicate, R::replicate, R::row, R::replicate,
                         R::replicate, R::replicate, R::column, R::replicate, R::row});
static_assert(tp::tensor_split_roles<MLP> ==
              std::array{R::column, R::replicate, R::row, R::replicate, R::replicate});
// A layer with parameters that is not split (a grouped convolution) breaks a pair.
static_assert(
    tp::tensor_split_roles<
        nn::Sequential<nn::Input<4, 8, 8>, nn::Conv2d<4, 4, 3>,
                       nn::Conv2d<4, 4, 1, nn::conv_options{.groups = 2}>, nn::Conv2d<4, 4, 1>>> ==
    std::array{R::replicate, R::replicate, R::replicate, R::replicate});

using cnn2 = tp::tensor_split_t<CNN<bf16>, 2>;
static_assert(
    std::is_same_v<
        cnn2,
        nn::Sequential<
            nn::Input<1, 28, 28>,
            tp::ColumnParallelConv2d<1, 32, 3, nn::conv_options{.pad = 1}, 2, bf16>, nn::ReLU,
            nn::MaxPool2d<2>, tp::RowParallelConv2d<32, 64, 3, nn::conv_options{.pad = 1}, 2, bf16>,
            nn::ReLU, nn::MaxPool2d<2>, nn::Flatten, tp::ColumnParallelLinear<3136, 128, 2, bf16>,
            nn::ReLU, tp::RowParallelLinear<128, 10, 2, bf16>>>);
// Any unscaled precision splits (fp16 as bf16); the shard layers instantiate with it.
static_assert(std::is_same_v<
              tp::tensor_split_t<CNN<tessera::fp16>, 2>,
              nn::Sequential<
                  nn::Input<1, 28, 28>,
                  tp::ColumnParallelConv2d<1, 32, 3, nn::conv_options{.pad = 1}, 2, tessera::fp16>,
                  nn::ReLU, nn::MaxPool2d<2>,
                  tp::RowParallelConv2d<32, 64, 3, nn::conv_options{.pad = 1}, 2, tessera::fp16>,
                  nn::ReLU, nn::MaxPool2d<2>, nn::Flatten,
                  tp::ColumnParallelLinear<3136, 128, 2, tessera::fp16>, nn::ReLU,
                  tp::RowParallelLinear<128, 10, 2, tessera::fp16>>>);
static_assert(sizeof(tp::ColumnParallelLinear<16, 8, 2, tessera::fp16>) > 0 &&
              sizeof(tp::RowParallelLinear<16, 8, 2, tessera::fp16>) > 0);
// Shapes through the split model: conv 1 makes 16 of the 32 channels; conv 4 takes them and
// makes all 64; linear 8 makes 64 of 128 features; the logits are whole.
static_assert(std::is_same_v<cnn2::output_extents<tessera::extents<tessera::dyn, 1, 28, 28>>,
                             tessera::extents<tessera::dyn, 10>>);
static_assert(std::is_same_v<tp::tensor_split_t<CNN<fp32>, 1>, CNN<fp32>>);
static_assert(std::is_same_v<tp::tensor_split_t<MLP, 4>,
                             nn::Sequential<tp::ColumnParallelLinear<23, 36, 4, fp32>, nn::ReLU,
                                            tp::RowParallelLinear<36, 20, 4, fp32>, nn::GELU,
                                            nn::Linear<20, 10>>>);

TEST_CASE("tensor split: shards are slices of (outer, T, inner) and reassemble", "[parallel]") {
  const tp::shard_spec s{true, 3, 2}; // a (3, T * 2) matrix split by column blocks
  constexpr int T = 4;
  std::vector<float> whole(3 * T * 2);
  std::iota(whole.begin(), whole.end(), 0.f);
  std::vector<float> gathered;
  for (int t = 0; t < T; ++t) {
    std::vector<float> shard(6);
    tp::detail::take_shard(whole.data(), shard.data(), s, T, t);
    CHECK(shard[0] == float(2 * t));         // row 0, first column of block t
    CHECK(shard[3] == float(8 + 2 * t + 1)); // row 1, second column of block t
    gathered.insert(gathered.end(), shard.begin(), shard.end());
  }
  std::vector<float> back(whole.size(), -1.f);
  tp::detail::assemble_shards(gathered.data(), back.data(), s, T);
  CHECK(back == whole);
}

TEST_CASE("tensor split: one process, T = 1 plan, gather is the identity", "[parallel]") {
  MLP model(3);
  const auto whole = tp::gather_parameters(model, tp::tensor_group{});
  REQUIRE(whole.size() == 6);
  boost::hana::for_each(model.parameters(), [&](const auto& p) {
    const auto& v = whole.at(p.name);
    REQUIRE(v.size() == std::size_t(p.size()));
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(v[i] == p.value.data()[i]);
  });
  auto changed = whole;
  for (auto& [name, v] : changed)
    for (float& x : v) x += 1.f;
  tp::scatter_parameters(model, tp::tensor_group{}, changed);
  CHECK(model.layer<4>().bias().value.data()[0] == whole.at("4.bias")[0] + 1.f);
  changed.erase("2.weight");
  CHECK_THROWS_WITH(tp::scatter_parameters(model, tp::tensor_group{}, changed),
                    Catch::Contains("no values for '2.weight'"));
  CHECK(model.layer<4>().bias().value.data()[0] == whole.at("4.bias")[0] + 1.f);
}

TEST_CASE("tensor split: a split layer needs a group of its size", "[parallel]") {
  tp::tensor_split_t<MLP, 2> model(3);
  Kokkos::DefaultExecutionSpace exec;
  tessera::Tensor<fp32, tessera::extents<tessera::dyn, 23>> x("x", 2);
  CHECK_THROWS_WITH(model.forward(exec, x), Catch::Contains("call bind_tensor_group"));
  CHECK_THROWS_WITH(tp::bind_tensor_group(model, tp::tensor_group{}),
                    Catch::Contains("split 2 ways but the tensor group has 1 ranks"));
}

TEST_CASE("tensor split: shard 0 before binding is the slice of the whole init", "[parallel]") {
  // Column-parallel: the first Out/T rows; row-parallel: the first In/T columns of each row.
  MLP whole(5);
  tp::tensor_split_t<MLP, 2> split(5);
  const auto& w0 = whole.layer<0>().weight().value;
  const auto s0 = split.layer<0>().parameters();
  const auto& c = boost::hana::at_c<0>(s0).value; // (18, 23)
  for (tessera::index_t i = 0; i < c.size(); ++i) CHECK(c.data()[i] == w0.data()[i]);
  const auto& w2 = whole.layer<2>().weight().value; // (20, 36)
  const auto& r = split.layer<2>().weight().value;  // (20, 18)
  for (tessera::index_t o = 0; o < 20; ++o)
    for (tessera::index_t i = 0; i < 18; ++i) CHECK(r(o, i) == w2(o, i));
  const auto& b2 = split.layer<2>().bias().value; // replicated
  for (tessera::index_t o = 0; o < 20; ++o) CHECK(b2(o) == whole.layer<2>().bias().value(o));
}
