#pragma once
/// \file nn/precision.hpp
/// The compute precision of a layer (a template parameter of Linear and Conv2d):
///  - tessera::fp32: everything fp32;
///  - tessera::bf16 (or any other unscaled precision, such as tessera::fp16): weights cast from
///    the fp32 masters to it each forward, activations and the gradients between layers in it,
///    GEMM/convolution accumulation fp32 (fp16's narrow range wants train::loss_scaler);
///  - tessera::nn::fp8<Recipe>: "hybrid" fp8 as in Transformer Engine: the inputs of every GEMM
///    and convolution are per-tensor scaled fp8, E4M3 for weights and activations and E5M2 for
///    gradients (train::hybrid), scales chosen by Recipe (train/fp8_recipe.hpp); activations and
///    gradients between layers are bf16 (the fp8 copies exist only as GEMM operands).
/// Masters and weight gradients are fp32 in every case.

#include <tessera/tensor.hpp>
#include <tessera/train/fp8_recipe.hpp>

#include <type_traits>

namespace tessera::nn {

/// The hybrid fp8 compute precision with a scaling recipe: train::current_scaling (the default:
/// each scale from the amax of the tensor being quantized) or train::delayed_scaling (from the
/// amax history of earlier steps; no extra pass). Each fp8 operand slot of a layer (weights,
/// input, output gradient) keeps its own train::fp8_meta<Recipe>.
template <class Recipe = train::current_scaling>
struct fp8 {
  using recipe = Recipe;
};

template <class T>
struct is_fp8_compute : std::false_type {};
template <class R>
struct is_fp8_compute<fp8<R>> : std::true_type {};

/// A compute precision: an unscaled precision (fp32, bf16, fp16: precision_traits<P>::scaled is
/// false) or nn::fp8<Recipe> (the scaled fp8 formats need a recipe for their scales).
template <class T>
concept ComputePrecision = is_fp8_compute<T>::value ||
    (Precision<T> && !precision_traits<T>::scaled);

namespace detail {
template <class Prec>
struct activation_of {
  using type = Prec;
};
template <class R>
struct activation_of<fp8<R>> {
  using type = bf16;
};
} // namespace detail

/// The precision of the activations (and of the gradients passed between layers) of a layer
/// computing in Prec: an unscaled precision -> itself (fp32, bf16, fp16), fp8<R> -> bf16.
template <class Prec>
using activation_t = typename detail::activation_of<Prec>::type;

} // namespace tessera::nn
