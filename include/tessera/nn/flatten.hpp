#pragma once
/// \file nn/flatten.hpp
/// nn::Flatten: (B, C, H, W) -> (B, C*H*W), sharing memory (no copy), as torch.nn.Flatten().
/// (nn::Input, which used to live here, is in nn/input.hpp; this header still includes it.)

#include <tessera/nn/activation.hpp>
#include <tessera/nn/input.hpp>
#include <tessera/nn/layer.hpp>

namespace tessera::nn {

class Flatten {
  using M = detail::default_memory_space;
  static constexpr index_t prod(index_t a, index_t b, index_t c) {
    return a == dyn || b == dyn || c == dyn ? dyn : a * b * c;
  }

public:
  template <class InExt>
  static constexpr bool accepts = InExt::rank == 4;
  template <class InExt>
  using output_extents =
      extents<dyn, prod(InExt::static_extent(1), InExt::static_extent(2), InExt::static_extent(3))>;
  /// nn/layer.hpp: a channel shard (B, C/T, H, W) flattens to a contiguous block of the
  /// features; no arithmetic (a view of x).
  static constexpr split_kind tensor_split = split_kind::per_feature;
  template <class InExt>
  static constexpr double forward_flops = 0;

  explicit Flatten(std::uint64_t /*seed*/ = 0) {}
  auto parameters() const { return boost::hana::make_tuple(); }

  template <class Exec, class P, class E>
  Tensor<P, output_extents<E>, layout_right, M> forward(const Exec&,
                                                        const Tensor<P, E, layout_right, M>& x) {
    static_assert(E::rank == 4, "tessera::nn::Flatten::forward: x must be (B, C, H, W).");
    in_.save(x.extents());
    using OE = output_extents<E>;
    const auto oe = OE::from_all({x.extent(0), x.extent(1) * x.extent(2) * x.extent(3)});
    out_.save(oe);
    return Tensor<P, OE, layout_right, M>(x.kokkos_view(), oe);
  }

  /// dy (B, C*H*W) seen as (B, C, H, W) of the last forward (shares memory).
  template <class Exec, class P, class DE>
  Tensor<P, dextents<4>, layout_right, M>
  backward(const Exec&, const Tensor<P, DE, layout_right, M>& dy, bool need_dx = true) {
    detail::require_saved_like("tessera::nn::Flatten::backward", dy, out_);
    if (!need_dx) return {};
    return Tensor<P, dextents<4>, layout_right, M>(dy.kokkos_view(),
                                                   dextents<4>::from_all(in_.as<4>()));
  }

private:
  detail::saved_shape in_, out_;
};

} // namespace tessera::nn
