// The implicit convolution's backward-weight gather (conv/detail/implicit.hpp, gather_tap),
// checked alone: for every tap of random geometries (odd and prime sizes, strides, dilation,
// padding larger than the kernel's reach, negative padding that crops) and for runs of pixels
// that start and end mid-row, span several rows or lie wholly in padding rows, the gathered
// floats must equal the input read by its own index arithmetic, and nothing outside the
// destination may be written. A write outside d lands in the same scratch block in the library
// (the next tap's row or the B panel), where neither the results nor AddressSanitizer see it:
// hence canaries around d.
#include <tessera/conv/detail/implicit.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
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
