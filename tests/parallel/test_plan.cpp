// plan<...>: sizes, mesh order, rank <-> coordinates, sub-communicator colours.
#include <tessera/parallel/plan.hpp>

#include <catch2/catch.hpp>

#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <map>
#include <set>
#include <utility>

namespace tp = tessera::parallel;
namespace hana = boost::hana;

// Static properties: any order, absent policies are size 1, the documented example.
using p222 = tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>;
static_assert(p222::world_size == 8);
static_assert(p222::coordinates(5) == tp::coordinates_t{0, 1, 1});
static_assert(p222::rank_of({1, 0, 1}) == 6);
static_assert(tp::plan<>::world_size == 1 && tp::plan<>::coordinates(0) == tp::coordinates_t{});
static_assert(tp::plan<tp::pipeline<3>, tp::tensor<5>>::world_size == 15);
static_assert(tp::plan<tp::pipeline<3>, tp::tensor<5>>::data_size == 1);
static_assert(std::is_same_v<tp::plan<tp::tensor<2>, tp::pipeline<3, tp::cut_at<2, 4>>>::cuts,
                             tp::cut_at<2, 4>>);
static_assert(std::is_same_v<tp::plan<tp::data<2>>::cuts, tp::balanced>);
static_assert(tp::plan<tp::data<4>, tp::pipeline<4>>::bubble_fraction(5) == 3.0 / 8.0);
static_assert(tp::Plan<p222> && !tp::Plan<tp::data<2>> && tp::Policy<tp::data<2>> &&
              !tp::Policy<int>);
// data<dyn>: the data degree from the world size, which must be a positive multiple of T * P.
using pdyn = tp::plan<tp::tensor<2>, tp::data<tessera::dyn>, tp::pipeline<3>>;
static_assert(pdyn::dynamic_data && !p222::dynamic_data);
static_assert(pdyn::fits(6) && pdyn::fits(18) && !pdyn::fits(0) && !pdyn::fits(3) &&
              !pdyn::fits(9) && !pdyn::fits(-6));
static_assert(pdyn::shape_on(18) == tp::mesh_shape{3, 2, 3});
static_assert(pdyn::shape_on(18).coordinates(7) == tp::coordinates_t{0, 1, 1});
static_assert(p222::fits(8) && !p222::fits(4) && !p222::fits(16) &&
              p222::shape_on(8) == p222::shape());
static_assert(tp::plan<tp::data<tessera::dyn>>::fits(1) &&
              tp::plan<tp::data<tessera::dyn>>::fits(7) &&
              tp::plan<tp::data<tessera::dyn>>::shape_on(7).data == 7);
// data<D, zero<S>>: the ZeRO stage rides on the data policy; the mesh is data<D>'s.
static_assert(p222::zero_stage == 0 && tp::plan<>::zero_stage == 0 &&
              tp::plan<tp::tensor<2>>::zero_stage == 0);
using pz = tp::plan<tp::pipeline<2>, tp::data<tessera::dyn, tp::zero<2>>, tp::tensor<2>>;
static_assert(pz::zero_stage == 2 && pz::dynamic_data &&
              pz::shape_on(12) == tp::mesh_shape{3, 2, 2});
static_assert(tp::plan<tp::data<3, tp::zero<1>>>::zero_stage == 1 &&
              tp::plan<tp::data<3, tp::zero<1>>>::world_size == 3 &&
              tp::Policy<tp::data<3, tp::zero<1>>>);
static_assert(tp::plan<tp::data<2, tp::zero<0>>>::zero_stage == 0);

namespace {

// Plans of several shapes, in several policy orders (sizes are small primes and 1 so that
// a swapped axis changes the answer).
using plans =
    decltype(hana::tuple_t<tp::plan<>, tp::plan<tp::data<2>>, tp::plan<tp::tensor<2>>,
                           tp::plan<tp::pipeline<2>>, tp::plan<tp::data<2>, tp::tensor<2>>,
                           tp::plan<tp::pipeline<2>, tp::data<2>>,
                           tp::plan<tp::tensor<2>, tp::pipeline<2>>, p222,
                           tp::plan<tp::pipeline<5>, tp::data<3>, tp::tensor<2>>,
                           tp::plan<tp::tensor<3>, tp::pipeline<2>, tp::data<7>>>);

// Independent reference of the Megatron order: enumerate pipeline outermost, then data, then
// tensor innermost, counting ranks.
inline std::map<int, tp::coordinates_t> enumerate_mesh(int D, int T, int P) {
  std::map<int, tp::coordinates_t> m;
  int rank = 0;
  for (int p = 0; p < P; ++p)
    for (int d = 0; d < D; ++d)
      for (int t = 0; t < T; ++t) m[rank++] = {d, t, p};
  return m;
}
template <class P>
std::map<int, tp::coordinates_t> enumerate_mesh() {
  return enumerate_mesh(P::data_size, P::tensor_size, P::pipeline_size);
}

} // namespace

TEST_CASE("plan: rank and coordinates are inverse and follow the tensor-data-pipeline order",
          "[parallel]") {
  hana::for_each(plans{}, [](auto type) {
    using P = typename decltype(type)::type;
    INFO(P::name());
    const auto reference = enumerate_mesh<P>();
    REQUIRE(int(reference.size()) == P::world_size);
    for (const auto& [rank, c] : reference) {
      CHECK(P::coordinates(rank) == c);
      CHECK(P::rank_of(c) == rank);
    }
  });
}

TEST_CASE("plan: groups along each axis partition the ranks, tensor groups are neighbours",
          "[parallel]") {
  hana::for_each(plans{}, [](auto type) {
    using P = typename decltype(type)::type;
    INFO(P::name());
    for (tp::axis a : P::axes) {
      std::map<int, std::set<int>> group_ranks; // colour -> positions inside the group
      std::map<int, std::set<int>> members;     // colour -> world ranks
      for (int r = 0; r < P::world_size; ++r) {
        const int colour = P::group_color(a, r);
        CHECK(group_ranks[colour].insert(P::group_rank(a, r)).second); // unique key
        members[colour].insert(r);
        // Ranks of one group agree on the other two coordinates.
        const auto c = P::coordinates(r), first = P::coordinates(*members[colour].begin());
        if (a != tp::axis::data) CHECK(c.data == first.data);
        if (a != tp::axis::tensor) CHECK(c.tensor == first.tensor);
        if (a != tp::axis::pipeline) CHECK(c.pipeline == first.pipeline);
      }
      CHECK(int(members.size()) == P::world_size / P::size(a));
      for (const auto& [colour, ranks] : members) {
        CHECK(int(ranks.size()) == P::size(a));
        CHECK(*group_ranks[colour].rbegin() == P::size(a) - 1);
        if (a == tp::axis::tensor) // contiguous
          CHECK(*ranks.rbegin() - *ranks.begin() == P::size(a) - 1);
      }
    }
  });
}

TEST_CASE("plan: data<dyn> meshes follow the same order at every world size", "[parallel]") {
  using P = tp::plan<tp::data<tessera::dyn>, tp::tensor<2>, tp::pipeline<2>>;
  CHECK(P::name() == "plan(data=dyn, tensor=2, pipeline=2)");
  for (int world = 1; world <= 40; ++world) {
    INFO("world " << world);
    CHECK(P::fits(world) == (world % 4 == 0));
    if (!P::fits(world)) {
      // The refusal names the plan, the world size and the rule.
      const std::string why = P::misfit(world);
      CHECK_THAT(why,
                 Catch::Contains("plan(data=dyn, tensor=2, pipeline=2)") &&
                     Catch::Contains("the world has " + std::to_string(world) + " processes") &&
                     Catch::Contains("multiple of tensor x pipeline = 4"));
      continue;
    }
    CHECK(P::misfit(world).empty());
    const tp::mesh_shape s = P::shape_on(world);
    CHECK(s == tp::mesh_shape{world / 4, 2, 2});
    CHECK(s.name() == "plan(data=" + std::to_string(world / 4) + ", tensor=2, pipeline=2)");
    for (const auto& [rank, c] : enumerate_mesh(world / 4, 2, 2)) {
      CHECK(s.coordinates(rank) == c);
      CHECK(s.rank_of(c) == rank);
    }
  }
  CHECK_THAT(tp::plan<tp::data<3>>::misfit(4),
             Catch::Contains("plan(data=3, tensor=1, pipeline=1) needs 3 processes") &&
                 Catch::Contains("the world has 4"));
}

TEST_CASE("plan: bubble fraction", "[parallel]") {
  using P = tp::plan<tp::pipeline<4>>;
  for (int m = 1; m <= 64; ++m) CHECK(P::bubble_fraction(m) == Approx(3.0 / (m + 3)));
  CHECK(tp::plan<tp::data<8>>::bubble_fraction(1) == 0.0);
  CHECK(p222::name() == "plan(data=2, tensor=2, pipeline=2)");
}
