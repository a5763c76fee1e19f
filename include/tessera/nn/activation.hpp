#pragma once
/// \file nn/activation.hpp
/// Element-wise activations of any shape and precision: nn::ReLU and nn::GELU (PyTorch's exact
/// erf form). The output has the input's shape and precision; each value is computed in fp32
/// and rounded once. backward returns dx in dy's precision.
///
///   tessera::nn::ReLU relu;
///   auto y = relu.forward(exec, x);    // y stays in the layer for backward
///   auto dx = relu.backward(exec, dy); // dy * (y > 0) = dy * (x > 0)

#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/layer.hpp>
#include <tessera/simd/lanes.hpp> // xsimd, host passes only

#include <boost/hana/tuple.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>

namespace tessera::nn {

/// max(x, 0) (NaN -> 0). No parameters. backward reads the forward's output (as PyTorch's
/// threshold_backward does): dx = dy where y > 0, which holds exactly where x > 0; the output
/// must therefore not be modified between forward and backward.
class ReLU {
  using M = detail::default_memory_space;

public:
  template <class InExt>
  static constexpr bool accepts = InExt::rank >= 1;
  template <class InExt>
  using output_extents = InExt;
  /// nn/layer.hpp: element-wise, so a feature shard is computed as the whole; one comparison
  /// per element.
  static constexpr split_kind tensor_split = split_kind::per_feature;
  template <class InExt>
  static constexpr double forward_flops = elements_per_sample<InExt>;

  explicit ReLU(std::uint64_t /*seed*/ = 0) : y_("relu.y"), dx_("relu.dx") {}
  auto parameters() const { return boost::hana::make_tuple(); }

  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    auto y = y_.template get<P>(x.extents());
    detail::for_chunks(
        exec, "tessera::nn::ReLU::forward", x.size(),
        KOKKOS_LAMBDA(const index_t begin, const index_t end) {
          // Local copies: the loop's stores cannot alias them, so it vectorises (branch-free).
          const auto* in = x.data();
          auto* out = y.data();
          for (index_t i = begin; i < end; ++i) {
            const auto v = in[i];
            out[i] = detail::keep_or_zero(to_float(v) > 0.f, v);
          }
        });
    exec.fence();
    shape_.save(x.extents());
    last_y_ = y.data();
    last_kind_ = kind_of<P>();
    return y;
  }

  /// Takes y, which the layer before computed with detail::relu_store applied to its output
  /// (nn::Sequential fuses them), as this layer's forward output: backward reads it there, so
  /// y must stay unmodified until then (the layer before owns it until its next forward).
  template <class P, class E>
  void adopt_output(const Tensor<P, E, layout_right, M>& y) {
    y_.release();
    shape_.save(y.extents());
    last_y_ = y.data();
    last_kind_ = kind_of<P>();
  }

  /// dx = dy where the last forward's output (equivalently its input) was > 0, else 0
  /// (PyTorch's choice at 0).
  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> backward(const Exec& exec, const Tensor<P, E, layout_right, M>& dy,
                                         bool need_dx = true) {
    detail::require_saved_like("tessera::nn::ReLU::backward", dy, shape_);
    if (!need_dx) return {};
    auto dx = dx_.template get<P>(dy.extents());
    // The output's precision is the forward input's: find it among all precisions.
    const auto run = [&](auto prec) {
      using Y = decltype(prec);
      if (last_kind_ != kind_of<Y>()) return;
      const auto* yp = static_cast<const storage_t<Y>*>(last_y_);
      detail::for_chunks(
          exec, "tessera::nn::ReLU::backward", dy.size(),
          KOKKOS_LAMBDA(const index_t begin, const index_t end) {
            const auto* d = dy.data();
            const auto* y = yp;
            auto* out = dx.data();
            for (index_t i = begin; i < end; ++i)
              out[i] = detail::keep_or_zero(to_float(y[i]) > 0.f, d[i]);
          });
    };
    for_each_precision(run);
    exec.fence();
    return dx;
  }

  /// nn/layer.hpp: the last forward's output, which backward reads.
  void count_activations(activation_ledger& l) const { y_.count(l); }
  /// nn/layer.hpp: frees it; backward then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    shape_ = {};
    last_y_ = nullptr;
    last_kind_ = -1;
  }

private:
  detail::any_buffer y_, dx_;
  detail::saved_shape shape_;
  // The last forward's output (in y_) and its precision.
  const void* last_y_ = nullptr;
  int last_kind_ = -1;
  template <class P>
  static constexpr int kind_of() {
    return precision_index<P>();
  }
};

/// GELU(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (PyTorch's default, approximate='none').
/// Forward keeps the fp32 derivative dGELU/dx = Phi(x) + x phi(x) per element (the same memory
/// as an fp32 copy of x), so backward is one multiply per element (no erf, no exp).
class GELU {
  using M = detail::default_memory_space;

public:
  template <class InExt>
  static constexpr bool accepts = InExt::rank >= 1;
  template <class InExt>
  using output_extents = InExt;
  /// nn/layer.hpp: element-wise; counted as one operation per element, like the activations
  /// (erf's cost is not a FLOP count any two libraries agree on).
  static constexpr split_kind tensor_split = split_kind::per_feature;
  template <class InExt>
  static constexpr double forward_flops = elements_per_sample<InExt>;

  explicit GELU(std::uint64_t /*seed*/ = 0) : y_("gelu.y"), dx_("gelu.dx"), grad_("gelu.grad") {}
  auto parameters() const { return boost::hana::make_tuple(); }

  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    auto y = y_.template get<P>(x.extents());
    const auto* in = x.data();
    auto* out = y.data();
    auto* keep = grad_.get(x.size());
#if !TESSERA_DEVICE_PASS
    if constexpr (tessera::detail::is_host_exec_v<Exec> && tessera::detail::simd::available) {
      // Host: xsimd batches over chunks, Phi by normal_cdf_sharing_exp (libm's scalar erff and
      // expf were about 13% of the char GPT's fp32 step on Zen 4).
      detail::for_chunks(exec, "tessera::nn::GELU::forward", x.size(),
                         [=](const index_t begin, const index_t end) {
                           gelu_host<P>(in + begin, out + begin, keep + begin, end - begin);
                         });
    } else
#endif
    {
      Kokkos::parallel_for(
          "tessera::nn::GELU::forward", Kokkos::RangePolicy<Exec>(exec, 0, x.size()),
          KOKKOS_LAMBDA(const index_t i) {
            const float v = to_float(in[i]);
            // Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation in the left tail.
            const float cdf = 0.5f * detail::kmath::erfc(-v * inv_sqrt2);
            const float pdf = inv_sqrt_2pi * detail::kmath::exp(-0.5f * v * v);
            keep[i] = cdf + v * pdf;
            out[i] = from_float<P>(v * cdf);
          });
    }
    exec.fence();
    shape_.save(x.extents());
    return y;
  }

  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> backward(const Exec& exec, const Tensor<P, E, layout_right, M>& dy,
                                         bool need_dx = true) {
    detail::require_saved_like("tessera::nn::GELU::backward", dy, shape_);
    if (!need_dx) return {};
    auto dx = dx_.template get<P>(dy.extents());
    const auto* d = dy.data();
    auto* out = dx.data();
    const float* g = grad_.data();
    detail::zip_rounded<P>(
        exec, "tessera::nn::GELU::backward", dy.size(), d, g, out,
        KOKKOS_LAMBDA(const float x, const float y) { return x * y; });
    exec.fence();
    return dx;
  }

  /// nn/layer.hpp: the last forward's output and its fp32 derivative.
  void count_activations(activation_ledger& l) const {
    y_.count(l);
    grad_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    grad_.release();
    shape_ = {};
  }

private:
  // 1/sqrt(2) and 1/sqrt(2 pi) (the standard normal density's factor), rounded to float.
  static constexpr float inv_sqrt2 = 0.70710678f;
  static constexpr float inv_sqrt_2pi = 0.39894228f;

#if !TESSERA_DEVICE_PASS
  /// Phi(x), the standard normal CDF, for a batch, given e = exp(-x^2 / 2) (which GELU needs
  /// anyway for the density): with a = |x|, Phi(x) = e Q(a) for x < 0 and 1 - e Q(a) for x >= 0,
  /// where Q(a) = erfc(a / sqrt 2) exp(a^2 / 2) / 2 is smooth and decreasing on [0, inf) (0.5 at
  /// 0, about 1 / (a sqrt(2 pi)) for large a). Q(a) ~ t P(t), t = 1 / (1 + 0.244 a), P of degree
  /// 6: coefficients fitted here (weighted minimax by Lawson iterations in 30-digit mpmath, the
  /// weight e, i.e. the absolute error of Phi, over a in [0, 14]). The fit's absolute error in Phi
  /// is below 9.2e-10 and its relative error below 8.7e-5 for a < 9 (Phi > 1e-19); the float
  /// evaluation adds a few ulp. No branch: one division, seven FMAs and a select, where the erf
  /// it replaces (xsimd's two-range method) paid both ranges, a division and 17 FMAs (GELU went
  /// from 0.44 to 0.30 ns per value in L1, AMD EPYC family 26 model 2, Zen 5). Unlike
  /// 0.5 (1 + erf(x / sqrt 2)) the left tail has no cancellation: Phi(-5) keeps its digits.
  /// Infinite x: e = 0 and t = 0, Phi = 0 or 1; NaN stays NaN.
  template <class B>
  static B normal_cdf_sharing_exp(const B& x, const B& e) {
    const B t = B(1.f) / xsimd::fma(B(0.244f), xsimd::abs(x), B(1.f));
    B p(-0.10985862853580686f); // Horner from the highest coefficient
    p = xsimd::fma(p, t, B(0.45505963355425806f));
    p = xsimd::fma(p, t, B(-0.45995369556092172f));
    p = xsimd::fma(p, t, B(0.4478279474168582f));
    p = xsimd::fma(p, t, B(-0.057374278952190469f));
    p = xsimd::fma(p, t, B(0.12994213775094476f));
    p = xsimd::fma(p, t, B(0.094356883422727051f));
    const B tail = e * (p * t); // Phi(-|x|)
    return xsimd::select(x < B(0.f), tail, B(1.f) - tail);
  }

  /// The forward's formula on n values on the host, xsimd batches of fp32 (the input widened
  /// and the output rounded through convert_n, 256 values at a time); y = x Phi(x) and
  /// keep = Phi(x) + x phi(x) as the kernel computes them, Phi by normal_cdf_sharing_exp (within
  /// 1e-9 plus a few ulp of the exact value), with one exp per value.
  template <class P>
  static void gelu_host(const storage_t<P>* in, storage_t<P>* out, float* keep, index_t n) {
    using B = xsimd::batch<float, xsimd::default_arch>;
    constexpr index_t block = 256, w = index_t(B::size);
    static_assert(block % w == 0);
    alignas(64) float xf[block], yf[block];
    for (index_t b = 0; b < n; b += block) {
      const index_t m = n - b < block ? n - b : block;
      const float* xs = xf;
      float* ys = yf;
      if constexpr (std::is_same_v<storage_t<P>, float>) {
        xs = in + b;
        ys = out + b;
      } else {
        convert_n<fp32>(in + b, xf, std::size_t(m));
      }
      index_t i = 0;
      for (; i + w <= m; i += w) {
        const B v = B::load_unaligned(xs + i);
        const B e = xsimd::exp(B(-0.5f) * v * v); // exp(-x^2 / 2): the density's and Phi's
        const B cdf = normal_cdf_sharing_exp(v, e);
        (cdf + v * (B(inv_sqrt_2pi) * e)).store_unaligned(keep + b + i);
        (v * cdf).store_unaligned(ys + i);
      }
      for (; i < m; ++i) {
        const float v = xs[i];
        const float cdf = 0.5f * std::erfc(-v * inv_sqrt2);
        const float pdf = inv_sqrt_2pi * std::exp(-0.5f * v * v);
        keep[b + i] = cdf + v * pdf;
        ys[i] = v * cdf;
      }
      if constexpr (!std::is_same_v<storage_t<P>, float>) convert_n<P>(yf, out + b, std::size_t(m));
    }
  }
#endif

  detail::any_buffer y_, dx_;
  detail::raw_buffer<float> grad_; // dGELU/dx of the last forward, fp32
  detail::saved_shape shape_;
};

} // namespace tessera::nn
