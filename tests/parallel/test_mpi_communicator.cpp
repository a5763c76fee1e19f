// mpi_communicator against references every rank computes alone (each rank can regenerate any
// other rank's data from its seed). Run under mpiexec with any number of ranks (CTest: 8 and 3).
#include <tessera/parallel/mesh.hpp>
#include <tessera/parallel/mpi.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tp = tessera::parallel;
using tessera::bfloat16;

namespace {

// Rank r's i-th value in test `salt`: deterministic, so every rank knows every rank's data.
float value(int r, std::int64_t i, int salt) {
  std::mt19937 g(std::uint32_t(1000003 * r + 7919 * salt) ^ std::uint32_t(i * 2654435761u));
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(g);
}

// Element counts: empty, tiny, odd, prime, and 20011 floats (80 KB), far above Open MPI's shared-
// memory eager limit (btl_vader_eager_limit, 4 KiB by default), so the rendezvous path runs too.
const std::vector<std::int64_t> counts = {0, 1, 3, 17, 1009, 20011};

} // namespace

TEST_CASE("mpi all_reduce_sum fp32, blocking and non-blocking", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  const int p = world.size(), me = world.rank();
  for (std::int64_t n : counts)
    for (bool nonblocking : {false, true}) {
      INFO(n << " elements, non-blocking " << nonblocking);
      std::vector<float> buf(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) buf[std::size_t(i)] = value(me, i, 1);
      if (nonblocking) {
        tp::request r = world.iall_reduce_sum(buf.data(), n);
        r.wait();
        CHECK_FALSE(r.pending());
      } else {
        world.all_reduce_sum(buf.data(), n);
      }
      int bad = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        double exact = 0, magnitude = 0;
        for (int r = 0; r < p; ++r) exact += value(r, i, 1), magnitude += std::fabs(value(r, i, 1));
        // p - 1 fp32 additions in some order: |error| <= (p - 1) u sum|x| (u = 2^-24).
        bad += std::fabs(buf[std::size_t(i)] - exact) > (p - 1) * 0x1p-24 * magnitude + 1e-30;
      }
      CHECK(bad == 0);
    }
}

TEST_CASE("mpi all_reduce_sum bf16 reduces in fp32 and rounds once", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  const int p = world.size(), me = world.rank();
  // Rank 0 holds 1, the others 2^-9 (a quarter of bf16's ulp at 1). Rounding after every hop
  // would lose each 2^-9 (1 + 2^-9 rounds back to 1); one rounding of the fp32 sum
  // 1 + (p-1) 2^-9 gives the nearest bf16 to it.
  for (bool nonblocking : {false, true}) {
    std::vector<bfloat16> buf(5, bfloat16::from_float(me == 0 ? 1.0f : 0x1p-9f));
    if (nonblocking)
      world.iall_reduce_sum(buf.data(), 5).wait();
    else
      world.all_reduce_sum(buf.data(), 5);
    const float expected = bfloat16::from_float(1.0f + float(p - 1) * 0x1p-9f).to_float();
    for (const bfloat16& x : buf) CHECK(x.to_float() == expected);
  }
  // Random data: the result is the bf16 rounding of a value within fp32 error of the exact sum.
  for (std::int64_t n : counts) {
    std::vector<bfloat16> buf(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      buf[std::size_t(i)] = bfloat16::from_float(value(me, i, 2));
    world.all_reduce_sum(buf.data(), n);
    int bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < p; ++r) {
        const double x = bfloat16::from_float(value(r, i, 2)).to_float();
        exact += x, magnitude += std::fabs(x);
      }
      // Half a bf16 ulp (2^-8 relative) after the fp32 sum's error.
      const double fp32_error = (p - 1) * 0x1p-24 * magnitude;
      bad += std::fabs(buf[std::size_t(i)].to_float() - exact) >
             0x1p-8 * (std::fabs(exact) + fp32_error) + fp32_error + 1e-30;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("mpi all_gather, reduce_scatter_sum and broadcast", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  const int p = world.size(), me = world.rank();
  for (std::int64_t n : {std::int64_t(1), std::int64_t(5), std::int64_t(4099)}) {
    INFO(n << " elements per rank");
    std::vector<float> mine(static_cast<std::size_t>(n)), all(static_cast<std::size_t>(n * p));
    for (std::int64_t i = 0; i < n; ++i) mine[std::size_t(i)] = value(me, i, 3);
    world.all_gather(mine.data(), all.data(), n);
    int bad = 0;
    for (int r = 0; r < p; ++r)
      for (std::int64_t i = 0; i < n; ++i) bad += all[std::size_t(r * n + i)] != value(r, i, 3);
    CHECK(bad == 0);

    std::vector<bfloat16> mine16(static_cast<std::size_t>(n)),
        all16(static_cast<std::size_t>(n * p));
    for (std::int64_t i = 0; i < n; ++i)
      mine16[std::size_t(i)] = bfloat16::from_float(value(me, i, 4));
    world.all_gather(mine16.data(), all16.data(), n);
    bad = 0;
    for (int r = 0; r < p; ++r)
      for (std::int64_t i = 0; i < n; ++i)
        bad += !(all16[std::size_t(r * n + i)] == bfloat16::from_float(value(r, i, 4)));
    CHECK(bad == 0);

    // Small integers: every sum is exact in fp32 and in bf16 (|sum| < 2^8).
    auto integer = [](int r, std::int64_t j) { return float((r * 7 + j * 3) % 11 - 5); };
    std::vector<float> send(static_cast<std::size_t>(n * p)), got(static_cast<std::size_t>(n));
    std::vector<bfloat16> send16(static_cast<std::size_t>(n * p)),
        got16(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n * p; ++j) {
      send[std::size_t(j)] = integer(me, j);
      send16[std::size_t(j)] = bfloat16::from_float(integer(me, j));
    }
    world.reduce_scatter_sum(send.data(), got.data(), n);
    world.reduce_scatter_sum(send16.data(), got16.data(), n);
    bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      float exact = 0;
      for (int r = 0; r < p; ++r) exact += integer(r, me * n + i);
      bad += got[std::size_t(i)] != exact;
      bad += got16[std::size_t(i)].to_float() != exact;
    }
    CHECK(bad == 0);

    const int root = p - 1;
    std::vector<float> b(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) b[std::size_t(i)] = value(me, i, 5);
    world.broadcast(b.data(), n, root);
    bad = 0;
    for (std::int64_t i = 0; i < n; ++i) bad += b[std::size_t(i)] != value(root, i, 5);
    CHECK(bad == 0);
  }
}

TEST_CASE("mpi send/recv and isend/irecv around a ring", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  const int p = world.size(), me = world.rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  for (std::int64_t n : {std::int64_t(0), std::int64_t(7), std::int64_t(100003)}) {
    std::vector<float> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n), -7.0f);
    for (std::int64_t i = 0; i < n; ++i) out[std::size_t(i)] = value(me, i, 6);
    {
      tp::request r = world.irecv(in.data(), n, prev, 11);
      tp::request s = world.isend(out.data(), n, next, 11);
      r.wait();
      s.wait();
    }
    int bad = 0;
    for (std::int64_t i = 0; i < n; ++i) bad += in[std::size_t(i)] != value(prev, i, 6);
    CHECK(bad == 0);
    // Blocking pairs: even ranks send first, odd ranks receive first (no cycle of waits).
    if (p > 1) {
      std::vector<bfloat16> out16(static_cast<std::size_t>(n)), in16(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i)
        out16[std::size_t(i)] = bfloat16::from_float(value(me, i, 7));
      if (me % 2 == 0) {
        world.send(out16.data(), n, next, 12);
        world.recv(in16.data(), n, prev, 12);
      } else {
        world.recv(in16.data(), n, prev, 12);
        world.send(out16.data(), n, next, 12);
      }
      bad = 0;
      for (std::int64_t i = 0; i < n; ++i)
        bad += !(in16[std::size_t(i)] == bfloat16::from_float(value(prev, i, 7)));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("mpi all_of: one rank's false is everyone's", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  CHECK(world.all_of(true));
  for (int culprit = 0; culprit < world.size(); ++culprit)
    CHECK_FALSE(world.all_of(world.rank() != culprit));
}

TEST_CASE("mpi bad arguments throw on the calling rank before any communication", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  std::vector<float> buf(4);
  CHECK_THROWS_AS(world.all_reduce_sum(buf.data(), -1), tessera::value_error);
  CHECK_THROWS_AS(world.send(buf.data(), 4, world.size(), 0), tessera::value_error);
  CHECK_THROWS_WITH(world.broadcast(buf.data(), 4, -1),
                    Catch::Contains("broadcast") && Catch::Contains("outside the communicator"));
  world.barrier();
}

TEST_CASE("mpi mesh: sub-communicators follow the plan's groups", "[parallel]") {
  auto world = tp::mpi_communicator::world();
  int meshes = 0, fitting = 0;
  auto check = [&](auto plan_type) {
    using P = typename decltype(plan_type)::type;
    // Whether P fits, from its sizes alone (not P::fits): exactly D x T x P processes, or for
    // data<dyn> any multiple of T x P.
    const int tp_size = P::tensor_size * P::pipeline_size;
    fitting += P::data_size == tessera::dyn ? world.size() % tp_size == 0
                                            : P::data_size * tp_size == world.size();
    if (!P::fits(world.size())) return;
    ++meshes;
    tp::mesh<P, tp::mpi_communicator> m(world);
    INFO(P::name() << " as " << m.shape.name());
    // data<dyn> takes the world's size over tensor x pipeline; fixed sizes are the plan's.
    CHECK(m.shape.world() == world.size());
    CHECK(m.shape.tensor == P::tensor_size);
    CHECK(m.shape.pipeline == P::pipeline_size);
    CHECK(m.shape.data ==
          (P::dynamic_data ? world.size() / (P::tensor_size * P::pipeline_size) : P::data_size));
    // Independent of mesh_shape's arithmetic: tensor innermost, then data, then pipeline.
    const int T = m.shape.tensor, D = m.shape.data, r = world.rank();
    CHECK(m.at == tp::coordinates_t{(r / T) % D, r % T, r / (T * D)});
    for (tp::axis a : P::axes) {
      auto& c = a == tp::axis::data ? m.data : a == tp::axis::tensor ? m.tensor : m.pipeline;
      REQUIRE(c.size() == m.shape.size(a));
      CHECK(c.rank() == m.shape.group_rank(a, world.rank()));
      // Gather the world ranks of the group, in group order, and compare with the plan.
      std::vector<float> me{float(world.rank())}, members(std::size_t(c.size()));
      c.all_gather(me.data(), members.data(), 1);
      for (int k = 0; k < c.size(); ++k) {
        tp::coordinates_t at = m.at;
        (a == tp::axis::data ? at.data : a == tp::axis::tensor ? at.tensor : at.pipeline) = k;
        CHECK(members[std::size_t(k)] == float(at.tensor + T * (at.data + D * at.pipeline)));
      }
    }
  };
  check(boost::hana::type_c<tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>>);
  check(boost::hana::type_c<tp::plan<tp::tensor<3>>>);
  check(boost::hana::type_c<tp::plan<tp::pipeline<3>>>);
  check(boost::hana::type_c<tp::plan<tp::data<2>, tp::pipeline<4>>>);
  check(boost::hana::type_c<tp::plan<tp::data<tessera::dyn>>>);
  check(boost::hana::type_c<tp::plan<tp::data<tessera::dyn>, tp::tensor<2>, tp::pipeline<2>>>);
  check(boost::hana::type_c<tp::plan<tp::pipeline<4>, tp::data<tessera::dyn>>>);
  check(boost::hana::type_c<tp::plan<tp::tensor<3>, tp::data<tessera::dyn>>>);
  // How many of the plans fit each CTest size (1, 3, 8): none skipped by mistake.
  CHECK(meshes == fitting);
  CHECK(meshes == (world.size() == 1   ? 1
                   : world.size() == 3 ? 4
                   : world.size() == 8 ? 5
                                       : fitting));
  // A mesh of the wrong size throws the same message on every rank.
  using wrong = tp::plan<tp::data<5>, tp::tensor<2>>; // 10 ranks, never the CTest size
  CHECK_THROWS_WITH((tp::mesh<wrong, tp::mpi_communicator>(world)),
                    Catch::Contains("plan(data=5, tensor=2, pipeline=1) needs 10 processes") &&
                        Catch::Contains("the world has " + std::to_string(world.size())));
  // data<dyn> over a world that tensor x pipeline (here 5) does not divide: the plan, the rule
  // and the world's size.
  using indivisible = tp::plan<tp::data<tessera::dyn>, tp::tensor<5>>;
  CHECK_THROWS_WITH(
      (tp::mesh<indivisible, tp::mpi_communicator>(world)),
      Catch::Contains("plan(data=dyn, tensor=5, pipeline=1)") &&
          Catch::Contains("positive multiple of tensor x pipeline = 5") &&
          Catch::Contains("the world has " + std::to_string(world.size()) + " processes"));
}
