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

/// d[0, n) = s[0, n), d[0, n) += s[0, n) and d[0, n) = v, for runs that do not overlap (im2col's
/// column rows and image rows): the restrict qualifiers let the compiler vectorise the copies of
/// 16-bit and 8-bit storage types (bf16, fp8), whose plain loops it left scalar for fear of
/// aliasing.
template <class T>
TESSERA_INLINE void copy_run(T* __restrict__ d, const T* __restrict__ s, index_t n) {
  for (index_t i = 0; i < n; ++i) d[i] = s[i];
}
template <class T>
TESSERA_INLINE void add_run(T* __restrict__ d, const T* __restrict__ s, index_t n) {
  for (index_t i = 0; i < n; ++i) d[i] += s[i];
}
template <class T>
TESSERA_INLINE void fill_run(T* __restrict__ d, T v, index_t n) {
  for (index_t i = 0; i < n; ++i) d[i] = v;
}

/// Input rows per work item of col2im_tile: 8 amortises the per-item tap ranges over 8 rows
/// while a 14-row image still splits into 2 items per channel for 2 threads.
inline constexpr index_t col2im_band = 8;

/// The columns of a tile, channels [c0, c0 + cg), into the dense row-major (cg*R*S, t.cols(Q))
/// matrix at col. The element type of col is x's storage type: a copy, no rounding.
/// One work item per (image, channel, kernel row r): it writes the S rows (c, r, s) of the
/// matrix; the valid column range of each tap s is computed once, so the loops over output
/// rows and columns are branch-free copies (unit stride for stride 1).
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
  const st zero = from_float<typename XV::precision>(0.f);
  Kokkos::parallel_for(
      "tessera::im2col_tile", Kokkos::RangePolicy<Exec>(exec, 0, t.nb * cg * R),
      KOKKOS_LAMBDA(const index_t i) {
        const index_t j = i / (cg * R), c = i / R % cg, r = i % R;
        const st* xc = x0 + j * xs0 + c * xs1;
        // Output rows whose input row p*sh - pt + r*dh lies inside the image.
        index_t plo, phi;
        valid_output_range(H, p0 + np, sh, r * dh - pt, plo, phi);
        plo = plo > p0 ? plo : p0;
        phi = phi > plo ? phi : plo;
        for (index_t s = 0; s < S; ++s) {
          const index_t off = s * dw - pl;
          index_t lo, hi;
          valid_output_range(W, Q, sw, off, lo, hi);
          st* dst = col + ((c * R + r) * S + s) * ld + j * np * Q - p0 * Q; // row p at + p*Q
          if (plo > p0) fill_run(dst + p0 * Q, zero, (plo - p0) * Q);
          for (index_t p = plo; p < phi; ++p) {
            st* d = dst + p * Q;
            const st* src = xc + (p * sh - pt + r * dh) * xs2;
            fill_run(d, zero, lo);
            if (sw == 1 && xs3 == 1) {
              copy_run(d + lo, src + lo + off, hi - lo);
            } else {
              for (index_t q = lo; q < hi; ++q) d[q] = src[(q * sw + off) * xs3];
            }
            fill_run(d + hi, zero, Q - hi);
          }
          if (p0 + np > phi) fill_run(dst + phi * Q, zero, (p0 + np - phi) * Q);
        }
      });
}

/// Adds the dense row-major fp32 columns (cg*R*S, t.cols(Q)) of a tile into fp32 image planes:
/// image j of the tile, channel c, row h starts at img + j*img_ns + c*img_cs + h*W (rows of W
/// contiguous floats). Without accumulate, every row of the tile's images and cg channels is
/// first zeroed (the tile must then cover all P output rows); with it, only the input rows the
/// tile touches are visited. One work item per (image, channel, band of col2im_band input rows)
/// owns those rows, so no two items write the same element; per tap (r, s) it adds column rows
/// into image rows with branch-free loops.
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
  const index_t bands = (h1 - h0 + col2im_band - 1) / col2im_band;
  Kokkos::parallel_for(
      "tessera::col2im_tile", Kokkos::RangePolicy<Exec>(exec, 0, t.nb * cg * bands),
      KOKKOS_LAMBDA(const index_t i) {
        const index_t j = i / (cg * bands), c = i / bands % cg;
        const index_t hb = h0 + i % bands * col2im_band;
        const index_t he = hb + col2im_band < h1 ? hb + col2im_band : h1;
        float* plane = img + j * img_ns + c * img_cs;
        if (!accumulate)
          for (index_t e = hb * W; e < he * W; ++e) plane[e] = 0.f;
        for (index_t r = 0; r < R; ++r) {
          // Tile rows p whose input row p*sh - pt + r*dh lies in [hb, he).
          index_t plo, phi;
          valid_output_range(he - hb, p1, sh, r * dh - pt - hb, plo, phi);
          plo = plo > p0 ? plo : p0;
          for (index_t s = 0; s < S; ++s) {
            const index_t off = s * dw - pl;
            index_t lo, hi;
            valid_output_range(W, Q, sw, off, lo, hi);
            const float* src = col + ((c * R + r) * S + s) * ld + (j * np - p0) * Q;
            for (index_t p = plo; p < phi; ++p) {
              float* out = plane + (p * sh - pt + r * dh) * W;
              const float* in = src + p * Q;
              if (sw == 1) {
                add_run(out + lo + off, in + lo, hi - lo);
              } else {
                for (index_t q = lo; q < hi; ++q) out[q * sw + off] += in[q];
              }
            }
          }
        }
      });
}

/// Throws shape_error when the column matrix's sizes C*R*S or P*Q overflow 64-bit integers.
inline void check_col_sizes(const char* op, index_t C, index_t R, index_t S, index_t P, index_t Q) {
  index_t crs = 0, pq = 0;
  if (!checked_product({C, R, S}, crs) || !checked_product({P, Q}, pq))
    throw shape_error(std::string(op) + ": C*R*S = " + std::to_string(C) + "*" + std::to_string(R) +
                      "*" + std::to_string(S) + " or P*Q = " + std::to_string(P) + "*" +
                      std::to_string(Q) + " overflows 64-bit integers");
}

} // namespace detail

/// im2col: col[n, (c*R + r)*S + s, p*Q + q] = x[n, c, p*stride_h - pad_top + r*dilation_h,
/// q*stride_w - pad_left + s*dilation_w], 0 where that lies in the padding; converted to col's
/// precision (rounded to nearest even) if it differs from x's.
///
/// x (N, C, H, W) and col (N, C*R*S, P*Q): Tensors or TensorViews of any precision and strides.
/// Groups do not change the matrix (group g owns rows [g, g + 1) * C/groups*R*S).
/// Throws value_error / shape_error (col untouched) for bad parameters, an empty output, a col
/// of the wrong shape, or a col sharing memory with x.
template <class Exec, class X, class Col>
void im2col(const Exec& exec, const X& x_in, const Col& col_in, index_t R, index_t S,
            const conv2d_params& prm) {
  const auto x = detail::conv_as_view(x_in);
  const auto col = detail::conv_as_view(col_in);
  static_assert(decltype(x)::rank == 4, "tessera::im2col: x must be rank 4 (N, C, H, W).");
  static_assert(decltype(col)::rank == 3, "tessera::im2col: col must be rank 3 (N, C*R*S, P*Q).");
  const index_t N = x.extent(0), C = x.extent(1);
  const auto [P, Q] = prm.output_hw_for("tessera::im2col", x.extent(2), x.extent(3), R, S);
  detail::check_col_sizes("tessera::im2col", C, R, S, P, Q);
  if (col.extent(0) != N || col.extent(1) != C * R * S || col.extent(2) != P * Q)
    throw shape_error("tessera::im2col: x " + shape_string(x.extents()) + " with kernel " +
                      std::to_string(R) + "x" + std::to_string(S) + ", " + prm.to_string() +
                      " needs col (" + std::to_string(N) + ", " + std::to_string(C * R * S) + ", " +
                      std::to_string(P * Q) + ") but col is " + shape_string(col.extents()));
  detail::require_distinct("tessera::im2col", "col", col);
  detail::require_no_overlap("tessera::im2col", "col", col, "x", x);
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
/// an empty output, mismatched shapes, or an x sharing memory with col.
template <class Exec, class Col, class X>
void col2im(const Exec& exec, const Col& col_in, const X& x_in, index_t R, index_t S,
            const conv2d_params& prm) {
  const auto col = detail::conv_as_view(col_in);
  const auto x = detail::conv_as_view(x_in);
  static_assert(decltype(x)::rank == 4, "tessera::col2im: x must be rank 4 (N, C, H, W).");
  static_assert(decltype(col)::rank == 3, "tessera::col2im: col must be rank 3 (N, C*R*S, P*Q).");
  const index_t N = x.extent(0), C = x.extent(1), H = x.extent(2), W = x.extent(3);
  const auto [P, Q] = prm.output_hw_for("tessera::col2im", H, W, R, S);
  detail::check_col_sizes("tessera::col2im", C, R, S, P, Q);
  if (col.extent(0) != N || col.extent(1) != C * R * S || col.extent(2) != P * Q)
    throw shape_error("tessera::col2im: x " + shape_string(x.extents()) + " with kernel " +
                      std::to_string(R) + "x" + std::to_string(S) + ", " + prm.to_string() +
                      " needs col (" + std::to_string(N) + ", " + std::to_string(C * R * S) + ", " +
                      std::to_string(P * Q) + ") but col is " + shape_string(col.extents()));
  detail::require_distinct("tessera::col2im", "x", x);
  detail::require_no_overlap("tessera::col2im", "x", x, "col", col);
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
