#pragma once
/// \file conv/workspace.hpp
/// conv2d_workspace: the scratch memory of the im2col convolutions, kept between calls so that a
/// training loop allocates it once. A call grows it (at its start, never inside its loops) when
/// the problem needs more; it never shrinks.
///
///   tessera::conv2d_workspace<> ws;                  // default column budget, 8 MiB
///   for (...) tessera::conv2d_forward(exec, x, w, b, y, params, ws);
///
/// What a call needs, with Cg = C/groups, Kg = K/groups, CRS = Cg*R*S, e = bytes per element of
/// the column matrix (x's element size; 4 for backward-data, whose columns are fp32):
///  - the output is cut into tiles whose column matrix (CRS, t columns) fits column_budget():
///    either several whole images (only while t <= 4096 columns, see
///    detail::target_tile_columns) or one image in bands of output rows (at least one row);
///  - column tile: CRS * t * e bytes <= max(column_budget, CRS * Q * e);
///  - multi-image tiles also gather dy / scatter y through a (Kg, t) tile (<= CRS * t * e for
///    usual layers); low-precision outputs accumulate in fp32 first: one tile's images
///    (C*H*W floats each) for backward-data, K*CRS floats for backward-weight.
/// The host implicit-GEMM paths (conv/detail/implicit.hpp: fp32, and operands exact in bf16
/// through bf16 pairs or AMX tiles) need no columns. Forward and stride-1 backward-data: the
/// packed weights (K/groups rounded up to 32, times CRS values per group: floats, or bf16 pairs
/// padded to the pair planes or tile steps) and, per thread, either a zero-padded band of the
/// input rows one unit reads (a unit: about 224 output pixels, at least one output row; on AMX
/// tiles 256 pixels, the band then as chunks of 64-byte pixel rows, or for few input channels
/// the pixels' rows of input segments, 64 bytes per pixel and 32 reduction values) with a block
/// of sums (the unit's slots x K/groups rounded up to 32 floats) and its channel rows (the same
/// plus 16 slots per channel), or a packed input block (224 x 512 floats) and a block of sums.
/// Backward-weight, per thread: the padded bands of a block of images (at most 512 KiB) and dy
/// copied onto their grid (about 6 KiB per output channel: a block spans about 96 vectors of
/// pixels), or the packed blocks (about 1 MiB + 2 KiB per output channel of a group), and the
/// thread's dW sums (CRS, rounded up to 14 on the packed path, times K/groups, rounded up to 32
/// there, per group). Backward-weight on AMX tiles, per thread: the bf16 bands and dy pairs of a
/// block of images (at most 512 KiB unless one band row alone is more), 16 rows of dy on the band's
/// grid, and the dW sums (R*S x C/groups x K/groups, each channel count rounded up to 16, floats
/// per group). Strided backward-weight in bf16 pairs (conv/detail/phases.hpp) adds the phase
/// images of as many images as column_budget() holds (at least one; C*H*W values each, padded
/// to multiples of the strides) and, when that is fewer than N, K*CRS floats of sums. The total
/// is independent of the batch size: never N*CRS*P*Q.

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
