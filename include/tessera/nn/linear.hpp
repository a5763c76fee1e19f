#pragma once
/// \file nn/linear.hpp
/// nn::Linear<In, Out, Prec>: y = x W^T + b, x (B, In), W (Out, In), b (Out), y (B, Out); the
/// batch B is dynamic, everything else static. x may also be (B, t, In) (a batch of sequences):
/// the leading dimensions are rows of one product and y is (B, t, Out). PyTorch's nn.Linear,
/// with explicit passes:
///
///   tessera::nn::Linear<784, 128> fc(/*seed=*/1);        // PyTorch's default init
///   auto y = fc.forward(exec, x);                         // (B, 128), keeps x for backward
///   auto dx = fc.backward(exec, dy);                      // writes fc.weight().grad, bias grad
///
/// Prec is the compute precision (nn/precision.hpp): the weights are cast from the fp32 master
/// at every forward; y and dx are in activation_t<Prec>. Every product is accumulated in fp32
/// (tessera::gemm). backward OVERWRITES the parameter gradients (it does not accumulate): one
/// backward per optimizer step needs no zero_grad.
///
/// forward returns a tensor in memory the layer owns and reuses: it stays valid until the next
/// forward (backward's dx likewise until the next backward).

#include <tessera/gemm/gemm.hpp>
#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/detail/row_math.hpp>
#include <tessera/nn/layer.hpp>

#include <boost/hana/flatten.hpp>
#include <boost/hana/tuple.hpp>

#include <array>
#include <cstdint>
#include <string>

namespace tessera::nn {

template <index_t In, index_t Out, class Prec = fp32>
class Linear {
  static_assert(In >= 1 && Out >= 1,
                "tessera::nn::Linear<In, Out>: both feature counts must be >= 1.");
  static_assert(ComputePrecision<Prec>,
                "tessera::nn::Linear: the compute precision must be "
                "tessera::fp32, tessera::bf16 or tessera::nn::fp8<Recipe>.");
  using M = detail::default_memory_space;

public:
  using compute_precision = Prec;
  using activation_precision = activation_t<Prec>;
  using weight_extents = extents<Out, In>;
  using bias_extents = extents<Out>;
  /// The input shape this layer fixes (Sequential starts from it when Linear comes first).
  using input_extents = extents<dyn, In>;

  /// True for inputs (B, In) and (B, t, In): what Sequential checks at compile time.
  template <class InExt>
  static constexpr bool accepts = (InExt::rank == 2 || InExt::rank == 3) &&
                                  (InExt::static_extent(InExt::rank - 1) == In ||
                                   InExt::static_extent(InExt::rank - 1) == dyn);

private:
  template <class Ext, index_t F>
  struct rows_of {
    using type = extents<dyn, F>;
  };
  template <index_t E0, index_t E1, index_t E2, index_t F>
  struct rows_of<extents<E0, E1, E2>, F> {
    using type = extents<dyn, E1, F>;
  };

public:
  /// (B, Out) for (B, In); (B, t, Out) for (B, t, In), t keeping its static extent if any.
  template <class InExt>
  using output_extents = typename rows_of<InExt, Out>::type;
  /// nn/layer.hpp: parallel/ splits it by output (column) or input (row) features; 2 In Out
  /// FLOPs per sample (a multiply and an add per weight).
  static constexpr split_kind tensor_split = split_kind::splittable;
  template <class InExt>
  static constexpr double forward_flops = 2.0 * double(In) * double(Out);

  /// Parameters initialised as PyTorch does (kaiming_uniform a = sqrt(5), uniform bias with
  /// bound 1/sqrt(In)), from the counter-based generator: the same seed gives the same layer.
  explicit Linear(std::uint64_t seed = 0)
      : weight_("weight", weight_extents{}), bias_("bias", bias_extents{}), y_("linear.y"),
        dx_("linear.dx"), w_cast_("linear.w"), x_cast_("linear.x"), dy_cast_("linear.dy"),
        acc_("linear.acc"), dx_sums_("linear.dx_sums") {
    reset_parameters(seed);
  }

  void reset_parameters(std::uint64_t seed) {
    detail::init_uniform_fan_in(weight_.value, seed, 0, In);
    detail::init_uniform_fan_in(bias_.value, seed, 1, In);
  }

  parameter<weight_extents>& weight() noexcept { return weight_; }
  parameter<bias_extents>& bias() noexcept { return bias_; }
  /// (weight, bias) as a boost::hana::tuple of handles (sharing the storage).
  auto parameters() const { return boost::hana::make_tuple(weight_, bias_); }
  /// The fp8 scaling states of the weight, input and output-gradient slots (pointers, in that
  /// order) for an fp8 compute precision; an empty tuple otherwise. For checkpoints.
  auto fp8_states() {
    return boost::hana::flatten(
        boost::hana::make_tuple(w_cast_.fp8_states(), x_cast_.fp8_states(), dy_cast_.fp8_states()));
  }

  /// y = x W^T + b. x: (B, In) or (B, t, In), any precision; kept (as the compute copy) for
  /// backward. `reduce` (detail::no_reduction) is applied to the fp32 products before the bias.
  template <class Exec, class XP, class XE, class R = detail::no_reduction>
  Tensor<activation_precision, output_extents<XE>, layout_right, M>
  forward(const Exec& exec, const Tensor<XP, XE, layout_right, M>& x_in, const R& reduce = {}) {
    static_assert(accepts<XE>,
                  "tessera::nn::Linear::forward: the input must be (B, In) or (B, t, In).");
    constexpr std::size_t r = XE::rank;
    if (x_in.extent(r - 1) != In)
      throw shape_error("tessera::nn::Linear<" + std::to_string(In) + ", " + std::to_string(Out) +
                        ">::forward: x has shape " + shape_string(x_in.extents()) +
                        "; it must be (B, " + std::to_string(In) + ") or (B, t, " +
                        std::to_string(In) + ")");
    const index_t B = x_in.size() / In; // rows: B, or B t
    const auto x = reshape<extents<dyn, In>>(x_in, B);
    w_ = w_cast_(exec, weight_.value);
    x_ = x_cast_(exec, x);
    auto y = y_.get(extents<dyn, Out>(B));
    // The fp32 product goes straight into y when y is fp32, else through an fp32 scratch so
    // that y is rounded once, after the bias.
    auto acc = [&] {
      if constexpr (std::is_same_v<activation_precision, fp32>) {
        return y;
      } else {
        return acc_.get(extents<dyn, Out>(B));
      }
    }();
    gemm(exec, x_.t, transpose(w_.t.view()), acc,
         gemm_options{.alpha = x_.scale_inv * w_.scale_inv, .beta = 0.f});
    if constexpr (detail::reduces<R>) reduce(exec, acc.data(), acc.size());
    const float* a = acc.data();
    const float* b = bias_.value.data();
    auto* out = y.data();
#if !TESSERA_DEVICE_PASS
    if constexpr (tessera::detail::is_host_exec_v<Exec> &&
                  !std::is_same_v<activation_precision, fp32>) {
      // Host: the sums in a vectorised loop, rounded 256 at a time by convert_n (the same
      // rounding as from_float).
      Kokkos::parallel_for("tessera::nn::Linear::forward[bias]",
                           Kokkos::RangePolicy<Exec>(exec, 0, B), [=](const index_t i) {
                             constexpr index_t block = 256;
                             alignas(64) float sum[block];
                             for (index_t j0 = 0; j0 < Out; j0 += block) {
                               const index_t n = Out - j0 < block ? Out - j0 : block;
                               for (index_t j = 0; j < n; ++j)
                                 sum[j] = a[i * Out + j0 + j] + b[j0 + j];
                               convert_n<activation_precision>(sum, out + i * Out + j0,
                                                               std::size_t(n));
                             }
                           });
    } else
#endif
    {
      Kokkos::parallel_for(
          "tessera::nn::Linear::forward[bias]", Kokkos::RangePolicy<Exec>(exec, 0, B),
          KOKKOS_LAMBDA(const index_t i) {
            for (index_t j = 0; j < Out; ++j)
              out[i * Out + j] = from_float<activation_precision>(a[i * Out + j] + b[j]);
          });
    }
    exec.fence();
    std::array<index_t, r> oe{};
    for (std::size_t i = 0; i + 1 < r; ++i) oe[i] = x_in.extent(i);
    oe[r - 1] = Out;
    const Tensor<activation_precision, output_extents<XE>, layout_right, M> y_out(
        y.kokkos_view(), output_extents<XE>::from_all(oe));
    batch_ = B;
    shape_.save(y_out.extents());
    return y_out;
  }

  /// From dy = dL/dy (B, Out) or (B, t, Out) of the last forward: writes dL/dW and dL/db into
  /// the parameters' grad and returns dx = dL/dx (B, In) or (B, t, In) in activation_precision
  /// (an empty tensor when need_dx is false, e.g. for a first layer). `reduce`
  /// (detail::no_reduction) is applied to the fp32 sums of dx before they are rounded to
  /// activation_precision.
  template <class Exec, class DP, class DE, class R = detail::no_reduction>
  Tensor<activation_precision, typename rows_of<DE, In>::type, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy_in, bool need_dx = true,
           const R& reduce = {}) {
    static_assert(DE::rank == 2 || DE::rank == 3,
                  "tessera::nn::Linear::backward: dy must be (B, Out) or (B, t, Out).");
    using dx_extents = typename rows_of<DE, In>::type;
    detail::require_saved_like("tessera::nn::Linear::backward", dy_in, shape_);
    const auto dy = reshape<extents<dyn, Out>>(dy_in, batch_);
    const index_t B = batch_;
    const auto dq = dy_cast_(exec, dy);
    // dW (Out, In) = dy^T (Out, B) x (B, In), fp32 into the gradient.
    gemm(exec, transpose(dq.t.view()), x_.t, weight_.grad,
         gemm_options{.alpha = dq.scale_inv * x_.scale_inv, .beta = 0.f});
    // db (Out) = column sums of dy, from dy itself (bf16 or fp32, unscaled).
    const auto* d = dy.data();
    float* db = bias_.grad.data();
    // Column blocks, each column summed over the rows in order (nn/detail/row_math.hpp).
    detail::for_column_blocks(
        exec, "tessera::nn::Linear::backward[bias]", Out,
        KOKKOS_LAMBDA(const index_t j0, const auto w) {
          float s[detail::column_block<Exec>] = {};
          for (index_t i = 0; i < B; ++i)
            for (index_t k = 0; k < w; ++k) s[k] += to_float(d[i * Out + j0 + k]);
          for (index_t k = 0; k < w; ++k) db[j0 + k] = s[k];
        });
    exec.fence();
    if (!need_dx) return {};
    // dx (B, In) = dy (B, Out) W (Out, In); through an fp32 scratch when it is reduced and
    // stored in a lower precision (one rounding, after the reduction).
    auto dx = dx_.get(extents<dyn, In>(B));
    std::array<index_t, DE::rank> de{};
    for (std::size_t i = 0; i + 1 < DE::rank; ++i) de[i] = dy_in.extent(i);
    de[DE::rank - 1] = In;
    const Tensor<activation_precision, dx_extents, layout_right, M> dx_out(
        dx.kokkos_view(), dx_extents::from_all(de));
    const gemm_options o{.alpha = dq.scale_inv * w_.scale_inv, .beta = 0.f};
    if constexpr (!detail::reduces<R>) {
      gemm(exec, dq.t, w_.t, dx, o);
    } else if constexpr (std::is_same_v<activation_precision, fp32>) {
      gemm(exec, dq.t, w_.t, dx, o);
      reduce(exec, dx.data(), dx.size());
    } else {
      auto sums = dx_sums_.get(extents<dyn, In>(B));
      gemm(exec, dq.t, w_.t, sums, o);
      reduce(exec, sums.data(), sums.size());
      convert_into(exec, dx, sums);
    }
    return dx_out;
  }

  /// nn/layer.hpp: the activations the last forward left for backward (its output, the compute
  /// copy of its input or, when none was needed, the input itself; the fp32 scratch of a
  /// non-fp32 output).
  void count_activations(activation_ledger& l) const {
    y_.count(l);
    x_.count(l);
    acc_.count(l);
  }
  /// nn/layer.hpp: frees them (the output handed out stays valid while it is shared); backward
  /// then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    x_cast_.release();
    acc_.release();
    x_ = {};
    shape_ = {};
  }

private:
  using wop = typename detail::operand_precision<Prec, false>::type;
  parameter<weight_extents> weight_;
  parameter<bias_extents> bias_;
  detail::buffer<activation_precision> y_, dx_;
  detail::operand_caster<Prec, false> w_cast_, x_cast_;
  detail::operand_caster<Prec, true> dy_cast_;
  detail::buffer<fp32> acc_, dx_sums_;
  detail::operand<wop, weight_extents> w_;
  detail::operand<wop, extents<dyn, In>> x_;
  index_t batch_ = 0;         // rows of the last forward (B, or B t)
  detail::saved_shape shape_; // its output's extents, which dy must have
};

} // namespace tessera::nn
