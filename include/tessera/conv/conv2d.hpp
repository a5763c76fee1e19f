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
///
/// Files: conv/detail/checks.hpp (argument checks and messages), conv/detail/plan.hpp (tiling,
/// path choice, implicit-GEMM geometry), conv/detail/passes.hpp (the three passes on one
/// skeleton), conv/detail/direct.hpp and conv/detail/implicit.hpp (the non-GEMM paths); this
/// file holds the public calls.

#include <tessera/conv/detail/checks.hpp>
#include <tessera/conv/detail/passes.hpp>
#include <tessera/conv/params.hpp>
#include <tessera/conv/workspace.hpp>

namespace tessera {

/// y = conv2d(x, w) (+ bias): y[n, k, p, q] = sum_{c in group(k), r, s} x[n, c, p*stride_h -
/// pad_top + r*dilation_h, q*stride_w - pad_left + s*dilation_w] w[k, c - group start, r, s]
/// (+ bias[k]). x (N, C, H, W), w (K, C/groups, R, S), bias (K), y (N, K, P, Q) overwritten.
/// Scratch memory comes from ws (grown at the start of the call if needed). The optional
/// epilogue, a float(float) callable on the execution space, is applied to every output value
/// after the bias and before the rounding to y's precision (e.g. a fused ReLU):
///   tessera::conv2d_forward(exec, x, w, b, y, {.pad_top = 1, ...}, ws,
///                           KOKKOS_LAMBDA(float v) { return v > 0.f ? v : 0.f; });
template <class Exec, detail::ConvInput X, detail::ConvInput Wt, detail::ConvOperand B,
          detail::ConvOperand Y, class M, class Epi = detail::no_epilogue,
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
  detail::require_output(op, "y", y, detail::named("x", x), detail::named("w", w),
                         detail::named("bias", bias));
  detail::conv2d_forward_impl(
      exec, x, w, bias, y, pb, ws,
      detail::input_scale_inv(op, "x", x_in) * detail::input_scale_inv(op, "w", w_in), epilogue);
}

/// y = conv2d(x, w) without bias; see the overload with bias.
template <class Exec, detail::ConvInput X, detail::ConvInput Wt, detail::ConvOperand Y, class M,
          class Epi = detail::no_epilogue, Conv2dParams Prm = conv2d_params>
void conv2d_forward(const Exec& exec, const X& x_in, const Wt& w_in, const Y& y_in,
                    const Prm& params, conv2d_workspace<M>& ws, const Epi& epilogue = {}) {
  const auto x = detail::input_view(x_in);
  const auto w = detail::input_view(w_in);
  const auto y = detail::conv_as_view(y_in);
  const char* op = "tessera::conv2d_forward";
  const auto pb = detail::check_conv2d(op, "x", x, "w", w, "y", y, params);
  detail::require_output(op, "y", y, detail::named("x", x), detail::named("w", w));
  detail::conv2d_forward_impl(
      exec, x, w, detail::no_bias_t{}, y, pb, ws,
      detail::input_scale_inv(op, "x", x_in) * detail::input_scale_inv(op, "w", w_in), epilogue);
}

/// dx = dL/dx for y = conv2d(x, w): the transposed convolution of dy with w.
/// dy (N, K, P, Q), w (K, C/groups, R, S), dx (N, C, H, W) overwritten; H and W are dx's.
template <class Exec, detail::ConvInput DY, detail::ConvInput Wt, detail::ConvOperand DX, class M,
          Conv2dParams Prm = conv2d_params>
void conv2d_backward_data(const Exec& exec, const DY& dy_in, const Wt& w_in, const DX& dx_in,
                          const Prm& params, conv2d_workspace<M>& ws) {
  const auto dy = detail::input_view(dy_in);
  const auto w = detail::input_view(w_in);
  const auto dx = detail::conv_as_view(dx_in);
  const char* op = "tessera::conv2d_backward_data";
  const auto pb = detail::check_conv2d(op, "dx", dx, "w", w, "dy", dy, params);
  detail::require_output(op, "dx", dx, detail::named("dy", dy), detail::named("w", w));
  detail::conv2d_backward_data_impl(exec, dy, w, dx, pb, ws,
                                    detail::input_scale_inv(op, "dy", dy_in) *
                                        detail::input_scale_inv(op, "w", w_in));
}

/// dw = dL/dw for y = conv2d(x, w): dw[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] times
/// the input pixel (c, r, s) of window (p, q). x (N, C, H, W), dy (N, K, P, Q),
/// dw (K, C/groups, R, S) overwritten (zero for N == 0).
template <class Exec, detail::ConvInput X, detail::ConvInput DY, detail::ConvOperand DW, class M,
          Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x_in, const DY& dy_in, const DW& dw_in,
                            const Prm& params, conv2d_workspace<M>& ws) {
  const auto x = detail::input_view(x_in);
  const auto dy = detail::input_view(dy_in);
  const auto dw = detail::conv_as_view(dw_in);
  const char* op = "tessera::conv2d_backward_weight";
  const auto pb = detail::check_conv2d(op, "x", x, "dw", dw, "dy", dy, params);
  detail::require_output(op, "dw", dw, detail::named("x", x), detail::named("dy", dy));
  detail::conv2d_backward_weight_impl(exec, x, dy, dw, pb, ws,
                                      detail::input_scale_inv(op, "x", x_in) *
                                          detail::input_scale_inv(op, "dy", dy_in));
}

/// dw as above and dbias[k] = sum over n, p, q of dy[n, k, p, q] (dbias (K) overwritten).
template <class Exec, detail::ConvInput X, detail::ConvInput DY, detail::ConvOperand DW,
          detail::ConvOperand DB, class M, Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x_in, const DY& dy_in, const DW& dw_in,
                            const DB& db_in, const Prm& params, conv2d_workspace<M>& ws) {
  const auto x = detail::input_view(x_in);
  const auto dy = detail::input_view(dy_in);
  const auto dw = detail::conv_as_view(dw_in);
  const auto db = detail::conv_as_view(db_in);
  const char* op = "tessera::conv2d_backward_weight";
  const auto pb = detail::check_conv2d(op, "x", x, "dw", dw, "dy", dy, params);
  detail::check_bias(op, "dbias", db, pb);
  detail::require_output(op, "dw", dw, detail::named("x", x), detail::named("dy", dy),
                         detail::named("dbias", db));
  detail::require_output(op, "dbias", db, detail::named("x", x), detail::named("dy", dy));
  const float sx = detail::input_scale_inv(op, "x", x_in);
  const float sdy = detail::input_scale_inv(op, "dy", dy_in);
  detail::conv2d_backward_weight_impl(exec, x, dy, dw, pb, ws, sx * sdy);
  detail::conv2d_bias_grad(exec, dy, db, sdy);
}

namespace detail {

/// conv2d_forward(x, w, bias, y, params, ws, epi) with each output channel's rows handed to
/// `rows` instead of stored into a y: rows(sums, ld, k, n, p0, count, f, alpha) gets the fp32
/// sums of channel k of image n, output rows p0 .. p0 + count - 1 (ld apart), whose stored values
/// would be f(alpha * sum) in precision Py, in bands starting at even rows (all of an even count
/// but a last one of odd P): what nn::Conv2d::forward_pooled needs to pool 2 x 2 windows in the
/// store, never writing the full-resolution output. Host spaces, the implicit direct paths
/// only: returns false, having done nothing, where they do not apply (a device space, an empty
/// batch, one input channel per group, im2col + GEMM), and the caller runs conv2d_forward.
template <class Py, class Exec, ConvInput X, ConvInput Wt, ConvOperand B, class M, class Epi,
          class Rows, Conv2dParams Prm>
bool conv2d_forward_rows(const Exec& exec, const X& x_in, const Wt& w_in, const B& bias_in,
                         const Prm& params, conv2d_workspace<M>& ws, const Epi& epi,
                         const Rows& rows) {
#if TESSERA_DEVICE_PASS
  (void)exec, (void)x_in, (void)w_in, (void)bias_in, (void)params, (void)ws, (void)epi, (void)rows;
  return false;
#else
  if constexpr (!is_host_exec_v<Exec>) {
    return false;
  } else {
    const auto x = input_view(x_in);
    const auto w = input_view(w_in);
    const auto bias = conv_as_view(bias_in);
    const char* op = "tessera::conv2d_forward";
    // The output's shape for the checks (no memory: nothing reads or writes it).
    const conv2d_params prm = params;
    const auto pq = prm.output_hw_for(op, x.extent(2), x.extent(3), w.extent(2), w.extent(3));
    const TensorView<fp32, dextents<4>, layout_right, M> shape(
        nullptr, dextents<4>(x.extent(0), w.extent(0), pq[0], pq[1]));
    const auto pb = check_conv2d(op, "x", x, "w", w, "y", shape, params);
    check_bias(op, "bias", bias, pb);
    check_workspace_space<decltype(x), M>();
    if (pb.N == 0 || pb.one_channel_per_group()) return false;
    const float alpha = input_scale_inv(op, "x", x_in) * input_scale_inv(op, "w", w_in);
    return forward_implicit<Py, true>(exec, x, w, bias, pb, ws, alpha, epi, rows);
  }
#endif
}

} // namespace detail

// The same five calls without a workspace argument: each allocates a temporary workspace (once,
// at its start). Layers called repeatedly should keep a conv2d_workspace and pass it.

template <class Exec, detail::ConvInput X, detail::ConvInput Wt, detail::ConvOperand Y,
          Conv2dParams Prm = conv2d_params>
void conv2d_forward(const Exec& exec, const X& x, const Wt& w, const Y& y, const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_forward(exec, x, w, y, params, ws);
}
template <class Exec, detail::ConvInput X, detail::ConvInput Wt, detail::ConvOperand B,
          detail::ConvOperand Y, Conv2dParams Prm = conv2d_params>
void conv2d_forward(const Exec& exec, const X& x, const Wt& w, const B& bias, const Y& y,
                    const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_forward(exec, x, w, bias, y, params, ws);
}
template <class Exec, detail::ConvInput DY, detail::ConvInput Wt, detail::ConvOperand DX,
          Conv2dParams Prm = conv2d_params>
void conv2d_backward_data(const Exec& exec, const DY& dy, const Wt& w, const DX& dx,
                          const Prm& params) {
  conv2d_workspace<typename DX::memory_space> ws;
  conv2d_backward_data(exec, dy, w, dx, params, ws);
}
template <class Exec, detail::ConvInput X, detail::ConvInput DY, detail::ConvOperand DW,
          Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x, const DY& dy, const DW& dw,
                            const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_backward_weight(exec, x, dy, dw, params, ws);
}
template <class Exec, detail::ConvInput X, detail::ConvInput DY, detail::ConvOperand DW,
          detail::ConvOperand DB, Conv2dParams Prm = conv2d_params>
void conv2d_backward_weight(const Exec& exec, const X& x, const DY& dy, const DW& dw,
                            const DB& dbias, const Prm& params) {
  conv2d_workspace<typename X::memory_space> ws;
  conv2d_backward_weight(exec, x, dy, dw, dbias, params, ws);
}

} // namespace tessera
