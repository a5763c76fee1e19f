#pragma once
/// \file config.hpp
/// Entry header of config/: macros, bit_cast, exceptions, CPU feature detection, Kokkos
/// version differences and host-space detection.

#include <tessera/config/bit_cast.hpp>
#include <tessera/config/cpu.hpp>
#include <tessera/config/error.hpp>
#include <tessera/config/kokkos_compat.hpp>
#include <tessera/config/macros.hpp>
