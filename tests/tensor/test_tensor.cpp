#include <tessera/tensor.hpp>

#include <catch2/catch.hpp>

using namespace tessera; // NOLINT: test file, not a header

TEST_CASE("tensor shapes, views and slices", "[tensor]") {
  Tensor<fp32, extents<dyn, 3, 4>> t("t", 5);
  CHECK(t.size() == 60);
  CHECK(t.extent(0) == 5);
  auto v = t.view();
  for (index_t i = 0; i < 5; ++i)
    for (index_t j = 0; j < 3; ++j)
      for (index_t k = 0; k < 4; ++k) v(i, j, k) = static_cast<float>(100 * i + 10 * j + k);
  auto s = v.slice(1, 3);
  CHECK(s.extent(0) == 2);
  CHECK(s(1, 2, 3) == 323.f);
  CHECK_THROWS_AS(v.slice(2, 6), shape_error);
}
