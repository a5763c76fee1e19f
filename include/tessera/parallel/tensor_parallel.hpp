#pragma once
/// \file parallel/tensor_parallel.hpp
/// Tensor (intra-layer) parallelism for nn::Sequential models, Megatron-LM style
/// (Shoeybi et al. 2019, section 3):
///
///   using Split = tessera::parallel::tensor_split_t<Model, 2>;  // a Sequential again
///   Split model(seed);                                           // layer I seeded as in Model
///   tessera::parallel::bind_tensor_group(model, tessera::parallel::tensor_group(mesh.tensor));
///   model.forward(exec, x); model.backward(exec, dy);           // as the single-process model
///   auto full = tessera::parallel::gather_parameters(model, group); // "8.weight" -> all values
///
/// The transform pairs the model's Linear and Conv2d layers: a splittable layer followed,
/// through layers that act on each feature or channel alone (ReLU, GELU, MaxPool2d, Flatten),
/// by another splittable layer becomes a column-parallel layer then a row-parallel one:
///
///   column-parallel  each rank holds 1/T of the OUTPUT features (Linear: rows of W, Conv2d:
///                    output channels) and their bias; forward needs no communication and
///                    yields 1/T of the activations; backward all-reduces the input gradient
///                    (Megatron's f: identity forward, all-reduce backward).
///   in between       ReLU, GELU, MaxPool2d act on the shard as on the whole; Flatten of a
///                    channel shard (B, C/T, H, W) is a contiguous block of the flat features.
///   row-parallel     each rank holds the weights of its 1/T of the INPUT features (Linear:
///                    columns of W; Conv2d: input channels) and the whole bias; forward
///                    all-reduces the fp32 partial sums, then adds the bias and rounds once
///                    (Megatron's g: all-reduce forward, identity backward).
///
/// So each pair costs one all-reduce forward and one backward (none backward for a first layer,
/// whose input gradient nobody needs). Convolutions are paired like Linear layers (the
/// alternative, splitting every Conv2d by output channels and all-gathering its activations,
/// moves T times more data: a (B, C, H, W) gather per layer instead of one (B, C', H', W')
/// all-reduce per pair). A splittable layer without a partner (e.g. the last of an odd count)
/// is replicated: every tensor rank computes it whole, with identical results. Conv2d with
/// groups != 1 and every other layer with parameters are replicated too.
///
/// Widths T does not divide fail at compile time: the static_assert in
/// detail::tensor_split_check<I, Layer, T, false> names the layer index I and its type.
/// Tensor-parallel layers compute in fp32 or bf16 (fp8 scales would have to be agreed across
/// the group); their activations must be in host-accessible memory (buffers go to MPI).
///
/// Parameters keep the names of the single-process model ("4.weight"); each shard is the slice
/// of the single-process initialisation (the whole layer is initialised with the same seed and
/// sliced), so the split model computes what the whole model computes, up to the order of the
/// fp32 sums.

#include <tessera/nn.hpp>
#include <tessera/parallel/communicator.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tessera::parallel {

/// A tensor-parallel group as tensor-parallel layers see it: rank, size, an fp32 all-reduce and
/// an fp32 all-gather, over any Communicator (type-erased, so that the layer types do not
/// depend on the backend). Copies share the communicator. A default group is a process alone.
class tensor_group {
public:
  tensor_group() = default;

  template <Communicator C>
  explicit tensor_group(C comm) {
    auto c = std::make_shared<C>(std::move(comm));
    rank_ = c->rank();
    size_ = c->size();
    reduce_ = [c](float* buf, std::int64_t n) { c->all_reduce_sum(buf, n); };
    gather_ = [c](const float* send, float* recv, std::int64_t n) { c->all_gather(send, recv, n); };
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// buf[i] = sum over the group of buf[i] (fp32).
  void all_reduce_sum(float* buf, std::int64_t n) const {
    if (reduce_) reduce_(buf, n);
  }
  /// recv[r * n + i] = send[i] of group rank r.
  void all_gather(const float* send, float* recv, std::int64_t n) const {
    if (gather_)
      gather_(send, recv, n);
    else
      std::copy(send, send + n, recv);
  }

private:
  int rank_ = 0, size_ = 1;
  std::function<void(float*, std::int64_t)> reduce_;
  std::function<void(const float*, float*, std::int64_t)> gather_;
};

/// How one parameter of a tensor-parallel layer is split. The whole tensor, row-major, is seen
/// as (outer, T, inner): rank t holds the (outer, inner) block at t, which is the whole tensor
/// cut along dimension `dim` into T equal parts. `split == false`: every rank holds the whole
/// tensor (replicated).
struct shard_spec {
  bool split = false;
  index_t outer = 1;
  index_t inner = 0;
  int dim = 0;
};

namespace detail {

/// shard[o, i] = full[o, t, i] (host pointers).
inline void take_shard(const float* full, float* shard, const shard_spec& s, int T, int t) {
  for (index_t o = 0; o < s.outer; ++o)
    for (index_t i = 0; i < s.inner; ++i) shard[o * s.inner + i] = full[(o * T + t) * s.inner + i];
}

/// full[o, t, i] = gathered[t, o, i] (gathered: the all-gather of the T shards).
inline void assemble_shards(const float* gathered, float* full, const shard_spec& s, int T) {
  const index_t n = s.outer * s.inner;
  for (int t = 0; t < T; ++t)
    for (index_t o = 0; o < s.outer; ++o)
      for (index_t i = 0; i < s.inner; ++i)
        full[(o * T + t) * s.inner + i] = gathered[t * n + o * s.inner + i];
}

/// The values of a parameter tensor as a host vector.
template <class Tensor>
std::vector<float> host_values(const Tensor& t) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, t.kokkos_view());
  return std::vector<float>(h.data(), h.data() + t.size());
}

/// Writes host values into a parameter tensor.
template <class Tensor>
void set_values(const Tensor& t, const float* values) {
  auto h = Kokkos::create_mirror_view(Kokkos::HostSpace{}, t.kokkos_view());
  std::copy(values, values + t.size(), h.data());
  Kokkos::deep_copy(t.kokkos_view(), h);
}

/// Each parameter of `layer` set to shard t of the matching parameter of `whole` (a layer of
/// the single-process model initialised with the same seed).
template <class Layer, class Whole>
void init_from_whole(const Layer& layer, const Whole& whole, int T, int t) {
  std::vector<std::vector<float>> full;
  boost::hana::for_each(whole.parameters(),
                        [&](const auto& p) { full.push_back(host_values(p.value)); });
  std::size_t k = 0;
  boost::hana::for_each(layer.parameters(), [&](const auto& p) {
    const shard_spec& s = Layer::shards[k];
    std::vector<float> shard(static_cast<std::size_t>(p.size()));
    if (s.split)
      take_shard(full[k].data(), shard.data(), s, T, t);
    else
      shard = full[k];
    set_values(p.value, shard.data());
    ++k;
  });
}

inline void check_group(const char* layer, int T, const tensor_group& g) {
  if (g.size() != T)
    throw value_error(std::string("tessera::parallel::") + layer + "::bind: the layer is split " +
                      std::to_string(T) + " ways but the tensor group has " +
                      std::to_string(g.size()) + " ranks");
}
inline void check_bound(const char* layer, bool bound) {
  if (!bound)
    throw value_error(std::string("tessera::parallel::") + layer +
                      ": the layer has no tensor group; call bind_tensor_group(model, group) "
                      "before forward");
}

template <class P>
inline constexpr bool tensor_parallel_precision =
    std::is_same_v<P, fp32> || std::is_same_v<P, bf16>;

template <class Exec>
void fence_and_all_reduce(const Exec& exec, const tensor_group& g, float* buf, index_t n) {
  exec.fence();
  g.all_reduce_sum(buf, n);
}

using tp_memory_space = nn::detail::default_memory_space;
static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, tp_memory_space>::accessible,
              "tessera::parallel: tensor-parallel layers hand activation buffers to the "
              "communicator, which needs host-accessible memory");

} // namespace detail

/// Linear<In, Out, P> split by output features: this rank's Out/T rows of W and of b.
template <index_t In, index_t Out, int T, class P = fp32>
class ColumnParallelLinear {
  static_assert(T >= 1 && Out % T == 0,
                "tessera::parallel::ColumnParallelLinear<In, Out, T>: T must divide Out");
  static_assert(detail::tensor_parallel_precision<P>,
                "tessera::parallel::ColumnParallelLinear: tensor-parallel layers compute in "
                "fp32 or bf16");
  using M = detail::tp_memory_space;
  using inner_type = nn::Linear<In, Out / T, P>;

public:
  static constexpr index_t local_out = Out / T;
  static constexpr int tensor_size = T;
  using whole_type = nn::Linear<In, Out, P>;
  using compute_precision = P;
  using activation_precision = nn::activation_t<P>;
  using input_extents = extents<dyn, In>;
  template <class InExt>
  static constexpr bool accepts = inner_type::template accepts<InExt>;
  template <class InExt>
  using output_extents = extents<dyn, local_out>;
  /// weight (Out, In) as (1, T, Out/T * In); bias (Out) as (1, T, Out/T).
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, 1, local_out* In},
                                                       shard_spec{true, 1, local_out}};

  /// Initialised as shard 0 of the whole layer; bind() re-slices for the group's rank.
  explicit ColumnParallelLinear(std::uint64_t seed = 0)
      : inner_(seed), seed_(seed), w_cast_("tp.linear.w"), dy_cast_("tp.linear.dy"),
        acc_("tp.linear.dx.acc"), dx_("tp.linear.dx") {
    init(0);
  }

  void bind(const tensor_group& g) {
    detail::check_group("ColumnParallelLinear", T, g);
    group_ = g;
    bound_ = true;
    init(g.rank());
  }
  auto parameters() const { return inner_.parameters(); }

  template <class Exec, class X>
  auto forward(const Exec& exec, const X& x) {
    if constexpr (T > 1) detail::check_bound("ColumnParallelLinear", bound_);
    return inner_.forward(exec, x);
  }

  /// Weight and bias gradients of the shard; dx = the all-reduce over the group of the partial
  /// input gradients dy_t W_t, summed in fp32 and rounded once.
  template <class Exec, class DY>
  Tensor<activation_precision, extents<dyn, In>, layout_right, M>
  backward(const Exec& exec, const DY& dy, bool need_dx = true) {
    inner_.backward(exec, dy, false);
    if (!need_dx) return {};
    const index_t B = dy.extent(0);
    const auto w = w_cast_(exec, inner_.weight().value);
    const auto dq = dy_cast_(exec, reshape<extents<dyn, local_out>>(dy, B));
    auto acc = acc_.get(extents<dyn, In>(B));
    gemm(exec, dq.t, w.t, acc, gemm_options{.alpha = 1.f, .beta = 0.f});
    detail::fence_and_all_reduce(exec, group_, acc.data(), acc.size());
    if constexpr (std::is_same_v<activation_precision, fp32>) {
      return acc;
    } else {
      auto dx = dx_.get(extents<dyn, In>(B));
      convert_into(exec, dx, acc);
      return dx;
    }
  }

private:
  void init(int t) { detail::init_from_whole(*this, nn::Linear<In, Out, fp32>(seed_), T, t); }

  inner_type inner_;
  std::uint64_t seed_;
  tensor_group group_;
  bool bound_ = false;
  nn::detail::operand_caster<P, false> w_cast_;
  nn::detail::operand_caster<P, true> dy_cast_;
  nn::detail::buffer<fp32> acc_;
  nn::detail::buffer<activation_precision> dx_;
};

/// Linear<In, Out, P> split by input features: W's columns of this rank's In/T inputs; the whole
/// bias, added after the all-reduce of the partial products.
template <index_t In, index_t Out, int T, class P = fp32>
class RowParallelLinear {
  static_assert(T >= 1 && In % T == 0,
                "tessera::parallel::RowParallelLinear<In, Out, T>: T must divide In");
  static_assert(detail::tensor_parallel_precision<P>,
                "tessera::parallel::RowParallelLinear: tensor-parallel layers compute in fp32 "
                "or bf16");
  using M = detail::tp_memory_space;

public:
  static constexpr index_t local_in = In / T;
  static constexpr int tensor_size = T;
  using whole_type = nn::Linear<In, Out, P>;
  using compute_precision = P;
  using activation_precision = nn::activation_t<P>;
  using weight_extents = extents<Out, local_in>;
  using bias_extents = extents<Out>;
  template <class InExt>
  static constexpr bool accepts = InExt::rank == 2 && (InExt::static_extent(1) == local_in ||
                                                       InExt::static_extent(1) == dyn);
  template <class InExt>
  using output_extents = extents<dyn, Out>;
  /// weight (Out, In) as (Out, T, In/T); the bias replicated.
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, Out, local_in, 1},
                                                       shard_spec{false, 1, 0}};

  explicit RowParallelLinear(std::uint64_t seed = 0)
      : weight_("weight", weight_extents{}), bias_("bias", bias_extents{}), seed_(seed),
        y_("tp.linear.y"), dx_("tp.linear.dx"), acc_("tp.linear.acc"), w_cast_("tp.linear.w"),
        x_cast_("tp.linear.x"), dy_cast_("tp.linear.dy") {
    init(0);
  }

  void bind(const tensor_group& g) {
    detail::check_group("RowParallelLinear", T, g);
    group_ = g;
    bound_ = true;
    init(g.rank());
  }
  nn::parameter<weight_extents>& weight() noexcept { return weight_; }
  nn::parameter<bias_extents>& bias() noexcept { return bias_; }
  auto parameters() const { return boost::hana::make_tuple(weight_, bias_); }

  /// y = all-reduce(x_t W_t^T) + b, the sum in fp32, rounded once. x: (B, In/T).
  template <class Exec, class XP, class XE>
  Tensor<activation_precision, extents<dyn, Out>, layout_right, M>
  forward(const Exec& exec, const Tensor<XP, XE, layout_right, M>& x_in) {
    static_assert(accepts<XE>, "tessera::parallel::RowParallelLinear::forward: the input must be "
                               "(B, In / T), this rank's shard of the features");
    if constexpr (T > 1) detail::check_bound("RowParallelLinear", bound_);
    if (x_in.extent(1) != local_in)
      throw shape_error("tessera::parallel::RowParallelLinear::forward: x has shape " +
                        shape_string(x_in.extents()) + "; it must be (B, " +
                        std::to_string(local_in) + ")");
    const index_t B = x_in.extent(0);
    const auto x = reshape<extents<dyn, local_in>>(x_in, B);
    w_ = w_cast_(exec, weight_.value);
    x_ = x_cast_(exec, x);
    auto acc = acc_.get(extents<dyn, Out>(B));
    gemm(exec, x_.t, transpose(w_.t.view()), acc, gemm_options{.alpha = 1.f, .beta = 0.f});
    detail::fence_and_all_reduce(exec, group_, acc.data(), acc.size());
    auto y = y_.get(extents<dyn, Out>(B));
    const float* a = acc.data();
    const float* b = bias_.value.data();
    auto* out = y.data();
    Kokkos::parallel_for(
        "tessera::parallel::RowParallelLinear::forward[bias]",
        Kokkos::RangePolicy<Exec>(exec, 0, B), KOKKOS_LAMBDA(const index_t i) {
          for (index_t j = 0; j < Out; ++j)
            out[i * Out + j] = from_float<activation_precision>(a[i * Out + j] + b[j]);
        });
    exec.fence();
    batch_ = B;
    return y;
  }

  /// As nn::Linear::backward on the shard (no communication): dW_t = dy^T x_t, db = column
  /// sums of dy (the same on every rank), dx_t = dy W_t.
  template <class Exec, class DP, class DE>
  Tensor<activation_precision, extents<dyn, local_in>, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy_in, bool need_dx = true) {
    if (batch_ < 0)
      throw value_error("tessera::parallel::RowParallelLinear::backward: called before forward");
    nn::detail::require_extents("tessera::parallel::RowParallelLinear::backward", "dy", dy_in,
                                std::array<index_t, 2>{batch_, Out});
    const index_t B = batch_;
    const auto dy = reshape<extents<dyn, Out>>(dy_in, B);
    const auto dq = dy_cast_(exec, dy);
    gemm(exec, transpose(dq.t.view()), x_.t, weight_.grad, gemm_options{.alpha = 1.f, .beta = 0.f});
    const auto* d = dy.data();
    float* db = bias_.grad.data();
    Kokkos::parallel_for(
        "tessera::parallel::RowParallelLinear::backward[bias]",
        Kokkos::RangePolicy<Exec>(exec, 0, Out), KOKKOS_LAMBDA(const index_t j) {
          float s = 0.f;
          for (index_t i = 0; i < B; ++i) s += to_float(d[i * Out + j]);
          db[j] = s;
        });
    exec.fence();
    if (!need_dx) return {};
    auto dx = dx_.get(extents<dyn, local_in>(B));
    gemm(exec, dq.t, w_.t, dx, gemm_options{.alpha = 1.f, .beta = 0.f});
    return dx;
  }

private:
  void init(int t) { detail::init_from_whole(*this, nn::Linear<In, Out, fp32>(seed_), T, t); }

  using wop = typename nn::detail::operand_precision<P, false>::type;
  nn::parameter<weight_extents> weight_;
  nn::parameter<bias_extents> bias_;
  std::uint64_t seed_;
  tensor_group group_;
  bool bound_ = false;
  nn::detail::buffer<activation_precision> y_, dx_;
  nn::detail::buffer<fp32> acc_;
  nn::detail::operand_caster<P, false> w_cast_, x_cast_;
  nn::detail::operand_caster<P, true> dy_cast_;
  nn::detail::operand<wop, weight_extents> w_;
  nn::detail::operand<wop, extents<dyn, local_in>> x_;
  index_t batch_ = -1;
};

/// Conv2d<InC, OutC, K, Opt, P> split by output channels: this rank's OutC/T filters and biases.
template <index_t InC, index_t OutC, index_t K, nn::conv_options Opt, int T, class P = fp32>
class ColumnParallelConv2d {
  static_assert(
      T >= 1 && OutC % T == 0,
      "tessera::parallel::ColumnParallelConv2d<InC, OutC, K, Opt, T>: T must divide OutC");
  static_assert(Opt.groups == 1,
                "tessera::parallel::ColumnParallelConv2d: grouped convolutions are not split");
  static_assert(detail::tensor_parallel_precision<P>,
                "tessera::parallel::ColumnParallelConv2d: tensor-parallel layers compute in fp32 "
                "or bf16");
  using M = detail::tp_memory_space;
  using inner_type = nn::Conv2d<InC, OutC / T, K, Opt, P>;

public:
  static constexpr index_t local_out = OutC / T;
  static constexpr int tensor_size = T;
  using whole_type = nn::Conv2d<InC, OutC, K, Opt, P>;
  using compute_precision = P;
  using activation_precision = nn::activation_t<P>;
  template <class InExt>
  static constexpr bool accepts = inner_type::template accepts<InExt>;
  template <class InExt>
  using output_extents = typename inner_type::template output_extents<InExt>;
  /// weight (OutC, InC, K, K) as (1, T, OutC/T * InC K K); bias as (1, T, OutC/T).
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, 1, local_out* InC* K* K},
                                                       shard_spec{true, 1, local_out}};

  explicit ColumnParallelConv2d(std::uint64_t seed = 0)
      : inner_(seed), seed_(seed), w_cast_("tp.conv.w"), dy_cast_("tp.conv.dy"),
        acc_("tp.conv.dx.acc"), dx_("tp.conv.dx") {
    init(0);
  }

  void bind(const tensor_group& g) {
    detail::check_group("ColumnParallelConv2d", T, g);
    group_ = g;
    bound_ = true;
    init(g.rank());
  }
  auto parameters() const { return inner_.parameters(); }

  template <class Exec, class X>
  auto forward(const Exec& exec, const X& x) {
    if constexpr (T > 1) detail::check_bound("ColumnParallelConv2d", bound_);
    in_ = {x.extent(0), InC, x.extent(2), x.extent(3)};
    return inner_.forward(exec, x);
  }

  /// Weight and bias gradients of the shard; dx = the all-reduce of the partial input
  /// gradients (the transposed convolution of dy_t with W_t), fp32, rounded once.
  template <class Exec, class DP, class DE>
  Tensor<activation_precision, extents<dyn, InC, dyn, dyn>, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    inner_.backward(exec, dy, false);
    if (!need_dx) return {};
    const auto w = w_cast_(exec, inner_.weight().value);
    const auto dyd = Tensor<DP, dextents<4>, layout_right, M>(
        dy.kokkos_view(), dextents<4>::from_all(dy.extents().to_array()));
    const auto dq = dy_cast_(exec, dyd);
    using E = extents<dyn, InC, dyn, dyn>;
    auto acc = acc_.get(E(in_[0], in_[2], in_[3]));
    conv2d_backward_data(exec, dq.conv_input(), w.conv_input(), acc, whole_type::params, ws_);
    detail::fence_and_all_reduce(exec, group_, acc.data(), acc.size());
    if constexpr (std::is_same_v<activation_precision, fp32>) {
      return acc;
    } else {
      auto dx = dx_.get(E(in_[0], in_[2], in_[3]));
      convert_into(exec, dx, acc);
      return dx;
    }
  }

private:
  void init(int t) {
    detail::init_from_whole(*this, nn::Conv2d<InC, OutC, K, Opt, fp32>(seed_), T, t);
  }

  inner_type inner_;
  std::uint64_t seed_;
  tensor_group group_;
  bool bound_ = false;
  nn::detail::operand_caster<P, false> w_cast_;
  nn::detail::operand_caster<P, true> dy_cast_;
  nn::detail::buffer<fp32> acc_;
  nn::detail::buffer<activation_precision> dx_;
  conv2d_workspace<M> ws_;
  std::array<index_t, 4> in_{};
};

/// Conv2d<InC, OutC, K, Opt, P> split by input channels: every filter's InC/T channels of this
/// rank; the whole bias, added after the all-reduce of the partial convolutions.
template <index_t InC, index_t OutC, index_t K, nn::conv_options Opt, int T, class P = fp32>
class RowParallelConv2d {
  static_assert(T >= 1 && InC % T == 0,
                "tessera::parallel::RowParallelConv2d<InC, OutC, K, Opt, T>: T must divide InC");
  static_assert(Opt.groups == 1,
                "tessera::parallel::RowParallelConv2d: grouped convolutions are not split");
  static_assert(detail::tensor_parallel_precision<P>,
                "tessera::parallel::RowParallelConv2d: tensor-parallel layers compute in fp32 "
                "or bf16");
  using M = detail::tp_memory_space;
  using shape_type = nn::Conv2d<InC / T, OutC, K, Opt, P>; // static shapes only

public:
  static constexpr index_t local_in = InC / T;
  static constexpr int tensor_size = T;
  using whole_type = nn::Conv2d<InC, OutC, K, Opt, P>;
  using compute_precision = P;
  using activation_precision = nn::activation_t<P>;
  using weight_extents = extents<OutC, local_in, K, K>;
  using bias_extents = extents<OutC>;
  template <class InExt>
  static constexpr bool accepts = shape_type::template accepts<InExt>;
  template <class InExt>
  using output_extents = typename shape_type::template output_extents<InExt>;
  /// weight (OutC, InC, K, K) as (OutC, T, InC/T * K K); the bias replicated.
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, OutC, local_in* K* K, 1},
                                                       shard_spec{false, 1, 0}};

  explicit RowParallelConv2d(std::uint64_t seed = 0)
      : weight_("weight", weight_extents{}), bias_("bias", bias_extents{}), seed_(seed),
        y_("tp.conv.y"), dx_("tp.conv.dx"), acc_("tp.conv.acc"), w_cast_("tp.conv.w"),
        x_cast_("tp.conv.x"), dy_cast_("tp.conv.dy") {
    init(0);
  }

  void bind(const tensor_group& g) {
    detail::check_group("RowParallelConv2d", T, g);
    group_ = g;
    bound_ = true;
    init(g.rank());
  }
  nn::parameter<weight_extents>& weight() noexcept { return weight_; }
  nn::parameter<bias_extents>& bias() noexcept { return bias_; }
  auto parameters() const { return boost::hana::make_tuple(weight_, bias_); }

  /// y = all-reduce(conv2d(x_t, W_t)) + b, fp32 sums rounded once. x: (B, InC/T, H, W).
  template <class Exec, class XP, class E>
  Tensor<activation_precision, output_extents<E>, layout_right, M>
  forward(const Exec& exec, const Tensor<XP, E, layout_right, M>& x) {
    static_assert(accepts<E>, "tessera::parallel::RowParallelConv2d::forward: x must be "
                              "(B, InC / T, H, W), this rank's shard of the channels");
    if constexpr (T > 1) detail::check_bound("RowParallelConv2d", bound_);
    const char* op = "tessera::parallel::RowParallelConv2d::forward";
    if (x.extent(1) != local_in)
      throw shape_error(std::string(op) + ": x has shape " + shape_string(x.extents()) +
                        "; it must have " + std::to_string(local_in) + " channels");
    const auto pq = whole_type::params.output_hw_for(op, x.extent(2), x.extent(3), K, K);
    const auto xd = Tensor<XP, dextents<4>, layout_right, M>(
        x.kokkos_view(), dextents<4>::from_all(x.extents().to_array()));
    w_ = w_cast_(exec, weight_.value);
    x_ = x_cast_(exec, xd);
    out_ = {x.extent(0), OutC, pq[0], pq[1]};
    auto acc = acc_.get(dextents<4>::from_all(out_));
    conv2d_forward(exec, x_.conv_input(), w_.conv_input(), acc, whole_type::params, ws_);
    detail::fence_and_all_reduce(exec, group_, acc.data(), acc.size());
    auto y = y_.get(output_extents<E>::from_all(out_));
    const float* a = acc.data();
    const float* b = bias_.value.data();
    auto* o = y.data();
    const index_t PQ = pq[0] * pq[1];
    Kokkos::parallel_for(
        "tessera::parallel::RowParallelConv2d::forward[bias]",
        Kokkos::RangePolicy<Exec>(exec, 0, out_[0] * OutC), KOKKOS_LAMBDA(const index_t r) {
          const float bias = b[r % OutC];
          for (index_t i = 0; i < PQ; ++i)
            o[r * PQ + i] = from_float<activation_precision>(a[r * PQ + i] + bias);
        });
    exec.fence();
    in_ = {x.extent(0), local_in, x.extent(2), x.extent(3)};
    return y;
  }

  /// As nn::Conv2d::backward on the shard (no communication).
  template <class Exec, class DP, class DE>
  Tensor<activation_precision, extents<dyn, local_in, dyn, dyn>, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy_in, bool need_dx = true) {
    static_assert(DE::rank == 4,
                  "tessera::parallel::RowParallelConv2d::backward: dy must be (B, OutC, P, Q)");
    if (out_[0] < 0)
      throw value_error("tessera::parallel::RowParallelConv2d::backward: called before forward");
    nn::detail::require_extents("tessera::parallel::RowParallelConv2d::backward", "dy", dy_in,
                                out_);
    const auto dy =
        Tensor<DP, dextents<4>, layout_right, M>(dy_in.kokkos_view(), dextents<4>::from_all(out_));
    const auto dq = dy_cast_(exec, dy);
    conv2d_backward_weight(exec, x_.conv_input(), dq.conv_input(), weight_.grad, whole_type::params,
                           ws_);
    // The bias gradient as nn::Conv2d computes it (each row of Q summed first).
    const auto* d = dy.data();
    float* db = bias_.grad.data();
    const index_t B = out_[0], PQ = out_[2] * out_[3], Q = out_[3], Pn = out_[2];
    Kokkos::parallel_for(
        "tessera::parallel::RowParallelConv2d::backward[bias]",
        Kokkos::RangePolicy<Exec>(exec, 0, OutC), KOKKOS_LAMBDA(const index_t k) {
          float acc = 0.f;
          for (index_t b = 0; b < B; ++b)
            for (index_t p = 0; p < Pn; ++p) {
              float row = 0.f;
              const auto* r = d + (b * OutC + k) * PQ + p * Q;
              for (index_t q = 0; q < Q; ++q) row += to_float(r[q]);
              acc += row;
            }
          db[k] = acc;
        });
    exec.fence();
    if (!need_dx) return {};
    auto dx = dx_.get(extents<dyn, local_in, dyn, dyn>(in_[0], in_[2], in_[3]));
    conv2d_backward_data(exec, dq.conv_input(), w_.conv_input(), dx, whole_type::params, ws_);
    return dx;
  }

private:
  void init(int t) {
    detail::init_from_whole(*this, nn::Conv2d<InC, OutC, K, Opt, fp32>(seed_), T, t);
  }

  using op_p = typename nn::detail::operand_precision<P, false>::type;
  nn::parameter<weight_extents> weight_;
  nn::parameter<bias_extents> bias_;
  std::uint64_t seed_;
  tensor_group group_;
  bool bound_ = false;
  nn::detail::buffer<activation_precision> y_, dx_;
  nn::detail::buffer<fp32> acc_;
  nn::detail::operand_caster<P, false> w_cast_, x_cast_;
  nn::detail::operand_caster<P, true> dy_cast_;
  conv2d_workspace<M> ws_;
  nn::detail::operand<op_p, weight_extents> w_;
  nn::detail::operand<op_p, dextents<4>> x_;
  std::array<index_t, 4> out_{-1, -1, -1, -1}, in_{};
};

/// What the tensor split makes of a layer.
enum class split_role : std::uint8_t { replicate, column, row };

namespace detail {

enum class tp_kind : std::uint8_t { other, splittable, per_feature };

template <class L>
struct tp_kind_of {
  static constexpr tp_kind value = tp_kind::other;
};
template <index_t In, index_t Out, class P>
struct tp_kind_of<nn::Linear<In, Out, P>> {
  static constexpr tp_kind value = tp_kind::splittable;
};
template <index_t InC, index_t OutC, index_t K, nn::conv_options O, class P>
struct tp_kind_of<nn::Conv2d<InC, OutC, K, O, P>> {
  static constexpr tp_kind value = O.groups == 1 ? tp_kind::splittable : tp_kind::other;
};
template <>
struct tp_kind_of<nn::ReLU> {
  static constexpr tp_kind value = tp_kind::per_feature;
};
template <>
struct tp_kind_of<nn::GELU> {
  static constexpr tp_kind value = tp_kind::per_feature;
};
template <index_t K>
struct tp_kind_of<nn::MaxPool2d<K>> {
  static constexpr tp_kind value = tp_kind::per_feature;
};
template <>
struct tp_kind_of<nn::Flatten> {
  static constexpr tp_kind value = tp_kind::per_feature;
};

/// Pairs each splittable layer with the next one when only per-feature layers lie between.
template <std::size_t N>
constexpr std::array<split_role, N> pair_roles(const std::array<tp_kind, N>& kind) {
  std::array<split_role, N> role{};
  for (std::size_t i = 0; i < N; ++i) role[i] = split_role::replicate;
  std::size_t i = 0;
  while (i < N) {
    if (kind[i] == tp_kind::splittable) {
      std::size_t j = i + 1;
      while (j < N && kind[j] == tp_kind::per_feature) ++j;
      if (j < N && kind[j] == tp_kind::splittable) {
        role[i] = split_role::column;
        role[j] = split_role::row;
        i = j + 1;
        continue;
      }
    }
    ++i;
  }
  return role;
}

/// Checked for every split layer: T must divide the width the layer splits (a column-parallel
/// layer's output features or channels, a row-parallel layer's input features or channels).
template <std::size_t I, class Layer, int T, bool Divides>
struct tensor_split_check {
  static_assert(Divides,
                "tessera::parallel::tensor<T>: T does not divide the width that layer I splits "
                "(a column-parallel layer's output features or channels, a row-parallel layer's "
                "input features or channels); tensor_split_check<I, Layer, T, false> in the "
                "instantiation above names the layer");
  static constexpr bool ok = Divides;
};

/// Checked for every split layer: tensor-parallel layers compute in fp32 or bf16.
template <std::size_t I, class Layer, bool Ok>
struct tensor_split_precision_check {
  static_assert(Ok, "tessera::parallel::tensor<T>: layer I computes in fp8, which the tensor "
                    "split does not support (fp8 scales would have to agree across the group); "
                    "tensor_split_precision_check<I, Layer, false> above names the layer");
  static constexpr bool ok = Ok;
};

template <std::size_t I, class L, split_role R, int T>
struct split_layer {
  using type = L;
  static constexpr bool ok = true;
};
template <std::size_t I, index_t In, index_t Out, class P, split_role R, int T>
requires(R != split_role::replicate) struct split_layer<I, nn::Linear<In, Out, P>, R, T> {
  static constexpr index_t width = R == split_role::column ? Out : In;
  static constexpr bool ok =
      tensor_split_check<I, nn::Linear<In, Out, P>, T, width % T == 0>::ok &&
      tensor_split_precision_check<I, nn::Linear<In, Out, P>, tensor_parallel_precision<P>>::ok;
  using type = std::conditional_t<R == split_role::column, ColumnParallelLinear<In, Out, T, P>,
                                  RowParallelLinear<In, Out, T, P>>;
};
template <std::size_t I, index_t InC, index_t OutC, index_t K, nn::conv_options O, class P,
          split_role R, int T>
requires(R != split_role::replicate) struct split_layer<I, nn::Conv2d<InC, OutC, K, O, P>, R, T> {
  static constexpr index_t width = R == split_role::column ? OutC : InC;
  static constexpr bool ok =
      tensor_split_check<I, nn::Conv2d<InC, OutC, K, O, P>, T, width % T == 0>::ok &&
      tensor_split_precision_check<I, nn::Conv2d<InC, OutC, K, O, P>,
                                   tensor_parallel_precision<P>>::ok;
  using type =
      std::conditional_t<R == split_role::column, ColumnParallelConv2d<InC, OutC, K, O, T, P>,
                         RowParallelConv2d<InC, OutC, K, O, T, P>>;
};

template <class Model>
struct layers_of;
template <class... L>
struct layers_of<nn::Sequential<L...>> {
  static constexpr std::size_t size = sizeof...(L);
  static constexpr std::array<tp_kind, sizeof...(L)> kinds{tp_kind_of<L>::value...};
};

template <class Model, int T, class Seq>
struct tensor_split_impl;
template <class... L, int T, std::size_t... I>
struct tensor_split_impl<nn::Sequential<L...>, T, std::index_sequence<I...>> {
  static constexpr auto roles = pair_roles<sizeof...(L)>({tp_kind_of<L>::value...});
  static constexpr bool ok = (split_layer<I, L, roles[I], T>::ok && ...);
  // After a failed check, the model unchanged: one error, not a cascade of shape errors.
  using type =
      std::conditional_t<ok, nn::Sequential<typename split_layer<I, L, roles[I], T>::type...>,
                         nn::Sequential<L...>>;
};

} // namespace detail

/// The role of each layer of Model (an nn::Sequential) under the tensor split.
template <class Model>
inline constexpr auto tensor_split_roles =
    detail::pair_roles<detail::layers_of<Model>::size>(detail::layers_of<Model>::kinds);

/// Model with its Linear / Conv2d pairs split T ways (see the file comment); Model itself for
/// T == 1. Layer indices, and so parameter names and seeds, are those of Model.
template <class Model, int T>
struct tensor_split {
  static_assert(T >= 1, "tessera::parallel::tensor_split: T must be at least 1");
  using type = typename detail::tensor_split_impl<
      Model, T, std::make_index_sequence<detail::layers_of<Model>::size>>::type;
};
template <class Model>
struct tensor_split<Model, 1> {
  using type = Model;
};
template <class Model, int T>
using tensor_split_t = typename tensor_split<Model, T>::type;

namespace detail {
template <class L>
concept tensor_parallel_layer = requires(L& l, const tensor_group& g) {
  l.bind(g);
  L::shards;
};

/// Index of a model's first layer in the whole model: Stage::begin for a pipeline stage, 0 for
/// a Sequential.
template <class Model>
constexpr std::size_t first_layer_index() {
  if constexpr (requires { Model::begin; })
    return Model::begin;
  else
    return 0;
}

template <class Model, class F, std::size_t... K>
void for_each_layer_impl(Model& model, F&& f, std::index_sequence<K...>) {
  (f(std::integral_constant<std::size_t, first_layer_index<Model>() + K>{},
     model.template layer<K>()),
   ...);
}
} // namespace detail

/// f(std::integral_constant<size_t, I>, layer) for every layer of a Sequential or pipeline
/// stage, I its index in the whole model.
template <class Model, class F>
void for_each_layer(Model& model, F&& f) {
  detail::for_each_layer_impl(model, f, std::make_index_sequence<Model::size()>{});
}

/// Gives every tensor-parallel layer of `model` (a Sequential or pipeline stage) its group and
/// slices its parameters for the group's rank. Throws value_error if a layer is split another
/// number of ways than the group's size.
template <class Model>
void bind_tensor_group(Model& model, const tensor_group& group) {
  for_each_layer(model, [&](auto, auto& layer) {
    if constexpr (detail::tensor_parallel_layer<std::remove_cvref_t<decltype(layer)>>)
      layer.bind(group);
  });
}

namespace detail {
template <bool Gradients, class Model>
std::map<std::string, std::vector<float>> gather_whole(Model& model, const tensor_group& group) {
  std::map<std::string, std::vector<float>> out;
  for_each_layer(model, [&](auto index, auto& layer) {
    using L = std::remove_cvref_t<decltype(layer)>;
    std::size_t k = 0;
    boost::hana::for_each(layer.parameters(), [&](const auto& p) {
      std::vector<float> local = host_values(Gradients ? p.grad : p.value);
      auto& full = out[std::to_string(decltype(index)::value) + "." + p.name];
      shard_spec s{};
      if constexpr (tensor_parallel_layer<L>) s = L::shards[k];
      ++k;
      if (!s.split) {
        full = std::move(local);
        return;
      }
      std::vector<float> gathered(local.size() * std::size_t(group.size()));
      group.all_gather(local.data(), gathered.data(), std::int64_t(local.size()));
      full.resize(gathered.size());
      assemble_shards(gathered.data(), full.data(), s, group.size());
    });
  });
  return out;
}
} // namespace detail

/// The whole (unsplit) values of every parameter of `model` (a Sequential or pipeline stage),
/// by name ("I.weight"), gathered over `group` (a collective: every rank of the group calls it
/// and gets the same map). Replicated parameters are this rank's copy.
template <class Model>
std::map<std::string, std::vector<float>> gather_parameters(Model& model,
                                                            const tensor_group& group) {
  return detail::gather_whole<false>(model, group);
}

/// The same for the parameters' gradients.
template <class Model>
std::map<std::string, std::vector<float>> gather_gradients(Model& model,
                                                           const tensor_group& group) {
  return detail::gather_whole<true>(model, group);
}

/// Sets every parameter of `model` from whole values by name (as gather_parameters returns
/// them, or a single-process model's): each rank takes its shard. Throws value_error for a
/// missing name or a wrong size, before changing anything.
template <class Model>
void scatter_parameters(Model& model, const tensor_group& group,
                        const std::map<std::string, std::vector<float>>& whole) {
  for (int pass = 0; pass < 2; ++pass) // check all, then write
    for_each_layer(model, [&](auto index, auto& layer) {
      using L = std::remove_cvref_t<decltype(layer)>;
      std::size_t k = 0;
      boost::hana::for_each(layer.parameters(), [&](const auto& p) {
        const std::string name = std::to_string(decltype(index)::value) + "." + p.name;
        const auto it = whole.find(name);
        shard_spec s{};
        if constexpr (detail::tensor_parallel_layer<L>) s = L::shards[k];
        ++k;
        const std::size_t want = std::size_t(p.size()) * (s.split ? std::size_t(group.size()) : 1);
        if (pass == 0) {
          if (it == whole.end())
            throw value_error("tessera::parallel::scatter_parameters: no values for '" + name +
                              "'");
          if (it->second.size() != want)
            throw value_error("tessera::parallel::scatter_parameters: '" + name + "' has " +
                              std::to_string(it->second.size()) + " values, the model needs " +
                              std::to_string(want));
          return;
        }
        std::vector<float> shard(static_cast<std::size_t>(p.size()));
        if (s.split)
          detail::take_shard(it->second.data(), shard.data(), s, group.size(), group.rank());
        else
          shard = it->second;
        detail::set_values(p.value, shard.data());
      });
    });
}

} // namespace tessera::parallel
