// tessera::gemm with low-precision operands against the double reference: all 25 precision
// pairs of A x B (fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, independently) into fp32 C in every
// transpose, a subset into bf16 C, fp16 with every precision into fp16 C on random odd, prime
// and tiny shapes, and determinism of the low-precision paths.
// The inputs are the stored (rounded) values widened exactly, so the reference sees exactly what
// the kernel multiplies; accumulation is fp32, so the bound is the fp32 one of
// tests/support/tolerance.hpp (gamma_{K+5} * sum |terms|), plus bf16's output rounding for a
// bf16 C.
//
// This source builds two programs (tests/gemm/CMakeLists.txt): TESSERA_TEST_GROUP=host runs the
// host algorithms (host_configs), =portable the portable one (portable_configs: every enabled
// space, the device space of a device build included, operands in the space's memory); the 16
// pairs per configuration would make one program slow to build.
#include "gemm_testing.hpp"

#define TESSERA_TEST_CAT2(a, b) a##b
#define TESSERA_TEST_CAT(a, b) TESSERA_TEST_CAT2(a, b)
#define TESSERA_TEST_STR2(x) #x
#define TESSERA_TEST_STR(x) TESSERA_TEST_STR2(x)
#define TESSERA_TEST_CONFIGS TESSERA_TEST_CAT(TESSERA_TEST_GROUP, _configs)
#define TESSERA_TEST_NAME(text) "gemm " TESSERA_TEST_STR(TESSERA_TEST_GROUP) ": " text

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr std::uint64_t base_seed = 0x10e5;

// (M, N, K, A transposed, B transposed): every transpose, sizes around the register and cache
// tiles, one K of 1000 (where accumulating in anything narrower than fp32 shows).
struct lowp_shape {
  index_t m, n, k;
  bool ta, tb;
};
constexpr lowp_shape lowp_shapes[] = {{33, 17, 65, false, false},   {64, 63, 127, true, false},
                                      {7, 130, 257, false, true},   {130, 9, 31, true, true},
                                      {19, 24, 1000, false, false}, {1, 1, 3, true, false}};

/// Input range per precision: [-2, 2) reaches fp8's subnormals (below 2^-6 for e4m3, 2^-14 for
/// e5m2) as well as values above 1.
constexpr float lo = -2.f, hi = 2.f;
} // namespace

TEMPLATE_LIST_TEST_CASE(TESSERA_TEST_NAME("all precision pairs of A x B into fp32 C"),
                        "[gemm][lowp]", TESSERA_TEST_CONFIGS) {
  std::uint64_t seed = base_seed;
  index_t failures = 0;
  for_each_precision_pair([&]<class Pair>(Pair) {
    using PA = typename Pair::a;
    using PB = typename Pair::b;
    for (const auto& s : lowp_shapes) {
      const float beta = s.m % 2 ? 0.f : 1.f; // alternate NaN-C and accumulate cases
      const matrix_form fa{s.ta, s.m % 3, 1}, fb{s.tb, 0, 0}, fc{false, s.n % 4, 0};
      ++seed;
      failures += !check_gemm_case<TestType, PA, PB, fp32>(s.m, s.n, s.k, fa, fb, fc, 0.5f, beta,
                                                           seed, lo, hi);
    }
  });
  CHECK(failures == 0);
}

TEMPLATE_LIST_TEST_CASE(
    TESSERA_TEST_NAME("bf16 x bf16 and e4m3 x e5m2: every issue size on each axis"), "[gemm][lowp]",
    TESSERA_TEST_CONFIGS) {
  // As the fp32 sweep: each size of the list on M, then N, then K, the others drawn from the
  // list below 1000, random transposes and leading dimensions. The AMX tiles (32 x 32, K in
  // steps of 32 bf16 pairs) and the fp32 tiles (14 x 32) both meet their edges here.
  std::mt19937_64 rng(base_seed + 300);
  const auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  index_t failures = 0;
  for (int axis = 0; axis < 3; ++axis)
    for (const index_t s : issue_sizes()) {
      index_t mnk[3] = {random_size(rng), random_size(rng), random_size(rng)};
      mnk[axis] = s;
      const matrix_form fa = random_form(rng, coin()), fb = random_form(rng, coin()),
                        fc = random_form(rng, coin());
      const float beta = coin() ? 0.f : 1.f;
      const std::uint64_t seed = rng();
      if (axis == 1)
        failures += !check_gemm_case<TestType, fp8_e4m3, fp8_e5m2, fp32>(
            mnk[0], mnk[1], mnk[2], fa, fb, fc, 1.f, beta, seed, lo, hi);
      else
        failures += !check_gemm_case<TestType, bf16, bf16, fp32>(mnk[0], mnk[1], mnk[2], fa, fb, fc,
                                                                 1.f, beta, seed, lo, hi);
    }
  CHECK(failures == 0);
}

TEMPLATE_LIST_TEST_CASE(TESSERA_TEST_NAME("bf16 and fp8 shapes straddling the host blocking"),
                        "[gemm][lowp]", TESSERA_TEST_CONFIGS) {
  // host_packed's low-precision kernels (include/tessera/gemm/detail/): AVX512_BF16 MR 14,
  // NR 32, K in bf16 pairs, KC 1024, MC 112; AMX 32 x 32 tiles, K in steps of 32, KC 512, MC 256;
  // NC up to 1024 for both. Each shape sits just below, at or just above a block edge (odd K
  // pads the last pair), with C row-major (partial sums over K kept in C) and transposed (kept
  // in a workspace), operands row-major or transposed, beta 0 (NaN C) and 1.
  const index_t shapes[][3] = {{113, 50, 1025}, {112, 64, 1024}, {40, 1025, 1023},
                               {29, 97, 2049},  {257, 33, 513},  {15, 1024, 31}};
  std::uint64_t seed = base_seed + 400;
  index_t failures = 0;
  for (const auto& s : shapes)
    for (const bool tc : {false, true}) {
      failures += !check_gemm_case<TestType, bf16, bf16, fp32>(
          s[0], s[1], s[2], {false, 0, 0}, {tc, 1, 0}, {tc, 0, 0}, 1.f, 0.f, ++seed, lo, hi);
      failures += !check_gemm_case<TestType, fp8_e4m3, fp8_e5m2, fp32>(
          s[0], s[1], s[2], {true, 2, 0}, {!tc, 0, 0}, {tc, 3, 1}, -0.5f, 1.f, ++seed, lo, hi);
      failures += !check_gemm_case<TestType, fp8_e5m2, bf16, bf16>(
          s[0], s[1], s[2], {tc, 0, 1}, {false, 0, 0}, {false, 1, 0}, 1.f, 0.f, ++seed, lo, hi);
    }
  CHECK(failures == 0);
}

TEMPLATE_LIST_TEST_CASE(TESSERA_TEST_NAME("operands without a unit stride"), "[gemm][lowp]",
                        TESSERA_TEST_CONFIGS) {
  // Every other column of a stored matrix (strides (ld, 2)), transposed or not: the packing's
  // general path, which neither rows nor columns are contiguous for.
  const auto every_other = [](const auto& m) {
    using V = std::remove_cvref_t<decltype(m.view)>;
    const index_t r = m.rows(), c = m.cols() / 2;
    V v(m.view.data(), dextents<2>(r, c), {m.view.stride(0), m.view.stride(1) * 2});
    dmatrix d(r, c);
    for (index_t i = 0; i < r; ++i)
      for (index_t j = 0; j < c; ++j) d(i, j) = m.values(i, 2 * j);
    return std::pair{v, d};
  };
  using mem = memory_of<TestType>;
  std::uint64_t seed = base_seed + 500;
  index_t failures = 0;
  const auto run = [&]<class PA, class PB>(PA, PB, index_t m, index_t n, index_t k) {
    for (const bool t : {false, true}) {
      const auto a = make_matrix<PA, mem>(m, 2 * k, {t, 1, 0}, ++seed, lo, hi);
      const auto b = make_matrix<PB, mem>(k, 2 * n, {!t, 0, 1}, ++seed, lo, hi);
      const auto c = make_matrix<fp32, mem>(m, n, {false, 0, 0}, ++seed);
      const auto [av, ad] = every_other(a);
      const auto [bv, bd] = every_other(b);
      const auto ref = reference_gemm(ad, bd, 1.0, 1.0, c.values);
      TestType::run(av, bv, c.view, gemm_options{.alpha = 1.f, .beta = 1.f});
      failures += check_against_reference<fp32>(
          TestType::name() + " " + precision_traits<PA>::name + " x " + precision_traits<PB>::name,
          to_dmatrix(c.view), ref, k);
    }
  };
  run(fp32{}, fp32{}, 70, 45, 300);
  run(bf16{}, bf16{}, 70, 45, 301);
  run(fp8_e4m3{}, bf16{}, 33, 70, 129);
  run(bf16{}, fp32{}, 65, 66, 67);
  CHECK(failures == 0);
}

TEMPLATE_LIST_TEST_CASE(TESSERA_TEST_NAME("bf16 C from fp32, bf16 and fp8 operands"),
                        "[gemm][lowp]", TESSERA_TEST_CONFIGS) {
  // One rounding to bf16 at the store on top of the fp32 bound; beta != 0 reads the old bf16 C.
  std::uint64_t seed = base_seed + 100;
  index_t failures = 0;
  const auto run = [&]<class PA, class PB>(PA, PB) {
    for (const auto& s : lowp_shapes)
      for (const float beta : {0.f, -1.f}) {
        const matrix_form fa{s.ta, 0, 0}, fb{s.tb, 2, 1}, fc{false, 1, 0};
        failures += !check_gemm_case<TestType, PA, PB, bf16>(s.m, s.n, s.k, fa, fb, fc, 1.f, beta,
                                                             ++seed, lo, hi);
      }
  };
  run(fp32{}, fp32{});
  run(bf16{}, bf16{});
  run(fp8_e4m3{}, fp8_e5m2{});
  run(bf16{}, fp8_e4m3{});
  CHECK(failures == 0);
}

TEMPLATE_LIST_TEST_CASE(TESSERA_TEST_NAME("fp16 with every precision into fp16 and fp32 C"),
                        "[gemm][lowp][fp16]", TESSERA_TEST_CONFIGS) {
  // fp16 x P and P x fp16 for every precision P, C fp16 (one rounding at the store on top of
  // the fp32 bound) or fp32, on random shapes: primes, odd sizes and 1s on every axis, random
  // transposes, leading dimensions and beta.
  std::mt19937_64 rng(base_seed + 600);
  const auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  constexpr index_t sizes[] = {1, 2, 3, 5, 7, 13, 31, 37, 61, 97, 127, 131, 257};
  const auto size = [&] { return sizes[std::uniform_int_distribution<int>(0, 12)(rng)]; };
  index_t failures = 0, cases = 0;
  for_each_precision([&]<class P>(P) {
    const auto one = [&]<class PA, class PB, class PC>(PA, PB, PC) {
      for (int r = 0; r < 4; ++r) {
        const index_t m = size(), n = size(), k = size();
        const matrix_form fa = random_form(rng, coin()), fb = random_form(rng, coin()),
                          fc = random_form(rng, coin());
        const float beta = coin() ? 0.f : 1.f;
        ++cases;
        failures +=
            !check_gemm_case<TestType, PA, PB, PC>(m, n, k, fa, fb, fc, 1.f, beta, rng(), lo, hi);
      }
    };
    one(fp16{}, P{}, fp16{});
    one(P{}, fp16{}, fp16{});
    one(fp16{}, P{}, fp32{});
  });
  CHECK(cases == 60);
  CHECK(failures == 0);
}

TEMPLATE_LIST_TEST_CASE(
    TESSERA_TEST_NAME("low-precision results are bit-identical on repeated calls"), "[gemm][lowp]",
    TESSERA_TEST_CONFIGS) {
  using mem = memory_of<TestType>;
  const auto twice = [&]<class PA, class PB>(PA, PB, std::uint64_t seed) {
    const index_t m = 200, n = 129, k = 513;
    const auto a = make_matrix<PA, mem>(m, k, {}, seed, lo, hi);
    const auto b = make_matrix<PB, mem>(k, n, {true, 0, 0}, seed + 1, lo, hi);
    const auto c1 = make_matrix<fp32, mem>(m, n, {}, seed + 2);
    const auto c2 = make_matrix<fp32, mem>(m, n, {}, seed + 2);
    const auto c0 = snapshot(c1);
    TestType::run(a.view, b.view, c1.view, gemm_options{.alpha = 1.f, .beta = 1.f});
    TestType::run(a.view, b.view, c2.view, gemm_options{.alpha = 1.f, .beta = 1.f});
    INFO(TestType::name() << " " << precision_traits<PA>::name << " x "
                          << precision_traits<PB>::name);
    const auto first = snapshot(c1);
    CHECK(first == snapshot(c2));
    CHECK(first != c0); // C was written
  };
  twice(bf16{}, bf16{}, base_seed + 200);
  twice(fp8_e4m3{}, fp8_e4m3{}, base_seed + 210);
  twice(fp8_e5m2{}, bf16{}, base_seed + 220);
  twice(fp16{}, fp16{}, base_seed + 230);
  twice(fp16{}, bf16{}, base_seed + 240);
}
