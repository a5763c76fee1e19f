#pragma once
/// \file config/macros.hpp
/// tessera's macros. Everything that runs inside a kernel is marked TESSERA_INLINE so it is
/// callable from every Kokkos execution space (host and device).

#include <Kokkos_Macros.hpp>

#define TESSERA_INLINE KOKKOS_INLINE_FUNCTION
#define TESSERA_FORCEINLINE KOKKOS_FORCEINLINE_FUNCTION

#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0

// Host-only SIMD code (xsimd, intrinsics) is compiled only where the host compiler sees it:
// not in a device compilation pass.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
#define TESSERA_DEVICE_PASS 1
#else
#define TESSERA_DEVICE_PASS 0
#endif
