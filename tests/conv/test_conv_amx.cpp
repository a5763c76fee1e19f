// The AMX form of the implicit convolution's direct path (conv/detail/implicit.hpp, "AMX
// tiles"): the band of bf16 channel pairs read in place by strided tile loads, the weights
// packed as A tiles, the sums landing as channel rows. Checked against a double reference of
// the same bf16 operands, for the layouts the form takes (linear rows, rows of whole tiles,
// pair planes padded to 16, odd channel counts, output channels not a multiple of 32, several
// bands, groups, dilation, row stride 2) on one thread and on the host space's team.
//
// Compiled with TESSERA_GEMM_AMX_EMULATE: on a CPU without AMX (but with AVX512_BF16, which
// fills the bands) the tiles are gemm/detail/amx_emulation.hpp's software model; where the build
// targets AMX the real instructions run (the conv tests then also run the form end to end:
// test_conv2d_lowp on an AMX machine).
#include <tessera/conv/detail/amx_weight.hpp>
#include <tessera/conv/detail/implicit.hpp>
#include <tessera/conv/detail/phases.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using tessera::index_t;
namespace ic = tessera::detail::implicit_conv;

#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16

struct amx_case {
  index_t N, G, cin, cout, H, W, R, S, sh, dh, dw, pad, sw = 1;
  std::string describe() const {
    return "N " + std::to_string(N) + " G " + std::to_string(G) + " cin " + std::to_string(cin) +
           " cout " + std::to_string(cout) + " " + std::to_string(H) + "x" + std::to_string(W) +
           " R " + std::to_string(R) + " S " + std::to_string(S) + " sh " + std::to_string(sh) +
           " dil " + std::to_string(dh) + "," + std::to_string(dw) + " pad " + std::to_string(pad) +
           " sw " + std::to_string(sw);
  }
  ic::geometry geometry() const {
    ic::geometry g;
    g.N = N, g.G = G, g.cin = cin, g.cout = cout, g.Hin = H, g.Win = W, g.R = R, g.S = S;
    g.sh = sh, g.sw = sw, g.dh = dh, g.dw = dw, g.pt = pad, g.pl = pad;
    g.Hout = (H + 2 * pad - dh * (R - 1) - 1) / sh + 1;
    g.Wout = (W + 2 * pad - dw * (S - 1) - 1) / sw + 1;
    return g;
  }
};

/// Values of precision P (random floats rounded to P), one in 16 of them zero.
template <class P>
std::vector<tessera::storage_t<P>> values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<tessera::storage_t<P>> v(n);
  for (auto& x : v) x = tessera::from_float<P>(rng() % 16 == 0 ? 0.f : u(rng));
  return v;
}

/// run_direct on AMX tiles against a double reference, x of precision Px (bf16 or fp8), w bf16;
/// seg: the segments form (else the grid band); inf_c >= 0: x of image 0, channel inf_c in the
/// middle of its last row is +Inf (the outputs it reaches are +-Inf or NaN as in the
/// reference; padded channels, taps and slots must not turn them into NaN).
template <class Exec, class Px = tessera::bf16>
void check_case(const amx_case& c, std::uint64_t seed, index_t inf_c = -1, bool seg = false) {
  INFO(c.describe() << (inf_c >= 0 ? ", +Inf in channel " + std::to_string(inf_c) : "")
                    << (std::is_same_v<Px, tessera::bf16> ? "" : ", fp8 x"));
  const ic::geometry g = c.geometry();
  const ic::direct_layout d = ic::direct_layout_for(g, true, false, true);
  REQUIRE(d.ok);
  REQUIRE(d.amx);
  REQUIRE(d.seg == seg);
  if (seg) {
    CHECK(d.SP == g.Wout);
    CHECK(d.steps(g) == (c.cin * c.R + 3) / 4);
  } else {
    CHECK((d.SP % 16 == 0 || (c.sh == 1 && d.SP == d.Wp))); // whole tiles a row, or linear
    CHECK(d.tile_planes() % 16 == 0);
  }
  CHECK(d.cap % 32 == 0);
  // x (N, G*cin, H, W) and w (G*cout, cin, R, S), row-major.
  const index_t C = c.G * c.cin, K = c.G * c.cout, RS = c.R * c.S;
  auto x = values<Px>(static_cast<std::size_t>(c.N * C * c.H * c.W), seed);
  if (inf_c >= 0)
    x[static_cast<std::size_t>((inf_c * c.H + c.H - 1) * c.W + c.W / 2)] =
        tessera::from_float<Px, tessera::overflow_to_inf_nan>(
            std::numeric_limits<float>::infinity());
  const auto w = values<tessera::bf16>(static_cast<std::size_t>(K * c.cin * RS), seed + 1);
  const Exec exec;
  // Weights: B(kk, j) of group gi = w[gi*cout + j, c, r, s], kk = (c*R + r)*S + s.
  std::vector<std::uint32_t> packed(d.packed_words(g), 0xdeadbeefu);
  ic::pack_weight_tiles(exec, g, d, packed.data(), [&](index_t gi, index_t kk, index_t j) {
    return w[static_cast<std::size_t>((gi * c.cout + j) * c.cin * RS + kk)].to_float();
  });
  exec.fence();
  const auto parts = static_cast<std::size_t>(ic::parts_for(exec, g, d));
  const std::size_t scratch_bytes =
      tessera::detail::round_up_64(sizeof(index_t) * static_cast<std::size_t>(d.steps(g))) +
      parts * d.part_floats(g) * 4;
  std::vector<float> scratch_mem(scratch_bytes / 4 + 16);
  void* scratch = reinterpret_cast<void*>(
      (reinterpret_cast<std::uintptr_t>(scratch_mem.data()) + 63) / 64 * 64);
  const index_t P = g.Hout, Q = g.Wout;
  std::vector<float> out(static_cast<std::size_t>(c.N * K * P * Q), std::nanf(""));
  std::vector<int> stored(out.size(), 0);
  ic::run_direct<true>(exec, g, d, x.data(), C * c.H * c.W, c.H * c.W, c.W, packed.data(), scratch,
                       [&](const float* sums, index_t k, index_t n, index_t p0, index_t count) {
                         for (index_t p = 0; p < count; ++p)
                           for (index_t q = 0; q < Q; ++q) {
                             const auto o =
                                 static_cast<std::size_t>(((n * K + k) * P + p0 + p) * Q + q);
                             out[o] = sums[p * Q + q];
                             ++stored[o];
                           }
                       });
  exec.fence();
  // Reference: double sums of the exact products; fp32 accumulation error within
  // (terms + 2) * 2^-24 * sum |terms| (a wrong tap, channel or slot is off by a whole term).
  std::size_t bad = 0, unstored = 0;
  for (index_t n = 0; n < c.N; ++n)
    for (index_t k = 0; k < K; ++k)
      for (index_t p = 0; p < P; ++p)
        for (index_t q = 0; q < Q; ++q) {
          const index_t gi = k / c.cout;
          double sum = 0, mag = 0;
          for (index_t ch = 0; ch < c.cin; ++ch)
            for (index_t r = 0; r < c.R; ++r)
              for (index_t s = 0; s < c.S; ++s) {
                const index_t h = p * c.sh - c.pad + r * c.dh, wc = q * c.sw - c.pad + s * c.dw;
                if (h < 0 || h >= c.H || wc < 0 || wc >= c.W) continue;
                const double a = tessera::to_float(
                    x[static_cast<std::size_t>(((n * C + gi * c.cin + ch) * c.H + h) * c.W + wc)]);
                const double b =
                    w[static_cast<std::size_t>(((k * c.cin + ch) * c.R + r) * c.S + s)].to_float();
                sum += a * b;
                mag += std::abs(a * b);
              }
          const auto o = static_cast<std::size_t>(((n * K + k) * P + p) * Q + q);
          const double tol = static_cast<double>(c.cin * RS + 2) * std::ldexp(1.0, -24) * mag;
          if (stored[o] != 1) ++unstored;
          const bool ok = std::isfinite(sum) ? std::abs(out[o] - sum) <= tol
                          : std::isnan(sum)  ? std::isnan(out[o])
                                             : static_cast<double>(out[o]) == sum;
          if (!ok) {
            if (bad < 5)
              UNSCOPED_INFO("n " << n << " k " << k << " p " << p << " q " << q << ": " << out[o]
                                 << " vs " << sum);
            ++bad;
          }
        }
  CHECK(unstored == 0);
  CHECK(bad == 0);
}

template <class Exec>
void check_cases() {
  const amx_case cases[] = {
      // N  G cin cout  H   W  R  S sh dh dw pad
      {3, 1, 32, 64, 14, 14, 3, 3, 1, 1, 1, 1}, // a FashionCNN conv2: linear rows of 16 slots
      {2, 1, 29, 40, 9, 23, 3, 3, 1, 1, 1, 1},  // 15 pair planes (odd cin), cout 40 of 64
      {2, 2, 64, 16, 12, 12, 3, 3, 1, 1, 1, 1}, // groups; cout 16 per group
      {1, 1, 27, 32, 40, 40, 3, 3, 1, 1, 1, 1}, // 14 pairs in 16 planes; 40 rows: several bands
      {2, 1, 64, 32, 21, 30, 3, 3, 2, 1, 1, 1}, // row stride 2: rows of 32 slots (2 tiles)
      {2, 1, 62, 48, 15, 17, 3, 3, 1, 2, 2, 2}, // dilation 2, 31 pairs
      {1, 1, 32, 96, 20, 20, 5, 5, 1, 1, 1, 2}, // 5 x 5, three channel blocks
      {5, 1, 160, 32, 8, 8, 3, 3, 1, 1, 1, 1},  // 80 pairs: 5 tile planes per tap; 10 a row
  };
  std::uint64_t seed = 0xa3c0;
  for (const amx_case& c : cases) {
    check_case<Exec>(c, seed);
    check_case<Exec, tessera::fp8_e4m3>(c, seed + 1); // four channel rows a register, widened
    seed += 2;
  }
  // +Inf in x: cin 51 fills two chunks of 32 channels, the second with 19; a chunk's input rows
  // past cin must be zeros, not the first chunk's channel 25 of the row read last (Inf x a
  // zero weight = NaN).
  check_case<Exec>({2, 1, 51, 32, 11, 13, 3, 3, 1, 1, 1, 1}, seed, 25);
  check_case<Exec>({1, 1, 32, 48, 14, 14, 3, 3, 1, 1, 1, 1}, seed + 2, 7);
  check_case<Exec, tessera::fp8_e5m2>({2, 1, 51, 32, 11, 13, 3, 3, 1, 1, 1, 1}, seed + 4, 27);
  // Pair planes padded to 16 may waste at most a quarter of the products: 17 pairs (cin 33) in
  // 32 planes are not taken.
  CHECK_FALSE(ic::direct_layout_for(amx_case{1, 1, 33, 32, 14, 14, 3, 3, 1, 1, 1, 1}.geometry(),
                                    true, false, true)
                  .ok);
  // Column stride 2 is not a tile row of consecutive words, and 32 channels x 3 rows are more
  // segments than the segments form takes: not taken.
  CHECK_FALSE(ic::direct_layout_for(amx_case{1, 1, 32, 32, 14, 14, 3, 3, 2, 1, 1, 1, 2}.geometry(),
                                    true, false, true)
                  .ok);
  // The segments form (few input channels, any stride): a segment's 8 lanes past S and outside
  // the input are zeros, steps of 4 segments past cin*R too.
  const amx_case segs[] = {
      // N  G cin cout  H   W  R  S sh dh dw pad sw
      {2, 1, 3, 64, 29, 31, 7, 7, 2, 1, 1, 3, 2}, // a stem (7 x 7 stride 2) on odd sizes
      {1, 1, 3, 40, 56, 56, 7, 7, 2, 1, 1, 3, 2}, // the stem on 56 x 56: several bands, cout 40
      {2, 2, 2, 16, 17, 19, 7, 7, 1, 1, 1, 3, 1}, // groups, stride 1: 14 segments in 4 steps
      {1, 1, 3, 32, 23, 21, 5, 5, 2, 2, 1, 2, 2}, // row dilation 2, 15 segments
      {3, 1, 2, 48, 20, 26, 5, 5, 1, 1, 1, 1, 3}, // column stride 3, 10 segments in 3 steps
  };
  for (const amx_case& c : segs) {
    check_case<Exec>(c, seed, -1, true);
    check_case<Exec, tessera::fp8_e4m3>(c, seed + 1, -1, true);
    seed += 2;
  }
  // +Inf in the last row's middle column, read by lane s = 7 of some slots' segments (S = 7):
  // those lanes must be zeros (Inf x a zero weight = NaN).
  check_case<Exec>({1, 1, 2, 32, 12, 15, 7, 7, 1, 1, 1, 3, 1}, seed, 1, true);
  check_case<Exec, tessera::fp8_e5m2>({1, 1, 3, 32, 15, 16, 7, 7, 2, 1, 1, 3, 2}, seed, 2, true);
  // Steps less than half real products (cin 1, 5 x 5: 25 of 64) are not taken.
  CHECK_FALSE(ic::direct_layout_for(amx_case{1, 1, 1, 32, 20, 20, 5, 5, 1, 1, 1, 2}.geometry(),
                                    true, false, true)
                  .ok);
}

TEST_CASE("conv2d direct path on AMX tiles (or their software model): the band read in place",
          "[conv][bf16][amx]") {
  if (!TESSERA_GEMM_AMX_EMULATED && !tessera::cpu::amx_bf16_usable()) {
    WARN("AMX compiled but not usable on this CPU / OS: kernel not run");
    return;
  }
  if (!tessera::cpu::has_avx512bf16()) {
    WARN("no AVX512_BF16 on this CPU (the bands are filled with it): kernel not run");
    return;
  }
  SECTION("one thread") {
    check_cases<Kokkos::Serial>();
  }
  SECTION("the host space's team") {
    check_cases<Kokkos::DefaultHostExecutionSpace>();
  }
}

// ---------------------------------------------------------------------------------------------
// Backward-weight on AMX tiles (conv/detail/amx_weight.hpp)
// ---------------------------------------------------------------------------------------------

struct weight_case {
  index_t N, G, cin, cout, H, W, R, S, dh, dw, pad;
  std::string describe() const {
    return "N " + std::to_string(N) + " G " + std::to_string(G) + " cin " + std::to_string(cin) +
           " cout " + std::to_string(cout) + " " + std::to_string(H) + "x" + std::to_string(W) +
           " R " + std::to_string(R) + " S " + std::to_string(S) + " dil " + std::to_string(dh) +
           "," + std::to_string(dw) + " pad " + std::to_string(pad);
  }
  ic::geometry geometry() const {
    return amx_case{N, G, cin, cout, H, W, R, S, 1, dh, dw, pad}.geometry();
  }
};

/// Checks dW (K x kred floats as stored, and how often each was stored) against a double
/// reference of the layer g (strides, dilation, padding) times alpha: within (N P Q + 2) 2^-24
/// of the sum of the products' magnitudes, Inf and NaN where the reference has them, every tap
/// stored exactly once.
template <class T>
void check_dw(const ic::geometry& g, const std::vector<T>& x, const std::vector<T>& dy,
              const std::vector<float>& dw, const std::vector<int>& stored, float alpha) {
  const index_t C = g.G * g.cin, K = g.G * g.cout, P = g.Hout, Q = g.Wout, kred = g.kred();
  std::size_t bad = 0, unstored = 0;
  for (index_t k = 0; k < K; ++k)
    for (index_t ch = 0; ch < g.cin; ++ch)
      for (index_t r = 0; r < g.R; ++r)
        for (index_t s = 0; s < g.S; ++s) {
          const index_t gi = k / g.cout;
          double sum = 0, mag = 0;
          for (index_t n = 0; n < g.N; ++n)
            for (index_t p = 0; p < P; ++p)
              for (index_t q = 0; q < Q; ++q) {
                const index_t h = p * g.sh - g.pt + r * g.dh, wc = q * g.sw - g.pl + s * g.dw;
                if (h < 0 || h >= g.Hin || wc < 0 || wc >= g.Win) continue;
                const double a = tessera::to_float(x[static_cast<std::size_t>(
                    ((n * C + gi * g.cin + ch) * g.Hin + h) * g.Win + wc)]);
                const double b =
                    tessera::to_float(dy[static_cast<std::size_t>(((n * K + k) * P + p) * Q + q)]);
                sum += a * b;
                mag += std::abs(a * b);
              }
          sum *= alpha;
          mag *= alpha;
          const auto o = static_cast<std::size_t>(k * kred + (ch * g.R + r) * g.S + s);
          const double tol = static_cast<double>(g.N * P * Q + 2) * std::ldexp(1.0, -24) * mag;
          const bool ok = std::isnan(sum)   ? std::isnan(dw[o])
                          : std::isinf(sum) ? dw[o] == sum
                                            : std::abs(dw[o] - sum) <= tol;
          if (stored[o] != 1) ++unstored;
          if (!ok) {
            if (bad < 5)
              UNSCOPED_INFO("k " << k << " c " << ch << " r " << r << " s " << s << ": " << dw[o]
                                 << " vs " << sum);
            ++bad;
          }
        }
  CHECK(unstored == 0);
  CHECK(bad == 0);
}

/// dW of x (P) and dy (P) through run_weight_amx against a double reference of the same
/// values; inf: one input +Inf (its image's bands take the exact loops).
template <class Exec, class Prec>
void check_weight_case(const weight_case& c, std::uint64_t seed, bool inf = false) {
  INFO(c.describe() << (inf ? ", one input Inf" : ""));
  const Exec exec;
  const float alpha = 0.5f;
  ic::geometry g = c.geometry();
  g.alpha = alpha;
  const ic::weight_amx_layout d = ic::weight_amx_layout_for(g, tessera::concurrency(exec));
  REQUIRE(d.ok);
  CHECK(d.slots % 32 == 0);
  CHECK(d.slots >= d.BR * d.Wp);
  const index_t C = c.G * c.cin, K = c.G * c.cout, P = g.Hout, Q = g.Wout;
  auto x = values<Prec>(static_cast<std::size_t>(c.N * C * c.H * c.W), seed);
  const auto dy = values<Prec>(static_cast<std::size_t>(c.N * K * P * Q), seed + 1);
  // In the last column, which tap s = 0 reaches only from a garbage slot (q = Wout): there the
  // true sums stay finite.
  if (inf)
    x[static_cast<std::size_t>((C * (c.N - 1) + 1) * c.H * c.W + c.H / 2 * c.W + c.W - 1)] =
        tessera::from_float<Prec>(std::numeric_limits<float>::infinity());
  const auto parts = static_cast<std::size_t>(ic::parts_for(exec, g, d));
  std::vector<float> scratch_mem(parts * d.part_bytes(g) / 4 + 16, std::nanf(""));
  void* scratch = reinterpret_cast<void*>(
      (reinterpret_cast<std::uintptr_t>(scratch_mem.data()) + 63) / 64 * 64);
  const index_t kred = g.kred();
  std::vector<float> dw(static_cast<std::size_t>(K * kred), std::nanf(""));
  std::vector<int> stored(dw.size(), 0);
  ic::run_weight_amx(exec, g, d, x.data(), C * c.H * c.W, c.H * c.W, c.W, dy.data(), K * P * Q,
                     P * Q, scratch, [&](index_t k, index_t kk, float v) {
                       dw[static_cast<std::size_t>(k * kred + kk)] = v;
                       ++stored[static_cast<std::size_t>(k * kred + kk)];
                     });
  exec.fence();
  check_dw(g, x, dy, dw, stored, alpha);
}

template <class Exec>
void check_weight_cases() {
  const weight_case cases[] = {
      // N G cin cout  H   W  R  S dh dw pad
      {6, 1, 32, 64, 14, 14, 3, 3, 1, 1, 1}, // a FashionCNN conv2: several images per unit
      {3, 1, 29, 40, 9, 23, 3, 3, 1, 1, 1},  // cin 29 in 32 planes, cout 40: blocks of 32 and 16
      {2, 2, 48, 16, 12, 12, 3, 3, 1, 1, 1}, // groups; channel blocks of 32 and 16
      {1, 1, 64, 32, 64, 60, 3, 3, 1, 1, 1}, // two bands (L2 budget), the last one shorter
      {2, 1, 32, 32, 15, 17, 3, 3, 2, 2, 2}, // dilation 2
      {2, 1, 16, 32, 20, 20, 5, 5, 1, 1, 2}, // 5 x 5
      {4, 1, 16, 16, 7, 7, 3, 3, 1, 1, 1},   // 7 x 7 outputs: 9 slots a row
      {5, 1, 32, 32, 8, 8, 1, 3, 1, 1, 0},   // 1 x 3, no padding
      {3, 1, 32, 48, 9, 5, 3, 1, 1, 1, 1},   // 3 x 1: no garbage slots (Wp = Wout)
  };
  std::uint64_t seed = 0xb7e1;
  for (const weight_case& c : cases) {
    check_weight_case<Exec, tessera::bf16>(c, seed);
    seed += 2;
  }
  check_weight_case<Exec, tessera::fp8_e4m3>(cases[0], seed);
  check_weight_case<Exec, tessera::fp8_e5m2>(cases[1], seed + 2);
  check_weight_case<Exec, tessera::bf16>(cases[0], seed + 4, true);
  check_weight_case<Exec, tessera::bf16>(cases[4], seed + 6, true);
  // Not taken: stride 2, 1 x 1, and channels padded to 16 that more than double the products
  // (cin 3).
  CHECK_FALSE(
      ic::weight_amx_layout_for(weight_case{1, 1, 32, 32, 14, 14, 1, 1, 1, 1, 0}.geometry(), 1).ok);
  CHECK_FALSE(
      ic::weight_amx_layout_for(amx_case{1, 1, 32, 32, 14, 14, 3, 3, 2, 1, 1, 1}.geometry(), 1).ok);
  CHECK_FALSE(
      ic::weight_amx_layout_for(weight_case{1, 1, 3, 32, 14, 14, 3, 3, 1, 1, 1}.geometry(), 1).ok);
}

TEST_CASE("conv2d backward-weight on AMX tiles (or their software model)", "[conv][bf16][amx]") {
  if (!TESSERA_GEMM_AMX_EMULATED && !tessera::cpu::amx_bf16_usable()) {
    WARN("AMX compiled but not usable on this CPU / OS: kernel not run");
    return;
  }
  SECTION("one thread") {
    check_weight_cases<Kokkos::Serial>();
  }
  SECTION("the host space's team") {
    check_weight_cases<Kokkos::DefaultHostExecutionSpace>();
  }
}

/// A strided layer for the phase split (conv/detail/phases.hpp), per-side padding.
struct strided_case {
  index_t N, G, cin, cout, H, W, R, S, sh, sw, pt, pb, pl, pr;
  std::string describe() const {
    const auto s = [](index_t v) { return std::to_string(v); };
    return "N " + s(N) + " G " + s(G) + " cin " + s(cin) + " cout " + s(cout) + " " + s(H) + "x" +
           s(W) + " R " + s(R) + " S " + s(S) + " stride " + s(sh) + "," + s(sw) + " pad " + s(pt) +
           "," + s(pb) + "," + s(pl) + "," + s(pr);
  }
  ic::geometry geometry() const {
    ic::geometry g;
    g.N = N, g.G = G, g.cin = cin, g.cout = cout, g.Hin = H, g.Win = W, g.R = R, g.S = S;
    g.sh = sh, g.sw = sw, g.pt = pt, g.pl = pl;
    g.Hout = (H + pt + pb - R) / sh + 1;
    g.Wout = (W + pl + pr - S) / sw + 1;
    return g;
  }
};

/// Backward-weight of a strided layer as the stride-1 one over x's phases: fill_phases, then
/// run_weight_amx (AMX or its software model) or run_weight_direct in bf16 pairs (VDPBF16PS,
/// where the CPU has it) on the split geometry, each sum stored to its original tap through
/// original_tap; checked against a double reference of the strided layer itself, with every
/// original tap stored exactly once. max_waste: the split's bound (raised to reach strides the
/// dispatch leaves to im2col, whose maps must be right all the same).
template <class Exec, class Prec>
void check_phase_case(const strided_case& c, std::uint64_t seed, bool amx, double max_waste,
                      bool inf = false) {
  INFO(c.describe() << (amx ? ", AMX tiles" : ", VDPBF16PS pairs")
                    << (inf ? ", one input Inf" : ""));
  const Exec exec;
  const float alpha = 0.75f;
  ic::geometry g = c.geometry();
  g.alpha = alpha;
  const ic::phase_split ps = ic::phase_split_for(g, max_waste);
  REQUIRE(ps.ok);
  CHECK(ps.g.sh == 1);
  CHECK(ps.g.sw == 1);
  CHECK(ps.g.Hout == g.Hout);
  CHECK(ps.g.Wout == g.Wout);
  CHECK(ps.g.cin == c.cin * c.sh * c.sw);
  const index_t C = c.G * c.cin, K = c.G * c.cout, P = g.Hout, Q = g.Wout;
  auto x = values<Prec>(static_cast<std::size_t>(c.N * C * c.H * c.W), seed);
  const auto dy = values<Prec>(static_cast<std::size_t>(c.N * K * P * Q), seed + 1);
  if (inf) // the middle of image 0, channel 0: its sums are +-Inf or NaN as the reference's
    x[static_cast<std::size_t>(c.H / 2 * c.W + c.W / 2)] =
        tessera::from_float<Prec>(std::numeric_limits<float>::infinity());
  // The phase images, with canaries after them.
  using T = tessera::storage_t<Prec>;
  const std::size_t nph = ps.elements();
  std::vector<T> xp(nph + 64, T{0x5a});
  ic::fill_phases(exec, ps, x.data(), C * c.H * c.W, c.H * c.W, c.W, xp.data());
  exec.fence();
  for (std::size_t i = nph; i < xp.size(); ++i) REQUIRE(xp[i] == T{0x5a});
  // Every phase value is the input at its place or zero past the input.
  std::size_t wrong = 0;
  for (index_t n = 0; n < c.N; ++n)
    for (index_t cp = 0; cp < C * c.sh * c.sw; ++cp)
      for (index_t i = 0; i < ps.g.Hin; ++i)
        for (index_t j = 0; j < ps.g.Win; ++j) {
          const index_t ch = cp / (c.sh * c.sw), h = c.sh * i + cp / c.sw % c.sh,
                        w = c.sw * j + cp % c.sw;
          const T want = h < c.H && w < c.W
                             ? x[static_cast<std::size_t>(((n * C + ch) * c.H + h) * c.W + w)]
                             : T{};
          wrong +=
              xp[static_cast<std::size_t>(n * ps.ns() + cp * ps.cs() + i * ps.hs() + j)] != want;
        }
  CHECK(wrong == 0);

  const index_t kred = g.kred();
  std::vector<float> dw(static_cast<std::size_t>(K * kred), std::nanf(""));
  std::vector<int> stored(dw.size(), 0);
  const auto store = [&](index_t k, index_t kk, float v) {
    const index_t t = ps.original_tap(kk);
    if (t < 0) return;
    REQUIRE(t < kred);
    dw[static_cast<std::size_t>(k * kred + t)] = v;
    ++stored[static_cast<std::size_t>(k * kred + t)];
  };
  std::vector<float> scratch_mem;
  const auto scratch = [&](std::size_t bytes) {
    scratch_mem.assign(bytes / 4 + 16, std::nanf(""));
    return reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(scratch_mem.data()) + 63) /
                                   64 * 64);
  };
  if (amx) {
    const ic::weight_amx_layout d = ic::weight_amx_layout_for(ps.g, tessera::concurrency(exec));
    REQUIRE(d.ok);
    void* s = scratch(static_cast<std::size_t>(ic::parts_for(exec, ps.g, d)) * d.part_bytes(ps.g));
    ic::run_weight_amx(exec, ps.g, d, xp.data(), ps.ns(), ps.cs(), ps.hs(), dy.data(), K * P * Q,
                       P * Q, s, store);
  } else {
    const ic::weight_direct_layout d =
        ic::weight_direct_layout_for(ps.g, tessera::concurrency(exec), true);
    REQUIRE(d.ok);
    void* s = scratch(
        tessera::detail::round_up_64(sizeof(index_t) * static_cast<std::size_t>(ps.g.kred())) +
        static_cast<std::size_t>(ic::parts_for(exec, ps.g, d)) * d.part_bytes(ps.g));
    ic::run_weight_direct(exec, ps.g, d, xp.data(), ps.ns(), ps.cs(), ps.hs(), dy.data(), K * P * Q,
                          P * Q, s, store);
  }
  exec.fence();
  check_dw(g, x, dy, dw, stored, alpha);
}

template <class Exec>
void check_phase_cases(bool amx) {
  // N G cin cout H W R S sh sw pt pb pl pr
  const strided_case small[] = {
      {2, 1, 3, 32, 29, 27, 7, 7, 2, 2, 3, 3, 3, 3}, // a ResNet stem on odd sizes
      {1, 1, 3, 64, 40, 38, 7, 7, 2, 2, 3, 3, 3, 3}, // 64 output channels
      {3, 1, 4, 16, 17, 19, 5, 5, 2, 2, 2, 2, 2, 2}, // 5 x 5 stride 2: 3 x 3 phase taps
      {2, 1, 6, 32, 21, 18, 7, 7, 2, 1, 3, 3, 3, 3}, // stride 2 down, 1 across
      {2, 1, 3, 32, 25, 22, 7, 7, 2, 2, 2, 1, 0, 3}, // padding differing on every side
      {2, 2, 3, 16, 16, 17, 7, 7, 2, 2, 3, 3, 3, 3}, // groups
      {2, 1, 3, 32, 20, 23, 6, 6, 2, 2, 2, 2, 2, 2}, // 6 x 6: no tap past the window
      {2, 1, 2, 32, 23, 25, 7, 5, 3, 3, 3, 3, 2, 2}, // stride 3 (over the dispatch's bound)
      {1, 1, 3, 32, 8, 11, 7, 7, 2, 2, 3, 3, 3, 3},  // a 4 x 6 output, mostly padding
  };
  // The pairs form's layout wants 48 vector steps or more per register block
  // (weight_direct_layout_for): larger outputs.
  const strided_case large[] = {
      {2, 1, 3, 32, 56, 60, 7, 7, 2, 2, 3, 3, 3, 3}, // a stem, 28 x 30 outputs
      {4, 1, 4, 32, 40, 44, 5, 5, 2, 2, 2, 2, 2, 2}, // 5 x 5 stride 2
      {2, 1, 6, 32, 40, 33, 7, 7, 2, 1, 3, 3, 3, 3}, // stride 2 down, 1 across
      {3, 2, 3, 16, 48, 50, 7, 7, 2, 2, 2, 1, 0, 3}, // groups, padding differing on every side
      {5, 1, 2, 32, 47, 53, 7, 5, 3, 3, 3, 3, 2, 2}, // stride 3
  };
  std::uint64_t seed = 0x5eed;
  if (amx)
    for (const strided_case& c : small)
      check_phase_case<Exec, tessera::bf16>(c, seed += 2, amx, 4.0);
  for (const strided_case& c : large) check_phase_case<Exec, tessera::bf16>(c, seed += 2, amx, 4.0);
  const strided_case& stem = amx ? small[0] : large[0];
  check_phase_case<Exec, tessera::fp8_e4m3>(stem, seed + 2, amx, 4.0);
  check_phase_case<Exec, tessera::fp8_e5m2>(amx ? small[4] : large[3], seed + 4, amx, 4.0);
  check_phase_case<Exec, tessera::bf16>(stem, seed + 6, amx, 4.0, true);
  // The dispatch's bound (1.5x the original taps): a 7 x 7 stem 1.31x and a 5 x 5 stride 2
  // 1.44x are split; 3 x 3 stride 2 (16 for 9), 4 x 4 stride 2 pad 1 (36 for 16) and the
  // 7 x 7 stride 3 above (81 for 49) are not; stride 1 and dilation never.
  const auto split = [](const strided_case& c) { return ic::phase_split_for(c.geometry()).ok; };
  CHECK(split(small[0]));
  CHECK(split(small[2]));
  CHECK_FALSE(split(small[7]));
  CHECK_FALSE(split({1, 1, 16, 32, 14, 14, 3, 3, 2, 2, 1, 1, 1, 1}));
  CHECK_FALSE(split({1, 1, 16, 32, 14, 14, 4, 4, 2, 2, 1, 1, 1, 1}));
  CHECK_FALSE(split({1, 1, 16, 32, 14, 14, 3, 3, 1, 1, 1, 1, 1, 1}));
  ic::geometry dil = small[0].geometry();
  dil.dh = 2, dil.Hout = (29 + 6 - 13) / 2 + 1;
  CHECK_FALSE(ic::phase_split_for(dil).ok);
}

TEST_CASE("conv2d backward-weight of strided layers over the input's phases (space to depth)",
          "[conv][bf16][amx]") {
  const bool amx = TESSERA_GEMM_AMX_EMULATED || tessera::cpu::amx_bf16_usable();
  const bool pairs = tessera::cpu::has_avx512bf16();
  if (!amx) WARN("AMX compiled but not usable on this CPU / OS: the tiles' form is not run");
  if (!pairs) WARN("no AVX512_BF16 on this CPU: the pairs form is not run");
  SECTION("one thread") {
    if (amx) check_phase_cases<Kokkos::Serial>(true);
    if (pairs) check_phase_cases<Kokkos::Serial>(false);
  }
  SECTION("the host space's team") {
    if (amx) check_phase_cases<Kokkos::DefaultHostExecutionSpace>(true);
    if (pairs) check_phase_cases<Kokkos::DefaultHostExecutionSpace>(false);
  }
}

#else

TEST_CASE("conv2d direct path on AMX tiles: not compiled", "[conv][bf16][amx]") {
  WARN("this build targets neither AMX nor AVX-512 BW + AVX512_BF16 (for the software tiles): "
       "the AMX form of the direct path is not compiled, nothing to check");
}

#endif

} // namespace
