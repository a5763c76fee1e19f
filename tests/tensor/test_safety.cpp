// "Nothing silently wrong" in tensor/: the exact overlap predicate (tensor/overlap.hpp) against
// a brute-force set of element bytes; element counts and strided spans that overflow 64 bits
// (config/checked.hpp, extents, Tensor, TensorView, reshape); outputs overlapping inputs in
// deep_copy / convert_into / quantize_with_scale; invalid fp8 scales in quantize_with_scale and
// dequantize. Every refused call must throw a tessera exception naming the operation and leave
// the tensors bit-identical.
#include "support/messages.hpp"
#include "tensor_testing.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace tessera;
using namespace tessera::testing;
using Catch::Matchers::Contains;

namespace {

// Host memory by design: the overlap and overflow checks are argument checks on addresses and
// extents (before any kernel), tested on buffers whose bytes the test reads in place.
using host = Kokkos::HostSpace;

/// Every byte address of every element of r: the brute-force reference.
std::set<std::int64_t> bytes_of(const detail::mem_region& r) {
  std::set<std::int64_t> out;
  std::int64_t n = 1;
  for (std::size_t k = 0; k < r.rank; ++k) n *= r.ext[k];
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t rem = flat, off = 0;
    for (std::size_t k = r.rank; k-- > 0;) {
      off += (rem % r.ext[k]) * r.stride[k];
      rem /= r.ext[k];
    }
    const auto b = static_cast<std::int64_t>(r.base) + off * r.elem;
    for (std::int64_t e = 0; e < r.elem; ++e) out.insert(b + e);
  }
  return out;
}

bool brute_overlap(const detail::mem_region& a, const detail::mem_region& b) {
  const auto sa = bytes_of(a), sb = bytes_of(b);
  for (const auto x : sa)
    if (sb.count(x)) return true;
  return false;
}

/// Two elements share a byte (brute force).
bool brute_distinct(const detail::mem_region& r) {
  std::int64_t n = 1;
  for (std::size_t k = 0; k < r.rank; ++k) n *= r.ext[k];
  return static_cast<std::int64_t>(bytes_of(r).size()) == n * r.elem;
}

/// A random region of rank 1..4 in a small address window: extents 1..5 (sometimes 0), strides
/// -12..12 (nested or not), element size 1, 2 or 4, base 0..63 bytes.
detail::mem_region random_region(std::mt19937_64& g, bool nested_only) {
  std::uniform_int_distribution<int> rank_d(1, 4), ext_d(1, 5), stride_d(-12, 12), base_d(0, 63),
      elem_d(0, 2), zero_d(0, 40);
  detail::mem_region r;
  r.rank = static_cast<std::size_t>(rank_d(g));
  r.elem = std::int64_t{1} << elem_d(g);
  r.base = 1024 + static_cast<std::uintptr_t>(base_d(g));
  if (nested_only) {
    // a packed or padded row-major layout, optionally with the dimensions permuted
    std::int64_t s = 1 + (g() % 2);
    for (std::size_t k = r.rank; k-- > 0;) {
      r.ext[k] = ext_d(g);
      r.stride[k] = s;
      s = s * r.ext[k] + static_cast<std::int64_t>(g() % 3);
    }
    if (r.rank >= 2 && g() % 2) {
      std::swap(r.ext[0], r.ext[r.rank - 1]);
      std::swap(r.stride[0], r.stride[r.rank - 1]);
    }
  } else {
    for (std::size_t k = 0; k < r.rank; ++k) {
      r.ext[k] = ext_d(g);
      r.stride[k] = stride_d(g);
    }
  }
  if (zero_d(g) == 0) r.ext[0] = 0;
  return r;
}

} // namespace

TEST_CASE("regions_overlap agrees with a brute-force byte set on random strided regions",
          "[tensor][overlap]") {
  std::mt19937_64 g(0x0e71a9);
  int disagreements = 0, overlapping = 0, conservative = 0, cases = 0;
  for (int t = 0; t < 20000; ++t) {
    const auto a = random_region(g, t % 2 == 0);
    const auto b = random_region(g, t % 3 == 0);
    const bool exact = brute_overlap(a, b);
    const bool got = detail::regions_overlap(a, b);
    ++cases;
    overlapping += exact;
    if (got != exact) {
      // The only allowed difference: a conservative "true" when neither region is nested.
      if (got && !exact) {
        ++conservative;
      } else {
        ++disagreements;
        FAIL_CHECK("a missed overlap: case " << t);
      }
    }
    CHECK(detail::regions_overlap(b, a) == got); // symmetric
  }
  CHECK(disagreements == 0);
  CHECK(overlapping > cases / 10); // the generator produces both outcomes
  CHECK(overlapping < cases * 9 / 10);
  INFO("conservative answers: " << conservative << " of " << cases);
  CHECK(conservative < cases / 5);
}

TEST_CASE("regions_overlap is exact whenever one region is nested", "[tensor][overlap]") {
  std::mt19937_64 g(0xbeef);
  for (int t = 0; t < 20000; ++t) {
    const auto a = random_region(g, true);
    const auto b = random_region(g, t % 2 == 0);
    INFO("case " << t);
    REQUIRE(detail::regions_overlap(a, b) == brute_overlap(a, b));
  }
}

TEST_CASE("distinct_elements agrees with brute force on nested regions and never accepts a "
          "self-overlapping one",
          "[tensor][overlap]") {
  std::mt19937_64 g(0x5e1f);
  for (int t = 0; t < 20000; ++t) {
    const auto r = random_region(g, t % 2 == 0);
    const bool exact = brute_distinct(r);
    const bool got = detail::distinct_elements(r);
    INFO("case " << t);
    if (got) REQUIRE(exact); // never a false "distinct"
    if (t % 2 == 0) REQUIRE(got == exact);
  }
}

TEST_CASE("regions_overlap: column halves of one matrix, interleaved columns, large shapes",
          "[tensor][overlap]") {
  // X (4096, 8192) fp32: A = X[:, :4096], C = X[:, 4096:] share no element.
  const auto base = std::uintptr_t{1} << 20;
  const auto left = detail::region_of(reinterpret_cast<void*>(base), 4, {4096, 4096}, {8192, 1});
  const auto right =
      detail::region_of(reinterpret_cast<void*>(base + 4096 * 4), 4, {4096, 4096}, {8192, 1});
  CHECK_FALSE(detail::regions_overlap(left, right));
  // Shifted by one element: they share the columns 4095 / 4096 of a row... no: X[:, 4095:8191]
  const auto shifted =
      detail::region_of(reinterpret_cast<void*>(base + 4095 * 4), 4, {4096, 4096}, {8192, 1});
  CHECK(detail::regions_overlap(left, shifted));
  // Even and odd columns (stride 2) of the same rows: disjoint; the even ones and a bf16 view of
  // the same bytes: overlapping (element sizes differ).
  const auto even = detail::region_of(reinterpret_cast<void*>(base), 4, {512, 512}, {1024, 2});
  const auto odd = detail::region_of(reinterpret_cast<void*>(base + 4), 4, {512, 512}, {1024, 2});
  CHECK_FALSE(detail::regions_overlap(even, odd));
  const auto odd_half =
      detail::region_of(reinterpret_cast<void*>(base + 6), 2, {512, 512}, {2048, 4});
  CHECK(detail::regions_overlap(odd, odd_half));
  CHECK_FALSE(detail::regions_overlap(even, odd_half));
  // The transpose of a square matrix and the matrix itself: the same bytes.
  const auto m = detail::region_of(reinterpret_cast<void*>(base), 4, {64, 64}, {64, 1});
  const auto mt = detail::region_of(reinterpret_cast<void*>(base), 4, {64, 64}, {1, 64});
  CHECK(detail::regions_overlap(m, mt));
  // An empty region overlaps nothing.
  const auto empty = detail::region_of(reinterpret_cast<void*>(base), 4, {0, 64}, {64, 1});
  CHECK_FALSE(detail::regions_overlap(m, empty));
  // A budget too small to decide gives the conservative answer.
  CHECK(detail::regions_overlap(left, right, 10));
}

TEST_CASE("overflowing element counts are refused before allocating", "[tensor][overflow]") {
  using t2 = Tensor<fp32, dextents<2>, layout_right, host>;
  const index_t two32 = index_t{1} << 32, two62 = index_t{1} << 62, two61 = index_t{1} << 61;
  CHECK_THAT(message_of<shape_error>([&] { t2("x", two32, two32); }),
             Contains("(4294967296, 4294967296)") && Contains("overflow"));
  CHECK_THAT(message_of<shape_error>([&] { t2("x", 3, two62); }),
             Contains("(3, 4611686018427387904)"));
  CHECK_THAT(message_of<shape_error>([&] { (void)dextents<3>(0, two32, two32); }),
             Contains("(0, 4294967296, 4294967296)"));
  CHECK_THAT(message_of<shape_error>([&] {
               (void)dextents<2>::from_all({two32, two32});
             }),
             Contains("(4294967296, 4294967296)"));
  // The count fits in int64 but its bytes do not: Tensor refuses, naming the tensor.
  CHECK_THAT(message_of<shape_error>([&] { t2("big", two61, 2); }),
             Contains("tessera::Tensor") && Contains("'big'") && Contains("bytes"));
  CHECK_THAT(
      message_of<shape_error>([&] { (void)t2::uninitialized("big", dextents<2>(two61, 2)); }),
      Contains("tessera::Tensor") && Contains("bytes"));
  // Static extents with a dynamic one.
  using t3 = Tensor<bf16, extents<dyn, 1024, 1024>, layout_right, host>;
  CHECK_THAT(message_of<shape_error>([&] { t3("y", two62); }), Contains("overflow"));
  // The largest legal shapes of the same kind still construct as extents (no allocation).
  CHECK(dextents<2>(two32, two32 / 2 - 1).size() == two32 * (two32 / 2 - 1));
}

TEST_CASE("reshape to an overflowing shape is refused", "[tensor][overflow]") {
  using t2 = Tensor<fp32, dextents<2>, layout_right, host>;
  const t2 x("x", 4, 4);
  const index_t big = (index_t{1} << 60) + 1;
  CHECK_THAT(message_of<shape_error>([&] { (void)reshape<dextents<2>>(x, big, 16); }),
             Contains("(1152921504606846977, 16)") && Contains("overflow"));
  CHECK_THAT(message_of<shape_error>([&] { (void)reshape<extents<dyn, 16>>(x, big); }),
             Contains("overflow"));
  // A legal reshape still works.
  CHECK(reshape<dextents<1>>(x, 16).extent(0) == 16);
}

TEST_CASE("strided views whose span overflows are refused", "[tensor][overflow]") {
  using sv = TensorView<fp32, dextents<2>, layout_stride, host>;
  std::vector<float> mem(16);
  const index_t two40 = index_t{1} << 40;
  CHECK_THAT(message_of<shape_error>([&] {
               sv(mem.data(), dextents<2>(two40, 2), {two40, 1});
             }),
             Contains("tessera::TensorView") && Contains("strides (1099511627776, 1)"));
  CHECK_THAT(message_of<shape_error>([&] {
               sv(mem.data(), dextents<2>(2, 2), {std::numeric_limits<index_t>::min(), 1});
             }),
             Contains("tessera::TensorView"));
  // the bytes of the span (elements * 4) must fit too
  CHECK_THAT(message_of<shape_error>([&] {
               sv(mem.data(), dextents<2>(3, 2), {index_t{1} << 61, 1});
             }),
             Contains("tessera::TensorView"));
  CHECK_NOTHROW(sv(mem.data(), dextents<2>(4, 2), {4, 2}));
}

TEMPLATE_LIST_TEST_CASE("tensor ops refuse an output overlapping their input, and accept "
                        "disjoint views of one allocation",
                        "[tensor][overlap]", host_exec_spaces) {
  using exec = TestType;
  using f1 = Tensor<fp32, dextents<1>, layout_right, host>;
  using b1 = Tensor<bf16, dextents<1>, layout_right, host>;
  using e1 = Tensor<fp8_e4m3, dextents<1>, layout_right, host>;
  // One fp32 allocation of 64 elements; views adopt sub-ranges of its Kokkos view.
  f1 buf("buf", 64);
  fill_uniform(buf, 7, -2.f, 2.f);
  const auto sub = [&](index_t b, index_t e) {
    return f1(Kokkos::subview(buf.kokkos_view(), Kokkos::make_pair(b, e)), dextents<1>(e - b));
  };
  const std::vector<float> before(buf.data(), buf.data() + 64);
  const auto same = [&] { return std::memcmp(before.data(), buf.data(), 64 * 4) == 0; };

  // deep_copy: partial overlap refused; a tensor onto itself allowed (no change).
  CHECK_THAT(message_of<shape_error>([&] { deep_copy(sub(0, 32), sub(16, 48)); }),
             Contains("tessera::deep_copy") && Contains("dst (32)") && Contains("src (32)") &&
                 Contains("overlaps"));
  CHECK(same());
  CHECK_NOTHROW(deep_copy(sub(0, 32), sub(0, 32)));
  CHECK(same());
  deep_copy(sub(32, 64), sub(0, 32)); // adjacent halves: fine
  CHECK(std::memcmp(buf.data() + 32, before.data(), 32 * 4) == 0);
  std::memcpy(buf.data(), before.data(), 64 * 4);

  // convert_into: a bf16 dst over the bytes of the fp32 src.
  b1 alias(Kokkos::View<bfloat16*, host>(reinterpret_cast<bfloat16*>(buf.data()), 64),
           dextents<1>(64));
  const auto src = sub(0, 64);
  CHECK_THAT(message_of<shape_error>([&] { convert_into(exec{}, alias, src); }),
             Contains("tessera::convert_into") && Contains("dst (64)") && Contains("src (64)"));
  CHECK(same());
  // A bf16 tensor converted to an fp32 dst that is its own memory's second half: refused too.
  b1 lo(Kokkos::View<bfloat16*, host>(reinterpret_cast<bfloat16*>(buf.data()) + 64, 32),
        dextents<1>(32));
  CHECK_THROWS_AS(convert_into(exec{}, sub(32, 64), lo), shape_error);
  CHECK(same());
  // Disjoint halves: converts, and the result is right.
  f1 half_dst = sub(32, 64);
  b1 bsrc("bsrc", 32);
  fill_uniform(bsrc, 9, -1.f, 1.f);
  convert_into(exec{}, half_dst, bsrc);
  for (index_t i = 0; i < 32; ++i) CHECK(half_dst(i) == to_float(bsrc(i)));
  std::memcpy(buf.data(), before.data(), 64 * 4);

  // quantize_with_scale: the fp8 payload over x's bytes.
  e1 payload(Kokkos::View<float8_e4m3*, host>(reinterpret_cast<float8_e4m3*>(buf.data()) + 8, 32),
             dextents<1>(32));
  CHECK_THAT(
      message_of<shape_error>([&] { quantize_with_scale(exec{}, sub(0, 32), payload, 2.f); }),
      Contains("tessera::quantize_with_scale") && Contains("payload (32)") && Contains("x (32)"));
  CHECK(same());
  // ...but after x's end it is fine.
  e1 payload_after(
      Kokkos::View<float8_e4m3*, host>(reinterpret_cast<float8_e4m3*>(buf.data() + 32), 32),
      dextents<1>(32));
  const float seen = quantize_with_scale(exec{}, sub(0, 32), payload_after, 2.f);
  CHECK(seen == amax(sub(0, 32)));
  CHECK(to_float(payload_after(3)) == to_float(from_float<fp8_e4m3, saturate>(before[3] * 2.f)));
}

// Host memory by design: the refusals come before any kernel runs, and the test compares the
// untouched bytes in place.
TEMPLATE_LIST_TEST_CASE("quantize_with_scale and dequantize refuse scales that are not "
                        "positive, finite and normal",
                        "[tensor][scale]", host_exec_spaces) {
  using exec = TestType;
  using f1 = Tensor<fp32, dextents<1>, layout_right, host>;
  using e1 = Tensor<fp8_e5m2, dextents<1>, layout_right, host>;
  f1 x("x", 16);
  fill_uniform(x, 3, -4.f, 4.f);
  e1 payload("p", 16);
  fill(payload, 1.5f);
  const std::vector<float> x0(x.data(), x.data() + 16);
  const std::vector<float8_e5m2> p0(payload.data(), payload.data() + 16);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float denorm = std::numeric_limits<float>::denorm_min() * 8;
  for (const float s : {0.f, -0.f, -1.f, nan, inf, -inf, denorm}) {
    INFO("scale " << s);
    CHECK_THAT(message_of<value_error>([&] { quantize_with_scale(exec{}, x, payload, s); }),
               Contains("tessera::quantize_with_scale") && Contains("scale"));
    const scaled_tensor<fp8_e5m2, dextents<1>, layout_right, host> q{payload, s};
    CHECK_THAT(message_of<value_error>([&] { (void)dequantize(exec{}, q); }),
               Contains("tessera::dequantize") && Contains("scale"));
    CHECK(std::memcmp(x.data(), x0.data(), 16 * 4) == 0);
    CHECK(std::memcmp(payload.data(), p0.data(), 16) == 0);
  }
  // The smallest normal scale and the largest finite one are accepted.
  CHECK_NOTHROW(quantize_with_scale(exec{}, x, payload, std::numeric_limits<float>::min()));
  CHECK_NOTHROW(quantize_with_scale(exec{}, x, payload, std::numeric_limits<float>::max()));
  // scale_for_amax never produces an invalid scale: a huge margin keeps the previous one.
  CHECK(scale_for_amax<fp8_e4m3>(3e38f, 64, 0.25f) == 0.25f);
}
