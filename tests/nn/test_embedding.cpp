// nn::Embedding and nn::PositionEmbedding (nn/embedding.hpp):
//  - forward: rows of the table, exactly, for ids with repeats; x + P[0..t) for positions;
//  - backward against an independent double scatter-add and against finite differences
//    (L = sum r y is linear in every table entry: the central difference is exact up to the
//    fp32 rounding of y, see nn_testing.hpp);
//  - overwrite semantics: a second backward gives this step's gradient, not a sum;
//  - errors: ids out of range throw value_error naming the op before anything is written (the
//    last output and the saved ids unchanged), t above the positional table throws shape_error;
//  - N(0, 0.02) initialisation from the counter-based generator: moments and seed determinism.
#include "nn_testing.hpp"

#include <tessera/nn/embedding.hpp>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

Kokkos::View<std::int32_t**> ids_view(const std::vector<int>& v, index_t B, index_t t) {
  Kokkos::View<std::int32_t**> ids("ids", std::size_t(B), std::size_t(t));
  auto h = Kokkos::create_mirror_view(ids);
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < t; ++i) h(b, i) = v[std::size_t(b * t + i)];
  Kokkos::deep_copy(ids, h);
  return ids;
}

static_assert(nn::Layer<nn::PositionEmbedding<8, 4>>);
static_assert(nn::PositionEmbedding<8, 4>::accepts<extents<dyn, dyn, 4>>);
static_assert(nn::PositionEmbedding<8, 4>::accepts<extents<dyn, 8, 4>>);
static_assert(!nn::PositionEmbedding<8, 4>::accepts<extents<dyn, 9, 4>>); // t > T, static
static_assert(!nn::PositionEmbedding<8, 4>::accepts<extents<dyn, 4>>);
static_assert(nn::layer_traits<nn::PositionEmbedding<8, 4>>::forward_flops<extents<dyn, 3, 4>> ==
              12);

} // namespace

TEST_CASE("nn::Embedding: rows of the table, scatter-add gradient, overwrite", "[nn][embedding]") {
  constexpr index_t V = 11, D = 5;
  nn::Embedding<V, D> emb(7);
  std::mt19937_64 g(3);
  for (const auto& [B, t] : std::vector<std::pair<index_t, index_t>>{{1, 1}, {3, 7}, {2, 33}}) {
    INFO("B " << B << ", t " << t);
    std::vector<int> idv(std::size_t(B * t));
    for (auto& e : idv) e = int(g() % 4) * 3 % int(V); // repeats, rows never selected
    const Kokkos::View<const std::int32_t**> ids = ids_view(idv, B, t);
    const auto y = emb.forward(exec_space(), ids);
    static_assert(std::is_same_v<decltype(y)::extents_type, extents<dyn, dyn, D>>);
    REQUIRE(y.extent(0) == B);
    REQUIRE(y.extent(1) == t);
    const auto w = to_doubles(emb.weight().value);
    const auto yh = to_doubles(y);
    for (index_t k = 0; k < B * t; ++k)
      for (index_t j = 0; j < D; ++j)
        REQUIRE(yh[std::size_t(k * D + j)] == w[std::size_t(idv[std::size_t(k)] * D + j)]);
    // backward twice with different dy: the second gradient is that of dy2 alone.
    for (int rep = 0; rep < 2; ++rep) {
      const auto r = uniform_values(std::size_t(B * t * D), g());
      emb.backward(exec_space(), tensor_from<fp32>(r, y.extents()));
      std::vector<double> want(std::size_t(V * D), 0.0), abs_sum(std::size_t(V * D), 0.0);
      for (index_t k = 0; k < B * t; ++k)
        for (index_t j = 0; j < D; ++j) {
          want[std::size_t(idv[std::size_t(k)] * D + j)] += r[std::size_t(k * D + j)];
          abs_sum[std::size_t(idv[std::size_t(k)] * D + j)] += std::abs(r[std::size_t(k * D + j)]);
        }
      const auto got = to_doubles(emb.weight().grad);
      for (std::size_t i = 0; i < want.size(); ++i) // a sum of <= B t fp32 terms (Higham 3.5)
        CHECK(std::abs(got[i] - want[i]) <= double(B * t) * u32 * abs_sum[i]);
      // Finite differences of L = sum r y with respect to the table.
      const auto loss = [&] { return dot(emb.forward(exec_space(), ids), r); };
      check_tensor_gradient("dW", emb.weight().value, emb.weight().grad, loss, 0.125f, 1e-6, g());
    }
  }
}

TEST_CASE("nn::Embedding: ids out of range throw before anything is written", "[nn][embedding]") {
  nn::Embedding<6, 3> emb(1);
  const std::vector<int> good = {0, 5, 2, 2};
  const auto y =
      emb.forward(exec_space(), Kokkos::View<const std::int32_t**>(ids_view(good, 2, 2)));
  const auto before = to_doubles(y);
  for (const int bad : {6, -1, 1 << 30}) {
    INFO("bad id " << bad);
    const std::vector<int> v = {1, 1, bad, 3};
    try {
      (void)emb.forward(exec_space(), Kokkos::View<const std::int32_t**>(ids_view(v, 2, 2)));
      FAIL("no exception");
    } catch (const value_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("tessera::nn::Embedding<6, 3>::forward") &&
                               Catch::Contains("outside [0, 6)"));
    }
    CHECK(to_doubles(y) == before); // the last output is untouched
  }
  // The saved ids are the good ones: the gradient of dy = 1 counts each id's uses.
  std::vector<double> ones(12, 1.0);
  emb.backward(exec_space(), tensor_from<fp32>(ones, extents<dyn, dyn, 3>(2, 2)));
  const auto gr = to_doubles(emb.weight().grad);
  const double uses[6] = {1, 0, 2, 0, 0, 1};
  for (int v = 0; v < 6; ++v)
    for (int j = 0; j < 3; ++j) CHECK(gr[std::size_t(v * 3 + j)] == uses[v]);
  nn::Embedding<6, 3> fresh(1);
  CHECK_THROWS_AS(fresh.backward(exec_space(), tensor_from<fp32>(ones, extents<dyn, dyn, 3>(2, 2))),
                  value_error);
  CHECK_THROWS_AS(emb.backward(exec_space(), tensor_from<fp32>(ones, extents<dyn, dyn, 3>(1, 4))),
                  shape_error);
}

TEST_CASE("nn::Embedding / PositionEmbedding: N(0, 0.02) from the seed", "[nn][embedding]") {
  nn::Embedding<300, 64> a(5), b(5), c(6);
  const auto wa = to_doubles(a.weight().value);
  CHECK(wa == to_doubles(b.weight().value));
  CHECK(wa != to_doubles(c.weight().value));
  double m = 0, s2 = 0;
  for (double x : wa) m += x, s2 += x * x;
  const double n = double(wa.size());
  m /= n;
  const double sd = std::sqrt(s2 / n - m * m);
  // 19200 samples: the mean's standard error is 0.02 / sqrt(n) = 1.4e-4, the sd's ~1e-4.
  CHECK(std::abs(m) < 6e-4);
  CHECK(std::abs(sd - 0.02) < 6e-4);
  nn::PositionEmbedding<128, 128> p(5);
  const auto wp = to_doubles(p.weight().value);
  double mp = 0, sp = 0;
  for (double x : wp) mp += x, sp += x * x;
  // 16384 samples: the mean's standard error is 0.02 / 128 = 1.6e-4 (the sum was taken and never
  // checked until clang's -Wunused-but-set-variable said so).
  CHECK(std::abs(mp / double(wp.size())) < 6e-4);
  CHECK(std::abs(std::sqrt(sp / double(wp.size())) - 0.02) < 6e-4);
}

TEST_CASE("nn::PositionEmbedding: x + P(0..t), gradients, t above the table", "[nn][embedding]") {
  constexpr index_t T = 9, D = 4;
  nn::PositionEmbedding<T, D> pos(2);
  for (const auto& [B, t] : std::vector<std::pair<index_t, index_t>>{{1, 1}, {3, 5}, {2, 9}}) {
    INFO("B " << B << ", t " << t);
    const auto xv = uniform_values(std::size_t(B * t * D), 11 + std::size_t(t));
    auto x = tensor_from<fp32>(xv, extents<dyn, dyn, D>(B, t));
    const auto y = to_doubles(pos.forward(exec_space(), x));
    const auto w = to_doubles(pos.weight().value);
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < t; ++i)
        for (index_t j = 0; j < D; ++j) {
          const std::size_t k = std::size_t((b * t + i) * D + j);
          CHECK(y[k] == double(float(xv[k] + w[std::size_t(i * D + j)])));
        }
    const auto r = uniform_values(xv.size(), 21 + std::size_t(t));
    const auto dx = to_host(pos.backward(exec_space(), tensor_from<fp32>(r, x.extents())));
    CHECK(to_doubles(dx) == r);
    const auto gp = to_doubles(pos.weight().grad);
    for (index_t p = t; p < T; ++p)
      for (index_t j = 0; j < D; ++j) CHECK(gp[std::size_t(p * D + j)] == 0.0);
    const auto loss = [&] { return dot(pos.forward(exec_space(), x), r); };
    check_tensor_gradient("dP", pos.weight().value, pos.weight().grad, loss, 0.125f, 1e-6, 31);
    check_tensor_gradient("dx", x, dx, loss, 0.125f, 1e-6, 32);
  }
  CHECK_THROWS_AS(pos.forward(exec_space(), Tensor<fp32, extents<dyn, dyn, D>>("x", 2, T + 1)),
                  shape_error);
  // Inside a Sequential, before a LayerNorm.
  nn::Sequential<nn::PositionEmbedding<T, D>, nn::LayerNorm<D>> model(3);
  const auto y = model.forward(exec_space(), Tensor<fp32, extents<dyn, dyn, D>>("x", 2, 3));
  CHECK(y.extent(1) == 3);
}

// nn::TokenEmbedding<V, D, T>: Embedding<V, D> as a layer (the first layer of a Sequential
// language model): the same table and outputs, a static (B, T, D) shape, W.grad as Embedding's,
// and a shape_error for ids whose length is not T.
static_assert(nn::Layer<nn::TokenEmbedding<11, 4, 3>>);
static_assert(std::is_same_v<nn::TokenEmbedding<11, 4, 3>::input_extents, extents<dyn, 3>>);
static_assert(std::is_same_v<nn::TokenEmbedding<11, 4, 3>::output_extents<extents<dyn, 3>>,
                             extents<dyn, 3, 4>>);
static_assert(nn::TokenEmbedding<11, 4, 3>::forward_flops<extents<dyn, 3>> == 12.0);

TEST_CASE("nn::TokenEmbedding: Embedding's rows and gradients as a (B, T, D) layer",
          "[nn][embedding]") {
  Kokkos::DefaultExecutionSpace exec;
  nn::TokenEmbedding<11, 4, 3> layer(5);
  nn::Embedding<11, 4> plain(5);
  const auto ids = ids_view({1, 7, 1, 10, 0, 7}, 2, 3);
  const auto y = layer.forward(exec, ids);
  static_assert(std::is_same_v<typename decltype(y)::extents_type, extents<dyn, 3, 4>>);
  const auto yp = plain.forward(exec, ids);
  REQUIRE(y.size() == yp.size());
  for (index_t i = 0; i < y.size(); ++i) CHECK(y.data()[i] == yp.data()[i]);
  Tensor<fp32, extents<dyn, 3, 4>> dy("dy", 2);
  for (index_t i = 0; i < dy.size(); ++i) dy.data()[i] = 0.25f * float(i % 7) - 0.5f;
  const auto dx = layer.backward(exec, dy, true);
  CHECK(dx.size() == 0); // no gradient for integers
  Tensor<fp32, extents<dyn, dyn, 4>> dyp("dyp", 2, 3);
  for (index_t i = 0; i < dy.size(); ++i) dyp.data()[i] = dy.data()[i];
  plain.backward(exec, dyp);
  const auto& g = layer.table().weight().grad;
  const auto& gp = plain.weight().grad;
  bool some_nonzero = false;
  for (index_t i = 0; i < g.size(); ++i) {
    CHECK(g.data()[i] == gp.data()[i]);
    some_nonzero = some_nonzero || g.data()[i] != 0.f;
  }
  CHECK(some_nonzero);
  CHECK_THROWS_AS(layer.forward(exec, ids_view({1, 2, 3, 4}, 2, 2)), shape_error);
}
