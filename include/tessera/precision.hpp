#pragma once
/// \file precision.hpp
/// Entry header of precision/: tags, traits, storage types, scalar and vector conversions.

#include <tessera/precision/convert.hpp>
#include <tessera/precision/policies.hpp>
#include <tessera/precision/storage.hpp>
#include <tessera/precision/traits.hpp>
#include <tessera/precision/vector_convert.hpp>
