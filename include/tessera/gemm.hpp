#pragma once
/// \file gemm.hpp
/// Entry header of gemm/: tessera::gemm, gemm_batched, their options, algorithm tags and
/// epilogues (see gemm/gemm.hpp for the whole API with examples).

#include <tessera/gemm/epilogue.hpp>
#include <tessera/gemm/gemm.hpp>
#include <tessera/gemm/options.hpp>
