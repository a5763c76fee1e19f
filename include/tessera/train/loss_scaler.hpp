#pragma once
/// \file train/loss_scaler.hpp
/// Loss scaling for low-precision backward passes: the loss (its gradient) is multiplied by
/// scale() before backward so small gradients stay representable, and the gradients are divided
/// by it again before the optimizer step.
///
///   bool finite = scaler.unscale_and_check(exec, params); // grads *= 1/scale, all finite?
///   if (finite) opt.step(exec, params);                   // or: train::step(...), step.hpp
///   scaler.update(finite);                                // dynamic: back off / grow
///
/// - `static_scaler{s}`: a fixed scale (1 = no scaling, still checks for inf/NaN).
/// - `dynamic_scaler<Policy>`: PyTorch's torch.cuda.amp.GradScaler rules. Start at init_scale
///   (2^16); after an overflowing step the scale is multiplied by backoff_factor (0.5), after
///   growth_interval (2000) consecutive clean steps by growth_factor (2); never above max_scale
///   (2^127, the largest power of two a float holds) or below min_scale (1 by default, as
///   Megatron-LM's and DeepSpeed's min_loss_scale). An overflow resets the clean-step count.
/// - Policies decide when an overflow backs off: `torch_policy` at every overflow (PyTorch);
///   `hysteresis_policy<N>` only at the N-th consecutive overflow and each one after it until a
///   clean step (DeepSpeed's consecutive_hysteresis = true), or with
///   `hysteresis_policy<N, hysteresis_reset::on_growth>` until the next growth (Megatron-LM's
///   DynamicGradScaler and DeepSpeed's default).

#include <tessera/config/bit_cast.hpp>
#include <tessera/tensor/scaled_tensor.hpp> // detail::valid_scale
#include <tessera/train/detail/optimizer_state.hpp>

#include <boost/hana/length.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace tessera::train {

namespace detail {
/// A rank-1 View read as v[k], converted to T (an address stored as an integer to a pointer).
template <class View, class T>
struct indexed_view {
  View v;
  KOKKOS_INLINE_FUNCTION T operator[](std::size_t k) const {
    if constexpr (std::is_pointer_v<T>)
      return reinterpret_cast<T>(v(k));
    else
      return static_cast<T>(v(k));
  }
};

/// The kernel of unscale_and_check over chunks [0, chunks): ptr, size and first_chunk are
/// indexable on Exec (Kokkos::Array for a compile-time parameter count, Views otherwise).
template <class Exec, class Ptr, class Size, class First>
bool unscale_chunks(const Exec& exec, const Ptr& ptr, const Size& size, const First& first_chunk,
                    index_t chunks, index_t chunk, float inv_scale) {
  const float s = inv_scale;
  const bool only_check = inv_scale == 1.f;
  int bad = 0;
  Kokkos::parallel_reduce(
      "tessera::train::unscale_and_check", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(const index_t c, int& b) {
        std::size_t k = 0;
        while (c >= first_chunk[k + 1]) ++k;
        float* g = ptr[k];
        const index_t begin = (c - first_chunk[k]) * chunk;
        const index_t end = begin + chunk < size[k] ? begin + chunk : size[k];
        // Non-finite <=> all exponent bits set (inf or NaN), tested on the bits so that
        // fast-math flags cannot fold the test away.
        std::uint32_t any = 0;
        if (only_check) {
          for (index_t i = begin; i < end; ++i)
            any |=
                ((::tessera::detail::bit_cast<std::uint32_t>(g[i]) & 0x7f800000u) == 0x7f800000u);
        } else {
          for (index_t i = begin; i < end; ++i) {
            const float v = g[i] * s;
            g[i] = v;
            any |= ((::tessera::detail::bit_cast<std::uint32_t>(v) & 0x7f800000u) == 0x7f800000u);
          }
        }
        b |= static_cast<int>(any);
      },
      Kokkos::BOr<int>(bad));
  return bad == 0;
}

/// grads *= inv_scale in place for every parameter (only checked when inv_scale is 1) and
/// whether every result is finite: one kernel and one reduction over all the parameters. The
/// work is cut into chunks that never straddle two parameters, so each work item runs a plain
/// (vectorisable) loop over one contiguous range. A parameter sequence of run-time length (a
/// range of block tuples, optimizer_state.hpp) passes its pointers through small Views.
template <class Exec, class Params>
bool unscale_and_check(const Exec& exec, const Params& params, float inv_scale) {
  // 2048 floats (8 KiB) per work item: long enough to vectorise and amortise finding the
  // parameter, short enough to spread a 100k-element tensor over many threads.
  constexpr index_t chunk = 2048;
  const auto check_space = [](const auto& p) {
    static_assert(Kokkos::SpaceAccessibility<
                      Exec, typename std::remove_cvref_t<decltype(p)>::memory_space>::accessible,
                  "tessera::train::unscale_and_check: the execution space cannot access the "
                  "parameters' memory space.");
  };
  if constexpr (static_parameter_count<Params>::known) {
    constexpr std::size_t n = static_parameter_count<Params>::value;
    if constexpr (n == 0) {
      return true;
    } else {
      Kokkos::Array<float*, n> ptr{};
      Kokkos::Array<index_t, n> size{};
      Kokkos::Array<index_t, n + 1> first_chunk{};
      for_each_parameter(params, [&](const auto& p, std::size_t k) {
        check_space(p);
        ptr[k] = p.grad.data();
        size[k] = p.size();
        first_chunk[k + 1] = first_chunk[k] + (size[k] + chunk - 1) / chunk;
      });
      return unscale_chunks(exec, ptr, size, first_chunk, first_chunk[n], chunk, inv_scale);
    }
  } else {
    const std::size_t n = count_parameters(params);
    if (n == 0) return true;
    using mem = typename Exec::memory_space;
    Kokkos::View<std::uintptr_t*, mem> ptr("tessera::train::unscale_and_check.ptr", n);
    Kokkos::View<index_t*, mem> size("tessera::train::unscale_and_check.size", n);
    Kokkos::View<index_t*, mem> first("tessera::train::unscale_and_check.first", n + 1);
    const auto hptr = Kokkos::create_mirror_view(ptr);
    const auto hsize = Kokkos::create_mirror_view(size);
    const auto hfirst = Kokkos::create_mirror_view(first);
    hfirst(0) = 0;
    for_each_parameter(params, [&](const auto& p, std::size_t k) {
      check_space(p);
      hptr(k) = reinterpret_cast<std::uintptr_t>(p.grad.data());
      hsize(k) = p.size();
      hfirst(k + 1) = hfirst(k) + (hsize(k) + chunk - 1) / chunk;
    });
    Kokkos::deep_copy(ptr, hptr);
    Kokkos::deep_copy(size, hsize);
    Kokkos::deep_copy(first, hfirst);
    const indexed_view<decltype(ptr), float*> as_ptr{ptr};
    const indexed_view<decltype(size), index_t> as_size{size};
    const indexed_view<decltype(first), index_t> as_first{first};
    return unscale_chunks(exec, as_ptr, as_size, as_first, hfirst(n), chunk, inv_scale);
  }
}

/// A loss scale (and the floor and ceiling of a dynamic one) obeys the rule of every scale in
/// tessera (tessera::detail::valid_scale: positive, finite, normal, so that 1 / scale, which
/// unscaling multiplies by, is finite). 0, negative values, NaN, +-inf and subnormals are
/// refused with value_error.
inline void require_valid_scale(const char* who, float s) {
  if (!::tessera::detail::valid_scale(s))
    throw value_error(std::string(who) +
                      ": the loss scale must be positive, finite and normal (>= 2^-126), got " +
                      std::to_string(s));
}
} // namespace detail

/// A fixed loss scale. update() does nothing; a non-finite gradient still skips the step.
class static_scaler {
public:
  /// Throws value_error unless scale is positive and finite.
  explicit static_scaler(float scale = 1.f) : scale_(scale) {
    detail::require_valid_scale("tessera::train::static_scaler", scale);
  }
  /// The factor the loss is multiplied by.
  float scale() const noexcept { return scale_; }
  /// Divides every gradient by scale() in place (a multiplication by the float 1 / scale; exact
  /// for a power of two) and returns true if all of them are finite. One kernel, one reduction.
  template <class Exec, class Params>
  bool unscale_and_check(const Exec& exec, const Params& params) const {
    return detail::unscale_and_check(exec, params, static_cast<float>(1.0 / scale_));
  }
  /// Nothing to update.
  void update(bool /*finite*/) noexcept {}
  /// Replaces the scale (checkpoints). Throws value_error unless positive and finite.
  void restore(float scale) {
    detail::require_valid_scale("tessera::train::static_scaler::restore", scale);
    scale_ = scale;
  }

private:
  float scale_;
};

/// Backs off at every overflow (PyTorch's GradScaler).
struct torch_policy {
  static constexpr const char* name = "torch";
  /// Called at an overflow; true: back off now.
  constexpr bool on_overflow() noexcept { return true; }
  constexpr void on_clean_step() noexcept {}
  constexpr void on_growth() noexcept {}
  /// The policy's state (checkpoints): none.
  constexpr std::int64_t state() const noexcept { return 0; }
  /// Restores state(); false (and no change) if the value is not a valid state.
  constexpr bool restore(std::int64_t s) noexcept { return s == 0; }
};

/// When a hysteresis policy refills its overflow budget.
enum class hysteresis_reset {
  on_clean_step, ///< any clean step (DeepSpeed consecutive_hysteresis = true): N consecutive
  on_growth      ///< only when the scale grows (Megatron-LM, DeepSpeed's default)
};

/// Backs off only at the N-th overflow since the budget was last refilled, and at every overflow
/// after that until it is refilled (Megatron-LM / DeepSpeed "hysteresis").
template <int N, hysteresis_reset Reset = hysteresis_reset::on_clean_step>
struct hysteresis_policy {
  static_assert(N >= 1, "tessera::train::hysteresis_policy<N>: N (overflows tolerated before "
                        "backing off, counting the one that backs off) must be >= 1.");
  static constexpr const char* name =
      Reset == hysteresis_reset::on_clean_step ? "hysteresis_consecutive" : "hysteresis_growth";
  static constexpr int hysteresis = N;

  std::int64_t remaining = N; ///< overflows left before backing off, in [1, N]

  constexpr bool on_overflow() noexcept {
    if (remaining <= 1) return true;
    --remaining;
    return false;
  }
  constexpr void on_clean_step() noexcept {
    if constexpr (Reset == hysteresis_reset::on_clean_step) remaining = N;
  }
  constexpr void on_growth() noexcept { remaining = N; }
  constexpr std::int64_t state() const noexcept { return remaining; }
  constexpr bool restore(std::int64_t s) noexcept {
    if (s < 1 || s > N) return false;
    remaining = s;
    return true;
  }
};

/// Settings of dynamic_scaler; defaults are PyTorch GradScaler's, the floor Megatron-LM's.
struct dynamic_scaler_config {
  float init_scale = 65536.f;          ///< 2^16
  float growth_factor = 2.f;           ///< > 1
  float backoff_factor = 0.5f;         ///< in (0, 1)
  std::int64_t growth_interval = 2000; ///< clean steps between growths (>= 1)
  float min_scale = 1.f;               ///< floor of the scale (> 0)
  float max_scale = 0x1p127f;          ///< ceiling: 2^127, the largest finite power of two
};

/// A loss scale that backs off after overflows and grows after runs of clean steps.
template <class Policy = torch_policy>
class dynamic_scaler {
public:
  using policy_type = Policy;

  /// Throws value_error for an inconsistent configuration (naming the field and the rule).
  explicit dynamic_scaler(const dynamic_scaler_config& c = {}) : cfg_(c), scale_(c.init_scale) {
    const auto bad = [](const std::string& what) {
      throw value_error("tessera::train::dynamic_scaler: " + what);
    };
    detail::require_valid_scale("tessera::train::dynamic_scaler (min_scale)", c.min_scale);
    detail::require_valid_scale("tessera::train::dynamic_scaler (max_scale)", c.max_scale);
    if (!(c.min_scale <= c.max_scale))
      bad("min_scale " + std::to_string(c.min_scale) + " exceeds max_scale " +
          std::to_string(c.max_scale));
    if (!(c.init_scale >= c.min_scale && c.init_scale <= c.max_scale))
      bad("init_scale " + std::to_string(c.init_scale) + " is outside [min_scale, max_scale]");
    if (!(c.growth_factor > 1.f) || !std::isfinite(c.growth_factor))
      bad("growth_factor must be finite and > 1, got " + std::to_string(c.growth_factor));
    if (!(c.backoff_factor > 0.f && c.backoff_factor < 1.f))
      bad("backoff_factor must be in (0, 1), got " + std::to_string(c.backoff_factor));
    if (c.growth_interval < 1)
      bad("growth_interval must be >= 1, got " + std::to_string(c.growth_interval));
  }

  /// The factor the loss is multiplied by.
  float scale() const noexcept { return scale_; }
  /// Clean steps since the last growth or overflow.
  std::int64_t growth_tracker() const noexcept { return growth_tracker_; }
  const Policy& policy() const noexcept { return policy_; }
  const dynamic_scaler_config& config() const noexcept { return cfg_; }

  /// Divides every gradient by scale() in place (multiplies by the float 1 / scale, exact for
  /// the powers of two the default factors produce) and returns true if all are finite.
  template <class Exec, class Params>
  bool unscale_and_check(const Exec& exec, const Params& params) const {
    return detail::unscale_and_check(exec, params, static_cast<float>(1.0 / scale_));
  }

  /// After a step: `finite` is what unscale_and_check returned.
  ///  - overflow: clean-step count to 0; if the policy says so, scale = max(scale * backoff,
  ///    min_scale);
  ///  - clean: count + 1; at growth_interval, count to 0 and scale = min(scale * growth,
  ///    max_scale).
  void update(bool finite) noexcept {
    if (!finite) {
      growth_tracker_ = 0;
      if (policy_.on_overflow()) {
        const float s = scale_ * cfg_.backoff_factor;
        scale_ = s > cfg_.min_scale ? s : cfg_.min_scale;
      }
      return;
    }
    policy_.on_clean_step();
    if (++growth_tracker_ >= cfg_.growth_interval) {
      growth_tracker_ = 0;
      const float s = scale_ * cfg_.growth_factor;
      scale_ = s < cfg_.max_scale ? s : cfg_.max_scale;
      policy_.on_growth();
    }
  }

  /// Replaces the state (checkpoints). Throws value_error, changing nothing, for a scale
  /// outside [min_scale, max_scale], a growth tracker outside [0, growth_interval) or an
  /// invalid policy state.
  void restore(float scale, std::int64_t growth_tracker, std::int64_t policy_state) {
    std::string why = check_state(scale, growth_tracker, policy_state);
    if (!why.empty()) throw value_error("tessera::train::dynamic_scaler::restore: " + why);
    scale_ = scale;
    growth_tracker_ = growth_tracker;
    policy_.restore(policy_state);
  }
  /// Why restore() would refuse these values, or an empty string.
  std::string check_state(float scale, std::int64_t growth_tracker,
                          std::int64_t policy_state) const {
    if (!(scale >= cfg_.min_scale && scale <= cfg_.max_scale))
      return "scale " + std::to_string(scale) + " is outside [min_scale " +
             std::to_string(cfg_.min_scale) + ", max_scale " + std::to_string(cfg_.max_scale) + "]";
    if (growth_tracker < 0 || growth_tracker >= cfg_.growth_interval)
      return "growth tracker " + std::to_string(growth_tracker) + " is outside [0, " +
             std::to_string(cfg_.growth_interval) + ")";
    Policy probe = policy_;
    if (!probe.restore(policy_state))
      return "policy state " + std::to_string(policy_state) + " is not valid for policy '" +
             Policy::name + "'";
    return {};
  }

private:
  dynamic_scaler_config cfg_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  Policy policy_{};
};

template <class T>
struct is_loss_scaler : std::false_type {};
template <>
struct is_loss_scaler<static_scaler> : std::true_type {};
template <class P>
struct is_loss_scaler<dynamic_scaler<P>> : std::true_type {};

} // namespace tessera::train
