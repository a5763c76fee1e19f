#pragma once
/// \file nn/activation.hpp
/// Element-wise activations of any shape and precision: nn::ReLU and nn::GELU (PyTorch's exact
/// erf form). The output has the input's shape and precision; each value is computed in fp32
/// and rounded once. backward returns dx in dy's precision.
///
///   tessera::nn::ReLU relu;
///   auto y = relu.forward(exec, x);    // keeps a 1-byte mask per element for backward
///   auto dx = relu.backward(exec, dy); // dy * (x > 0)

#include <tessera/nn/detail/common.hpp>

#include <boost/hana/tuple.hpp>

#include <array>
#include <cstdint>

namespace tessera::nn {

namespace detail {
/// The run-time extents of a tensor as a fixed array of up to 8 dimensions plus its rank.
struct saved_shape {
  std::array<index_t, 8> dims{};
  std::size_t rank = 0;
  index_t size = -1; // -1: no forward yet

  template <class Ext>
  void save(const Ext& e) {
    static_assert(Ext::rank <= 8, "tessera::nn: tensors of rank > 8 are not supported.");
    rank = Ext::rank;
    for (std::size_t i = 0; i < Ext::rank; ++i) dims[i] = e.extent(i);
    size = e.size();
  }
  template <std::size_t R>
  std::array<index_t, R> as() const {
    std::array<index_t, R> a{};
    for (std::size_t i = 0; i < R; ++i) a[i] = dims[i];
    return a;
  }
};

template <class T>
void require_saved_like(const char* op, const T& dy, const saved_shape& s) {
  if (s.size < 0) throw value_error(std::string(op) + ": called before forward");
  if (T::rank != s.rank)
    throw shape_error(std::string(op) + ": dy has rank " + std::to_string(T::rank) +
                      " but the last forward's output has rank " + std::to_string(s.rank));
  require_extents(op, "dy", dy, s.as<T::rank>());
}
} // namespace detail

/// max(x, 0). No parameters.
class ReLU {
  using M = detail::default_memory_space;

public:
  template <class InExt>
  static constexpr bool accepts = InExt::rank >= 1;
  template <class InExt>
  using output_extents = InExt;

  explicit ReLU(std::uint64_t /*seed*/ = 0) : y_("relu.y"), dx_("relu.dx"), mask_("relu.mask") {}
  auto parameters() const { return boost::hana::make_tuple(); }

  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    auto y = y_.template get<P>(x.extents());
    const auto* in = x.data();
    auto* out = y.data();
    auto* mask = mask_.get(x.size());
    Kokkos::parallel_for(
        "tessera::nn::ReLU::forward", Kokkos::RangePolicy<Exec>(exec, 0, x.size()),
        KOKKOS_LAMBDA(const index_t i) {
          const bool pos = to_float(in[i]) > 0.f;
          mask[i] = pos ? 1 : 0;
          out[i] = pos ? in[i] : from_float<P>(0.f);
        });
    exec.fence();
    shape_.save(x.extents());
    return y;
  }

  /// dx = dy where the last forward's input was > 0, else 0 (PyTorch's choice at 0).
  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> backward(const Exec& exec, const Tensor<P, E, layout_right, M>& dy,
                                         bool need_dx = true) {
    detail::require_saved_like("tessera::nn::ReLU::backward", dy, shape_);
    if (!need_dx) return {};
    auto dx = dx_.template get<P>(dy.extents());
    const auto* d = dy.data();
    auto* out = dx.data();
    const auto* mask = mask_.data();
    Kokkos::parallel_for(
        "tessera::nn::ReLU::backward", Kokkos::RangePolicy<Exec>(exec, 0, dy.size()),
        KOKKOS_LAMBDA(const index_t i) { out[i] = mask[i] ? d[i] : from_float<P>(0.f); });
    exec.fence();
    return dx;
  }

private:
  detail::any_buffer y_, dx_;
  detail::raw_buffer<std::uint8_t> mask_;
  detail::saved_shape shape_;
};

/// GELU(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (PyTorch's default, approximate='none').
/// Keeps an fp32 copy of x for backward: dGELU/dx = Phi(x) + x phi(x).
class GELU {
  using M = detail::default_memory_space;

public:
  template <class InExt>
  static constexpr bool accepts = InExt::rank >= 1;
  template <class InExt>
  using output_extents = InExt;

  explicit GELU(std::uint64_t /*seed*/ = 0) : y_("gelu.y"), dx_("gelu.dx"), x_("gelu.x") {}
  auto parameters() const { return boost::hana::make_tuple(); }

  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    auto y = y_.template get<P>(x.extents());
    const auto* in = x.data();
    auto* out = y.data();
    auto* keep = x_.get(x.size());
    Kokkos::parallel_for(
        "tessera::nn::GELU::forward", Kokkos::RangePolicy<Exec>(exec, 0, x.size()),
        KOKKOS_LAMBDA(const index_t i) {
          const float v = to_float(in[i]);
          keep[i] = v;
          // 0.70710678f = 1/sqrt(2), rounded to float.
          out[i] = from_float<P>(0.5f * v * (1.f + detail::kmath::erf(v * 0.70710678f)));
        });
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
    const float* xs = x_.data();
    Kokkos::parallel_for(
        "tessera::nn::GELU::backward", Kokkos::RangePolicy<Exec>(exec, 0, dy.size()),
        KOKKOS_LAMBDA(const index_t i) {
          const float v = xs[i];
          const float cdf = 0.5f * (1.f + detail::kmath::erf(v * 0.70710678f));
          // 0.39894228f = 1/sqrt(2 pi): the standard normal density's factor.
          const float pdf = 0.39894228f * detail::kmath::exp(-0.5f * v * v);
          out[i] = from_float<P>(to_float(d[i]) * (cdf + v * pdf));
        });
    exec.fence();
    return dx;
  }

private:
  detail::any_buffer y_, dx_;
  detail::raw_buffer<float> x_;
  detail::saved_shape shape_;
};

} // namespace tessera::nn
