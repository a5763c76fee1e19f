#pragma once
/// \file nn/pooling.hpp
/// nn::MaxPool2d<K>: the maximum of each K x K window, stride K, no padding (PyTorch's
/// nn.MaxPool2d(K)). x (B, C, H, W) -> y (B, C, H / K, W / K) (rounded down: the last rows and
/// columns that do not fill a window are dropped), any precision (max is exact in every
/// format). forward keeps the position of each maximum (one byte per output) for backward,
/// which routes dy to it; the first maximum wins ties, as in PyTorch's CPU kernel.
///
///   tessera::nn::MaxPool2d<2> pool;
///   auto y = pool.forward(exec, x);     // (B, C, H/2, W/2)
///   auto dx = pool.backward(exec, dy);  // (B, C, H, W), dextents

#include <tessera/nn/activation.hpp>
#include <tessera/nn/detail/maxpool2_simd.hpp>
#include <tessera/nn/layer.hpp>

#include <utility>

namespace tessera::nn {

template <index_t K>
class MaxPool2d {
  static_assert(K >= 1 && K <= 15,
                "tessera::nn::MaxPool2d<K>: the window must be 1..15 (its positions are kept in "
                "one byte).");
  using M = detail::default_memory_space;
  static constexpr index_t pooled(index_t e) { return e == dyn ? dyn : e / K; }

public:
  /// (B, C, H, W) with H, W >= K when they are static.
  template <class InExt>
  static constexpr bool accepts = InExt::rank == 4 &&
                                  (InExt::static_extent(2) == dyn ||
                                   InExt::static_extent(2) >= K) &&
                                  (InExt::static_extent(3) == dyn || InExt::static_extent(3) >= K);
  template <class InExt>
  using output_extents = extents<dyn, InExt::static_extent(1), pooled(InExt::static_extent(2)),
                                 pooled(InExt::static_extent(3))>;
  /// nn/layer.hpp: each channel pooled alone; K^2 comparisons per output.
  static constexpr split_kind tensor_split = split_kind::per_feature;
  template <class InExt>
  static constexpr double forward_flops = double(K* K) * elements_per_sample<output_extents<InExt>>;

  explicit MaxPool2d(std::uint64_t /*seed*/ = 0)
      : y_("maxpool.y"), dx_("maxpool.dx"), arg_("maxpool.argmax") {}
  auto parameters() const { return boost::hana::make_tuple(); }

  template <class Exec, class XP, class E>
  Tensor<XP, output_extents<E>, layout_right, M> forward(const Exec& exec,
                                                         const Tensor<XP, E, layout_right, M>& x) {
    static_assert(E::rank == 4, "tessera::nn::MaxPool2d::forward: x must be (B, C, H, W).");
    const index_t B = x.extent(0), C = x.extent(1), H = x.extent(2), W = x.extent(3);
    if (H < K || W < K)
      throw shape_error("tessera::nn::MaxPool2d<" + std::to_string(K) + ">::forward: x has shape " +
                        shape_string(x.extents()) + "; H and W must be >= " + std::to_string(K));
    const index_t P = H / K, Q = W / K;
    auto y = y_.template get<XP>(output_extents<E>::from_all({B, C, P, Q}));
    const auto* in = x.data();
    auto* out = y.data();
    auto* arg = arg_.get(B * C * P * Q);
#if TESSERA_MAXPOOL2_SIMD
    if constexpr (K == 2 && detail::maxpool2::simd_v<XP> && tessera::detail::is_host_exec_v<Exec>) {
      // Work items of 64 output rows (the sizes copied into locals: the byte stores of the
      // positions may alias anything a functor keeps).
      const index_t rows = B * C * P;
      Kokkos::parallel_for(
          "tessera::nn::MaxPool2d::forward[simd]",
          Kokkos::RangePolicy<Exec>(exec, 0, (rows + 63) / 64), [=](const index_t c) {
            const index_t h = H, w = W, p2 = P, q2 = Q, end = rows;
            detail::maxpool2::forward_range<XP>(in, h, w, p2, q2, c * 64,
                                                end < c * 64 + 64 ? end : c * 64 + 64, out, arg);
          });
      exec.fence();
      in_ = {B, C, H, W};
      out_shape_.save(y.extents());
      last_y_ = y.data();
      last_kind_ = precision_index<XP>();
      return y;
    }
#endif
    // One work item per output row (b, c, p).
    Kokkos::parallel_for(
        "tessera::nn::MaxPool2d::forward", Kokkos::RangePolicy<Exec>(exec, 0, B * C * P),
        KOKKOS_LAMBDA(const index_t r) {
          const index_t bc = r / P, p = r % P;
          // Local pointers: the byte stores to arg cannot alias them (no reloads per element).
          const auto* plane = in + bc * H * W + p * K * W;
          auto* o = out + r * Q;
          auto* a = arg + r * Q;
          for (index_t q = 0; q < Q; ++q) {
            float best = to_float(plane[q * K]);
            int at = 0;
            for (index_t dh = 0; dh < K; ++dh)
              for (index_t dw = 0; dw < K; ++dw) {
                const float v = to_float(plane[dh * W + q * K + dw]);
                // NaN propagates (as PyTorch's): a NaN is taken and then never replaced.
                // Selects, not branches: which element wins is data-dependent.
                const bool take = v > best || (v != v && best == best);
                best = take ? v : best;
                at = take ? static_cast<int>(dh * K + dw) : at;
              }
            o[q] = from_float<XP>(best);
            a[q] = static_cast<std::uint8_t>(at);
          }
        });
    exec.fence();
    in_ = {B, C, H, W};
    out_shape_.save(y.extents());
    last_y_ = y.data();
    last_kind_ = precision_index<XP>();
    return y;
  }

  /// For the layer before, pooling its own output in its store (nn::Conv2d::forward_pooled):
  /// the output tensor and the consumer of its output rows (detail::maxpool2::conv_rows) that
  /// fills it and the positions, for an input of shape `in` (B, C, H, W); `fused_done` then
  /// records them as forward would have. Only for K == 2, H and W >= 2 and W <=
  /// maxpool2::max_fused_width (accepts_fused); otherwise the layer before runs, then forward.
  template <class XP, class InExt>
  auto fused_target(const InExt& in) {
    static_assert(K == 2, "tessera::nn::MaxPool2d::fused_target: only 2 x 2 windows are pooled "
                          "in a convolution's store.");
    auto y = y_.template get<XP>(output_extents<InExt>::from_all(
        {in.extent(0), in.extent(1), in.extent(2) / K, in.extent(3) / K}));
    auto* arg = arg_.get(y.size());
    return std::pair{y, detail::maxpool2::conv_rows<XP>{y.data(), arg, in.extent(1), in.extent(3),
                                                        y.extent(2), y.extent(3)}};
  }
  template <class InExt>
  static bool accepts_fused(const InExt& in) noexcept {
    return K == 2 && in.extent(2) >= K && in.extent(3) >= K &&
           in.extent(3) <= detail::maxpool2::max_fused_width;
  }
  template <class XP, class OutExt, class InExt>
  void fused_done(const Tensor<XP, OutExt, layout_right, M>& y, const InExt& in) {
    in_ = {in.extent(0), in.extent(1), in.extent(2), in.extent(3)};
    out_shape_.save(y.extents());
    last_y_ = y.data();
    last_kind_ = precision_index<XP>();
  }

  /// dx (B, C, H, W) of the last forward's input: dy at each window's maximum, 0 elsewhere.
  template <class Exec, class DP, class DE>
  Tensor<DP, dextents<4>, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    detail::require_saved_like("tessera::nn::MaxPool2d::backward", dy, out_shape_);
    if (!need_dx) return {};
    return scatter(exec, dy, static_cast<const storage_t<DP>*>(nullptr));
  }

  /// The backward of an nn::ReLU and this pooling after it, in one pass (nn::Sequential runs a
  /// ReLU followed by MaxPool2d so): dx of the ReLU's input, dy at each window's maximum where
  /// that maximum is > 0, 0 elsewhere. The same values as the ReLU's backward applied to
  /// backward's dx: at a window's maximum the ReLU's output is the pooled value (so its mask
  /// is pooled > 0), and elsewhere dx is 0 either way. The last forward's input must be the
  /// ReLU's output, and the forward's output unmodified since (the layer after reads it only).
  template <class Exec, class DP, class DE>
  Tensor<DP, dextents<4>, layout_right, M>
  backward_after_relu(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy,
                      bool need_dx = true) {
    detail::require_saved_like("tessera::nn::MaxPool2d::backward_after_relu", dy, out_shape_);
    if (!need_dx) return {};
    Tensor<DP, dextents<4>, layout_right, M> dx;
    bool done = false;
    for_each_precision([&](auto prec) {
      using Y = decltype(prec);
      if (done || last_kind_ != precision_index<Y>()) return;
      dx = scatter(exec, dy, static_cast<const storage_t<Y>*>(last_y_));
      done = true;
    });
    if (!done)
      throw value_error("tessera::nn::MaxPool2d::backward_after_relu: called before forward");
    return dx;
  }

private:
  /// dx from dy and the positions; with `pooled` (the forward's output, precision Y), only
  /// where the pooled value is > 0.
  template <class Exec, class DP, class DE, class SY>
  Tensor<DP, dextents<4>, layout_right, M>
  scatter(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, const SY* pooled) {
    const index_t H = in_[2], W = in_[3], P = out_shape_.dims[2], Q = out_shape_.dims[3];
    auto dx = dx_.template get<DP>(dextents<4>(in_[0], in_[1], H, W));
    const auto* d = dy.data();
    auto* out = dx.data();
    const auto* arg = arg_.data();
#if TESSERA_MAXPOOL2_SIMD
    if constexpr (K == 2 && detail::maxpool2::simd_v<DP> && tessera::detail::is_host_exec_v<Exec> &&
                  std::is_same_v<SY, storage_t<DP>>) {
      // Work items of 64 output rows (b, c, p), the sizes in locals: for each, the two input
      // rows under it, and the input rows below the last window (odd H) with the last p.
      const index_t rows = in_[0] * in_[1] * P;
      Kokkos::parallel_for("tessera::nn::MaxPool2d::backward[simd]",
                           Kokkos::RangePolicy<Exec>(exec, 0, (rows + 63) / 64),
                           [=](const index_t c) {
                             const index_t h = H, w = W, p2 = P, q2 = Q,
                                           end = rows < c * 64 + 64 ? rows : c * 64 + 64;
                             const SY* ys = pooled;
                             index_t bc = c * 64 / p2, p = c * 64 % p2;
                             for (index_t r = c * 64; r < end; ++r) {
                               auto* plane = out + bc * h * w;
                               detail::maxpool2::backward_rows<DP>(
                                   d + r * q2, arg + r * q2, q2, w, plane + 2 * p * w,
                                   plane + (2 * p + 1) * w, ys ? ys + r * q2 : nullptr);
                               if (p == p2 - 1)
                                 for (index_t e = 2 * p2 * w; e < h * w; ++e)
                                   plane[e] = from_float<DP>(0.f);
                               if (++p == p2) {
                                 p = 0;
                                 ++bc;
                               }
                             }
                           });
      exec.fence();
      return dx;
    }
#endif
    // One work item per input row (b, c, h): every element is written once, no zeroing pass.
    Kokkos::parallel_for(
        "tessera::nn::MaxPool2d::backward", Kokkos::RangePolicy<Exec>(exec, 0, in_[0] * in_[1] * H),
        KOKKOS_LAMBDA(const index_t r) {
          const index_t bc = r / H, h = r % H, p = h / K, dh = h % K;
          auto* row = out + r * W;
          if (p >= P) { // rows below the last window get no gradient
            for (index_t w = 0; w < W; ++w) row[w] = from_float<DP>(0.f);
            return;
          }
          const auto* drow = d + (bc * P + p) * Q;
          const auto* arow = arg + (bc * P + p) * Q;
          const SY* yrow = pooled ? pooled + (bc * P + p) * Q : nullptr;
          for (index_t q = 0; q < Q; ++q) {
            const auto g = drow[q];
            const int at = arow[q];
            const bool open = !yrow || to_float(yrow[q]) > 0.f;
            for (index_t dw = 0; dw < K; ++dw)
              row[q * K + dw] =
                  detail::keep_or_zero(open && at == static_cast<int>(dh * K + dw), g);
          }
          for (index_t w = Q * K; w < W; ++w) row[w] = from_float<DP>(0.f);
        });
    exec.fence();
    return dx;
  }

  detail::any_buffer y_, dx_;
  detail::raw_buffer<std::uint8_t> arg_;

public:
  /// nn/layer.hpp: the last forward's output and the positions of the maxima.
  void count_activations(activation_ledger& l) const {
    y_.count(l);
    arg_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    arg_.release();
    out_shape_ = {};
    last_y_ = nullptr;
    last_kind_ = -1;
  }

private:
  std::array<index_t, 4> in_{};
  detail::saved_shape out_shape_;
  // The last forward's output (in y_, read by backward_after_relu) and its precision.
  const void* last_y_ = nullptr;
  int last_kind_ = -1;
};

namespace detail {
/// True when layer Before is an nn::ReLU and layer L (nn::MaxPool2d) has a backward_after_relu
/// for DY: the pooling's backward then passes dy on only where the window's maximum, the ReLU's
/// output there, is > 0, which is the ReLU's backward (the same values, one pass less over the
/// activations). Every backward walk over layers runs such a pair as one pass (Sequential's
/// backward, parallel::backward_overlapped): a forward that pooled in the convolution's store
/// (Sequential::fuses_relu_pool) left the ReLU no output of its own.
template <class Before, class L, class Exec, class DY>
constexpr bool pools_after_relu() {
  if constexpr (!std::is_same_v<Before, ReLU>) {
    return false;
  } else {
    return requires(L & l, const Exec& e, const DY& dy) {
      l.backward_after_relu(e, dy, true);
    };
  }
}
} // namespace detail

} // namespace tessera::nn
