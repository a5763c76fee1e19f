// tessera::gemm and gemm_batched on bad input: shape mismatches, C aliasing A or B, strides
// that give two elements of C one address, epilogue arguments of the wrong length, a bad output
// scale. Each must throw (tessera::shape_error / value_error) with a message naming the call,
// the operands and their shapes, and leave every operand bit-identical. And the legal cases next
// to them (operands sharing one allocation without overlapping, A aliasing B) must still work.
// Each test runs on main_configs: every enabled space, the operands in its memory (the checks
// run on the host before any kernel and must not read the operands' elements).
#include "gemm_testing.hpp"
#include "support/messages.hpp"

using namespace tessera;
using namespace tessera::testing;
using Catch::Matchers::Contains;

namespace {
constexpr std::uint64_t base_seed = 0xe4404;

template <Precision P, class Mem>
using tensor1 = Tensor<P, dextents<1>, layout_right, Mem>;

/// Snapshots of A, B and C: the call under test must leave all three as they were.
template <class PA, class PB, class PC, class Mem>
struct untouched {
  const test_matrix<PA, Mem>& a;
  const test_matrix<PB, Mem>& b;
  const test_matrix<PC, Mem>& c;
  std::vector<unsigned char> a0 = snapshot(a), b0 = snapshot(b), c0 = snapshot(c);
  bool operator()() const { return unchanged(a, a0) && unchanged(b, b0) && unchanged(c, c0); }
};
template <class PA, class PB, class PC, class Mem>
untouched(const test_matrix<PA, Mem>&, const test_matrix<PB, Mem>&, const test_matrix<PC, Mem>&)
    -> untouched<PA, PB, PC, Mem>;
} // namespace

TEMPLATE_LIST_TEST_CASE("gemm errors: shape mismatches name the call and every shape",
                        "[gemm][errors]", main_configs) {
  using mem = memory_of<TestType>;
  struct bad_shape {
    index_t am, ak, bk, bn, cm, cn;
    const char* a_shape;
    const char* b_shape;
    const char* c_shape;
  };
  const bad_shape cases[] = {
      {5, 7, 8, 3, 5, 3, "(5, 7)", "(8, 3)", "(5, 3)"},         // inner dimensions differ
      {5, 7, 7, 3, 4, 3, "(5, 7)", "(7, 3)", "(4, 3)"},         // C has the wrong number of rows
      {5, 7, 7, 3, 5, 4, "(5, 7)", "(7, 3)", "(5, 4)"},         // C has the wrong number of columns
      {65, 1, 2, 65, 65, 65, "(65, 1)", "(2, 65)", "(65, 65)"}, // K 1 against 2
  };
  for (const auto& s : cases) {
    const auto a = make_matrix<fp32, mem>(s.am, s.ak, {}, base_seed);
    const auto b = make_matrix<fp32, mem>(s.bk, s.bn, {true, 1, 0}, base_seed + 1);
    const auto c = make_matrix<fp32, mem>(s.cm, s.cn, {false, 2, 1}, base_seed + 2);
    const untouched same{a, b, c};
    INFO(TestType::name() << ": A " << s.a_shape << ", B " << s.b_shape << ", C " << s.c_shape);
    CHECK_THAT(message_of<shape_error>([&] { TestType::run(a.view, b.view, c.view); }),
               Contains("tessera::gemm") && Contains(s.a_shape) && Contains(s.b_shape) &&
                   Contains(s.c_shape));
    CHECK(same());
  }
}

TEMPLATE_LIST_TEST_CASE("gemm errors: C overlapping A or B is refused", "[gemm][errors]",
                        main_configs) {
  using mem = memory_of<TestType>;
  // C = A exactly (square), C = A^T (same memory, other strides), C a block overlapping half of
  // B in one allocation.
  const index_t n = 24;
  const auto a = make_matrix<fp32, mem>(n, n, {}, base_seed + 3);
  const auto b = make_matrix<fp32, mem>(n, n, {}, base_seed + 4);
  const untouched same{a, b, a};
  CHECK_THAT(message_of<shape_error>([&] { TestType::run(a.view, b.view, a.view); }),
             Contains("tessera::gemm") && Contains("(24, 24)") && Contains("A"));
  REQUIRE_THROWS_AS(TestType::run(a.view, b.view, transpose(a.view)), shape_error);
  REQUIRE_THROWS_AS(TestType::run(a.view, b.view, b.view), shape_error);
  CHECK(same());

  // One allocation of 2n rows: B is rows [0, n), C rows [n / 2, 3n / 2).
  const auto big = make_matrix<fp32, mem>(2 * n, n, {}, base_seed + 5);
  const strided_matrix_view<fp32, mem> b_part(big.view.data(), dextents<2>(n, n), {n, 1});
  const strided_matrix_view<fp32, mem> c_part(big.view.data() + n / 2 * n, dextents<2>(n, n),
                                              {n, 1});
  const untouched same_big{a, big, big};
  CHECK_THAT(message_of<shape_error>([&] { TestType::run(a.view, b_part, c_part); }),
             Contains("tessera::gemm") && Contains("B"));
  CHECK(same_big());
}

TEMPLATE_LIST_TEST_CASE("gemm errors: C strides that give two elements one address",
                        "[gemm][errors]", main_configs) {
  using mem = memory_of<TestType>;
  const auto a = make_matrix<fp32, mem>(6, 5, {}, base_seed + 6);
  const auto b = make_matrix<fp32, mem>(5, 4, {}, base_seed + 7);
  const auto c = make_matrix<fp32, mem>(6, 4, {}, base_seed + 8);
  const untouched same{a, b, c};
  // Column stride 0 (every column of a row at one address), then rows overlapping (row stride 2
  // with 4 columns of stride 1).
  const strided_matrix_view<fp32, mem> broadcast(c.view.data(), dextents<2>(6, 4), {4, 0});
  const strided_matrix_view<fp32, mem> rows_overlap(c.view.data(), dextents<2>(6, 4), {2, 1});
  CHECK_THAT(message_of<shape_error>([&] { TestType::run(a.view, b.view, broadcast); }),
             Contains("tessera::gemm") && Contains("(6, 4)"));
  REQUIRE_THROWS_AS(TestType::run(a.view, b.view, rows_overlap), shape_error);
  CHECK(same());
}

TEMPLATE_LIST_TEST_CASE("gemm errors: operands sharing an allocation without overlap, and A "
                        "aliasing B, are legal",
                        "[gemm][errors]", main_configs) {
  using mem = memory_of<TestType>;
  // One allocation of (M + K + M) rows of width W = K = N: A is the first M rows, B the next K,
  // C the last M. The three byte ranges touch but do not overlap.
  const index_t m = 9, k = 16, n = 16;
  const auto big = make_matrix<fp32, mem>(m + k + m, k, {}, base_seed + 9);
  const strided_matrix_view<fp32, mem> a(big.view.data(), dextents<2>(m, k), {k, 1});
  const strided_matrix_view<fp32, mem> b(big.view.data() + m * k, dextents<2>(k, n), {n, 1});
  const strided_matrix_view<fp32, mem> c(big.view.data() + (m + k) * k, dextents<2>(m, n), {n, 1});
  const auto ref = reference_gemm(to_dmatrix(a), to_dmatrix(b));
  REQUIRE_NOTHROW(TestType::run(a, b, c));
  CHECK(check_against_reference<fp32>(TestType::name() + " A, B, C in one allocation",
                                      to_dmatrix(c), ref, k) == 0);

  // A A^T: A is both operands.
  const auto x = make_matrix<fp32, mem>(33, 20, {false, 3, 2}, base_seed + 10);
  const auto y = make_matrix<fp32, mem>(33, 33, {}, base_seed + 11);
  REQUIRE_NOTHROW(TestType::run(x.view, transpose(x.view), y.view));
  CHECK(check_against_reference<fp32>(TestType::name() + " A A^T", to_dmatrix(y.view),
                                      reference_gemm(x.values, transposed(x.values)), 20) == 0);
}

TEMPLATE_LIST_TEST_CASE("gemm errors: epilogue arguments of the wrong length", "[gemm][errors]",
                        main_configs) {
  using mem = memory_of<TestType>;
  namespace epi = tessera::epi;
  const auto a = make_matrix<fp32, mem>(7, 5, {}, base_seed + 12);
  const auto b = make_matrix<fp32, mem>(5, 11, {}, base_seed + 13);
  const auto c = make_matrix<fp32, mem>(7, 11, {}, base_seed + 14);
  const untouched same{a, b, c};
  tensor1<fp32, mem> v7("v7", 7), v11("v11", 11), v12("v12", 12);
  Tensor<bf16, dextents<2>, layout_right, mem> r("r", 11, 7); // C's shape transposed
  // bias_col needs N = 11 values, bias_row M = 7, residual C's shape (7, 11).
  CHECK_THAT(message_of<shape_error>([&] {
               TestType::run(a.view, b.view, c.view, make_epilogue({}, epi::bias_col{v12}));
             }),
             Contains("tessera::gemm") && Contains("bias_col") && Contains("12") && Contains("11"));
  CHECK_THAT(message_of<shape_error>([&] {
               TestType::run(a.view, b.view, c.view, make_epilogue({}, epi::bias_row{v11}));
             }),
             Contains("tessera::gemm") && Contains("bias_row") && Contains("11") && Contains("7"));
  CHECK_THAT(message_of<shape_error>([&] {
               TestType::run(a.view, b.view, c.view,
                             make_epilogue({}, epi::relu{}, epi::residual{r}));
             }),
             Contains("tessera::gemm") && Contains("residual") && Contains("(11, 7)"));
  // The right lengths pass (the same ops, fixed).
  REQUIRE_NOTHROW(TestType::run(a.view, b.view, c.view,
                                make_epilogue({}, epi::bias_col{v11}, epi::bias_row{v7})));
  CHECK(!same()); // sanity: the successful call did write C
}

TEMPLATE_LIST_TEST_CASE("gemm errors: a scaled output needs a positive finite scale",
                        "[gemm][errors]", main_configs) {
  using mem = memory_of<TestType>;
  const auto a = make_matrix<fp32, mem>(4, 3, {}, base_seed + 15);
  const auto b = make_matrix<fp32, mem>(3, 5, {}, base_seed + 16);
  const auto c = make_matrix<fp8_e4m3, mem>(4, 5, {}, base_seed + 17);
  const untouched same{a, b, c};
  for (const float s : {0.f, -2.f, std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
    INFO("scale " << s);
    CHECK_THAT(message_of<value_error>([&] { TestType::run(a.view, b.view, scaled(c.view, s)); }),
               Contains("tessera::gemm") && Contains("scale"));
  }
  CHECK(same());
}

TEMPLATE_LIST_TEST_CASE("gemm_batched errors: batch extents, and C aliasing A or B in any matrix",
                        "[gemm][errors]", main_configs) {
  using mem = memory_of<TestType>;
  using tensor3 = Tensor<fp32, dextents<3>, layout_right, mem>;
  using strided3 = TensorView<fp32, dextents<3>, layout_stride, mem>;
  tensor3 a("a", 3, 4, 5), b2("b2", 2, 5, 6), b("b", 3, 5, 6), c("c", 3, 4, 6);
  fill_uniform(a, base_seed + 18, -1.f, 1.f);
  fill_uniform(b, base_seed + 19, -1.f, 1.f);
  fill(c, 42.f);
  const auto snap = [](const tensor3& t) { return elements_of(t.view()); };
  const auto a0 = snap(a), b0 = snap(b), c0 = snap(c);
  // A has 3 matrices, B 2 (neither 3 nor 1), C 3.
  CHECK_THAT(message_of<shape_error>([&] { TestType::run_batched(a, b2, c); }),
             Contains("tessera::gemm_batched") && Contains("(3, 4, 5)") && Contains("(2, 5, 6)") &&
                 Contains("(3, 4, 6)"));
  // C's rows (4, 6) against A's (4, 5) and B's (5, 6): C has the wrong number of columns.
  tensor3 c_bad("c_bad", 3, 4, 7);
  CHECK_THAT(message_of<shape_error>([&] { TestType::run_batched(a, b, c_bad); }),
             Contains("tessera::gemm_batched") && Contains("(4, 7)"));
  // C[i] is B[i]'s memory in every matrix (an (M, N) = (5, 6) C inside B).
  tensor3 a5("a5", 3, 5, 5);
  REQUIRE_THROWS_AS(TestType::run_batched(a5, b, b), shape_error);
  const bool all_unchanged = snap(a) == a0 && snap(b) == b0 && snap(c) == c0;
  CHECK(all_unchanged);

  // C[0] is A[1]'s memory and C[1] is A[2]'s (C = A shifted by one matrix). A check that only
  // compares C[i] with A[i] misses it, and computing C[0] would overwrite A[1] before it is read.
  tensor3 bb("bb", 2, 5, 5);
  fill_uniform(bb, base_seed + 20, -1.f, 1.f);
  const strided3 a_first2(a.data(), dextents<3>(2, 4, 5), {20, 5, 1});
  const strided3 c_shifted(a.data() + 20, dextents<3>(2, 4, 5), {20, 5, 1});
  CHECK_THAT(message_of<shape_error>([&] { TestType::run_batched(a_first2, bb, c_shifted); }),
             Contains("tessera::gemm_batched"));
  const bool a_unchanged = snap(a) == a0;
  CHECK(a_unchanged);
}

TEST_CASE("gemm errors: static extents that only meet their mismatch at run time still throw",
          "[gemm][errors]") {
  // The compile-time check sees two static extents at a time (tests/compile_fail/gemm_static_*);
  // a static A against a dynamic B of the wrong K is left to the run-time check. Host tensors by
  // design: the shape check throws before any kernel runs.
  Tensor<fp32, extents<5, 7>, layout_right, host_space> a("a");     // (5, 7) static
  Tensor<fp32, dextents<2>, layout_right, host_space> b("b", 8, 3); // (8, 3) dynamic: K 8 != 7
  Tensor<fp32, extents<5, 3>, layout_right, host_space> c("c");     // (5, 3) static
  CHECK_THAT(message_of<shape_error>([&] { gemm(Kokkos::DefaultHostExecutionSpace{}, a, b, c); }),
             Contains("tessera::gemm") && Contains("(5, 7)") && Contains("(8, 3)") &&
                 Contains("(5, 3)") && Contains("needs A (M, K), B (K, N), C (M, N)"));
}

TEST_CASE("gemm: every operand type reaches the algorithms as one view type per precision",
          "[gemm][static]") {
  // Static shapes and layouts are erased before the algorithm is chosen, so the GEMM code is
  // instantiated once per precision combination, not per shape (benchmarks/compile counts it).
  using canonical = detail::gemm_matrix<fp32, host_space>;
  using static_rm = TensorView<fp32, extents<4, 3>, layout_right, host_space>;
  using static_cm = TensorView<fp32, extents<64, 9>, layout_left, host_space>;
  using dynamic_strided = TensorView<fp32, dextents<2>, layout_stride, host_space>;
  static_assert(
      std::is_same_v<decltype(detail::as_gemm_matrix(std::declval<static_rm>())), canonical>);
  static_assert(
      std::is_same_v<decltype(detail::as_gemm_matrix(std::declval<static_cm>())), canonical>);
  static_assert(
      std::is_same_v<decltype(detail::as_gemm_matrix(std::declval<dynamic_strided>())), canonical>);
  // The conversion keeps the memory, the extents and the strides.
  Tensor<fp32, extents<6, 4>, layout_left, host_space> t("t"); // (6, 4) column-major
  const auto v = transpose(t.view());                          // (4, 6), strides (6, 1)
  const auto m = detail::as_gemm_matrix(v);
  CHECK(m.data() == t.data());
  CHECK(m.extent(0) == 4);
  CHECK(m.extent(1) == 6);
  CHECK(m.stride(0) == v.stride(0));
  CHECK(m.stride(1) == v.stride(1));
  CHECK(&m(3, 5) == &t(5, 3));
}
