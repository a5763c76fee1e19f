#pragma once
/// \file train/detail/optimizer_state.hpp
/// The state every optimizer keeps: a step counter and, per parameter, a fixed number of fp32
/// buffers ("slots": SGD's momentum buffer, AdamW's first and second moments) of the
/// parameter's size. Private: reached through an optimizer's `state` member. Also the walk over
/// a parameter sequence every optimizer, scaler and checkpoint uses, public as
/// train::for_each_parameter and train::count_parameters (end of the file).

#include <tessera/config/error.hpp>
#include <tessera/train/parameter.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/concept/foldable.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>

#include <array>
#include <cstdint>
#include <ranges>
#include <string>
#include <type_traits>
#include <vector>

namespace tessera::train::detail {

/// Calls f(p, k) for the k-th parameter of a parameter sequence, checking at compile time that
/// every element is one. A parameter sequence is a Hana sequence whose elements are parameters or
/// parameter sequences, or a range (e.g. std::vector) of parameter sequences: a model with a
/// run-time number of identical blocks returns its blocks' parameter tuples in a std::vector.
/// The parameters are numbered in that nesting order, depth first.
template <class Params, class F>
void for_each_parameter(const Params& params, F&& f, std::size_t& k) {
  if constexpr (nn::Parameter<Params>) {
    f(params, k);
    ++k;
  } else if constexpr (std::ranges::range<Params>) {
    for (const auto& e : params) for_each_parameter(e, f, k);
  } else {
    static_assert(boost::hana::Foldable<Params>::value,
                  "tessera::train: every element of the parameter sequence must be a "
                  "tessera::nn::parameter (what a model's parameters() returns), a Hana sequence "
                  "of them or a range of such sequences.");
    boost::hana::for_each(params, [&](const auto& p) { for_each_parameter(p, f, k); });
  }
}
template <class Params, class F>
void for_each_parameter(const Params& params, F&& f) {
  std::size_t k = 0;
  for_each_parameter(params, f, k);
}

/// The number of parameters when it is known at compile time (a Hana sequence of parameters
/// only), else 0 with `known` false.
template <class Params>
struct static_parameter_count {
  static constexpr bool known = false;
  static constexpr std::size_t value = 0;
};
template <class... P>
requires(nn::Parameter<P>&&...) struct static_parameter_count<boost::hana::tuple<P...>> {
  static constexpr bool known = true;
  static constexpr std::size_t value = sizeof...(P);
};

template <class Params>
std::size_t count_parameters(const Params& params) {
  std::size_t n = 0;
  for_each_parameter(params, [&](const auto&, std::size_t) { ++n; });
  return n;
}

/// Throws value_error if two parameters share a name (checkpoints address them by name).
template <class Params>
void require_unique_names(const char* who, const Params& params) {
  std::vector<std::string> names;
  for_each_parameter(params, [&](const auto& p, std::size_t) {
    for (const auto& n : names)
      if (n == p.name)
        throw value_error(std::string(who) + ": two parameters are named '" + p.name +
                          "'; parameter names must be unique");
    names.push_back(p.name);
  });
}

template <class MemorySpace, std::size_t Slots>
struct optimizer_state {
  using memory_space = MemorySpace;
  using buffer_type = Kokkos::View<float*, MemorySpace>;
  static constexpr std::size_t slot_count = Slots;

  std::int64_t step = 0; ///< completed (not skipped) steps
  bool created = false;  ///< names and sizes recorded (at the first step or a checkpoint load)
  std::vector<std::string> names; ///< parameter names, in the order of the sequence
  std::vector<index_t> sizes;     ///< parameter sizes, same order
  /// slots[s][k]: buffer s of parameter k; slots[s] is empty until the optimizer allocates it.
  std::array<std::vector<buffer_type>, Slots> slots{};

  optimizer_state() = default;
  /// Copies are deep: a copied optimizer continues independently of the original (Kokkos views
  /// alone would share their buffers).
  optimizer_state(const optimizer_state& o)
      : step(o.step), created(o.created), names(o.names), sizes(o.sizes) {
    for (std::size_t s = 0; s < Slots; ++s)
      for (const auto& b : o.slots[s]) {
        buffer_type c(Kokkos::view_alloc(Kokkos::WithoutInitializing, b.label()), b.extent(0));
        Kokkos::deep_copy(c, b);
        slots[s].push_back(c);
      }
  }
  optimizer_state& operator=(const optimizer_state& o) {
    if (this != &o) *this = optimizer_state(o);
    return *this;
  }
  optimizer_state(optimizer_state&&) noexcept = default;
  optimizer_state& operator=(optimizer_state&&) noexcept = default;
  ~optimizer_state() = default;

  /// On the first call records the parameters' names and sizes; afterwards checks that the
  /// same parameters (count, names, sizes) are passed, throwing shape_error naming `who`.
  template <class Params>
  void bind(const char* who, const Params& params) {
    if (created) return check_same(who, params);
    require_unique_names(who, params);
    for_each_parameter(params, [&](const auto& p, std::size_t) {
      names.push_back(p.name);
      sizes.push_back(p.size());
    });
    created = true;
  }

  /// Throws shape_error naming `who` unless params are the parameters the state was created
  /// for (count, names, sizes, in order).
  template <class Params>
  void check_same(const char* who, const Params& params) const {
    const std::size_t n = count_parameters(params);
    if (n != names.size())
      throw shape_error(std::string(who) + ": the optimizer state was created for " +
                        std::to_string(names.size()) + " parameters, but " + std::to_string(n) +
                        " were passed; pass the same parameters at every step");
    for_each_parameter(params, [&](const auto& p, std::size_t k) {
      if (p.name != names[k] || p.size() != sizes[k])
        throw shape_error(std::string(who) + ": parameter " + std::to_string(k) + " is '" + p.name +
                          "' with " + std::to_string(p.size()) +
                          " elements, but the optimizer state was created for '" + names[k] +
                          "' with " + std::to_string(sizes[k]) +
                          "; pass the same parameters at every step");
    });
  }

  /// Allocates slot s for every parameter (zero-filled) if it is not allocated yet; returns
  /// true if it allocated (the slot's first use).
  bool ensure_slot(std::size_t s, const char* label) {
    if (!slots[s].empty() || sizes.empty()) return false;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      slots[s].emplace_back(names[k] + "." + label, static_cast<std::size_t>(sizes[k]));
    return true;
  }
};

/// Checks at compile time that an execution space can run kernels on parameters and state.
template <class Exec, class MemorySpace>
constexpr void require_accessible() {
  static_assert(Kokkos::SpaceAccessibility<Exec, MemorySpace>::accessible,
                "tessera::train: the execution space cannot access the memory space of the "
                "optimizer state / parameters.");
}

} // namespace tessera::train::detail

namespace tessera::train {
/// Public: walks a parameter sequence (a Hana sequence or a range of them) as optimizers do.
using detail::count_parameters;
using detail::for_each_parameter;
} // namespace tessera::train
