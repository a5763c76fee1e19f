// nn::CausalSelfAttention (nn/attention.hpp), the tiled online-softmax core with its
// projections, against the naive double reference of tests/support/naive_attention.hpp
// (materialised scores):
//  - forward and backward (dx and all four parameter gradients) over odd shapes: t = 1, 2, 7,
//    33, 130 with tiles of 16, 32 and 64 rows, H = 1, 3, 4, batch 1 and 3;
//  - the reference's own backward against central differences of its forward (double), and
//    the layer's gradients against finite differences of the layer (fp32);
//  - the causal property: changing later tokens leaves earlier outputs bit for bit unchanged;
//  - decode with the key/value cache equal to the full forward, token by token and after a
//    prompt fed whole; its errors;
//  - bf16 compute precision within a stated tolerance of fp32;
//  - a GPT block (two Residuals in a Sequential) runs and its input gradient matches finite
//    differences.
//
// Tolerance against the double reference: each output is a chain of fp32 sums (the QKV
// projection over D, the scores over d, the softmax and the weighted sum over <= t keys, the
// output projection over D), so its error is within a few (D + t) u times the magnitudes
// involved (Higham eq. 3.5, u = 2^-24). We allow 8 (D + t) u of the largest |reference|
// element of the same tensor, per element. A mask off by one key moves row i by ~1/(i+1) of
// a value (> 7e-3 relative for t = 130), a wrong max or sum correction by O(1): far above it.
#include "nn_testing.hpp"

#include "support/naive_attention.hpp"

#include <tessera/nn/activation.hpp>
#include <tessera/nn/attention.hpp>
#include <tessera/nn/residual.hpp>

#include <boost/hana/at.hpp>
#include <boost/hana/length.hpp>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

static_assert(nn::Layer<nn::CausalSelfAttention<8, 2>>);
static_assert(nn::CausalSelfAttention<8, 2>::accepts<extents<dyn, dyn, 8>>);
static_assert(!nn::CausalSelfAttention<8, 2>::accepts<extents<dyn, 8>>);
static_assert(std::is_same_v<nn::CausalSelfAttention<8, 2>::output_extents<extents<dyn, dyn, 8>>,
                             extents<dyn, dyn, 8>>);
static_assert(nn::layer_traits<nn::CausalSelfAttention<8, 2>>::declares_flops<extents<dyn, 4, 8>>);
static_assert(
    !nn::layer_traits<nn::CausalSelfAttention<8, 2>>::declares_flops<extents<dyn, dyn, 8>>);
// 8 t D^2 + 2 t (t + 1) D with t = 4, D = 8.
static_assert(nn::layer_traits<nn::CausalSelfAttention<8, 2>>::forward_flops<extents<dyn, 4, 8>> ==
              8.0 * 4 * 64 + 2.0 * 4 * 5 * 8);

/// |got - want| <= extra[i] + rel * max|want| element by element: `extra` a rounding bound
/// that depends on the terms of the element's sum, not on the largest result.
void check_within(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                  const std::vector<double>& extra, double rel) {
  REQUIRE(got.size() == want.size());
  REQUIRE(extra.size() == want.size());
  double mx = 0;
  for (double w : want) mx = std::max(mx, std::abs(w));
  int bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(got[i] - want[i]), tol = extra[i] + rel * mx + 1e-30;
    worst = std::max(worst, e);
    if (!(e <= tol) && bad++ < 5)
      FAIL_CHECK(what << "[" << i << "]: " << got[i] << " vs reference " << want[i] << " (tol "
                      << tol << ")");
  }
  INFO(what << ": worst error " << worst << " of max " << mx);
  CHECK(bad == 0);
}

/// check_within with no per-element allowance: rel of the largest reference element.
void check_close(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                 double rel) {
  check_within(what, got, want, std::vector<double>(want.size(), 0.0), rel);
}

template <index_t D, index_t H, class Prec = fp32>
naive_attention reference_of(nn::CausalSelfAttention<D, H, Prec>& a, index_t B, index_t t) {
  return naive_attention{int(B),
                         int(t),
                         int(D),
                         int(H),
                         to_doubles(a.qkv().weight().value),
                         to_doubles(a.qkv().bias().value),
                         to_doubles(a.proj().weight().value),
                         to_doubles(a.proj().bias().value),
                         {},
                         {},
                         {},
                         {}};
}

template <index_t D, index_t H>
void against_naive(index_t B, index_t t, index_t tile, std::uint64_t seed, double x_range = 1) {
  INFO("D " << D << ", H " << H << ", B " << B << ", t " << t << ", tile " << tile);
  nn::CausalSelfAttention<D, H> attn(seed);
  attn.set_tile(tile);
  auto ref = reference_of(attn, B, t);
  const auto xv = uniform_values(std::size_t(B * t * D), seed + 1, -x_range, x_range);
  const auto x = tensor_from<fp32>(xv, extents<dyn, dyn, D>(B, t));
  const double rel = 8.0 * double(D + t) * u32;
  const auto y = attn.forward(exec_space(), x);
  check_close("y", to_doubles(y), ref.forward(xv), rel);
  const auto r = uniform_values(std::size_t(B * t * D), seed + 2);
  const auto dx = to_doubles(attn.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  const auto g = ref.backward(r);
  check_close("dx", dx, g.dx, rel);
  check_close("dWqkv", to_doubles(attn.qkv().weight().grad), g.dwqkv, rel);
  check_close("dbqkv", to_doubles(attn.qkv().bias().grad), g.dbqkv, rel);
  check_close("dWo", to_doubles(attn.proj().weight().grad), g.dwo, rel);
  check_close("dbo", to_doubles(attn.proj().bias().grad), g.dbo, rel);
}

} // namespace

TEST_CASE("CausalSelfAttention: forward and backward match the naive reference over odd shapes",
          "[nn][attention]") {
  for (const index_t t : {1, 2, 7, 33, 130})
    for (const index_t tile : {16, 32, 64}) {
      against_naive<12, 1>(1, t, tile, 100 + std::uint64_t(t));
      against_naive<12, 3>(3, t, tile, 200 + std::uint64_t(t));
      against_naive<12, 4>(3, t, tile, 300 + std::uint64_t(t));
    }
  // The GPT's width and heads (head dim 32), and peaked softmax rows (x in +-4).
  against_naive<128, 4>(2, 130, 64, 400);
  against_naive<16, 4>(3, 33, 32, 401, 4.0);
  against_naive<16, 2>(1, 70, 7, 402); // a tile that divides nothing
}

TEST_CASE("CausalSelfAttention: the naive reference's backward is the derivative of its forward",
          "[nn][attention]") {
  const int B = 2, t = 5, D = 6;
  nn::CausalSelfAttention<6, 2> attn(9);
  auto ref = reference_of(attn, B, t);
  auto xv = uniform_values(std::size_t(B * t * D), 10, -2, 2);
  const auto r = uniform_values(std::size_t(B * t * D), 11);
  ref.forward(xv);
  const auto g = ref.backward(r);
  const auto loss = [&](const std::vector<double>& x) {
    auto copy = ref;
    const auto y = copy.forward(x);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  };
  // Central differences in double, h = 1e-5: truncation ~h^2 |L'''| ~ 1e-9, rounding
  // ~1e-16 / 1e-5 = 1e-11.
  const double h = 1e-5;
  const auto fd = [&](std::vector<double>& v, std::size_t i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double lp = loss(xv);
    v[i] = keep - h;
    const double lm = loss(xv);
    v[i] = keep;
    return (lp - lm) / (2 * h);
  };
  for (std::size_t i = 0; i < xv.size(); ++i) CHECK(std::abs(fd(xv, i) - g.dx[i]) < 1e-7);
  for (std::size_t i = 0; i < ref.wqkv.size(); i += 3)
    CHECK(std::abs(fd(ref.wqkv, i) - g.dwqkv[i]) < 1e-7);
  for (std::size_t i = 0; i < ref.bqkv.size(); ++i)
    CHECK(std::abs(fd(ref.bqkv, i) - g.dbqkv[i]) < 1e-7);
  for (std::size_t i = 0; i < ref.wo.size(); i += 2)
    CHECK(std::abs(fd(ref.wo, i) - g.dwo[i]) < 1e-7);
}

TEST_CASE("CausalSelfAttention: gradients match finite differences of the fp32 layer",
          "[nn][attention]") {
  nn::CausalSelfAttention<8, 2> attn(21);
  attn.set_tile(2);
  const index_t B = 2, t = 5;
  auto x =
      tensor_from<fp32>(uniform_values(std::size_t(B * t * 8), 22), extents<dyn, dyn, 8>(B, t));
  const auto y = attn.forward(exec_space(), x);
  const auto r = uniform_values(std::size_t(y.size()), 23);
  const auto dx = to_host(attn.backward(exec_space(), tensor_from<fp32>(r, y.extents())));
  const auto gq = to_host(attn.qkv().weight().grad);
  const auto gqb = to_host(attn.qkv().bias().grad);
  const auto go = to_host(attn.proj().weight().grad);
  const auto loss = [&] { return dot(attn.forward(exec_space(), x), r); };
  // h = 1e-2: the softmax's curvature gives truncation h^2/6 |L'''| <~ 1e-4 for these O(1)
  // scores; fp32 rounding of L (80 outputs of ~10 roundings each) over 2h ~ 1e-5.
  check_tensor_gradient("dx", x, dx, loss, 0.01f, 3e-4, 24, 1e-3);
  check_tensor_gradient("qkv.weight", attn.qkv().weight().value, gq, loss, 0.01f, 3e-4, 25, 1e-3);
  check_tensor_gradient("qkv.bias", attn.qkv().bias().value, gqb, loss, 0.01f, 3e-4, 26, 1e-3);
  check_tensor_gradient("proj.weight", attn.proj().weight().value, go, loss, 0.01f, 3e-4, 27, 1e-3);
  // Named parameters, in order.
  const auto p = attn.parameters();
  static_assert(decltype(boost::hana::length(p))::value == 4);
  CHECK(boost::hana::at_c<0>(p).name == "qkv.weight");
  CHECK(boost::hana::at_c<3>(p).name == "proj.bias");
}

TEST_CASE("CausalSelfAttention: a later token never changes an earlier output", "[nn][attention]") {
  const index_t B = 3, t = 41;
  nn::CausalSelfAttention<16, 4> attn(31);
  attn.set_tile(16);
  auto xv = uniform_values(std::size_t(B * t * 16), 32);
  const auto y0 =
      to_doubles(attn.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, dyn, 16>(B, t))));
  for (const index_t p : {index_t(0), index_t(17), t - 1}) {
    auto x2 = xv;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = p; i < t; ++i)
        for (index_t c = 0; c < 16; ++c) x2[std::size_t((b * t + i) * 16 + c)] += 0.5;
    const auto y2 =
        to_doubles(attn.forward(exec_space(), tensor_from<fp32>(x2, extents<dyn, dyn, 16>(B, t))));
    int changed_before = 0, changed_at = 0;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < t; ++i)
        for (index_t c = 0; c < 16; ++c) {
          const std::size_t k = std::size_t((b * t + i) * 16 + c);
          if (y2[k] != y0[k]) (i < p ? changed_before : changed_at)++;
        }
    CHECK(changed_before == 0);
    CHECK(changed_at > 0); // the test can see a change
  }
}

TEST_CASE("CausalSelfAttention::decode: the key/value cache gives the full forward's outputs",
          "[nn][attention]") {
  const index_t B = 3, t = 37;
  constexpr index_t D = 32;
  nn::CausalSelfAttention<D, 4> attn(41);
  attn.set_tile(16);
  const auto xv = uniform_values(std::size_t(B * t * D), 42);
  const auto full =
      to_doubles(attn.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, dyn, D>(B, t))));
  const auto rows = [&](index_t from, index_t n) { // x[:, from:from+n, :]
    std::vector<double> v;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = from; i < from + n; ++i)
        for (index_t c = 0; c < D; ++c) v.push_back(xv[std::size_t((b * t + i) * D + c)]);
    return tensor_from<fp32>(v, extents<dyn, dyn, D>(B, n));
  };
  const double rel = 8.0 * double(D + t) * u32;
  const auto compare = [&](const std::vector<double>& got, index_t from, index_t n) {
    std::vector<double> want;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = from; i < from + n; ++i)
        for (index_t c = 0; c < D; ++c) want.push_back(full[std::size_t((b * t + i) * D + c)]);
    check_close("decode", got, want, rel);
  };
  SECTION("token by token") {
    nn::CausalSelfAttention<D, 4>::cache c(B, t);
    for (index_t p = 0; p < t; ++p) {
      INFO("position " << p);
      compare(to_doubles(attn.decode(exec_space(), rows(p, 1), c)), p, 1);
      CHECK(c.length() == p + 1);
    }
    CHECK_THROWS_AS(attn.decode(exec_space(), rows(0, 1), c), shape_error); // full
    c.reset();
    compare(to_doubles(attn.decode(exec_space(), rows(0, 1), c)), 0, 1);
  }
  SECTION("a prompt fed whole, then the last token") {
    nn::CausalSelfAttention<D, 4>::cache c(B, t + 5);
    compare(to_doubles(attn.decode(exec_space(), rows(0, t - 1), c)), 0, t - 1);
    compare(to_doubles(attn.decode(exec_space(), rows(t - 1, 1), c)), t - 1, 1);
    nn::CausalSelfAttention<D, 4>::cache other(B + 1, t);
    CHECK_THROWS_AS(attn.decode(exec_space(), rows(0, 1), other), shape_error);
    // decode leaves no forward state: backward needs a forward first.
    CHECK_THROWS_AS(attn.backward(exec_space(), rows(0, 1)), value_error);
  }
}

TEST_CASE("CausalSelfAttention: bf16 compute precision within tolerance of fp32",
          "[nn][attention]") {
  const index_t B = 2, t = 33;
  constexpr index_t D = 32;
  nn::CausalSelfAttention<D, 4> a32(51);
  nn::CausalSelfAttention<D, 4, bf16> a16(51); // same seed: the same fp32 masters
  CHECK(to_doubles(a32.qkv().weight().value) == to_doubles(a16.qkv().weight().value));
  const auto xv = uniform_values(std::size_t(B * t * D), 52);
  const auto y32 = a32.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, dyn, D>(B, t)));
  const auto y16 = a16.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, dyn, D>(B, t)));
  static_assert(std::is_same_v<typename decltype(y16)::precision, bf16>);
  // bf16 rounds x, the weights, qkv, o and y (u = 2^-9 each, relative) and the products sum
  // in fp32: a few percent of the largest output at most. We allow 3%; a core that dropped
  // the softmax normalisation or a head would be off by O(100%).
  check_close("y bf16", to_doubles(y16), to_doubles(y32), 0.03);
  const auto r = uniform_values(std::size_t(B * t * D), 53);
  const auto d32 = to_doubles(a32.backward(exec_space(), tensor_from<fp32>(r, y32.extents())));
  const auto d16 = to_doubles(a16.backward(exec_space(), tensor_from<bf16>(r, y16.extents())));
  check_close("dx bf16", d16, d32, 0.03);
  check_close("dWqkv bf16", to_doubles(a16.qkv().weight().grad),
              to_doubles(a32.qkv().weight().grad), 0.03);
}

namespace {

/// The bf16 core (nn::detail::tiled_attention_core with bf16 activations) on qkv (B, t, 3W) and
/// dO (B, t, W) in bf16, against the core's definition in double on the same (exact) values:
/// o = softmax(q k^T / sqrt d, causal) v per head; dq, dk, dv from dO with D_i = rowsum(dO_i o_i)
/// over the core's own (bf16-rounded) o, as the core computes it. o is rounded to bf16 once
/// (2^-9 relative), so it is compared to 2^-8 of its largest element; dqkv is fp32 sums of
/// at most d + t terms per chain: 16 (d + t) u of the largest element of each block. Where the
/// core keeps k and v as key pairs (P V and dS K on VDPBF16PS), P and dS are rounded to bf16
/// (2^-9 relative) before those products: o and dq are also allowed 2^-8 of the sum of their
/// terms' magnitudes (sum_j p_j |v_j|, sum_j |ds_j k_j| / sqrt d).
template <index_t W, index_t NH>
void core_against_double(index_t B, index_t t, index_t tile, bool dot, std::uint64_t seed) {
  constexpr index_t d = W / NH;
  using core_t = nn::detail::tiled_attention_core<W, NH, bf16>;
  INFO("W " << W << ", heads " << NH << ", B " << B << ", t " << t << ", tile " << tile
            << ", dot products " << dot << ", paired " << core_t::paired);
  core_t core;
  core.set_tile(tile, "test");
  core.set_dot_products(dot);
  const auto qkv_v = to_doubles(tensor_from<bf16>(uniform_values(std::size_t(B * t * 3 * W), seed),
                                                  extents<dyn>(B * t * 3 * W)));
  const auto g_v = to_doubles(
      tensor_from<bf16>(uniform_values(std::size_t(B * t * W), seed + 1), extents<dyn>(B * t * W)));
  const auto qkv = tensor_from<bf16>(qkv_v, extents<dyn>(B * t * 3 * W));
  const auto g = tensor_from<bf16>(g_v, extents<dyn>(B * t * W));
  Tensor<bf16, extents<dyn>> o("o", B * t * W);
  Tensor<fp32, extents<dyn>> dqkv("dqkv", B * t * 3 * W);
  core.forward(exec_space(), qkv.data(), B, t, o.data());
  // Key pairs exactly where they can be used (the condition of uses_key_pairs).
  const bool pairs = core.dot_products() && core_t::key_pairs_possible && tile % 2 == 0;
  CHECK(core.key_pairs() == pairs);
  core.backward(exec_space(), g.data(), o.data(), B, t, dqkv.data());
  const auto o_got = to_doubles(o), d_got = to_doubles(dqkv);

  std::vector<double> o_ref(o_got.size()), d_ref(d_got.size(), 0.0);
  std::vector<double> o_abs(o_got.size(), 0.0), d_abs(d_got.size(), 0.0);
  const double scale = 1 / std::sqrt(double(d));
  const auto at = [&](index_t b, index_t i, index_t c, index_t width) {
    return std::size_t((b * t + i) * width + c);
  };
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < NH; ++h) {
      const auto q = [&](index_t i, index_t e) { return qkv_v[at(b, i, h * d + e, 3 * W)]; };
      const auto k = [&](index_t i, index_t e) { return qkv_v[at(b, i, W + h * d + e, 3 * W)]; };
      const auto v = [&](index_t i, index_t e) {
        return qkv_v[at(b, i, 2 * W + h * d + e, 3 * W)];
      };
      for (index_t i = 0; i < t; ++i) {
        std::vector<double> p(std::size_t(i + 1));
        double m = -1e300, z = 0;
        for (index_t j = 0; j <= i; ++j) {
          double sc = 0;
          for (index_t e = 0; e < d; ++e) sc += q(i, e) * k(j, e);
          p[std::size_t(j)] = sc * scale;
          m = std::max(m, p[std::size_t(j)]);
        }
        for (auto& x : p) z += (x = std::exp(x - m));
        for (auto& x : p) x /= z;
        double di = 0;
        for (index_t e = 0; e < d; ++e) {
          double acc = 0;
          double mag = 0;
          for (index_t j = 0; j <= i; ++j) {
            acc += p[std::size_t(j)] * v(j, e);
            mag += p[std::size_t(j)] * std::abs(v(j, e));
          }
          o_ref[at(b, i, h * d + e, W)] = acc;
          o_abs[at(b, i, h * d + e, W)] = mag;
          di += g_v[at(b, i, h * d + e, W)] * o_got[at(b, i, h * d + e, W)];
        }
        for (index_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (index_t e = 0; e < d; ++e) dp += g_v[at(b, i, h * d + e, W)] * v(j, e);
          const double pj = p[std::size_t(j)], ds = pj * (dp - di);
          for (index_t e = 0; e < d; ++e) {
            d_ref[at(b, i, h * d + e, 3 * W)] += ds * k(j, e) * scale;
            d_abs[at(b, i, h * d + e, 3 * W)] += std::abs(ds * k(j, e)) * scale;
            d_ref[at(b, j, W + h * d + e, 3 * W)] += ds * q(i, e) * scale;
            d_ref[at(b, j, 2 * W + h * d + e, 3 * W)] += pj * g_v[at(b, i, h * d + e, W)];
          }
        }
      }
    }
  const double in_pairs = pairs ? 1.0 / 256 : 0.0; // 2^-8 of the terms' magnitudes
  for (auto& x : o_abs) x *= in_pairs;
  check_within("o", o_got, o_ref, o_abs, 1.0 / 256);
  // dq, dk and dv separately (their magnitudes differ).
  for (index_t part = 0; part < 3; ++part) {
    std::vector<double> got, want, extra;
    for (index_t r = 0; r < B * t; ++r)
      for (index_t c = 0; c < W; ++c) {
        const auto at_rc = std::size_t(r * 3 * W + part * W + c);
        got.push_back(d_got[at_rc]);
        want.push_back(d_ref[at_rc]);
        extra.push_back(part == 0 ? d_abs[at_rc] * in_pairs : 0.0);
      }
    check_within(part == 0   ? "dq"
                 : part == 1 ? "dk"
                             : "dv",
                 got, want, extra, 16.0 * double(d + t) * u32);
  }
}

} // namespace

TEST_CASE("The bf16 attention core (VDPBF16PS and widening paths) against its definition in "
          "double",
          "[nn][attention]") {
  for (const bool dot : {true, false})
    for (const index_t t : {1, 7, 33, 130})
      for (const index_t tile : {7, 16, 64}) { // 7: no key pairs (tiles start off a pair)
        core_against_double<64, 2>(2, t, tile, dot, 500 + std::uint64_t(t)); // d 32, paired
        core_against_double<16, 2>(1, t, tile, dot, 600 + std::uint64_t(t)); // d 8, paired
        core_against_double<12, 4>(2, t, tile, dot, 700 + std::uint64_t(t)); // d 3, not paired
      }
  core_against_double<128, 4>(2, 128, 64, true, 800); // the GPT's head width
  static_assert(nn::detail::tiled_attention_core<64, 2, bf16>::paired);
  static_assert(!nn::detail::tiled_attention_core<12, 4, bf16>::paired);
  static_assert(!nn::detail::tiled_attention_core<64, 2, fp32>::paired);
}

TEST_CASE("CausalSelfAttention: errors", "[nn][attention]") {
  nn::CausalSelfAttention<8, 2> attn(1);
  CHECK_THROWS_AS(attn.forward(exec_space(), Tensor<fp32, dextents<3>>("x", 2, 3, 7)), shape_error);
  CHECK_THROWS_AS(attn.backward(exec_space(), Tensor<fp32, extents<dyn, dyn, 8>>("dy", 2, 3)),
                  value_error);
  (void)attn.forward(exec_space(), Tensor<fp32, extents<dyn, dyn, 8>>("x", 2, 3));
  CHECK_THROWS_AS(attn.backward(exec_space(), Tensor<fp32, extents<dyn, dyn, 8>>("dy", 2, 4)),
                  shape_error);
  CHECK_THROWS_AS(attn.set_tile(0), value_error);
  using cache = nn::CausalSelfAttention<8, 2>::cache;
  CHECK_THROWS_AS(cache(0, 4), value_error);
}

TEST_CASE("A GPT block: Residual<LayerNorm, attention> and Residual<LayerNorm, MLP> in a "
          "Sequential",
          "[nn][attention]") {
  constexpr index_t D = 16;
  using Block = nn::Sequential<
      nn::Residual<nn::LayerNorm<D>, nn::CausalSelfAttention<D, 4>>,
      nn::Residual<nn::LayerNorm<D>, nn::Linear<D, 4 * D>, nn::GELU, nn::Linear<4 * D, D>>>;
  static_assert(std::is_same_v<Block::output_extents<extents<dyn, dyn, D>>, extents<dyn, dyn, D>>);
  Block block(61);
  const index_t B = 2, t = 6;
  auto x =
      tensor_from<fp32>(uniform_values(std::size_t(B * t * D), 62), extents<dyn, dyn, D>(B, t));
  const auto y = block.forward(exec_space(), x);
  const auto r = uniform_values(std::size_t(y.size()), 63);
  const auto dx = to_host(block.backward(exec_space(), tensor_from<fp32>(r, y.extents()), true));
  const auto gw = to_host(block.layer<0>().layer<1>().qkv().weight().grad);
  const auto loss = [&] { return dot(block.forward(exec_space(), x), r); };
  // As the attention's own check; LayerNorm's curvature adds to the truncation.
  check_tensor_gradient("block dx", x, dx, loss, 0.01f, 1e-3, 64, 2e-3);
  check_tensor_gradient("attention qkv.weight", block.layer<0>().layer<1>().qkv().weight().value,
                        gw, loss, 0.01f, 1e-3, 65, 2e-3);
}

TEST_CASE("CausalSelfAttention: fp8 (hybrid) projections run and stay near fp32",
          "[nn][attention]") {
  const index_t B = 2, t = 17;
  constexpr index_t D = 32;
  nn::CausalSelfAttention<D, 4> a32(71);
  nn::CausalSelfAttention<D, 4, nn::fp8<>> a8(71);
  const auto xv = uniform_values(std::size_t(B * t * D), 72);
  const auto y32 = a32.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, dyn, D>(B, t)));
  const auto y8 = a8.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, dyn, D>(B, t)));
  // E4M3 keeps 3 mantissa bits (u = 2^-4) on x, the weights and o: the outputs move by up to
  // ~20% of the largest one; a broken core (no normalisation, a lost head) by far more.
  check_close("y fp8", to_doubles(y8), to_doubles(y32), 0.2);
  const auto r = uniform_values(std::size_t(B * t * D), 73);
  const auto dx8 = to_doubles(a8.backward(
      exec_space(), tensor_from<typename decltype(a8)::activation_precision>(r, y8.extents())));
  const auto dx32 = to_doubles(a32.backward(exec_space(), tensor_from<fp32>(r, y32.extents())));
  check_close("dx fp8", dx8, dx32, 0.3);
  CHECK(decltype(boost::hana::length(a8.fp8_states()))::value == 6);
}
