#pragma once
/// \file parallel/data_parallel.hpp
/// Data parallelism: gradients averaged across the data group by bucketed, non-blocking
/// all-reduces that start while backward is still running, and steps skipped consistently.
///
///   tessera::parallel::gradient_buckets dp(mesh.data, model.parameters(), 1 << 20); // 1 MiB
///   // backward, layer by layer from the last: after a layer's gradients are final,
///   dp.mark_ready(param);      // a bucket whose parameters are all ready starts its all-reduce
///   dp.finish();               // waits for every bucket; gradients now hold the group average
///   bool applied = tessera::parallel::consistent_step(exec, opt, scaler, params, mesh.world);
///
/// Buckets are filled in reverse parameter order, the order backward produces gradients, each
/// closing once it holds at least `bucket_bytes` (as PyTorch DDP does; a parameter larger than
/// that is a bucket of its own). The first bucket's all-reduce is in flight while the layers
/// before it run their backward. A parameter never marked is reduced by finish(): forgetting a
/// mark costs overlap, never correctness.
///
/// With bucket_reduction::reduce_scatter (or _staged) the buckets reduce-scatter instead: each
/// rank receives the average of its shard (shard_layout) of the flattened gradients only, as
/// ZeRO stages 1 and 2 want (parallel/zero.hpp). Those buckets are cut at exactly
/// `bucket_bytes` of the flattened gradients, a large parameter split across several, so that
/// stage 2's two staging buffers stay bucket-sized whatever the parameters' sizes.
///
/// Averaging assumes every rank's loss is the mean over an equal share of the global batch:
/// the average of the ranks' gradients is then the gradient of the global-batch mean.

#include <tessera/nn/layer.hpp>
#include <tessera/nn/parameter.hpp>
#include <tessera/nn/pooling.hpp>
#include <tessera/parallel/communicator.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/for_each.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::parallel {

/// N elements split over D ranks into contiguous shards, balanced: rank r owns
/// [begin(r), end(r)) with begin(r) = floor(r N / D); sizes differ by at most one.
struct shard_layout {
  std::int64_t elements = 0; ///< N
  int ranks = 1;             ///< D

  constexpr std::int64_t begin(int r) const noexcept { return elements * r / ranks; }
  constexpr std::int64_t end(int r) const noexcept { return begin(r + 1); }
  constexpr std::int64_t size(int r) const noexcept { return end(r) - begin(r); }
  /// The largest shard, ceil(N / D): the count every rank hands to the collectives (padded).
  constexpr std::int64_t chunk() const noexcept { return (elements + ranks - 1) / ranks; }
  /// Calls f(q, a, b) for each rank q whose shard meets [first, last), with [a, b) the
  /// intersection, in increasing order.
  template <class F>
  void for_each_owner(std::int64_t first, std::int64_t last, F&& f) const {
    if (first >= last) return;
    int q = elements > 0 ? int(first * ranks / elements) : 0;
    while (q > 0 && begin(q) > first) --q;
    while (q + 1 < ranks && end(q) <= first) ++q;
    for (; q < ranks && begin(q) < last; ++q) {
      const std::int64_t a = std::max(first, begin(q)), b = std::min(last, end(q));
      if (a < b) f(q, a, b);
    }
  }
};

/// What gradient_buckets do with a full bucket (see gradient_buckets).
enum class bucket_reduction {
  all_reduce,            ///< every rank receives the bucket's group average (DDP, ZeRO stage 0)
  reduce_scatter,        ///< each rank receives the average of its shard's part of the bucket;
                         ///< every bucket staged in a buffer of its own (ZeRO stage 1)
  reduce_scatter_staged, ///< the same through two bucket-sized buffers used in turn (ZeRO
                         ///< stage 2: no whole-gradient buffer), where that is smaller than
                         ///< the whole gradient (two buckets or fewer: as reduce_scatter)
};

/// Bucketed gradient reduction over a data-parallel communicator (see the file comment).
/// Wire is float (default) or bfloat16: the precision the buckets travel in (bf16 halves the
/// bytes; the sum is still computed in fp32, then each gradient rounds to bf16 once).
///
/// The reduce-scatter forms (ZeRO, parallel/zero.hpp; fp32 wire only) split the parameters,
/// flattened in parameter order into N elements, as shard_layout{N, D}; a bucket is a
/// contiguous range of those N elements, bucket_bytes / 4 of them (the lowest bucket the
/// rest), cut without regard to where parameters begin: a parameter may lie in several
/// buckets, which all become ready when it is marked. Each rank receives the group sum of the
/// bucket's elements inside its shard (MPI_Ireduce_scatter, in place, with those counts),
/// started as soon as every parameter with elements in the bucket is ready, like the
/// all-reduce. Afterwards the gradients of this rank's shard hold the group average; the rest
/// of each gradient is left as backward wrote it.
template <Communicator C, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space,
          class Wire = float>
class gradient_buckets {
  static_assert(std::is_same_v<Wire, float> || std::is_same_v<Wire, bfloat16>,
                "tessera::parallel::gradient_buckets: Wire must be float or tessera::bfloat16");

public:
  /// Groups `params` (a hana tuple of nn::parameter in MemorySpace) into buckets of at least
  /// `bucket_bytes` (in Wire bytes) of whole parameters for the all-reduce, of exactly
  /// bucket_bytes / 4 elements (parameters cut at the edges; the last bucket the rest) for the
  /// reduce-scatter forms. Throws value_error if bucket_bytes is 0 or two parameters share a
  /// gradient buffer.
  template <class Params>
  gradient_buckets(C comm, const Params& params, std::size_t bucket_bytes,
                   bucket_reduction how = bucket_reduction::all_reduce)
      : comm_(std::move(comm)), bucket_bytes_(bucket_bytes), how_(how) {
    if (bucket_bytes == 0)
      throw value_error("tessera::parallel::gradient_buckets: bucket_bytes must be positive");
    if (how != bucket_reduction::all_reduce && !std::is_same_v<Wire, float>)
      throw value_error("tessera::parallel::gradient_buckets: the reduce-scatter forms (ZeRO) "
                        "carry fp32 gradients; a bf16 wire is only for the all-reduce");
    std::int64_t n = 0;
    boost::hana::for_each(params, [&](const auto& p) {
      static_assert(nn::Parameter<decltype(p)>,
                    "tessera::parallel::gradient_buckets: every element must be an "
                    "nn::parameter (what a model's parameters() returns)");
      static_assert(
          std::is_same_v<typename std::remove_cvref_t<decltype(p)>::memory_space, MemorySpace>,
          "tessera::parallel::gradient_buckets: the parameters live in another "
          "memory space than MemorySpace");
      slots_.push_back({p.name, grad_view(p.grad.data(), std::size_t(p.size())), n, {}, false});
      n += p.size();
    });
    layout_ = {n, comm_.size()};
    // Reverse order: the last layer's gradients are final first. The all-reduce closes a
    // bucket once it holds bucket_bytes (whole parameters); the reduce-scatter forms cut
    // parameters so that every bucket but the lowest holds exactly `cap` elements.
    const bool cut = how_ != bucket_reduction::all_reduce;
    const std::size_t cap = std::max<std::size_t>(1, bucket_bytes_ / sizeof(Wire));
    auto full = [&](const bucket& b) {
      return cut ? b.elements >= cap : b.elements * sizeof(Wire) >= bucket_bytes_;
    };
    for (std::size_t k = slots_.size(); k-- > 0;) {
      slot& s = slots_[k];
      if (!index_.emplace(s.grad.data(), k).second)
        throw value_error("tessera::parallel::gradient_buckets: parameters '" + s.name + "' and '" +
                          slots_[index_[s.grad.data()]].name + "' share a gradient buffer");
      std::size_t left = s.grad.extent(0); // s's elements [0, left) not in a bucket yet
      do {
        if (buckets_.empty() || full(buckets_.back())) buckets_.push_back({});
        bucket& b = buckets_.back();
        const std::size_t take = cut ? std::min(left, cap - b.elements) : left;
        left -= take;
        b.pieces.push_back({k, left, take, 0});
        b.slots.push_back(k);
        b.elements += take;
        b.first = s.global + std::int64_t(left); // the bucket's lowest piece comes last
        s.buckets.push_back(buckets_.size() - 1);
      } while (left > 0);
    }
    // Each bucket holds its elements in parameter order: [first, first + elements) of the N.
    for (bucket& b : buckets_)
      for (piece& pc : b.pieces)
        pc.offset = std::size_t(slots_[pc.slot].global + std::int64_t(pc.begin) - b.first);
    // Staged: two buffers of the largest bucket, used in turn, where that is less than the
    // whole gradient (more than two buckets); else a buffer per bucket.
    std::size_t largest = 0;
    for (const bucket& b : buckets_) largest = std::max(largest, b.elements);
    ring_ = how_ == bucket_reduction::reduce_scatter_staged && buckets_.size() > 2 &&
            2 * largest < std::size_t(n);
    for (bucket& b : buckets_) {
      if (!ring_) b.flat = host_view("tessera::parallel::gradient_buckets::flat", b.elements);
      if constexpr (std::is_same_v<Wire, bfloat16>) b.wire.resize(b.elements);
      b.pending = b.pieces.size();
      if (how_ != bucket_reduction::all_reduce) {
        b.counts.assign(std::size_t(layout_.ranks), 0);
        layout_.for_each_owner(
            b.first, b.first + std::int64_t(b.elements),
            [&](int q, std::int64_t lo, std::int64_t hi) { b.counts[std::size_t(q)] = hi - lo; });
      }
    }
    if (ring_)
      for (int i = 0; i < 2; ++i)
        staging_.push_back(
            {host_view("tessera::parallel::gradient_buckets::staging", largest), nullptr});
  }

  /// The gradient of `p` (one of the parameters given at construction) is final for this step.
  /// When it completes its bucket, the bucket is packed and its reduction started. Marking a
  /// parameter twice in one step throws value_error.
  template <class Exec, nn::Parameter P>
  void mark_ready(const Exec& exec, const P& p) {
    const auto it = index_.find(p.grad.data());
    if (it == index_.end())
      throw value_error("tessera::parallel::gradient_buckets::mark_ready: '" + p.name +
                        "' is not one of the parameters the buckets were built for");
    slot& s = slots_[it->second];
    if (s.ready)
      throw value_error("tessera::parallel::gradient_buckets::mark_ready: '" + p.name +
                        "' was marked twice in one step");
    s.ready = true;
    for (std::size_t i : s.buckets) {
      bucket& b = buckets_[i];
      if (--b.pending == 0) {
        start(exec, b);
        ++marked_starts_;
      }
    }
    poll();
  }

  /// Lets in-flight reductions progress (MPI progresses only inside MPI calls): call it
  /// between layers' backwards for more overlap. Non-blocking.
  void poll() {
    for (bucket& b : buckets_)
      if (b.started) b.req.poll();
  }

  /// Starts the buckets not started yet, waits for all, and writes the average over the
  /// communicator into every gradient (the reduce-scatter forms: into this rank's shard of
  /// them). Ready for the next step afterwards.
  template <class Exec>
  void finish(const Exec& exec) {
    last_marked_starts_ = marked_starts_;
    marked_starts_ = 0;
    for (bucket& b : buckets_)
      if (!b.started) start(exec, b);
    for (bucket& b : buckets_) {
      complete(exec, b);
      for (std::size_t k : b.slots) slots_[k].ready = false;
      b.started = b.done = false;
      b.pending = b.pieces.size();
    }
    for (stage_buffer& sb : staging_) sb.user = nullptr;
    exec.fence();
  }

  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  /// Buckets whose reduction the last finished step started from mark_ready, while backward
  /// was still running (the others started in finish(), after it): bucket_count() when every
  /// parameter was marked, 0 without overlap.
  std::size_t overlapped_buckets() const noexcept { return last_marked_starts_; }
  /// Parameters with elements in bucket i, by index into the parameter tuple (in the order
  /// reduced; under the reduce-scatter forms a parameter cut at the bucket's edge is also in
  /// the bucket next to it).
  const std::vector<std::size_t>& bucket_parameters(std::size_t i) const {
    return buckets_.at(i).slots;
  }
  bucket_reduction reduction() const noexcept { return how_; }
  /// The split of the flattened parameters over the communicator the reduce-scatter forms use
  /// (N = every gradient element, D = the communicator's size).
  const shard_layout& layout() const noexcept { return layout_; }
  /// Bytes this rank hands to the collectives per step: the gradient count times sizeof(Wire).
  std::size_t bytes_per_step() const noexcept {
    std::size_t n = 0;
    for (const bucket& b : buckets_) n += b.elements;
    return n * sizeof(Wire);
  }
  /// Bytes of the buffers the gradients are reduced in: fp32 per gradient (plus the bf16 wire
  /// copy when Wire is bfloat16) for the all-reduce and reduce_scatter; for
  /// reduce_scatter_staged two buckets' (8 * (bucket_bytes / 4)) where the gradient has more
  /// than two buckets, else the whole gradient's.
  std::size_t buffer_bytes() const noexcept {
    std::size_t n = 0;
    for (const bucket& b : buckets_) // (ring: each flat is a view of a staging buffer)
      n += (ring_ ? 0 : b.flat.extent(0) * sizeof(float)) + b.wire.size() * sizeof(bfloat16);
    for (const stage_buffer& sb : staging_) n += sb.buffer.extent(0) * sizeof(float);
    return n;
  }
  const C& communicator() const noexcept { return comm_; }

private:
  using grad_view = Kokkos::View<float*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using host_view = Kokkos::View<float*, Kokkos::HostSpace>;
  static Kokkos::pair<std::size_t, std::size_t> range(std::size_t offset, std::size_t n) {
    return {offset, offset + n};
  }

  struct slot {
    std::string name;
    grad_view grad;
    std::int64_t global = 0;          // of its first element among the N
    std::vector<std::size_t> buckets; // those holding its elements (one for the all-reduce)
    bool ready = false;
  };
  /// Elements [begin, begin + count) of parameter `slot`, at `offset` in its bucket.
  struct piece {
    std::size_t slot = 0, begin = 0, count = 0, offset = 0;
  };
  struct bucket {
    std::vector<piece> pieces;
    std::vector<std::size_t> slots; // pieces' parameters
    std::size_t elements = 0, pending = 0;
    std::int64_t first = 0; // its first element among the N
    host_view flat;         // reduce_scatter_staged: a staging buffer's while in flight
    std::vector<bfloat16> wire;
    std::vector<std::int64_t> counts; // the reduce-scatter forms: elements per rank
    request req;
    bool started = false, done = false;
  };
  struct stage_buffer {
    host_view buffer;
    bucket* user; // the bucket in flight in it, or null
  };

  template <class Exec>
  void start(const Exec& exec, bucket& b) {
    if (ring_) {
      // The staging buffers in turn; the bucket that used this one completes first.
      stage_buffer& sb = staging_[next_staging_++ % staging_.size()];
      if (sb.user) complete(exec, *sb.user);
      sb.user = &b;
      b.flat = Kokkos::subview(sb.buffer, range(0, b.elements));
    }
    exec.fence(); // the backward kernels that wrote these gradients have finished
    for (const piece& pc : b.pieces)
      Kokkos::deep_copy(exec, Kokkos::subview(b.flat, range(pc.offset, pc.count)),
                        Kokkos::subview(slots_[pc.slot].grad, range(pc.begin, pc.count)));
    exec.fence();
    if constexpr (std::is_same_v<Wire, bfloat16>) {
      for (std::size_t i = 0; i < b.elements; ++i) b.wire[i] = bfloat16::from_float(b.flat(i));
      b.req = comm_.iall_reduce_sum(b.wire.data(), std::int64_t(b.elements));
    } else if (how_ == bucket_reduction::all_reduce) {
      b.req = comm_.iall_reduce_sum(b.flat.data(), std::int64_t(b.elements));
    } else {
      b.req = comm_.ireduce_scatter_sum(b.flat.data(), b.counts.data());
    }
    b.started = true;
  }

  /// Waits for b's reduction and writes the average into the gradients (all of them, or this
  /// rank's shard: the reduce-scatter leaves it at the front of the buffer). Once per step.
  template <class Exec>
  void complete(const Exec& exec, bucket& b) {
    if (b.done) return;
    b.req.wait();
    const float inv = 1.0f / float(comm_.size());
    if (how_ == bucket_reduction::all_reduce) {
      if constexpr (std::is_same_v<Wire, bfloat16>)
        for (std::size_t i = 0; i < b.elements; ++i) b.flat(i) = b.wire[i].to_float();
      for (std::size_t i = 0; i < b.elements; ++i) b.flat(i) *= inv;
      for (const piece& pc : b.pieces)
        Kokkos::deep_copy(exec, Kokkos::subview(slots_[pc.slot].grad, range(pc.begin, pc.count)),
                          Kokkos::subview(b.flat, range(pc.offset, pc.count)));
    } else {
      const int r = comm_.rank();
      const std::int64_t lo = std::max(b.first, layout_.begin(r)),
                         hi = std::min(b.first + std::int64_t(b.elements), layout_.end(r));
      for (std::int64_t i = 0; i < hi - lo; ++i) b.flat(std::size_t(i)) *= inv;
      for (const piece& pc : b.pieces) {
        const slot& s = slots_[pc.slot];
        const std::int64_t first = s.global + std::int64_t(pc.begin);
        const std::int64_t a = std::max(lo, first),
                           e = std::min(hi, first + std::int64_t(pc.count));
        if (a < e)
          Kokkos::deep_copy(
              exec, Kokkos::subview(s.grad, range(std::size_t(a - s.global), std::size_t(e - a))),
              Kokkos::subview(b.flat, range(std::size_t(a - lo), std::size_t(e - a))));
      }
    }
    exec.fence(); // the staging buffer may be reused as soon as this returns
    b.done = true;
  }

  C comm_;
  std::size_t bucket_bytes_;
  bucket_reduction how_;
  bool ring_ = false; // staged through two buffers (see the constructor)
  shard_layout layout_;
  std::size_t marked_starts_ = 0, last_marked_starts_ = 0, next_staging_ = 0;
  std::vector<slot> slots_;
  std::vector<bucket> buckets_;
  std::vector<stage_buffer> staging_;
  std::unordered_map<const float*, std::size_t> index_;
};

namespace detail {
template <class Model, std::size_t... J>
constexpr bool parameters_before(std::index_sequence<J...>) {
  return (nn::detail::has_parameters<
              std::remove_cvref_t<decltype(std::declval<Model&>().template layer<J>())>> ||
          ... || false);
}
/// Layers I - 1 and I of Model are an nn::ReLU and a pooling with backward_after_relu
/// (nn::detail::pools_after_relu): one pass, as nn::Sequential's backward runs them.
template <class Model, std::size_t I, class Exec, class DY>
constexpr bool pools_after_relu() {
  if constexpr (I == 0) {
    return false;
  } else {
    return nn::detail::pools_after_relu<
        std::remove_cvref_t<decltype(std::declval<Model&>().template layer<I - 1>())>,
        std::remove_cvref_t<decltype(std::declval<Model&>().template layer<I>())>, Exec, DY>();
  }
}
template <std::size_t I, class Exec, class Model, class DY, class Buckets>
void backward_marking(const Exec& exec, Model& model, const DY& dy, Buckets& buckets) {
  constexpr bool before = parameters_before<Model>(std::make_index_sequence<I>{});
  constexpr bool pair = pools_after_relu<Model, I, Exec, DY>(); // layers I - 1 and I at once
  auto& layer = model.template layer<I>();
  auto dx = [&] {
    if constexpr (pair) {
      return layer.backward_after_relu(exec, dy, before);
    } else {
      return layer.backward(exec, dy, before);
    }
  }();
  boost::hana::for_each(layer.parameters(), [&](const auto& p) { buckets.mark_ready(exec, p); });
  constexpr std::size_t next = pair ? 2 : 1; // a ReLU has no parameters to mark
  if constexpr (I >= next) {
    if constexpr (before) backward_marking<I - next>(exec, model, dx, buckets);
  }
}
} // namespace detail

/// Model::backward (an nn::Sequential: layers from the last to the first, dy = dL/d(output) of
/// the last forward), marking each layer's parameters ready in `buckets` as soon as that
/// layer's backward has written them, so each full bucket's all-reduce starts while the earlier
/// layers are still in backward. Layers before the first one with parameters are skipped (no
/// gradient needed there). Call buckets.finish(exec) afterwards.
template <class Exec, class Model, class DY, class Buckets>
void backward_overlapped(const Exec& exec, Model& model, const DY& dy, Buckets& buckets) {
  static_assert(Model::size() >= 1, "tessera::parallel::backward_overlapped: an empty model");
  detail::backward_marking<Model::size() - 1>(exec, model, dy, buckets);
}

/// The training step of train::step, with the finite check agreed across `group`: if any
/// rank's unscaled gradients hold an inf or NaN, every rank skips the step and every rank's
/// scaler backs off, so the replicas stay identical. Returns whether the step was applied.
/// (Scaler: unscale_and_check(exec, params) -> bool and update(bool); Optimizer: step(exec,
/// params); as in tessera/train/.)
template <class Exec, class Optimizer, class Scaler, class Params, Communicator C>
bool consistent_step(const Exec& exec, Optimizer& opt, Scaler& scaler, const Params& params,
                     C& group) {
  const bool finite = group.all_of(scaler.unscale_and_check(exec, params));
  if (finite) opt.step(exec, params);
  scaler.update(finite);
  return finite;
}

} // namespace tessera::parallel
