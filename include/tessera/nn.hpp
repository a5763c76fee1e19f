#pragma once
/// \file nn.hpp
/// Entry header of nn/: the Layer concept and the declarations parallel plans read
/// (nn/layer.hpp), layers with explicit forward and backward (Linear, Conv2d, ReLU, GELU,
/// MaxPool2d, Flatten, Input, LayerNorm, Embedding, PositionEmbedding, CausalSelfAttention,
/// Residual), the softmax cross-entropy loss, Sequential models and
/// the parameter handles optimizers walk. See docs/architecture.md.

#include <tessera/nn/activation.hpp>
#include <tessera/nn/attention.hpp>
#include <tessera/nn/conv2d.hpp>
#include <tessera/nn/embedding.hpp>
#include <tessera/nn/flatten.hpp>
#include <tessera/nn/input.hpp>
#include <tessera/nn/layer.hpp>
#include <tessera/nn/layernorm.hpp> // optional: the layer works without this line
#include <tessera/nn/linear.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/nn/parameter.hpp>
#include <tessera/nn/pooling.hpp>
#include <tessera/nn/precision.hpp>
#include <tessera/nn/recompute.hpp>
#include <tessera/nn/residual.hpp>
#include <tessera/nn/rmsnorm.hpp>
#include <tessera/nn/sequential.hpp>
