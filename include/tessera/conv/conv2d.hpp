#pragma once
/// \file conv/conv2d.hpp
/// 2-D convolution, forward and both backward passes, as im2col + GEMM.
///
/// Shapes (NCHW activations, KCRS weights, all row-major within each image / filter):
///   x, dx (N, C, H, W)    w, dw (K, C/groups, R, S)    bias, dbias (K)    y, dy (N, K, P, Q)
/// with {P, Q} = params.output_hw(H, W, R, S). Operands are tessera::Tensor or TensorView of any
/// precision (fp32, bf16, fp8_e4m3, fp8_e5m2, mixed freely); every product is accumulated in
/// fp32 and each output element is rounded to its precision once. Outputs are overwritten.
/// The inputs x, w and dy may also be scaled fp8 tensors (tensor/scaled_tensor.hpp): their
/// scale_inv factors are applied to the fp32 accumulator (as GEMM's alpha).
///
///   tessera::conv2d_params p{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
///   tessera::conv2d_workspace<> ws;                              // reused across calls
///   tessera::conv2d_forward(exec, x, w, b, y, p, ws);            // y = conv(x, w) + b
///   tessera::conv2d_backward_data(exec, dy, w, dx, p, ws);       // dx = dL/dx
///   tessera::conv2d_backward_weight(exec, x, dy, dw, db, p, ws); // dw = dL/dw, db = dL/db
///   auto xq = tessera::quantize<tessera::fp8_e4m3>(x);           // scaled fp8
///   tessera::conv2d_forward(exec, xq, w, b, y, p, ws);           // y ~= conv(x, w) + b
///
/// Algorithm, per tile of the output (several whole images when they are small, else one image
/// in bands of output rows; sized by the workspace's column budget, see conv/workspace.hpp) and
/// per group g (Cg = C/groups, Kg = K/groups, CRS = Cg*R*S, t = the tile's pixels):
///   forward          col = im2col(x, tile)                             (CRS, t)
///                    y tile = W_g (Kg, CRS) * col                      (Kg, t)
///   backward-data    dcol = W_g^T (CRS, Kg) * dy tile                  (CRS, t) fp32
///                    dx += col2im(dcol)
///   backward-weight  dW_g (Kg, CRS) += dy tile (Kg, t) * col^T          fp32, over all tiles
///                    dbias[k] = sum over n, p, q of dy[n, k, p, q]
/// A one-image tile of y or dy is a matrix inside the tensor (no copy); multi-image tiles are
/// gathered / scattered. 1x1 convolutions with stride 1 and no padding use x (or write dx)
/// directly as the column matrix. For a low-precision y the forward bias and epilogue are fused
/// into the GEMM's store when the epilogue is a default-constructible functor (one rounding).
/// On host spaces, with fp32 operands, forward and stride-1 backward-data convolutions of at
/// least 16 output channels per group and a reduction of at least 64 (detail::use_implicit), and
/// backward-weight with at least 16 output channels per group, skip the column matrix: an
/// implicit GEMM gathers the GEMM's packed panels from x / dy directly (conv/detail/implicit.hpp),
/// one parallel region per call (plus one to pack the weights, or to add the threads' dW sums).
/// Convolutions with one input channel per group (depthwise: groups == C) use direct loops
/// (conv/detail/direct.hpp) instead of one tiny GEMM per channel.
///
/// Errors: ranks are checked at compile time; at run time mismatched channel counts, groups that
/// do not divide C and K, invalid parameters, an empty output, and outputs (or bias) of the wrong
/// shape throw tessera::shape_error / value_error naming the operation, the operands, their shapes
/// and the parameters, before anything is written.

#include <tessera/conv/detail/direct.hpp>
#include <tessera/conv/detail/implicit.hpp>
#include <tessera/conv/im2col.hpp>
#include <tessera/conv/params.hpp>
#include <tessera/conv/workspace.hpp>
#include <tessera/gemm/gemm.hpp>

#include <array>
#include <string>
#include <type_traits>

namespace tessera {

namespace detail {

struct no_bias_t {};

/// The default forward epilogue: none (skipped entirely, not called).
struct no_epilogue {
  TESSERA_INLINE float operator()(float v) const noexcept { return v; }
};

template <class T>
concept conv_operand = is_tensor<T>::value || is_tensor_view<T>::value;

template <class T>
struct is_scaled_tensor : std::false_type {};
template <class P, class E, class L, class M>
struct is_scaled_tensor<scaled_tensor<P, E, L, M>> : std::true_type {};

/// What an input (x, w, dy) may be: a Tensor, a TensorView, or a scaled fp8 tensor, whose
/// values are payload * scale_inv (the scale_inv factors become the GEMM's alpha).
template <class T>
concept conv_input = conv_operand<T> || is_scaled_tensor<T>::value;

template <class T>
auto input_view(const T& t) {
  if constexpr (is_scaled_tensor<T>::value) {
    return t.data.view();
  } else {
    return conv_as_view(t);
  }
}
template <class T>
float input_scale_inv(const T& t) {
  if constexpr (is_scaled_tensor<T>::value) {
    return t.scale_inv();
  } else {
    return 1.f;
  }
}

/// The sizes of a checked convolution.
struct conv2d_problem {
  index_t N, C, H, W, K, R, S, P, Q, G, Cg, Kg;
  conv2d_params prm;

  /// 1x1, stride 1, no padding: the column matrix of an image is the image itself.
  bool pointwise() const noexcept {
    return R == 1 && S == 1 && prm.stride_h == 1 && prm.stride_w == 1 && prm.pad_top == 0 &&
           prm.pad_bottom == 0 && prm.pad_left == 0 && prm.pad_right == 0;
  }
  /// One input channel per group and several groups (depthwise and channel multipliers).
  bool one_channel_per_group() const noexcept { return Cg == 1 && G > 1; }
};

template <class V>
std::string describe(const char* name, const V& v) {
  return std::string(name) + " " + shape_string(v.extents());
}

/// Activations must be row-major within each (H, W) plane; weights within each (C/g, R, S) filter
/// (true for every Tensor and for batch slices of one): the planes become matrix columns.
template <class V>
void require_rowmajor(const char* op, const char* name, const V& v, bool filter) {
  const index_t d1 = v.extent(1), d2 = v.extent(2), d3 = v.extent(3);
  bool ok = d2 * d3 <= 1 || (v.stride(3) == 1 && (d2 == 1 || v.stride(2) == d3));
  if (filter) ok = ok && (d1 <= 1 || v.stride(1) == d2 * d3);
  if (!ok)
    throw shape_error(std::string(op) + ": " + describe(name, v) + " has strides (" +
                      std::to_string(v.stride(0)) + ", " + std::to_string(v.stride(1)) + ", " +
                      std::to_string(v.stride(2)) + ", " + std::to_string(v.stride(3)) +
                      "); it must be row-major within each " +
                      (filter ? "filter (C/groups, R, S)" : "image plane (H, W)"));
}

/// True when both extents are static (compile-time checks apply only then).
constexpr bool static_pair(index_t a, index_t b) noexcept {
  return a != dyn && b != dyn;
}

/// Checks an (x-like, w-like, y-like) triple: (N, C, H, W), (K, C/groups, R, S), (N, K, P, Q).
template <class XV, class WV, class YV, class Prm>
conv2d_problem check_conv2d(const char* op, const char* xn, const XV& x, const char* wn,
                            const WV& w, const char* yn, const YV& y, const Prm& prm_in) {
  const conv2d_params prm = prm_in;
  static_assert(XV::rank == 4 && WV::rank == 4 && YV::rank == 4,
                "tessera::conv2d: activations must be rank 4 (N, C, H, W) and weights rank 4 "
                "(K, C/groups, R, S).");
  using xe = typename XV::extents_type;
  using we = typename WV::extents_type;
  using ye = typename YV::extents_type;
  static_assert(!static_pair(xe::static_extent(0), ye::static_extent(0)) ||
                    xe::static_extent(0) == ye::static_extent(0),
                "tessera::conv2d: the input and output activations have different static batch "
                "sizes (dimension 0).");
  static_assert(!static_pair(we::static_extent(0), ye::static_extent(1)) ||
                    we::static_extent(0) == ye::static_extent(1),
                "tessera::conv2d: the weights' static output channel count K (dimension 0) "
                "differs from the output activations' (dimension 1).");
  if constexpr (is_conv2d_static_params<Prm>::value) {
    constexpr index_t P = Prm::output_extent(xe::static_extent(2), we::static_extent(2), 0);
    constexpr index_t Q = Prm::output_extent(xe::static_extent(3), we::static_extent(3), 1);
    static_assert(P != -1 && Q != -1,
                  "tessera::conv2d: with these static parameters the dilated kernel does not fit "
                  "in the padded static input (the output would be empty).");
    static_assert((P == dyn || ye::static_extent(2) == dyn || P == ye::static_extent(2)) &&
                      (Q == dyn || ye::static_extent(3) == dyn || Q == ye::static_extent(3)),
                  "tessera::conv2d: the output activations' static height/width (dimensions 2, 3) "
                  "differ from the size the static parameters give for the static input and "
                  "kernel.");
    static_assert(xe::static_extent(1) == dyn || we::static_extent(1) == dyn ||
                      xe::static_extent(1) == we::static_extent(1) * Prm::groups,
                  "tessera::conv2d: the input's static channel count C (dimension 1) differs from "
                  "the weights' C/groups (dimension 1) times the static groups.");
  }
  const auto all = [&] {
    return std::string(op) + ": " + describe(xn, x) + ", " + describe(wn, w) + ", " +
           describe(yn, y) + ", " + prm.to_string() + ": ";
  };
  prm.validate(op);
  conv2d_problem pb{};
  pb.prm = prm;
  pb.N = x.extent(0), pb.C = x.extent(1), pb.H = x.extent(2), pb.W = x.extent(3);
  pb.K = w.extent(0), pb.R = w.extent(2), pb.S = w.extent(3), pb.G = prm.groups;
  if (pb.C < 1 || pb.K < 1)
    throw shape_error(all() + "the channel counts C (dim 1 of " + xn + ") and K (dim 0 of " + wn +
                      ") must be >= 1");
  if (pb.C % pb.G != 0 || pb.K % pb.G != 0)
    throw shape_error(all() + "groups " + std::to_string(pb.G) + " must divide both C = " +
                      std::to_string(pb.C) + " and K = " + std::to_string(pb.K));
  pb.Cg = pb.C / pb.G, pb.Kg = pb.K / pb.G;
  if (w.extent(1) != pb.Cg)
    throw shape_error(all() + std::string(wn) + " has " + std::to_string(w.extent(1)) +
                      " input channels per group but " + xn + " has C = " + std::to_string(pb.C) +
                      " channels in " + std::to_string(pb.G) + " groups, i.e. " +
                      std::to_string(pb.Cg) + " per group");
  const auto pq = prm.output_hw_for(op, pb.H, pb.W, pb.R, pb.S);
  pb.P = pq[0], pb.Q = pq[1];
  if (y.extent(0) != pb.N || y.extent(1) != pb.K || y.extent(2) != pb.P || y.extent(3) != pb.Q)
    throw shape_error(all() + std::string(yn) + " must be (N, K, P, Q) = (" + std::to_string(pb.N) +
                      ", " + std::to_string(pb.K) + ", " + std::to_string(pb.P) + ", " +
                      std::to_string(pb.Q) + ")");
  require_rowmajor(op, xn, x, false);
  require_rowmajor(op, wn, w, true);
  require_rowmajor(op, yn, y, false);
  return pb;
}

template <class BV>
void check_bias(const char* op, const char* bn, const BV& b, const conv2d_problem& pb) {
  static_assert(BV::rank == 1, "tessera::conv2d: the bias must be rank 1 (K).");
  if (b.extent(0) != pb.K)
    throw shape_error(std::string(op) + ": " + describe(bn, b) + " must have K = " +
                      std::to_string(pb.K) + " elements (one per output channel)");
}

/// A (rows, cols) row-major matrix view with leading dimension ld over raw storage.
template <class P, class M>
TensorView<P, dextents<2>, layout_stride, M> matrix_view(storage_t<P>* data, index_t rows,
                                                         index_t cols, index_t ld) {
  return {data, dextents<2>(rows, cols), {ld, 1}};
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

/// Output columns a GEMM call should have at least, when whole images are small: images are
/// grouped into one call until a tile has 4096 columns (e.g. 20 images of 14 x 14). Each call
/// costs a few parallel launches and barriers (10-50 us on a loaded 2-core host), which 4096
/// columns x (Kg x C/g*R*S) multiply-adds amortise for every layer of the benchmark set.
inline constexpr index_t target_tile_columns = 4096;

/// How the output is tiled: `images` whole images per tile (then rows == P), or one image in
/// tiles of `rows` output rows. Chosen so that a column tile of `row_elems` entries per output
/// row of `elem_bytes` each fits the budget (at least one output row per tile).
struct conv_plan {
  index_t images, rows;
  index_t max_cols(index_t Q) const noexcept { return images * rows * Q; }
};

inline conv_plan plan_tiles(const conv2d_problem& pb, std::size_t budget, index_t row_elems,
                            std::size_t elem_bytes) {
  const std::size_t row_bytes = static_cast<std::size_t>(row_elems) * elem_bytes;
  const std::size_t fit = row_bytes == 0 ? static_cast<std::size_t>(pb.P) : budget / row_bytes;
  if (fit < static_cast<std::size_t>(pb.P)) return {1, fit < 1 ? 1 : static_cast<index_t>(fit)};
  const index_t pq = pb.P * pb.Q < 1 ? 1 : pb.P * pb.Q;
  index_t nb = target_tile_columns / pq;
  const index_t fit_images = static_cast<index_t>(fit / static_cast<std::size_t>(pb.P));
  nb = nb < fit_images ? nb : fit_images;
  nb = nb < pb.N ? nb : pb.N;
  return {nb < 1 ? 1 : nb, pb.P};
}

/// Calls f(tile) for the tiles of a plan: images outer, output rows inner.
template <class F>
void for_each_tile(const conv2d_problem& pb, const conv_plan& plan, F&& f) {
  for (index_t n0 = 0; n0 < pb.N; n0 += plan.images)
    for (index_t p0 = 0; p0 < pb.P; p0 += plan.rows)
      f(conv_tile{n0, n0 + plan.images < pb.N ? plan.images : pb.N - n0, p0,
                  p0 + plan.rows < pb.P ? p0 + plan.rows : pb.P});
}

/// Consecutive 64-byte aligned regions of the given sizes from one workspace allocation.
template <std::size_t K, class M>
std::array<unsigned char*, K> carve(conv2d_workspace<M>& ws, std::array<std::size_t, K> bytes) {
  std::size_t total = 0;
  for (auto& b : bytes) total += b = round_up_64(b);
  unsigned char* p = ws.reserve(total);
  std::array<unsigned char*, K> out{};
  for (std::size_t i = 0; i < K; ++i) out[i] = p, p += bytes[i];
  return out;
}

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
        auto* dst = out + k * ld + j * pix;
        for (index_t e = 0; e < pix; ++e) dst[e] = src[e];
      });
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

template <class XV, class M>
void check_workspace_space() {
  static_assert(std::is_same_v<typename XV::memory_space, M>,
                "tessera::conv2d: the workspace must live in the tensors' memory space "
                "(conv2d_workspace<MemorySpace>).");
}

/// When the implicit-GEMM path (conv/detail/implicit.hpp) is taken, for a pass whose GEMM has
/// `channels` output channels per group and a reduction of `reduction` = channels in * R * S:
///  - at least 16 channels: its channel panels are 32 wide, fewer would leave most unused;
///  - a reduction of at least 64: below that the transposed store of its pixel-major results
///    to NCHW costs more than the GEMM (measured: C*R*S = 9 runs 1.5x faster as im2col + GEMM);
///  - not 1x1 stride 1 unpadded: the GEMM then reads x itself (no im2col to save) and writes y
///    rows directly, 2x faster than the transposed store (C = 64, K = 256, 56 x 56).
inline constexpr index_t implicit_min_channels = 16;
inline constexpr index_t implicit_min_reduction = 64;

inline index_t crs_of(const conv2d_problem& pb, index_t channels_in) {
  return channels_in * pb.R * pb.S;
}
inline bool use_implicit(const conv2d_problem& pb, index_t channels, index_t reduction) {
  return channels >= implicit_min_channels && reduction >= implicit_min_reduction &&
         !pb.pointwise();
}

#if !TESSERA_DEVICE_PASS
/// The implicit-GEMM geometry of conv2d_forward.
inline implicit_conv::geometry forward_geometry(const conv2d_problem& pb, float alpha) {
  const conv2d_params& p = pb.prm;
  return {.N = pb.N,
          .G = pb.G,
          .cin = pb.Cg,
          .cout = pb.Kg,
          .Hin = pb.H,
          .Win = pb.W,
          .Hout = pb.P,
          .Wout = pb.Q,
          .R = pb.R,
          .S = pb.S,
          .sh = p.stride_h,
          .sw = p.stride_w,
          .dh = p.dilation_h,
          .dw = p.dilation_w,
          .pt = p.pad_top,
          .pl = p.pad_left,
          .alpha = alpha};
}

/// The implicit-GEMM geometry of conv2d_backward_data with stride 1: dx is the convolution of
/// dy (cin = K/groups channels per group) with the weights flipped in R and S and transposed per
/// group, padding dilation*(R - 1) - pad (negative when pad is larger: a crop).
inline implicit_conv::geometry backward_data_geometry(const conv2d_problem& pb, float alpha) {
  const conv2d_params& p = pb.prm;
  return {.N = pb.N,
          .G = pb.G,
          .cin = pb.Kg,
          .cout = pb.Cg,
          .Hin = pb.P,
          .Win = pb.Q,
          .Hout = pb.H,
          .Wout = pb.W,
          .R = pb.R,
          .S = pb.S,
          .sh = 1,
          .sw = 1,
          .dh = p.dilation_h,
          .dw = p.dilation_w,
          .pt = p.dilation_h * (pb.R - 1) - p.pad_top,
          .pl = p.dilation_w * (pb.S - 1) - p.pad_left,
          .alpha = alpha};
}

/// Runs an implicit convolution of `in` into `out` (both rank-4 NCHW views) with the weights
/// w, wval(w data, group, kk, j) giving B(kk, j) of a group; store_value(k, v) turns the fp32
/// value alpha * sum of output channel k into the stored one (bias, epilogue, rounding).
template <class Exec, class IV, class WV, class OV, class M, class WVal, class StoreValue>
void run_implicit(const Exec& exec, const implicit_conv::geometry& g, const IV& in, const WV& w,
                  const OV& out, conv2d_workspace<M>& ws, const WVal& wval,
                  const StoreValue& store_value) {
  namespace ic = implicit_conv;
  const auto parts = static_cast<std::size_t>(ic::parts_for(exec, g));
  const auto [b_mem, s_mem] =
      carve<2>(ws, {ic::packed_b_floats(g) * 4, parts * (ic::a_floats() + ic::c_floats(g)) * 4});
  auto* packed = reinterpret_cast<float*>(b_mem);
  const auto* wd = w.data();
  ic::pack_weights(exec, g, packed,
                   [=](index_t gi, index_t kk, index_t j) { return wval(wd, gi, kk, j); });
  exec.fence();
  const index_t np = g.npad();
  ic::run(exec, g, in.data(), in.stride(0), in.stride(1), in.stride(2), packed, out.data(),
          out.stride(0), out.stride(1), reinterpret_cast<float*>(s_mem),
          [&](const float* sums, index_t k, auto* dst, index_t count) {
            for (index_t i = 0; i < count; ++i) dst[i] = store_value(k, g.alpha * sums[i * np]);
          });
  exec.fence();
}
#endif

template <class Exec, class XV, class WV, class BV, class YV, class M, class Epi>
void conv2d_forward_impl(const Exec& exec, const XV& x, const WV& w, const BV& bias, const YV& y,
                         const conv2d_problem& pb, conv2d_workspace<M>& ws, float alpha,
                         const Epi& epi) {
  check_workspace_space<XV, M>();
  constexpr bool has_bias = !std::is_same_v<BV, no_bias_t>;
  constexpr bool post = has_bias || !std::is_same_v<Epi, no_epilogue>; // a pass after the GEMM
  using px = typename XV::precision;
  using pw = typename WV::precision;
  using py = typename YV::precision;
  // Named copies, not a structured binding: lambdas below capture them (clang < 16 cannot
  // capture structured bindings).
  [[maybe_unused]] const index_t N = pb.N, C = pb.C, H = pb.H, W = pb.W, K = pb.K, R = pb.R,
                                 S = pb.S, P = pb.P, Q = pb.Q, G = pb.G, Cg = pb.Cg, Kg = pb.Kg;
  const conv2d_params& prm = pb.prm;
  if (N == 0) return;
  if (pb.one_channel_per_group()) {
    direct_cg1_forward<has_bias>(exec, x, w, bias, y, prm, alpha, epi);
    exec.fence();
    return;
  }
#if !TESSERA_DEVICE_PASS
  if constexpr (implicit_capable_v<Exec, px, pw>) {
    if (use_implicit(pb, Kg, crs_of(pb, Cg))) {
      // A filter (C/groups, R, S) is row-major (require_rowmajor): tap kk is at offset kk.
      const index_t ws0 = w.stride(0);
      run_implicit(
          exec, forward_geometry(pb, alpha), x, w, y, ws,
          [=](const auto* wd, index_t gi, index_t kk, index_t j) {
            return to_float(wd[(gi * Kg + j) * ws0 + kk]);
          },
          [&](index_t k, float v) {
            float b = 0.f;
            if constexpr (has_bias) b = to_float(bias(k));
            return from_float<py>(epi(v + b));
          });
      return;
    }
  }
#endif
  const index_t crs = Cg * R * S;
  const std::size_t xe = sizeof(storage_t<px>);
  const auto plan = plan_tiles(pb, ws.column_budget(), crs * Q, xe);
  // Tiles of one image are matrices inside x and y; tiles of several images are gathered into
  // columns (im2col, also for 1x1) and scattered back from an fp32 tile. An fp32 y gets the
  // bias and epilogue in a pass over y (vectorised; the GEMM applies epilogue ops one element at
  // a time, 8% slower for a 1x1 layer with K/groups = 64 rows). A low-precision y must be
  // rounded once: the bias and epilogue are fused into the GEMM's store when the epilogue can be
  // an op of a tessera::epilogue (default-constructible and assignable: not a lambda), else y
  // goes through the fp32 tile.
  constexpr bool fuse = !std::is_same_v<py, fp32> && std::is_default_constructible_v<Epi> &&
                        std::is_copy_assignable_v<Epi>;
  const bool col_needed = !(pb.pointwise() && plan.images == 1);
  const bool direct_out = plan.images == 1 && (fuse || !post || std::is_same_v<py, fp32>);
  const index_t maxc = plan.max_cols(Q);
  const auto [col_mem, out_mem] =
      carve<2>(ws, {col_needed ? static_cast<std::size_t>(crs * maxc) * xe : 0,
                    direct_out ? 0 : static_cast<std::size_t>(Kg * maxc) * 4});
  auto* col = reinterpret_cast<storage_t<px>*>(col_mem);
  auto* out = reinterpret_cast<float*>(out_mem);
  const gemm_options opts{.alpha = alpha, .beta = 0.f};
  for_each_tile(pb, plan, [&](const conv_tile& t) {
    const index_t cols = t.cols(Q);
    for (index_t g = 0; g < G; ++g) {
      const auto wg = matrix_view<pw, M>(w.data() + g * Kg * w.stride(0), Kg, crs, w.stride(0));
      auto b = matrix_view<px, M>(col, crs, cols, cols);
      if (col_needed) {
        im2col_tile(exec, x, t, g * Cg, Cg, R, S, Q, prm, col);
      } else {
        b = matrix_view<px, M>(x.data() + t.n0 * x.stride(0) + g * Cg * x.stride(1) + t.p0 * W, Cg,
                               cols, x.stride(1));
      }
      if (direct_out) {
        const auto yt = matrix_view<py, M>(
            y.data() + t.n0 * y.stride(0) + g * Kg * y.stride(1) + t.p0 * Q, Kg, cols, y.stride(1));
        if constexpr (post && fuse) {
          gemm(exec, wg, b, yt,
               epilogue<conv_bias_op<has_bias, BV, Epi>>{
                   .alpha = alpha, .beta = 0.f, .ops = {{bias, g * Kg, epi}}});
        } else {
          gemm(exec, wg, b, yt, opts);
          if constexpr (post) bias_epilogue<has_bias>(exec, yt, yt, bias, g * Kg, epi);
        }
      } else {
        gemm(exec, wg, b, matrix_view<fp32, M>(out, Kg, cols, cols), opts);
        scatter_tile<has_bias>(exec, out, y, t, g * Kg, Kg, Q, bias, epi);
      }
    }
  });
  exec.fence();
}

template <class Exec, class DYV, class WV, class DXV, class M>
void conv2d_backward_data_impl(const Exec& exec, const DYV& dy, const WV& w, const DXV& dx,
                               const conv2d_problem& pb, conv2d_workspace<M>& ws, float alpha) {
  check_workspace_space<DXV, M>();
  using pdy = typename DYV::precision;
  using pw = typename WV::precision;
  using pdx = typename DXV::precision;
  // Named copies, not a structured binding: lambdas below capture them (clang < 16 cannot
  // capture structured bindings).
  [[maybe_unused]] const index_t N = pb.N, C = pb.C, H = pb.H, W = pb.W, K = pb.K, R = pb.R,
                                 S = pb.S, P = pb.P, Q = pb.Q, G = pb.G, Cg = pb.Cg, Kg = pb.Kg;
  const conv2d_params& prm = pb.prm;
  if (N == 0) return;
  if (pb.one_channel_per_group()) {
    direct_cg1_backward_data(exec, dy, w, dx, prm, alpha);
    exec.fence();
    return;
  }
#if !TESSERA_DEVICE_PASS
  if constexpr (implicit_capable_v<Exec, pdy, pw>) {
    if (prm.stride_h == 1 && prm.stride_w == 1 && use_implicit(pb, Cg, crs_of(pb, Kg))) {
      // Tap kk = (k, r, s) reads w[k, j, R-1-r, S-1-s]: offset (R*S - 1 - (r*S + s)) in the
      // row-major (R, S) plane of input channel j, planes R*S apart.
      const index_t ws0 = w.stride(0), RS = R * S;
      run_implicit(
          exec, backward_data_geometry(pb, alpha), dy, w, dx, ws,
          [=](const auto* wd, index_t gi, index_t kk, index_t j) {
            const index_t k = kk / RS, t = kk - k * RS;
            return to_float(wd[(gi * Kg + k) * ws0 + j * RS + RS - 1 - t]);
          },
          [](index_t, float v) { return from_float<pdx>(v); });
      return;
    }
  }
#endif
  const index_t crs = Cg * R * S;
  const gemm_options opts{.alpha = alpha, .beta = 0.f};
  const auto wg_t = [&](index_t g) {
    return transpose(matrix_view<pw, M>(w.data() + g * Kg * w.stride(0), Kg, crs, w.stride(0)));
  };
  const auto dy_view = [&](const conv_tile& t, index_t g) { // one image's tile, in place
    return matrix_view<pdy, M>(dy.data() + t.n0 * dy.stride(0) + g * Kg * dy.stride(1) + t.p0 * Q,
                               Kg, t.cols(Q), dy.stride(1));
  };
  if (pb.pointwise()) { // dx[n, g] (Cg, H*W) = W_g^T dy[n, g]: no columns, one rounding
    for (index_t n = 0; n < N; ++n)
      for (index_t g = 0; g < G; ++g)
        gemm(exec, wg_t(g), dy_view(conv_tile{n, 1, 0, P}, g),
             matrix_view<pdx, M>(dx.data() + n * dx.stride(0) + g * Cg * dx.stride(1), Cg, H * W,
                                 dx.stride(1)),
             opts);
    exec.fence();
    return;
  }
  constexpr bool dx_f32 = std::is_same_v<pdx, fp32>;
  const auto plan = plan_tiles(pb, ws.column_budget(), crs * Q, 4);
  const bool single = plan.rows >= P; // whole images per tile: col2im overwrites
  const bool direct_dy = plan.images == 1;
  const index_t maxc = plan.max_cols(Q);
  const auto [dcol_mem, dyg_mem, img_mem] =
      carve<3>(ws, {static_cast<std::size_t>(crs * maxc) * 4,
                    direct_dy ? 0 : static_cast<std::size_t>(Kg * maxc) * sizeof(storage_t<pdy>),
                    dx_f32 ? 0 : static_cast<std::size_t>(plan.images * C * H * W) * 4});
  auto* dcol = reinterpret_cast<float*>(dcol_mem);
  auto* dyg = reinterpret_cast<storage_t<pdy>*>(dyg_mem);
  auto* img = reinterpret_cast<float*>(img_mem);
  for_each_tile(pb, plan, [&](const conv_tile& t) {
    const index_t cols = t.cols(Q);
    float* target = img; // fp32 accumulation target: dx itself, or dense scratch images
    index_t tns = C * H * W, tcs = H * W;
    if constexpr (dx_f32) {
      target = dx.data() + t.n0 * dx.stride(0);
      tns = dx.stride(0), tcs = dx.stride(1);
    }
    if (!single && t.p0 == 0) zero_planes(exec, target, C, tcs, H, W); // nb == 1 here
    for (index_t g = 0; g < G; ++g) {
      auto dyt = matrix_view<pdy, M>(dyg, Kg, cols, cols);
      if (direct_dy) {
        dyt = dy_view(t, g);
      } else {
        gather_tile(exec, dy, t, g * Kg, Kg, Q, dyg);
      }
      gemm(exec, wg_t(g), dyt, matrix_view<fp32, M>(dcol, crs, cols, cols), opts);
      col2im_tile(exec, dcol, t, Cg, R, S, Q, prm, target + g * Cg * tcs, tns, tcs, H, W, !single);
    }
    if constexpr (!dx_f32)
      if (t.p1 == P)
        store_images<Exec, pdx>(exec, img, dx.data() + t.n0 * dx.stride(0), t.nb, dx.stride(0), C,
                                dx.stride(1), H, W);
  });
  exec.fence();
}

template <class Exec, class XV, class DYV, class DWV, class M>
void conv2d_backward_weight_impl(const Exec& exec, const XV& x, const DYV& dy, const DWV& dw,
                                 const conv2d_problem& pb, conv2d_workspace<M>& ws, float alpha) {
  check_workspace_space<XV, M>();
  using px = typename XV::precision;
  using pdy = typename DYV::precision;
  using pdw = typename DWV::precision;
  // Named copies, not a structured binding: lambdas below capture them (clang < 16 cannot
  // capture structured bindings).
  [[maybe_unused]] const index_t N = pb.N, C = pb.C, H = pb.H, W = pb.W, K = pb.K, R = pb.R,
                                 S = pb.S, P = pb.P, Q = pb.Q, G = pb.G, Cg = pb.Cg, Kg = pb.Kg;
  const conv2d_params& prm = pb.prm;
  if (pb.one_channel_per_group()) { // N == 0 included: the empty sums give zeros
    direct_cg1_backward_weight(exec, x, dy, dw, prm, alpha);
    exec.fence();
    return;
  }
#if !TESSERA_DEVICE_PASS
  if constexpr (implicit_capable_v<Exec, fp32, fp32>) {
    // fp32 x and dy run the implicit path as they are. Low-precision ones only with a reduction
    // C/groups*R*S under 16 (a first layer: 1 x 3 x 3), where the GEMM dW = dy col^T is too thin
    // for the low-precision kernels and decodes every element in the direct loop (1 GFLOP/s for
    // fp8): they are widened to fp32 (exact), the same products 10-25x faster.
    constexpr bool native = implicit_capable_v<Exec, px, pdy>;
    const bool widen = !native && crs_of(pb, Cg) < 16 && x.is_contiguous() && dy.is_contiguous();
    if (N > 0 && Kg >= implicit_min_channels && (native || widen)) {
      namespace ic = implicit_conv;
      const auto g = forward_geometry(pb, alpha);
      const std::size_t nx = native ? 0 : static_cast<std::size_t>(x.size());
      const std::size_t ndy = native ? 0 : static_cast<std::size_t>(dy.size());
      const auto [x_mem, dy_mem, s_mem] =
          carve<3>(ws, {nx * 4, ndy * 4,
                        static_cast<std::size_t>(ic::weight_parts(exec, g)) *
                            ic::weight_scratch_floats(g) * 4});
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
      // A filter (C/groups, R, S) is row-major (require_rowmajor): tap kk is at offset kk.
      const index_t ws0 = dw.stride(0);
      auto* dwd = dw.data();
      ic::run_weight(
          exec, g, xin, xs[0], xs[1], xs[2], dyin, dys[0], dys[1], reinterpret_cast<float*>(s_mem),
          [=](index_t k, index_t kk, float v) { dwd[k * ws0 + kk] = from_float<pdw>(v); });
      exec.fence();
      return;
    }
  }
#endif
  const index_t crs = Cg * R * S;
  constexpr bool dw_f32 = std::is_same_v<pdw, fp32>;
  const std::size_t xe = sizeof(storage_t<px>);
  const auto plan = plan_tiles(pb, ws.column_budget(), crs * Q, xe);
  const bool col_needed = !(pb.pointwise() && plan.images == 1);
  const bool direct_dy = plan.images == 1;
  const index_t maxc = plan.max_cols(Q);
  const auto [col_mem, dyg_mem, acc_mem] =
      carve<3>(ws, {col_needed ? static_cast<std::size_t>(crs * maxc) * xe : 0,
                    direct_dy ? 0 : static_cast<std::size_t>(Kg * maxc) * sizeof(storage_t<pdy>),
                    dw_f32 ? 0 : static_cast<std::size_t>(K * crs) * 4});
  auto* col = reinterpret_cast<storage_t<px>*>(col_mem);
  auto* dyg = reinterpret_cast<storage_t<pdy>*>(dyg_mem);
  float* target = reinterpret_cast<float*>(acc_mem); // fp32 accumulation of dW over tiles
  index_t ld = crs;
  if constexpr (dw_f32) { // accumulate straight into dw
    target = dw.data();
    ld = dw.stride(0);
  }
  if (N == 0) zero_planes(exec, target, K, ld, 1, crs);
  for_each_tile(pb, plan, [&](const conv_tile& t) {
    const index_t cols = t.cols(Q);
    for (index_t g = 0; g < G; ++g) {
      auto b = matrix_view<px, M>(col, crs, cols, cols);
      if (col_needed) {
        im2col_tile(exec, x, t, g * Cg, Cg, R, S, Q, prm, col);
      } else {
        b = matrix_view<px, M>(x.data() + t.n0 * x.stride(0) + g * Cg * x.stride(1) + t.p0 * W, Cg,
                               cols, x.stride(1));
      }
      auto dyt = matrix_view<pdy, M>(dyg, Kg, cols, cols);
      if (direct_dy) {
        dyt =
            matrix_view<pdy, M>(dy.data() + t.n0 * dy.stride(0) + g * Kg * dy.stride(1) + t.p0 * Q,
                                Kg, cols, dy.stride(1));
      } else {
        gather_tile(exec, dy, t, g * Kg, Kg, Q, dyg);
      }
      const float beta = t.n0 == 0 && t.p0 == 0 ? 0.f : 1.f; // the first tile overwrites
      gemm(exec, dyt, transpose(b), matrix_view<fp32, M>(target + g * Kg * ld, Kg, crs, ld),
           gemm_options{.alpha = alpha, .beta = beta});
    }
  });
  if constexpr (!dw_f32)
    store_images<Exec, pdw>(exec, target, dw.data(), 1, 0, K, dw.stride(0), 1, crs);
  exec.fence();
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

} // namespace detail

/// y = conv2d(x, w) (+ bias): y[n, k, p, q] = sum_{c in group(k), r, s} x[n, c, p*stride_h -
/// pad_top + r*dilation_h, q*stride_w - pad_left + s*dilation_w] w[k, c - group start, r, s]
/// (+ bias[k]). x (N, C, H, W), w (K, C/groups, R, S), bias (K), y (N, K, P, Q) overwritten.
/// Scratch memory comes from ws (grown at the start of the call if needed). The optional
/// epilogue, a float(float) callable on the execution space, is applied to every output value
/// after the bias and before the rounding to y's precision (e.g. a fused ReLU):
///   tessera::conv2d_forward(exec, x, w, b, y, {.pad_top = 1, ...}, ws,
///                           KOKKOS_LAMBDA(float v) { return v > 0.f ? v : 0.f; });
template <class Exec, detail::conv_input X, detail::conv_input Wt, detail::conv_operand B,
          detail::conv_operand Y, class M, class Epi = detail::no_epilogue,
          Conv2dParams Prm = conv2d_params>
void conv2d_forward(const Exec& exec, const X& x_in, const Wt& w_in, const B& bias_in,
                    const Y& y_in, const Prm& params, conv2d_workspace<M>& ws,
                    const Epi& epilogue = {}) {
  const auto x = detail::input_view(x_in);
  const auto w = detail::input_view(w_in);
  const auto bias = detail::conv_as_view(bias_in);
  const auto y = detail::conv_as_view(y_in);
  const char* op = "tessera::conv2d_forward";
  const auto pb = detail::check_conv2d(op, "x", x, "w", w, "y", y, params);
  detail::check_bias(op, "bias", bias, pb);
  detail::conv2d_forward_impl(exec, x, w, bias, y, pb, ws,
                              detail::input_scale_inv(x_in) * detail::input_scale_inv(w_in),
                              epilogue);
}

/// y = conv2d(x, w) without bias; see the overload with bias.
template <class Exec, detail::conv_input X, detail::conv_input Wt, detail::conv_operand Y, class M,
          class Epi = detail::no_epilogue, Conv2dParams Prm = conv2d_params>
void conv2d_forward(const Exec& exec, const X& x_in, const Wt& w_in, const Y& y_in,
                    const Prm& params, conv2d_workspace<M>& ws, const Epi& epilogue = {}) {
  const auto x = detail::input_view(x_in);
  const auto w = detail::input_view(w_in);
  const auto y = detail::conv_as_view(y_in);
  const auto pb = detail::check_conv2d("tessera::conv2d_forward", "x", x, "w", w, "y", y, params);
  detail::conv2d_forward_impl(exec, x, w, detail::no_bias_t{}, y, pb, ws,
                              detail::input_scale_inv(x_in) * detail::input_scale_inv(w_in),
                              epilogue);
}

/// dx = dL/dx for y = conv2d(x, w): the transposed convolution of dy with w.
/// dy (N, K, P, Q), w (K, C/groups, R, S), dx (N, C, H, W) overwritten; H and W are dx's.
template <class Exec, detail::conv_input DY, detail::conv_input Wt, detail::conv_operand DX,
          class M, Conv2dParams Prm = conv2d_params>
void conv2d_backward_data(const Exec& exec, const DY& dy_in, const Wt& w_in, const DX& dx_in,
                          const Prm& params, conv2d_workspace<M>& ws) {
  const auto dy = detail::input_view(dy_in);
  const auto w = detail::input_view(w_in);
  const auto dx = detail::conv_as_view(dx_in);
  const auto pb =
      detail::check_conv2d("tessera::conv2d_backward_data", "dx", dx, "w", w, "dy", dy, params);
  detail::conv2d_backward_data_impl(exec, dy, w, dx, pb, ws,
                                    detail::input_scale_inv(dy_in) * detail::input_scale_inv(w_in));
}

/// dw = dL/dw for y = conv2d(x, w): dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] times
/// the input pixel (c, r, s) of window (p, q). x (N, C, H, W), dy (N, K, P, Q),
/// dw (K, C/groups, R, S) overwritten (zero for N == 0).
template <class Exec, detail::conv_input X, detail::conv_input DY, detail::conv_operand DW, class M,
          Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x_in, const DY& dy_in, const DW& dw_in,
                            const Prm& params, conv2d_workspace<M>& ws) {
  const auto x = detail::input_view(x_in);
  const auto dy = detail::input_view(dy_in);
  const auto dw = detail::conv_as_view(dw_in);
  const auto pb =
      detail::check_conv2d("tessera::conv2d_backward_weight", "x", x, "dw", dw, "dy", dy, params);
  detail::conv2d_backward_weight_impl(
      exec, x, dy, dw, pb, ws, detail::input_scale_inv(x_in) * detail::input_scale_inv(dy_in));
}

/// dw as above and dbias[k] = sum over n, p, q of dy[n, k, p, q] (dbias (K) overwritten).
template <class Exec, detail::conv_input X, detail::conv_input DY, detail::conv_operand DW,
          detail::conv_operand DB, class M, Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x_in, const DY& dy_in, const DW& dw_in,
                            const DB& db_in, const Prm& params, conv2d_workspace<M>& ws) {
  const auto x = detail::input_view(x_in);
  const auto dy = detail::input_view(dy_in);
  const auto dw = detail::conv_as_view(dw_in);
  const auto db = detail::conv_as_view(db_in);
  const char* op = "tessera::conv2d_backward_weight";
  const auto pb = detail::check_conv2d(op, "x", x, "dw", dw, "dy", dy, params);
  detail::check_bias(op, "dbias", db, pb);
  detail::conv2d_backward_weight_impl(
      exec, x, dy, dw, pb, ws, detail::input_scale_inv(x_in) * detail::input_scale_inv(dy_in));
  detail::conv2d_bias_grad(exec, dy, db, detail::input_scale_inv(dy_in));
}

// The same five calls without a workspace argument: each allocates a temporary workspace (once,
// at its start). Layers called repeatedly should keep a conv2d_workspace and pass it.

template <class Exec, detail::conv_input X, detail::conv_input Wt, detail::conv_operand Y,
          Conv2dParams Prm = conv2d_params>
void conv2d_forward(const Exec& exec, const X& x, const Wt& w, const Y& y, const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_forward(exec, x, w, y, params, ws);
}
template <class Exec, detail::conv_input X, detail::conv_input Wt, detail::conv_operand B,
          detail::conv_operand Y, Conv2dParams Prm = conv2d_params>
void conv2d_forward(const Exec& exec, const X& x, const Wt& w, const B& bias, const Y& y,
                    const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_forward(exec, x, w, bias, y, params, ws);
}
template <class Exec, detail::conv_input DY, detail::conv_input Wt, detail::conv_operand DX,
          Conv2dParams Prm = conv2d_params>
void conv2d_backward_data(const Exec& exec, const DY& dy, const Wt& w, const DX& dx,
                          const Prm& params) {
  conv2d_workspace<typename DX::memory_space> ws;
  conv2d_backward_data(exec, dy, w, dx, params, ws);
}
template <class Exec, detail::conv_input X, detail::conv_input DY, detail::conv_operand DW,
          Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x, const DY& dy, const DW& dw,
                            const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_backward_weight(exec, x, dy, dw, params, ws);
}
template <class Exec, detail::conv_input X, detail::conv_input DY, detail::conv_operand DW,
          detail::conv_operand DB, Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x, const DY& dy, const DW& dw,
                            const DB& dbias, const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_backward_weight(exec, x, dy, dw, dbias, params, ws);
}

} // namespace tessera
