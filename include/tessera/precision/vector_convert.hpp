#pragma once
/// \file precision/vector_convert.hpp
/// Whole-array conversions on the host, bit-identical to the scalar ones in convert.hpp
/// (including the NaN codes they produce), vectorised with xsimd batches of the widest
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

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tessera {

namespace detail {

#if !TESSERA_DEVICE_PASS

/// The storage types the vector path handles; anything else converts element by element.
template <class S>
inline constexpr bool has_vector_codec =
    std::is_same_v<S, float> || std::is_same_v<S, bfloat16> || std::is_same_v<S, float8_e4m3> ||
    std::is_same_v<S, float8_e5m2>;

/// Storage type S -> float bit patterns, lane by lane. Mirrors the scalar to_float of each type.
template <class S, class A>
inline simd::lanes<A> vector_decode(const simd::lanes<A>& b) noexcept {
  using L = simd::lanes<A>;
  if constexpr (std::is_same_v<S, float>) {
    return b;
  } else if constexpr (std::is_same_v<S, bfloat16>) {
    return b << 16;
  } else {
    constexpr int man_bits = S::mantissa_bits, bias = S::bias;
    constexpr std::int32_t exp_field = (1 << S::exponent_bits) - 1;
    constexpr std::int32_t man_mask = (1 << man_bits) - 1;
    const L sign = (b & L(0x80)) << 24;
    const L mag = b & L(0x7f);
    // Normal: shift exponent and mantissa into place and rebias the exponent.
    const L normal = (mag << (23 - man_bits)) + L((127 - bias) << 23);
    // Subnormal (exponent field 0): mantissa * 2^(1 - bias - man_bits), an exact product.
    constexpr float step =
        bit_cast<float>(static_cast<std::uint32_t>(127 + 1 - bias - man_bits) << 23);
    const L sub =
        xsimd::bitwise_cast<L>(xsimd::batch_cast<float>(mag) * xsimd::batch<float, A>(step));
    L r = xsimd::select(mag <= L(man_mask), sub, normal);
    if constexpr (std::is_same_v<S, float8_e5m2>) {
      // Exponent field all ones: infinity (mantissa 0) or NaN, payload kept as the scalar does.
      r = xsimd::select(mag >= L(exp_field << man_bits),
                        L(0x7f800000) | ((mag & L(man_mask)) << (23 - man_bits)), r);
    } else {
      // E4M3FN: only S.1111.111 is NaN; it decodes to the default quiet NaN.
      r = xsimd::select(mag == L(0x7f), L(0x7fc00000), r);
    }
    return r | sign;
  }
}

/// Round-to-nearest-even right shift of non-negative lanes x by s (each in [1, 25]); mirrors
/// detail::rne_shift. Lanes of x must stay below 2^31 - 2^24 for the sum not to wrap.
template <class A>
inline simd::lanes<A> vector_rne_shift(const simd::lanes<A>& x, const simd::lanes<A>& s) noexcept {
  using L = simd::lanes<A>;
  const L one(1);
  const L lsb = simd::shift_right<A>(x, s) & one;
  const L half_minus_one = simd::shift_left<A>(one, s - one) - one;
  return simd::shift_right<A>(x + half_minus_one + lsb, s);
}

/// Float bit patterns u -> codes of precision To under Policy (in the low bits of each lane).
/// Mirrors bfloat16::from_float and detail::encode_fp8 exactly.
template <class To, class Policy, class A>
inline simd::lanes<A> vector_encode(const simd::lanes<A>& u) noexcept {
  using L = simd::lanes<A>;
  constexpr bool sat = std::is_same_v<Policy, saturate>;
  if constexpr (std::is_same_v<To, fp32>) {
    return u;
  } else if constexpr (std::is_same_v<To, bf16>) {
    const L a = u & L(0x7fffffff);
    const L sign = (u >> 16) & L(0x8000); // arithmetic shift, then masked
    // RNE on the 16 dropped bits; a <= 0x7f800000 for non-NaN lanes, so the sum cannot wrap.
    L r = ((a + L(0x7fff) + ((a >> 16) & L(1))) >> 16) | sign;
    if constexpr (sat) r = xsimd::select(a >= L(0x7f7f8000), sign | L(0x7f7f), r);
    // NaN: the input's top half with the quiet bit set (upper lane bits are dropped on store).
    return xsimd::select(a > L(0x7f800000), (u >> 16) | L(0x0040), r);
  } else {
    using S = storage_t<To>;
    constexpr int man_bits = S::mantissa_bits, bias = S::bias;
    // The same constants as the scalar encoders in storage.hpp.
    constexpr std::int32_t max_code = std::is_same_v<To, fp8_e4m3> ? 0x7e : 0x7b;
    constexpr std::int32_t overflow_code = std::is_same_v<To, fp8_e4m3> ? 0x7f : 0x7c;
    constexpr std::int32_t nan_code = std::is_same_v<To, fp8_e4m3> ? 0x7f : 0x7e;
    const L sign = (u >> 24) & L(0x80);
    const L a = u & L(0x7fffffff);
    const L exp_field = a >> 23;
    // Normal in the target (biased target exponent >= 1): round the whole magnitude at bit
    // 23 - man_bits, then rebias. Otherwise (subnormal, zero, float subnormal): round the
    // mantissa with its hidden bit by a per-lane shift; shifts >= 25 all give 0 (the mantissa
    // is below 2^24), so they are clamped to 25 to stay a valid shift count.
    const auto normal = exp_field >= L(128 - bias);
    L code;
    if (xsimd::all(normal)) {
      // Common case (no lane below the target's min normal): the same rounding with a constant
      // shift, half the instructions of the general path.
      constexpr int shift = 23 - man_bits;
      const L r = (a + L((1 << (shift - 1)) - 1) + ((a >> shift) & L(1))) >> shift;
      code = r - L((127 - bias) << man_bits);
    } else {
      const L x = xsimd::select(normal, a, (a & L(0x7fffff)) | L(0x800000));
      const L s = xsimd::select(normal, L(23 - man_bits),
                                xsimd::min(L(151 - man_bits - bias) - exp_field, L(25)));
      const L r = vector_rne_shift<A>(x, s);
      code = r - xsimd::select(normal, L((127 - bias) << man_bits), L(0));
    }
    // Beyond max finite (this includes infinity): the policy decides.
    code = xsimd::select(code > L(max_code), L(sat ? max_code : overflow_code), code);
    code = xsimd::select(a > L(0x7f800000), L(nan_code), code);
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

#endif // !TESSERA_DEVICE_PASS

} // namespace detail

/// Converts n elements of storage type From (float, bfloat16, float8_e4m3, float8_e5m2) to
/// storage of precision To on the host: dst[i] = convert<To, Policy>(src[i]) bit for bit,
/// including the NaN codes. Vectorised with xsimd where the translation unit has a SIMD arch
/// (the last n % (2 * batch size) elements, and other From types, take the scalar path).
/// Preconditions: src and dst do not overlap. Complexity: O(n), memory-bound on AVX-512.
///
///   std::vector<float> w(n);  std::vector<tessera::float8_e4m3> q(n);
///   tessera::convert_n<tessera::fp8_e4m3, tessera::saturate>(w.data(), q.data(), n);
template <Precision To, OverflowPolicy Policy = default_overflow_t<To>, class From>
void convert_n(const From* src, storage_t<To>* dst, std::size_t n) noexcept {
  std::size_t i = 0;
#if !TESSERA_DEVICE_PASS
  if constexpr (detail::simd::available && detail::has_vector_codec<From> &&
                detail::has_vector_codec<storage_t<To>>)
    i = detail::vector_convert_body<To, Policy, xsimd::default_arch>(src, dst, n);
#endif
  for (; i < n; ++i) dst[i] = convert<To, Policy>(src[i]);
}

} // namespace tessera
