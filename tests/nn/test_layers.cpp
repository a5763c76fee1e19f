// nn::Linear and nn::Conv2d (fp32): finite-difference gradient checks of dx, dW and db on
// random inputs over several static shapes and random batch / image sizes; PyTorch's default
// initialisation bounds and seed determinism. Tolerances: nn_testing.hpp.
#include "nn_testing.hpp"

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

template <index_t In, index_t Out>
void linear_gradients(index_t B, std::uint64_t seed) {
  INFO("Linear<" << In << ", " << Out << ">, batch " << B << ", seed " << seed);
  nn::Linear<In, Out> fc(seed);
  auto x = tensor_from<fp32>(uniform_values(static_cast<std::size_t>(B * In), seed + 1),
                             extents<dyn, In>(B)); // (B, In)
  const auto y = fc.forward(exec_space(), x);      // (B, Out)
  REQUIRE(y.extent(0) == B);
  const auto r = uniform_values(static_cast<std::size_t>(B * Out), seed + 2);
  const auto dx = to_host(fc.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  const auto dw = to_host(fc.weight().grad); // two declarations: different tensor types
  const auto db = to_host(fc.bias().grad);
  const auto loss = [&] { return dot(fc.forward(exec_space(), x), r); };
  // L is linear in each coordinate: a large step keeps the rounding noise small.
  const float h = 0.125f;
  const double wmax = 1.0 / std::sqrt(double(In)) + h, k = In + 1;
  const double A = In * (1.0 + h) * wmax + wmax; // bound on sum |terms| of one output
  const auto noise = [&](double changed) { return 2 * changed * k * u32 * A / (2 * h); };
  check_tensor_gradient("dx", x, dx, loss, h, noise(Out), seed + 3);
  check_tensor_gradient("dW", fc.weight().value, dw, loss, h, noise(B), seed + 4);
  check_tensor_gradient("db", fc.bias().value, db, loss, h, noise(B), seed + 5);
}

/// Linear on (B, t, In): gradients against finite differences (as linear_gradients), and the
/// output equal, element for element, to the rank-2 forward of the same rows (B t, In).
template <index_t In, index_t Out, class XE>
void linear3_gradients(const XE& xe, std::uint64_t seed) {
  INFO("Linear<" << In << ", " << Out << "> on " << shape_string(xe) << ", seed " << seed);
  nn::Linear<In, Out> fc(seed);
  const index_t rows = xe.size() / In;
  const auto xv = uniform_values(static_cast<std::size_t>(xe.size()), seed + 1);
  auto x = tensor_from<fp32>(xv, xe);
  const auto y = fc.forward(exec_space(), x);
  static_assert(decltype(y)::extents_type::rank == 3);
  static_assert(decltype(y)::extents_type::static_extent(1) == XE::static_extent(1));
  REQUIRE(y.extent(0) == xe.extent(0));
  REQUIRE(y.extent(1) == xe.extent(1));
  REQUIRE(y.extent(2) == Out);
  const auto y3 = to_doubles(y);
  const auto y2 =
      to_doubles(fc.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, In>(rows))));
  CHECK(y3 == y2);
  (void)fc.forward(exec_space(), x);
  const auto r = uniform_values(static_cast<std::size_t>(rows * Out), seed + 2);
  const auto dxt = fc.backward(exec_space(), tensor_from<fp32>(r, y.extents()));
  static_assert(decltype(dxt)::extents_type::rank == 3);
  REQUIRE(dxt.extent(0) == xe.extent(0));
  REQUIRE(dxt.extent(1) == xe.extent(1));
  REQUIRE(dxt.extent(2) == In);
  const auto dx = to_host(dxt);
  const auto dw = to_host(fc.weight().grad);
  const auto db = to_host(fc.bias().grad);
  // A dy of the other rank, or of another t, is refused.
  CHECK_THROWS_AS(fc.backward(exec_space(), tensor_from<fp32>(r, extents<dyn, Out>(rows))),
                  shape_error);
  const index_t B = xe.extent(0), t = xe.extent(1);
  if (t > 1) // the same rows (B t) as (B t, 1): only the saved (B, t) tells it apart
    CHECK_THROWS_AS(fc.backward(exec_space(), tensor_from<fp32>(r, dextents<3>(B * t, 1, Out))),
                    shape_error);
  CHECK_THROWS_AS(
      fc.backward(exec_space(), tensor_from<fp32>(uniform_values(std::size_t(B * (t + 1) * Out), 7),
                                                  dextents<3>(B, t + 1, Out))),
      shape_error);
  const auto loss = [&] { return dot(fc.forward(exec_space(), x), r); };
  const float h = 0.125f;
  const double wmax = 1.0 / std::sqrt(double(In)) + h, k = In + 1;
  const double A = In * (1.0 + h) * wmax + wmax;
  const auto noise = [&](double changed) { return 2 * changed * k * u32 * A / (2 * h); };
  check_tensor_gradient("dx", x, dx, loss, h, noise(Out), seed + 3);
  check_tensor_gradient("dW", fc.weight().value, dw, loss, h, noise(double(rows)), seed + 4);
  check_tensor_gradient("db", fc.bias().value, db, loss, h, noise(double(rows)), seed + 5);
}

template <index_t C, index_t K, index_t R, nn::conv_options O>
void conv_gradients(index_t B, index_t H, index_t W, std::uint64_t seed) {
  INFO("Conv2d<" << C << ", " << K << ", " << R << ", stride " << O.stride << " pad " << O.pad
                 << " dilation " << O.dilation << " groups " << O.groups << ">, x (" << B << ", "
                 << C << ", " << H << ", " << W << "), seed " << seed);
  nn::Conv2d<C, K, R, O> conv(seed);
  auto x = tensor_from<fp32>(uniform_values(static_cast<std::size_t>(B * C * H * W), seed + 1),
                             dextents<4>(B, C, H, W));
  const auto y = conv.forward(exec_space(), x); // (B, K, P, Q)
  const auto r = uniform_values(static_cast<std::size_t>(y.size()), seed + 2);
  const auto dx = to_host(conv.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  const auto dw = to_host(conv.weight().grad); // two declarations: different tensor types
  const auto db = to_host(conv.bias().grad);
  const auto loss = [&] { return dot(conv.forward(exec_space(), x), r); };
  const float h = 0.125f;
  const double fan = double(C / O.groups * R * R), k = fan + 1;
  const double wmax = 1.0 / std::sqrt(fan) + h, A = fan * (1.0 + h) * wmax + wmax;
  const double pixels = double(B * y.extent(2) * y.extent(3));
  const auto noise = [&](double changed) { return 2 * changed * k * u32 * A / (2 * h); };
  check_tensor_gradient("dx", x, dx, loss, h, noise(double(K * R * R)), seed + 3);
  check_tensor_gradient("dW", conv.weight().value, dw, loss, h, noise(pixels), seed + 4);
  check_tensor_gradient("db", conv.bias().value, db, loss, h, noise(pixels), seed + 5);
}

} // namespace

TEST_CASE("nn::Linear fp32: gradients match finite differences", "[nn][linear]") {
  std::mt19937_64 g(11);
  const index_t batches[] = {1, 2, 5, 17, 64};
  for (int rep = 0; rep < 3; ++rep) {
    const index_t B = batches[g() % 5];
    const auto s = g() % 100000;
    linear_gradients<1, 1>(B, s);
    linear_gradients<7, 3>(B, s + 10);
    linear_gradients<13, 29>(B, s + 20);
    linear_gradients<128, 10>(B, s + 30);
    linear_gradients<5, 70>(B, s + 40); // the bias gradient's column blocks (32) and their tail
  }
}

TEST_CASE("nn::Linear fp32 on (B, t, In): rows of one product, gradients match finite "
          "differences",
          "[nn][linear]") {
  static_assert(nn::Linear<4, 6>::accepts<extents<dyn, dyn, 4>>);
  static_assert(nn::Linear<4, 6>::accepts<extents<dyn, 5, 4>>);
  static_assert(!nn::Linear<4, 6>::accepts<extents<dyn, 5, 3>>);
  static_assert(!nn::Linear<4, 6>::accepts<dextents<4>>);
  static_assert(
      std::is_same_v<nn::Linear<4, 6>::output_extents<extents<dyn, 5, 4>>, extents<dyn, 5, 6>>);
  static_assert(
      std::is_same_v<nn::Linear<4, 6>::output_extents<dextents<3>>, extents<dyn, dyn, 6>>);
  static_assert(std::is_same_v<nn::Linear<4, 6>::output_extents<extents<dyn, 4>>, extents<dyn, 6>>);
  linear3_gradients<7, 3>(extents<dyn, dyn, 7>(2, 5), 101);
  linear3_gradients<13, 29>(extents<dyn, 3, 13>(4), 102);
  linear3_gradients<1, 1>(dextents<3>(1, 1, 1), 103);
  linear3_gradients<32, 96>(extents<dyn, dyn, 32>(3, 7), 104);
  nn::Linear<4, 6> fc(1);
  CHECK_THROWS_AS(fc.forward(exec_space(), Tensor<fp32, dextents<3>>("x", 2, 3, 5)), shape_error);
}

TEST_CASE("nn::Conv2d fp32: gradients match finite differences", "[nn][conv]") {
  std::mt19937_64 g(12);
  for (int rep = 0; rep < 3; ++rep) {
    const index_t B = 1 + index_t(g() % 3), H = 3 + index_t(g() % 9), W = 3 + index_t(g() % 9);
    const auto s = g() % 100000;
    conv_gradients<1, 4, 3, nn::conv_options{.pad = 1}>(B, H, W, s);
    conv_gradients<3, 5, 3, nn::conv_options{.stride = 2}>(B, H, W, s + 10);
    conv_gradients<4, 6, 2, nn::conv_options{.pad = 1, .dilation = 2, .groups = 2}>(B, H, W,
                                                                                    s + 20);
    conv_gradients<2, 3, 1, nn::conv_options{}>(B, H, W, s + 30);
  }
}

// The bias gradient is summed image by image (each thread the images the passes around it
// get), then over the batch per channel in order of b: against a double sum of dy, and the
// same bits on every host space (Serial and the threaded one run the work items on different
// teams), batches that do not divide among the threads, and a batch that shrinks between calls.
TEST_CASE("nn::Conv2d: the bias gradient is dy's sum per channel, the same bits on every space",
          "[nn][conv]") {
  std::vector<std::vector<float>> first; // per batch: the first space's db
  const auto on = [&](auto space) {
    using Exec = decltype(space);
    INFO("execution space " << Exec::name());
    nn::Conv2d<3, 20, 3, nn::conv_options{.pad = 1}> conv(7);
    std::size_t at = 0;
    for (const index_t B : {index_t(37), index_t(64), index_t(5)}) {
      INFO("batch " << B);
      const index_t H = 9, W = 11;
      auto x = tensor_from<fp32>(uniform_values(static_cast<std::size_t>(B * 3 * H * W), 70 + B),
                                 dextents<4>(B, 3, H, W));
      const auto y = conv.forward(space, x);
      const auto r = uniform_values(static_cast<std::size_t>(y.size()), 80 + B);
      conv.backward(space, tensor_from<fp32>(r, y.extents()), false);
      const auto db = to_host(conv.bias().grad);
      std::vector<float> got(20);
      const index_t PQ = y.extent(2) * y.extent(3);
      for (index_t k = 0; k < 20; ++k) {
        double sum = 0, mag = 0;
        for (index_t b = 0; b < B; ++b)
          for (index_t i = 0; i < PQ; ++i) {
            const double v = r[static_cast<std::size_t>((b * 20 + k) * PQ + i)];
            sum += v;
            mag += std::abs(v);
          }
        got[static_cast<std::size_t>(k)] = db(k);
        // lane sums of PQ / 16 + 4 terms per plane, then B planes: each term's error is bounded
        // by that many roundings of the partial sums, each at most u32 * mag.
        const double bound = double(PQ / 16 + 5 + B) * u32 * mag;
        CHECK(std::abs(double(db(k)) - sum) <= bound);
      }
      if (first.size() <= at) first.push_back(got);
      CHECK(got == first[at]);
      ++at;
    }
  };
  std::apply([&](auto... spaces) { (on(spaces), ...); }, default_memory_exec_spaces{});
#if TESSERA_KOKKOS_4 && defined(KOKKOS_ENABLE_OPENMP)
  // A Kokkos with one host space gives the comparison above one side: a one-thread OpenMP
  // instance beside the whole team (Kokkos 4 partitions the pool).
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::OpenMP>)
    if (Kokkos::OpenMP().concurrency() > 1) on(Kokkos::OpenMP(1));
#endif
}

TEST_CASE("nn layers: PyTorch default init bounds, seed determinism", "[nn][init]") {
  const auto check = [](const auto& p, double bound) {
    const auto v = to_doubles(p.value);
    double lo = 1, hi = -1, mean = 0;
    for (double e : v) lo = std::min(lo, e), hi = std::max(hi, e), mean += e;
    mean /= double(v.size());
    INFO(p.name << ": min " << lo << " max " << hi << " mean " << mean << ", bound " << bound);
    CHECK(lo >= -bound);
    CHECK(hi <= bound);
    // Uniform on [-bound, bound]: with n samples the extremes are within ~ 2 bound / n * 10 of
    // the ends (probability of failing ~ e^-10), and the mean within 5 sigma = 5 bound /
    // sqrt(3 n).
    const double n = double(v.size());
    CHECK(hi > bound * (1 - 20 / n));
    CHECK(lo < -bound * (1 - 20 / n));
    CHECK(std::abs(mean) < 5 * bound / std::sqrt(3 * n));
  };
  nn::Linear<100, 50> fc(7);
  check(fc.weight(), 0.1); // 1 / sqrt(100)
  nn::Conv2d<3, 64, 5> conv(7);
  check(conv.weight(), 1 / std::sqrt(75.0)); // fan_in = 3 * 5 * 5

  nn::Linear<100, 50> same(7), other(8);
  CHECK(to_doubles(same.weight().value) == to_doubles(fc.weight().value));
  CHECK(to_doubles(same.bias().value) == to_doubles(fc.bias().value));
  CHECK(to_doubles(other.weight().value) != to_doubles(fc.weight().value));
  // Weight and bias come from different streams: the bias is not the weight's first row.
  const auto w = to_doubles(fc.weight().value), b = to_doubles(fc.bias().value);
  CHECK(std::vector<double>(w.begin(), w.begin() + 50) != b);
}

TEST_CASE("nn::Linear / Conv2d: wrong shapes throw before writing", "[nn][errors]") {
  nn::Linear<4, 3> fc(1);
  Tensor<fp32, dextents<2>> bad("bad", 2, 5);
  CHECK_THROWS_AS(fc.forward(exec_space(), bad), shape_error);
  CHECK_THROWS_AS(fc.backward(exec_space(), Tensor<fp32, extents<dyn, 3>>("dy", 2)), value_error);
  Tensor<fp32, extents<dyn, 4>> x("x", 2);
  fc.forward(exec_space(), x);
  const auto before = to_doubles(fc.weight().grad);
  CHECK_THROWS_AS(fc.backward(exec_space(), Tensor<fp32, extents<dyn, 3>>("dy", 3)), shape_error);
  CHECK(to_doubles(fc.weight().grad) == before);

  nn::Conv2d<2, 3, 3> conv(1);
  CHECK_THROWS_AS(conv.forward(exec_space(), Tensor<fp32, dextents<4>>("x", 1, 3, 5, 5)),
                  shape_error);
  CHECK_THROWS_AS(conv.forward(exec_space(), Tensor<fp32, dextents<4>>("x", 1, 2, 2, 5)),
                  shape_error);
}
