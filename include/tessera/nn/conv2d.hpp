#pragma once
/// \file nn/conv2d.hpp
/// nn::Conv2d<InC, OutC, Kernel, Options, Prec>: PyTorch's nn.Conv2d with a square kernel and
/// symmetric stride / padding / dilation, channels and options static, batch and image size
/// taken from the input (static in a Sequential, so its output shape is known at compile time):
///   x (B, InC, H, W)  W (OutC, InC/groups, Kernel, Kernel)  b (OutC)  y (B, OutC, P, Q),
///   P = (H + 2 pad - dilation (Kernel - 1) - 1) / stride + 1, Q likewise.
///
///   tessera::nn::Conv2d<1, 32, 3, tessera::nn::conv_options{.pad = 1}> conv(/*seed=*/1);
///   auto y = conv.forward(exec, x);     // (B, 32, 28, 28) for x (B, 1, 28, 28)
///   auto dx = conv.backward(exec, dy);  // writes the weight and bias gradients
///
/// Runs tessera::conv2d_forward / conv2d_backward_data / conv2d_backward_weight (im2col + GEMM,
/// fp32 accumulation) with a workspace kept by the layer. Prec as for nn::Linear: the weights
/// are cast from the fp32 master every forward; fp8 operands are scaled tensors whose scales
/// the convolution applies to its fp32 accumulators. backward OVERWRITES the gradients.

#include <tessera/conv/conv2d.hpp>
#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/detail/row_math.hpp> // lane_sum
#include <tessera/nn/layer.hpp>

#include <boost/hana/flatten.hpp>
#include <boost/hana/tuple.hpp>

#include <array>
#include <cstdint>
#include <string>

namespace tessera::nn {

/// The compile-time options of nn::Conv2d (symmetric in height and width).
struct conv_options {
  index_t stride = 1;
  index_t pad = 0;
  index_t dilation = 1;
  index_t groups = 1;
};

template <index_t InC, index_t OutC, index_t Kernel, conv_options Opt = conv_options{},
          class Prec = fp32>
class Conv2d {
  static_assert(InC >= 1 && OutC >= 1 && Kernel >= 1,
                "tessera::nn::Conv2d<InC, OutC, Kernel>: channel counts and kernel must be >= 1.");
  static_assert(Opt.stride >= 1 && Opt.pad >= 0 && Opt.dilation >= 1 && Opt.groups >= 1,
                "tessera::nn::Conv2d: stride, dilation and groups must be >= 1, padding >= 0.");
  static_assert(InC % Opt.groups == 0 && OutC % Opt.groups == 0,
                "tessera::nn::Conv2d: groups must divide both InC and OutC.");
  static_assert(ComputePrecision<Prec>,
                "tessera::nn::Conv2d: the compute precision must be "
                "tessera::fp32, tessera::bf16 or tessera::nn::fp8<Recipe>.");
  using M = detail::default_memory_space;

  static constexpr index_t span(index_t e) {
    return e + 2 * Opt.pad - Opt.dilation * (Kernel - 1) - 1;
  }
  static constexpr index_t out_size(index_t e) { return e == dyn ? dyn : span(e) / Opt.stride + 1; }

public:
  using compute_precision = Prec;
  using activation_precision = activation_t<Prec>;
  using weight_extents = extents<OutC, InC / Opt.groups, Kernel, Kernel>;
  using bias_extents = extents<OutC>;

  /// (B, InC, H, W), with the dilated kernel fitting the padded image when H, W are static.
  template <class InExt>
  static constexpr bool
      accepts = InExt::rank == 4 &&
                (InExt::static_extent(1) == InC || InExt::static_extent(1) == dyn) &&
                (InExt::static_extent(2) == dyn || span(InExt::static_extent(2)) >= 0) &&
                (InExt::static_extent(3) == dyn || span(InExt::static_extent(3)) >= 0);
  template <class InExt>
  using output_extents =
      extents<dyn, OutC, out_size(InExt::static_extent(2)), out_size(InExt::static_extent(3))>;
  /// nn/layer.hpp: split by output or input channels when ungrouped (replicated otherwise);
  /// 2 OutC P Q InC/groups K^2 FLOPs per sample.
  static constexpr split_kind tensor_split =
      Opt.groups == 1 ? split_kind::splittable : split_kind::replicate;
  template <class InExt>
  static constexpr double forward_flops = 2.0 * double(OutC) *
                                          double(out_size(InExt::static_extent(2))) *
                                          double(out_size(InExt::static_extent(3))) *
                                          double(InC / Opt.groups) * double(Kernel) *
                                          double(Kernel);

  /// Parameters initialised as PyTorch does, fan_in = InC/groups * Kernel^2.
  explicit Conv2d(std::uint64_t seed = 0)
      : weight_("weight", weight_extents{}), bias_("bias", bias_extents{}), y_("conv.y"),
        dx_("conv.dx"), w_cast_("conv.w"), x_cast_("conv.x"), dy_cast_("conv.dy"),
        sums_("conv.sums"), dx_sums_("conv.dx_sums") {
    reset_parameters(seed);
  }

  void reset_parameters(std::uint64_t seed) {
    detail::init_uniform_fan_in(weight_.value, seed, 0, fan_in);
    detail::init_uniform_fan_in(bias_.value, seed, 1, fan_in);
  }

  static constexpr index_t fan_in = InC / Opt.groups * Kernel * Kernel;
  static constexpr conv2d_params params{.stride_h = Opt.stride,
                                        .stride_w = Opt.stride,
                                        .pad_top = Opt.pad,
                                        .pad_bottom = Opt.pad,
                                        .pad_left = Opt.pad,
                                        .pad_right = Opt.pad,
                                        .dilation_h = Opt.dilation,
                                        .dilation_w = Opt.dilation,
                                        .groups = Opt.groups};

  parameter<weight_extents>& weight() noexcept { return weight_; }
  parameter<bias_extents>& bias() noexcept { return bias_; }
  auto parameters() const { return boost::hana::make_tuple(weight_, bias_); }
  /// The fp8 scaling states of the weight, input and output-gradient slots (pointers, in that
  /// order) for an fp8 compute precision; an empty tuple otherwise. For checkpoints.
  auto fp8_states() {
    return boost::hana::flatten(
        boost::hana::make_tuple(w_cast_.fp8_states(), x_cast_.fp8_states(), dy_cast_.fp8_states()));
  }

  /// y = conv2d(x, W) + b; keeps the compute copy of x for backward. `reduce`
  /// (detail::no_reduction) is applied to the fp32 sums of the convolution before the bias;
  /// `epi` (a float(float) functor, e.g. detail::relu_store) to sum + bias before the rounding.
  template <class Exec, class XP, class E, class R = detail::no_reduction,
            class Epi = tessera::detail::no_epilogue>
  Tensor<activation_precision, output_extents<E>, layout_right, M>
  forward(const Exec& exec, const Tensor<XP, E, layout_right, M>& x, const R& reduce = {},
          const Epi& epi = {}) {
    const auto oe = begin_forward(exec, x);
    auto y = y_.get(oe);
    if constexpr (!detail::reduces<R>) {
      conv2d_forward(exec, x_.conv_input(), w_.conv_input(), bias_.value, y, params, ws_, epi);
    } else {
      // The sums without the bias (in y itself when y is fp32), reduced, then the bias and one
      // rounding.
      auto sums = [&] {
        if constexpr (std::is_same_v<activation_precision, fp32>) {
          return y;
        } else {
          return sums_.get(y.extents());
        }
      }();
      conv2d_forward(exec, x_.conv_input(), w_.conv_input(), sums, params, ws_);
      reduce(exec, sums.data(), sums.size());
      const float* a = sums.data();
      const float* b = bias_.value.data();
      auto* o = y.data();
      const index_t PQ = oe.extent(2) * oe.extent(3);
      Kokkos::parallel_for(
          "tessera::nn::Conv2d::forward[bias]", Kokkos::RangePolicy<Exec>(exec, 0, out_[0] * OutC),
          KOKKOS_LAMBDA(const index_t r) {
            const float bias = b[r % OutC];
            for (index_t i = 0; i < PQ; ++i)
              o[r * PQ + i] = from_float<activation_precision>(epi(a[r * PQ + i] + bias));
          });
      exec.fence();
    }
    in_ = {x.extent(0), InC, x.extent(2), x.extent(3)};
    return y;
  }

  /// forward(exec, x, {}, epi), then `pool` (an nn::MaxPool2d<2>) over its output, in one pass
  /// where the convolution runs an implicit direct path (host spaces:
  /// detail::conv2d_forward_rows): each band's output rows are pooled in the convolution's
  /// store, the full-resolution output is never written, and `pool` records its output and the
  /// maxima's positions as its forward would. Otherwise the output is computed, passed to
  /// `full` (nn::Sequential: the ReLU adopts it) and pooled by pool.forward. The same values
  /// either way; backward then takes dy of the full-resolution output (pool's backward).
  template <class Exec, class XP, class E, class Epi, class Pool, class Full>
  auto forward_pooled(const Exec& exec, const Tensor<XP, E, layout_right, M>& x, const Epi& epi,
                      Pool& pool, const Full& full) {
    const auto oe = begin_forward(exec, x);
    in_ = {x.extent(0), InC, x.extent(2), x.extent(3)};
    if constexpr (tessera::detail::is_host_exec_v<Exec>) {
      if (Pool::accepts_fused(oe)) {
        auto [y, rows] = pool.template fused_target<activation_precision>(oe);
        if (tessera::detail::conv2d_forward_rows<activation_precision>(
                exec, x_.conv_input(), w_.conv_input(), bias_.value, params, ws_, epi, rows)) {
          pool.fused_done(y, oe);
          return y;
        }
      }
    }
    auto y = y_.get(oe);
    conv2d_forward(exec, x_.conv_input(), w_.conv_input(), bias_.value, y, params, ws_, epi);
    full(y);
    return pool.forward(exec, y);
  }

  /// From dy (B, OutC, P, Q) of the last forward: writes dL/dW and dL/db into the gradients
  /// and returns dx (B, InC, H, W) in activation_precision (empty when need_dx is false).
  /// `reduce` (detail::no_reduction) is applied to the fp32 sums of dx before their rounding.
  template <class Exec, class DP, class DE, class R = detail::no_reduction>
  Tensor<activation_precision, extents<dyn, InC, dyn, dyn>, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy_in, bool need_dx = true,
           const R& reduce = {}) {
    static_assert(DE::rank == 4, "tessera::nn::Conv2d::backward: dy must be (B, OutC, P, Q).");
    if (out_[0] < 0) throw value_error("tessera::nn::Conv2d::backward: called before forward");
    detail::require_extents("tessera::nn::Conv2d::backward", "dy", dy_in, out_);
    const auto dy =
        Tensor<DP, dextents<4>, layout_right, M>(dy_in.kokkos_view(), dextents<4>::from_all(out_));
    const auto dq = dy_cast_(exec, dy);
    conv2d_backward_weight(exec, x_.conv_input(), dq.conv_input(), weight_.grad, params, ws_);
    // The bias gradient from dy itself (not its fp8 copy): sum over b, p, q per channel, each
    // (b, channel) plane of P*Q summed in 16 lanes first (detail::lane_sum), then the planes in
    // order of b: the fp32 error grows with P*Q/16 + 4 + B terms, not B*P*Q. The planes are
    // summed image by image, so that each thread reads the images the passes before and after
    // give it (static schedules over images): split by channels instead, every thread read
    // half of dy from the other core's cache, and the pass ran 1.25x faster on 2 threads than
    // on 1 (AMD EPYC Zen 5). Then each channel's B plane sums are added in order of b: the same
    // additions as one pass per channel, so the same bits on any team.
    const auto* d = dy.data();
    float* db = bias_.grad.data();
    const index_t B = out_[0], PQ = out_[2] * out_[3];
    float* planes = plane_sums_.get(B * OutC);
    Kokkos::parallel_for(
        "tessera::nn::Conv2d::backward[bias planes]", Kokkos::RangePolicy<Exec>(exec, 0, B),
        KOKKOS_LAMBDA(const index_t b) {
          const auto* src = d; // a local: the sums' loop then vectorises
          for (index_t k = 0; k < OutC; ++k) {
            const auto* r = src + (b * OutC + k) * PQ;
            planes[b * OutC + k] =
                detail::lane_sum(PQ, [&](const index_t i) { return to_float(r[i]); });
          }
        });
    Kokkos::parallel_for(
        "tessera::nn::Conv2d::backward[bias]", Kokkos::RangePolicy<Exec>(exec, 0, OutC),
        KOKKOS_LAMBDA(const index_t k) {
          float acc = 0.f;
          for (index_t b = 0; b < B; ++b) acc += planes[b * OutC + k];
          db[k] = acc;
        });
    exec.fence();
    if (!need_dx) return {};
    auto dx = dx_.get(extents<dyn, InC, dyn, dyn>(in_[0], in_[2], in_[3]));
    if constexpr (!detail::reduces<R>) {
      conv2d_backward_data(exec, dq.conv_input(), w_.conv_input(), dx, params, ws_);
    } else if constexpr (std::is_same_v<activation_precision, fp32>) {
      conv2d_backward_data(exec, dq.conv_input(), w_.conv_input(), dx, params, ws_);
      reduce(exec, dx.data(), dx.size());
    } else {
      auto sums = dx_sums_.get(dx.extents());
      conv2d_backward_data(exec, dq.conv_input(), w_.conv_input(), sums, params, ws_);
      reduce(exec, sums.data(), sums.size());
      convert_into(exec, dx, sums);
    }
    return dx;
  }

  /// nn/layer.hpp: the activations the last forward left for backward (its output, the compute
  /// copy of its input or the input itself, the fp32 sums of a reduced non-fp32 output).
  void count_activations(activation_ledger& l) const {
    y_.count(l);
    x_.count(l);
    sums_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    x_cast_.release();
    sums_.release();
    x_ = {};
    out_ = {-1, -1, -1, -1};
  }

private:
  /// A forward's checks and casts: x's channels, the output's extents (returned, kept for
  /// backward), the compute copies of the weight and of x.
  template <class Exec, class XP, class E>
  output_extents<E> begin_forward(const Exec& exec, const Tensor<XP, E, layout_right, M>& x) {
    static_assert(accepts<E>, "tessera::nn::Conv2d::forward: x must be (B, InC, H, W) with the "
                              "dilated kernel fitting the padded image.");
    const char* op = "tessera::nn::Conv2d::forward";
    if (x.extent(1) != InC)
      throw shape_error(std::string(op) + ": x has shape " + shape_string(x.extents()) +
                        "; it must have " + std::to_string(InC) + " channels (dimension 1)");
    const auto pq = params.output_hw_for(op, x.extent(2), x.extent(3), Kernel, Kernel);
    const auto xd = Tensor<XP, dextents<4>, layout_right, M>(
        x.kokkos_view(), dextents<4>::from_all(x.extents().to_array()));
    w_ = w_cast_(exec, weight_.value);
    x_ = x_cast_(exec, xd);
    out_ = {x.extent(0), OutC, pq[0], pq[1]};
    return output_extents<E>::from_all({x.extent(0), OutC, pq[0], pq[1]});
  }

  using op_p = typename detail::operand_precision<Prec, false>::type;
  parameter<weight_extents> weight_;
  parameter<bias_extents> bias_;
  detail::buffer<activation_precision> y_, dx_;
  detail::operand_caster<Prec, false> w_cast_, x_cast_;
  detail::operand_caster<Prec, true> dy_cast_;
  detail::buffer<fp32> sums_, dx_sums_; // only with a reduction and a non-fp32 activation
  detail::raw_buffer<float, M> plane_sums_{"tessera::nn::Conv2d::plane_sums"}; // B x OutC
  conv2d_workspace<M> ws_;
  detail::operand<op_p, weight_extents> w_;
  detail::operand<op_p, dextents<4>> x_;
  std::array<index_t, 4> out_{-1, -1, -1, -1}, in_{};
};

} // namespace tessera::nn
