#pragma once
/// \file precision/vector_convert.hpp
/// Whole-array conversions on the host, bit-identical to the scalar ones in convert.hpp
/// (including the NaN codes they produce); float <-> fp16 with F16C where the target has it;
/// every other pair vectorised with xsimd batches of the widest
/// architecture the translation unit is compiled for (xsimd::default_arch: AVX-512 under
/// -march=native on a current x86 CPU).
///
///   tessera::convert_n<tessera::bf16>(src_floats, dst_bf16, n);
///   tessera::convert_n<tessera::fp8_e4m3, tessera::saturate>(src_bf16, dst_e4m3, n);
///
/// How: every element is widened to its float bit pattern in 32-bit lanes (exact: decode), then
/// rounded to the target's code in the same lanes (encode), then narrowed on store. This is the
/// scalar path `from_float<To>(to_float(x))` written branch-free: each special case (NaN,
/// overflow, subnormal target) is computed for all lanes and chosen with a select.

#include <tessera/precision/convert.hpp>
#include <tessera/simd/lanes.hpp>

#if !TESSERA_DEVICE_PASS && (defined(__AVX512F__) || defined(__F16C__))
#include <immintrin.h>
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tessera {

namespace detail {

#if !TESSERA_DEVICE_PASS

/// The storage types the vector path handles: those of the precisions in known_precisions (each
/// is coded by its precision_traits<P>::encoding); anything else converts element by element.
template <class S, class List = known_precisions>
inline constexpr bool has_vector_codec = false;
template <class S, class... Ps>
inline constexpr bool
    has_vector_codec<S, precision_list<Ps...>> = (std::is_same_v<S, storage_t<Ps>> || ...);

/// Storage type S -> float bit patterns, lane by lane. Mirrors the scalar to_float of each type.
template <class S, class A>
inline simd::lanes<A> vector_decode(const simd::lanes<A>& b) noexcept {
  using L = simd::lanes<A>;
  using T = precision_traits<precision_of_t<S>>;
  if constexpr (T::encoding == precision_encoding::binary32) {
    return b;
  } else if constexpr (T::encoding == precision_encoding::binary32_top_half) {
    return b << 16;
  } else {
    constexpr int man_bits = S::mantissa_bits, bias = S::bias, code_bits = 8 * sizeof(S);
    constexpr std::int32_t exp_field = (1 << S::exponent_bits) - 1;
    constexpr std::int32_t man_mask = (1 << man_bits) - 1;
    const L sign = ((b >> (code_bits - 1)) & L(1)) << 31;
    const L mag = b & L((1 << (code_bits - 1)) - 1);
    // Normal: shift exponent and mantissa into place and rebias the exponent.
    const L normal = (mag << (23 - man_bits)) + L((127 - bias) << 23);
    // Subnormal (exponent field 0): mantissa * 2^(1 - bias - man_bits), an exact product.
    constexpr float step =
        bit_cast<float>(static_cast<std::uint32_t>(127 + 1 - bias - man_bits) << 23);
    const L sub =
        xsimd::bitwise_cast<L>(xsimd::batch_cast<float>(mag) * xsimd::batch<float, A>(step));
    L r = xsimd::select(mag <= L(man_mask), sub, normal);
    if constexpr (S::has_inf) {
      // Exponent field all ones: infinity (mantissa 0) or NaN, payload kept as the scalar does
      // (and quieted where the scalar quiets it).
      const L man = mag & L(man_mask);
      L special = L(0x7f800000) | (man << (23 - man_bits));
      if constexpr (S::quiet_nan_on_decode)
        special = xsimd::select(man != L(0), special | L(0x00400000), special);
      r = xsimd::select(mag >= L(exp_field << man_bits), special, r);
    } else {
      // E4M3FN: only S.1111.111 is NaN; it decodes to the default quiet NaN.
      r = xsimd::select(mag == L((1 << (code_bits - 1)) - 1), L(0x7fc00000), r);
    }
    return r | sign;
  }
}

/// Float bit patterns u -> codes of precision To under Policy (in the low bits of each lane).
/// Mirrors bfloat16::from_float and detail::encode_minifloat exactly.
template <class To, class Policy, class A>
inline simd::lanes<A> vector_encode(const simd::lanes<A>& u) noexcept {
  using L = simd::lanes<A>;
  using T = precision_traits<To>;
  constexpr bool sat = std::is_same_v<Policy, saturate>;
  if constexpr (T::encoding == precision_encoding::binary32) {
    return u;
  } else if constexpr (T::encoding == precision_encoding::binary32_top_half) {
    const L a = u & L(0x7fffffff);
    const L sign = (u >> 16) & L(0x8000); // arithmetic shift, then masked
    // RNE on the 16 dropped bits; a <= 0x7f800000 for non-NaN lanes, so the sum cannot wrap.
    L r = ((a + L(0x7fff) + ((a >> 16) & L(1))) >> 16) | sign;
    if constexpr (sat) r = xsimd::select(a >= L(0x7f7f8000), sign | L(0x7f7f), r);
    // NaN: the input's top half with the quiet bit set (upper lane bits are dropped on store).
    return xsimd::select(a > L(0x7f800000), (u >> 16) | L(0x0040), r);
  } else {
    using S = storage_t<To>;
    constexpr int man_bits = S::mantissa_bits, bias = S::bias, code_bits = 8 * sizeof(S);
    // The storage type's own constants, as its scalar encoder uses them.
    constexpr std::int32_t max_code = S::max_code, overflow_code = S::overflow_code;
    const L sign = (u >> (32 - code_bits)) & L(1 << (code_bits - 1));
    const L a = u & L(0x7fffffff);
    // Normal in the target (biased target exponent >= 1): round the whole magnitude at bit
    // 23 - man_bits and rebias, in one sum (the rebias is a multiple of 2^shift and such lanes
    // stay non-negative, so subtracting it before the shift is exact).
    constexpr int shift = 23 - man_bits;
    const L normal_code =
        (a + L((1 << (shift - 1)) - 1 - ((127 - bias) << 23)) + ((a >> shift) & L(1))) >> shift;
    // Below the target's min normal (its subnormals, zero, float subnormals): the subnormal
    // code is |x| / 2^(1 - bias - man_bits) rounded to nearest even. The product by a power of
    // two is exact and the float -> int conversion rounds to nearest even (the default rounding
    // mode, which every float operation here assumes); a value that rounds up to the min normal
    // gives 2^man_bits, the min normal's code. The input is clamped to the min normal first so
    // that no lane overflows the conversion (which would raise FE_INVALID for normal lanes).
    using F = xsimd::batch<float, A>;
    constexpr float min_normal = bit_cast<float>(static_cast<std::uint32_t>(128 - bias) << 23);
    constexpr float to_code =
        bit_cast<float>(static_cast<std::uint32_t>(127 + bias + man_bits - 1) << 23);
    const L subnormal_code =
        xsimd::nearbyint_as_int(xsimd::min(xsimd::bitwise_cast<F>(a), F(min_normal)) * F(to_code));
    // Both computed for every lane and chosen by a select: no branch on the data.
    L code = xsimd::select(a >= L((128 - bias) << 23), normal_code, subnormal_code);
    // Beyond max finite (this includes infinity): the policy decides. The overflow code is the
    // one after max finite, so either policy is a min.
    static_assert(overflow_code == max_code + 1);
    code = xsimd::min(code, L(sat ? max_code : overflow_code));
    if constexpr (S::nan_keeps_payload) {
      const L nan = L(overflow_code | (1 << (man_bits - 1))) |
                    ((a >> (23 - man_bits)) & L((1 << man_bits) - 1));
      code = xsimd::select(a > L(0x7f800000), nan, code);
    } else {
      code = xsimd::select(a > L(0x7f800000), L(static_cast<std::int32_t>(S::nan_code)), code);
    }
    return code | sign;
  }
}

/// Converts the first n - n % (2 * lanes) elements with batches of arch A; returns how many.
template <class To, class Policy, class A, class From>
inline std::size_t vector_convert_body(const From* src, storage_t<To>* dst,
                                       std::size_t n) noexcept {
  using L = simd::lanes<A>;
  constexpr std::size_t w = L::size;
  constexpr int in_bytes = sizeof(From), out_bytes = sizeof(storage_t<To>);
  const auto* in = reinterpret_cast<const unsigned char*>(src);
  auto* out = reinterpret_cast<unsigned char*>(dst);
  const std::size_t n_body = n - n % (2 * w);
  // Two independent batches per iteration keep both vector pipes busy.
  for (std::size_t i = 0; i < n_body; i += 2 * w) {
    const L u0 = vector_decode<From, A>(simd::load_widened<A, in_bytes>(in + i * in_bytes));
    const L u1 = vector_decode<From, A>(simd::load_widened<A, in_bytes>(in + (i + w) * in_bytes));
    simd::store_narrowed<A, out_bytes>(out + i * out_bytes, vector_encode<To, Policy, A>(u0));
    simd::store_narrowed<A, out_bytes>(out + (i + w) * out_bytes, vector_encode<To, Policy, A>(u1));
  }
  return n_body;
}

/// The largest magnitude of src[0, n) as a float bit pattern with the sign cleared (NaN patterns
/// lie above +inf, so a NaN wins), the scalar `bit_cast<uint32>(to_float(x)) & 0x7fffffff` maxed
/// over the elements. If Quantize, also dst[i] = from_float<To, saturate>(to_float(src[i]) *
/// scale), bit for bit as the scalar path (the product is the same single float rounding).
/// Batches of arch A; the tail scalar.
template <class To, bool Quantize, class A, class From>
inline std::uint32_t vector_amax_quantize(const From* src, storage_t<To>* dst, std::size_t n,
                                          float scale) noexcept {
  using L = simd::lanes<A>;
  using F = xsimd::batch<float, A>;
  constexpr std::size_t w = L::size;
  constexpr int in_bytes = sizeof(From), out_bytes = sizeof(storage_t<To>);
  const auto* in = reinterpret_cast<const unsigned char*>(src);
  auto* out = reinterpret_cast<unsigned char*>(dst);
  const L magnitude(0x7fffffff);
  L m0(0), m1(0);
  const F s(scale);
  const std::size_t n_body = n - n % (2 * w);
  for (std::size_t i = 0; i < n_body; i += 2 * w) {
    const L u0 = vector_decode<From, A>(simd::load_widened<A, in_bytes>(in + i * in_bytes));
    const L u1 = vector_decode<From, A>(simd::load_widened<A, in_bytes>(in + (i + w) * in_bytes));
    // Magnitudes are below 2^31: a signed max is their unsigned max.
    m0 = xsimd::max(m0, u0 & magnitude);
    m1 = xsimd::max(m1, u1 & magnitude);
    if constexpr (Quantize) {
      const L q0 =
          vector_encode<To, saturate, A>(xsimd::bitwise_cast<L>(xsimd::bitwise_cast<F>(u0) * s));
      const L q1 =
          vector_encode<To, saturate, A>(xsimd::bitwise_cast<L>(xsimd::bitwise_cast<F>(u1) * s));
      simd::store_narrowed<A, out_bytes>(out + i * out_bytes, q0);
      simd::store_narrowed<A, out_bytes>(out + (i + w) * out_bytes, q1);
    }
  }
  // xsimd 8.1 has no horizontal max: the lanes through memory.
  alignas(A::alignment()) std::int32_t lane_max[w];
  xsimd::max(m0, m1).store_aligned(lane_max);
  std::uint32_t m = 0;
  for (const std::int32_t v : lane_max)
    m = static_cast<std::uint32_t>(v) > m ? static_cast<std::uint32_t>(v) : m;
  for (std::size_t i = n_body; i < n; ++i) {
    const float v = to_float(src[i]);
    if constexpr (Quantize) dst[i] = from_float<To, saturate>(v * scale);
    const std::uint32_t a = bit_cast<std::uint32_t>(v) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}

/// Whether F16C converts From -> To: float -> a precision whose traits say f16c, or back.
template <class To, class From>
inline constexpr bool f16c_pair = (std::is_same_v<From, float> && precision_traits<To>::f16c) ||
                                  (has_vector_codec<From> &&
                                   precision_traits<To>::encoding == precision_encoding::binary32 &&
                                   precision_traits<precision_of_t<From>>::f16c);

#if defined(__AVX512F__) || defined(__F16C__)
inline constexpr bool have_f16c = true;

/// The first n - n % lanes elements with the F16C conversions (VCVTPS2PH rounding to nearest
/// even, VCVTPH2PS): IEEE-754 overflow, subnormals and NaNs, which is what float16's scalar
/// conversions do bit for bit (tests/precision/test_exhaustive.cpp). Saturation clamps the input
/// to +-max finite first (min/max keep a NaN: it is their second operand). Returns how many.
template <class To, class Policy, class From>
inline std::size_t f16c_convert_body(const From* src, storage_t<To>* dst, std::size_t n) noexcept {
#if defined(__AVX512F__)
  constexpr std::size_t w = 16;
#else
  constexpr std::size_t w = 8;
#endif
  const std::size_t n_body = n - n % w;
  if constexpr (std::is_same_v<From, float>) {
    constexpr float mx = precision_traits<To>::max_finite;
    constexpr bool sat = std::is_same_v<Policy, saturate>;
    for (std::size_t i = 0; i < n_body; i += w) {
#if defined(__AVX512F__)
      __m512 x = _mm512_loadu_ps(src + i);
      if constexpr (sat)
        x = _mm512_max_ps(_mm512_set1_ps(-mx), _mm512_min_ps(_mm512_set1_ps(mx), x));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
      __m256 x = _mm256_loadu_ps(src + i);
      if constexpr (sat)
        x = _mm256_max_ps(_mm256_set1_ps(-mx), _mm256_min_ps(_mm256_set1_ps(mx), x));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
#endif
    }
  } else {
    for (std::size_t i = 0; i < n_body; i += w) {
#if defined(__AVX512F__)
      _mm512_storeu_ps(
          reinterpret_cast<float*>(dst + i),
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#else
      _mm256_storeu_ps(reinterpret_cast<float*>(dst + i),
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    }
  }
  return n_body;
}
#else
inline constexpr bool have_f16c = false;
template <class To, class Policy, class From>
inline std::size_t f16c_convert_body(const From*, storage_t<To>*, std::size_t) noexcept {
  return 0;
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
inline constexpr bool have_cvtneps2bf16 = true;

/// float -> bf16 (overflow to infinity) for the first n - n % 16 elements by AVX512_BF16's
/// VCVTNEPS2BF16, one instruction per 16 values. It rounds to nearest even and turns a NaN
/// into its top half with the quiet bit set, as bfloat16::from_float does, but it treats
/// float subnormal inputs as zero (the instruction ignores MXCSR): a batch holding one takes
/// the scalar conversion instead (bf16 has float's exponent range, so a float subnormal rounds
/// to a bf16 subnormal or zero). Returns how many.
inline std::size_t cvtneps2bf16_body(const float* src, bfloat16* dst, std::size_t n) noexcept {
  const std::size_t n_body = n - n % 16;
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff),
                min_normal = _mm512_set1_epi32(0x00800000);
  for (std::size_t i = 0; i < n_body; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(x), magnitude);
    const __mmask16 subnormal =
        _mm512_mask_cmplt_epi32_mask(_mm512_test_epi32_mask(a, a), a, min_normal);
    if (subnormal != 0) {
      for (std::size_t l = 0; l < 16; ++l)
        dst[i + l] = convert<bf16, overflow_to_inf_nan>(src[i + l]);
      continue;
    }
    const __m256bh r = _mm512_cvtneps_pbh(x);
    __m256i bits;
    std::memcpy(&bits, &r, sizeof bits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bits);
  }
  return n_body;
}
#else
inline constexpr bool have_cvtneps2bf16 = false;
inline std::size_t cvtneps2bf16_body(const float*, bfloat16*, std::size_t) noexcept {
  return 0;
}
#endif

#endif // !TESSERA_DEVICE_PASS

} // namespace detail

namespace detail {
/// convert_n, with conversion instructions where UseHardware and the pair allows: F16C for
/// float <-> fp16, AVX512_BF16's VCVTNEPS2BF16 for float -> bf16 (overflow to infinity); else,
/// or without them, the portable xsimd codec. Tests call both forms and compare the bits.
template <class To, class Policy, bool UseHardware, class From>
void convert_n_impl(const From* src, storage_t<To>* dst, std::size_t n) noexcept {
  std::size_t i = 0;
#if !TESSERA_DEVICE_PASS
  if constexpr (UseHardware && have_f16c && f16c_pair<To, From>)
    i = f16c_convert_body<To, Policy>(src, dst, n);
  else if constexpr (UseHardware && have_cvtneps2bf16 && std::is_same_v<From, float> &&
                     std::is_same_v<To, bf16> && std::is_same_v<Policy, overflow_to_inf_nan>)
    i = cvtneps2bf16_body(src, dst, n);
  else if constexpr (simd::available && has_vector_codec<From> && has_vector_codec<storage_t<To>>)
    i = vector_convert_body<To, Policy, xsimd::default_arch>(src, dst, n);
#endif
  for (; i < n; ++i) dst[i] = convert<To, Policy>(src[i]);
}
} // namespace detail

namespace detail {
/// max over src[0, n) of the magnitude's float bit pattern (see vector_amax_quantize), and, if
/// Quantize, dst[i] = from_float<To, saturate>(to_float(src[i]) * scale): the host kernels of
/// tessera::amax and tessera::quantize_with_scale, vectorised where the types have a codec.
template <class To, bool Quantize, class From>
std::uint32_t amax_quantize_n(const From* src, storage_t<To>* dst, std::size_t n,
                              float scale) noexcept {
#if !TESSERA_DEVICE_PASS
  if constexpr (simd::available && has_vector_codec<From> && has_vector_codec<storage_t<To>>)
    return vector_amax_quantize<To, Quantize, xsimd::default_arch>(src, dst, n, scale);
#endif
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = to_float(src[i]);
    if constexpr (Quantize) dst[i] = from_float<To, saturate>(v * scale);
    const std::uint32_t a = bit_cast<std::uint32_t>(v) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return m;
}
} // namespace detail

/// Converts n elements of a storage type From (float, bfloat16, float16, float8_e4m3,
/// float8_e5m2) to storage of precision To on the host: dst[i] = convert<To, Policy>(src[i]) bit
/// for bit, including the NaN codes. float <-> float16 takes the F16C instructions where the
/// translation unit has them (__F16C__ or __AVX512F__); other pairs are vectorised with xsimd
/// where the translation unit has a SIMD arch (the last n % (2 * batch size) elements, and other
/// From types, take the scalar path).
/// Preconditions: src and dst do not overlap. Complexity: O(n), memory-bound on AVX-512.
///
///   std::vector<float> w(n);  std::vector<tessera::float8_e4m3> q(n);
///   tessera::convert_n<tessera::fp8_e4m3, tessera::saturate>(w.data(), q.data(), n);
template <Precision To, OverflowPolicy Policy = default_overflow_t<To>, class From>
void convert_n(const From* src, storage_t<To>* dst, std::size_t n) noexcept {
  detail::convert_n_impl<To, Policy, true>(src, dst, n);
}

} // namespace tessera
