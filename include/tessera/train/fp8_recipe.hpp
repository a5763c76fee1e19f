#pragma once
/// \file train/fp8_recipe.hpp
/// fp8 scaling recipes and the per-tensor scaling state a layer keeps for each fp8 tensor.
///
/// A leaf header: it depends only on tensor/ and precision/, so nn layers include it.
///
/// ## The convention
/// Transformer Engine's, as in tensor/scaled_tensor.hpp: payload = round(x * scale) and
/// x ~= payload / scale. For a tensor whose largest magnitude is `amax`,
///
///     scale = max_finite(P) / amax / 2^margin
///
/// so amax lands on the format's largest finite value (margin 0) or 2^margin below it. A zero,
/// infinite or NaN amax carries no information: the previous scale is kept (the first scale,
/// before any usable amax, is 1).
///
/// ## Recipes (policies)
/// - `current_scaling{margin}`: the scale comes from the amax of the tensor being quantized,
///   measured just before quantizing it (one extra pass over the tensor).
/// - `delayed_scaling{history_len, amax_algo, margin}`: the scale comes from the amaxes that
///   earlier iterations recorded (the last `history_len` of them; their maximum, or only the
///   most recent one), so quantizing needs no extra pass and the amax of this iteration's
///   tensor is recorded afterwards (a GEMM can return it with its output).
///
/// ## How a layer uses fp8_meta (one per fp8 tensor: weight, input, output gradient...)
///
///     tessera::train::fp8_meta<tessera::train::delayed_scaling> meta{{.history_len = 16}};
///     float amax_now = 0.f;                                    // needed only by current scaling
///     if constexpr (decltype(meta)::needs_current_amax) amax_now = tessera::amax(exec, w);
///     const float s = meta.scale<tessera::fp8_e4m3>(amax_now);  // 1. the scale to use now
///     /* 2. quantize with s: payload = round(w * s) */
///     meta.record(amax_of_w);                                  // 3. after quantizing
///
/// Delayed scaling ignores scale()'s argument. Both recipes keep the previous scale when the
/// amax they would use is zero or non-finite (an overflowing backward records an inf amax; it
/// does not destroy the scale).
///
/// ## Formats
/// `hybrid` (E4M3 for weights and activations, E5M2 for gradients, Transformer Engine's
/// Format.HYBRID; gradients need E5M2's range more than E4M3's precision) and `all_e4m3`
/// (Format.E4M3).

#include <tessera/config/error.hpp>
#include <tessera/precision/traits.hpp>
#include <tessera/tensor/scaled_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace tessera::train {

// ---------------------------------------------------------------------------------------------
// Formats

/// fp8 format selection "hybrid": E4M3 (more precision) for weights and activations, E5M2 (more
/// range) for gradients. Transformer Engine's recipe.Format.HYBRID.
struct hybrid {
  using weight = fp8_e4m3;     ///< forward GEMM operand: weights
  using activation = fp8_e4m3; ///< forward GEMM operand: inputs / activations
  using gradient = fp8_e5m2;   ///< backward GEMM operand: output gradients
};

/// fp8 format selection "E4M3 everywhere" (Transformer Engine's recipe.Format.E4M3).
struct all_e4m3 {
  using weight = fp8_e4m3;     ///< forward GEMM operand: weights
  using activation = fp8_e4m3; ///< forward GEMM operand: inputs / activations
  using gradient = fp8_e4m3;   ///< backward GEMM operand: output gradients
};

/// A format selection: names the fp8 precision of weights, activations and gradients.
template <class F>
concept Fp8Format = Fp8Precision<typename F::weight> && Fp8Precision<typename F::activation> &&
    Fp8Precision<typename F::gradient>;

// ---------------------------------------------------------------------------------------------
// Recipes

/// How delayed scaling reduces its amax history to the one amax the scale is computed from.
enum class amax_algorithm {
  max,        ///< the largest amax in the history (Transformer Engine's default, "max")
  most_recent ///< the amax recorded last ("most_recent")
};

/// Current (just-in-time) scaling: scale from the amax of the tensor being quantized.
struct current_scaling {
  /// The scaled amax lands 2^margin below max_finite (0: exactly on it); 0..64.
  int margin = 0;
};

/// Delayed scaling: scale from the amaxes recorded by earlier iterations.
/// Defaults are Transformer Engine's DelayedScaling (history 1024, "max", margin 0).
struct delayed_scaling {
  /// How many recorded amaxes the history keeps (>= 1); older ones are forgotten.
  int history_len = 1024;
  /// max over the history, or the most recent entry.
  amax_algorithm amax_algo = amax_algorithm::max;
  /// The scaled amax lands 2^margin below max_finite (0: exactly on it); 0..64.
  int margin = 0;
};

template <class R>
struct is_fp8_recipe
    : std::bool_constant<std::is_same_v<R, current_scaling> || std::is_same_v<R, delayed_scaling>> {
};

/// current_scaling or delayed_scaling.
template <class R>
concept Fp8Recipe = is_fp8_recipe<R>::value;

namespace detail {
/// An amax is usable when it is positive, finite, and large enough that the scale of the widest
/// fp8 format (E5M2, max_finite 57344) stays a finite float: 57344 / amax overflows float for
/// amax below about 2^-112, which only a subnormal-sized tensor has; treating it like zero
/// keeps the previous scale instead of producing an infinite one.
inline bool usable_amax(float amax) noexcept {
  return amax > 0.f && std::isfinite(amax) &&
         std::isfinite(precision_traits<fp8_e5m2>::max_finite / amax);
}
/// The larger of a and b; NaN if either is (a NaN amax must reach the history, as the single
/// process's amax of the whole tensor would be NaN).
inline float max_or_nan(float a, float b) noexcept {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return a > b ? a : b;
}
} // namespace detail

// ---------------------------------------------------------------------------------------------
// Per-tensor state

/// The scaling state of one fp8 tensor under recipe R (see the file comment for the protocol).
///
/// State: the amax the current scale derives from (`scale_amax()`, 0 before any usable amax:
/// scale 1), and for delayed scaling a ring buffer of the last history_len recorded amaxes.
/// scale() is const and cheap (a division); record() is O(history_len) for amax_algorithm::max.
/// Host-side state: not for use inside kernels.
template <class R>
class fp8_meta {
  static_assert(Fp8Recipe<R>,
                "tessera::train::fp8_meta: the recipe must be "
                "tessera::train::current_scaling or tessera::train::delayed_scaling.");

public:
  using recipe_type = R;

  /// True when scale() needs the amax of the tensor about to be quantized (current scaling);
  /// false when it uses the recorded history and ignores its argument (delayed scaling).
  static constexpr bool needs_current_amax = std::is_same_v<R, current_scaling>;

  /// Throws value_error for history_len < 1, an amax_algo that is not one of the enumerators, or
  /// a margin outside [0, 64] (2^64 is far past any fp8 range; a negative margin would push the
  /// scaled amax past max_finite).
  explicit fp8_meta(const R& recipe = {}) : recipe_(recipe) {
    if (recipe_.margin < 0 || recipe_.margin > 64)
      throw value_error("tessera::train::fp8_meta: margin " + std::to_string(recipe_.margin) +
                        " is outside [0, 64]");
    if constexpr (!needs_current_amax) {
      if (recipe_.amax_algo != amax_algorithm::max &&
          recipe_.amax_algo != amax_algorithm::most_recent)
        throw value_error("tessera::train::fp8_meta: delayed_scaling amax_algo " +
                          std::to_string(static_cast<int>(recipe_.amax_algo)) +
                          " is neither amax_algorithm::max nor amax_algorithm::most_recent");
      if (recipe_.history_len < 1)
        throw value_error("tessera::train::fp8_meta: delayed_scaling history_len must be >= 1, "
                          "got " +
                          std::to_string(recipe_.history_len));
      history_.assign(static_cast<std::size_t>(recipe_.history_len), 0.f);
    }
  }

  /// The scale for precision P: max_finite(P) / amax / 2^margin, where amax is
  ///  - current scaling: `current_amax` if usable, else the last usable amax passed to record();
  ///  - delayed scaling: the history's max (or most recent entry) as of the last record(), if
  ///    usable, else the amax the previous scale came from. `current_amax` is ignored.
  /// 1 when no usable amax was ever seen. "Usable": positive, finite, and not so small that the
  /// scale overflows float.
  template <Fp8Precision P>
  float scale(float current_amax = 0.f) const noexcept {
    float a = scale_amax_;
    if constexpr (needs_current_amax) {
      if (detail::usable_amax(current_amax)) a = current_amax;
    }
    return a > 0.f ? ::tessera::scale_for_amax<P>(a, recipe_.margin, 1.f) : 1.f;
  }

  /// Records the amax of the tensor just quantized (may be zero, inf or NaN; such values are
  /// stored but never become the scale's amax).
  ///  - current scaling: remembers amax, if usable, as the fallback for an unusable amax later.
  ///  - delayed scaling: pushes amax into the history (dropping the oldest entry when full),
  ///    reduces the history (max or most recent) and, if the result is usable, makes it the
  ///    amax of the scale the next scale() returns. With max, an inf or NaN in the history makes
  ///    the reduction unusable, so the scale holds until that entry leaves the history
  ///    (Transformer Engine behaves the same way).
  ///
  /// While records are deferred (defer_records(true)), record() only keeps the largest amax
  /// recorded since the last commit(), and the history and the scale do not change.
  void record(float amax) {
    if (deferred_) {
      pending_amax_ = pending_ ? detail::max_or_nan(pending_amax_, amax) : amax;
      pending_ = true;
      return;
    }
    apply(amax);
  }

  /// Deferred records, for parallel plans (parallel/fp8_sync.hpp): a rank quantizes a slice of
  /// the tensor the single process quantizes (its data share, its tensor shard, one
  /// micro-batch), so the amax to record is the maximum over the slices of one step, known only
  /// after the step. While deferred, record() keeps the running maximum of the amaxes it is
  /// given (NaN if any is NaN) as the pending amax, and the scale stays the one of the step's
  /// start; commit() then records one amax (the pending one reduced over the ranks) as one
  /// record() of the whole tensor would.
  void defer_records(bool on) noexcept { deferred_ = on; }
  /// Whether records are deferred (see defer_records).
  bool defers_records() const noexcept { return deferred_; }
  /// Whether record() was called since the last commit() while deferred.
  bool has_pending() const noexcept { return pending_; }
  /// The largest amax recorded since the last commit() (NaN if one was NaN; 0 if none).
  float pending_amax() const noexcept { return pending_ ? pending_amax_ : 0.f; }
  /// Records `amax` as a non-deferred record() does, and forgets the pending amax.
  void commit(float amax) {
    pending_ = false;
    pending_amax_ = 0.f;
    apply(amax);
  }

  /// How a current amax is agreed on: f(context, amax) returns the amax of the whole tensor
  /// given this rank's slice's (a collective over the ranks that share the tensor).
  using amax_reduction = float (*)(void* context, float amax);
  /// Current scaling under a parallel plan (parallel/fp8_sync.hpp installs it): a rank measures
  /// only its slice of the tensor the single process quantizes, so current_amax() passes the
  /// slice's amax through `f` to get the whole tensor's and every rank quantizes with the
  /// single process's scale. `f` null (the default): the slice's own amax. Ignored by delayed
  /// scaling, whose scale never reads a current amax. `context` must outlive the state's use.
  void reduce_current_amax_with(amax_reduction f, void* context) noexcept {
    reduce_ = f;
    reduce_context_ = context;
  }
  /// The amax to pass to scale() for a tensor whose own (this rank's) amax is `local`: `local`,
  /// or with a reduction installed the reduction's result (see reduce_current_amax_with).
  float current_amax(float local) const {
    return reduce_ ? reduce_(reduce_context_, local) : local;
  }

private:
  void apply(float amax) {
    if constexpr (needs_current_amax) {
      if (detail::usable_amax(amax)) scale_amax_ = amax;
    } else {
      history_[next_] = amax;
      next_ = (next_ + 1) % history_.size();
      if (filled_ < history_.size()) ++filled_;
      const float reduced = reduce_history();
      if (detail::usable_amax(reduced)) scale_amax_ = reduced;
    }
  }

public:
  /// The recipe this state follows.
  const R& recipe() const noexcept { return recipe_; }
  /// The amax the current scale derives from; 0 when none was usable yet (scale 1).
  float scale_amax() const noexcept { return scale_amax_; }
  /// How many amaxes were recorded, at most history_len (always 0 for current scaling).
  std::size_t history_size() const noexcept { return filled_; }
  /// The recorded amaxes, oldest first (empty for current scaling).
  std::vector<float> history() const {
    std::vector<float> h;
    h.reserve(filled_);
    const std::size_t n = history_.size();
    for (std::size_t k = 0; k < filled_; ++k) h.push_back(history_[(next_ + n - filled_ + k) % n]);
    return h;
  }

  /// Replaces the state with the given history (oldest first, at most history_len entries) and
  /// scale amax, as saved from history() and scale_amax() (checkpoints use this), forgetting any
  /// pending amax (defer_records). Throws
  /// value_error, changing nothing, for too long a history, a history given to current scaling,
  /// or a scale amax that is neither 0 nor usable.
  void restore(const std::vector<float>& history_oldest_first, float scale_amax) {
    const std::size_t cap = needs_current_amax ? 0 : history_.size();
    if (history_oldest_first.size() > cap)
      throw value_error(
          "tessera::train::fp8_meta::restore: " + std::to_string(history_oldest_first.size()) +
          " history entries given, the recipe keeps at most " + std::to_string(cap));
    if (scale_amax != 0.f && !detail::usable_amax(scale_amax))
      throw value_error("tessera::train::fp8_meta::restore: scale amax " +
                        std::to_string(scale_amax) + " is neither 0 nor a usable amax");
    if constexpr (!needs_current_amax) {
      std::fill(history_.begin(), history_.end(), 0.f);
      for (std::size_t k = 0; k < history_oldest_first.size(); ++k)
        history_[k] = history_oldest_first[k];
      filled_ = history_oldest_first.size();
      next_ = filled_ % history_.size();
    }
    scale_amax_ = scale_amax;
    pending_ = false;
    pending_amax_ = 0.f;
  }

private:
  /// The history reduced by the recipe's algorithm; NaN if max meets a NaN (a NaN never
  /// compares greater, so it is checked explicitly).
  float reduce_history() const noexcept {
    if (filled_ == 0) return 0.f;
    const std::size_t n = history_.size();
    if (recipe_.amax_algo == amax_algorithm::most_recent) return history_[(next_ + n - 1) % n];
    float m = 0.f;
    for (std::size_t k = 0; k < filled_; ++k) {
      const float a = history_[(next_ + n - filled_ + k) % n];
      if (std::isnan(a)) return a;
      m = a > m ? a : m;
    }
    return m;
  }

  R recipe_;
  std::vector<float> history_;      // ring buffer of history_len entries (delayed scaling only)
  std::size_t next_ = 0;            // where the next record() writes
  std::size_t filled_ = 0;          // entries recorded so far, at most history_len
  float scale_amax_ = 0.f;          // the amax the current scale derives from; 0: none yet
  bool deferred_ = false;           // record() only updates the pending amax (defer_records)
  bool pending_ = false;            // record() was called since the last commit()
  float pending_amax_ = 0.f;        // the largest amax recorded since (NaN if one was)
  amax_reduction reduce_ = nullptr; // current scaling under a plan (reduce_current_amax_with)
  void* reduce_context_ = nullptr;
};

template <class T>
struct is_fp8_meta : std::false_type {};
template <class R>
struct is_fp8_meta<fp8_meta<R>> : std::true_type {};

} // namespace tessera::train
