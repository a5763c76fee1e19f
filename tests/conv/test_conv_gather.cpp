// The implicit convolution's backward-weight gather (conv/detail/implicit.hpp, gather_tap),
// checked alone: for every tap of random geometries (odd and prime sizes, strides, dilation,
// padding larger than the kernel's reach, negative padding that crops) and for runs of pixels
// that start and end mid-row, span several rows or lie wholly in padding rows, the gathered
// floats must equal the input read by its own index arithmetic, and nothing outside the
// destination may be written. A write outside d lands in the same scratch block in the library
// (the next tap's row or the B panel), where neither the results nor AddressSanitizer see it:
// hence canaries around d. Also band_prefetch, the prefetch of the next unit's rows, and
// fill_band_pairs, the band of bf16 channel pairs from bf16 and fp8 rows (below).
#include <tessera/conv/detail/implicit.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using tessera::index_t;
namespace ic = tessera::detail::implicit_conv;

// A float no gather produces (the input holds its own 1-based index, or 0): a quiet NaN's bits.
float canary() {
  const std::uint32_t bits = 0x7fc0beefu;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
bool is_canary(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof f);
  return bits == 0x7fc0beefu;
}

std::string describe(const ic::geometry& g) {
  return "cin " + std::to_string(g.cin) + " " + std::to_string(g.Hin) + "x" +
         std::to_string(g.Win) + " -> " + std::to_string(g.Hout) + "x" + std::to_string(g.Wout) +
         " R " + std::to_string(g.R) + " S " + std::to_string(g.S) + " stride " +
         std::to_string(g.sh) + "," + std::to_string(g.sw) + " dil " + std::to_string(g.dh) + "," +
         std::to_string(g.dw) + " pad " + std::to_string(g.pt) + "," + std::to_string(g.pl);
}

} // namespace

TEST_CASE("implicit conv gather_tap: the inputs of one tap for any run of pixels, nothing "
          "written outside it",
          "[conv][implicit]") {
  std::mt19937 rng(20261201);
  const auto pick = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(rng);
  };
  constexpr index_t guard = 80; // canaries either side of d (more than a row of any case)
  for (int trial = 0; trial < 60; ++trial) {
    ic::geometry g;
    index_t hspan = -1, wspan = -1;  // input rows / columns the kernel's first tap sweeps, less 1
    while (hspan < 0 || wspan < 0) { // drawn again until the geometry has an output
      g.N = 1;
      g.cin = pick(1, 3);
      g.cout = 1;
      g.Hin = pick(1, 13);
      g.Win = pick(1, 17);
      g.R = pick(1, 5);
      g.S = pick(1, 5);
      g.sh = pick(1, 3);
      g.sw = pick(1, 3);
      g.dh = pick(1, 2);
      g.dw = pick(1, 2);
      // From cropping (-1) to more than the kernel's reach (rows wholly in padding).
      g.pt = pick(-1, (g.R - 1) * g.dh + 2);
      g.pl = pick(-1, (g.S - 1) * g.dw + 2);
      hspan = g.Hin + 2 * g.pt - (g.R - 1) * g.dh - 1;
      wspan = g.Win + 2 * g.pl - (g.S - 1) * g.dw - 1;
    }
    g.Hout = hspan / g.sh + 1;
    g.Wout = wspan / g.sw + 1;
    // The input plane padded to a row stride of its own and a channel stride of its own.
    const index_t hs = g.Win + pick(0, 3), cs = g.Hin * hs + pick(0, 5);
    std::vector<float> in(static_cast<std::size_t>(g.cin * cs));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i + 1); // unique
    const index_t pixels = g.pixels();
    // Runs: the whole image, single pixels, from mid-row to mid-row, and random ones.
    std::vector<std::pair<index_t, index_t>> runs = {{0, pixels}, {0, 1}, {pixels - 1, 1}};
    for (int k = 0; k < 6; ++k) {
      const index_t m0 = pick(0, pixels - 1);
      runs.emplace_back(m0, pick(1, pixels - m0));
    }
    if (g.Wout > 2 && g.Hout > 1) runs.emplace_back(g.Wout / 2, g.Wout); // mid-row to mid-row
    std::vector<float> buf(static_cast<std::size_t>(pixels + 2 * guard));
    for (index_t c = 0; c < g.cin; ++c)
      for (index_t r = 0; r < g.R; ++r)
        for (index_t s = 0; s < g.S; ++s)
          for (const auto& [m0, kp] : runs) {
            INFO(describe(g) << ", tap c " << c << " r " << r << " s " << s << ", pixels [" << m0
                             << ", " << m0 + kp << ")");
            std::fill(buf.begin(), buf.end(), canary());
            float* d = buf.data() + guard;
            ic::gather_tap(g, in.data(), cs, hs, c, r, s, m0, kp, d);
            index_t outside = 0, wrong = 0;
            for (index_t i = 0; i < guard; ++i)
              outside += !is_canary(buf[static_cast<std::size_t>(i)]);
            for (index_t i = guard + kp; i < pixels + 2 * guard; ++i)
              outside += !is_canary(buf[static_cast<std::size_t>(i)]);
            for (index_t i = 0; i < kp; ++i) {
              const index_t m = m0 + i, p = m / g.Wout, q = m % g.Wout;
              const index_t h = p * g.sh - g.pt + r * g.dh, w = q * g.sw - g.pl + s * g.dw;
              const bool inside = h >= 0 && h < g.Hin && w >= 0 && w < g.Win;
              const float want = inside ? in[static_cast<std::size_t>(c * cs + h * hs + w)] : 0.f;
              wrong += !(d[i] == want); // a canary left in d is NaN: wrong as well
            }
            CHECK(outside == 0);
            CHECK(wrong == 0);
          }
  }
}

// band_prefetch (implicit.hpp): over its `steps` calls it must touch exactly the 64-byte lines of
// the next unit's rows that lie inside the image (no line twice per row, none of a padding row,
// none after the last call), or nothing when those rows are one contiguous stretch of memory
// (left to the hardware's prefetchers). Random geometries of both element sizes the bands read.
template <class T>
void check_band_prefetch(std::mt19937& rng) {
  const auto pick = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 400; ++trial) {
    const index_t images = pick(1, 3), planes = pick(1, 5), H = pick(1, 9), W = pick(1, 40);
    const bool dense = pick(0, 2) == 0; // rows, planes and images back to back
    const index_t hs = H == 1 && pick(0, 1) == 0 ? 0 : W + (dense ? 0 : pick(0, 3));
    const index_t elems = dense ? W : pick(1, W);
    const index_t cs = (H == 1 ? W : H * hs) + (dense ? 0 : pick(0, 2) * 7);
    const index_t ns = planes * cs + (dense ? 0 : pick(0, 2) * 5);
    const index_t h0 = dense && pick(0, 1) == 0 ? -pick(0, 2) : pick(-3, H);
    const index_t BH = dense && h0 <= 0 ? H - h0 + pick(0, 2) : pick(1, H + 4);
    const index_t steps = pick(1, 40);
    std::vector<T> buf(static_cast<std::size_t>(images * ns + 64));
    const T* base = buf.data();
    const auto at = [&](const T* p) { return reinterpret_cast<std::uintptr_t>(p); };
    // Expected: the lines of every row inside [0, H), and the rows' byte ranges.
    std::set<std::uintptr_t> want;
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
    std::size_t want_touches = 0;
    for (index_t i = 0; i < images; ++i)
      for (index_t c = 0; c < planes; ++c)
        for (index_t h = std::max<index_t>(h0, 0); h < std::min(H, h0 + BH); ++h) {
          const T* row = base + i * ns + c * cs + h * hs;
          ranges.emplace_back(at(row), at(row + elems));
          for (std::uintptr_t a = at(row) & ~std::uintptr_t(63); a < at(row + elems); a += 64) {
            want.insert(a);
            ++want_touches;
          }
        }
    ic::band_prefetch<T> pf;
    pf.arm(base, images, ns, planes, cs, hs, h0, BH, H, elems, steps);
    std::multiset<std::uintptr_t> got;
    for (index_t s = 0; s < steps + 3; ++s) {
      const std::size_t before = got.size();
      pf.step([&](std::uintptr_t a) { got.insert(a); });
      if (s >= steps) REQUIRE(got.size() == before); // nothing past the last call
    }
    INFO("images " << images << " planes " << planes << " H " << H << " W " << W << " hs " << hs
                   << " elems " << elems << " cs " << cs << " ns " << ns << " h0 " << h0 << " BH "
                   << BH << " steps " << steps << " sizeof " << sizeof(T));
    if (got.empty() && !want.empty()) { // skipped: the rows must be one contiguous stretch
      std::sort(ranges.begin(), ranges.end());
      for (std::size_t k = 1; k < ranges.size(); ++k)
        REQUIRE(ranges[k].first == ranges[k - 1].second);
      continue;
    }
    REQUIRE(got.size() == want_touches);
    REQUIRE(std::set<std::uintptr_t>(got.begin(), got.end()) == want);
  }
}

TEST_CASE("implicit conv band_prefetch: the next unit's rows inside the image, line by line, "
          "within its calls, or nothing for one contiguous stretch",
          "[conv][implicit]") {
  std::mt19937 rng(20261202);
  check_band_prefetch<float>(rng);
  check_band_prefetch<std::uint16_t>(rng);
  // The two cases the rule was measured on: a 64-channel band of 6 rows of a 56 x 56 image
  // (prefetched: 64 x 6 rows), and a whole 32-channel 14 x 14 image (left to the hardware).
  std::vector<float> img(64 * 56 * 56);
  std::size_t n = 0;
  ic::band_prefetch<float> pf;
  pf.arm(img.data(), 1, 0, 64, 56 * 56, 56, 3, 6, 56, 56, 32);
  for (int s = 0; s < 32; ++s) pf.step([&](std::uintptr_t) { ++n; });
  CHECK(n >= 64 * 6 * 4); // 224 bytes a row: 4 or 5 lines
  n = 0;
  pf.arm(img.data(), 1, 0, 32, 14 * 14, 14, -1, 16, 14, 14, 28);
  for (int s = 0; s < 28; ++s) pf.step([&](std::uintptr_t) { ++n; });
  CHECK(n == 0);
}

#if TESSERA_GEMM_AVX512BF16
namespace {

// The bf16 bits of x by the definition: bf16 as it is; fp8 through its float (exact in bf16:
// the float's low 16 bits are zero), independent of the tables and registers fill_band_pairs uses.
template <class T>
std::uint32_t bf16_of(T x) {
  if constexpr (std::is_same_v<T, tessera::bfloat16>) {
    return x.bits;
  } else {
    const float f = x.to_float();
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u >> 16;
  }
}

template <class T>
void check_pair_band(std::mt19937& rng) {
  const auto pick = [&](index_t lo, index_t hi) {
    return std::uniform_int_distribution<index_t>(lo, hi)(rng);
  };
  constexpr std::uint32_t guard = 0xdeadbeefu;
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    ic::geometry g;
    g.N = 1;
    g.cin = pick(1, 9);
    g.cout = 32;
    g.R = pick(1, 5), g.S = pick(1, 5);
    // Rows from 1 to 4 chunks of 64 (the fp8 path takes 64 codes a step, masked past the end).
    g.Hin = pick(1, 12), g.Win = trial % 4 == 0 ? pick(60, 200) : pick(1, 70);
    g.pt = pick(0, g.R), g.pl = pick(-1, g.S); // -1: the band starts inside the row
    g.Hout = g.Hin + 2 * g.pt - g.R + 1, g.Wout = g.Win + 2 * g.pl - g.S + 1;
    if (g.Hout < 1 || g.Wout < 1) continue;
    const ic::direct_layout d = ic::direct_layout_for(g, true);
    if (!d.ok) continue;
    // Channel and row strides past the row's end (inputs cut from a larger tensor).
    const index_t hs = g.Win + pick(0, 3), cs = g.Hin * hs + pick(0, 5);
    std::vector<T> in(static_cast<std::size_t>(g.cin * cs + 64));
    for (auto& x : in) {
      if constexpr (std::is_same_v<T, tessera::bfloat16>)
        x.bits = static_cast<std::uint16_t>(rng());
      else
        x = T::from_bits(static_cast<std::uint8_t>(rng())); // every code: NaN, Inf, subnormals
    }
    const index_t words = d.planes * d.BH * d.Wp;
    std::vector<std::uint32_t> band(static_cast<std::size_t>(words + 64), guard);
    const index_t h0 = pick(-g.R, g.Hin); // rows above and below the image are zeros
    ic::fill_band_pairs(g, d, in.data(), cs, hs, h0, band.data());
    for (index_t c2 = 0; c2 < d.planes; ++c2)
      for (index_t hr = 0; hr < d.BH; ++hr)
        for (index_t w = 0; w < d.Wp; ++w) {
          const index_t h = h0 + hr, x = w - g.pl;
          std::uint32_t want = 0;
          if (h >= 0 && h < g.Hin && x >= 0 && x < g.Win) {
            want = bf16_of(in[static_cast<std::size_t>(2 * c2 * cs + h * hs + x)]);
            if (2 * c2 + 1 < g.cin)
              want |= bf16_of(in[static_cast<std::size_t>((2 * c2 + 1) * cs + h * hs + x)]) << 16;
          }
          const std::uint32_t got = band[static_cast<std::size_t>((c2 * d.BH + hr) * d.Wp + w)];
          if (got != want)
            FAIL_CHECK(describe(g) << " h0 " << h0 << " word (" << c2 << ", " << hr << ", " << w
                                   << "): " << got << ", want " << want);
        }
    for (index_t i = words; i < words + 64; ++i)
      REQUIRE(band[static_cast<std::size_t>(i)] == guard);
    ++checked;
  }
  REQUIRE(checked > 200);
}

} // namespace

TEST_CASE("implicit conv fill_band_pairs: bf16 channel pairs of bf16 and fp8 rows, zeros outside "
          "the image, nothing written past the band",
          "[conv][implicit]") {
  std::mt19937 rng(20261205);
  check_pair_band<tessera::bfloat16>(rng);
  check_pair_band<tessera::float8_e4m3>(rng);
  check_pair_band<tessera::float8_e5m2>(rng);
}
#endif
