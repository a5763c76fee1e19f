// Shapes, layouts, views, slices, transposes, reshapes and shape errors. These run no kernels
// (element access from the host), so they are not instantiated per execution space.
#include "tensor_testing.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

using namespace tessera; // NOLINT: test file, not a header

namespace {

// Shapes with 0, 1, small primes, odd and even sizes: every stride computation is exercised
// with extents that cannot hide a swapped or missing factor.
const std::vector<std::array<index_t, 3>> shapes3 = {
    {1, 1, 1}, {2, 3, 5},  {5, 3, 2}, {7, 1, 4}, {1, 13, 1},
    {4, 4, 4}, {11, 7, 3}, {0, 3, 2}, {3, 0, 2},
};

// A value that identifies the multi-index: distinct for every element of the shapes above and
// exact in fp32 (well below 2^24).
float tag(index_t i, index_t j, index_t k) {
  return static_cast<float>(10000 * i + 100 * j + k);
}

template <class L>
using cube = Tensor<fp32, dextents<3>, L, Kokkos::HostSpace>;

// Expected offsets, written out directly from the definition of each layout.
index_t right_offset(const std::array<index_t, 3>& e, index_t i, index_t j, index_t k) {
  return (i * e[1] + j) * e[2] + k;
}
index_t left_offset(const std::array<index_t, 3>& e, index_t i, index_t j, index_t k) {
  return i + e[0] * (j + e[1] * k);
}

template <class L>
void fill_by_offset(const cube<L>& t,
                    index_t (*offset)(const std::array<index_t, 3>&, index_t, index_t, index_t)) {
  const auto e = t.extents().to_array();
  for (index_t i = 0; i < e[0]; ++i)
    for (index_t j = 0; j < e[1]; ++j)
      for (index_t k = 0; k < e[2]; ++k) t.data()[offset(e, i, j, k)] = tag(i, j, k);
}

} // namespace

TEST_CASE("extents: rank, static and dynamic sizes", "[tensor][extents]") {
  using e = extents<dyn, 3, 28, dyn>;
  static_assert(e::rank == 4 && e::rank_dynamic == 2 && !e::all_static);
  static_assert(e::static_extent(0) == dyn && e::static_extent(1) == 3 &&
                e::static_extent(2) == 28 && e::static_extent(3) == dyn);
  static_assert(extents<2, 3, 4>::all_static && extents<2, 3, 4>::static_size() == 24);
  static_assert(extents<>::rank == 0 && extents<>::static_size() == 1);
  static_assert(std::is_same_v<dextents<3>, extents<dyn, dyn, dyn>>);
  static_assert(std::is_same_v<dextents<0>, extents<>>);
  static_assert(is_extents<e>::value && !is_extents<int>::value);

  const e x(64, 5);
  CHECK(x.extent(0) == 64);
  CHECK(x.extent(1) == 3);
  CHECK(x.extent(2) == 28);
  CHECK(x.extent(3) == 5);
  CHECK(x.size() == 64 * 3 * 28 * 5);
  CHECK(x.to_array() == std::array<index_t, 4>{64, 3, 28, 5});
  CHECK(shape_string(x) == "(64, 3, 28, 5)");
  CHECK(shape_string(extents<>{}) == "()");

  // Default construction: static extents as given, dynamic ones 0 (like std::extents).
  const e z;
  CHECK(z.to_array() == std::array<index_t, 4>{0, 3, 28, 0});
  CHECK(z.size() == 0);

  CHECK(e::from_all({64, 3, 28, 5}) == x);
  CHECK_FALSE(e::from_all({64, 3, 28, 6}) == x);
  CHECK(extents<>{}.size() == 1); // a scalar has one element
}

TEST_CASE("extents: invalid sizes throw shape_error naming the dimension",
          "[tensor][extents][errors]") {
  using e = extents<dyn, 3>;
  CHECK_THROWS_WITH(e(-2), Catch::Contains("dimension 0") && Catch::Contains("-2"));
  CHECK_THROWS_WITH(e::from_all({4, 5}), Catch::Contains("dimension 1") &&
                                             Catch::Contains("static 3") && Catch::Contains("5"));
  CHECK_THROWS_AS(e::from_all({-1, 3}), shape_error);
  using t = Tensor<fp32, e, layout_right, Kokkos::HostSpace>;
  CHECK_THROWS_AS(t("t", -1), shape_error);
}

TEST_CASE("tensors are zero-filled, sized and labelled as declared", "[tensor]") {
  Tensor<bf16, extents<dyn, 3, 4>, layout_right, Kokkos::HostSpace> t("weights", 5); // (5, 3, 4)
  static_assert(decltype(t)::rank == 3);
  static_assert(std::is_same_v<decltype(t)::storage_type, bfloat16>);
  CHECK(t.label() == "weights");
  CHECK(t.size() == 60);
  CHECK(t.extents().to_array() == std::array<index_t, 3>{5, 3, 4});
  CHECK(t.kokkos_view().extent(0) == 60);
  CHECK(t.is_allocated());
  for (index_t i = 0; i < t.size(); ++i) CHECK(t.data()[i].bits == 0);

  Tensor<fp32, extents<2, 3>, layout_right, Kokkos::HostSpace> s("static"); // (2, 3)
  CHECK(s.size() == 6);

  Tensor<fp32, extents<>, layout_right, Kokkos::HostSpace> scalar("scalar"); // ()
  scalar() = 2.5f;
  CHECK(scalar.size() == 1);
  CHECK(scalar.data()[0] == 2.5f);

  // Copies are shallow: they share elements, like Kokkos::View.
  auto alias = t;
  alias(4, 2, 3) = bfloat16::from_float(1.f);
  CHECK(t.data()[59].to_float() == 1.f);

  // Adopting a Kokkos::View of the wrong length is a shape error naming both sizes.
  Kokkos::View<float*, Kokkos::HostSpace> raw("raw", 7);
  using t23 = Tensor<fp32, extents<2, 3>, layout_right, Kokkos::HostSpace>;
  CHECK_THROWS_WITH(t23(raw, extents<2, 3>{}),
                    Catch::Contains("7 elements") && Catch::Contains("(2, 3)"));
}

TEST_CASE("layout_right and layout_left strides and element addresses", "[tensor][layout]") {
  for (const auto& e : shapes3) {
    INFO("shape (" << e[0] << ", " << e[1] << ", " << e[2] << ")");
    const auto ext = dextents<3>::from_all(e);

    cube<layout_right> r("r", ext);
    const auto rv = r.view();
    CHECK(rv.stride(2) == 1);
    CHECK(rv.stride(1) == e[2]);
    CHECK(rv.stride(0) == e[1] * e[2]);
    CHECK(rv.is_contiguous());

    cube<layout_left> l("l", ext);
    const auto lv = l.view();
    CHECK(lv.stride(0) == 1);
    CHECK(lv.stride(1) == e[0]);
    CHECK(lv.stride(2) == e[0] * e[1]);

    // Writing through the raw offsets and reading through operator() agree element by element.
    fill_by_offset(r, right_offset);
    fill_by_offset(l, left_offset);
    for (index_t i = 0; i < e[0]; ++i)
      for (index_t j = 0; j < e[1]; ++j)
        for (index_t k = 0; k < e[2]; ++k) {
          REQUIRE(r(i, j, k) == tag(i, j, k));
          REQUIRE(rv(i, j, k) == tag(i, j, k));
          REQUIRE(l(i, j, k) == tag(i, j, k));
          REQUIRE(lv(i, j, k) == tag(i, j, k));
        }
  }
}

TEST_CASE("slices along the leading dimension share memory", "[tensor][view][slice]") {
  for (const auto& e : shapes3) {
    const auto ext = dextents<3>::from_all(e);
    cube<layout_right> r("r", ext);
    cube<layout_left> l("l", ext);
    fill_by_offset(r, right_offset);
    fill_by_offset(l, left_offset);
    // Every [begin, end) with 0 <= begin <= end <= e[0], the empty ones included.
    for (index_t b = 0; b <= e[0]; ++b)
      for (index_t en = b; en <= e[0]; ++en) {
        INFO("shape (" << e[0] << ", " << e[1] << ", " << e[2] << "), slice [" << b << ", " << en
                       << ")");
        const auto rs = r.slice(b, en);
        const auto ls = l.slice(b, en);
        static_assert(std::is_same_v<decltype(rs)::layout, layout_right>);
        static_assert(std::is_same_v<decltype(ls)::layout, layout_stride>);
        REQUIRE(rs.extents().to_array() == std::array<index_t, 3>{en - b, e[1], e[2]});
        REQUIRE(ls.extents().to_array() == std::array<index_t, 3>{en - b, e[1], e[2]});
        for (index_t i = 0; i < en - b; ++i)
          for (index_t j = 0; j < e[1]; ++j)
            for (index_t k = 0; k < e[2]; ++k) {
              REQUIRE(rs(i, j, k) == tag(b + i, j, k));
              REQUIRE(ls(i, j, k) == tag(b + i, j, k));
              REQUIRE(&rs(i, j, k) == &r(b + i, j, k));
              REQUIRE(&ls(i, j, k) == &l(b + i, j, k));
            }
      }
  }

  // The sliced dimension becomes dynamic; the others keep their static sizes.
  Tensor<fp32, extents<6, 3>, layout_right, Kokkos::HostSpace> t("t"); // (6, 3)
  auto s = t.slice(2, 5);
  static_assert(std::is_same_v<decltype(s)::extents_type, extents<dyn, 3>>);
  auto ss = s.slice(1, 2); // a slice of a slice is rows [3, 4) of t
  CHECK(ss.extent(0) == 1);
  CHECK(&ss(0, 0) == &t(3, 0));
}

TEST_CASE("out-of-range slices throw shape_error naming the range and the shape",
          "[tensor][slice][errors]") {
  Tensor<fp32, extents<dyn, 3, 4>, layout_right, Kokkos::HostSpace> t("t", 5); // (5, 3, 4)
  const auto v = t.view();
  CHECK_THROWS_WITH(v.slice(2, 6), Catch::Contains("tessera::slice") && Catch::Contains("[2, 6)") &&
                                       Catch::Contains("(5, 3, 4)"));
  CHECK_THROWS_AS(v.slice(-1, 2), shape_error);
  CHECK_THROWS_AS(v.slice(3, 2), shape_error);
  CHECK_NOTHROW(v.slice(5, 5));
}

TEST_CASE("transpose swaps extents and strides without copying", "[tensor][view][transpose]") {
  const std::vector<std::array<index_t, 2>> shapes = {{1, 1}, {1, 7}, {7, 1}, {3, 5}, {13, 4}};
  for (const auto& e : shapes) {
    INFO("shape (" << e[0] << ", " << e[1] << ")");
    Tensor<fp32, dextents<2>, layout_right, Kokkos::HostSpace> a("a", e[0], e[1]); // (M, K)
    for (index_t i = 0; i < e[0]; ++i)
      for (index_t j = 0; j < e[1]; ++j) a(i, j) = tag(i, j, 0);
    const auto at = transpose(a.view()); // (K, M)
    static_assert(std::is_same_v<decltype(at)::layout, layout_stride>);
    CHECK(at.extent(0) == e[1]);
    CHECK(at.extent(1) == e[0]);
    CHECK(at.stride(0) == 1);
    CHECK(at.stride(1) == e[1]);
    for (index_t i = 0; i < e[0]; ++i)
      for (index_t j = 0; j < e[1]; ++j) REQUIRE(&at(j, i) == &a(i, j));
    const auto att = transpose(at);
    for (index_t i = 0; i < e[0]; ++i)
      for (index_t j = 0; j < e[1]; ++j) REQUIRE(&att(i, j) == &a(i, j));
    // A transposed matrix with both extents > 1 is not dense in row-major order.
    CHECK(at.is_contiguous() == (e[0] == 1 || e[1] == 1));
  }
  // Static extents swap with the dimensions.
  Tensor<fp32, extents<dyn, 4>, layout_right, Kokkos::HostSpace> b("b", 3);
  static_assert(std::is_same_v<decltype(transpose(b.view()))::extents_type, extents<4, dyn>>);

  // A transposed slice of a column-major matrix.
  Tensor<fp32, dextents<2>, layout_left, Kokkos::HostSpace> c("c", 6, 4); // (6, 4) col-major
  const auto cts = transpose(c.slice(1, 4));                              // (4, 3)
  CHECK(cts.extent(0) == 4);
  CHECK(cts.extent(1) == 3);
  for (index_t i = 0; i < 3; ++i)
    for (index_t j = 0; j < 4; ++j) REQUIRE(&cts(j, i) == &c(1 + i, j));
}

TEST_CASE("strided views: explicit strides, as_strided and packed-stride checks",
          "[tensor][view]") {
  std::vector<float> buf(64);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  // A (3, 4) matrix with leading dimension 10 inside a larger buffer.
  TensorView<fp32, dextents<2>, layout_stride, Kokkos::HostSpace> m(buf.data(), dextents<2>(3, 4),
                                                                    {10, 1});
  CHECK(m(2, 3) == 23.f);
  CHECK_FALSE(m.is_contiguous());
  // Strides that are not packed are refused for a contiguous layout.
  using rv = TensorView<fp32, dextents<2>, layout_right, Kokkos::HostSpace>;
  CHECK_THROWS_AS(rv(buf.data(), dextents<2>(3, 4), {10, 1}), shape_error);
  CHECK_NOTHROW(rv(buf.data(), dextents<2>(3, 4), {4, 1}));
  // as_strided forgets the layout but keeps the strides.
  const rv packed(buf.data(), dextents<2>(3, 4));
  const auto s = packed.as_strided();
  static_assert(std::is_same_v<decltype(s)::layout, layout_stride>);
  CHECK(s.strides() == std::array<index_t, 2>{4, 1});
  CHECK(s.is_contiguous());
  CHECK(s(1, 2) == 6.f);
}

TEST_CASE("reshape keeps the elements in order and shares memory", "[tensor][reshape]") {
  Tensor<fp32, extents<dyn, 3, 4>, layout_right, Kokkos::HostSpace> t("x", 5); // (5, 3, 4)
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(i);

  auto flat = reshape<extents<dyn, 12>>(t, 5); // (5, 12)
  static_assert(std::is_same_v<decltype(flat)::extents_type, extents<dyn, 12>>);
  CHECK(flat.data() == t.data());
  for (index_t i = 0; i < 5; ++i)
    for (index_t j = 0; j < 12; ++j) REQUIRE(flat(i, j) == static_cast<float>(12 * i + j));

  auto fixed = reshape<extents<60>>(t); // (60): all static, size checked at run time
  CHECK(fixed.data() == t.data());
  auto back = reshape<extents<dyn, 3, 4>>(fixed, 5);
  CHECK(back(4, 2, 3) == 59.f);
  Tensor<fp32, extents<1>, layout_right, Kokkos::HostSpace> one("one"); // (1)
  one(0) = 7.f;
  auto scalar = reshape<extents<>>(one); // ()
  CHECK(scalar() == 7.f);
}

TEST_CASE("reshape to a different number of elements throws shape_error naming both shapes",
          "[tensor][reshape][errors]") {
  Tensor<fp32, extents<dyn, 3, 4>, layout_right, Kokkos::HostSpace> t("x", 5); // (5, 3, 4)
  CHECK_THROWS_WITH((reshape<extents<dyn, 12>>(t, 7)),
                    Catch::Contains("tessera::reshape") && Catch::Contains("'x'") &&
                        Catch::Contains("(5, 3, 4)") && Catch::Contains("60 elements") &&
                        Catch::Contains("(7, 12)") && Catch::Contains("84"));
  CHECK_THROWS_AS((reshape<extents<59>>(t)), shape_error);
  CHECK_THROWS_AS((reshape<extents<dyn, 12>>(t, -5)), shape_error);
}

TEST_CASE("shape errors are std::invalid_argument and name the operation and shapes",
          "[tensor][errors]") {
  static_assert(std::is_base_of_v<error, shape_error>);
  static_assert(std::is_base_of_v<std::invalid_argument, shape_error>);
  static_assert(std::is_base_of_v<std::invalid_argument, value_error>);

  using m = Tensor<fp32, dextents<2>, layout_right, Kokkos::HostSpace>;
  m a("a", 2, 3), b("b", 3, 2);
  fill(a, 1.f);
  fill(b, 2.f);
  CHECK_THROWS_AS(deep_copy(a, b), std::invalid_argument);
  CHECK_THROWS_WITH(deep_copy(a, b), Catch::Contains("tessera::deep_copy") &&
                                         Catch::Contains("(2, 3)") && Catch::Contains("(3, 2)"));
  // The destination is untouched by the failed call.
  for (index_t i = 0; i < a.size(); ++i) REQUIRE(a.data()[i] == 1.f);

  Tensor<bf16, dextents<2>, layout_right, Kokkos::HostSpace> c("c", 3, 3);
  CHECK_THROWS_WITH(convert_into(Kokkos::DefaultHostExecutionSpace{}, c, a),
                    Catch::Contains("tessera::convert_into") && Catch::Contains("(3, 3)") &&
                        Catch::Contains("(2, 3)"));
  for (index_t i = 0; i < c.size(); ++i) REQUIRE(c.data()[i].bits == 0);
}
