#pragma once
/// \file conv/detail/passes.hpp
/// The three passes of conv2d (forward, backward-data, backward-weight) on one skeleton,
/// run_conv_pass: direct loops, implicit GEMM or im2col + GEMM over tiles and groups; each pass
/// is a struct that fills in the steps. Also the tile movers they share (matrix views inside a
/// tensor, gather / scatter of multi-image tiles, bias and epilogue passes, the final rounding)
/// and the bias gradient.

#include <tessera/config/kokkos_compat.hpp>
#include <tessera/conv/detail/amx_weight.hpp>
#include <tessera/conv/detail/checks.hpp>
#include <tessera/conv/detail/direct.hpp>
#include <tessera/conv/detail/phases.hpp>
#include <tessera/conv/detail/plan.hpp>
#include <tessera/conv/im2col.hpp>
#include <tessera/gemm/gemm.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>

namespace tessera::detail {

/// A (rows, cols) row-major matrix view with leading dimension ld over raw storage.
template <class P, class M>
TensorView<P, dextents<2>, layout_stride, M> matrix_view(storage_t<P>* data, index_t rows,
                                                         index_t cols, index_t ld) {
  return {data, dextents<2>(rows, cols), {ld, 1}};
}

/// Channels [c0, c0 + c) of the NCHW view v (rows of `width` pixels) over the pixels of a tile
/// of one image, in place: a (c, t.cols(width)) matrix with leading dimension v.stride(1).
template <class M, class V>
auto tile_matrix(const V& v, const conv_tile& t, index_t c0, index_t c, index_t width) {
  return matrix_view<typename V::precision, M>(v.data() + t.n0 * v.stride(0) + c0 * v.stride(1) +
                                                   t.p0 * width,
                                               c, t.cols(width), v.stride(1));
}

/// The filters of group g as a (K/groups, C/groups*R*S) matrix (require_rowmajor).
template <class M, class WV>
auto filter_matrix(const WV& w, const conv2d_problem& pb, index_t g) {
  return matrix_view<typename WV::precision, M>(w.data() + g * pb.Kg * w.stride(0), pb.Kg, pb.crs(),
                                                w.stride(0));
}

/// Group g's columns (C/groups*R*S, t.cols(Q)) of tile t: x itself when in_place (1x1 stride 1
/// unpadded, one image per tile), else im2col'd into col.
template <class M, class Exec, class XV>
auto x_columns(const Exec& exec, const XV& x, const conv2d_problem& pb, const conv_tile& t,
               index_t g, typename XV::storage_type* col, bool in_place) {
  if (in_place) return tile_matrix<M>(x, t, g * pb.Cg, pb.Cg, pb.W);
  im2col_tile(exec, x, t, g * pb.Cg, pb.Cg, pb.R, pb.S, pb.Q, pb.prm, col);
  const index_t cols = t.cols(pb.Q);
  return matrix_view<typename XV::precision, M>(col, pb.crs(), cols, cols);
}

/// A GEMM epilogue op (gemm/epilogue.hpp) for output channel rows k0 + i of a convolution:
/// epi(v + bias[k0 + i]), so the GEMM's single rounding to y's precision comes after both.
template <bool HasBias, class BV, class Epi>
struct conv_bias_op {
  BV bias;
  index_t k0 = 0;
  Epi epi;
  TESSERA_INLINE float operator()(float v, index_t i, index_t) const noexcept {
    float b = 0.f;
    if constexpr (HasBias) b = to_float(bias(k0 + i));
    return epi(v + b);
  }
  void check(const char*, index_t, index_t) const {}
};

#if !TESSERA_DEVICE_PASS
/// conv_bias_op's vector form (gemm/detail/host.hpp, vec_op) when it has no epilogue of its own:
/// the host GEMM then adds the bias on whole vectors in its last store.
template <bool HasBias, class BV>
hostgemm::vfloat vec_op(const conv_bias_op<HasBias, BV, no_epilogue>& o, const hostgemm::vfloat& v,
                        index_t i, index_t) {
  if constexpr (HasBias)
    return v + hostgemm::vfloat(to_float(o.bias(o.k0 + i)));
  else
    return v;
}
#endif

/// dst(i, j) = epi(src(i, j) + bias[k0 + i]), rounded once to dst's precision (src may alias
/// dst).
template <bool HasBias, class Exec, class SrcM, class DstM, class BV, class Epi>
void bias_epilogue(const Exec& exec, const SrcM& src, const DstM& dst, const BV& bias, index_t k0,
                   const Epi& epi) {
  using pd = typename DstM::precision;
  const index_t cols = dst.extent(1);
  Kokkos::parallel_for(
      "tessera::conv2d_forward[epilogue]", Kokkos::RangePolicy<Exec>(exec, 0, dst.extent(0)),
      KOKKOS_LAMBDA(const index_t i) {
        float b = 0.f;
        if constexpr (HasBias) b = to_float(bias(k0 + i));
        for (index_t j = 0; j < cols; ++j) dst(i, j) = from_float<pd>(epi(to_float(src(i, j)) + b));
      });
}

/// y[n0 + j, k0 + k, tile pixels] = epi(tmp(k, image j's columns) (+ bias[k0 + k])), rounded
/// once: the image-major tile matrix (kc, t.cols(Q)) scattered back to NCHW.
template <bool HasBias, class Exec, class YV, class BV, class Epi>
void scatter_tile(const Exec& exec, const float* tmp, const YV& y, const conv_tile& t, index_t k0,
                  index_t kc, index_t Q, const BV& bias, const Epi& epi) {
  using py = typename YV::precision;
  auto* y0 = y.data() + t.n0 * y.stride(0) + k0 * y.stride(1) + t.p0 * Q;
  const index_t ys0 = y.stride(0), ys1 = y.stride(1), pix = t.rows() * Q, ld = t.cols(Q);
  Kokkos::parallel_for(
      "tessera::conv2d_forward[scatter]", Kokkos::RangePolicy<Exec>(exec, 0, t.nb * kc),
      KOKKOS_LAMBDA(const index_t i) {
        const index_t j = i / kc, k = i % kc;
        float b = 0.f;
        if constexpr (HasBias) b = to_float(bias(k0 + k));
        const float* src = tmp + k * ld + j * pix;
        auto* dst = y0 + j * ys0 + k * ys1;
        for (index_t e = 0; e < pix; ++e) dst[e] = from_float<py>(epi(src[e] + b));
      });
}

/// The tile's pixels of channels [k0, k0 + kc) of dy, copied into the dense image-major
/// (kc, t.cols(Q)) matrix at out (same precision: no rounding).
template <class Exec, class DYV>
void gather_tile(const Exec& exec, const DYV& dy, const conv_tile& t, index_t k0, index_t kc,
                 index_t Q, typename DYV::storage_type* out) {
  const auto* d0 = dy.data() + t.n0 * dy.stride(0) + k0 * dy.stride(1) + t.p0 * Q;
  const index_t ds0 = dy.stride(0), ds1 = dy.stride(1), pix = t.rows() * Q, ld = t.cols(Q);
  Kokkos::parallel_for(
      "tessera::conv2d[gather]", Kokkos::RangePolicy<Exec>(exec, 0, t.nb * kc),
      KOKKOS_LAMBDA(const index_t i) {
        const index_t j = i / kc, k = i % kc;
        const auto* src = d0 + j * ds0 + k * ds1;
        copy_run(out + k * ld + j * pix, src, pix); // vectorised for bf16 and fp8 too
      });
}

/// Group g's (K/groups, t.cols(Q)) tile of dy: dy itself when in_place (one image per tile),
/// else gathered into dyg.
template <class M, class Exec, class DYV>
auto dy_tile(const Exec& exec, const DYV& dy, const conv2d_problem& pb, const conv_tile& t,
             index_t g, typename DYV::storage_type* dyg, bool in_place) {
  if (in_place) return tile_matrix<M>(dy, t, g * pb.Kg, pb.Kg, pb.Q);
  gather_tile(exec, dy, t, g * pb.Kg, pb.Kg, pb.Q, dyg);
  const index_t cols = t.cols(pb.Q);
  return matrix_view<typename DYV::precision, M>(dyg, pb.Kg, cols, cols);
}

/// Zeroes c fp32 planes of H rows x W (channel stride cs).
template <class Exec>
void zero_planes(const Exec& exec, float* img, index_t c, index_t cs, index_t H, index_t W) {
  Kokkos::parallel_for(
      "tessera::conv2d[zero]", Kokkos::RangePolicy<Exec>(exec, 0, c * H),
      KOKKOS_LAMBDA(const index_t i) {
        float* row = img + (i / H) * cs + (i % H) * W;
        for (index_t w = 0; w < W; ++w) row[w] = 0.f;
      });
}

/// dst (nb images of c planes, image stride ns, channel stride cs, rows of W) = the dense fp32
/// images at src, rounded once to P.
template <class Exec, class P>
void store_images(const Exec& exec, const float* src, storage_t<P>* dst, index_t nb, index_t ns,
                  index_t c, index_t cs, index_t H, index_t W) {
  Kokkos::parallel_for(
      "tessera::conv2d[store]", Kokkos::RangePolicy<Exec>(exec, 0, nb * c * H),
      KOKKOS_LAMBDA(const index_t i) {
        const float* in = src + i * W;
        storage_t<P>* out = dst + i / (c * H) * ns + i / H % c * cs + i % H * W;
        for (index_t w = 0; w < W; ++w) out[w] = from_float<P>(in[w]);
      });
}

/// The skeleton of every conv2d pass (forward, backward-data, backward-weight): after an empty
/// batch (unless the pass still has an output to write), the direct loops for one input channel
/// per group, else the implicit GEMM where it applies (host spaces), else im2col + GEMM over the
/// tiles of the output and, inside each tile, the groups. A Pass provides:
///   runs_when_empty     whether an empty batch (N == 0) still runs the pass (dW = 0)
///   direct()            conv/detail/direct.hpp's loops for one input channel per group
///   implicit()          runs the implicit GEMM and returns true, or returns false (not taken)
///   plan()              the tiling (conv_plan) of the im2col + GEMM path; carves its scratch
///   tile_begin(t), group(t, g), tile_end(t)   per tile, per group g of a tile, after a tile
///   finish()            after the last tile
/// Each path ends with the space fenced (the implicit path fences itself).
template <class Exec, class Pass>
void run_conv_pass(const Exec& exec, const conv2d_problem& pb, Pass& pass) {
  if (pb.N == 0 && !Pass::runs_when_empty) return;
  if (pb.one_channel_per_group()) {
    pass.direct();
    exec.fence();
    return;
  }
#if !TESSERA_DEVICE_PASS
  if (pass.implicit()) return;
#endif
  const conv_plan plan = pass.plan();
  for_each_tile(pb, plan, [&](const conv_tile& t) {
    pass.tile_begin(t);
    for (index_t g = 0; g < pb.G; ++g) pass.group(t, g);
    pass.tile_end(t);
  });
  pass.finish();
  exec.fence();
}

#if !TESSERA_DEVICE_PASS
/// The implicit paths of the forward pass (host spaces), or false where none applies: the
/// values stored are from_float<Py>(epi(alpha * sum + bias)). Pool2 false: into the NCHW view
/// `out`, through any implicit path. Pool2 true: `out` is a consumer of output rows (as
/// rows_into, conv/detail/plan.hpp) that pools 2 x 2 windows: only the direct forms, in bands of
/// an even number of rows.
template <class Py, bool Pool2, class Exec, class XV, class WV, class BV, class M, class Epi,
          class Out>
bool forward_implicit(const Exec& exec, const XV& x, const WV& w, const BV& bias,
                      const conv2d_problem& pb, conv2d_workspace<M>& ws, float alpha,
                      const Epi& epi, const Out& out) {
  using px = typename XV::precision;
  using pw = typename WV::precision;
  constexpr bool has_bias = !std::is_same_v<BV, no_bias_t>;
  // A filter (C/groups, R, S) is row-major (require_rowmajor): tap kk is at offset kk.
  const index_t Kg = pb.Kg, ws0 = w.stride(0);
  const auto wval = [=](const auto* wd, index_t gi, index_t kk, index_t j) {
    return wd[(gi * Kg + j) * ws0 + kk];
  };
  const auto store_value = [&](index_t k) {
    float b = 0.f;
    if constexpr (has_bias) b = to_float(bias(k));
    return store_rounded<Py, Epi, true>{b, epi};
  };
  const auto rows = [&] {
    if constexpr (Pool2) {
      return out;
    } else {
      return rows_into_view(out);
    }
  };
  // A short reduction (a first layer), stride 1, any precision: vectors along output rows.
  if constexpr (implicit_narrow_capable_v<Exec>) {
    if (!pb.pointwise() && pb.crs() < narrow_conv::max_reduction) {
      const auto g = forward_geometry(pb, alpha);
      const auto d = narrow_conv::layout_for(g, Pool2);
      if (d.ok) {
        run_narrow(exec, g, d, x, w, ws, wval, store_value, rows());
        return true;
      }
    }
  }
  // fp32 operands: the fp32 implicit paths; operands exact in bf16: the bf16 pairs form of the
  // direct path where the CPU and the layout allow, else im2col and the GEMM; in a build
  // without a bf16 dot product, low-precision operands widened on the fp32 paths.
  constexpr bool pairs = implicit_pairs_capable_v<Exec, px, pw>;
  if constexpr (implicit_capable_v<Exec, px, pw> || implicit_widened_v<Exec, px, pw> || pairs) {
    const auto g = forward_geometry(pb, alpha);
    if (!use_implicit(pb, pb.Kg, pb.crs())) return false;
    if constexpr (Pool2) {
      const auto d = pairs ? implicit_conv::pairs_layout_for(g, true)
                           : implicit_conv::direct_layout_for(g, false, true);
      if (!d.ok) return false;
      run_direct_rows<pairs>(exec, g, d, x, w, ws, wval, store_value, out);
      return true;
    } else {
      if (pairs && !implicit_conv::pairs_direct_for(g)) return false;
      run_implicit<pairs>(exec, g, x, w, out, ws, wval, store_value);
      return true;
    }
  }
  return false;
}
#endif

/// y = conv(x, w) (+ bias), then epi, rounded once to y's precision.
template <class Exec, class XV, class WV, class BV, class YV, class M, class Epi>
struct forward_pass {
  using px = typename XV::precision;
  using pw = typename WV::precision;
  using py = typename YV::precision;
  static constexpr bool runs_when_empty = false;
  static constexpr bool has_bias = !std::is_same_v<BV, no_bias_t>;
  static constexpr bool post = has_bias || !std::is_same_v<Epi, no_epilogue>; // after the GEMM
  using bias_op = conv_bias_op<has_bias, BV, Epi>;
  // The bias and epilogue go into the GEMM's last store when the epilogue can be an op of a
  // tessera::epilogue (default-constructible and assignable: not a lambda) and either y is in a
  // low precision (rounded once, after them) or the host GEMM stores them on whole vectors
  // (fp32 y and no epilogue besides the bias: conv_bias_op's vec_op; for res1x1_56's forward
  // this saved the pass over y, 10% of the time on Zen 5). Otherwise an fp32 y gets them in a
  // vectorised pass over y (the scalar store of a GEMM epilogue was 8% slower for a 1x1 layer
  // with K/groups = 64 rows), and a low-precision y goes through the fp32 tile.
  static constexpr bool vector_fused = [] {
#if !TESSERA_DEVICE_PASS
    return is_host_exec_v<Exec> && hostgemm::vector_op<bias_op>;
#else
    return false;
#endif
  }();
  static constexpr bool fuse = (!std::is_same_v<py, fp32> || vector_fused) &&
                               std::is_default_constructible_v<Epi> &&
                               std::is_copy_assignable_v<Epi>;

  const Exec& exec;
  const XV& x;
  const WV& w;
  const BV& bias;
  const YV& y;
  const conv2d_problem& pb;
  conv2d_workspace<M>& ws;
  float alpha;
  const Epi& epi;
  // Set by plan().
  bool x_in_place = false, direct_out = false;
  storage_t<px>* col = nullptr;
  float* out = nullptr;

  void direct() const {
    direct_cg1_forward<has_bias>(exec, x, w, bias, y, pb.prm, alpha, epi);
  }

  bool implicit() const {
#if !TESSERA_DEVICE_PASS
    return forward_implicit<py, false>(exec, x, w, bias, pb, ws, alpha, epi, y);
#else
    return false;
#endif
  }

  // Tiles of one image are matrices inside x and y; tiles of several images are gathered into
  // columns (im2col, also for 1x1) and scattered back from an fp32 tile.
  conv_plan plan() {
    const std::size_t xe = sizeof(storage_t<px>);
    const auto p = plan_tiles(pb, ws.column_budget(), pb.crs() * pb.Q, xe);
    x_in_place = pb.pointwise() && p.images == 1;
    direct_out = p.images == 1 && (fuse || !post || std::is_same_v<py, fp32>);
    const index_t maxc = p.max_cols(pb.Q);
    const auto [col_mem, out_mem] =
        carve<2>(ws, {x_in_place ? 0 : static_cast<std::size_t>(pb.crs() * maxc) * xe,
                      direct_out ? 0 : static_cast<std::size_t>(pb.Kg * maxc) * 4});
    col = reinterpret_cast<storage_t<px>*>(col_mem);
    out = reinterpret_cast<float*>(out_mem);
    return p;
  }
  void tile_begin(const conv_tile&) const {}
  void group(const conv_tile& t, index_t g) const {
    const index_t Kg = pb.Kg, cols = t.cols(pb.Q);
    const gemm_options opts{.alpha = alpha, .beta = 0.f};
    const auto wg = filter_matrix<M>(w, pb, g);
    const auto b = x_columns<M>(exec, x, pb, t, g, col, x_in_place);
    if (direct_out) {
      const auto yt = tile_matrix<M>(y, t, g * Kg, Kg, pb.Q);
      if constexpr (post && fuse) {
        gemm(exec, wg, b, yt,
             epilogue<bias_op>{.alpha = alpha, .beta = 0.f, .ops = {{bias, g * Kg, epi}}});
      } else {
        gemm(exec, wg, b, yt, opts);
        if constexpr (post) bias_epilogue<has_bias>(exec, yt, yt, bias, g * Kg, epi);
      }
    } else {
      gemm(exec, wg, b, matrix_view<fp32, M>(out, Kg, cols, cols), opts);
      scatter_tile<has_bias>(exec, out, y, t, g * Kg, Kg, pb.Q, bias, epi);
    }
  }
  void tile_end(const conv_tile&) const {}
  void finish() const {}
};

/// dx = the transposed convolution of dy with w, accumulated in fp32, rounded once to dx's
/// precision.
template <class Exec, class DYV, class WV, class DXV, class M>
struct backward_data_pass {
  using pdy = typename DYV::precision;
  using pw = typename WV::precision;
  using pdx = typename DXV::precision;
  static constexpr bool runs_when_empty = false;
  static constexpr bool dx_f32 = std::is_same_v<pdx, fp32>;

  const Exec& exec;
  const DYV& dy;
  const WV& w;
  const DXV& dx;
  const conv2d_problem& pb;
  conv2d_workspace<M>& ws;
  float alpha;
  // Set by plan().
  bool single = false, direct_dy = false;
  float* dcol = nullptr;
  storage_t<pdy>* dyg = nullptr;
  float* img = nullptr;
  // Set by tile_begin(): the fp32 accumulation target, dx itself or dense scratch images.
  float* target = nullptr;
  index_t tns = 0, tcs = 0;

  void direct() const { direct_cg1_backward_data(exec, dy, w, dx, pb.prm, alpha); }

  bool implicit() const {
#if !TESSERA_DEVICE_PASS
    constexpr bool pairs = implicit_pairs_capable_v<Exec, pdy, pw>; // as in forward_pass
    if constexpr (implicit_capable_v<Exec, pdy, pw> || implicit_widened_v<Exec, pdy, pw> || pairs) {
      const auto g = backward_data_geometry(pb, alpha);
      if (pb.prm.stride_h == 1 && pb.prm.stride_w == 1 &&
          use_implicit(pb, pb.Cg, crs_of(pb, pb.Kg)) &&
          (!pairs || implicit_conv::pairs_direct_for(g))) {
        // Tap kk = (k, r, s) reads w[k, j, R-1-r, S-1-s]: offset (R*S - 1 - (r*S + s)) in the
        // row-major (R, S) plane of input channel j, planes R*S apart.
        const index_t Kg = pb.Kg, ws0 = w.stride(0), RS = pb.R * pb.S;
        run_implicit<pairs>(
            exec, g, dy, w, dx, ws,
            [=](const auto* wd, index_t gi, index_t kk, index_t j) {
              const index_t k = kk / RS, t = kk - k * RS;
              return wd[(gi * Kg + k) * ws0 + j * RS + RS - 1 - t];
            },
            [](index_t) {
              return store_rounded<pdx, no_epilogue, false>{0.f, no_epilogue{}};
            });
        return true;
      }
    }
#endif
    return false;
  }

  // 1x1 stride 1 unpadded: one whole image per tile, dx[n, g] (Cg, H*W) = W_g^T dy[n, g] with
  // no columns and one rounding. Otherwise dcol = W_g^T dy tile in fp32, col2im'd into dx (or
  // into fp32 scratch images for a low-precision dx, rounded once when an image is complete).
  conv_plan plan() {
    if (pb.pointwise()) return {1, pb.P};
    const auto p = plan_tiles(pb, ws.column_budget(), pb.crs() * pb.Q, 4);
    single = p.rows >= pb.P; // whole images per tile: col2im overwrites
    direct_dy = p.images == 1;
    const index_t maxc = p.max_cols(pb.Q);
    const auto [dcol_mem, dyg_mem, img_mem] = carve<3>(
        ws, {static_cast<std::size_t>(pb.crs() * maxc) * 4,
             direct_dy ? 0 : static_cast<std::size_t>(pb.Kg * maxc) * sizeof(storage_t<pdy>),
             dx_f32 ? 0 : static_cast<std::size_t>(p.images * pb.C * pb.H * pb.W) * 4});
    dcol = reinterpret_cast<float*>(dcol_mem);
    dyg = reinterpret_cast<storage_t<pdy>*>(dyg_mem);
    img = reinterpret_cast<float*>(img_mem);
    return p;
  }
  void tile_begin(const conv_tile& t) {
    if (pb.pointwise()) return;
    target = img;
    tns = pb.C * pb.H * pb.W, tcs = pb.H * pb.W;
    if constexpr (dx_f32) {
      target = dx.data() + t.n0 * dx.stride(0);
      tns = dx.stride(0), tcs = dx.stride(1);
    }
    if (!single && t.p0 == 0) zero_planes(exec, target, pb.C, tcs, pb.H, pb.W); // nb == 1 here
  }
  void group(const conv_tile& t, index_t g) const {
    const index_t Cg = pb.Cg, cols = t.cols(pb.Q);
    const gemm_options opts{.alpha = alpha, .beta = 0.f};
    const auto wg_t = transpose(filter_matrix<M>(w, pb, g)); // (CRS, Kg)
    if (pb.pointwise()) { // whole images: dx[n, g] (Cg, H*W), P*Q == H*W
      gemm(exec, wg_t, tile_matrix<M>(dy, t, g * pb.Kg, pb.Kg, pb.Q),
           tile_matrix<M>(dx, t, g * Cg, Cg, pb.W), opts);
      return;
    }
    gemm(exec, wg_t, dy_tile<M>(exec, dy, pb, t, g, dyg, direct_dy),
         matrix_view<fp32, M>(dcol, pb.crs(), cols, cols), opts);
    col2im_tile(exec, dcol, t, Cg, pb.R, pb.S, pb.Q, pb.prm, target + g * Cg * tcs, tns, tcs, pb.H,
                pb.W, !single);
  }
  void tile_end(const conv_tile& t) const {
    if constexpr (!dx_f32)
      if (!pb.pointwise() && t.p1 == pb.P)
        store_images<Exec, pdx>(exec, img, dx.data() + t.n0 * dx.stride(0), t.nb, dx.stride(0),
                                pb.C, dx.stride(1), pb.H, pb.W);
  }
  void finish() const {}
};

/// dW_g (Kg, CRS) = sum over the tiles of dy tile (Kg, t) * col^T, accumulated in fp32 (in dw
/// itself when it is fp32), rounded once to dw's precision.
template <class Exec, class XV, class DYV, class DWV, class M>
struct backward_weight_pass {
  using px = typename XV::precision;
  using pdy = typename DYV::precision;
  using pdw = typename DWV::precision;
  static constexpr bool runs_when_empty = true; // dw = 0
  static constexpr bool dw_f32 = std::is_same_v<pdw, fp32>;

  const Exec& exec;
  const XV& x;
  const DYV& dy;
  const DWV& dw;
  const conv2d_problem& pb;
  conv2d_workspace<M>& ws;
  float alpha;
  // Set by plan().
  index_t ld = 0;
  bool x_in_place = false, direct_dy = false;
  storage_t<px>* col = nullptr;
  storage_t<pdy>* dyg = nullptr;
  float* target = nullptr; // fp32 accumulation of dW over tiles

  void direct() const { direct_cg1_backward_weight(exec, x, dy, dw, pb.prm, alpha); }

  bool implicit() const {
#if !TESSERA_DEVICE_PASS
    if constexpr (implicit_capable_v<Exec, fp32, fp32>) {
      namespace ic = implicit_conv;
      const auto g = forward_geometry(pb, alpha);
      // x and dy exact in bf16 (bf16, fp8): the bf16 pairs paths (AMX tiles, else VDPBF16PS),
      // which read bands at stride 1. A strided layer (a 7 x 7 stride-2 stem) runs as the
      // stride-1 convolution over x's phases (conv/detail/phases.hpp), copied to the workspace
      // first, rather than as im2col + GEMM; each phase tap's sum lands on its original tap.
      if constexpr (implicit_pairs_capable_v<Exec, px, pdy>) {
        if (pb.N > 0) {
          const auto pp = pairs_for(g);
          if (pp.kind != pairs_plan::none) {
            const auto [s_mem] = carve<1>(ws, {pp.scratch});
            run_pairs(g, pp, x.data(), x.stride(0), x.stride(1), x.stride(2), dy.data(), s_mem,
                      store_dw());
            return true;
          }
          const auto ps = ic::phase_split_for(g);
          if (ps.ok && run_phases(ps)) return true;
        }
      }
      // fp32 x and dy run the implicit path as they are. Low-precision ones only with a
      // reduction C/groups*R*S under 16 (a first layer: 1 x 3 x 3), where the GEMM dW = dy col^T
      // is too thin for the low-precision kernels and decodes every element in the direct loop
      // (1 GFLOP/s for fp8): they are widened to fp32 (exact), the same products 10-25x faster.
      // With stride 1 on AVX-512 each unit widens its own band and dy rows as it copies them
      // (run_weight_direct<true>); else x and dy are widened whole first (contiguous copies).
      constexpr bool native = implicit_capable_v<Exec, px, pdy>;
      const bool widen = !native && pb.crs() < 16;
      if (pb.N > 0 && pb.Kg >= implicit_min_channels && (native || widen)) {
        // Stride 1 on AVX-512: dot products along output rows; else gathers and transposes.
        const ic::weight_direct_layout dl =
            ic::weight_direct_layout_for(g, tessera::concurrency(exec), false, !native);
        if constexpr (!native) {
#if defined(__AVX512F__)
          if (dl.ok) {
            const auto [s_mem] = carve<1>(ws, {scratch_bytes(g, dl)});
            ic::run_weight_direct<true>(exec, g, dl, x.data(), x.stride(0), x.stride(1),
                                        x.stride(2), dy.data(), dy.stride(0), dy.stride(1), s_mem,
                                        store_dw());
            exec.fence();
            return true;
          }
#endif
          if (!x.is_contiguous() || !dy.is_contiguous()) return false;
        }
        const std::size_t nx = native ? 0 : static_cast<std::size_t>(x.size());
        const std::size_t ndy = native ? 0 : static_cast<std::size_t>(dy.size());
        const auto [x_mem, dy_mem, s_mem] = carve<3>(ws, {nx * 4, ndy * 4, scratch_bytes(g, dl)});
        const float* xin;
        const float* dyin;
        std::array<index_t, 3> xs{x.stride(0), x.stride(1), x.stride(2)};
        std::array<index_t, 2> dys{dy.stride(0), dy.stride(1)};
        if constexpr (native) {
          xin = x.data();
          dyin = dy.data();
        } else { // contiguous copies
          auto* xf = reinterpret_cast<float*>(x_mem);
          auto* dyf = reinterpret_cast<float*>(dy_mem);
          convert_host_chunks<fp32, overflow_to_inf_nan>(exec, x.data(), xf, x.size());
          convert_host_chunks<fp32, overflow_to_inf_nan>(exec, dy.data(), dyf, dy.size());
          xin = xf, dyin = dyf;
        }
        if (dl.ok) {
#if defined(__AVX512F__)
          ic::run_weight_direct(exec, g, dl, xin, xs[0], xs[1], xs[2], dyin, dys[0], dys[1], s_mem,
                                store_dw());
#endif
        } else {
          ic::run_weight(exec, g, xin, xs[0], xs[1], xs[2], dyin, dys[0], dys[1],
                         reinterpret_cast<float*>(s_mem), store_dw());
        }
        exec.fence();
        return true;
      }
    }
#endif
    return false;
  }

#if !TESSERA_DEVICE_PASS
  /// The bf16 pairs form that runs backward-weight of geometry g (stride 1; x and dy exact in
  /// bf16) on this CPU: AMX tiles where this process can use them (no implicit_min_channels
  /// floor: the layout's own rule bounds the waste of narrow layers, padding cin and cout to 16
  /// and rows to Wp at most doubling the products, which the tiles' rate repays many times),
  /// else VDPBF16PS (AVX512_BF16, as the forward pass); none where neither applies.
  struct pairs_plan {
    enum kind_t { none, amx, pairs } kind = none;
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
    implicit_conv::weight_amx_layout amx_layout;
#endif
    implicit_conv::weight_direct_layout direct_layout;
    std::size_t scratch = 0; ///< bytes of workspace the run needs
  };
  pairs_plan pairs_for([[maybe_unused]] const implicit_conv::geometry& g) const {
    namespace ic = implicit_conv;
    pairs_plan pp;
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
    if (ic::pairs_amx_cpu()) {
      pp.amx_layout = ic::weight_amx_layout_for(g, tessera::concurrency(exec));
      if (pp.amx_layout.ok) {
        pp.kind = pairs_plan::amx;
        pp.scratch = static_cast<std::size_t>(ic::parts_for(exec, g, pp.amx_layout)) *
                     pp.amx_layout.part_bytes(g);
        return pp;
      }
    }
#endif
#if TESSERA_GEMM_AVX512BF16
    if (g.cout >= implicit_min_channels && ic::pairs_cpu()) {
      pp.direct_layout = ic::weight_direct_layout_for(g, tessera::concurrency(exec), true);
      if (pp.direct_layout.ok) {
        pp.kind = pairs_plan::pairs;
        pp.scratch = scratch_bytes(g, pp.direct_layout);
      }
    }
#endif
    return pp;
  }
  /// Runs the form pp (kind not none) of pairs_for(g) on input `in` (strides ns, cs, hs; rows
  /// contiguous) and dy at dyp (dy's strides), scratch: pp.scratch bytes of the workspace.
  template <class TX, class TD, class Store>
  void run_pairs(const implicit_conv::geometry& g, const pairs_plan& pp, const TX* in, index_t ns,
                 index_t cs, index_t hs, const TD* dyp, void* scratch, const Store& store) const {
    namespace ic = implicit_conv;
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
    if (pp.kind == pairs_plan::amx)
      ic::run_weight_amx(exec, g, pp.amx_layout, in, ns, cs, hs, dyp, dy.stride(0), dy.stride(1),
                         scratch, store);
#endif
#if TESSERA_GEMM_AVX512BF16
    if (pp.kind == pairs_plan::pairs)
      ic::run_weight_direct(exec, g, pp.direct_layout, in, ns, cs, hs, dyp, dy.stride(0),
                            dy.stride(1), scratch, store);
#endif
    (void)g, (void)pp, (void)in, (void)ns, (void)cs, (void)hs, (void)dyp, (void)scratch,
        (void)store;
    exec.fence();
  }
  /// Backward-weight of a strided layer as the stride-1 one over x's phases (ps, phases.hpp) in
  /// bf16 pairs: the phase images of a chunk of images are copied to the workspace, as many
  /// images as the column budget holds (at least one: the workspace stays independent of the
  /// batch), and each phase tap's sum lands on its original tap, the chunks' sums added in fp32
  /// (K x C/groups x R x S floats) and stored once. False (nothing run) where the pairs forms
  /// do not take the split geometry.
  bool run_phases(const implicit_conv::phase_split& ps) const {
    namespace ic = implicit_conv;
    using tx = storage_t<px>;
    const index_t N = pb.N;
    const std::size_t image = static_cast<std::size_t>(ps.ns()) * sizeof(tx);
    const index_t nc = std::clamp<index_t>(
        static_cast<index_t>(std::min<std::size_t>(ws.column_budget() / image, N)), 1, N);
    const index_t chunks = (N + nc - 1) / nc, n_last = N - (chunks - 1) * nc;
    const auto chunk = [&](index_t n) {
      ic::phase_split c = ps;
      c.g.N = n;
      return c;
    };
    const auto pp = pairs_for(chunk(nc).g), pl = pairs_for(chunk(n_last).g);
    if (pp.kind == pairs_plan::none || pl.kind == pairs_plan::none) return false;
    const index_t kred = pb.crs();
    const auto [acc_mem, x_mem, s_mem] =
        carve<3>(ws, {chunks > 1 ? static_cast<std::size_t>(pb.K * kred) * 4 : 0,
                      static_cast<std::size_t>(nc) * image, std::max(pp.scratch, pl.scratch)});
    auto* acc = reinterpret_cast<float*>(acc_mem);
    auto* xp = reinterpret_cast<tx*>(x_mem);
    const auto store = store_dw();
    for (index_t ci = 0; ci < chunks; ++ci) {
      const index_t n0 = ci * nc;
      const auto c = chunk(ci + 1 < chunks ? nc : n_last);
      ic::fill_phases(exec, c, x.data() + n0 * x.stride(0), x.stride(0), x.stride(1), x.stride(2),
                      xp);
      exec.fence();
      const bool first = ci == 0, last = ci + 1 == chunks;
      run_pairs(c.g, ci + 1 < chunks ? pp : pl, static_cast<const tx*>(xp), c.ns(), c.cs(), c.hs(),
                dy.data() + n0 * dy.stride(0), s_mem, [=](index_t k, index_t kk, float v) {
                  const index_t t = c.original_tap(kk);
                  if (t < 0) return;
                  if (first && last) {
                    store(k, t, v);
                    return;
                  }
                  float& a = acc[k * kred + t];
                  const float sum = first ? v : a + v;
                  if (last) {
                    store(k, t, sum);
                  } else {
                    a = sum;
                  }
                });
    }
    return true;
  }

  // Scratch of run_weight_direct (dl.ok) or run_weight.
  std::size_t scratch_bytes(const implicit_conv::geometry& g,
                            const implicit_conv::weight_direct_layout& dl) const {
    namespace ic = implicit_conv;
    return dl.ok ? round_up_64(sizeof(index_t) * static_cast<std::size_t>(g.kred())) +
                       static_cast<std::size_t>(ic::parts_for(exec, g, dl)) * dl.part_bytes(g)
                 : static_cast<std::size_t>(ic::weight_parts(exec, g)) *
                       ic::weight_scratch_floats(g) * 4;
  }
  // dw[k, kk] = v, rounded to dw's precision. A filter (C/groups, R, S) is row-major
  // (require_rowmajor): tap kk is at offset kk.
  auto store_dw() const {
    const index_t ws0 = dw.stride(0);
    auto* dwd = dw.data();
    return [=](index_t k, index_t kk, float v) { dwd[k * ws0 + kk] = from_float<pdw>(v); };
  }
#endif

  conv_plan plan() {
    const index_t crs = pb.crs();
    const std::size_t xe = sizeof(storage_t<px>);
    const auto p = plan_tiles(pb, ws.column_budget(), crs * pb.Q, xe);
    x_in_place = pb.pointwise() && p.images == 1;
    direct_dy = p.images == 1;
    const index_t maxc = p.max_cols(pb.Q);
    const auto [col_mem, dyg_mem, acc_mem] = carve<3>(
        ws, {x_in_place ? 0 : static_cast<std::size_t>(crs * maxc) * xe,
             direct_dy ? 0 : static_cast<std::size_t>(pb.Kg * maxc) * sizeof(storage_t<pdy>),
             dw_f32 ? 0 : static_cast<std::size_t>(pb.K * crs) * 4});
    col = reinterpret_cast<storage_t<px>*>(col_mem);
    dyg = reinterpret_cast<storage_t<pdy>*>(dyg_mem);
    target = reinterpret_cast<float*>(acc_mem);
    ld = crs;
    if constexpr (dw_f32) { // accumulate straight into dw
      target = dw.data();
      ld = dw.stride(0);
    }
    if (pb.N == 0) zero_planes(exec, target, pb.K, ld, 1, crs);
    return p;
  }
  void tile_begin(const conv_tile&) const {}
  void group(const conv_tile& t, index_t g) const {
    const auto b = x_columns<M>(exec, x, pb, t, g, col, x_in_place);
    const auto dyt = dy_tile<M>(exec, dy, pb, t, g, dyg, direct_dy);
    const float beta = t.n0 == 0 && t.p0 == 0 ? 0.f : 1.f; // the first tile overwrites
    gemm(exec, dyt, transpose(b),
         matrix_view<fp32, M>(target + g * pb.Kg * ld, pb.Kg, pb.crs(), ld),
         gemm_options{.alpha = alpha, .beta = beta});
  }
  void tile_end(const conv_tile&) const {}
  void finish() const {
    if constexpr (!dw_f32)
      store_images<Exec, pdw>(exec, target, dw.data(), 1, 0, pb.K, dw.stride(0), 1, pb.crs());
  }
};

template <class Exec, class XV, class WV, class BV, class YV, class M, class Epi>
void conv2d_forward_impl(const Exec& exec, const XV& x, const WV& w, const BV& bias, const YV& y,
                         const conv2d_problem& pb, conv2d_workspace<M>& ws, float alpha,
                         const Epi& epi) {
  check_workspace_space<XV, M>();
  forward_pass<Exec, XV, WV, BV, YV, M, Epi> pass{exec, x, w, bias, y, pb, ws, alpha, epi};
  run_conv_pass(exec, pb, pass);
}

template <class Exec, class DYV, class WV, class DXV, class M>
void conv2d_backward_data_impl(const Exec& exec, const DYV& dy, const WV& w, const DXV& dx,
                               const conv2d_problem& pb, conv2d_workspace<M>& ws, float alpha) {
  check_workspace_space<DXV, M>();
  backward_data_pass<Exec, DYV, WV, DXV, M> pass{exec, dy, w, dx, pb, ws, alpha};
  run_conv_pass(exec, pb, pass);
}

template <class Exec, class XV, class DYV, class DWV, class M>
void conv2d_backward_weight_impl(const Exec& exec, const XV& x, const DYV& dy, const DWV& dw,
                                 const conv2d_problem& pb, conv2d_workspace<M>& ws, float alpha) {
  check_workspace_space<XV, M>();
  backward_weight_pass<Exec, XV, DYV, DWV, M> pass{exec, x, dy, dw, pb, ws, alpha};
  run_conv_pass(exec, pb, pass);
}

/// dbias[k] = alpha * sum over n, p, q of dy[n, k, p, q]; each (n, p) row of Q is summed first,
/// so the fp32 error grows with Q + N*P rather than N*P*Q.
template <class Exec, class DYV, class DBV>
void conv2d_bias_grad(const Exec& exec, const DYV& dy, const DBV& db, float alpha) {
  using pb = typename DBV::precision;
  const index_t N = dy.extent(0), P = dy.extent(2), Q = dy.extent(3);
  Kokkos::parallel_for(
      "tessera::conv2d_backward_weight[bias]", Kokkos::RangePolicy<Exec>(exec, 0, dy.extent(1)),
      KOKKOS_LAMBDA(const index_t k) {
        float acc = 0.f;
        for (index_t n = 0; n < N; ++n)
          for (index_t p = 0; p < P; ++p) {
            float row = 0.f;
            for (index_t q = 0; q < Q; ++q) row += to_float(dy(n, k, p, q));
            acc += row;
          }
        db(k) = from_float<pb>(alpha * acc);
      });
  exec.fence();
}

} // namespace tessera::detail
