#pragma once
// Kokkos set up once for the fuzz targets that run kernels (checkpoint, conv_gemm).
#include <tessera/config/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstdlib>

namespace tessera::fuzz {

/// Kokkos on one thread with its warnings off, finalised at exit: one execution of a target is
/// microseconds of work, so threads only add noise. Kokkos 4 replaced InitArguments by
/// InitializationSettings.
inline void initialize_kokkos() {
#if TESSERA_KOKKOS_4
  Kokkos::initialize(
      Kokkos::InitializationSettings().set_num_threads(1).set_disable_warnings(true));
#else
  Kokkos::InitArguments args;
  args.num_threads = 1;
  args.disable_warnings = true;
  Kokkos::initialize(args);
#endif
  std::atexit([] { Kokkos::finalize(); });
}

} // namespace tessera::fuzz
