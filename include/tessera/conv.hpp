#pragma once
/// \file conv.hpp
/// Entry header of conv/: conv2d_params, conv2d_workspace, im2col / col2im, and the 2-D
/// convolution passes conv2d_forward, conv2d_backward_data, conv2d_backward_weight.

#include <tessera/conv/conv2d.hpp>
#include <tessera/conv/im2col.hpp>
#include <tessera/conv/params.hpp>
#include <tessera/conv/workspace.hpp>
