#pragma once
/// \file gemm.hpp
/// Entry header of gemm/: tessera::gemm and its options and epilogues.

#include <tessera/gemm/gemm.hpp>
