#pragma once
/// \file nn/parameter.hpp
/// tessera::nn::parameter, nn::Parameter, nn::is_parameter: the trainable tensors of a layer
/// (fp32 master value, fp32 gradient, name). Defined in train/parameter.hpp, one layer below
/// nn/ (train/ never includes nn/); this header is where layer code and users find them.

#include <tessera/train/parameter.hpp>
