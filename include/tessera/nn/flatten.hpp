#pragma once
/// \file nn/flatten.hpp
/// nn::Flatten: (B, C, H, W) -> (B, C*H*W), sharing memory (no copy), as torch.nn.Flatten().
/// nn::Input<Dims...>: the identity, fixing the per-sample shape (B, Dims...) at the start of
/// a Sequential whose first real layer (a Conv2d) does not fix it by itself.

#include <tessera/nn/activation.hpp>

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

template <index_t... Dims>
class Input {
  static_assert(sizeof...(Dims) >= 1 && ((Dims >= 1) && ...),
                "tessera::nn::Input<Dims...>: give the static per-sample shape, e.g. "
                "Input<1, 28, 28>.");
  using M = detail::default_memory_space;

public:
  using input_extents = extents<dyn, Dims...>;
  static constexpr bool is_input = true;
  template <class InExt>
  static constexpr bool accepts = InExt::rank == sizeof...(Dims) + 1;
  template <class InExt>
  using output_extents = input_extents;

  explicit Input(std::uint64_t /*seed*/ = 0) {}
  auto parameters() const { return boost::hana::make_tuple(); }

  /// x seen as (B, Dims...) (shares memory); throws shape_error if its extents differ.
  template <class Exec, class P, class E>
  Tensor<P, input_extents, layout_right, M> forward(const Exec&,
                                                    const Tensor<P, E, layout_right, M>& x) {
    static_assert(E::rank == sizeof...(Dims) + 1,
                  "tessera::nn::Input::forward: x must be (B, Dims...).");
    const std::array<index_t, sizeof...(Dims)> want{Dims...};
    for (std::size_t i = 0; i < want.size(); ++i)
      if (x.extent(i + 1) != want[i])
        throw shape_error("tessera::nn::Input::forward: x has shape " + shape_string(x.extents()) +
                          " but the model takes " + shape_string(input_extents(x.extent(0))));
    return Tensor<P, input_extents, layout_right, M>(x.kokkos_view(), input_extents(x.extent(0)));
  }

  template <class Exec, class P, class DE>
  Tensor<P, DE, layout_right, M> backward(const Exec&, const Tensor<P, DE, layout_right, M>& dy,
                                          bool = true) {
    return dy;
  }
};

} // namespace tessera::nn
