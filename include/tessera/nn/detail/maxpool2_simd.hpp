#pragma once
/// \file nn/detail/maxpool2_simd.hpp
/// SIMD rows of nn::MaxPool2d<2> for fp32 and bf16 on the host. AVX-512 (F/BW/VL): 16 windows
/// per step, the even / odd columns of a row pair split by one permute (fp32) or by the two
/// halves of each 32-bit lane (bf16), the first-maximum-wins / NaN-propagating selection done
/// with compare masks. AVX2: the same steps on 8 windows, with in-lane shuffles and a 64-bit
/// block permute for the split, masks as vectors (blends, masked loads; bf16 tails through a
/// small buffer). Each instruction set supplies the lane operations (split loads, the select,
/// stores, the interleave); forward_rows and backward_rows are written once over them. Same
/// results, bit for bit, as the portable loops in nn/pooling.hpp (the tests run both). Host only,
/// and only when the translation unit is compiled for one of them. On an AVX2 CPU (AMD Zen 3) the
/// scalar loops had been a quarter of a FashionCNN fp32 training step (its pooled convolution
/// store).

#include <tessera/config/macros.hpp>
#include <tessera/precision/convert.hpp>
#include <tessera/tensor/extents.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if !TESSERA_DEVICE_PASS && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TESSERA_MAXPOOL2_SIMD 1
#define TESSERA_MAXPOOL2_AVX512 1
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#elif !TESSERA_DEVICE_PASS && defined(__AVX2__)
#define TESSERA_MAXPOOL2_SIMD 1
#define TESSERA_MAXPOOL2_AVX512 0
#include <immintrin.h>
#else
#define TESSERA_MAXPOOL2_SIMD 0
#define TESSERA_MAXPOOL2_AVX512 0
#endif

namespace tessera::nn::detail::maxpool2 {

/// True when rows of precision P have the SIMD path in this translation unit.
template <class P>
inline constexpr bool simd_v = TESSERA_MAXPOOL2_SIMD &&
                               (std::is_same_v<P, fp32> || std::is_same_v<P, bf16>);

#if TESSERA_MAXPOOL2_AVX512

/// The first n lanes (n <= 16) of a 16-lane mask.
inline __mmask16 first(index_t n) noexcept {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u);
}

/// Windows q .. q + n of one row of storage P (n <= 16): its even columns in ev, odd in od.
template <class P>
inline void load_pairs(const storage_t<P>* row, index_t n, __m512& ev, __m512& od) noexcept {
  if constexpr (std::is_same_v<P, fp32>) {
    const __m512 lo = _mm512_maskz_loadu_ps(first(2 * n), row);
    const __m512 hi = _mm512_maskz_loadu_ps(first(2 * n - 16 > 0 ? 2 * n - 16 : 0), row + 16);
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    ev = _mm512_permutex2var_ps(lo, ie, hi);
    od = _mm512_permutex2var_ps(lo, io, hi);
  } else {
    // 32 bf16 codes: the low half of each 32-bit lane is an even column, the high half odd;
    // bf16 -> fp32 is the code in a float's upper 16 bits.
    const __mmask32 m = n >= 16 ? __mmask32(0xffffffffu) : __mmask32((1u << (2 * n)) - 1u);
    const __m512i v = _mm512_maskz_loadu_epi16(m, row);
    ev = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    od = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
}

/// n (<= 16) consecutive elements of storage P as fp32 lanes (exact), the rest 0.
template <class P>
inline __m512 load_lanes(const storage_t<P>* v, index_t n) noexcept {
  if constexpr (std::is_same_v<P, fp32>) {
    return _mm512_maskz_loadu_ps(first(n), v);
  } else {
    const __m256i codes = _mm256_maskz_loadu_epi16(first(n), v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(codes), 16));
  }
}

/// Stores n (<= 16) fp32 lanes as storage P (exact: the values came from P).
template <class P>
inline void store_lanes(storage_t<P>* out, index_t n, __m512 v) noexcept {
  if constexpr (std::is_same_v<P, fp32>) {
    _mm512_mask_storeu_ps(out, first(n), v);
  } else {
    const __m256i codes = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
    _mm256_mask_storeu_epi16(out, first(n), codes);
  }
}

/// Windows per step.
inline constexpr index_t lanes_n = 16;
using vec_t = __m512;
using ivec_t = __m512i;
using mask_t = __mmask16;

/// Where the running maximum best gives way to the candidate v: best is a number and v is
/// greater or NaN. "Not <=" is true for both (an unordered compare), and the compare masked by
/// best's ordered lanes drops a NaN best.
inline mask_t takes(vec_t best, vec_t v) noexcept {
  return _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(best, best, _CMP_ORD_Q), v, best, _CMP_NLE_UQ);
}
inline vec_t select(mask_t m, vec_t a, vec_t b) noexcept {
  return _mm512_mask_mov_ps(a, m, b);
}
inline ivec_t select_k(mask_t m, ivec_t a, int k) noexcept {
  return _mm512_mask_mov_epi32(a, m, _mm512_set1_epi32(k));
}
inline ivec_t izero() noexcept {
  return _mm512_setzero_si512();
}

/// The low n (<= 16) bytes of the 32-bit lanes (each 0 .. 3) stored at out, and loaded back.
inline void store_bytes(std::uint8_t* out, index_t n, ivec_t v) noexcept {
  _mm_mask_storeu_epi8(out, first(n), _mm512_cvtepi32_epi8(v));
}
inline ivec_t load_bytes(const std::uint8_t* in, index_t n) noexcept {
  return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(first(n), in));
}

/// g where p > 0, else 0; g where at == k, else 0.
inline vec_t where_positive(vec_t g, vec_t p) noexcept {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_GT_OQ), g);
}
inline vec_t where_at(vec_t g, ivec_t at, int k) noexcept {
  return _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(k)), g);
}

/// Even columns e0 and odd e1 interleaved into 32 columns: lo the first 16, hi the rest.
inline void interleave(vec_t e0, vec_t e1, vec_t& lo, vec_t& hi) noexcept {
  const __m512i il = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i ih = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  lo = _mm512_permutex2var_ps(e0, il, e1);
  hi = _mm512_permutex2var_ps(e0, ih, e1);
}

#elif TESSERA_MAXPOOL2_SIMD // AVX2: the same steps on 8 windows, masks as vectors

/// Lanes [0, n) of 8 (n clamped to [0, 8]) set: a mask for the AVX2 masked loads and stores.
inline __m256i first8(index_t n) noexcept {
  const int m = n < 0 ? 0 : n > 8 ? 8 : static_cast<int>(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Windows q .. q + n of one row of storage P (n <= 8): its even columns in ev, odd in od.
template <class P>
inline void load_pairs(const storage_t<P>* row, index_t n, __m256& ev, __m256& od) noexcept {
  if constexpr (std::is_same_v<P, fp32>) {
    const __m256 lo = _mm256_maskload_ps(row, first8(2 * n));
    const __m256 hi = _mm256_maskload_ps(row + 8, first8(2 * n - 8));
    // Per 128-bit half: (lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6); then the 64-bit blocks in the
    // order 0, 2, 1, 3: lo0 lo2 lo4 lo6 hi0 hi2 hi4 hi6.
    const auto order = [](__m256 v) {
      return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
    };
    ev = order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
    od = order(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
  } else {
    // 16 bf16 codes: the low half of each 32-bit lane an even column, the high half odd.
    __m256i v;
    if (n == 8) {
      v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
    } else {
      alignas(32) std::uint16_t buf[16] = {};
      std::memcpy(buf, row, static_cast<std::size_t>(2 * n) * sizeof(std::uint16_t));
      v = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
    }
    ev = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    od = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
  }
}

/// n (<= 8) consecutive elements of storage P as fp32 lanes (exact), the rest 0.
template <class P>
inline __m256 load_lanes(const storage_t<P>* v, index_t n) noexcept {
  if constexpr (std::is_same_v<P, fp32>) {
    return _mm256_maskload_ps(v, first8(n));
  } else {
    __m128i codes;
    if (n == 8) {
      codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
    } else {
      alignas(16) std::uint16_t buf[8] = {};
      std::memcpy(buf, v, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
      codes = _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(codes), 16));
  }
}

/// Stores n (<= 8) fp32 lanes as storage P (exact: the values came from P).
template <class P>
inline void store_lanes(storage_t<P>* out, index_t n, __m256 v) noexcept {
  if constexpr (std::is_same_v<P, fp32>) {
    _mm256_maskstore_ps(out, first8(n), v);
  } else {
    const __m256i c32 = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    // Packed per 128-bit half (c0..c3 c0..c3 | c4..c7 c4..c7), then blocks 0 and 2 first.
    const __m256i c16 =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(c32, c32), _MM_SHUFFLE(3, 1, 2, 0));
    const __m128i codes = _mm256_castsi256_si128(c16);
    if (n == 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), codes);
    } else {
      alignas(16) std::uint16_t buf[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(buf), codes);
      std::memcpy(out, buf, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
    }
  }
}

/// The low n (<= 8) bytes of eight 32-bit lanes (each 0 .. 3) stored at out.
inline void store_bytes(std::uint8_t* out, index_t n, __m256i v) noexcept {
  const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i b8 = _mm_packus_epi16(w16, w16);
  if (n == 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), b8);
  } else {
    alignas(16) std::uint8_t buf[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), b8);
    std::memcpy(out, buf, static_cast<std::size_t>(n));
  }
}

inline constexpr index_t lanes_n = 8;
using vec_t = __m256;
using ivec_t = __m256i;
using mask_t = __m256; ///< all ones or all zeros per lane

/// As in the AVX-512 form, with the masks as vectors.
inline mask_t takes(vec_t best, vec_t v) noexcept {
  return _mm256_and_ps(_mm256_cmp_ps(best, best, _CMP_ORD_Q), _mm256_cmp_ps(v, best, _CMP_NLE_UQ));
}
inline vec_t select(mask_t m, vec_t a, vec_t b) noexcept {
  return _mm256_blendv_ps(a, b, m);
}
inline ivec_t select_k(mask_t m, ivec_t a, int k) noexcept {
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(_mm256_set1_epi32(k)), m));
}
inline ivec_t izero() noexcept {
  return _mm256_setzero_si256();
}

inline ivec_t load_bytes(const std::uint8_t* in, index_t n) noexcept {
  alignas(16) std::uint8_t bytes[16] = {};
  std::memcpy(bytes, in, static_cast<std::size_t>(n));
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
}

inline vec_t where_positive(vec_t g, vec_t p) noexcept {
  return _mm256_and_ps(g, _mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_GT_OQ));
}
inline vec_t where_at(vec_t g, ivec_t at, int k) noexcept {
  return _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, _mm256_set1_epi32(k))));
}

/// Even columns e0 and odd e1 into 16 columns. unpack interleaves per 128-bit half (e0_0 e1_0
/// e0_1 e1_1 | e0_4 ..) and (e0_2 .. | e0_6 ..): columns 0..7 are the two low halves, 8..15 the
/// two high ones.
inline void interleave(vec_t e0, vec_t e1, vec_t& lo, vec_t& hi) noexcept {
  const __m256 ul = _mm256_unpacklo_ps(e0, e1), uh = _mm256_unpackhi_ps(e0, e1);
  lo = _mm256_permute2f128_ps(ul, uh, 0x20);
  hi = _mm256_permute2f128_ps(ul, uh, 0x31);
}

#endif // TESSERA_MAXPOOL2_AVX512 / AVX2

#if TESSERA_MAXPOOL2_SIMD

// One source for both instruction sets over the lane operations above (lanes_n windows a step).

/// R output rows at once (R independent chains for the out-of-order core; out and arg rows
/// consecutive, Q apart): output row i (q in [0, Q)) of the input row pair r0s[i], r0s[i] + W:
/// out[q] = the max of the window, arg[q] = its position dh * 2 + dw (first maximum wins; a
/// NaN is taken and then kept).
template <class P, int R>
inline void forward_rows(const storage_t<P>* const* r0s, index_t W, index_t Q, storage_t<P>* out,
                         std::uint8_t* arg) noexcept {
  for (index_t q = 0; q < Q; q += lanes_n) {
    const index_t n = Q - q < lanes_n ? Q - q : lanes_n;
    vec_t best[R];
    ivec_t at[R];
    for (int i = 0; i < R; ++i) {
      vec_t v[4];
      load_pairs<P>(r0s[i] + 2 * q, n, v[0], v[1]);
      load_pairs<P>(r0s[i] + W + 2 * q, n, v[2], v[3]);
      best[i] = v[0];
      at[i] = izero();
      for (int k = 1; k < 4; ++k) {
        const mask_t take = takes(best[i], v[k]);
        best[i] = select(take, best[i], v[k]);
        at[i] = select_k(take, at[i], k);
      }
    }
    for (int i = 0; i < R; ++i) {
      store_lanes<P>(out + i * Q + q, n, best[i]);
      store_bytes(arg + i * Q + q, n, at[i]);
    }
  }
}

/// The two input rows (dx0: dh = 0, dx1: dh = 1) under output row dy / arg (Q windows): dy at
/// each window's recorded maximum, 0 elsewhere; columns [2Q, W) are zeroed. With `pooled` (the
/// forward's output row, of a ReLU's output: nn::MaxPool2d::backward_after_relu), dy only where
/// the window's maximum is > 0 (the ReLU's backward at that position), 0 elsewhere.
template <class P>
inline void backward_rows(const storage_t<P>* dy, const std::uint8_t* arg, index_t Q, index_t W,
                          storage_t<P>* dx0, storage_t<P>* dx1,
                          const storage_t<P>* pooled = nullptr) noexcept {
  for (index_t q = 0; q < Q; q += lanes_n) {
    const index_t n = Q - q < lanes_n ? Q - q : lanes_n;
    vec_t g = load_lanes<P>(dy + q, n);
    if (pooled) g = where_positive(g, load_lanes<P>(pooled + q, n));
    const ivec_t at = load_bytes(arg + q, n);
    storage_t<P>* rows[2] = {dx0, dx1};
    for (int dh = 0; dh < 2; ++dh) {
      vec_t lo, hi;
      interleave(where_at(g, at, 2 * dh), where_at(g, at, 2 * dh + 1), lo, hi);
      const index_t cols = 2 * n;
      store_lanes<P>(rows[dh] + 2 * q, cols < lanes_n ? cols : lanes_n, lo);
      if (cols > lanes_n) store_lanes<P>(rows[dh] + 2 * q + lanes_n, cols - lanes_n, hi);
    }
  }
  for (index_t w = 2 * Q; w < W; ++w) {
    dx0[w] = from_float<P>(0.f);
    dx1[w] = from_float<P>(0.f);
  }
}

/// Output rows [r_begin, r_end) of x (B*C planes of H x W, P = H / 2 output rows per plane):
/// four rows at a time, the plane and row counted on (no division per row).
template <class P>
inline void forward_range(const storage_t<P>* x, index_t H, index_t W, index_t P2, index_t Q,
                          index_t r_begin, index_t r_end, storage_t<P>* out,
                          std::uint8_t* arg) noexcept {
  index_t bc = r_begin / P2, p = r_begin % P2;
  const auto next = [&] {
    const storage_t<P>* r0 = x + (bc * H + 2 * p) * W;
    if (++p == P2) {
      p = 0;
      ++bc;
    }
    return r0;
  };
  index_t r = r_begin;
  for (; r + 4 <= r_end; r += 4) {
    const storage_t<P>* r0s[4];
    for (auto& e : r0s) e = next();
    forward_rows<P, 4>(r0s, W, Q, out + r * Q, arg + r * Q);
  }
  for (; r < r_end; ++r) {
    const storage_t<P>* r0s[1] = {next()};
    forward_rows<P, 1>(r0s, W, Q, out + r * Q, arg + r * Q);
  }
}

#endif // TESSERA_MAXPOOL2_SIMD

/// One output row from the input row pair r0, r0 + W (Q windows) without SIMD: the loops of
/// nn::MaxPool2d's portable forward for K = 2 (candidates in the order (0,0), (0,1), (1,0),
/// (1,1); the first maximum wins; a NaN is taken and then kept).
template <class P>
inline void forward_pair(const storage_t<P>* r0, index_t W, index_t Q, storage_t<P>* out,
                         std::uint8_t* arg) noexcept {
  for (index_t q = 0; q < Q; ++q) {
    float best = to_float(r0[2 * q]);
    int at = 0;
    for (int k = 1; k < 4; ++k) {
      const float v = to_float(r0[(k / 2) * W + 2 * q + k % 2]);
      const bool take = v > best || (v != v && best == best);
      best = take ? v : best;
      at = take ? k : at;
    }
    out[q] = from_float<P>(best);
    arg[q] = static_cast<std::uint8_t>(at);
  }
}

/// The widest convolution output row conv_rows pools.
inline constexpr index_t max_fused_width = 1024;

/// nn::MaxPool2d<2> in a convolution's store (nn::Conv2d::forward_pooled): a consumer of output
/// rows for tessera::detail::conv2d_forward_rows. Channel k of image n, rows p0 .. p0 + count - 1
/// (p0 even, W sums each, contiguous) arrive as fp32 sums with the function f that gives their
/// stored values (bias, ReLU, rounding to P); runs of row pairs are rounded into a stack buffer,
/// as the convolution would have stored them (one loop over the run), and pooled there four
/// output rows at a time: y (B, C, H/2, W/2) and the positions arg, the same bits as
/// MaxPool2d's forward over the stored output. A last unpaired row (odd H) is dropped, as the
/// pooling drops it. W <= max_fused_width.
template <class P>
struct conv_rows {
  storage_t<P>* y;
  std::uint8_t* arg;
  index_t C, W, P2, Q; ///< channels, the convolution's output width, the pooled height and width

  static constexpr index_t stage_n = 4 * max_fused_width;

  template <class F>
  void operator()(const float* sums, index_t k, index_t n, index_t p0, index_t count, const F& f,
                  float alpha) const {
    storage_t<P> stage[stage_n];
    const index_t q2 = Q, pairs = count / 2, sld = W;
    const index_t per = stage_n / (2 * W); // row pairs per run (W <= max_fused_width: >= 2)
    storage_t<P>* out = y + ((n * C + k) * P2 + p0 / 2) * q2;
    std::uint8_t* at = arg + ((n * C + k) * P2 + p0 / 2) * q2;
    for (index_t i0 = 0; i0 < pairs; i0 += per) {
      const index_t m = pairs - i0 < per ? pairs - i0 : per;
      const float* src = sums + 2 * i0 * W;
      const index_t e_n = (2 * m - 1) * W + 2 * q2; // to the last row's last pooled column
      for (index_t e = 0; e < e_n; ++e) stage[e] = f(alpha * src[e]);
      index_t i = 0;
#if TESSERA_MAXPOOL2_SIMD
      if constexpr (simd_v<P>) {
        for (; i + 4 <= m; i += 4) {
          const storage_t<P>* r0s[4] = {stage + 2 * i * sld, stage + 2 * (i + 1) * sld,
                                        stage + 2 * (i + 2) * sld, stage + 2 * (i + 3) * sld};
          forward_rows<P, 4>(r0s, sld, q2, out + (i0 + i) * q2, at + (i0 + i) * q2);
        }
        for (; i < m; ++i) {
          const storage_t<P>* r0s[1] = {stage + 2 * i * sld};
          forward_rows<P, 1>(r0s, sld, q2, out + (i0 + i) * q2, at + (i0 + i) * q2);
        }
      }
#endif
      for (; i < m; ++i)
        forward_pair<P>(stage + 2 * i * sld, sld, q2, out + (i0 + i) * q2, at + (i0 + i) * q2);
    }
  }
};

} // namespace tessera::nn::detail::maxpool2
