// expect: Out must be void (the input's precision) or an unscaled precision
// LayerNorm's output precision must need no scale: fp8 output would need a per-tensor scale the
// norm does not have (quantizing is the next layer's job).
#include <tessera/nn/layernorm.hpp>

tessera::nn::LayerNorm<8, std::ratio<1, 100000>, tessera::fp8_e4m3> snippet;
