#pragma once
/// \file precision.hpp
/// Entry header of precision/: tags, traits, storage types and scalar conversions. Light: it
/// includes neither Kokkos_Core nor xsimd.
///
/// The vectorised host conversions of many elements (tessera::convert_n, xsimd and F16C) are in
/// <tessera/precision/vector_convert.hpp>, which includes xsimd; code that needs them includes
/// that header (tessera/tensor.hpp does, for deep_copy between precisions).

#include <tessera/precision/convert.hpp>
#include <tessera/precision/policies.hpp>
#include <tessera/precision/storage.hpp>
#include <tessera/precision/traits.hpp>
