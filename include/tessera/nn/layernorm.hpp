#pragma once
/// \file nn/layernorm.hpp
/// nn::LayerNorm<D, Eps, Out>: layer normalisation over the last dimension (Ba et al. 2016;
/// PyTorch's nn.LayerNorm(D, eps) with elementwise_affine):
///   x (B, ..., D)  gamma (D)  beta (D)  y (B, ..., D)
///   y[r, j] = gamma[j] (x[r, j] - mean_r) / sqrt(var_r + eps) + beta[j]
/// with mean_r and the biased variance var_r taken over the D values of row r. Eps is a
/// std::ratio (default 1/100000 = 1e-5, PyTorch's default), a compile-time constant like every
/// other layer option. Out is the precision of y: void (the default) for x's precision, or an
/// unscaled precision (tessera::bf16 in a mixed-precision transformer: the residual stream is
/// fp32 and the layer after the norm computes in bf16, so y is rounded to it once, here, and
/// never stored in fp32).
///
///   tessera::nn::LayerNorm<128> norm;        // gamma = 1, beta = 0, as PyTorch initialises
///   auto y = norm.forward(exec, x);         // x (B, 128) in any precision, y in x's precision
///   auto dx = norm.backward(exec, dy);      // writes gamma.grad and beta.grad; dx in dy's
///   tessera::nn::LayerNorm<128, std::ratio<1, 100000>, tessera::bf16> norm16; // y in bf16
///
/// The statistics, the normalised values and every gradient sum are fp32 whatever the
/// precision of x; each output is rounded once. forward keeps the normalised rows x_hat (fp32,
/// one per element) and 1/sqrt(var + eps) per row for backward, which computes
///   dbeta[j]  = sum_r dy[r, j]
///   dgamma[j] = sum_r dy[r, j] x_hat[r, j]
///   dx[r, j]  = rstd_r (g[r, j] - mean_j g[r, .] - x_hat[r, j] mean_j (g x_hat)[r, .]),
///               g = dy gamma
/// and OVERWRITES the parameter gradients, as every layer does.
///
/// Layer declarations (nn/layer.hpp): its forward FLOPs (8 per element, for the balanced
/// pipeline cut); no tensor_split declaration, so the tensor split replicates it (its
/// statistics need all D features: it cannot run on a feature shard), which keeps gamma and
/// beta identical on the ranks of a tensor group. This file is the whole of the layer: no other
/// file names it.

#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/detail/row_math.hpp>
#include <tessera/nn/layer.hpp>

#include <boost/hana/tuple.hpp>

#include <cstdint>
#include <ratio>
#include <string>
#include <type_traits>

namespace tessera::nn {

namespace detail {
/// LayerNorm's Out: void, or a precision that needs no scale.
template <class Out>
constexpr bool is_layernorm_output() {
  if constexpr (std::is_void_v<Out>)
    return true;
  else if constexpr (Precision<Out>)
    return !precision_traits<Out>::scaled;
  else
    return false;
}
} // namespace detail

template <index_t D, class Eps = std::ratio<1, 100000>, class Out = void>
class LayerNorm {
  static_assert(D >= 1, "tessera::nn::LayerNorm<D>: the normalised dimension must be >= 1.");
  static_assert(Eps::num > 0 && Eps::den > 0,
                "tessera::nn::LayerNorm<D, Eps>: Eps (a std::ratio) must be positive.");
  static_assert(detail::is_layernorm_output<Out>(),
                "tessera::nn::LayerNorm<D, Eps, Out>: Out must be void (the input's precision) "
                "or an unscaled precision such as tessera::fp32 or tessera::bf16 (fp8 needs a "
                "scale: quantizing is the next layer's job).");
  using M = detail::default_memory_space;
  template <class P>
  using out_t = std::conditional_t<std::is_void_v<Out>, P, Out>;

public:
  /// eps as a float (added to the fp32 variance).
  static constexpr float eps = float(double(Eps::num) / double(Eps::den));
  using gamma_extents = extents<D>;

  /// (B, ..., D): rank >= 2, the last extent D (or dynamic, checked at forward).
  template <class InExt>
  static constexpr bool accepts = InExt::rank >= 2 &&
                                  (InExt::static_extent(InExt::rank - 1) == D ||
                                   InExt::static_extent(InExt::rank - 1) == dyn);
  template <class InExt>
  using output_extents = InExt;
  /// nn/layer.hpp: per element, the mean (1 add), the variance (sub, mul, add), the
  /// normalisation (sub, mul) and the affine map (mul, add): 8 FLOPs.
  template <class InExt>
  static constexpr double forward_flops = 8.0 * elements_per_sample<InExt>;

  /// gamma = 1, beta = 0 (PyTorch's initialisation; the seed is not needed).
  explicit LayerNorm(std::uint64_t /*seed*/ = 0)
      : gamma_("weight", gamma_extents{}), beta_("bias", gamma_extents{}), y_("layernorm.y"),
        dx_("layernorm.dx"), xhat_("layernorm.xhat"), rstd_("layernorm.rstd") {
    fill(gamma_.value, 1.f);
    fill(beta_.value, 0.f);
  }

  parameter<gamma_extents>& gamma() noexcept { return gamma_; }
  parameter<gamma_extents>& beta() noexcept { return beta_; }
  /// (gamma, beta) as a boost::hana::tuple of handles, named "weight" and "bias" as PyTorch's.
  auto parameters() const { return boost::hana::make_tuple(gamma_, beta_); }

  /// y = gamma * (x - mean) / sqrt(var + eps) + beta over the last dimension; x in any
  /// precision, y in Out (x's precision when Out is void). Throws shape_error if x's last
  /// extent is not D.
  template <class Exec, class P, class E>
  Tensor<out_t<P>, E, layout_right, M> forward(const Exec& exec,
                                               const Tensor<P, E, layout_right, M>& x) {
    static_assert(accepts<E>, "tessera::nn::LayerNorm::forward: x must be (B, ..., D).");
    if (x.extent(E::rank - 1) != D)
      throw shape_error("tessera::nn::LayerNorm<" + std::to_string(D) + ">::forward: x has shape " +
                        shape_string(x.extents()) + "; its last dimension must be " +
                        std::to_string(D));
    const index_t rows = x.size() / D;
    using O = out_t<P>;
    auto y = y_.template get<O>(x.extents());
    const auto* in = x.data();
    auto* out = y.data();
    float* xh = xhat_.get(x.size());
    float* rs = rstd_.get(rows);
    const float* g = gamma_.value.data();
    const float* b = beta_.value.data();
    // Row r's statistics: mean and 1 / sqrt(var + eps). Two passes (mean, then squared
    // deviations): no cancellation for rows whose mean is large against their spread. Sums in
    // lanes (nn/detail/row_math.hpp).
    const auto stats = KOKKOS_LAMBDA(const index_t r, float& mean, float& rstd) {
      const auto* xr = in + r * D;
      mean = detail::lane_sum<D>([&](index_t j) { return to_float(xr[j]); }) / float(D);
      const float sq = detail::lane_sum<D>([&](index_t j) {
        const float c = to_float(xr[j]) - mean;
        return c * c;
      });
      rstd = 1.f / detail::kmath::sqrt(sq / float(D) + eps);
      rs[r] = rstd;
    };
#if !TESSERA_DEVICE_PASS
    if constexpr (tessera::detail::is_host_exec_v<Exec> && !std::is_same_v<storage_t<O>, float> &&
                  D <= 8192) {
      // Host, y in a narrow precision: the row's outputs in fp32, rounded by convert_n
      // (vectorised; the same rounding as from_float).
      Kokkos::parallel_for("tessera::nn::LayerNorm::forward",
                           Kokkos::RangePolicy<Exec>(exec, 0, rows), [=](const index_t r) {
                             float mean, rstd;
                             stats(r, mean, rstd);
                             const auto* xr = in + r * D;
                             alignas(64) float yr[D];
                             for (index_t j = 0; j < D; ++j) {
                               const float h = (to_float(xr[j]) - mean) * rstd;
                               xh[r * D + j] = h;
                               yr[j] = g[j] * h + b[j];
                             }
                             convert_n<O>(yr, out + r * D, std::size_t(D));
                           });
      exec.fence();
      shape_.save(x.extents());
      rows_ = rows;
      return y;
    }
#endif
    Kokkos::parallel_for(
        "tessera::nn::LayerNorm::forward", Kokkos::RangePolicy<Exec>(exec, 0, rows),
        KOKKOS_LAMBDA(const index_t r) {
          float mean, rstd;
          stats(r, mean, rstd);
          const auto* xr = in + r * D;
          for (index_t j = 0; j < D; ++j) {
            const float h = (to_float(xr[j]) - mean) * rstd;
            xh[r * D + j] = h;
            out[r * D + j] = from_float<O>(g[j] * h + b[j]);
          }
        });
    exec.fence();
    shape_.save(x.extents());
    rows_ = rows;
    return y;
  }

  /// From dy = dL/dy of the last forward: writes dL/dgamma and dL/dbeta into the parameters'
  /// grad and returns dx in dy's precision (an empty tensor when need_dx is false).
  template <class Exec, class DP, class DE>
  Tensor<DP, DE, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    detail::require_saved_like("tessera::nn::LayerNorm::backward", dy, shape_);
    const index_t rows = rows_;
    const auto* d = dy.data();
    const float* xh = xhat_.data();
    const float* rs = rstd_.data();
    const float* g = gamma_.value.data();
    float* dg = gamma_.grad.data();
    float* db = beta_.grad.data();
    // The column sums over the rows, by blocks of features (nn/detail/row_math.hpp).
    detail::for_column_blocks(
        exec, "tessera::nn::LayerNorm::backward[params]", D,
        KOKKOS_LAMBDA(const index_t j0, const auto w) {
          float sg[detail::column_block<Exec>] = {}, sb[detail::column_block<Exec>] = {};
          for (index_t r = 0; r < rows; ++r)
            for (index_t k = 0; k < w; ++k) {
              const float v = to_float(d[r * D + j0 + k]);
              sg[k] += v * xh[r * D + j0 + k];
              sb[k] += v;
            }
          for (index_t k = 0; k < w; ++k) {
            dg[j0 + k] = sg[k];
            db[j0 + k] = sb[k];
          }
        });
    exec.fence();
    if (!need_dx) return {};
    auto dx = dx_.template get<DP>(dy.extents());
    auto* out = dx.data();
#if !TESSERA_DEVICE_PASS
    if constexpr (tessera::detail::is_host_exec_v<Exec> && !std::is_same_v<storage_t<DP>, float> &&
                  D <= 8192) {
      // Host, dy and dx in a narrow precision: the row widened and the result rounded by
      // convert_n (vectorised; the same conversions), the same sums in between.
      Kokkos::parallel_for("tessera::nn::LayerNorm::backward[dx]",
                           Kokkos::RangePolicy<Exec>(exec, 0, rows), [=](const index_t r) {
                             alignas(64) float gd[D];
                             convert_n<fp32>(d + r * D, gd, std::size_t(D));
                             const float* xr = xh + r * D;
                             for (index_t j = 0; j < D; ++j) gd[j] *= g[j];
                             const float s1 = detail::lane_sum<D>([&](index_t j) { return gd[j]; });
                             const float s2 =
                                 detail::lane_sum<D>([&](index_t j) { return gd[j] * xr[j]; });
                             const float m1 = s1 / float(D), m2 = s2 / float(D), rstd = rs[r];
                             for (index_t j = 0; j < D; ++j)
                               gd[j] = rstd * (gd[j] - m1 - xr[j] * m2);
                             convert_n<DP>(gd, out + r * D, std::size_t(D));
                           });
      exec.fence();
      return dx;
    }
#endif
    Kokkos::parallel_for(
        "tessera::nn::LayerNorm::backward[dx]", Kokkos::RangePolicy<Exec>(exec, 0, rows),
        KOKKOS_LAMBDA(const index_t r) {
          // sum of g, sum of g * x_hat over the row, in lanes
          const float s1 =
              detail::lane_sum<D>([&](index_t j) { return to_float(d[r * D + j]) * g[j]; });
          const float s2 = detail::lane_sum<D>(
              [&](index_t j) { return to_float(d[r * D + j]) * g[j] * xh[r * D + j]; });
          const float m1 = s1 / float(D), m2 = s2 / float(D), rstd = rs[r];
          for (index_t j = 0; j < D; ++j) {
            const float gj = to_float(d[r * D + j]) * g[j];
            out[r * D + j] = from_float<DP>(rstd * (gj - m1 - xh[r * D + j] * m2));
          }
        });
    exec.fence();
    return dx;
  }

  /// nn/layer.hpp: the last forward's output, normalised input and per-row 1/sigma.
  void count_activations(activation_ledger& l) const {
    y_.count(l);
    xhat_.count(l);
    rstd_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    xhat_.release();
    rstd_.release();
    shape_ = {};
  }

private:
  parameter<gamma_extents> gamma_, beta_;
  detail::any_buffer y_, dx_;
  detail::raw_buffer<float> xhat_, rstd_;
  detail::saved_shape shape_;
  index_t rows_ = 0;
};

} // namespace tessera::nn
