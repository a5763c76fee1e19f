#pragma once
/// \file nn/rmsnorm.hpp
/// nn::RMSNorm<D, Eps>: root-mean-square normalisation over the last dimension (Zhang and
/// Sennrich 2019; PyTorch's nn.RMSNorm(D, eps) with elementwise_affine):
///   x (B, ..., D)  gamma (D)  y (B, ..., D)
///   y[r, j] = gamma[j] x[r, j] / sqrt(mean_j x[r, .]^2 + eps)
/// Eps is a std::ratio (default 1/100000 = 1e-5, like nn::LayerNorm; PyTorch's default is the
/// dtype's epsilon). No bias, no mean subtraction.
///
///   tessera::nn::RMSNorm<128> norm;         // gamma = 1
///   auto y = norm.forward(exec, x);         // x (B, ..., 128) in any precision, y in x's
///   auto dx = norm.backward(exec, dy);      // writes gamma.grad; dx in dy's precision
///
/// The statistics and every gradient sum are fp32 whatever the precision of x. forward keeps
/// x_hat = x rstd (fp32) and rstd per row; backward computes
///   dgamma[j] = sum_r dy[r, j] x_hat[r, j]
///   dx[r, j]  = rstd_r (g[r, j] - x_hat[r, j] mean_j (g x_hat)[r, .]),  g = dy gamma
/// and OVERWRITES gamma's gradient, as every layer does. forward_flops: 4 per element;
/// replicated by the tensor split (its statistic needs all D features).

#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/detail/row_math.hpp>
#include <tessera/nn/layer.hpp>

#include <boost/hana/tuple.hpp>

#include <cstdint>
#include <ratio>
#include <string>

namespace tessera::nn {

template <index_t D, class Eps = std::ratio<1, 100000>>
class RMSNorm {
  static_assert(D >= 1, "tessera::nn::RMSNorm<D>: the normalised dimension must be >= 1.");
  static_assert(Eps::num > 0 && Eps::den > 0,
                "tessera::nn::RMSNorm<D, Eps>: Eps (a std::ratio) must be positive.");
  using M = detail::default_memory_space;

public:
  static constexpr float eps = float(double(Eps::num) / double(Eps::den));
  using gamma_extents = extents<D>;

  template <class InExt>
  static constexpr bool accepts = InExt::rank >= 2 &&
                                  (InExt::static_extent(InExt::rank - 1) == D ||
                                   InExt::static_extent(InExt::rank - 1) == dyn);
  template <class InExt>
  using output_extents = InExt;
  /// nn/layer.hpp: per element a multiply and an add (the statistic), a multiply by rstd and
  /// one by gamma: 4 FLOPs.
  template <class InExt>
  static constexpr double forward_flops = 4.0 * elements_per_sample<InExt>;
  static constexpr split_kind tensor_split = split_kind::replicate;

  /// gamma = 1 (the seed is not needed).
  explicit RMSNorm(std::uint64_t /*seed*/ = 0)
      : gamma_("weight", gamma_extents{}), y_("rmsnorm.y"), dx_("rmsnorm.dx"),
        xhat_("rmsnorm.xhat"), rstd_("rmsnorm.rstd") {
    fill(gamma_.value, 1.f);
  }

  parameter<gamma_extents>& gamma() noexcept { return gamma_; }
  auto parameters() const { return boost::hana::make_tuple(gamma_); }

  /// y = gamma * x / sqrt(mean(x^2) + eps) over the last dimension, in x's precision. Throws
  /// shape_error if x's last extent is not D.
  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    static_assert(accepts<E>, "tessera::nn::RMSNorm::forward: x must be (B, ..., D).");
    if (x.extent(E::rank - 1) != D)
      throw shape_error("tessera::nn::RMSNorm<" + std::to_string(D) + ">::forward: x has shape " +
                        shape_string(x.extents()) + "; its last dimension must be " +
                        std::to_string(D));
    const index_t rows = x.size() / D;
    auto y = y_.template get<P>(x.extents());
    const auto* in = x.data();
    auto* out = y.data();
    float* xh = xhat_.get(x.size());
    float* rs = rstd_.get(rows);
    const float* g = gamma_.value.data();
    Kokkos::parallel_for(
        "tessera::nn::RMSNorm::forward", Kokkos::RangePolicy<Exec>(exec, 0, rows),
        KOKKOS_LAMBDA(const index_t r) {
          const auto* xr = in + r * D;
          const float sq = detail::lane_sum<D>([&](index_t j) { // in lanes (row_math.hpp)
            const float v = to_float(xr[j]);
            return v * v;
          });
          const float rstd = 1.f / detail::kmath::sqrt(sq / float(D) + eps);
          rs[r] = rstd;
          for (index_t j = 0; j < D; ++j) {
            const float h = to_float(xr[j]) * rstd;
            xh[r * D + j] = h;
            out[r * D + j] = from_float<P>(g[j] * h);
          }
        });
    exec.fence();
    shape_.save(x.extents());
    rows_ = rows;
    return y;
  }

  /// From dy of the last forward: writes dL/dgamma and returns dx in dy's precision (empty
  /// when need_dx is false).
  template <class Exec, class DP, class DE>
  Tensor<DP, DE, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    detail::require_saved_like("tessera::nn::RMSNorm::backward", dy, shape_);
    const index_t rows = rows_;
    const auto* d = dy.data();
    const float* xh = xhat_.data();
    const float* rs = rstd_.data();
    const float* g = gamma_.value.data();
    float* dg = gamma_.grad.data();
    // The column sums over the rows, by blocks of features (nn/detail/row_math.hpp).
    detail::for_column_blocks(
        exec, "tessera::nn::RMSNorm::backward[gamma]", D,
        KOKKOS_LAMBDA(const index_t j0, const auto w) {
          float s[detail::column_block<Exec>] = {};
          for (index_t r = 0; r < rows; ++r)
            for (index_t k = 0; k < w; ++k)
              s[k] += to_float(d[r * D + j0 + k]) * xh[r * D + j0 + k];
          for (index_t k = 0; k < w; ++k) dg[j0 + k] = s[k];
        });
    exec.fence();
    if (!need_dx) return {};
    auto dx = dx_.template get<DP>(dy.extents());
    auto* out = dx.data();
    Kokkos::parallel_for(
        "tessera::nn::RMSNorm::backward[dx]", Kokkos::RangePolicy<Exec>(exec, 0, rows),
        KOKKOS_LAMBDA(const index_t r) {
          const float s = detail::lane_sum<D>( // sum of g * x_hat over the row, in lanes
              [&](index_t j) { return to_float(d[r * D + j]) * g[j] * xh[r * D + j]; });
          const float m = s / float(D), rstd = rs[r];
          for (index_t j = 0; j < D; ++j) {
            const float gj = to_float(d[r * D + j]) * g[j];
            out[r * D + j] = from_float<DP>(rstd * (gj - xh[r * D + j] * m));
          }
        });
    exec.fence();
    return dx;
  }

  /// nn/layer.hpp: the last forward's output, normalised input and per-row 1/rms.
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
  parameter<gamma_extents> gamma_;
  detail::any_buffer y_, dx_;
  detail::raw_buffer<float> xhat_, rstd_;
  detail::saved_shape shape_;
  index_t rows_ = 0;
};

} // namespace tessera::nn
