// fp8 scaling recipes: scripted amax histories against scales computed by hand in the test
// (scale = max_finite / amax / 2^margin; E4M3 max_finite = 448 = 1.75 * 2^8, E5M2 max_finite =
// 57344 = 1.75 * 2^15, from the OCP fp8 specification), fallback on zero / inf / NaN amax,
// history length and the two reduction algorithms.
#include <tessera/train/fp8_recipe.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace tessera;        // NOLINT: test file, not a header
using namespace tessera::train; // NOLINT

namespace {

constexpr float e4m3_max = 448.f;   // OCP E4M3: S.1111.110 = 1.75 * 2^8
constexpr float e5m2_max = 57344.f; // OCP E5M2: S.11110.11 = 1.75 * 2^15
const float inf = std::numeric_limits<float>::infinity();
const float qnan = std::numeric_limits<float>::quiet_NaN();

// Scales are compared bit for bit: the header must compute exactly this float expression.
bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

} // namespace

TEST_CASE("hybrid format: E4M3 weights and activations, E5M2 gradients", "[train][fp8]") {
  STATIC_REQUIRE(std::is_same_v<hybrid::weight, fp8_e4m3>);
  STATIC_REQUIRE(std::is_same_v<hybrid::activation, fp8_e4m3>);
  STATIC_REQUIRE(std::is_same_v<hybrid::gradient, fp8_e5m2>);
  STATIC_REQUIRE(std::is_same_v<all_e4m3::gradient, fp8_e4m3>);
  STATIC_REQUIRE(Fp8Format<hybrid>);
  STATIC_REQUIRE(fp8_meta<current_scaling>::needs_current_amax);
  STATIC_REQUIRE(!fp8_meta<delayed_scaling>::needs_current_amax);
  // The constants used by the hand computations below are the formats' own.
  REQUIRE(precision_traits<fp8_e4m3>::max_finite == e4m3_max);
  REQUIRE(precision_traits<fp8_e5m2>::max_finite == e5m2_max);
}

TEST_CASE("current scaling: scale from the current amax, previous kept on zero/inf/NaN",
          "[train][fp8]") {
  fp8_meta<current_scaling> m{{.margin = 1}};
  // Nothing recorded yet and no usable amax: scale 1.
  REQUIRE(m.scale<fp8_e4m3>(0.f) == 1.f);
  REQUIRE(m.scale<fp8_e4m3>(inf) == 1.f);

  // amax 3.5, margin 1: 448 / 3.5 / 2 = 64.
  REQUIRE(same_bits(m.scale<fp8_e4m3>(3.5f), e4m3_max / 3.5f / 2.f));
  REQUIRE(m.scale<fp8_e4m3>(3.5f) == 64.f);
  // E5M2: 57344 / 3.5 / 2 = 8192.
  REQUIRE(m.scale<fp8_e5m2>(3.5f) == 8192.f);
  m.record(3.5f);
  // A later zero / inf / NaN amax keeps the scale of the last usable one.
  for (const float bad : {0.f, -0.f, inf, -inf, qnan, -1.f})
    REQUIRE(m.scale<fp8_e4m3>(bad) == 64.f);
  // Non-power-of-two ratios: 448 / 0.3 / 2 rounded as float, same expression.
  REQUIRE(same_bits(m.scale<fp8_e4m3>(0.3f), e4m3_max / 0.3f / 2.f));
  m.record(0.3f);
  REQUIRE(same_bits(m.scale<fp8_e4m3>(qnan), e4m3_max / 0.3f / 2.f));
  // Recording unusable amaxes does not forget the fallback.
  m.record(inf);
  m.record(0.f);
  REQUIRE(same_bits(m.scale<fp8_e4m3>(0.f), e4m3_max / 0.3f / 2.f));
  // An amax so small that the scale would overflow float is treated like zero.
  REQUIRE(same_bits(m.scale<fp8_e4m3>(1e-40f), e4m3_max / 0.3f / 2.f));
}

TEST_CASE("delayed scaling, max over a history of 3: scripted sequence", "[train][fp8]") {
  fp8_meta<delayed_scaling> m{{.history_len = 3, .amax_algo = amax_algorithm::max, .margin = 0}};
  REQUIRE(m.scale<fp8_e4m3>() == 1.f); // nothing recorded: scale 1
  // The current amax is ignored by delayed scaling.
  REQUIRE(m.scale<fp8_e4m3>(2.f) == 1.f);

  // Script: amax recorded per step, and the max over the last 3 entries that the scale after
  // that step must come from (worked by hand).
  struct step {
    float amax;
    float window_max; // max of the last <= 3 recorded amaxes
  };
  const std::vector<step> script = {
      {2.f, 2.f},     // [2]
      {8.f, 8.f},     // [2, 8]
      {1.f, 8.f},     // [2, 8, 1]
      {0.5f, 8.f},    // [8, 1, 0.5]
      {0.25f, 1.f},   // [1, 0.5, 0.25]: 8 left the window
      {0.75f, 0.75f}, // [0.5, 0.25, 0.75]
      {0.1f, 0.75f},  // [0.25, 0.75, 0.1]
      {0.1f, 0.75f},  // [0.75, 0.1, 0.1]
      {0.2f, 0.2f},   // [0.1, 0.1, 0.2]
  };
  for (std::size_t k = 0; k < script.size(); ++k) {
    INFO("step " << k << ", recorded amax " << script[k].amax);
    m.record(script[k].amax);
    REQUIRE(m.scale_amax() == script[k].window_max);
    REQUIRE(same_bits(m.scale<fp8_e4m3>(), e4m3_max / script[k].window_max / 1.f));
    REQUIRE(same_bits(m.scale<fp8_e5m2>(), e5m2_max / script[k].window_max / 1.f));
    REQUIRE(m.history_size() == std::min<std::size_t>(k + 1, 3));
  }
  // Values by hand for two of the steps: 448 / 8 = 56, 448 / 0.75 = 597.33..
  fp8_meta<delayed_scaling> m2{{.history_len = 3}};
  m2.record(2.f);
  m2.record(8.f);
  REQUIRE(m2.scale<fp8_e4m3>() == 56.f);
  REQUIRE(m2.scale<fp8_e5m2>() == 7168.f); // 57344 / 8
  REQUIRE(m2.history() == std::vector<float>{2.f, 8.f});
}

TEST_CASE("delayed scaling, most_recent with a margin", "[train][fp8]") {
  fp8_meta<delayed_scaling> m{
      {.history_len = 4, .amax_algo = amax_algorithm::most_recent, .margin = 2}};
  const std::vector<float> amaxes = {4.f, 16.f, 1.f, 0.5f, 3.f, 7.f};
  for (const float a : amaxes) {
    m.record(a);
    // margin 2: 448 / a / 4. E.g. a = 4 -> 28, a = 16 -> 7, a = 1 -> 112.
    REQUIRE(same_bits(m.scale<fp8_e4m3>(), e4m3_max / a / 4.f));
  }
  m.record(4.f);
  REQUIRE(m.scale<fp8_e4m3>() == 28.f);
  m.record(16.f);
  REQUIRE(m.scale<fp8_e4m3>() == 7.f);
  // The history keeps the last 4, oldest first.
  REQUIRE(m.history() == std::vector<float>{3.f, 7.f, 4.f, 16.f});
}

TEST_CASE("delayed scaling: zero / inf / NaN amax keeps the previous scale", "[train][fp8]") {
  SECTION("most_recent: a bad entry is skipped, the next good one is used") {
    fp8_meta<delayed_scaling> m{{.history_len = 2, .amax_algo = amax_algorithm::most_recent}};
    m.record(7.f);
    REQUIRE(m.scale<fp8_e4m3>() == 64.f); // 448 / 7
    for (const float bad : {0.f, inf, qnan}) {
      m.record(bad);
      REQUIRE(m.scale<fp8_e4m3>() == 64.f);
    }
    m.record(14.f);
    REQUIRE(m.scale<fp8_e4m3>() == 32.f); // 448 / 14
  }
  SECTION("max: an inf holds the scale until it leaves the window") {
    fp8_meta<delayed_scaling> m{{.history_len = 3}};
    m.record(7.f);
    REQUIRE(m.scale<fp8_e4m3>() == 64.f);
    m.record(inf); // [7, inf] -> inf: unusable, keep 448 / 7
    REQUIRE(m.scale<fp8_e4m3>() == 64.f);
    m.record(1.f); // [7, inf, 1]
    REQUIRE(m.scale<fp8_e4m3>() == 64.f);
    m.record(2.f); // [inf, 1, 2]
    REQUIRE(m.scale<fp8_e4m3>() == 64.f);
    m.record(3.5f); // [1, 2, 3.5]: inf gone, 448 / 3.5 = 128
    REQUIRE(m.scale<fp8_e4m3>() == 128.f);
  }
  SECTION("max: a NaN anywhere in the window holds the scale as well") {
    fp8_meta<delayed_scaling> m{{.history_len = 2}};
    m.record(14.f);
    m.record(qnan); // [14, NaN]
    REQUIRE(m.scale<fp8_e4m3>() == 32.f);
    m.record(56.f); // [NaN, 56]: NaN still inside
    REQUIRE(m.scale<fp8_e4m3>() == 32.f);
    m.record(28.f);                      // [56, 28]
    REQUIRE(m.scale<fp8_e4m3>() == 8.f); // 448 / 56
  }
  SECTION("all zeros from the start: scale stays 1") {
    fp8_meta<delayed_scaling> m{{.history_len = 2}};
    m.record(0.f);
    m.record(0.f);
    m.record(0.f);
    REQUIRE(m.scale<fp8_e5m2>() == 1.f);
  }
}

TEST_CASE("delayed scaling: history length 1 is most-recent, a long history remembers",
          "[train][fp8]") {
  fp8_meta<delayed_scaling> one{{.history_len = 1}};
  fp8_meta<delayed_scaling> longer{{.history_len = 1000}};
  float running_max = 0.f;
  for (int k = 0; k < 2500; ++k) {
    // A deterministic, non-monotone amax sequence: 1 + (k * 37 mod 101) / 8.
    const float a = 1.f + static_cast<float>((k * 37) % 101) / 8.f;
    one.record(a);
    longer.record(a);
    REQUIRE(one.scale_amax() == a);
    // Every value of the sequence repeats within 101 steps, so once 101 entries are in the
    // window its max is the sequence's max, 1 + 100 / 8.
    running_max = std::max(running_max, a);
    REQUIRE(longer.scale_amax() == running_max);
  }
  REQUIRE(running_max == 1.f + 100.f / 8.f);
  REQUIRE(longer.history_size() == 1000);
  REQUIRE(longer.history().size() == 1000);
}

TEST_CASE("fp8_meta: restore round-trips, bad recipes and states are refused", "[train][fp8]") {
  fp8_meta<delayed_scaling> a{{.history_len = 4}};
  for (const float x : {1.f, 5.f, 2.f, 3.f, 4.f, 0.5f}) a.record(x);
  fp8_meta<delayed_scaling> b{{.history_len = 4}};
  b.restore(a.history(), a.scale_amax());
  REQUIRE(b.history() == a.history());
  REQUIRE(b.scale_amax() == a.scale_amax());
  // Identical behaviour from here on.
  for (const float x : {0.25f, 0.125f, 9.f, 0.f, 0.f, 0.f, 0.f}) {
    a.record(x);
    b.record(x);
    REQUIRE(same_bits(a.scale<fp8_e4m3>(), b.scale<fp8_e4m3>()));
  }

  const auto before = b.history();
  REQUIRE_THROWS_AS(b.restore(std::vector<float>(5, 1.f), 1.f), value_error);
  REQUIRE_THROWS_AS(b.restore({1.f}, inf), value_error);
  REQUIRE(b.history() == before); // unchanged on refusal
  REQUIRE_THROWS_AS(fp8_meta<delayed_scaling>({.history_len = 0}), value_error);
  REQUIRE_THROWS_AS(fp8_meta<current_scaling>({.margin = -1}), value_error);
  fp8_meta<current_scaling> c;
  REQUIRE_THROWS_AS(c.restore({1.f}, 1.f), value_error);
  c.restore({}, 2.f);
  REQUIRE(c.scale<fp8_e4m3>(0.f) == 224.f); // 448 / 2
}

TEST_CASE("fp8_meta: deferred records keep the step's scale, commit records one amax",
          "[train][fp8]") {
  fp8_meta<delayed_scaling> meta{{.history_len = 4}};
  meta.record(2.f); // not deferred: one entry, scale from amax 2
  const float s0 = meta.scale<fp8_e4m3>();
  meta.defer_records(true);
  CHECK(meta.defers_records());
  CHECK(!meta.has_pending());
  meta.record(3.f);
  meta.record(5.f);
  meta.record(4.f);
  // Nothing recorded yet: the history and the scale are the step's start.
  CHECK(meta.history() == std::vector<float>{2.f});
  CHECK(meta.scale<fp8_e4m3>() == s0);
  CHECK(meta.has_pending());
  CHECK(meta.pending_amax() == 5.f);
  meta.commit(6.f); // e.g. the pending 5 max-reduced with another rank's 6
  CHECK(!meta.has_pending());
  CHECK(meta.history() == std::vector<float>{2.f, 6.f});
  CHECK(meta.scale_amax() == 6.f);
  // The same as a plain record of the whole tensor's amax.
  fp8_meta<delayed_scaling> plain{{.history_len = 4}};
  plain.record(2.f);
  plain.record(6.f);
  CHECK(meta.scale<fp8_e4m3>() == plain.scale<fp8_e4m3>());
  // A NaN among the deferred amaxes wins (as the whole tensor's amax would be NaN).
  meta.record(1.f);
  meta.record(std::numeric_limits<float>::quiet_NaN());
  meta.record(7.f);
  CHECK(std::isnan(meta.pending_amax()));
  // restore() forgets the pending amax.
  meta.restore({2.f}, 2.f);
  CHECK(!meta.has_pending());
  // Current scaling: the deferred amax becomes the fallback only at commit.
  fp8_meta<current_scaling> cur;
  cur.defer_records(true);
  cur.record(8.f);
  CHECK(cur.scale_amax() == 0.f);
  cur.commit(cur.pending_amax());
  CHECK(cur.scale_amax() == 8.f);
}

TEST_CASE("fp8_meta: an installed amax reduction gives current_amax the whole tensor's amax",
          "[train][fp8]") {
  fp8_meta<current_scaling> meta;
  CHECK(meta.current_amax(3.f) == 3.f); // no reduction: the slice's own
  // A stand-in for the ranks that share the tensor: the other slice's amax is 5.
  float other = 5.f;
  int calls = 0;
  struct context {
    float* other;
    int* calls;
  } ctx{&other, &calls};
  meta.reduce_current_amax_with(
      [](void* c, float amax) {
        auto& x = *static_cast<context*>(c);
        ++*x.calls;
        return amax > *x.other ? amax : *x.other;
      },
      &ctx);
  CHECK(meta.current_amax(3.f) == 5.f);
  CHECK(meta.current_amax(9.f) == 9.f);
  CHECK(calls == 2);
  // The scale is the one of the reduced amax, as for the single process's whole tensor.
  CHECK(meta.scale<fp8_e4m3>(meta.current_amax(3.f)) == meta.scale<fp8_e4m3>(5.f));
  // Copies (checkpoint staging, nn::Recompute's save and restore) keep it; null removes it.
  const fp8_meta<current_scaling> copy = meta;
  CHECK(copy.current_amax(1.f) == 5.f);
  meta.reduce_current_amax_with(nullptr, nullptr);
  CHECK(meta.current_amax(1.f) == 1.f);
}
