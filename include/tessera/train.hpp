#pragma once
/// \file train.hpp
/// Entry header of train/: mixed-precision training machinery — fp8 scaling recipes.

#include <tessera/train/fp8_recipe.hpp>
