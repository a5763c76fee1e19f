// tessera::gemm with fp32 operands and fp32 C against the double reference: every size of
// issue 3 on every axis, random triples, the four transposes with padded leading dimensions,
// alpha/beta cases (beta == 0 with NaN in C), every kind of operand type, and determinism.
// Each test runs on every configuration (every enabled Kokkos space x algorithms, the operands in
// the space's own memory: a device build runs the device space too; results read through host
// copies).
// Tolerance: tests/support/tolerance.hpp (gamma_{K+5} * sum |terms|, fp32 output).
#include "gemm_testing.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {
// Seeds are fixed so that a failure reproduces; each failure message prints its case's seed.
constexpr std::uint64_t base_seed = 0x7e55e4a3;

float pick(std::mt19937_64& rng, std::initializer_list<float> l) {
  return *(l.begin() + std::uniform_int_distribution<std::size_t>(0, l.size() - 1)(rng));
}
bool coin(std::mt19937_64& rng) {
  return std::uniform_int_distribution<int>(0, 1)(rng) == 1;
}
} // namespace

TEMPLATE_LIST_TEST_CASE("gemm fp32: every issue size on each axis", "[gemm][fp32]", all_configs) {
  // Each size of the list on M, then N, then K, the two other sizes drawn from the list below
  // 1000 (so a case costs at most 1000 * 257 * 257 multiply-adds in the reference), random
  // transposes, leading dimensions and alpha/beta.
  std::mt19937_64 rng(base_seed);
  index_t failures = 0;
  for (int axis = 0; axis < 3; ++axis)
    for (const index_t s : issue_sizes()) {
      index_t mnk[3] = {random_size(rng), random_size(rng), random_size(rng)};
      mnk[axis] = s;
      const matrix_form fa = random_form(rng, coin(rng)), fb = random_form(rng, coin(rng)),
                        fc = random_form(rng, coin(rng));
      const float alpha = pick(rng, {1.f, -0.75f, 2.5f}), beta = pick(rng, {0.f, 1.f, 0.5f});
      const std::uint64_t seed = rng();
      if (!check_gemm_case<TestType, fp32, fp32, fp32>(mnk[0], mnk[1], mnk[2], fa, fb, fc, alpha,
                                                       beta, seed))
        ++failures;
    }
  CHECK(failures == 0);
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: random triples", "[gemm][fp32]", all_configs) {
  // Sizes anywhere in [1, 300] (primes, odd, off-by-one from the blocking), 40 cases.
  std::mt19937_64 rng(base_seed + 1);
  std::uniform_int_distribution<index_t> size(1, 300);
  for (int t = 0; t < 40; ++t) {
    const index_t m = size(rng), n = size(rng), k = size(rng);
    const matrix_form fa = random_form(rng, coin(rng)), fb = random_form(rng, coin(rng)),
                      fc = random_form(rng, coin(rng));
    const float alpha = pick(rng, {1.f, 0.5f, -3.f}), beta = pick(rng, {0.f, 1.f, -0.25f});
    check_gemm_case<TestType, fp32, fp32, fp32>(m, n, k, fa, fb, fc, alpha, beta, rng());
  }
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: NN NT TN TT with leading dimensions larger than the extents",
                        "[gemm][fp32]", all_configs) {
  // Shapes below, at and above the usual register and cache tile sizes (8, 16, 64, 256).
  const index_t shapes[][3] = {{1, 1, 1},      {7, 9, 5},     {17, 33, 65}, {64, 64, 64},
                               {127, 63, 255}, {65, 257, 31}, {33, 16, 300}};
  std::uint64_t seed = base_seed + 2;
  for (const auto& s : shapes)
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        // Dense, then padded with offsets on all three operands.
        check_gemm_case<TestType, fp32, fp32, fp32>(s[0], s[1], s[2], {ta, 0, 0}, {tb, 0, 0},
                                                    {false, 0, 0}, 1.f, 0.f, ++seed);
        check_gemm_case<TestType, fp32, fp32, fp32>(s[0], s[1], s[2], {ta, 3, 1}, {tb, 17, 2},
                                                    {false, 5, 3}, 1.f, 1.f, ++seed);
      }
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: shapes straddling the host blocking", "[gemm][fp32]",
                        all_configs) {
  // host_packed's fp32 blocking (include/tessera/gemm/detail/host.hpp): KC = 512, MC = 14 * 12 =
  // 168, NC up to 1024, MR 14, NR 32; the AMX path's tiles are 32 x 32 with K in steps of 32, KC
  // 512, MC 256. Each shape sits just below, at or just above a block edge, with C row-major
  // (partial sums over K kept in C) and transposed (kept in a workspace), beta 0 and 1.
  const index_t shapes[][3] = {{337, 50, 513},  {168, 64, 512},   {169, 33, 1025},
                               {40, 1025, 511}, {15, 1024, 1024}, {29, 97, 1537}};
  std::uint64_t seed = base_seed + 20;
  for (const auto& s : shapes)
    for (const bool tc : {false, true}) {
      check_gemm_case<TestType, fp32, fp32, fp32>(s[0], s[1], s[2], {false, 0, 0}, {tc, 1, 0},
                                                  {tc, 0, 0}, 1.f, 0.f, ++seed);
      check_gemm_case<TestType, fp32, fp32, fp32>(s[0], s[1], s[2], {true, 2, 0}, {false, 0, 0},
                                                  {tc, 3, 1}, -0.5f, 1.f, ++seed);
    }
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: alpha and beta", "[gemm][fp32]", all_configs) {
  // alpha in {0, 1, other} x beta in {0, 1, other}; beta == 0 starts from NaN in C, and
  // alpha == 0 with beta == 0 must give exact zeros.
  std::uint64_t seed = base_seed + 3;
  for (const float alpha : {0.f, 1.f, -0.75f})
    for (const float beta : {0.f, 1.f, 1.5f})
      for (const bool ta : {false, true}) {
        check_gemm_case<TestType, fp32, fp32, fp32>(31, 65, 17, {ta, 0, 0}, {false, 2, 0},
                                                    {false, 1, 1}, alpha, beta, ++seed);
        check_gemm_case<TestType, fp32, fp32, fp32>(130, 70, 129, {false, 0, 0}, {!ta, 0, 0},
                                                    {false, 0, 0}, alpha, beta, ++seed);
      }
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: beta 0 ignores NaN and infinity in C", "[gemm][fp32]",
                        all_configs) {
  using mem = memory_of<TestType>;
  const index_t m = 67, n = 45, k = 33;
  const auto a = make_matrix<fp32, mem>(m, k, {}, base_seed + 4);
  const auto b = make_matrix<fp32, mem>(k, n, {true, 0, 0}, base_seed + 5);
  const auto c = make_matrix<fp32, mem>(m, n, {}, base_seed + 6);
  c.modify([&](const auto& v) {
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j)
        v(i, j) = (i + j) % 2 ? std::numeric_limits<float>::quiet_NaN()
                              : -std::numeric_limits<float>::infinity();
  });
  TestType::run(a.view, b.view, c.view, gemm_options{.alpha = 1.f, .beta = 0.f});
  const auto ref = reference_gemm(a.values, b.values);
  CHECK(check_against_reference<fp32>(TestType::name(), to_dmatrix(c.view), ref, k) == 0);
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: NaN and infinity in A or B propagate", "[gemm][fp32]",
                        all_configs) {
  // IEEE: a NaN in A(i, p) makes row i of C NaN, an infinity in B(p, j) (with no zero or
  // opposite infinity met) makes column j infinite; every other element stays finite and
  // correct. Catches kernels that skip zeros or mask padding by multiplying with 0.
  using mem = memory_of<TestType>;
  const index_t m = 37, n = 41, k = 70;
  const auto a = make_matrix<fp32, mem>(m, k, {}, base_seed + 7, 0.5f, 1.f);
  const auto b = make_matrix<fp32, mem>(k, n, {}, base_seed + 8, 0.5f, 1.f);
  const index_t nan_row = 5, inf_col = 33;
  a.modify([&](const auto& v) { v(nan_row, 61) = std::numeric_limits<float>::quiet_NaN(); });
  b.modify([&](const auto& v) { v(12, inf_col) = std::numeric_limits<float>::infinity(); });
  const auto c = make_matrix<fp32, mem>(m, n, {}, base_seed + 9);
  TestType::run(a.view, b.view, c.view, gemm_options{});
  const dmatrix got = to_dmatrix(c.view);
  index_t wrong = 0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const double v = got(i, j);
      if (i == nan_row) {
        wrong += !std::isnan(v);
      } else if (j == inf_col) {
        wrong += !(std::isinf(v) && v > 0);
      } else {
        wrong += !std::isfinite(v);
      }
    }
  CHECK(wrong == 0);
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: Tensor, layout_left, static extents and transpose() operands",
                        "[gemm][fp32]", all_configs) {
  // Each operand type a caller may pass, beside the strided views the other tests use.
  using mem = memory_of<TestType>;
  using rm = Tensor<fp32, dextents<2>, layout_right, mem>;
  using cm = Tensor<fp32, dextents<2>, layout_left, mem>;
  const index_t m = 19, n = 70, k = 45;
  rm a("a", m, k);                                         // (M, K) row-major
  cm b("b", k, n);                                         // (K, N) column-major
  Tensor<fp32, extents<19, 70>, layout_right, mem> c("c"); // (M, N) static extents
  rm bt("bt", n, k);                                       // (N, K), B^T row-major
  cm ccm("ccm", m, n);                                     // (M, N) column-major
  fill_uniform(a, base_seed + 10, -1.f, 1.f);
  fill_uniform(b, base_seed + 11, -1.f, 1.f);
  fill_uniform(bt, base_seed + 12, -1.f, 1.f);
  const auto ref = reference_gemm(to_dmatrix(a), to_dmatrix(b));
  const auto ref_t = reference_gemm(to_dmatrix(a), transposed(to_dmatrix(bt)));

  fill(c, std::numeric_limits<float>::quiet_NaN());
  TestType::run(a, b, c, gemm_options{});
  CHECK(check_against_reference<fp32>("Tensor x layout_left Tensor -> static Tensor", to_dmatrix(c),
                                      ref, k) == 0);

  fill(ccm, std::numeric_limits<float>::quiet_NaN());
  TestType::run(a.view(), transpose(bt.view()), ccm.view(), gemm_options{});
  CHECK(check_against_reference<fp32>("view x transpose(view) -> layout_left view", to_dmatrix(ccm),
                                      ref_t, k) == 0);

  fill(c, std::numeric_limits<float>::quiet_NaN());
  TestType::run(a.view().as_strided(), b.view(), c.view(), gemm_options{});
  CHECK(check_against_reference<fp32>("strided view x layout_left view -> view", to_dmatrix(c), ref,
                                      k) == 0);

  // C = A^T^T: transposing twice gives back the operand.
  rm at("at", k, m); // (K, M)
  const auto ha = host_mirror_copy(a);
  fill_on_host(at, [&](index_t s) { return ha.data()[(s % m) * k + s / m]; });
  fill(c, std::numeric_limits<float>::quiet_NaN());
  TestType::run(transpose(at.view()), b, c, gemm_options{});
  CHECK(check_against_reference<fp32>("transpose(view) x Tensor -> Tensor", to_dmatrix(c), ref,
                                      k) == 0);
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: bit-identical results on repeated calls", "[gemm][fp32]",
                        all_configs) {
  // Same inputs and thread count -> the same bits, also after another call of a different
  // shape in between (cached packing buffers must not carry state from one call to the next).
  using mem = memory_of<TestType>;
  const index_t m = 257, n = 200, k = 300;
  const auto a = make_matrix<fp32, mem>(m, k, {}, base_seed + 13);
  const auto b = make_matrix<fp32, mem>(k, n, {true, 3, 0}, base_seed + 14);
  const auto c1 = make_matrix<fp32, mem>(m, n, {}, base_seed + 15);
  const auto c2 = make_matrix<fp32, mem>(m, n, {}, base_seed + 15);
  const auto other_a = make_matrix<fp32, mem>(70, 513, {}, base_seed + 16);
  const auto other_b = make_matrix<fp32, mem>(513, 90, {}, base_seed + 17);
  const auto other_c = make_matrix<fp32, mem>(70, 90, {}, base_seed + 18);
  const gemm_options opts{.alpha = 0.5f, .beta = 1.f};
  TestType::run(a.view, b.view, c1.view, opts);
  TestType::run(other_a.view, other_b.view, other_c.view, opts);
  TestType::run(a.view, b.view, c2.view, opts);
  const auto first = bytes_of(c1.storage), second = bytes_of(c2.storage);
  CHECK(first == second);
  CHECK(first != snapshot(make_matrix<fp32, host_space>(m, n, {}, base_seed + 15))); // C written
}

TEMPLATE_LIST_TEST_CASE("gemm fp32: empty extents (K == 0, M == 0, N == 0)", "[gemm][fp32]",
                        all_configs) {
  // K == 0: A B is the zero matrix, so C = beta * C (exact zeros for beta == 0, whatever C
  // held); M == 0 or N == 0: nothing to write. Sizes on both sides of the portable 64 x 64 tile.
  std::uint64_t seed = base_seed + 30;
  for (const index_t s : {1, 17, 64, 65})
    for (const float beta : {0.f, 0.5f}) {
      check_gemm_case<TestType, fp32, fp32, fp32>(s, 70, 0, {}, {}, {false, 2, 1}, 1.f, beta,
                                                  ++seed);
      check_gemm_case<TestType, fp32, fp32, fp32>(0, s, 33, {}, {true, 0, 0}, {}, 1.f, beta,
                                                  ++seed);
      // (C with a padded leading dimension: the harness divides by it.)
      check_gemm_case<TestType, fp32, fp32, fp32>(s, 0, 33, {true, 1, 0}, {}, {false, 1, 0}, 1.f,
                                                  beta, ++seed);
    }
}
