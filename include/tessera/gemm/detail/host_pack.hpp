#pragma once
/// \file gemm/detail/host_pack.hpp
/// Data movement of gemm_algo::host_packed's packing, on 32-bit words (an fp32, or a pair of
/// bf16 along K): a transpose of up to 16 rows into interleaved micro-panel order and a masked
/// copy of a short run. With AVX-512 the transpose works on 16 x 16 blocks in registers (64
/// shuffles per 256 words, against a load and a store per word in scalar code); other targets
/// take the scalar loops.

#include <tessera/config/macros.hpp>
#include <tessera/tensor/extents.hpp>

#include <cstdint>
#include <cstring>

#if !TESSERA_DEVICE_PASS && defined(__AVX512F__)
#include <immintrin.h>
#define TESSERA_GEMM_PACK_AVX512 1
#else
#define TESSERA_GEMM_PACK_AVX512 0
#endif

namespace tessera::detail::hostgemm {

#if !TESSERA_DEVICE_PASS

/// dst[c * ldd + r] = src[r * lds + c] (32-bit words; lds in bytes, so any element stride
/// works) for r < rows, c < cols, and dst[c * ldd + r] = 0 for rows <= r < lanes.
/// rows <= lanes <= 16.
inline void transpose_words(const void* src, index_t lds, index_t rows, index_t cols, void* dst,
                            index_t ldd, index_t lanes) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<std::uint32_t*>(dst);
#if TESSERA_GEMM_PACK_AVX512
  const __mmask16 store = static_cast<__mmask16>((1u << lanes) - 1u);
  for (index_t c0 = 0; c0 < cols; c0 += 16) {
    const index_t n = cols - c0 < 16 ? cols - c0 : 16;
    const __mmask16 load = static_cast<__mmask16>((1u << n) - 1u);
    __m512i r[16], t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] =
          i < rows ? _mm512_maskz_loadu_epi32(load, s + i * lds + c0 * 4) : _mm512_setzero_si512();
      // Stage 1, 2: within 128-bit lanes, r[4i + j] lane L = column 4L + j of rows 4i .. 4i+3.
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // Stage 3, 4: gather lane L of r[j], r[4 + j], r[8 + j], r[12 + j] into column 4L + j.
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i x0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
      const __m512i x1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
      const __m512i y0 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
      const __m512i y1 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
      t[j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
      t[8 + j] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
      t[4 + j] = _mm512_shuffle_i32x4(x1, y1, 0x88);
      t[12 + j] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
    }
    std::uint32_t* o = d + c0 * ldd;
    if (lanes == 16) {
      for (index_t c = 0; c < n; ++c) _mm512_storeu_si512(o + c * ldd, t[c]);
    } else {
      for (index_t c = 0; c < n; ++c) _mm512_mask_storeu_epi32(o + c * ldd, store, t[c]);
    }
  }
#else
  for (index_t c = 0; c < cols; ++c) {
    for (index_t r = 0; r < rows; ++r) std::memcpy(d + c * ldd + r, s + r * lds + c * 4, 4);
    for (index_t r = rows; r < lanes; ++r) d[c * ldd + r] = 0;
  }
#endif
}

/// Prefetches (into L1) the cache lines of bytes [0, n) from p. The packing loops that read a
/// short run from each of many rows a row apart (pairs of K rows of a row-major B, of a
/// transposed A) call it for the rows they will read a few iterations later: such a stride of
/// a whole row between runs of a few lines is one the hardware prefetchers follow poorly, and
/// operands that come from memory (a layer's saved activations in the weight gradient) then
/// stall every load (measured on Zen 5, 1 thread, operands out of cache: the weight-gradient
/// shapes of the char GPT at 258-314 GFLOP/s against 420-440 from cache). GCC's and clang's
/// __builtin_prefetch (read, high locality: PREFETCHT0 on x86) serves every target, AVX2 builds
/// of the fp32 kernel's packing included; elsewhere nothing is prefetched.
inline void prefetch_bytes(const void* p, std::size_t n) {
#if defined(__GNUC__)
  const auto* c = static_cast<const char*>(p);
  for (std::size_t o = 0; o < n; o += 64) __builtin_prefetch(c + o, 0, 3);
  if (n > 0) __builtin_prefetch(c + n - 1, 0, 3);
#else
  (void)p;
  (void)n;
#endif
}

/// dst[i] = src[i] (32-bit words) for i < n, dst[i] = 0 for n <= i < lanes; lanes <= 32.
inline void copy_words(const void* src, index_t n, void* dst, index_t lanes) {
#if TESSERA_GEMM_PACK_AVX512
  const auto* s = static_cast<const std::uint32_t*>(src);
  auto* d = static_cast<std::uint32_t*>(dst);
  for (index_t i = 0; i < lanes; i += 16) {
    const index_t k = n - i, m = lanes - i;
    const __mmask16 load = static_cast<__mmask16>(k >= 16 ? 0xffffu : k <= 0 ? 0u : (1u << k) - 1u);
    const __mmask16 store = static_cast<__mmask16>(m >= 16 ? 0xffffu : (1u << m) - 1u);
    _mm512_mask_storeu_epi32(d + i, store, _mm512_maskz_loadu_epi32(load, s + i));
  }
#else
  std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
  std::memset(static_cast<std::uint32_t*>(dst) + n, 0, static_cast<std::size_t>(lanes - n) * 4);
#endif
}

#endif // !TESSERA_DEVICE_PASS

} // namespace tessera::detail::hostgemm
