// Fuzz target: the argument checks of tessera::gemm and of conv2d_forward / backward_data /
// backward_weight, and the answers behind them. Bytes decode an operation, small shapes,
// strides (negative and zero included), view offsets, padding, dilation, groups, deliberate
// shape mismatches and, for gemm, C sharing A's memory. Every operand is a strided view into a
// buffer of its own (or a shared one) that is larger than the view, filled with small integers
// (so every exact result is representable and any summation order gives it).
//
// Properties, for every call:
// - it returns or throws a tessera::error (nothing else, no out-of-bounds access);
// - an invalid call (by the rules stated independently below) throws;
// - a call that throws leaves every buffer as it was;
// - a call that returns has written exactly the reference result into the output's elements
//   (tests/support/reference_gemm.hpp, reference_conv.hpp) and nothing outside them.
// Sizes stay below 6 per dimension so that one execution takes microseconds.
#include "fuzz_kokkos.hpp"
#include "fuzz_support.hpp"

#include "support/reference_conv.hpp"
#include "support/reference_gemm.hpp"

#include <tessera/conv.hpp>
#include <tessera/gemm.hpp>

#include <Kokkos_Core.hpp>

#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <set>
#include <tuple>

namespace {

using tessera::index_t;
// Host memory by design: the checks read every byte of each buffer, outside the views too.
using host = Kokkos::HostSpace;
template <std::size_t R>
using view = tessera::TensorView<tessera::fp32, tessera::dextents<R>, tessera::layout_stride, host>;

/// Reads the input byte by byte; past its end every byte is 0.
struct cursor {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t next() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  int in(int lo, int hi) { return lo + next() % (hi - lo + 1); }
  /// One of the values; a zero byte gives the first (so that zero bytes decode a valid call).
  index_t pick(std::initializer_list<index_t> v) { return v.begin()[next() % v.size()]; }
  /// True one time in one_in (never for a zero byte).
  bool flag(int one_in) { return next() % one_in == one_in - 1; }
};

/// An operand: a view of `rank` extents and strides at `offset` into a buffer (any strides; the
/// buffer is made large enough to hold every element).
template <std::size_t R>
struct operand {
  std::array<index_t, R> ext{}, str{};
  index_t offset = 0;
  /// Smallest and largest element index relative to offset.
  std::pair<index_t, index_t> span() const {
    index_t lo = 0, hi = 0;
    for (std::size_t d = 0; d < R; ++d) {
      if (ext[d] == 0) return {0, -1};
      const index_t s = (ext[d] - 1) * str[d];
      (s < 0 ? lo : hi) += s;
    }
    return {lo, hi};
  }
  /// The buffer indices of every element, row-major over the extents.
  std::vector<index_t> addresses() const {
    index_t count = 1;
    for (auto e : ext) count *= e;
    std::vector<index_t> a;
    a.reserve(static_cast<std::size_t>(count));
    std::array<index_t, R> i{};
    for (index_t k = 0; k < count; ++k) {
      index_t at = offset;
      for (std::size_t d = 0; d < R; ++d) at += i[d] * str[d];
      a.push_back(at);
      for (std::size_t d = R; d-- > 0;)
        if (++i[d] < ext[d])
          break;
        else
          i[d] = 0;
    }
    return a;
  }
  view<R> make(std::vector<float>& buf) const {
    const auto e = std::apply([](auto... x) { return tessera::dextents<R>(x...); }, ext);
    return view<R>(buf.data() + offset, e, str);
  }
};

/// Places the operand at a fresh offset (0..3 past its lowest element) and returns the buffer
/// size it needs.
template <std::size_t R>
index_t place(operand<R>& o, cursor& c) {
  const auto [lo, hi] = o.span();
  o.offset = -lo + c.in(0, 3);
  return o.offset + std::max<index_t>(hi, 0) + 1 + c.in(0, 2);
}

/// Small integers in [-3, 3] from a seed (a linear congruential generator: any values will do).
void fill(std::vector<float>& buf, std::uint32_t seed) {
  for (auto& v : buf) {
    seed = seed * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int>((seed >> 24) % 7) - 3);
  }
}

std::vector<double> gather(const std::vector<float>& buf, const std::vector<index_t>& at) {
  std::vector<double> v;
  for (auto i : at) v.push_back(buf[static_cast<std::size_t>(i)]);
  return v;
}

/// TESSERA_FUZZ_VERBOSE=1: print each call's outcome.
bool verbose() {
  static const bool v = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  return v;
}

/// Runs call(); true if it returned, false if it threw a tessera::error.
template <class F>
bool returns(const char* op, bool valid, F&& call) {
  try {
    call();
    if (verbose())
      std::fprintf(stderr, "  %s (%s call) returned\n", op, valid ? "valid" : "invalid");
    return true;
  } catch (const tessera::error& e) {
    if (verbose())
      std::fprintf(stderr, "  %s (%s call) threw: %s\n", op, valid ? "valid" : "invalid", e.what());
    return false;
  }
}

/// After a call that returned: the output elements hold the reference (within the fp32 bound
/// for reductions of length L; integers make it exact in practice), every other element of
/// every buffer is unchanged.
void check_result(const char* op, const std::vector<float>& out, const std::vector<float>& before,
                  const std::vector<index_t>& at, const std::vector<double>& ref,
                  const std::vector<double>& abs, index_t L) {
  std::vector<char> is_out(out.size(), 0);
  const double u = 0x1p-24, lu = static_cast<double>(L) * u;
  for (std::size_t e = 0; e < at.size(); ++e) {
    const auto i = static_cast<std::size_t>(at[e]);
    is_out[i] = 1;
    const double bound = lu / (1 - lu) * abs[e] + static_cast<double>(L) * FLT_MIN;
    TESSERA_FUZZ_CHECK(std::abs(static_cast<double>(out[i]) - ref[e]) <= bound,
                       "%s: output element %zu is %g, the reference %g", op, e,
                       static_cast<double>(out[i]), ref[e]);
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    TESSERA_FUZZ_CHECK(is_out[i] || std::memcmp(&out[i], &before[i], sizeof(float)) == 0,
                       "%s wrote buffer element %zu, outside its output", op, i);
}

// ---- gemm -------------------------------------------------------------------------------------

operand<2> gemm_operand(cursor& c, index_t rows, index_t cols) {
  operand<2> o;
  o.ext = {rows, cols};
  switch (c.next() % 5) {
  case 0:
    o.str = {cols, 1};
    break; // row-major
  case 1:
    o.str = {1, rows};
    break; // column-major
  case 2:
    o.str = {cols + c.in(1, 3), 1};
    break; // row-major with padding
  case 3:
    o.str = {c.in(0, 6), c.in(0, 6)};
    break; // any non-negative strides
  default:
    o.str = {c.in(-2, 6), c.in(-2, 6)};
    break; // negative ones too
  }
  return o;
}

void fuzz_gemm(cursor& c) {
  const index_t m = c.pick({3, 1, 2, 4, 5, 0}), k = c.pick({3, 1, 2, 4, 5, 0}),
                n = c.pick({3, 1, 2, 4, 5, 0});
  const std::uint8_t wrong = c.next(); // mismatched extents, one bit each
  auto a = gemm_operand(c, m, wrong & 1 ? c.in(0, 5) : k);
  auto b = gemm_operand(c, wrong & 2 ? c.in(0, 5) : k, n);
  auto cc = gemm_operand(c, wrong & 4 ? c.in(0, 5) : m, wrong & 8 ? c.in(0, 5) : n);
  const bool c_in_a = c.flag(6); // C in A's buffer (possibly overlapping A)
  const float alphas[] = {1.f, 2.f, -1.f, 0.5f, 0.f}, betas[] = {0.f, 1.f, -2.f};
  const tessera::gemm_options opts{.alpha = alphas[c.next() % 5], .beta = betas[c.next() % 3]};
  const int algo = c.next() % 5;
  const index_t na = place(a, c), nb = place(b, c);
  index_t nc = place(cc, c);
  std::vector<float> bufa(static_cast<std::size_t>(c_in_a ? std::max(na, nc) : na)),
      bufb(static_cast<std::size_t>(nb)), bufc(static_cast<std::size_t>(c_in_a ? 0 : nc));
  fill(bufa, c.next()), fill(bufb, c.next() + 1000u), fill(bufc, c.next() + 2000u);
  std::vector<float>& cbuf = c_in_a ? bufa : bufc;
  const auto a0 = bufa, b0 = bufb, c0 = bufc;

  // The rules, stated independently: A (M, K), B (K, N), C (M, N); C's elements at distinct
  // addresses; no negative strides; C sharing no address with A or B (a stricter check, by
  // address range, may also refuse).
  const auto ca = cc.addresses(), aa = a.addresses(), ba = b.addresses();
  bool valid = a.ext[1] == b.ext[0] && cc.ext[0] == a.ext[0] && cc.ext[1] == b.ext[1];
  valid = valid && std::set<index_t>(ca.begin(), ca.end()).size() == ca.size();
  for (const auto* o : {&a, &b, &cc})
    for (std::size_t d = 0; d < 2; ++d) valid = valid && (o->ext[d] <= 1 || o->str[d] >= 0);
  if (c_in_a)
    for (auto i : ca)
      for (auto j : aa) valid = valid && i != j;

  const auto va = a.make(bufa), vb = b.make(bufb), vc = cc.make(cbuf);
  const Kokkos::DefaultHostExecutionSpace exec;
  namespace ga = tessera::gemm_algo;
  const bool ok = returns("gemm", valid, [&] {
    switch (algo) {
    case 0:
      tessera::gemm(exec, va, vb, vc, opts);
      break;
    case 1:
      tessera::gemm(ga::direct{}, exec, va, vb, vc, opts);
      break;
    case 2:
      tessera::gemm(ga::portable{}, exec, va, vb, vc, opts);
      break;
    case 3:
      tessera::gemm(ga::host_packed{}, exec, va, vb, vc, opts);
      break;
    default:
      tessera::gemm(ga::reference{}, exec, va, vb, vc, opts);
      break;
    }
  });
  if (!ok) {
    TESSERA_FUZZ_CHECK(bufa == a0 && bufb == b0 && bufc == c0, "gemm threw and changed a buffer");
    return;
  }
  TESSERA_FUZZ_CHECK(valid,
                     "gemm accepted an invalid call (M %lld, K %lld / %lld, N %lld, C (%lld, "
                     "%lld) strides (%lld, %lld), C in A's buffer: %d)",
                     (long long)m, (long long)a.ext[1], (long long)b.ext[0], (long long)n,
                     (long long)cc.ext[0], (long long)cc.ext[1], (long long)cc.str[0],
                     (long long)cc.str[1], int(c_in_a));
  tessera::testing::dmatrix da(m, a.ext[1]), db(b.ext[0], n), dc(m, n);
  da.v = gather(c_in_a ? a0 : bufa, aa);
  db.v = gather(bufb, ba);
  dc.v = gather(c_in_a ? a0 : c0, ca);
  const auto ref = tessera::testing::reference_gemm(da, db, opts.alpha, opts.beta, dc);
  TESSERA_FUZZ_CHECK(bufb == b0, "gemm changed B");
  if (!c_in_a) TESSERA_FUZZ_CHECK(bufa == a0, "gemm changed A");
  check_result("gemm", cbuf, c_in_a ? a0 : c0, ca, ref.value.v, ref.abs.v, a.ext[1] + 2);
}

// ---- conv2d -----------------------------------------------------------------------------------

/// A (d0, d1, d2, d3) activation view: images at a batch stride of d1 d2 d3 plus a gap; the
/// (H, W) planes row-major, or (one in 8) transposed, which conv refuses.
operand<4> activation(cursor& c, index_t d0, index_t d1, index_t d2, index_t d3) {
  operand<4> o;
  o.ext = {d0, d1, d2, d3};
  o.str = {d1 * d2 * d3 + c.in(0, 3), d2 * d3, d3, 1};
  if (c.flag(8)) o.str = {d1 * d2 * d3, d2 * d3, 1, d2};
  return o;
}

void fuzz_conv(cursor& c, int pass) {
  using tessera::testing::conv_shape;
  conv_shape s;
  s.N = c.pick({1, 2, 0}), s.C = c.pick({2, 1, 3, 4}), s.H = c.pick({5, 4, 3, 2, 1, 0}),
  s.W = c.pick({5, 4, 3, 2, 1, 0});
  s.K = c.pick({2, 1, 3, 4}), s.R = c.pick({3, 1, 2}), s.S = c.pick({3, 1, 2});
  auto& p = s.prm;
  p.stride_h = c.pick({1, 2, 3, 0}), p.stride_w = c.pick({1, 2, 3, 0});
  p.pad_top = c.pick({1, 0, 2, -1}), p.pad_bottom = c.pick({1, 0, 2, -1});
  p.pad_left = c.pick({1, 0, 2, -1}), p.pad_right = c.pick({1, 0, 2, -1});
  p.dilation_h = c.pick({1, 2, 0}), p.dilation_w = c.pick({1, 2, 0}), p.groups = c.pick({1, 2, 3});
  const bool bias = c.flag(2) && pass != 1; // backward_data has no bias
  const std::uint8_t wrong = c.next();
  const auto off = [&](index_t v, int bit) {
    return wrong & (1 << bit) ? std::max<index_t>(0, v + c.in(-1, 1)) : v;
  };

  // The shapes the call is meant to have, then (some bits of `wrong`) one more or one less.
  const bool params_ok = p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 &&
                         p.dilation_w >= 1 && p.pad_top >= 0 && p.pad_bottom >= 0 &&
                         p.pad_left >= 0 && p.pad_right >= 0;
  const bool fits = s.H + p.pad_top + p.pad_bottom - p.dilation_h * (s.R - 1) - 1 >= 0 &&
                    s.W + p.pad_left + p.pad_right - p.dilation_w * (s.S - 1) - 1 >= 0;
  const bool sized = params_ok && fits;
  const index_t P = sized ? s.P() : c.in(0, 3), Q = sized ? s.Q() : c.in(0, 3);
  operand<4> x = activation(c, off(s.N, 0), off(s.C, 1), off(s.H, 2), s.W);
  operand<4> w;
  w.ext = {off(s.K, 3), off(s.C / p.groups, 4), s.R, off(s.S, 5)};
  w.str = {w.ext[1] * w.ext[2] * w.ext[3], w.ext[2] * w.ext[3], w.ext[3], 1};
  operand<4> y = activation(c, s.N, s.K, off(P, 6), off(Q, 7));
  operand<1> bv;
  bv.ext = {bias ? std::max<index_t>(0, s.K + (c.flag(6) ? c.in(-1, 1) : 0)) : 0};
  bv.str = {1};

  // The rules, stated independently (see conv/params.hpp), on the shapes as they are: x (N, C,
  // H, W), w (K, C / groups, R, S), y (N, K, P, Q) with P and Q from x, w and the parameters.
  s.N = x.ext[0], s.C = x.ext[1], s.H = x.ext[2], s.W = x.ext[3];
  s.K = w.ext[0], s.R = w.ext[2], s.S = w.ext[3];
  bool valid = params_ok && p.groups >= 1 && s.R >= 1 && s.S >= 1 && s.C % p.groups == 0 &&
               s.K % p.groups == 0 && w.ext[1] == s.C / p.groups;
  valid = valid && s.H + p.pad_top + p.pad_bottom - p.dilation_h * (s.R - 1) - 1 >= 0 &&
          s.W + p.pad_left + p.pad_right - p.dilation_w * (s.S - 1) - 1 >= 0;
  valid = valid && y.ext == std::array<index_t, 4>{s.N, s.K, s.P(), s.Q()} &&
          (!bias || bv.ext[0] == s.K);
  // Within an image, (H, W) planes must be row-major (an extent of 1 makes a stride moot, an
  // empty view makes every stride moot).
  for (const auto* o : {&x, &y}) {
    const bool empty = o->ext[0] == 0 || o->ext[1] == 0 || o->ext[2] == 0 || o->ext[3] == 0;
    valid = valid && (empty || ((o->ext[2] <= 1 || o->str[2] == o->ext[3]) &&
                                (o->ext[3] <= 1 || o->str[3] == 1)));
  }

  std::vector<float> bx(static_cast<std::size_t>(place(x, c))),
      bw(static_cast<std::size_t>(place(w, c))), by(static_cast<std::size_t>(place(y, c))),
      bb(static_cast<std::size_t>(place(bv, c)));
  fill(bx, c.next()), fill(bw, c.next() + 1000u), fill(by, c.next() + 2000u),
      fill(bb, c.next() + 3000u);
  const auto x0 = bx, w0 = bw, y0 = by, b0 = bb;
  const auto vx = x.make(bx), vw = w.make(bw), vy = y.make(by);
  const auto vb = bv.make(bb);
  const Kokkos::DefaultHostExecutionSpace exec;
  const char* names[] = {"conv2d_forward", "conv2d_backward_data", "conv2d_backward_weight"};
  const bool ok = returns(names[pass], valid, [&] {
    if (pass == 0) {
      if (bias)
        tessera::conv2d_forward(exec, vx, vw, vb, vy, p);
      else
        tessera::conv2d_forward(exec, vx, vw, vy, p);
    } else if (pass == 1) {
      tessera::conv2d_backward_data(exec, vy, vw, vx, p); // x is dx, y is dy
    } else {
      if (bias)
        tessera::conv2d_backward_weight(exec, vx, vy, vw, vb, p); // w is dw, bias dbias
      else
        tessera::conv2d_backward_weight(exec, vx, vy, vw, p);
    }
  });
  if (!ok) {
    TESSERA_FUZZ_CHECK(bx == x0 && bw == w0 && by == y0 && bb == b0,
                       "%s threw and changed a buffer", names[pass]);
    return;
  }
  TESSERA_FUZZ_CHECK(valid,
                     "%s accepted an invalid call: x (%lld, %lld, %lld, %lld), w (%lld, "
                     "%lld, %lld, %lld), y (%lld, %lld, %lld, %lld), %s",
                     names[pass], (long long)x.ext[0], (long long)x.ext[1], (long long)x.ext[2],
                     (long long)x.ext[3], (long long)w.ext[0], (long long)w.ext[1],
                     (long long)w.ext[2], (long long)w.ext[3], (long long)y.ext[0],
                     (long long)y.ext[1], (long long)y.ext[2], (long long)y.ext[3],
                     p.to_string().c_str());
  namespace t = tessera::testing;
  const auto xa = x.addresses(), wa = w.addresses(), ya = y.addresses(), ba = bv.addresses();
  const index_t red_fwd = s.Cg() * s.R * s.S + 2, red_bwd = s.N * s.P() * s.Q() + 2;
  if (pass == 0) {
    auto ref = t::reference_conv2d_forward(s, gather(x0, xa), gather(w0, wa),
                                           bias ? gather(b0, ba) : std::vector<double>{});
    TESSERA_FUZZ_CHECK(bx == x0 && bw == w0 && bb == b0, "conv2d_forward changed an input");
    check_result(names[pass], by, y0, ya, ref.value, ref.abs, red_fwd);
  } else if (pass == 1) {
    auto ref = t::reference_conv2d_backward_data(s, gather(y0, ya), gather(w0, wa));
    TESSERA_FUZZ_CHECK(by == y0 && bw == w0, "conv2d_backward_data changed an input");
    check_result(names[pass], bx, x0, xa, ref.value, ref.abs, s.Kg() * s.R * s.S + 2);
  } else {
    auto ref = t::reference_conv2d_backward_weight(s, gather(x0, xa), gather(y0, ya));
    TESSERA_FUZZ_CHECK(bx == x0 && by == y0, "conv2d_backward_weight changed an input");
    check_result(names[pass], bw, w0, wa, ref.value, ref.abs, red_bwd);
    if (bias) {
      auto rb = t::reference_conv2d_backward_bias(s, gather(y0, ya));
      check_result("conv2d_backward_weight (dbias)", bb, b0, ba, rb.value, rb.abs, red_bwd);
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::initialize_kokkos();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cursor c{data, size};
  const int op = c.next() % 4;
  if (op == 0)
    fuzz_gemm(c);
  else
    fuzz_conv(c, op - 1);
  return 0;
}
