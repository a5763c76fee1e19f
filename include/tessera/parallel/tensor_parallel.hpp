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
/// An nn::Recompute whose segment is a Sequential of one splittable layer among per-feature
/// layers (e.g. Conv2d, ReLU, MaxPool2d) pairs as its splittable layer and is split inside
/// (TensorParallelRecompute); any other Recompute is replicated or passed through as it
/// declares (nn/recompute.hpp).
///
/// Which layers pair, pass through or are replicated is what each layer declares
/// (`tensor_split`, read through nn::layer_traits, nn/layer.hpp): nn::split_kind::splittable
/// (Linear, Conv2d with groups 1), per_feature (ReLU, GELU, MaxPool2d, Flatten, Input), and
/// replicate, the default of a layer that declares nothing (e.g. nn::LayerNorm, whose
/// statistics need every feature: it breaks a pair, and each tensor rank computes it whole on
/// the whole activations, its parameters identical across the group).
///
/// Widths T does not divide fail at compile time: the static_assert in
/// detail::tensor_split_check<I, Layer, T, false> names the layer index I and its type.
/// Tensor-parallel layers compute in any unscaled precision or in fp8 (nn::fp8<R>: each shard's
/// scaling states are made the whole tensor's by parallel/fp8_sync.hpp, which plans call after
/// every step); their activations must be in host-accessible memory (buffers go to MPI).
///
/// Parameters keep the names of the single-process model ("4.weight"); each shard is the slice
/// of the single-process initialisation (the whole layer is initialised with the same seed and
/// sliced), so the split model computes what the whole model computes, up to the order of the
/// fp32 sums.

#include <tessera/nn.hpp>
#include <tessera/parallel/communicator.hpp>
#include <tessera/tensor/host_mirror.hpp>

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

  // Not for C = tensor_group: checking Communicator<tensor_group> asks whether tensor_group is
  // move-constructible, which would consider this constructor again (clang stops there).
  template <class C>
  requires(!std::is_same_v<C, tensor_group> && Communicator<C>) explicit tensor_group(C comm) {
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

/// What the tensor split makes of a layer.
enum class split_role : std::uint8_t { replicate, column, row };

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
  const auto h = host_mirror_copy(t);
  return std::vector<float>(h.data(), h.data() + t.size());
}

/// Writes host values into a parameter tensor.
template <class Tensor>
void set_values(const Tensor& t, const float* values) {
  const auto h = host_mirror(t);
  std::copy(values, values + t.size(), h.data());
  copy_from_host(t, h);
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

/// Tensor-parallel layers compute in any unscaled precision (fp32, bf16, fp16) or in fp8
/// (nn::fp8<R>): a shard's fp8 scaling states record the amax of its shard, and
/// parallel/fp8_sync.hpp makes them the whole tensor's (the maximum over the tensor group)
/// before they set a scale, so every rank of the group quantizes with the single process's
/// scale. (A concept, so that the traits are read only for precisions: nn::fp8<R> has none.)
template <class P>
concept TensorParallelPrecision = nn::is_fp8_compute<P>::value ||
    (Precision<P> && !precision_traits<P>::scaled);

/// The reduction a shard layer hands to nn::Linear / nn::Conv2d (nn::detail::no_reduction's
/// counterpart): the fp32 partial sums, summed over the tensor group in place.
struct group_sum {
  const tensor_group* group;
  template <class Exec>
  void operator()(const Exec& exec, float* sums, index_t n) const {
    // The sums live in the shard layers' memory (nn's default memory space); spelt through
    // Exec so that only a use, not the inclusion of this header, refuses device memory.
    using M = std::conditional_t<std::is_void_v<Exec>, void, nn::detail::default_memory_space>;
    static_assert(is_host_accessible_v<M>,
                  "tessera::parallel: a tensor-parallel layer sums its partial results over the "
                  "tensor group through the communicator, which reads host memory (device-aware "
                  "MPI is not assumed): tensor plans need a host-accessible default memory space "
                  "(a host build of Kokkos).");
    exec.fence();
    group->all_reduce_sum(sums, n);
  }
};

using tp_memory_space = nn::detail::default_memory_space;

/// What the four shard layers share: the nn layer computing this rank's shard (Inner), the
/// group, slicing the whole layer's initialisation (Whole, fp32, the same seed), and the pass
/// that sums over the group: a column shard (split outputs) sums its partial input gradients
/// in backward, a row shard (split inputs) its partial outputs in forward, each in fp32 before
/// the bias and the one rounding.
template <class Inner, class Whole, int T, split_role Role>
class shard_layer {
  static_assert(Role != split_role::replicate);

public:
  static constexpr int tensor_size = T;
  using compute_precision = typename Inner::compute_precision;
  using activation_precision = typename Inner::activation_precision;
  template <class InExt>
  static constexpr bool accepts = Inner::template accepts<InExt>;
  template <class InExt>
  using output_extents = typename Inner::template output_extents<InExt>;

  auto& weight() noexcept { return inner_.weight(); }
  auto& bias() noexcept { return inner_.bias(); }
  auto parameters() const { return inner_.parameters(); }
  /// The shard's fp8 scaling states (nn::Linear / nn::Conv2d::fp8_states: weight, input, output
  /// gradient), each recording the amax of this rank's part of the tensor.
  auto fp8_states() { return inner_.fp8_states(); }

  template <class Exec, class X>
  auto forward(const Exec& exec, const X& x) {
    if constexpr (Role == split_role::row) {
      return inner_.forward(exec, x, sum());
    } else {
      (void)sum(); // the bound check
      return inner_.forward(exec, x);
    }
  }
  template <class Exec, class DY>
  auto backward(const Exec& exec, const DY& dy, bool need_dx = true) {
    if constexpr (Role == split_role::column) {
      return inner_.backward(exec, dy, need_dx, sum());
    } else {
      return inner_.backward(exec, dy, need_dx);
    }
  }

protected:
  shard_layer(const char* name, std::uint64_t seed) : inner_(seed), name_(name), seed_(seed) {}

  template <class Self>
  void init(Self& self, int t) {
    init_from_whole(self, Whole(seed_), T, t);
  }
  template <class Self>
  void bind_to(Self& self, const tensor_group& g) {
    check_group(name_, T, g);
    group_ = g;
    bound_ = true;
    init(self, g.rank());
  }
  /// The group's sum, after checking that the layer has a group (not needed when T == 1).
  group_sum sum() const {
    if constexpr (T > 1) check_bound(name_, bound_);
    return group_sum{&group_};
  }

  Inner inner_;

private:
  const char* name_;
  std::uint64_t seed_;
  tensor_group group_;
  bool bound_ = false;
};

} // namespace detail

/// Linear<In, Out, P> split by output features: this rank's Out/T rows of W and of b. Backward
/// sums the partial input gradients dy_t W_t over the group (fp32, rounded once).
template <index_t In, index_t Out, int T, class P = fp32>
class ColumnParallelLinear
    : public detail::shard_layer<nn::Linear<In, Out / T, P>, nn::Linear<In, Out, fp32>, T,
                                 split_role::column> {
  static_assert(T >= 1 && Out % T == 0,
                "tessera::parallel::ColumnParallelLinear<In, Out, T>: T must divide Out");
  static_assert(detail::TensorParallelPrecision<P>,
                "tessera::parallel::ColumnParallelLinear: tensor-parallel layers compute in "
                "an unscaled precision or in nn::fp8<Recipe> (not a bare scaled one)");
  using base = detail::shard_layer<nn::Linear<In, Out / T, P>, nn::Linear<In, Out, fp32>, T,
                                   split_role::column>;

public:
  static constexpr index_t local_out = Out / T;
  using whole_type = nn::Linear<In, Out, P>;
  using input_extents = extents<dyn, In>;
  /// weight (Out, In) as (1, T, Out/T * In); bias (Out) as (1, T, Out/T).
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, 1, local_out* In},
                                                       shard_spec{true, 1, local_out}};

  /// Initialised as shard 0 of the whole layer; bind() re-slices for the group's rank.
  explicit ColumnParallelLinear(std::uint64_t seed = 0) : base("ColumnParallelLinear", seed) {
    this->init(*this, 0);
  }
  void bind(const tensor_group& g) { this->bind_to(*this, g); }
};

/// Linear<In, Out, P> split by input features: W's columns of this rank's In/T inputs; the whole
/// bias, added after the sum of the partial products over the group (fp32, rounded once).
/// x: (B, In/T), this rank's shard of the features.
template <index_t In, index_t Out, int T, class P = fp32>
class RowParallelLinear
    : public detail::shard_layer<nn::Linear<In / T, Out, P>, nn::Linear<In, Out, fp32>, T,
                                 split_role::row> {
  static_assert(T >= 1 && In % T == 0,
                "tessera::parallel::RowParallelLinear<In, Out, T>: T must divide In");
  static_assert(detail::TensorParallelPrecision<P>,
                "tessera::parallel::RowParallelLinear: tensor-parallel layers compute in "
                "an unscaled precision or in nn::fp8<Recipe> (not a bare scaled one)");
  using base = detail::shard_layer<nn::Linear<In / T, Out, P>, nn::Linear<In, Out, fp32>, T,
                                   split_role::row>;

public:
  static constexpr index_t local_in = In / T;
  using whole_type = nn::Linear<In, Out, P>;
  /// weight (Out, In) as (Out, T, In/T); the bias replicated.
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, Out, local_in, 1},
                                                       shard_spec{false, 1, 0}};

  explicit RowParallelLinear(std::uint64_t seed = 0) : base("RowParallelLinear", seed) {
    this->init(*this, 0);
  }
  void bind(const tensor_group& g) { this->bind_to(*this, g); }
};

/// Conv2d<InC, OutC, K, Opt, P> split by output channels: this rank's OutC/T filters and biases.
/// Backward sums the partial input gradients over the group (fp32, rounded once).
template <index_t InC, index_t OutC, index_t K, nn::conv_options Opt, int T, class P = fp32>
class ColumnParallelConv2d
    : public detail::shard_layer<nn::Conv2d<InC, OutC / T, K, Opt, P>,
                                 nn::Conv2d<InC, OutC, K, Opt, fp32>, T, split_role::column> {
  static_assert(
      T >= 1 && OutC % T == 0,
      "tessera::parallel::ColumnParallelConv2d<InC, OutC, K, Opt, T>: T must divide OutC");
  static_assert(Opt.groups == 1,
                "tessera::parallel::ColumnParallelConv2d: grouped convolutions are not split");
  static_assert(detail::TensorParallelPrecision<P>,
                "tessera::parallel::ColumnParallelConv2d: tensor-parallel layers compute in "
                "an unscaled precision or in nn::fp8<Recipe> (not a bare scaled one)");
  using base = detail::shard_layer<nn::Conv2d<InC, OutC / T, K, Opt, P>,
                                   nn::Conv2d<InC, OutC, K, Opt, fp32>, T, split_role::column>;

public:
  static constexpr index_t local_out = OutC / T;
  using whole_type = nn::Conv2d<InC, OutC, K, Opt, P>;
  /// weight (OutC, InC, K, K) as (1, T, OutC/T * InC K K); bias as (1, T, OutC/T).
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, 1, local_out* InC* K* K},
                                                       shard_spec{true, 1, local_out}};

  explicit ColumnParallelConv2d(std::uint64_t seed = 0) : base("ColumnParallelConv2d", seed) {
    this->init(*this, 0);
  }
  void bind(const tensor_group& g) { this->bind_to(*this, g); }
};

/// Conv2d<InC, OutC, K, Opt, P> split by input channels: every filter's InC/T channels of this
/// rank; the whole bias, added after the sum of the partial convolutions over the group.
/// x: (B, InC/T, H, W), this rank's shard of the channels.
template <index_t InC, index_t OutC, index_t K, nn::conv_options Opt, int T, class P = fp32>
class RowParallelConv2d
    : public detail::shard_layer<nn::Conv2d<InC / T, OutC, K, Opt, P>,
                                 nn::Conv2d<InC, OutC, K, Opt, fp32>, T, split_role::row> {
  static_assert(T >= 1 && InC % T == 0,
                "tessera::parallel::RowParallelConv2d<InC, OutC, K, Opt, T>: T must divide InC");
  static_assert(Opt.groups == 1,
                "tessera::parallel::RowParallelConv2d: grouped convolutions are not split");
  static_assert(detail::TensorParallelPrecision<P>,
                "tessera::parallel::RowParallelConv2d: tensor-parallel layers compute in "
                "an unscaled precision or in nn::fp8<Recipe> (not a bare scaled one)");
  using base = detail::shard_layer<nn::Conv2d<InC / T, OutC, K, Opt, P>,
                                   nn::Conv2d<InC, OutC, K, Opt, fp32>, T, split_role::row>;

public:
  static constexpr index_t local_in = InC / T;
  using whole_type = nn::Conv2d<InC, OutC, K, Opt, P>;
  /// weight (OutC, InC, K, K) as (OutC, T, InC/T * K K); the bias replicated.
  static constexpr std::array<shard_spec, 2> shards = {shard_spec{true, OutC, local_in* K* K, 1},
                                                       shard_spec{false, 1, 0}};

  explicit RowParallelConv2d(std::uint64_t seed = 0) : base("RowParallelConv2d", seed) {
    this->init(*this, 0);
  }
  void bind(const tensor_group& g) { this->bind_to(*this, g); }
};

/// nn::CausalSelfAttention<D, H, P> split by heads (Megatron-LM, section 3): this rank owns
/// heads [t H/T, (t + 1) H/T). Its QKV projection is column-parallel over those heads' q, k and
/// v columns (the rows of Wqkv (3D, D) seen as (3, T, D/T * D)), computed as an
/// nn::Linear<D, 3D/T>; its heads' attention needs no communication; its output projection is
/// row-parallel (the columns of Wo (D, D) of its heads, (D, T, D/T)), the fp32 partial sums
/// all-reduced before the whole bias. Backward all-reduces the QKV projection's partial input
/// gradients. Parameter names are the whole layer's ("qkv.weight", ..., "proj.bias").
///
/// The core on this rank's heads is the whole layer's (nn::detail::tiled_attention_core, on
/// H/T heads of width D/H): tiled with an online softmax, only the log-sum-exp per row kept
/// between forward and backward, backward recomputing the probability tiles; its memory is
/// linear in t (count_activations). With the same tile it computes each head with the same
/// sums as the whole layer.
template <index_t D, index_t H, int T, class P = fp32>
class HeadParallelAttention {
  static_assert(T >= 1 && H % T == 0,
                "tessera::parallel::HeadParallelAttention<D, H, T>: T must divide the heads H");
  static_assert(detail::TensorParallelPrecision<P>,
                "tessera::parallel::HeadParallelAttention: tensor-parallel layers compute in "
                "an unscaled precision or in nn::fp8<Recipe> (not a bare scaled one)");
  using M = detail::tp_memory_space;
  using whole_fp32 = nn::CausalSelfAttention<D, H, fp32>;

public:
  static constexpr int tensor_size = T;
  static constexpr index_t local_width = D / T, local_heads = H / T, head_dim = D / H;
  using whole_type = nn::CausalSelfAttention<D, H, P>;
  using compute_precision = P;
  using activation_precision = nn::activation_t<P>;
  template <class InExt>
  static constexpr bool accepts = whole_type::template accepts<InExt>;
  template <class InExt>
  using output_extents = typename whole_type::template output_extents<InExt>;
  /// qkv.weight (3D, D) as (3, T, D/T * D); qkv.bias (3D) as (3, T, D/T); proj.weight (D, D) as
  /// (D, T, D/T); proj.bias replicated.
  static constexpr std::array<shard_spec, 4> shards = {
      shard_spec{true, 3, local_width* D}, shard_spec{true, 3, local_width},
      shard_spec{true, D, local_width, 1}, shard_spec{false, 1, 0}};

  /// Initialised as shard 0 of whole_type(seed); bind() re-slices for the group's rank.
  explicit HeadParallelAttention(std::uint64_t seed = 0)
      : seed_(seed), qkv_(counter_rng{seed, 0}.bits(0)), proj_(counter_rng{seed, 1}.bits(0)) {
    detail::init_from_whole(*this, whole_fp32(seed_), T, 0);
  }
  void bind(const tensor_group& g) {
    detail::check_group("HeadParallelAttention", T, g);
    group_ = g;
    bound_ = true;
    detail::init_from_whole(*this, whole_fp32(seed_), T, g.rank());
  }

  nn::Linear<D, 3 * local_width, P>& qkv() noexcept { return qkv_; }
  nn::Linear<local_width, D, P>& proj() noexcept { return proj_; }
  /// The fp8 scaling states of the QKV and output projections' shards, in
  /// nn::CausalSelfAttention::fp8_states' order.
  auto fp8_states() {
    return boost::hana::flatten(boost::hana::make_tuple(qkv_.fp8_states(), proj_.fp8_states()));
  }
  /// (qkv.weight, qkv.bias, proj.weight, proj.bias): this rank's shards.
  auto parameters() const {
    const auto named = [](const char* prefix) {
      return [prefix](auto p) {
        p.name = std::string(prefix) + p.name;
        return p;
      };
    };
    return boost::hana::flatten(
        boost::hana::make_tuple(boost::hana::transform(qkv_.parameters(), named("qkv.")),
                                boost::hana::transform(proj_.parameters(), named("proj."))));
  }

  /// Query (and key) rows per work item of the tiled core (default 64, as the whole layer's;
  /// the same tile gives the same sums per head).
  index_t tile() const noexcept { return core_.tile(); }
  /// Sets the tile (1 to 256 rows); value_error otherwise.
  void set_tile(index_t rows) { core_.set_tile(rows, "tessera::parallel::HeadParallelAttention"); }
  /// The core's memory of the last forward and backward (nn::CausalSelfAttention::scratch_bytes).
  std::size_t scratch_bytes() const noexcept { return core_.scratch_bytes(); }

  /// nn/layer.hpp: what the last forward left for backward: both projections' (nn::Linear's),
  /// this rank's heads' output o (B, t, D/T), and the core's q, k, k^T, v, v^T (fp32, B t D/T
  /// each) and log-sum-exp per row (B H/T t): linear in t.
  void count_activations(nn::activation_ledger& l) const {
    qkv_.count_activations(l);
    proj_.count_activations(l);
    o_.count(l);
    core_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() noexcept {
    qkv_.release_activations();
    proj_.release_activations();
    o_.release();
    core_.release();
  }

  /// y (B, t, D) of x (B, t, D), whole on every rank of the group.
  template <class Exec, class XP, class XE>
  auto forward(const Exec& exec, const Tensor<XP, XE, layout_right, M>& x) {
    static_assert(accepts<XE>, "tessera::parallel::HeadParallelAttention::forward: x must be "
                               "(B, t, D).");
    if constexpr (T > 1) detail::check_bound("HeadParallelAttention", bound_);
    const index_t B = x.extent(0), t = x.extent(1);
    const auto qkv = qkv_.forward(exec, x);
    batch_ = B;
    len_ = t;
    auto o = o_.get(extents<dyn, XE::static_extent(1), local_width>::from_all({B, t, local_width}));
    core_.forward(exec, qkv.data(), B, t, o.data());
    return proj_.forward(exec, o, detail::group_sum{&group_});
  }

  /// dx (B, t, D) from dy (B, t, D) of the last forward (whole on every rank: the QKV
  /// projection's partial input gradients are summed over the group); writes this rank's
  /// parameter gradients.
  template <class Exec, class DP, class DE>
  auto backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    const auto dout = proj_.backward(exec, dy, true); // dL/do (B, t, D/T)
    const index_t B = batch_, t = len_;
    auto dqkv = dqkv_.get(
        extents<dyn, DE::static_extent(1), 3 * local_width>::from_all({B, t, 3 * local_width}));
    core_.backward(exec, dout.data(), o_.get(extents<dyn, local_width>(B * t)).data(), B, t,
                   dqkv.data());
    return qkv_.backward(exec, dqkv, need_dx, detail::group_sum{&group_});
  }

private:
  std::uint64_t seed_;
  nn::Linear<D, 3 * local_width, P> qkv_;
  nn::Linear<local_width, D, P> proj_;
  tensor_group group_;
  bool bound_ = false;
  index_t batch_ = 0, len_ = 0;
  nn::detail::buffer<activation_precision, M> o_{"tessera::parallel::HeadParallelAttention.o"};
  nn::detail::buffer<fp32, M> dqkv_{"tessera::parallel::HeadParallelAttention.dqkv"};
  nn::detail::tiled_attention_core<local_width, local_heads, activation_precision, M> core_;
};

namespace detail {

/// How the split treats a layer: what the layer declares about itself (nn::layer_traits,
/// nn/layer.hpp), split_kind::replicate when it declares nothing. No concrete layer is named
/// here: a new layer is paired, passed through or replicated by its own declaration.
using tp_kind = nn::split_kind;

template <class L>
struct tp_kind_of {
  static constexpr tp_kind value = nn::layer_traits<L>::tensor_split;
};
/// An nn::Recompute segment that is a Sequential of one splittable layer among per-feature
/// layers (Conv2d, ReLU, MaxPool2d) pairs as that layer does: split inside, see
/// TensorParallelRecompute.
template <class... Ls>
struct tp_kind_of<nn::Recompute<nn::Sequential<Ls...>>> {
  static constexpr int splittable = ((tp_kind_of<Ls>::value == tp_kind::splittable) + ...);
  static constexpr bool others_per_feature = ((tp_kind_of<Ls>::value != tp_kind::replicate) && ...);
  static constexpr tp_kind value =
      splittable == 1 && others_per_feature
          ? tp_kind::splittable
          : nn::layer_traits<nn::Recompute<nn::Sequential<Ls...>>>::tensor_split;
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

template <std::size_t LayerIndex, class LayerType, bool Ok>
inline constexpr bool layer_has_shard_types = Ok;

/// A layer the split leaves whole. A layer that declares split_kind::splittable lands here when
/// it was paired but parallel/ has no column/row-parallel shard types for it.
template <std::size_t I, class L, split_role R, int T>
struct split_layer {
  static_assert(layer_has_shard_types<I, L, R == split_role::replicate>,
                "tessera::parallel::tensor<T>: the layer in layer_has_shard_types<index, type, "
                "false> declares nn::split_kind::splittable, but parallel/tensor_parallel.hpp "
                "has column- and row-parallel shard types only for nn::Linear and nn::Conv2d "
                "(groups 1); declare split_kind::replicate (or nothing) for it.");
  using type = L;
  static constexpr bool ok = R == split_role::replicate;
};
template <std::size_t I, index_t In, index_t Out, class P, split_role R, int T>
requires(R != split_role::replicate) struct split_layer<I, nn::Linear<In, Out, P>, R, T> {
  static constexpr index_t width = R == split_role::column ? Out : In;
  static constexpr bool ok = tensor_split_check<I, nn::Linear<In, Out, P>, T, width % T == 0>::ok;
  using type = std::conditional_t<R == split_role::column, ColumnParallelLinear<In, Out, T, P>,
                                  RowParallelLinear<In, Out, T, P>>;
};
template <std::size_t I, index_t InC, index_t OutC, index_t K, nn::conv_options O, class P,
          split_role R, int T>
requires(R != split_role::replicate) struct split_layer<I, nn::Conv2d<InC, OutC, K, O, P>, R, T> {
  static constexpr index_t width = R == split_role::column ? OutC : InC;
  static constexpr bool ok =
      tensor_split_check<I, nn::Conv2d<InC, OutC, K, O, P>, T, width % T == 0>::ok;
  using type =
      std::conditional_t<R == split_role::column, ColumnParallelConv2d<InC, OutC, K, O, T, P>,
                         RowParallelConv2d<InC, OutC, K, O, T, P>>;
};

/// The shard_spec of every parameter of Layers..., in parameters() order: a layer's `shards`
/// where it declares them (a tensor-parallel layer), unsplit otherwise. The `shards` of a
/// composite layer (TensorParallelResidual, TensorParallelRecompute).
template <class... Layers>
constexpr auto concat_shards() {
  constexpr std::size_t total =
      (decltype(boost::hana::length(std::declval<const Layers&>().parameters()))::value + ... +
       std::size_t(0));
  std::array<shard_spec, total> out{};
  std::size_t k = 0;
  const auto add = [&]<class L>(L*) {
    constexpr std::size_t n =
        decltype(boost::hana::length(std::declval<const L&>().parameters()))::value;
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (requires { L::shards; })
        out[k++] = L::shards[i];
      else
        out[k++] = shard_spec{};
    }
  };
  (add(static_cast<Layers*>(nullptr)), ...);
  return out;
}
} // namespace detail

/// nn::Residual<Layers...> with its inner layers split (tensor_split_t's rule for a Residual):
/// a Linear pair inside it column- then row-parallel (the MLP block Linear, GELU, Linear),
/// nn::CausalSelfAttention split by heads (HeadParallelAttention), every other inner layer
/// (LayerNorm) replicated. Its forward and backward are nn::Residual's: x + f(x) with f's
/// output whole on every rank. `shards` lists its parameters' splits in parameters() order.
template <int T, class... Layers>
class TensorParallelResidual : public nn::Residual<Layers...> {
public:
  static constexpr int tensor_size = T;
  static constexpr auto shards = detail::concat_shards<Layers...>();

  explicit TensorParallelResidual(std::uint64_t seed = 0) : nn::Residual<Layers...>(seed) {}
  /// Binds the inner tensor-parallel layers.
  void bind(const tensor_group& g) {
    detail::check_group("TensorParallelResidual", T, g);
    bind_tensor_group(this->inner(), g);
  }
};

namespace detail {

/// An inner layer of a Residual under the split: paired Linear layers as split_layer makes
/// them, nn::CausalSelfAttention by heads (when T divides H and it computes unscaled), the
/// rest unchanged.
template <std::size_t I, class L, split_role R, int T>
struct split_inner : split_layer<I, L, R, T> {};
template <std::size_t I, index_t D, index_t H, class P, int T>
requires(H % T == 0 &&
         TensorParallelPrecision<P>) struct split_inner<I, nn::CausalSelfAttention<D, H, P>,
                                                        split_role::replicate, T> {
  static constexpr bool ok = true;
  using type = HeadParallelAttention<D, H, T, P>;
};

template <std::size_t I, int T, class Roles, class Seq, class... Ls>
struct split_residual_impl;
template <std::size_t I, int T, class... Ls, std::size_t... J>
struct split_residual_impl<I, T, std::index_sequence<J...>, std::index_sequence<J...>, Ls...> {
  static constexpr auto roles = pair_roles<sizeof...(Ls)>({tp_kind_of<Ls>::value...});
  static constexpr bool ok = (split_inner<I, Ls, roles[J], T>::ok && ...);
  using type = TensorParallelResidual<T, typename split_inner<I, Ls, roles[J], T>::type...>;
};

/// A Residual (declared replicate: it is never paired) is split inside.
template <std::size_t I, class... Ls, int T>
requires(T > 1) struct split_layer<I, nn::Residual<Ls...>, split_role::replicate, T> {
  using impl = split_residual_impl<I, T, std::index_sequence_for<Ls...>,
                                   std::index_sequence_for<Ls...>, Ls...>;
  static constexpr bool ok = impl::ok;
  using type = typename impl::type;
};

} // namespace detail

/// nn::Recompute<nn::Sequential<Ls...>> with its one splittable layer split (tensor_split_t's
/// rule for such a segment, paired with the splittable layer or segment next to it): the
/// segment's forward, backward and recomputation are nn::Recompute's, its layers those of the
/// split (the splittable one column- or row-parallel, the per-feature ones as they are).
/// `shards` lists its parameters' splits in parameters() order.
template <int T, class Segment>
class TensorParallelRecompute;
template <int T, class... Layers>
class TensorParallelRecompute<T, nn::Sequential<Layers...>>
    : public nn::Recompute<nn::Sequential<Layers...>> {
  using base = nn::Recompute<nn::Sequential<Layers...>>;

public:
  static constexpr int tensor_size = T;
  static constexpr auto shards = detail::concat_shards<Layers...>();

  explicit TensorParallelRecompute(std::uint64_t seed = 0) : base(seed) {}
  explicit TensorParallelRecompute(nn::flat_seed s) : base(s) {}
  /// Binds the segment's tensor-parallel layer.
  void bind(const tensor_group& g) {
    detail::check_group("TensorParallelRecompute", T, g);
    bind_tensor_group(this->segment(), g);
  }
};

namespace detail {

/// A Recompute segment paired as a whole: its splittable layer takes the role R, the others
/// stay.
template <std::size_t I, int T, split_role R, class... Ls>
struct split_recompute_impl {
  static constexpr bool ok =
      (split_layer < I, Ls,
       tp_kind_of<Ls>::value == tp_kind::splittable ? R : split_role::replicate, T > ::ok && ...);
  using type = TensorParallelRecompute<
      T, nn::Sequential<typename split_layer<
             I, Ls, tp_kind_of<Ls>::value == tp_kind::splittable ? R : split_role::replicate,
             T>::type...>>;
};
template <std::size_t I, class... Ls, split_role R, int T>
requires(R !=
         split_role::replicate) struct split_layer<I, nn::Recompute<nn::Sequential<Ls...>>, R, T> {
  using impl = split_recompute_impl<I, T, R, Ls...>;
  static constexpr bool ok = impl::ok;
  using type = typename impl::type;
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
concept TensorParallelLayer = requires(L& l, const tensor_group& g) {
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
    if constexpr (detail::TensorParallelLayer<std::remove_cvref_t<decltype(layer)>>)
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
      if constexpr (TensorParallelLayer<L>) s = L::shards[k];
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
        if constexpr (detail::TensorParallelLayer<L>) s = L::shards[k];
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
