#pragma once
/// \file tensor.hpp
/// Entry header of tensor/: extents, layouts, Tensor, TensorView, operations, scaled fp8.

#include <tessera/precision.hpp>
#include <tessera/tensor/extents.hpp>
#include <tessera/tensor/layout.hpp>
#include <tessera/tensor/ops.hpp>
#include <tessera/tensor/overlap.hpp>
#include <tessera/tensor/random.hpp>
#include <tessera/tensor/scaled_tensor.hpp>
#include <tessera/tensor/tensor.hpp>
#include <tessera/tensor/tensor_view.hpp>
