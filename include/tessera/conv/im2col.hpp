#pragma once
/// \file conv/im2col.hpp
/// im2col and col2im: the rearrangements that turn a convolution into a matrix product.
///
/// For an image x (C, H, W), kernel R x S and output P x Q, the column matrix has one row per
/// (c, r, s) (s fastest, so it matches KCRS weights) and one column per output pixel (p, q):
///
///   col[(c*R + r)*S + s, p*Q + q] = x[c, p*stride_h - pad_top  + r*dilation_h,
///                                        q*stride_w - pad_left + s*dilation_w]   (0 outside)
///
/// so y_g = W_g * col_g with W_g the (K/groups, C/groups*R*S) rows of group g and col_g the
/// C/groups*R*S rows of group g's channels. col2im is the adjoint: every input pixel receives the
/// sum of all column entries that were copied from it (overlapping windows accumulate).
///
///   tessera::Tensor<tessera::fp32, tessera::dextents<3>> col("col", N, C * R * S, P * Q);
///   tessera::im2col(exec, x, col, R, S, params);     // x (N, C, H, W)
///   tessera::col2im(exec, col, dx, R, S, params);    // dx (N, C, H, W) overwritten
///
/// The convolutions do not materialise the whole (N, C*R*S, P*Q) matrix: they run the same index
/// maps on tiles of a few images or of a few output rows (detail::im2col_tile, col2im_tile).

#include <tessera/conv/params.hpp>
#include <tessera/tensor.hpp>

#include <string>

namespace tessera {

namespace detail {

/// The output positions [lo, hi) (clamped to [0, n_out)) whose input coordinate
/// o * stride + offset lies in [0, n_in). offset = kernel_tap * dilation - pad.
TESSERA_INLINE void valid_output_range(index_t n_in, index_t n_out, index_t stride, index_t offset,
                                       index_t& lo, index_t& hi) {
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride; // o * stride + offset >= 0
  const index_t top = n_in - 1 - offset;                  // o * stride + offset <= n_in - 1
  hi = top < 0 ? 0 : top / stride + 1;
  if (hi > n_out) hi = n_out;
  if (lo > hi) lo = hi;
}

template <class V>
auto conv_as_view(const V& t) {
  if constexpr (is_tensor<V>::value) {
    return t.view();
  } else {
    static_assert(is_tensor_view<V>::value,
                  "tessera conv: operands must be tessera::Tensor or tessera::TensorView.");
    return t;
  }
}

/// A tile of the output: images [n0, n0 + nb) and, of each, output rows [p0, p1). Its column
/// matrices are image-major: image j, pixel (p, q) is column (j*(p1 - p0) + p - p0)*Q + q.
struct conv_tile {
  index_t n0, nb, p0, p1;
  index_t rows() const noexcept { return p1 - p0; }
  /// Columns of the tile's matrices for an output width Q.
  index_t cols(index_t Q) const noexcept { return nb * (p1 - p0) * Q; }
};

/// The columns of a tile, channels [c0, c0 + cg), into the dense row-major (cg*R*S, t.cols(Q))
/// matrix at col. The element type of col is x's storage type: a copy, no rounding.
template <class Exec, class XV>
void im2col_tile(const Exec& exec, const XV& x, const conv_tile& t, index_t c0, index_t cg,
                 index_t R, index_t S, index_t Q, const conv2d_params& prm,
                 typename XV::storage_type* col) {
  using st = typename XV::storage_type;
  const index_t H = x.extent(2), W = x.extent(3), np = t.rows(), ld = t.cols(Q), p0 = t.p0;
  const index_t sh = prm.stride_h, sw = prm.stride_w, dh = prm.dilation_h, dw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left;
  const st* x0 = x.data() + t.n0 * x.stride(0) + c0 * x.stride(1);
  const index_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
  const index_t per_image = cg * R * S * np;
  const st zero = from_float<typename XV::precision>(0.f);
  Kokkos::parallel_for(
      "tessera::im2col_tile", Kokkos::RangePolicy<Exec>(exec, 0, t.nb * per_image),
      KOKKOS_LAMBDA(const index_t i) {
        const index_t j = i / per_image, row = i % per_image / np, p = p0 + i % np;
        const index_t c = row / (R * S), r = row / S % R, s = row % S;
        st* dst = col + row * ld + (j * np + p - p0) * Q;
        const index_t h = p * sh - pt + r * dh;
        if (h < 0 || h >= H) {
          for (index_t q = 0; q < Q; ++q) dst[q] = zero;
          return;
        }
        const index_t off = s * dw - pl;
        index_t lo, hi;
        valid_output_range(W, Q, sw, off, lo, hi);
        const st* src = x0 + j * xs0 + c * xs1 + h * xs2;
        for (index_t q = 0; q < lo; ++q) dst[q] = zero;
        if (sw == 1 && xs3 == 1) {
          for (index_t q = lo; q < hi; ++q) dst[q] = src[q + off];
        } else {
          for (index_t q = lo; q < hi; ++q) dst[q] = src[(q * sw + off) * xs3];
        }
        for (index_t q = hi; q < Q; ++q) dst[q] = zero;
      });
}

/// Adds the dense row-major fp32 columns (cg*R*S, t.cols(Q)) of a tile into fp32 image planes:
/// image j of the tile, channel c, row h starts at img + j*img_ns + c*img_cs + h*W (rows of W
/// contiguous floats). Without accumulate, every row of the tile's images and cg channels is
/// first zeroed (the tile must then cover all P output rows); with it, only the input rows the
/// tile touches are visited. Parallel over (image, channel, input row): each element is written
/// by one thread.
template <class Exec>
void col2im_tile(const Exec& exec, const float* col, const conv_tile& t, index_t cg, index_t R,
                 index_t S, index_t Q, const conv2d_params& prm, float* img, index_t img_ns,
                 index_t img_cs, index_t H, index_t W, bool accumulate) {
  const index_t np = t.rows(), ld = t.cols(Q), p0 = t.p0, p1 = t.p1;
  const index_t sh = prm.stride_h, sw = prm.stride_w, dh = prm.dilation_h, dw = prm.dilation_w;
  const index_t pt = prm.pad_top, pl = prm.pad_left;
  index_t h0 = 0, h1 = H;
  if (accumulate) {
    h0 = p0 * sh - pt;
    h1 = (p1 - 1) * sh - pt + (R - 1) * dh + 1;
    h0 = h0 < 0 ? 0 : h0;
    h1 = h1 > H ? H : h1;
    if (h1 <= h0) return;
  }
  const index_t nh = h1 - h0;
  Kokkos::parallel_for(
      "tessera::col2im_tile", Kokkos::RangePolicy<Exec>(exec, 0, t.nb * cg * nh),
      KOKKOS_LAMBDA(const index_t i) {
        const index_t j = i / (cg * nh), c = i / nh % cg, h = h0 + i % nh;
        float* out = img + j * img_ns + c * img_cs + h * W;
        if (!accumulate)
          for (index_t w = 0; w < W; ++w) out[w] = 0.f;
        for (index_t r = 0; r < R; ++r) {
          const index_t u = h + pt - r * dh;
          if (u < 0 || u % sh != 0) continue;
          const index_t p = u / sh;
          if (p < p0 || p >= p1) continue;
          for (index_t s = 0; s < S; ++s) {
            const index_t off = s * dw - pl;
            index_t lo, hi;
            valid_output_range(W, Q, sw, off, lo, hi);
            const float* src = col + ((c * R + r) * S + s) * ld + (j * np + p - p0) * Q;
            if (sw == 1) {
              for (index_t q = lo; q < hi; ++q) out[q + off] += src[q];
            } else {
              for (index_t q = lo; q < hi; ++q) out[q * sw + off] += src[q];
            }
          }
        }
      });
}

} // namespace detail

/// im2col: col[n, (c*R + r)*S + s, p*Q + q] = x[n, c, p*stride_h - pad_top + r*dilation_h,
/// q*stride_w - pad_left + s*dilation_w], 0 where that lies in the padding; converted to col's
/// precision (rounded to nearest even) if it differs from x's.
///
/// x (N, C, H, W) and col (N, C*R*S, P*Q): Tensors or TensorViews of any precision and strides.
/// Groups do not change the matrix (group g owns rows [g, g + 1) * C/groups*R*S).
/// Throws value_error / shape_error (col untouched) for bad parameters, an empty output or a col
/// of the wrong shape.
template <class Exec, class X, class Col>
void im2col(const Exec& exec, const X& x_in, const Col& col_in, index_t R, index_t S,
            const conv2d_params& prm) {
  const auto x = detail::conv_as_view(x_in);
  const auto col = detail::conv_as_view(col_in);
  static_assert(decltype(x)::rank == 4, "tessera::im2col: x must be rank 4 (N, C, H, W).");
  static_assert(decltype(col)::rank == 3, "tessera::im2col: col must be rank 3 (N, C*R*S, P*Q).");
  const index_t N = x.extent(0), C = x.extent(1);
  const auto [P, Q] = prm.output_hw_for("tessera::im2col", x.extent(2), x.extent(3), R, S);
  if (col.extent(0) != N || col.extent(1) != C * R * S || col.extent(2) != P * Q)
    throw shape_error("tessera::im2col: x " + shape_string(x.extents()) + " with kernel " +
                      std::to_string(R) + "x" + std::to_string(S) + ", " + prm.to_string() +
                      " needs col (" + std::to_string(N) + ", " + std::to_string(C * R * S) + ", " +
                      std::to_string(P * Q) + ") but col is " + shape_string(col.extents()));
  using pc = typename decltype(col)::precision;
  const index_t H = x.extent(2), W = x.extent(3), Qv = Q;
  const conv2d_params p = prm;
  Kokkos::parallel_for(
      "tessera::im2col",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {N, C * R * S, P}),
      KOKKOS_LAMBDA(const index_t n, const index_t row, const index_t op) {
        const index_t c = row / (R * S), r = row / S % R, s = row % S;
        const index_t h = op * p.stride_h - p.pad_top + r * p.dilation_h;
        for (index_t q = 0; q < Qv; ++q) {
          const index_t w = q * p.stride_w - p.pad_left + s * p.dilation_w;
          const bool inside = h >= 0 && h < H && w >= 0 && w < W;
          col(n, row, op * Qv + q) = from_float<pc>(inside ? to_float(x(n, c, h, w)) : 0.f);
        }
      });
  exec.fence();
}

/// col2im, the adjoint of im2col: x[n, c, h, w] = the sum (in fp32, rounded once to x's
/// precision) of every col[n, (c*R + r)*S + s, p*Q + q] that im2col copies from (h, w);
/// overlapping windows accumulate, pixels no window reads become 0. x is overwritten.
///
/// col (N, C*R*S, P*Q) and x (N, C, H, W): Tensors or TensorViews of any precision and strides;
/// H and W are taken from x. Throws value_error / shape_error (x untouched) for bad parameters,
/// an empty output or mismatched shapes.
template <class Exec, class Col, class X>
void col2im(const Exec& exec, const Col& col_in, const X& x_in, index_t R, index_t S,
            const conv2d_params& prm) {
  const auto col = detail::conv_as_view(col_in);
  const auto x = detail::conv_as_view(x_in);
  static_assert(decltype(x)::rank == 4, "tessera::col2im: x must be rank 4 (N, C, H, W).");
  static_assert(decltype(col)::rank == 3, "tessera::col2im: col must be rank 3 (N, C*R*S, P*Q).");
  const index_t N = x.extent(0), C = x.extent(1), H = x.extent(2), W = x.extent(3);
  const auto [P, Q] = prm.output_hw_for("tessera::col2im", H, W, R, S);
  if (col.extent(0) != N || col.extent(1) != C * R * S || col.extent(2) != P * Q)
    throw shape_error("tessera::col2im: x " + shape_string(x.extents()) + " with kernel " +
                      std::to_string(R) + "x" + std::to_string(S) + ", " + prm.to_string() +
                      " needs col (" + std::to_string(N) + ", " + std::to_string(C * R * S) + ", " +
                      std::to_string(P * Q) + ") but col is " + shape_string(col.extents()));
  using px = typename decltype(x)::precision;
  const index_t Pv = P, Qv = Q;
  const conv2d_params p = prm;
  Kokkos::parallel_for(
      "tessera::col2im", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(exec, {0, 0, 0}, {N, C, H}),
      KOKKOS_LAMBDA(const index_t n, const index_t c, const index_t h) {
        for (index_t w = 0; w < W; ++w) {
          float acc = 0.f;
          for (index_t r = 0; r < R; ++r) {
            const index_t t = h + p.pad_top - r * p.dilation_h;
            if (t < 0 || t % p.stride_h != 0 || t / p.stride_h >= Pv) continue;
            for (index_t s = 0; s < S; ++s) {
              const index_t u = w + p.pad_left - s * p.dilation_w;
              if (u < 0 || u % p.stride_w != 0 || u / p.stride_w >= Qv) continue;
              acc += to_float(col(n, (c * R + r) * S + s, t / p.stride_h * Qv + u / p.stride_w));
            }
          }
          x(n, c, h, w) = from_float<px>(acc);
        }
      });
  exec.fence();
}

} // namespace tessera
