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
      Kokkos::parallel_for("tessera::nn::MaxPool2d::forward[simd]",
                           Kokkos::RangePolicy<Exec>(exec, 0, B * C * P), [=](const index_t r) {
                             const auto* r0 = in + (r / P * H + r % P * 2) * W;
                             detail::maxpool2::forward_row<XP>(r0, r0 + W, Q, out + r * Q,
                                                               arg + r * Q);
                           });
      exec.fence();
      in_ = {B, C, H, W};
      out_shape_.save(y.extents());
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
    return y;
  }

  /// dx (B, C, H, W) of the last forward's input: dy at each window's maximum, 0 elsewhere.
  template <class Exec, class DP, class DE>
  Tensor<DP, dextents<4>, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    detail::require_saved_like("tessera::nn::MaxPool2d::backward", dy, out_shape_);
    if (!need_dx) return {};
    const index_t H = in_[2], W = in_[3], P = out_shape_.dims[2], Q = out_shape_.dims[3];
    auto dx = dx_.template get<DP>(dextents<4>(in_[0], in_[1], H, W));
    const auto* d = dy.data();
    auto* out = dx.data();
    const auto* arg = arg_.data();
#if TESSERA_MAXPOOL2_SIMD
    if constexpr (K == 2 && detail::maxpool2::simd_v<DP> && tessera::detail::is_host_exec_v<Exec>) {
      // One work item per output row (b, c, p): the two input rows under it, and the input rows
      // below the last window (odd H) with the last p.
      const index_t B = in_[0], C = in_[1];
      Kokkos::parallel_for("tessera::nn::MaxPool2d::backward[simd]",
                           Kokkos::RangePolicy<Exec>(exec, 0, B * C * P), [=](const index_t r) {
                             const index_t bc = r / P, p = r % P;
                             auto* plane = out + bc * H * W;
                             detail::maxpool2::backward_rows<DP>(d + r * Q, arg + r * Q, Q, W,
                                                                 plane + 2 * p * W,
                                                                 plane + (2 * p + 1) * W);
                             if (p == P - 1)
                               for (index_t e = 2 * P * W; e < H * W; ++e)
                                 plane[e] = from_float<DP>(0.f);
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
          for (index_t q = 0; q < Q; ++q) {
            const auto g = drow[q];
            const int at = arow[q];
            for (index_t dw = 0; dw < K; ++dw)
              row[q * K + dw] = detail::keep_or_zero(at == static_cast<int>(dh * K + dw), g);
          }
          for (index_t w = Q * K; w < W; ++w) row[w] = from_float<DP>(0.f);
        });
    exec.fence();
    return dx;
  }

private:
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
  }

private:
  std::array<index_t, 4> in_{};
  detail::saved_shape out_shape_;
};

} // namespace tessera::nn
