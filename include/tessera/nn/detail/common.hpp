#pragma once
// Private helpers of nn/: reusable activation buffers, compute copies of GEMM operands in a
// layer's compute precision, device-callable math. Not part of the public API.

#include <tessera/config/kokkos_compat.hpp> // is_host_exec_v
#include <tessera/nn/parameter.hpp>
#include <tessera/nn/precision.hpp>
#include <tessera/precision/vector_convert.hpp> // convert_n (host paths)

#include <Kokkos_MathematicalFunctions.hpp>
#include <boost/hana/tuple.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>

namespace tessera::nn {

/// The activation memory a model holds between a forward and its backward, counted once per
/// allocation: layers add every activation view they keep (their outputs, the copies of their
/// inputs they saved for backward, masks, statistics; not parameters, gradients or the weights'
/// compute copies) through their optional `count_activations(activation_ledger&) const`
/// (nn/layer.hpp). A view shared by two layers (an fp32 Linear keeps a reference to the tensor
/// the layer before it returned) counts once. A local object, passed down: no global counter.
class activation_ledger {
public:
  /// Records `bytes` held at `data` (ignored when data is null: an unallocated buffer).
  void add(const void* data, std::size_t bytes) {
    if (data != nullptr && bytes > 0) {
      auto& b = held_[data];
      b = b > bytes ? b : bytes;
    }
  }
  /// The bytes recorded, each allocation once.
  std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& [p, b] : held_) n += b;
    return n;
  }
  /// The number of distinct allocations recorded.
  std::size_t allocations() const noexcept { return held_.size(); }

private:
  std::map<const void*, std::size_t> held_;
};

} // namespace tessera::nn

namespace tessera::nn::detail {

// exp/log/tanh/erf callable in kernels: Kokkos::Experimental:: on 3.4-3.6, Kokkos:: from 3.7
// (where the Experimental names became deprecated aliases).
#if KOKKOS_VERSION >= 30700
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

using default_memory_space = Kokkos::DefaultExecutionSpace::memory_space;

/// The memory of one activation (or gradient) tensor a layer returns, kept between steps: it is
/// reallocated only when the number of elements changes (a smaller last batch), so a training
/// loop does not allocate per step. The tensor handed out shares it and stays valid until the
/// layer next writes it (its next forward, or next backward for gradients).
template <class P, class M = default_memory_space>
class buffer {
public:
  explicit buffer(std::string label = "tessera::nn::buffer") : label_(std::move(label)) {}

  template <class Ext>
  Tensor<P, Ext, layout_right, M> get(const Ext& e) {
    if (static_cast<index_t>(v_.extent(0)) != e.size())
      v_ = view_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, label_),
                     static_cast<std::size_t>(e.size()));
    return Tensor<P, Ext, layout_right, M>(v_, e);
  }

  /// Adds the memory held to l (nothing when unallocated).
  void count(activation_ledger& l) const { l.add(v_.data(), v_.extent(0) * sizeof(storage_t<P>)); }
  /// Drops this buffer's reference to its memory (freed once no tensor handed out shares it);
  /// the next get allocates again.
  void release() noexcept { v_ = view_type(); }

private:
  using view_type = Kokkos::View<storage_t<P>*, M>;
  std::string label_;
  view_type v_;
};

/// A buffer for tensors of whichever precision flows through a precision-generic layer: one per
/// precision of tessera::known_precisions (an allocation only for those actually used).
class any_buffer {
public:
  explicit any_buffer(const char* label) : bufs_(make(label, known_precisions{})) {}
  template <class P, class Ext>
  auto get(const Ext& e) {
    constexpr int i = precision_index<P>();
    static_assert(i >= 0, "tessera::nn: the precision is not in tessera::known_precisions.");
    return std::get<i>(bufs_).get(e);
  }
  void count(activation_ledger& l) const {
    std::apply([&](const auto&... b) { (b.count(l), ...); }, bufs_);
  }
  void release() noexcept {
    std::apply([](auto&... b) { (b.release(), ...); }, bufs_);
  }

private:
  template <class... Ps>
  static std::tuple<buffer<Ps>...> make(const char* label, precision_list<Ps...>) {
    return {buffer<Ps>(label)...};
  }
  decltype(make("", known_precisions{})) bufs_;
};

/// l.count_activations(ledger) / l.release_activations() when the layer declares them
/// (nn/layer.hpp); nothing otherwise (a layer that keeps no activations: Input, Flatten).
template <class L>
void count_activations_of(const L& layer, activation_ledger& l) {
  if constexpr (requires { layer.count_activations(l); }) layer.count_activations(l);
}
template <class L>
void release_activations_of(L& layer) {
  if constexpr (requires { layer.release_activations(); }) layer.release_activations();
}

/// Raw memory of n elements of T, kept between steps like buffer (masks, pooling indices).
template <class T, class M = default_memory_space>
class raw_buffer {
public:
  explicit raw_buffer(std::string label = "tessera::nn::raw_buffer") : label_(std::move(label)) {}
  T* get(index_t n) {
    if (static_cast<index_t>(v_.extent(0)) != n)
      v_ = Kokkos::View<T*, M>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label_),
                               static_cast<std::size_t>(n));
    return v_.data();
  }
  T* data() const noexcept { return v_.data(); }
  void count(activation_ledger& l) const { l.add(v_.data(), v_.extent(0) * sizeof(T)); }
  void release() noexcept { v_ = Kokkos::View<T*, M>(); }

private:
  std::string label_;
  Kokkos::View<T*, M> v_;
};

/// What Linear and Conv2d do with the fp32 sums of their output (forward) or of their input
/// gradient (backward), before the bias and the single rounding to the activation precision:
/// nothing, by default. A layer that holds one shard of a larger layer passes a reduction
/// instead (parallel/tensor_parallel.hpp: the sum over its tensor group), called as
/// reduce(exec, sums, count) on host-accessible fp32 memory that kernels may still be writing
/// (the reduction fences first).
struct no_reduction {};

/// nn::ReLU's function on an fp32 value, max(v, 0) with NaN -> 0, as a store epilogue of the
/// layer before it (Sequential fuses Conv2d + ReLU): rounding relu(v) gives what ReLU gives on
/// the rounded v (rounding is monotonic and keeps signs, a positive v rounding to +0 included).
struct relu_store {
  TESSERA_INLINE float operator()(float v) const noexcept { return v > 0.f ? v : 0.f; }
};
template <class R>
inline constexpr bool reduces = !std::is_same_v<R, no_reduction>;

/// Runs f(begin, end) over [0, n) cut into chunks of 4096 elements, one work item each: an
/// element-wise kernel written as a plain loop over its chunk (with its pointers copied into
/// locals) vectorises, which a per-element Kokkos functor whose stores may alias its own
/// captured pointers does not.
template <class Exec, class F>
void for_chunks(const Exec& exec, const char* label, index_t n, const F& f) {
  constexpr index_t chunk = 4096;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, (n + chunk - 1) / chunk),
      KOKKOS_LAMBDA(const index_t c) {
        const index_t begin = c * chunk;
        f(begin, n - begin < chunk ? n : begin + chunk);
      });
}

/// out[i] = from_float<P>(f(to_float(a[i]), to_float(b[i]))) for i < n, in parallel over
/// for_chunks. On host spaces each chunk goes 256 elements at a time through convert_n (the
/// operands widened, the results rounded: the same conversions, vectorised) and f runs in a
/// loop over fp32 arrays the compiler vectorises; elsewhere one element per iteration.
template <class P, class Exec, class SA, class SB, class F>
void zip_rounded(const Exec& exec, const char* label, index_t n, const SA* a, const SB* b,
                 storage_t<P>* out, const F& f) {
#if !TESSERA_DEVICE_PASS
  if constexpr (tessera::detail::is_host_exec_v<Exec>) {
    for_chunks(exec, label, n, [=](const index_t begin, const index_t end) {
      constexpr index_t block = 256;
      alignas(64) float fa[block], fb[block], fo[block];
      for (index_t i0 = begin; i0 < end; i0 += block) {
        const index_t m = end - i0 < block ? end - i0 : block;
        const float* xa = fa;
        const float* xb = fb;
        if constexpr (std::is_same_v<SA, float>)
          xa = a + i0;
        else
          convert_n<fp32>(a + i0, fa, std::size_t(m));
        if constexpr (std::is_same_v<SB, float>)
          xb = b + i0;
        else
          convert_n<fp32>(b + i0, fb, std::size_t(m));
        float* xo = fo;
        if constexpr (std::is_same_v<storage_t<P>, float>) xo = out + i0;
        for (index_t i = 0; i < m; ++i) xo[i] = f(xa[i], xb[i]);
        if constexpr (!std::is_same_v<storage_t<P>, float>)
          convert_n<P>(fo, out + i0, std::size_t(m));
      }
    });
    return;
  }
#endif
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(const index_t i) {
        out[i] = from_float<P>(f(to_float(a[i]), to_float(b[i])));
      });
}

/// v where keep is true, else +0, with no data-dependent branch (a ReLU mask is random: a
/// branch per element mispredicts half the time; a compare-and-mask vectorises). Storage of
/// every precision: a float, or a struct of raw bits.
template <class S>
TESSERA_INLINE S keep_or_zero(bool keep, S v) noexcept {
  if constexpr (std::is_same_v<S, float>) {
    return keep ? v : 0.f;
  } else {
    using bits_t = decltype(v.bits);
    S r;
    r.bits = static_cast<bits_t>(v.bits & static_cast<bits_t>(0u - static_cast<unsigned>(keep)));
    return r;
  }
}

/// The precision a GEMM / convolution operand has in compute precision Prec: the compute
/// precision itself for fp32 and bf16; for hybrid fp8, E5M2 for gradients and E4M3 otherwise.
template <class Prec, bool Gradient>
struct operand_precision {
  using type = Prec;
};
template <class R, bool Gradient>
struct operand_precision<fp8<R>, Gradient> {
  using type = std::conditional_t<Gradient, train::hybrid::gradient, train::hybrid::weight>;
};

/// A GEMM / convolution operand: a tensor in the operand precision and the factor (scale_inv)
/// its elements must be multiplied by to give the values they stand for (1 unless fp8).
template <class P, class Ext, class M = default_memory_space>
struct operand {
  Tensor<P, Ext, layout_right, M> t;
  float scale_inv = 1.f;

  /// What conv2d_* take: the tensor itself, or a scaled fp8 tensor carrying the scale.
  auto conv_input() const {
    if constexpr (Fp8Precision<P>) {
      return scaled_tensor<P, Ext, layout_right, M>{t, 1.f / scale_inv};
    } else {
      return t;
    }
  }
  /// Adds the tensor's memory to l (a copy the caster made, or the source it references).
  void count(activation_ledger& l) const {
    l.add(t.data(), static_cast<std::size_t>(t.size()) * sizeof(storage_t<P>));
  }
};

/// Makes the compute copies of one operand slot (the weights of a layer, its input, or its
/// output gradient) in precision Prec: no copy when the source already has the operand
/// precision, a rounding cast into a kept buffer for fp32/bf16, a scaled fp8 quantization for
/// fp8 whose scale comes from the recipe's per-tensor state (kept here, one per slot).
template <class Prec, bool Gradient, class M = default_memory_space>
class operand_caster {
public:
  using precision = typename operand_precision<Prec, Gradient>::type;

  explicit operand_caster(std::string label = "tessera::nn::operand") : buf_(std::move(label)) {}

  template <class Exec, class SrcP, class Ext>
  operand<precision, Ext, M> operator()(const Exec& exec,
                                        const Tensor<SrcP, Ext, layout_right, M>& src) {
    if constexpr (std::is_same_v<SrcP, precision> && !Fp8Precision<precision>) {
      return {src, 1.f};
    } else if constexpr (!Fp8Precision<precision>) {
      auto t = buf_.get(src.extents());
      convert_into(exec, t, src);
      return {t, 1.f};
    } else {
      auto t = buf_.get(src.extents());
      const float current =
          meta_type::needs_current_amax ? meta_.current_amax(amax(exec, src)) : 0.f;
      const float scale = meta_.template scale<precision>(current);
      meta_.record(quantize_with_scale(exec, src, t, scale));
      return {t, 1.f / scale};
    }
  }

  /// Frees the compute copy (see buffer::release).
  void release() noexcept { buf_.release(); }

  /// This slot's fp8 scaling state (train::fp8_meta), as a boost::hana::tuple of one pointer
  /// for fp8, of none otherwise: what checkpoints save and restore.
  auto fp8_states() {
    if constexpr (Fp8Precision<precision>) {
      return boost::hana::make_tuple(&meta_);
    } else {
      return boost::hana::make_tuple();
    }
  }

private:
  template <class P>
  struct meta_of {
    using type = int; // unused for fp32 / bf16
  };
  template <class R>
  struct meta_of<fp8<R>> {
    using type = train::fp8_meta<R>;
  };
  using meta_type = typename meta_of<Prec>::type;

  buffer<precision, M> buf_;
  [[no_unique_address]] meta_type meta_{};
};

/// PyTorch's default initialisation of a layer with fan_in inputs per output: kaiming_uniform
/// with a = sqrt(5) for the weights, gain sqrt(2 / (1 + a^2)) = sqrt(1/3), bound gain *
/// sqrt(3 / fan_in) = 1 / sqrt(fan_in); the bias uniform with the same bound. Each tensor gets
/// its own stream of the counter-based generator, derived from (seed, which).
template <class Ext>
void init_uniform_fan_in(const Tensor<fp32, Ext>& t, std::uint64_t seed, std::uint64_t which,
                         index_t fan_in) {
  const float bound = 1.f / std::sqrt(static_cast<float>(fan_in));
  fill_uniform(t, counter_rng{seed, which}.bits(0), -bound, bound);
}

/// A Tensor of any static shape seen with a dynamic first dimension (shares memory).
template <class P, index_t E0, index_t... Es, class M>
Tensor<P, extents<dyn, Es...>, layout_right, M>
with_dyn_batch(const Tensor<P, extents<E0, Es...>, layout_right, M>& t) {
  if constexpr (E0 == dyn) {
    return t;
  } else {
    auto a = t.extents().to_array();
    return Tensor<P, extents<dyn, Es...>, layout_right, M>(t.kokkos_view(),
                                                           extents<dyn, Es...>::from_all(a));
  }
}

/// Throws shape_error unless the run-time extents of t are exactly want (a layer's backward
/// receiving a gradient of another shape than its forward output).
template <class T, std::size_t R>
void require_extents(const char* op, const char* name, const T& t,
                     const std::array<index_t, R>& want) {
  static_assert(T::rank == R, "tessera::nn: a gradient has the wrong rank for this layer.");
  bool ok = true;
  for (std::size_t i = 0; i < R; ++i) ok = ok && t.extent(i) == want[i];
  if (!ok) {
    std::string w = "(";
    for (std::size_t i = 0; i < R; ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    throw shape_error(std::string(op) + ": " + name + " has shape " + shape_string(t.extents()) +
                      " but the last forward produced " + w + "); backward needs the gradient " +
                      "of the last forward's output");
  }
}

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

} // namespace tessera::nn::detail
