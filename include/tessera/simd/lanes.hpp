#pragma once
/// \file simd/lanes.hpp
/// xsimd glue for bit-level work on 32-bit lanes: zero-extending loads of 8/16/32-bit codes and
/// truncating stores back to 8/16/32 bits. xsimd 8.1 has no narrowing/widening packs, so
/// AVX-512 gets intrinsics and every other arch a form the compiler vectorises.
/// Host only: nothing here exists in a device compilation pass.
///
///   using A = xsimd::default_arch;
///   auto v = tessera::detail::simd::load_widened<A>(bytes);        // 16 codes -> 16 lanes
///   tessera::detail::simd::store_narrowed<A>(out, v & 0xff);       // 16 lanes -> 16 bytes

#include <tessera/config/macros.hpp>

#if !TESSERA_DEVICE_PASS
// GCC 12.2's AVX-512 intrinsics start from _mm512_undefined_*() and trip -W(maybe-)uninitialized
// wherever they are inlined (GCC PR 105593, fixed in 12.3). GCC attributes the warning to the
// intrinsic header's lines, so ignoring it while the headers are first read silences exactly
// those lines and nothing in the user's code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <xsimd/xsimd.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tessera::detail::simd {

/// True when the translation unit was compiled for some SIMD architecture xsimd knows.
inline constexpr bool available = !std::is_same_v<xsimd::default_arch, xsimd::unavailable>;

/// 32-bit lanes of arch A. Signed, so that comparisons are plain signed compares on every arch
/// (xsimd 8.1 has no unsigned compare before AVX-512); callers keep compared values below 2^31.
template <class A>
using lanes = xsimd::batch<std::int32_t, A>;

template <class A>
inline constexpr bool is_avx512 =
#if defined(__AVX512F__)
    std::is_base_of_v<xsimd::avx512f, A>;
#else
    false;
#endif

/// Loads lanes<A>::size codes of Bytes bytes each from p (unaligned), zero-extended to 32 bits.
template <class A, int Bytes>
inline lanes<A> load_widened(const void* p) noexcept {
  static_assert(Bytes == 1 || Bytes == 2 || Bytes == 4, "codes are 8, 16 or 32 bits wide");
  constexpr std::size_t n = lanes<A>::size;
#if defined(__AVX512F__)
  if constexpr (is_avx512<A>) {
    if constexpr (Bytes == 1)
      return _mm512_cvtepu8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    else if constexpr (Bytes == 2)
      return _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    else
      return _mm512_loadu_si512(p);
  }
#endif
  using code_t = std::conditional_t<Bytes == 1, std::uint8_t,
                                    std::conditional_t<Bytes == 2, std::uint16_t, std::uint32_t>>;
  code_t codes[n];
  std::memcpy(codes, p, sizeof codes);
  alignas(A::alignment()) std::int32_t wide[n];
  for (std::size_t i = 0; i < n; ++i) wide[i] = static_cast<std::int32_t>(codes[i]);
  return lanes<A>::load_aligned(wide);
}

/// Stores the low Bytes bytes of each lane of v to p (unaligned), lane i at p + i * Bytes.
template <class A, int Bytes>
inline void store_narrowed(void* p, const lanes<A>& v) noexcept {
  static_assert(Bytes == 1 || Bytes == 2 || Bytes == 4, "codes are 8, 16 or 32 bits wide");
  constexpr std::size_t n = lanes<A>::size;
#if defined(__AVX512F__)
  if constexpr (is_avx512<A>) {
    // Convert in registers and store plainly: the memory-destination forms of VPMOVDB/VPMOVDW
    // are microcoded on AMD Zen 4/5.
    if constexpr (Bytes == 1)
      _mm_storeu_si128(static_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
    else if constexpr (Bytes == 2)
      _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
    else
      _mm512_storeu_si512(p, v);
    return;
  }
#endif
  using code_t = std::conditional_t<Bytes == 1, std::uint8_t,
                                    std::conditional_t<Bytes == 2, std::uint16_t, std::uint32_t>>;
  alignas(A::alignment()) std::int32_t wide[n];
  v.store_aligned(wide);
  code_t codes[n];
  for (std::size_t i = 0; i < n; ++i) codes[i] = static_cast<code_t>(wide[i]);
  std::memcpy(p, codes, sizeof codes);
}

} // namespace tessera::detail::simd

#endif // !TESSERA_DEVICE_PASS
