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
      // Host: xsimd's vectorised erf and exp over chunks (libm's scalar erff and expf were
      // about 13% of the char GPT's fp32 step on Zen 4).
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
            const float cdf = 0.5f * (1.f + detail::kmath::erf(v * inv_sqrt2));
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
  /// erf(z) for a batch, given e = exp(-z^2) (which GELU needs anyway for the density, so one
  /// exp per value instead of two). The method and coefficients of xsimd's float erf (from
  /// Boost.SIMD): |z| < 2/3: z P(z^2); else sign(z) (1 - e Q(|z| / (1 + |z|) - 0.4)); erf(+-inf)
  /// = +-1. Within a few ulp of libm's erff.
  template <class B>
  static B erf_sharing_exp(const B& z, const B& e) {
    const B a = xsimd::abs(z);
    const auto poly = [](const B& x, std::initializer_list<float> c) {
      // Horner from the highest coefficient (listed last).
      const float* hi = c.end();
      B r(*--hi);
      while (hi != c.begin()) r = xsimd::fma(r, x, B(*--hi));
      return r;
    };
    const B small =
        z * poly(z * z, {1.128379154774254f, -3.761252839094832e-01f, 1.128218315189123e-01f,
                         -2.678010670585737e-02f, 5.013293006147870e-03f, -6.095205117313012e-04f});
    const B q = poly(a / (B(1.f) + a) - B(0.4f),
                     {5.392844046572836e-01f, -1.137035586823118e+00f, 1.603704761054187e-01f,
                      3.843569094305250e-01f, 1.420508523645926e-01f, 1.562764709849380e-01f,
                      -1.364514006347145e+00f, 3.260765682222576e+00f, -6.409487379234005e+00f,
                      6.702908785399893e+00f, -2.628299919293280e+00f});
    const B large = xsimd::select(xsimd::isinf(a), B(1.f), B(1.f) - e * q);
    return xsimd::select(a < B(2.f / 3.f), small, xsimd::select(z < B(0.f), -large, large));
  }

  /// The forward's formula on n values on the host, xsimd batches of fp32 (the input widened
  /// and the output rounded through convert_n, 256 values at a time); y = x Phi(x) and
  /// keep = Phi(x) + x phi(x) as the kernel computes them, within a few ulp of libm's erf/exp,
  /// with one exp per value (erf_sharing_exp).
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
        const B e = xsimd::exp(B(-0.5f) * v * v); // exp(-x^2 / 2): the density's and erf's
        const B cdf = B(0.5f) * (B(1.f) + erf_sharing_exp(v * B(inv_sqrt2), e));
        (cdf + v * (B(inv_sqrt_2pi) * e)).store_unaligned(keep + b + i);
        (v * cdf).store_unaligned(ys + i);
      }
      for (; i < m; ++i) {
        const float v = xs[i];
        const float cdf = 0.5f * (1.f + std::erf(v * inv_sqrt2));
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
