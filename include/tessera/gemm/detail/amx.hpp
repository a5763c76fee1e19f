#pragma once
/// \file gemm/detail/amx.hpp
/// The AMX micro-kernel of gemm_algo::host_packed, for bf16 and fp8 inputs (any mix of bf16,
/// fp8_e4m3, fp8_e5m2 for A and B): packing widens fp8 to bf16, exactly (every fp8 value is a
/// bf16 value), and TDPBF16PS accumulates in fp32.
///
/// Register tile: 32 x 32 outputs in the 4 accumulator tiles C00 C01 C10 C11 (16 x 16 fp32
/// each), fed per 32-step of K by 2 A tiles (16 rows x 32 bf16) and 2 B tiles (16 pairs of K x
/// 16 columns, the "VNNI" layout of bf16 pairs): all 8 tile registers. Each step is 4
/// TDPBF16PS (4 x 16 x 16 x 32 multiply-adds) for 4 KiB of tile loads.
///
/// Compiled only when the translation unit targets AMX (__AMX_TILE__ and __AMX_BF16__, e.g.
/// -march=native on a Sapphire Rapids or later Xeon); used only when cpu::amx_bf16_usable()
/// (CPU, OS and the Linux permission request) says so at run time. Tests also compile it with
/// TESSERA_GEMM_AMX_EMULATE on any AVX-512 machine: the tile instructions then come from the
/// software model of gemm/detail/amx_emulation.hpp (test_gemm_amx_emulated), so the packing,
/// tile configuration and indexing below run against the reference without AMX hardware.

#include <tessera/config/cpu.hpp>
#include <tessera/gemm/detail/blocking.hpp>
#include <tessera/gemm/detail/problem.hpp>
#include <tessera/precision/vector_convert.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if !TESSERA_DEVICE_PASS &&                                                                        \
    (defined(__AVX512VBMI__) || defined(__AMX_TILE__) || defined(TESSERA_GEMM_AMX_EMULATE))
#include <immintrin.h>
#endif
// The tile instructions: the real ones where the translation unit targets AMX, else (tests
// only, TESSERA_GEMM_AMX_EMULATE on an AVX-512 target, which packing needs) the software model
// of gemm/detail/amx_emulation.hpp, so that the kernel's code is the same in both.
#if !TESSERA_DEVICE_PASS && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define TESSERA_GEMM_AMX 1
#define TESSERA_GEMM_AMX_EMULATED 0
#define TESSERA_AMX_LOADCONFIG(cfg) _tile_loadconfig(cfg)
#define TESSERA_AMX_RELEASE() _tile_release()
#define TESSERA_AMX_ZERO(t) _tile_zero(t)
#define TESSERA_AMX_LOADD(t, p, s) _tile_loadd(t, p, s)
#define TESSERA_AMX_STORED(t, p, s) _tile_stored(t, p, s)
#define TESSERA_AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#elif !TESSERA_DEVICE_PASS && defined(TESSERA_GEMM_AMX_EMULATE) && defined(__AVX512BW__)
#include <tessera/gemm/detail/amx_emulation.hpp>
#define TESSERA_GEMM_AMX 1
#define TESSERA_GEMM_AMX_EMULATED 1
#define TESSERA_AMX_LOADCONFIG(cfg) ::tessera::detail::hostgemm::amx_emulation::loadconfig(cfg)
#define TESSERA_AMX_RELEASE() ::tessera::detail::hostgemm::amx_emulation::release()
#define TESSERA_AMX_ZERO(t) ::tessera::detail::hostgemm::amx_emulation::zero(t)
#define TESSERA_AMX_LOADD(t, p, s) ::tessera::detail::hostgemm::amx_emulation::loadd(t, p, s)
#define TESSERA_AMX_STORED(t, p, s) ::tessera::detail::hostgemm::amx_emulation::stored(t, p, s)
#define TESSERA_AMX_DPBF16PS(c, a, b) ::tessera::detail::hostgemm::amx_emulation::dpbf16ps(c, a, b)
#else
#define TESSERA_GEMM_AMX 0
#define TESSERA_GEMM_AMX_EMULATED 0
#endif

namespace tessera::detail::hostgemm {

/// bf16 bit patterns of the 256 codes of an fp8 format (exact widening), built once.
template <class S>
struct fp8_to_bf16_table {
  std::uint16_t v[256];
  constexpr fp8_to_bf16_table() : v{} {
    for (int i = 0; i < 256; ++i) {
      const float f = S{static_cast<std::uint8_t>(i)}.to_float();
      v[i] = static_cast<std::uint16_t>(bit_cast<std::uint32_t>(f) >> 16);
    }
  }
};

/// The low and high bytes of fp8_to_bf16_table, as two 256-byte tables (for byte shuffles),
/// and the byte order that interleaves 32 low and 32 high bytes into 32 bf16: byte 2k of the
/// output is low byte k, byte 2k + 1 high byte k (index bit 6 picks the second source).
template <class S>
struct fp8_to_bf16_bytes {
  alignas(64) std::uint8_t lo[256];
  alignas(64) std::uint8_t hi[256];
  alignas(64) std::uint8_t order[128]; ///< elements 0..31, then 32..63
  constexpr fp8_to_bf16_bytes() : lo{}, hi{}, order{} {
    const fp8_to_bf16_table<S> t{};
    for (int i = 0; i < 256; ++i) {
      lo[i] = static_cast<std::uint8_t>(t.v[i] & 0xff);
      hi[i] = static_cast<std::uint8_t>(t.v[i] >> 8);
    }
    for (int k = 0; k < 64; ++k) {
      order[k] = static_cast<std::uint8_t>((k >> 1) | (k & 1) << 6);
      order[64 + k] = static_cast<std::uint8_t>((32 + (k >> 1)) | (k & 1) << 6);
    }
  }
};

/// bf16 bits of one element of storage type S (bf16: as is; fp8: exact; fp32: rounded).
template <class S>
inline std::uint16_t bf16_bits(S x) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>) {
    return x.bits;
  } else if constexpr (std::is_same_v<S, float>) {
    return bfloat16::from_float(x).bits;
  } else {
    static constexpr fp8_to_bf16_table<S> table{};
    return table.v[x.bits];
  }
}

#if !TESSERA_DEVICE_PASS && defined(__AVX512VBMI__)
/// 64 fp8 codes (format S) to 64 bf16, elements 0..31 in lo and 32..63 in hi: each byte of a
/// bf16 is one 256-entry lookup (two 128-entry VPERMI2B, chosen by the code's top bit), then
/// the two bytes are interleaved. Bit-identical to fp8_to_bf16_table (and so to the scalar
/// conversion).
template <class S>
inline void fp8_to_bf16_x64(__m512i x, __m512i& lo, __m512i& hi) noexcept {
  static constexpr fp8_to_bf16_bytes<S> t{};
  const __mmask64 top = _mm512_movepi8_mask(x);
  const __m512i l = _mm512_mask_blend_epi8(
      top, _mm512_permutex2var_epi8(_mm512_load_si512(t.lo), x, _mm512_load_si512(t.lo + 64)),
      _mm512_permutex2var_epi8(_mm512_load_si512(t.lo + 128), x, _mm512_load_si512(t.lo + 192)));
  const __m512i h = _mm512_mask_blend_epi8(
      top, _mm512_permutex2var_epi8(_mm512_load_si512(t.hi), x, _mm512_load_si512(t.hi + 64)),
      _mm512_permutex2var_epi8(_mm512_load_si512(t.hi + 128), x, _mm512_load_si512(t.hi + 192)));
  lo = _mm512_permutex2var_epi8(l, _mm512_load_si512(t.order), h);
  hi = _mm512_permutex2var_epi8(l, _mm512_load_si512(t.order + 64), h);
}
#endif

/// A contiguous run of n elements to bf16 bits.
template <class S>
inline void load_bf16(const S* src, std::uint16_t* dst, index_t n) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * 2);
  } else {
    index_t i = 0;
#if !TESSERA_DEVICE_PASS && defined(__AVX512VBMI__)
    if constexpr (!std::is_same_v<S, float>) {
      // fp8: 64 codes per step through fp8_to_bf16_x64 (byte-table lookups).
      const auto* in = reinterpret_cast<const std::uint8_t*>(src);
      for (; i + 64 <= n; i += 64) {
        __m512i lo, hi;
        fp8_to_bf16_x64<S>(_mm512_loadu_si512(in + i), lo, hi);
        _mm512_storeu_si512(dst + i, lo);
        _mm512_storeu_si512(dst + i + 32, hi);
      }
      if (i < n) { // the last 1..63 codes: masked loads and stores (short rows: a conv band's)
        const auto r = static_cast<unsigned>(n - i);
        const __mmask64 m = (std::uint64_t(1) << r) - 1u;
        __m512i lo, hi;
        fp8_to_bf16_x64<S>(_mm512_maskz_loadu_epi8(m, in + i), lo, hi);
        _mm512_mask_storeu_epi16(dst + i, static_cast<__mmask32>(m), lo);
        if (r > 32) _mm512_mask_storeu_epi16(dst + i + 32, static_cast<__mmask32>(m >> 32), hi);
        return;
      }
    }
#endif
#if !TESSERA_DEVICE_PASS
    if constexpr (simd::available && !std::is_same_v<S, float>) {
      // fp8 codes -> float bit patterns in 32-bit lanes (precision/vector_convert.hpp's exact
      // decode) -> their top 16 bits, which are the bf16 (the low 16 are zero for fp8 values).
      using A = xsimd::default_arch;
      constexpr index_t L = static_cast<index_t>(simd::lanes<A>::size);
      for (; i + L <= n; i += L) {
        const auto u = vector_decode<S, A>(simd::load_widened<A, 1>(src + i));
        simd::store_narrowed<A, 2>(dst + i, u >> 16);
      }
    }
#endif
    for (; i < n; ++i) dst[i] = bf16_bits(src[i]);
  }
}

/// Precisions the bf16 kernels (AMX tiles, AVX512_BF16 dot products) take: those whose every
/// value is a bf16 (precision_traits<P>::exact_in_bf16: bf16 and fp8, not fp32 nor fp16).
template <class P>
inline constexpr bool amx_input_v = precision_traits<P>::exact_in_bf16;

/// The AMX kernel's shape for the blocking rule (amx_kernel below; here also where the kernel is
/// not compiled, so that the choice can be tested on any machine): 32-row tiles, KC 512 in
/// steps of 32, at most 16 panels, 4 per MiB of L2.
inline constexpr kernel_shape amx_shape{32, 512, 32, 16, 4};

#if TESSERA_GEMM_AMX

struct amx_kernel {
  static constexpr const char* name = "amx";
  static constexpr index_t MR = 32, NR = 32;
  // The blocking is chosen at run time by gemm/detail/blocking.hpp; KC and MC here are the
  // largest it may choose and `shape` its anchors (measured on an Emerald Rapids Xeon: see
  // blocking.hpp).
  /// KC: a B micro-panel (KC x NR bf16 = 512 * 32 * 2 = 32 KiB) stays in the 48 KiB L1d.
  static constexpr index_t KC = 512;
  /// MC: 4 micro-panels per MiB of L2 (at most 16): on Sapphire Rapids' 2 MiB L2 the packed A
  /// block (MC x KC bf16 = 256 * 512 * 2 = 256 KiB) stays in L2.
  static constexpr index_t MC = MR * 16;
  static constexpr kernel_shape shape = amx_shape;
  /// NC: the C block (MC x NC fp32 = 256 * 1024 * 4 = 1 MiB) stays in L2 across the KC slices;
  /// the packed B block (K x NC bf16) is kept under blocking::b_bytes (L3).
  static constexpr index_t NC_max = 1024;
  using packed_t = std::uint16_t;
  /// K is padded with zeros to whole 32-element tile steps.
  static constexpr index_t k_align = 32;
  static_assert(shape.mr == MR && shape.kc == KC && shape.k_align == k_align &&
                    shape.max_panels == MC / MR,
                "amx_shape must describe amx_kernel");

  /// Up to 16 (32) consecutive elements from src as bf16 bits, zeros past n (n <= 0: all zero):
  /// a masked load for bf16 (the lanes past n are not read), else load_bf16 into a buffer.
  template <class S>
  static __m256i load16(const S* src, index_t n) {
    if (n <= 0) return _mm256_setzero_si256();
    if constexpr (std::is_same_v<S, bfloat16>) {
      const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
      return _mm256_maskz_loadu_epi16(m, src);
    } else {
#if defined(__AVX512VBMI__)
      if constexpr (!std::is_same_v<S, float>) {
        const __mmask64 m = n >= 16 ? __mmask64(0xffff) : (__mmask64(1) << n) - 1;
        __m512i lo, hi;
        fp8_to_bf16_x64<S>(_mm512_maskz_loadu_epi8(m, src), lo, hi);
        return _mm512_castsi512_si256(lo);
      }
#endif
      alignas(32) std::uint16_t t[16] = {};
      load_bf16(src, t, std::min<index_t>(n, 16));
      return _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
    }
  }
  template <class S>
  static __m512i load32(const S* src, index_t n) {
    if (n <= 0) return _mm512_setzero_si512();
    if constexpr (std::is_same_v<S, bfloat16>) {
      const __mmask32 m = n >= 32 ? ~__mmask32(0) : __mmask32((1u << n) - 1);
      return _mm512_maskz_loadu_epi16(m, src);
    } else {
#if defined(__AVX512VBMI__)
      if constexpr (!std::is_same_v<S, float>) {
        const __mmask64 m = n >= 32 ? __mmask64(0xffffffff) : (__mmask64(1) << n) - 1;
        __m512i lo, hi;
        fp8_to_bf16_x64<S>(_mm512_maskz_loadu_epi8(m, src), lo, hi);
        return lo;
      }
#endif
      alignas(64) std::uint16_t t[32] = {};
      load_bf16(src, t, std::min<index_t>(n, 32));
      return _mm512_load_si512(t);
    }
  }
  /// The bf16 pairs (x[j], y[j]) of 16 elements each, as 16 32-bit lanes (x in the low half).
  static __m512i pairs(__m256i x, __m256i y) {
    return _mm512_or_si512(_mm512_cvtepu16_epi32(x),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(y), 16));
  }
  /// In-place transpose of a 16 x 16 matrix of 32-bit elements, r[i] its row i: 32-bit and
  /// 64-bit unpacks within 128-bit lanes, then two rounds of 128-bit lane shuffles.
  static void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    // u[g][c] (g: rows 4g..4g+3): 128-bit lane L holds column 4L + c of those four rows.
    __m512i u[4][4];
    for (int g = 0; g < 4; ++g) {
      u[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
      u[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
      u[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
      u[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    // Row 4L + c of the result: lane L of u[0][c], u[1][c], u[2][c], u[3][c].
    for (int c = 0; c < 4; ++c) {
      const __m512i v0 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0x88); // L0 L2 of u0, u1
      const __m512i v1 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0xdd); // L1 L3
      const __m512i v2 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0x88);
      const __m512i v3 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0xdd);
      r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);      // lane 0
      r[4 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);  // lane 1
      r[8 + c] = _mm512_shuffle_i32x4(v0, v2, 0xdd);  // lane 2
      r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xdd); // lane 3
    }
  }

  /// A(i0.., p0..) into panels of 32 rows: [kcp/32][32 rows][32 k], zero-padded. Rows
  /// contiguous along K: one 64-byte (masked) load per row and tile step. Otherwise (A
  /// transposed or strided): for 16 rows at a time, the bf16 pairs of K rows p and p + 1
  /// (16 x 16 32-bit lanes: pair q of row i), transposed into the rows.
  template <class VA>
  static void pack_a(const VA& a, index_t i0, index_t mc, index_t p0, index_t kc,
                     std::uint16_t* dst) {
    using S = typename VA::storage_type;
    const index_t s0 = a.stride(0), s1 = a.stride(1), kcp = (kc + 31) / 32 * 32;
    const S* base = a.data();
    for (index_t ip = 0; ip < mc; ip += MR) {
      std::uint16_t* d = dst + ip * kcp;
      const index_t rows = std::min(MR, mc - ip);
      if (s1 == 1) {
        for (index_t r = 0; r < MR; ++r) {
          const S* src = base + (i0 + ip + r) * s0 + p0;
          for (index_t kk = 0; kk < kcp; kk += 32)
            _mm512_storeu_si512(d + (kk + r) * 32,
                                r < rows ? load32(src + kk, kc - kk) : _mm512_setzero_si512());
        }
        continue;
      }
      for (index_t h = 0; h < MR; h += 16) {
        const index_t n = std::min<index_t>(16, rows - h); // rows of this half (<= 0: none)
        const index_t first = i0 + ip + h;
        for (index_t kk = 0; kk < kcp; kk += 32) {
          __m512i v[16];
          for (index_t q = 0; q < 16; ++q) {
            const index_t p = kk + 2 * q;
            __m256i x[2];
            for (index_t e = 0; e < 2; ++e) {
              if (p + e >= kc || n <= 0) {
                x[e] = _mm256_setzero_si256();
              } else if (s0 == 1) {
                x[e] = load16(base + (p0 + p + e) * s1 + first, n);
              } else {
                alignas(32) std::uint16_t t[16] = {};
                for (index_t i = 0; i < n; ++i)
                  t[i] = bf16_bits(base[(first + i) * s0 + (p0 + p + e) * s1]);
                x[e] = _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
              }
            }
            v[q] = pairs(x[0], x[1]);
          }
          transpose16(v); // v[i]: row first + i's 16 pairs of this tile step
          for (index_t i = 0; i < 16; ++i) _mm512_storeu_si512(d + (kk + h + i) * 32, v[i]);
        }
      }
    }
  }

  /// B(p0.., j0..) into panels of 32 columns: [kcp/32][tile 0..1][16 pairs][16 cols][2]. Rows
  /// contiguous along N: rows p and p + 1 (32 columns each, masked loads) interleaved into
  /// pairs by one two-source word permutation per tile. Otherwise (B transposed or strided):
  /// 16 columns' runs of 32 K values (16 pairs each) transposed into the tile's 16 pair rows.
  template <class VB>
  static void pack_b(const VB& b, index_t p0, index_t kc, index_t j0, index_t nc,
                     std::uint16_t* dst) {
    using S = typename VB::storage_type;
    const index_t s0 = b.stride(0), s1 = b.stride(1), kcp = (kc + 31) / 32 * 32;
    const S* base = b.data();
    // Word k of tile t's pair row: k even, column 16 t + k / 2 of the first row (source
    // index), k odd, of the second (index + 32).
    alignas(64) static constexpr std::uint16_t interleave[2][32] = {
        {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
         8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
        {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
         24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};
    if (s1 == 1) {
      // Row pairs outermost: each pair of B rows is read once, front to back (a panel at a
      // time would touch a new page of B in every row).
      const __m512i lo = _mm512_load_si512(interleave[0]);
      const __m512i hi = _mm512_load_si512(interleave[1]);
      for (index_t p = 0; p < kcp; p += 2) {
        const S* src = base + (p0 + p) * s0 + j0;
        const index_t off = (p >> 5) * 1024 + ((p & 31) >> 1) * 32;
        for (index_t jp = 0; jp < nc; jp += NR) {
          const index_t cols = std::min(NR, nc - jp);
          const __m512i x = p < kc ? load32(src + jp, cols) : _mm512_setzero_si512();
          const __m512i y = p + 1 < kc ? load32(src + s0 + jp, cols) : _mm512_setzero_si512();
          std::uint16_t* row = dst + jp * kcp + off;
          _mm512_storeu_si512(row, _mm512_permutex2var_epi16(x, lo, y));
          _mm512_storeu_si512(row + 512, _mm512_permutex2var_epi16(x, hi, y));
        }
      }
      return;
    }
    for (index_t jp = 0; jp < nc; jp += NR) {
      std::uint16_t* d = dst + jp * kcp;
      const index_t cols = std::min(NR, nc - jp);
      for (index_t t = 0; t < 2; ++t) {
        const index_t n = cols - 16 * t; // columns of this tile (<= 0: none)
        for (index_t kk = 0; kk < kcp; kk += 32) {
          __m512i v[16];
          for (index_t j = 0; j < 16; ++j) {
            const index_t col = j0 + jp + 16 * t + j;
            if (j >= n || kk >= kc) {
              v[j] = _mm512_setzero_si512();
            } else if (s0 == 1) {
              v[j] = load32(base + (p0 + kk) + col * s1, kc - kk);
            } else {
              alignas(64) std::uint16_t run[32] = {};
              const index_t m = std::min<index_t>(32, kc - kk);
              for (index_t p = 0; p < m; ++p)
                run[p] = bf16_bits(base[(p0 + kk + p) * s0 + col * s1]);
              v[j] = _mm512_load_si512(run);
            }
          }
          transpose16(v); // v[q]: pair row q of the tile, columns 0..15
          std::uint16_t* tile = d + (kk >> 5) * 1024 + t * 512;
          for (index_t q = 0; q < 16; ++q) _mm512_storeu_si512(tile + q * 32, v[q]);
        }
      }
    }
  }

  /// Tile configuration (palette 1): 8 tiles of 16 rows x 64 bytes.
  struct alignas(64) tile_config {
    std::uint8_t palette = 1, start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  };
  static void begin() {
    static const tile_config cfg{};
    TESSERA_AMX_LOADCONFIG(&cfg);
  }
  static void end() {
    TESSERA_AMX_RELEASE();
  }

  /// The K loop: accumulator tiles 0..3 (C00 C01 C10 C11) += a_panel * b_panel over kcp.
  static void product(index_t kcp, const std::uint16_t* a, const std::uint16_t* b) {
    for (index_t kk = 0; kk < kcp; kk += 32) {
      const std::uint16_t* ak = a + kk * 32;
      const std::uint16_t* bk = b + kk * 32;
      TESSERA_AMX_LOADD(4, ak, 64);
      TESSERA_AMX_LOADD(6, bk, 64);
      TESSERA_AMX_LOADD(7, bk + 512, 64);
      TESSERA_AMX_DPBF16PS(0, 4, 6);
      TESSERA_AMX_DPBF16PS(1, 4, 7);
      TESSERA_AMX_LOADD(5, ak + 512, 64);
      TESSERA_AMX_DPBF16PS(2, 5, 6);
      TESSERA_AMX_DPBF16PS(3, 5, 7);
    }
  }
  /// Accumulator tiles 0..3 to / from a 32 x 32 fp32 block at d, row stride ld floats.
  static void store(float* d, index_t ld) {
    const auto bytes = static_cast<long>(ld * 4);
    TESSERA_AMX_STORED(0, d, bytes);
    TESSERA_AMX_STORED(1, d + 16, bytes);
    TESSERA_AMX_STORED(2, d + 16 * ld, bytes);
    TESSERA_AMX_STORED(3, d + 16 * ld + 16, bytes);
  }
  static void load(const float* d, index_t ld) {
    const auto bytes = static_cast<long>(ld * 4);
    TESSERA_AMX_LOADD(0, d, bytes);
    TESSERA_AMX_LOADD(1, d + 16, bytes);
    TESSERA_AMX_LOADD(2, d + 16 * ld, bytes);
    TESSERA_AMX_LOADD(3, d + 16 * ld + 16, bytes);
  }
  static void zero() {
    TESSERA_AMX_ZERO(0);
    TESSERA_AMX_ZERO(1);
    TESSERA_AMX_ZERO(2);
    TESSERA_AMX_ZERO(3);
  }

  /// t (32 x 32 fp32, row-major) = a_panel * b_panel over kcp (a multiple of 32).
  static void micro(index_t kcp, const std::uint16_t* a, const std::uint16_t* b, float* t) {
    zero();
    product(kcp, a, b);
    store(t, NR);
  }

  /// The full 32 x 32 fp32 tile at d (row stride ldd) = alpha * a_panel * b_panel + beta * d
  /// with alpha = ab[0], beta = ab[1]. The common cases go through the tiles alone: alpha 1,
  /// beta 0 (d is not read: the sums are stored into it) and alpha 1, beta 1 (d is loaded into
  /// the accumulators, which the products are added to; as TDPBF16PS adds each product pair to
  /// the accumulator, this rounds as the sum of d and the products in that order). Others take
  /// the sums through a local tile.
  [[gnu::noinline]] static void micro_c(index_t kcp, const std::uint16_t* __restrict a,
                                        const std::uint16_t* __restrict b, float* __restrict d,
                                        index_t ldd, const float* ab) {
    const float al = ab[0], be = ab[1];
    if (al == 1.f && (be == 0.f || be == 1.f)) {
      if (be == 0.f)
        zero();
      else
        load(d, ldd);
      product(kcp, a, b);
      store(d, ldd);
      return;
    }
    alignas(64) float t[MR * NR];
    micro(kcp, a, b, t);
    const __m512 va = _mm512_set1_ps(al), vb = _mm512_set1_ps(be);
    for (index_t r = 0; r < MR; ++r)
      for (index_t j = 0; j < NR; j += 16) {
        float* dr = d + r * ldd + j;
        const __m512 x = _mm512_mul_ps(va, _mm512_load_ps(t + r * NR + j));
        _mm512_storeu_ps(dr, be == 0.f ? x : _mm512_fmadd_ps(vb, _mm512_loadu_ps(dr), x));
      }
  }
};

#endif // TESSERA_GEMM_AMX

} // namespace tessera::detail::hostgemm
