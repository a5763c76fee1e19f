#pragma once
/// \file conv/detail/phases.hpp
/// A strided convolution as a stride-1 one over the phases of its input (space to depth), for
/// the backward-weight paths that read bands at stride 1 (AMX tiles, bf16 pairs).
///
/// With strides (sh, sw) and dilation 1, output row p reads input row h = sh p + r - pt. Write
/// r - pt = sh m + a with 0 <= a < sh (m = floor((r - pt) / sh)): then h = sh (p + m) + a, row
/// p + m of phase a, the image x_a(i) = x(sh i + a). So the convolution is one of stride 1 over
/// the sh x sw phases of each input channel (channel c' = (c sh + a) sw + b of the phase image),
/// with a kernel of R' = floor((R - 1 - pt) / sh) - floor(-pt / sh) + 1 rows (the values of m)
/// and padding pt' = -floor(-pt / sh); columns likewise. Tap (c', r', s') of it is tap
/// (c, sh (r' - pt') + a + pt, sw (s' - pl') + b + pl) of the original when that lies in the
/// R x S window; the others (past the window's edges) multiply inputs by nothing of the
/// original and are dropped. Every original tap is exactly one phase tap: backward-weight over
/// the phases sums the same products as the strided pass, in another order.
///
/// Phase images are ceil(H / sh) x ceil(W / sw) (zeros past the input); rows and columns beyond
/// them are the stride-1 pass's padding. The split pays where the strided pass would otherwise
/// take im2col + GEMM: a 7 x 7 stride-2 stem (3 -> 12 channels, 4 x 4 taps: 1.31x the products)
/// runs on AMX tiles at about twice the speed of its columns (Xeon 0xCF, docs/performance.md).
/// Not taken (ok false) when the phase taps exceed the original ones by more than half (3 x 3
/// stride 2: 16 for 9).

#include <tessera/conv/detail/implicit.hpp>

#include <cstddef>
#include <cstring>

namespace tessera::detail {

#if !TESSERA_DEVICE_PASS

namespace implicit_conv {

/// floor(a / b) for b > 0.
constexpr index_t floor_div(index_t a, index_t b) noexcept {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/// The stride-1 geometry over the phases of a strided one (see the file comment).
struct phase_split {
  bool ok = false;
  geometry g;               ///< the stride-1 convolution over the phases
  index_t sh = 1, sw = 1;   ///< the original strides
  index_t R = 1, S = 1;     ///< the original kernel
  index_t pt = 0, pl = 0;   ///< the original padding
  index_t Hin = 0, Win = 0; ///< the original input
  /// Strides of the phase images (contiguous: images of G cin' planes of g.Hin x g.Win).
  index_t ns() const noexcept { return g.G * g.cin * g.Hin * g.Win; }
  index_t cs() const noexcept { return g.Hin * g.Win; }
  index_t hs() const noexcept { return g.Win; }
  /// Elements of the phase images of all N images.
  std::size_t elements() const noexcept { return static_cast<std::size_t>(g.N * ns()); }
  /// The original tap (c R + r) S + s of phase tap kk = (c' R' + r') S' + s', or -1 when it
  /// lies outside the original window.
  index_t original_tap(index_t kk) const noexcept {
    const index_t RS = g.R * g.S, cp = kk / RS, rp = kk / g.S % g.R, spp = kk % g.S;
    const index_t c = cp / (sh * sw), a = cp / sw % sh, b = cp % sw;
    const index_t r = sh * (rp - g.pt) + a + pt, s = sw * (spp - g.pl) + b + pl;
    if (r < 0 || r >= R || s < 0 || s >= S) return -1;
    return (c * R + r) * S + s;
  }
};

/// The split of g (ok: a stride above 1, dilation 1, phase taps at most max_waste times the
/// original ones).
inline phase_split phase_split_for(const geometry& g, double max_waste = 1.5) {
  phase_split ps;
  if ((g.sh == 1 && g.sw == 1) || g.dh != 1 || g.dw != 1 || g.N < 1 || g.cin < 1 || g.Hin < 1 ||
      g.Win < 1 || g.Hout < 1 || g.Wout < 1)
    return ps;
  ps.sh = g.sh, ps.sw = g.sw, ps.R = g.R, ps.S = g.S, ps.pt = g.pt, ps.pl = g.pl;
  ps.Hin = g.Hin, ps.Win = g.Win;
  const index_t mh = floor_div(-g.pt, g.sh), mw = floor_div(-g.pl, g.sw);
  ps.g = g;
  ps.g.cin = g.cin * g.sh * g.sw;
  ps.g.Hin = (g.Hin + g.sh - 1) / g.sh;
  ps.g.Win = (g.Win + g.sw - 1) / g.sw;
  ps.g.R = floor_div(g.R - 1 - g.pt, g.sh) - mh + 1;
  ps.g.S = floor_div(g.S - 1 - g.pl, g.sw) - mw + 1;
  ps.g.sh = ps.g.sw = 1;
  ps.g.pt = -mh, ps.g.pl = -mw;
  ps.ok = static_cast<double>(ps.g.kred()) <= max_waste * static_cast<double>(g.kred());
  return ps;
}

/// The phase images of x (in: N images of G cin planes, strides in_ns, in_cs, in_hs, rows
/// contiguous) into out (ps.elements() values, strides ps.ns(), ps.cs(), ps.hs()): plane
/// (c sh + a) sw + b, row i, column j holds x(c, sh i + a, sw j + b), zero past the input.
/// Parallel over the input rows of the phases.
template <class Exec, class T>
void fill_phases(const Exec& exec, const phase_split& ps, const T* in, index_t in_ns, index_t in_cs,
                 index_t in_hs, T* out) {
  const index_t sh = ps.sh, sw = ps.sw, H = ps.Hin, W = ps.Win, Hph = ps.g.Hin, Wph = ps.g.Win;
  const index_t C = ps.g.G * ps.g.cin / (sh * sw), ns = ps.ns(), cs = ps.cs();
  // One item: input channel c of image n, phase row i of phase a (all sw column phases).
  const index_t items = ps.g.N * C * sh * Hph;
  Kokkos::parallel_for("tessera::conv2d_backward_weight[phases]",
                       Kokkos::RangePolicy<Exec>(exec, 0, items), [=](const index_t it) {
                         const index_t i = it % Hph, a = it / Hph % sh, c = it / (Hph * sh) % C,
                                       n = it / (Hph * sh * C);
                         const index_t h = sh * i + a;
                         for (index_t b = 0; b < sw; ++b) {
                           T* dst = out + n * ns + ((c * sh + a) * sw + b) * cs + i * Wph;
                           if (h >= H) {
                             std::memset(static_cast<void*>(dst), 0,
                                         sizeof(T) * static_cast<std::size_t>(Wph));
                             continue;
                           }
                           const T* src = in + n * in_ns + c * in_cs + h * in_hs + b;
                           const index_t j1 = (W - b + sw - 1) / sw; // columns sw j + b < W
                           for (index_t j = 0; j < j1; ++j) dst[j] = src[sw * j];
                           for (index_t j = j1; j < Wph; ++j) dst[j] = T{};
                         }
                       });
}

} // namespace implicit_conv

#endif // !TESSERA_DEVICE_PASS

} // namespace tessera::detail
