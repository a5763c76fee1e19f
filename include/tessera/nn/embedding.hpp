#pragma once
/// \file nn/embedding.hpp
/// The input layers of a language model:
///
///   nn::Embedding<V, D>          token embedding: ids (B, t) in [0, V) -> rows of W (V, D),
///                                y (B, t, D) (PyTorch's nn.Embedding(V, D)).
///   nn::PositionEmbedding<T, D>  learned positional embedding: y = x + P[0..t) for x (B, t, D),
///                                t <= T (nanoGPT's wpe, added in the same step).
///
///   tessera::nn::Embedding<256, 128> tok(/*seed=*/1);
///   tessera::nn::PositionEmbedding<128, 128> pos(/*seed=*/2);
///   auto x = pos.forward(exec, tok.forward(exec, ids)); // ids: Kokkos::View<const int32_t**>
///   ...
///   tok.backward(exec, pos.backward(exec, dx));          // writes both weights' grad
///
/// Both tables are initialised N(0, 0.02) (nanoGPT's rule) from tessera's counter-based
/// generator: the same seed gives the same table on every space and thread count. Everything
/// is fp32 (the tables are fp32 masters and the outputs fp32 activations).
///
/// Embedding is not an nn::Layer usable inside nn::Sequential (its input is integers, not a
/// tensor): a model composes it in front of one. Its backward takes dy (B, t, D), returns
/// nothing, and OVERWRITES W.grad with this step's gradient: zero for rows no id selects, the
/// sum of dy over the positions that select a row otherwise. The scatter-add is deterministic
/// (one work item per feature column walks every position in order: no atomics, the same sums
/// on every run).
///
/// PositionEmbedding is an nn::Layer on (B, t, D) (replicated by the tensor split). Its
/// backward returns dx = dy (a copy) and writes P.grad[p] = sum over the batch of dy[., p] for
/// p < t, zero for the rows t..T-1 the forward did not use.

#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/layer.hpp>

#include <boost/hana/tuple.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace tessera::nn {

namespace detail {
/// N(0, 0.02) from the counter-based generator, stream (seed, which).
template <class Ext>
void init_normal_002(const Tensor<fp32, Ext>& t, std::uint64_t seed, std::uint64_t which) {
  fill_normal(t, counter_rng{seed, which}.bits(0), 0.f, 0.02f);
}
} // namespace detail

template <index_t V, index_t D>
class Embedding {
  static_assert(V >= 1 && D >= 1,
                "tessera::nn::Embedding<V, D>: the vocabulary size and the width must be >= 1.");
  using M = detail::default_memory_space;

public:
  using weight_extents = extents<V, D>;
  using output_extents = extents<dyn, dyn, D>;

  /// W (V, D) drawn N(0, 0.02) from the counter-based generator stream of `seed`.
  explicit Embedding(std::uint64_t seed = 0)
      : weight_("weight", weight_extents{}), y_("embedding.y"), ids_("embedding.ids") {
    reset_parameters(seed);
  }
  void reset_parameters(std::uint64_t seed) { detail::init_normal_002(weight_.value, seed, 0); }

  parameter<weight_extents>& weight() noexcept { return weight_; }
  /// (weight) as a boost::hana::tuple of one handle.
  auto parameters() const { return boost::hana::make_tuple(weight_); }

  /// y[b, i, :] = W[ids(b, i), :]. ids: a rank-2 Kokkos::View of integers (B, t) readable from
  /// Exec (e.g. Kokkos::View<const std::int32_t**>); kept (copied) for backward. Throws
  /// value_error, before writing anything, if an id is outside [0, V).
  template <class Exec, class Ids>
  Tensor<fp32, output_extents, layout_right, M> forward(const Exec& exec, const Ids& ids) {
    static_assert(Kokkos::is_view<Ids>::value && Ids::rank == 2 &&
                      std::is_integral_v<typename Ids::non_const_value_type>,
                  "tessera::nn::Embedding::forward: ids must be a rank-2 Kokkos::View of "
                  "integers (B, t).");
    const index_t B = static_cast<index_t>(ids.extent(0));
    const index_t t = static_cast<index_t>(ids.extent(1));
    const index_t n = B * t;
    index_t bad = 0;
    Kokkos::parallel_reduce(
        "tessera::nn::Embedding::forward[check]", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(const index_t k, index_t& c) {
          const auto id = static_cast<std::int64_t>(ids(k / t, k % t));
          c += (id < 0 || id >= V) ? 1 : 0;
        },
        bad);
    if (bad)
      throw value_error("tessera::nn::Embedding<" + std::to_string(V) + ", " + std::to_string(D) +
                        ">::forward: " + std::to_string(bad) + " of the " + std::to_string(n) +
                        " token ids are outside [0, " + std::to_string(V) + ")");
    auto y = y_.get(output_extents(B, t));
    std::int32_t* keep = ids_.get(n);
    float* out = y.data();
    const float* w = weight_.value.data();
    Kokkos::parallel_for(
        "tessera::nn::Embedding::forward", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(const index_t k) {
          const auto id = static_cast<index_t>(ids(k / t, k % t));
          keep[k] = static_cast<std::int32_t>(id);
          for (index_t j = 0; j < D; ++j) out[k * D + j] = w[id * D + j];
        });
    exec.fence();
    shape_.save(y.extents());
    return y;
  }

  /// From dy = dL/dy (B, t, D) of the last forward: W.grad = this step's gradient (zero rows
  /// for ids not seen). There is no input gradient (the input is integers).
  template <class Exec, class DP, class DE>
  void backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy) {
    static_assert(DE::rank == 3, "tessera::nn::Embedding::backward: dy must be (B, t, D).");
    detail::require_saved_like("tessera::nn::Embedding::backward", dy, shape_);
    const index_t n = shape_.dims[0] * shape_.dims[1];
    const auto* d = dy.data();
    const std::int32_t* ids = ids_.data();
    float* g = weight_.grad.data();
    Kokkos::parallel_for(
        "tessera::nn::Embedding::backward", Kokkos::RangePolicy<Exec>(exec, 0, D),
        KOKKOS_LAMBDA(const index_t j) {
          for (index_t v = 0; v < V; ++v) g[v * D + j] = 0.f;
          for (index_t k = 0; k < n; ++k) g[index_t(ids[k]) * D + j] += to_float(d[k * D + j]);
        });
    exec.fence();
  }

  /// nn/layer.hpp: the last forward's output and its copy of the ids.
  void count_activations(activation_ledger& l) const {
    y_.count(l);
    ids_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    ids_.release();
    shape_ = {};
  }

private:
  parameter<weight_extents> weight_;
  detail::buffer<fp32> y_;
  detail::raw_buffer<std::int32_t> ids_;
  detail::saved_shape shape_; // the last forward's output (B, t, D)
};

template <index_t T, index_t D>
class PositionEmbedding {
  static_assert(T >= 1 && D >= 1,
                "tessera::nn::PositionEmbedding<T, D>: the context bound and the width must be "
                ">= 1.");
  using M = detail::default_memory_space;

public:
  using weight_extents = extents<T, D>;
  /// Context bound: inputs may have any t <= T (checked at forward).
  static constexpr index_t max_positions = T;

  /// (B, t, D), t dynamic or a static t <= T.
  template <class InExt>
  static constexpr bool accepts = InExt::rank == 3 &&
                                  (InExt::static_extent(2) == D ||
                                   InExt::static_extent(2) == dyn) &&
                                  (InExt::static_extent(1) == dyn || InExt::static_extent(1) <= T);
  template <class InExt>
  using output_extents = InExt;
  /// nn/layer.hpp: one add per element.
  template <class InExt>
  static constexpr double forward_flops = elements_per_sample<InExt>;
  static constexpr split_kind tensor_split = split_kind::replicate;

  /// P (T, D) drawn N(0, 0.02) from the counter-based generator stream of `seed`.
  explicit PositionEmbedding(std::uint64_t seed = 0)
      : weight_("weight", weight_extents{}), y_("position_embedding.y"),
        dx_("position_embedding.dx") {
    reset_parameters(seed);
  }
  void reset_parameters(std::uint64_t seed) { detail::init_normal_002(weight_.value, seed, 0); }

  parameter<weight_extents>& weight() noexcept { return weight_; }
  auto parameters() const { return boost::hana::make_tuple(weight_); }

  /// y[b, i, :] = x[b, i, :] + P[i, :], in x's precision (the sum in fp32, rounded once).
  /// Throws shape_error if x is not (B, t, D) with t <= T.
  template <class Exec, class P, class E>
  Tensor<P, E, layout_right, M> forward(const Exec& exec, const Tensor<P, E, layout_right, M>& x) {
    static_assert(accepts<E>, "tessera::nn::PositionEmbedding::forward: x must be (B, t, D).");
    const index_t t = x.extent(1);
    if (x.extent(2) != D || t > T)
      throw shape_error("tessera::nn::PositionEmbedding<" + std::to_string(T) + ", " +
                        std::to_string(D) + ">::forward: x has shape " + shape_string(x.extents()) +
                        "; it must be (B, t, " + std::to_string(D) +
                        ") with t <= " + std::to_string(T) + " (the positional table's rows)");
    auto y = y_.template get<P>(x.extents());
    const auto* in = x.data();
    auto* out = y.data();
    const float* w = weight_.value.data();
    const index_t n = x.size() / D;
    Kokkos::parallel_for(
        "tessera::nn::PositionEmbedding::forward", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(const index_t k) {
          const index_t p = k % t;
          for (index_t j = 0; j < D; ++j)
            out[k * D + j] = from_float<P>(to_float(in[k * D + j]) + w[p * D + j]);
        });
    exec.fence();
    shape_.save(x.extents());
    return y;
  }

  /// dx = dy (a copy in dy's precision, empty when !need_dx); P.grad[p] = sum_b dy[b, p] for
  /// p < t, 0 for p >= t.
  template <class Exec, class DP, class DE>
  Tensor<DP, DE, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    detail::require_saved_like("tessera::nn::PositionEmbedding::backward", dy, shape_);
    const index_t B = shape_.dims[0], t = shape_.dims[1];
    const auto* d = dy.data();
    float* g = weight_.grad.data();
    Kokkos::parallel_for(
        "tessera::nn::PositionEmbedding::backward[weight]",
        Kokkos::RangePolicy<Exec>(exec, 0, T * D), KOKKOS_LAMBDA(const index_t k) {
          const index_t p = k / D, j = k % D;
          float s = 0.f;
          if (p < t)
            for (index_t b = 0; b < B; ++b) s += to_float(d[(b * t + p) * D + j]);
          g[k] = s;
        });
    exec.fence();
    if (!need_dx) return {};
    auto dx = dx_.template get<DP>(dy.extents());
    detail::for_chunks(
        exec, "tessera::nn::PositionEmbedding::backward[dx]", dy.size(),
        KOKKOS_LAMBDA(const index_t begin, const index_t end) {
          const auto* src = dy.data();
          auto* dst = dx.data();
          for (index_t i = begin; i < end; ++i) dst[i] = src[i];
        });
    exec.fence();
    return dx;
  }

  /// nn/layer.hpp: the last forward's output.
  void count_activations(activation_ledger& l) const { y_.count(l); }
  /// nn/layer.hpp: frees it; backward then needs a forward first.
  void release_activations() noexcept {
    y_.release();
    shape_ = {};
  }

private:
  parameter<weight_extents> weight_;
  detail::any_buffer y_, dx_;
  detail::saved_shape shape_;
};

/// Embedding<V, D> as an nn::Layer on ids of T positions (the first layer of a language model
/// written as one nn::Sequential, which is what the parallel plans split and cut into pipeline
/// stages). Its input is a rank-2 Kokkos::View of integers (B, T), the model input shape it
/// fixes is extents<dyn, T> (input_extents), and it returns (B, T, D) with T static, so every
/// later activation has a static shape after the batch (what a pipeline boundary needs).
/// Parameters, initialisation and arithmetic are Embedding<V, D>'s; backward writes W.grad and
/// returns an empty tensor (no gradient for integers). Replicated by the tensor split.
template <index_t V, index_t D, index_t T>
class TokenEmbedding {
  static_assert(T >= 1, "tessera::nn::TokenEmbedding<V, D, T>: the context T must be >= 1.");
  using M = detail::default_memory_space;

public:
  using input_extents = extents<dyn, T>;
  template <class InExt>
  static constexpr bool accepts = InExt::rank == 2 &&
                                  (InExt::static_extent(1) == T || InExt::static_extent(1) == dyn);
  template <class InExt>
  using output_extents = extents<dyn, T, D>;
  /// nn/layer.hpp: one copy per output element.
  template <class InExt>
  static constexpr double forward_flops = double(T) * double(D);
  static constexpr split_kind tensor_split = split_kind::replicate;

  explicit TokenEmbedding(std::uint64_t seed = 0) : table_(seed) {}

  Embedding<V, D>& table() noexcept { return table_; }
  auto parameters() const { return table_.parameters(); }

  /// Embedding<V, D>::forward on ids (B, T); throws shape_error if ids has not T columns.
  template <class Exec, class Ids>
  Tensor<fp32, extents<dyn, T, D>, layout_right, M> forward(const Exec& exec, const Ids& ids) {
    if (index_t(ids.extent(1)) != T)
      throw shape_error("tessera::nn::TokenEmbedding<" + std::to_string(V) + ", " +
                        std::to_string(D) + ", " + std::to_string(T) + ">::forward: ids (" +
                        std::to_string(ids.extent(0)) + ", " + std::to_string(ids.extent(1)) +
                        ") must have " + std::to_string(T) + " positions");
    const auto y = table_.forward(exec, ids);
    return reshape<extents<dyn, T, D>>(y, y.extent(0));
  }

  /// Embedding<V, D>::backward; returns an empty tensor.
  template <class Exec, class DP, class DE>
  Tensor<DP, DE, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool /*need_dx*/ = true) {
    table_.backward(exec, dy);
    return {};
  }

  /// nn/layer.hpp: the embedding's (see Embedding).
  void count_activations(activation_ledger& l) const { table_.count_activations(l); }
  void release_activations() noexcept { table_.release_activations(); }

private:
  Embedding<V, D> table_;
};

} // namespace tessera::nn
