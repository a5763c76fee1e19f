#pragma once
/// \file conv/detail/checks.hpp
/// The checks of conv2d's public calls, before anything is written: what an operand may be
/// (Tensor, TensorView, scaled fp8 input), the shape rules of an (x, w, y) triple with their
/// messages (check_conv2d), the bias length, the layout every pass relies on (row-major planes
/// and filters), outputs that alias an input, and the workspace's memory space. Also
/// conv2d_problem, the sizes a checked call hands to its pass.

#include <tessera/conv/im2col.hpp>
#include <tessera/conv/params.hpp>
#include <tessera/conv/workspace.hpp>
#include <tessera/tensor.hpp>

#include <string>
#include <type_traits>
#include <utility>

namespace tessera::detail {

struct no_bias_t {};

/// The default forward epilogue: none (skipped entirely, not called).
struct no_epilogue {
  TESSERA_INLINE float operator()(float v) const noexcept { return v; }
};

template <class T>
concept ConvOperand = is_tensor<T>::value || is_tensor_view<T>::value;

/// What an input (x, w, dy) may be: a Tensor, a TensorView, or a scaled fp8 tensor, whose
/// values are payload * scale_inv (the scale_inv factors become the GEMM's alpha).
template <class T>
concept ConvInput = ConvOperand<T> || is_scaled_tensor<T>::value;

template <class T>
auto input_view(const T& t) {
  if constexpr (is_scaled_tensor<T>::value) {
    return t.data.view();
  } else {
    return conv_as_view(t);
  }
}
/// The scale_inv of a scaled input after checking its scale (value_error naming the operation
/// and the operand for a scale that is not positive, finite and normal); 1 for other inputs.
template <class T>
float input_scale_inv(const char* op, const char* name, const T& t) {
  if constexpr (is_scaled_tensor<T>::value) {
    require_valid_scale(op, name, t.scale);
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
  /// The rows of a group's column matrix: C/groups * R * S.
  index_t crs() const noexcept { return Cg * R * S; }
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
  // Every scratch size a pass forms (conv/workspace.hpp) is at most one of these byte counts:
  // the columns of all images (C/g R S x N P Q), fp32 copies of x, y and w. Checked once here,
  // with overflow-checked products, so that no workspace size computed later can wrap around.
  index_t cols = 0, xs = 0, ys = 0, wsz = 0;
  if (!checked_product({pb.Cg, pb.R, pb.S, pb.N, pb.P, pb.Q}, cols) || !fits_bytes(cols, 8) ||
      !checked_product({pb.N, pb.C, pb.H, pb.W}, xs) || !fits_bytes(xs, 8) ||
      !checked_product({pb.N, pb.K, pb.P, pb.Q}, ys) || !fits_bytes(ys, 8) ||
      !checked_product({pb.K, pb.Cg, pb.R, pb.S}, wsz) || !fits_bytes(wsz, 8))
    throw shape_error(all() + "the scratch sizes of this convolution (C/groups*R*S x N*P*Q = " +
                      std::to_string(pb.Cg) + "*" + std::to_string(pb.R) + "*" +
                      std::to_string(pb.S) + " x " + std::to_string(pb.N) + "*" +
                      std::to_string(pb.P) + "*" + std::to_string(pb.Q) +
                      " elements) overflow 64-bit byte counts");
  return pb;
}

/// Throws shape_error before anything is written when the output `out` (named on) has two
/// elements at one address or shares memory with an operand it is computed from (tensor/
/// overlap.hpp: exact for strided views). No conv2d pass is in-place safe: y, dx and dw are
/// written tile by tile (and dx, dw accumulated) while x, w and dy are still being read.
template <class VO, class... Named>
void require_output(const char* op, const char* on, const VO& out, const Named&... in) {
  require_distinct(op, on, out);
  (require_no_overlap(op, on, out, in.first, in.second), ...);
}
template <class V>
std::pair<const char*, const V&> named(const char* n, const V& v) {
  return {n, v};
}

template <class BV>
void check_bias(const char* op, const char* bn, const BV& b, const conv2d_problem& pb) {
  static_assert(BV::rank == 1, "tessera::conv2d: the bias must be rank 1 (K).");
  if (b.extent(0) != pb.K)
    throw shape_error(std::string(op) + ": " + describe(bn, b) + " must have K = " +
                      std::to_string(pb.K) + " elements (one per output channel)");
}

template <class XV, class M>
void check_workspace_space() {
  static_assert(std::is_same_v<typename XV::memory_space, M>,
                "tessera::conv2d: the workspace must live in the tensors' memory space "
                "(conv2d_workspace<MemorySpace>).");
}

} // namespace tessera::detail
