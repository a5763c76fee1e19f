// deep_copy, fill, cast and amax, each run on every enabled execution space (the host spaces; the
// device space in a device build) in its own memory, for every precision, checked through host
// copies against scalar computations on the host.
#include "tensor_testing.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

namespace {

template <class P, class Exec>
using vec = Tensor<P, dextents<1>, layout_right, typename Exec::memory_space>;
template <class P>
using host_vec = Tensor<P, dextents<1>, layout_right, Kokkos::HostSpace>;

// Sizes around convert_into's host chunk of 16384 elements (0, 1, odd, one chunk, one chunk and
// one element, several chunks and a prime tail).
const std::vector<index_t> sizes = {0, 1, 2, 17, 16384, 16385, 3 * 16384 + 7, 100003};

// Storage values covering every class: random bit patterns (normals, subnormals, zeros, infinities,
// NaNs) of the source format. Generated with a local SplitMix64 so the test does not depend on
// tessera's own generator.
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <class P>
storage_t<P> random_storage(std::uint64_t& state) {
  const auto r = splitmix64(state);
  if constexpr (std::is_same_v<P, fp32>) {
    // Half of the inputs are random bit patterns; half are moderate values with random sign and
    // exponents around the low-precision ranges, where rounding and saturation decide.
    if (r & 1) return detail::bit_cast<float>(static_cast<std::uint32_t>(r >> 32));
    const int e = static_cast<int>((r >> 8) % 48) - 24;
    const float m = 1.f + static_cast<float>((r >> 32) & 0xffffffu) * 0x1.0p-24f;
    return ((r >> 2) & 1 ? -1.f : 1.f) * std::ldexp(m, e);
  } else {
    using u = decltype(storage_t<P>{}.bits);
    return storage_t<P>::from_bits(static_cast<u>(r >> 17));
  }
}

template <class P>
host_vec<P> random_host_vec(index_t n, std::uint64_t seed) {
  host_vec<P> h("h", n);
  for (index_t i = 0; i < n; ++i) h.data()[i] = random_storage<P>(seed);
  return h;
}

template <class P, class Exec>
vec<P, Exec> on_space(const host_vec<P>& h) {
  vec<P, Exec> d("d", h.extent(0));
  deep_copy(d, h);
  return d;
}

// max |x| over float values by a sequential scan, NaN if any element is NaN.
template <class P>
float host_amax(const host_vec<P>& h) {
  float m = 0.f;
  for (index_t i = 0; i < h.size(); ++i) {
    const float a = std::fabs(to_float(h.data()[i]));
    if (std::isnan(a)) return a;
    if (a > m) m = a;
  }
  return m;
}

} // namespace

TEMPLATE_LIST_TEST_CASE("deep_copy round-trips between the host and the execution space",
                        "[tensor][deep_copy]", enabled_exec_spaces) {
  using exec = TestType;
  INFO("execution space " << exec::name());
  for_each_type(all_precisions, [&]<class P>() {
    INFO(precision_traits<P>::name);
    for (const index_t n : {index_t{0}, index_t{1}, index_t{1000}}) {
      const auto h = random_host_vec<P>(n, 7);
      auto d = on_space<P, exec>(h); // host -> space
      host_vec<P> back("back", n);
      deep_copy(back, d); // space -> host
      REQUIRE(first_bitwise_difference(back, h) == -1);
      const auto again = to_host(d);
      REQUIRE(first_bitwise_difference(again, h) == -1);
    }
    // Static and dynamic extents of the same shape are interchangeable.
    Tensor<P, extents<2, 3>, layout_right, typename exec::memory_space> s("s");
    Tensor<P, extents<dyn, 3>, layout_right, Kokkos::HostSpace> hd("hd", 2);
    fill(hd, 3.f);
    deep_copy(s, hd);
    REQUIRE(first_bitwise_difference(to_host(s), hd) == -1);
  });
}

TEMPLATE_LIST_TEST_CASE("fill sets every element to the value rounded to the precision",
                        "[tensor][fill]", enabled_exec_spaces) {
  using exec = TestType;
  INFO("execution space " << exec::name());
  const std::vector<float> values = {0.f,
                                     -0.f,
                                     1.f / 3.f,
                                     -2.75f,
                                     1e-9f,
                                     300.f,
                                     1e6f,
                                     -1e30f,
                                     5e-40f,
                                     std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::quiet_NaN()};
  for_each_type(all_precisions, [&]<class P>() {
    INFO(precision_traits<P>::name);
    vec<P, exec> t("t", 1001);
    for (const float v : values) {
      INFO("value " << v);
      fill(exec{}, t, v);
      const auto h = to_host(t);
      const auto want = bits_of(from_float<P>(v));
      for (index_t i = 0; i < h.size(); ++i) REQUIRE(bits_of(h.data()[i]) == want);
    }
  });
}

TEMPLATE_LIST_TEST_CASE("cast equals the scalar conversion element by element", "[tensor][cast]",
                        enabled_exec_spaces) {
  using exec = TestType;
  INFO("execution space " << exec::name());
  for_each_type(all_precisions, [&]<class From>() {
    for_each_type(all_precisions, [&]<class To>() {
      INFO(precision_traits<From>::name << " -> " << precision_traits<To>::name);
      for (const index_t n : sizes) {
        INFO("n = " << n);
        const auto h = random_host_vec<From>(n, 1000 + static_cast<std::uint64_t>(n));
        const auto src = on_space<From, exec>(h);

        const auto d = to_host(cast<To>(exec{}, src)); // default policy
        const auto s = to_host(cast<To, saturate>(exec{}, src));
        const auto o = to_host(cast<To, overflow_to_inf_nan>(exec{}, src));
        for (index_t i = 0; i < n; ++i) {
          const auto x = h.data()[i];
          REQUIRE(bits_of(d.data()[i]) == bits_of(convert<To>(x)));
          REQUIRE(bits_of(s.data()[i]) == bits_of(convert<To, saturate>(x)));
          REQUIRE(bits_of(o.data()[i]) == bits_of(convert<To, overflow_to_inf_nan>(x)));
        }
      }
    });
  });
}

TEMPLATE_LIST_TEST_CASE("convert_into writes into an existing tensor (default policy)",
                        "[tensor][cast]", enabled_exec_spaces) {
  using exec = TestType;
  INFO("execution space " << exec::name());
  const auto h = random_host_vec<fp32>(20000, 3);
  const auto src = on_space<fp32, exec>(h);
  vec<fp8_e4m3, exec> dst("dst", 20000);
  convert_into(exec{}, dst, src);
  const auto r = to_host(dst);
  for (index_t i = 0; i < r.size(); ++i)
    REQUIRE(bits_of(r.data()[i]) == bits_of(from_float<fp8_e4m3, saturate>(h.data()[i])));
}

TEMPLATE_LIST_TEST_CASE("amax is max |x|, widened to float, and propagates NaN", "[tensor][amax]",
                        enabled_exec_spaces) {
  using exec = TestType;
  INFO("execution space " << exec::name());
  for_each_type(all_precisions, [&]<class P>() {
    INFO(precision_traits<P>::name);
    // Finite data of both signs and many magnitudes.
    for (const index_t n : {index_t{1}, index_t{2}, index_t{17}, index_t{4099}, index_t{65537}}) {
      INFO("n = " << n);
      host_vec<P> h("h", n);
      std::uint64_t state = 99 + static_cast<std::uint64_t>(n);
      for (index_t i = 0; i < n; ++i) {
        const auto r = splitmix64(state);
        const float x = ((r & 1) ? -1.f : 1.f) * static_cast<float>((r >> 8) % 1000) *
                        std::ldexp(1.f, static_cast<int>((r >> 40) % 8) - 6);
        h.data()[i] = from_float<P>(x);
      }
      const auto d = on_space<P, exec>(h);
      REQUIRE(bits_of(amax(exec{}, d)) == bits_of(host_amax(h)));

      // The largest magnitude negative, at the first, a middle and the last position.
      for (const index_t at : {index_t{0}, n / 2, n - 1}) {
        host_vec<P> hm("hm", n);
        deep_copy(hm, h);
        hm.data()[at] = from_float<P>(-precision_traits<P>::max_finite);
        REQUIRE(amax(exec{}, on_space<P, exec>(hm)) == precision_traits<P>::max_finite);

        // NaN anywhere wins, even next to an infinity (where the format has one).
        hm.data()[at] = from_float<P, overflow_to_inf_nan>(std::numeric_limits<float>::quiet_NaN());
        if (n > 1 && precision_traits<P>::has_inf)
          hm.data()[(at + 1) % n] =
              from_float<P, overflow_to_inf_nan>(-std::numeric_limits<float>::infinity());
        REQUIRE(std::isnan(amax(exec{}, on_space<P, exec>(hm))));
      }
    }
    // -0 has magnitude 0; an empty tensor has amax 0.
    host_vec<P> z("z", 3);
    z.data()[1] = from_float<P>(-0.f);
    REQUIRE(bits_of(amax(exec{}, on_space<P, exec>(z))) == 0u);
    REQUIRE(amax(exec{}, vec<P, exec>("empty", 0)) == 0.f);
    if constexpr (precision_traits<P>::has_inf) {
      z.data()[2] = from_float<P, overflow_to_inf_nan>(-std::numeric_limits<float>::infinity());
      REQUIRE(amax(exec{}, on_space<P, exec>(z)) == std::numeric_limits<float>::infinity());
    }
  });
}
