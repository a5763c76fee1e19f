#pragma once
/// \file train/parameter.hpp
/// tessera::train::parameter (also spelled tessera::nn::parameter): one trainable tensor — its fp32
/// master value and its fp32 gradient, of the same static shape, plus a name ("conv1.weight") used
/// by checkpoints.
///
/// A parameter is a handle: copying it shares the value and gradient storage (they are Kokkos
/// Views underneath), so a model's `parameters()` returns a boost::hana::tuple of parameters by
/// value and optimizers, loss scalers, checkpoints and parallel plans walk that tuple with
/// `boost::hana::for_each` without knowing the layers:
///
///   boost::hana::for_each(model.parameters(), [&](const auto& p) {
///     // p.name, p.value (Tensor<fp32, Ext>), p.grad (Tensor<fp32, Ext>), p.size()
///   });
///
/// The compute-precision copy a bf16 or fp8 layer multiplies with is not a parameter: layers
/// cast it from `value` when they run forward, so the master is the single source of truth.
///
/// It lives in train/ because train/ sits below nn/: optimizers, loss scalers, fp8 recipes and
/// checkpoints know parameters and precisions, never layers, and nn/'s layers are built on
/// them (docs/architecture.md, "Layers"). The nn:: names at the end keep the spelling layers
/// and users have always written.

#include <tessera/tensor.hpp>

#include <boost/hana/core/is_a.hpp>
#include <boost/hana/ext/std/integral_constant.hpp>

#include <string>
#include <type_traits>

namespace tessera::train {

template <class Ext, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct parameter {
  using extents_type = Ext;
  using memory_space = MemorySpace;
  using tensor_type = Tensor<fp32, Ext, layout_right, MemorySpace>;

  std::string name;  ///< unique within a model, e.g. "2.weight"
  tensor_type value; ///< fp32 master weights
  tensor_type grad;  ///< fp32 gradient; backward accumulates into it, zero_grad clears it

  parameter() = default;

  /// Allocates a zero value and a zero gradient of the given extents.
  parameter(std::string n, const Ext& e)
      : name(std::move(n)), value(name, e), grad(name + ".grad", e) {}

  index_t size() const noexcept { return value.size(); }
};

template <class T>
struct is_parameter : std::false_type {};
template <class E, class M>
struct is_parameter<parameter<E, M>> : std::true_type {};

/// Anything optimizers and checkpoints accept as one parameter.
template <class T>
concept Parameter = is_parameter<std::remove_cvref_t<T>>::value;

} // namespace tessera::train

namespace tessera::nn {
using train::is_parameter;
using train::parameter;
using train::Parameter;
} // namespace tessera::nn
