#pragma once
/// \file gemm/detail/amx_emulation.hpp
/// TEST ONLY: a software model of the AMX tile instructions the AMX micro-kernel (amx.hpp) uses
/// (LDTILECFG, TILERELEASE, TILEZERO, TILELOADD, TILESTORED, TDPBF16PS), so that the kernel's
/// packing, tile configuration and indexing run end to end on a machine without AMX. Selected
/// by defining TESSERA_GEMM_AMX_EMULATE (tests/gemm/CMakeLists.txt: test_gemm_amx_emulated);
/// never in a library build, and never where the real instructions are compiled.
///
/// Semantics follow the Intel SDM (vol. 2B, TDPBF16PS; ISE, "Intel AMX"): 8 tile registers of up
/// to 16 rows x 64 bytes, each with the rows and bytes per row of the loaded palette-1
/// configuration; TDPBF16PS computes, for m < dst.rows, k < a.colsb / 4, n < dst.colsb / 4,
///   dst[m][n] += a[m].bf16[2k] * b[k].bf16[2n] + a[m].bf16[2k + 1] * b[k].bf16[2n + 1]
/// in fp32 (the products of bf16 values are exact in fp32; the hardware's flush of denormals and
/// its single rounding of the pair are not modelled: the tests' fp32 error bound covers both).
/// Shape rules the hardware faults on (an unconfigured tile, a.colsb / 4 != b.rows, dst.rows
/// != a.rows, dst.colsb != b.colsb) are checked and throw, so that an indexing error of the
/// kernel fails its test instead of computing something else.
/// The tile registers are per thread, as in hardware: one thread_local register file (the only
/// mutable state, and only in this test-only emulation).

#include <tessera/config/bit_cast.hpp>
#include <tessera/config/error.hpp>

#include <cstdint>
#include <cstring>
#include <string>

namespace tessera::detail::hostgemm::amx_emulation {

struct tile_file {
  alignas(64) std::uint8_t data[8][16][64] = {};
  std::uint8_t rows[8] = {};
  std::uint16_t colsb[8] = {};
  bool configured = false;
};

inline tile_file& tiles() {
  thread_local tile_file f;
  return f;
}

[[noreturn]] inline void fault(const std::string& what) {
  throw value_error("AMX emulation: " + what);
}

inline void check_tile(int t) {
  const tile_file& f = tiles();
  if (!f.configured) fault("tile instruction without a loaded configuration");
  if (t < 0 || t > 7 || f.rows[t] == 0 || f.colsb[t] == 0)
    fault("tile " + std::to_string(t) + " is not configured");
}

/// LDTILECFG of a 64-byte palette-1 configuration (the layout of amx_kernel::tile_config).
inline void loadconfig(const void* cfg) {
  const auto* p = static_cast<const std::uint8_t*>(cfg);
  tile_file& f = tiles();
  if (p[0] != 1) fault("palette " + std::to_string(p[0]) + " (only palette 1 exists)");
  for (int t = 0; t < 8; ++t) {
    std::uint16_t cb = 0;
    std::memcpy(&cb, p + 16 + 2 * t, 2);
    f.rows[t] = p[48 + t];
    f.colsb[t] = cb;
    if (f.rows[t] > 16 || f.colsb[t] > 64) fault("tile " + std::to_string(t) + " exceeds 16 x 64");
  }
  f.configured = true;
}

inline void release() {
  tiles() = tile_file{};
}

inline void zero(int t) {
  check_tile(t);
  std::memset(tiles().data[t], 0, sizeof(tiles().data[t]));
}

inline void loadd(int t, const void* base, long stride) {
  check_tile(t);
  tile_file& f = tiles();
  for (int r = 0; r < f.rows[t]; ++r)
    std::memcpy(f.data[t][r], static_cast<const std::uint8_t*>(base) + r * stride, f.colsb[t]);
}

inline void stored(int t, void* base, long stride) {
  check_tile(t);
  tile_file& f = tiles();
  for (int r = 0; r < f.rows[t]; ++r)
    std::memcpy(static_cast<std::uint8_t*>(base) + r * stride, f.data[t][r], f.colsb[t]);
}

inline float bf16_at(const std::uint8_t* row, int i) {
  std::uint16_t h = 0;
  std::memcpy(&h, row + 2 * i, 2);
  return bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline void dpbf16ps(int dst, int a, int b) {
  check_tile(dst);
  check_tile(a);
  check_tile(b);
  tile_file& f = tiles();
  if (f.colsb[a] / 4 != f.rows[b] || f.rows[dst] != f.rows[a] || f.colsb[dst] != f.colsb[b])
    fault("TDPBF16PS shapes: dst " + std::to_string(f.rows[dst]) + " x " +
          std::to_string(f.colsb[dst]) + " B, a " + std::to_string(f.rows[a]) + " x " +
          std::to_string(f.colsb[a]) + " B, b " + std::to_string(f.rows[b]) + " x " +
          std::to_string(f.colsb[b]) + " B");
  if (dst == a || dst == b || a == b) fault("TDPBF16PS with repeated tile registers");
  for (int m = 0; m < f.rows[dst]; ++m)
    for (int n = 0; n < f.colsb[dst] / 4; ++n) {
      float acc = 0.f;
      std::memcpy(&acc, f.data[dst][m] + 4 * n, 4);
      for (int k = 0; k < f.colsb[a] / 4; ++k) {
        acc += bf16_at(f.data[a][m], 2 * k) * bf16_at(f.data[b][k], 2 * n);
        acc += bf16_at(f.data[a][m], 2 * k + 1) * bf16_at(f.data[b][k], 2 * n + 1);
      }
      std::memcpy(f.data[dst][m] + 4 * n, &acc, 4);
    }
}

} // namespace tessera::detail::hostgemm::amx_emulation
