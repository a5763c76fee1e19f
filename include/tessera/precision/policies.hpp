#pragma once
/// \file precision/policies.hpp
/// Overflow policies for narrowing conversions (float -> bf16 / fp8). Rounding is always to
/// nearest, ties to even.

#include <type_traits>

namespace tessera {

/// Finite values beyond the largest finite value, and infinities, become +-max finite. NaN stays
/// NaN. This is what fp8 training uses (OCP "saturation mode"; NVIDIA's __NV_SATFINITE).
struct saturate {};

/// Values that round beyond max finite become +-inf where the format has infinities (bf16,
/// e5m2) and NaN where it has none (e4m3). This is IEEE-754 behaviour.
struct overflow_to_inf_nan {};

template <class P>
concept OverflowPolicy =
    std::is_same_v<P, saturate> || std::is_same_v<P, overflow_to_inf_nan>;

} // namespace tessera
