#pragma once
/// \file conv/workspace.hpp
/// conv2d_workspace: the scratch memory of the im2col convolutions, kept between calls so that a
/// training loop allocates it once. A call grows it (at its start, never inside its loops) when
/// the problem needs more; it never shrinks.
///
///   tessera::conv2d_workspace<> ws;                  // default column budget, 8 MiB
///   for (...) tessera::conv2d_forward(exec, x, w, b, y, params, ws);
///
/// What a call needs (bytes), with Cg = C / groups, Kg = K / groups, e = element size of x:
///   column tile   Cg*R*S * (t*Q) * e   (4 bytes per element for backward-data's fp32 columns)
///   t = output rows per tile = clamp(column_budget / (Cg*R*S * Q * e), 1, P)
/// plus, only where the destination is not fp32 and needs fp32 accumulation: an fp32 tile of
/// Kg * t*Q (forward with bias), one image of C*H*W floats (backward-data) or K*Cg*R*S floats
/// (backward-weight). So the column buffer is at most max(column_budget, one output row of
/// columns), independent of the batch size.

#include <tessera/tensor/extents.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace tessera {

/// Reusable scratch memory for conv2d_* calls on one memory space. Not thread-safe: one
/// workspace per concurrent caller.
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class conv2d_workspace {
public:
  using memory_space = MemorySpace;

  /// 8 MiB: one tile of columns then stays within a Zen 4/5 CCD's 32 MiB L3 together with the
  /// GEMM's packed panels, and is large enough (>= 2 output rows for every layer of ResNet-50)
  /// that the per-tile GEMM is not dominated by its fixed cost.
  static constexpr std::size_t default_column_budget = std::size_t{8} << 20;

  /// column_budget: the bytes one tile of im2col columns may use (at least one output row of
  /// columns is always used, even if that is more).
  explicit conv2d_workspace(std::size_t column_budget = default_column_budget)
      : column_budget_(column_budget) {}

  std::size_t column_budget() const noexcept { return column_budget_; }
  /// Bytes currently allocated.
  std::size_t capacity() const noexcept { return buf_.extent(0); }

  /// Makes at least `bytes` available (reallocating, without preserving contents, when it is
  /// smaller) and returns the base address, aligned to 64 bytes (Kokkos' allocation alignment).
  unsigned char* reserve(std::size_t bytes) {
    if (buf_.extent(0) < bytes)
      buf_ = Kokkos::View<unsigned char*, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "tessera::conv2d_workspace"), bytes);
    return buf_.data();
  }

private:
  std::size_t column_budget_;
  Kokkos::View<unsigned char*, MemorySpace> buf_;
};

namespace detail {
/// Bytes rounded up to a multiple of 64, so regions carved from a workspace stay aligned.
constexpr std::size_t round_up_64(std::size_t b) noexcept {
  return (b + 63) / 64 * 64;
}
} // namespace detail

} // namespace tessera
