#pragma once
/// \file conv/params.hpp
/// conv2d_params: stride, per-side padding, dilation and groups of a 2-D convolution, and the
/// output size they give. Layouts are NCHW for activations and KCRS for weights:
///
///   x  (N, C, H, W)           input
///   w  (K, C / groups, R, S)  weights (K output channels, an R x S window)
///   y  (N, K, P, Q)           output, P = (H + pad_top + pad_bottom - dilation_h (R - 1) - 1)
///                                         / stride_h + 1, Q likewise
///
///   tessera::conv2d_params p{.stride_h = 2, .stride_w = 2, .pad_top = 3, .pad_bottom = 3,
///                            .pad_left = 3, .pad_right = 3};
///   auto [P, Q] = p.output_hw(224, 224, 7, 7);   // {112, 112}

#include <tessera/config/checked.hpp>
#include <tessera/config/error.hpp>
#include <tessera/tensor/extents.hpp>

#include <array>
#include <string>
#include <type_traits>

namespace tessera {

/// Run-time parameters of a 2-D convolution (see the file comment for the shapes).
struct conv2d_params {
  index_t stride_h = 1, stride_w = 1;
  index_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  index_t dilation_h = 1, dilation_w = 1;
  index_t groups = 1;

  /// "stride (1, 1), padding (top 0, bottom 0, left 0, right 0), dilation (1, 1), groups 1":
  /// for error messages.
  std::string to_string() const {
    const auto s = [](index_t v) { return std::to_string(v); };
    return "stride (" + s(stride_h) + ", " + s(stride_w) + "), padding (top " + s(pad_top) +
           ", bottom " + s(pad_bottom) + ", left " + s(pad_left) + ", right " + s(pad_right) +
           "), dilation (" + s(dilation_h) + ", " + s(dilation_w) + "), groups " + s(groups);
  }

  /// Throws value_error unless strides and dilations are >= 1, paddings >= 0 and groups >= 1.
  void validate(const char* op = "tessera::conv2d_params") const {
    if (stride_h < 1 || stride_w < 1 || dilation_h < 1 || dilation_w < 1 || pad_top < 0 ||
        pad_bottom < 0 || pad_left < 0 || pad_right < 0 || groups < 1)
      throw value_error(std::string(op) + ": " + to_string() +
                        ": strides, dilations and groups must be >= 1 and paddings >= 0");
  }

  /// The output size {P, Q} for an input of H x W and a kernel of R x S. Throws value_error
  /// (for invalid parameters or a kernel < 1) or shape_error (when the dilated kernel does not
  /// fit in the padded input, i.e. the output would be empty) naming the input size, the kernel,
  /// the stride, the padding and the dilation.
  std::array<index_t, 2> output_hw(index_t H, index_t W, index_t R, index_t S) const {
    return output_hw_for("tessera::conv2d_params::output_hw", H, W, R, S);
  }

  /// output_hw, with the calling operation named in the error message.
  std::array<index_t, 2> output_hw_for(const char* op, index_t H, index_t W, index_t R,
                                       index_t S) const {
    validate(op);
    const auto s = [](index_t v) { return std::to_string(v); };
    if (R < 1 || S < 1 || H < 0 || W < 0)
      throw value_error(std::string(op) + ": kernel " + s(R) + "x" + s(S) + " on input " + s(H) +
                        "x" + s(W) + ": kernel sizes must be >= 1 and input sizes >= 0");
    // The span of the last window start: padded size minus the dilated kernel extent. Checked
    // before dividing, since C++ division truncates -1 / 2 to 0. Formed with overflow-checked
    // arithmetic: paddings, dilations and kernels near 2^63 must not wrap around.
    index_t padded_h = 0, padded_w = 0, kext_h = 0, kext_w = 0;
    if (!detail::checked_add(H, pad_top, padded_h) ||
        !detail::checked_add(padded_h, pad_bottom, padded_h) ||
        !detail::checked_add(W, pad_left, padded_w) ||
        !detail::checked_add(padded_w, pad_right, padded_w) ||
        !detail::checked_mul(dilation_h, R - 1, kext_h) ||
        !detail::checked_mul(dilation_w, S - 1, kext_w))
      throw shape_error(std::string(op) + ": input " + s(H) + "x" + s(W) + " with kernel " + s(R) +
                        "x" + s(S) + ", " + to_string() +
                        ": the padded input or the dilated kernel size overflows 64-bit integers");
    const index_t span_h = padded_h - kext_h - 1;
    const index_t span_w = padded_w - kext_w - 1;
    if (span_h < 0 || span_w < 0)
      throw shape_error(std::string(op) + ": input " + s(H) + "x" + s(W) + " with kernel " + s(R) +
                        "x" + s(S) + ", " + to_string() + " gives an empty output (" +
                        s(span_h < 0 ? 0 : span_h / stride_h + 1) + "x" +
                        s(span_w < 0 ? 0 : span_w / stride_w + 1) +
                        "): the dilated kernel must fit in the padded input");
    return {span_h / stride_h + 1, span_w / stride_w + 1};
  }
};

/// Compile-time convolution parameters: the same numbers as conv2d_params, as template
/// arguments (padding symmetric per axis; use conv2d_params for asymmetric padding). Every
/// conv2d_* call takes either. With static parameters and static extents on x, w and y the
/// output size is checked at compile time, and layers can name their output type:
///
///   using p = tessera::conv2d_static_params<1, 1, 1>;               // stride 1, pad 1
///   static_assert(p::output_extent(28, 3, 0) == 28);                 // H = 28, R = 3
///   tessera::conv2d_forward(exec, x, w, y, p{});   // y (N, K, 28, 28) checked by the compiler
template <index_t StrideH = 1, index_t StrideW = StrideH, index_t PadH = 0, index_t PadW = PadH,
          index_t DilationH = 1, index_t DilationW = DilationH, index_t Groups = 1>
struct conv2d_static_params {
  static_assert(StrideH >= 1 && StrideW >= 1 && DilationH >= 1 && DilationW >= 1 && Groups >= 1,
                "tessera::conv2d_static_params: strides, dilations and groups must be >= 1.");
  static_assert(PadH >= 0 && PadW >= 0, "tessera::conv2d_static_params: paddings must be >= 0.");

  static constexpr conv2d_params value{StrideH, StrideW,   PadH,      PadH,  PadW,
                                       PadW,    DilationH, DilationW, Groups};
  static constexpr index_t groups = Groups;

  constexpr operator conv2d_params() const noexcept { return value; } // NOLINT: by design

  /// Output size along axis 0 (height) or 1 (width) for input size `in` and kernel size `k`;
  /// `dyn` when either is dynamic, -1 when the dilated kernel does not fit (empty output).
  static constexpr index_t output_extent(index_t in, index_t k, int axis) noexcept {
    if (in == dyn || k == dyn) return dyn;
    const index_t pad = axis == 0 ? 2 * PadH : 2 * PadW;
    const index_t dil = axis == 0 ? DilationH : DilationW;
    const index_t stride = axis == 0 ? StrideH : StrideW;
    const index_t span = in + pad - dil * (k - 1) - 1;
    return span < 0 ? -1 : span / stride + 1;
  }
};

template <class T>
struct is_conv2d_static_params : std::false_type {};
template <index_t... V>
struct is_conv2d_static_params<conv2d_static_params<V...>> : std::true_type {};

/// conv2d_params or conv2d_static_params<...>: what every conv2d_* call accepts.
template <class T>
concept Conv2dParams = std::is_same_v<T, conv2d_params> || is_conv2d_static_params<T>::value;

} // namespace tessera
