#pragma once
/// \file conv/detail/plan.hpp
/// How a conv2d pass runs, once its call is checked: the tiling of the output (conv_plan: whole
/// images or bands of output rows, sized by the workspace's column budget), the scratch regions
/// carved from the workspace, when the implicit-GEMM path is taken (use_implicit) and its
/// geometry for forward and backward-data (conv/detail/implicit.hpp runs it).

#include <tessera/conv/detail/checks.hpp>
#include <tessera/conv/detail/implicit.hpp>
#include <tessera/conv/detail/narrow.hpp>

#include <array>
#include <cstddef>

namespace tessera::detail {

/// Output columns a GEMM call should have at least, when whole images are small: images are
/// grouped into one call until a tile has 4096 columns (e.g. 20 images of 14 x 14). Each call
/// costs a few parallel launches and barriers (10-50 us on a loaded 2-core host), which 4096
/// columns x (Kg x C/g*R*S) multiply-adds amortise for every layer of the benchmark set.
inline constexpr index_t target_tile_columns = 4096;

/// How the output is tiled: `images` whole images per tile (then rows == P), or one image in
/// tiles of `rows` output rows. Chosen so that a column tile of `row_elems` entries per output
/// row of `elem_bytes` each fits the budget (at least one output row per tile).
struct conv_plan {
  index_t images, rows;
  index_t max_cols(index_t Q) const noexcept { return images * rows * Q; }
};

inline conv_plan plan_tiles(const conv2d_problem& pb, std::size_t budget, index_t row_elems,
                            std::size_t elem_bytes) {
  const std::size_t row_bytes = static_cast<std::size_t>(row_elems) * elem_bytes;
  const std::size_t fit = row_bytes == 0 ? static_cast<std::size_t>(pb.P) : budget / row_bytes;
  if (fit < static_cast<std::size_t>(pb.P)) return {1, fit < 1 ? 1 : static_cast<index_t>(fit)};
  const index_t pq = pb.P * pb.Q < 1 ? 1 : pb.P * pb.Q;
  index_t nb = target_tile_columns / pq;
  const index_t fit_images = static_cast<index_t>(fit / static_cast<std::size_t>(pb.P));
  nb = nb < fit_images ? nb : fit_images;
  nb = nb < pb.N ? nb : pb.N;
  return {nb < 1 ? 1 : nb, pb.P};
}

/// Calls f(tile) for the tiles of a plan: images outer, output rows inner.
template <class F>
void for_each_tile(const conv2d_problem& pb, const conv_plan& plan, F&& f) {
  for (index_t n0 = 0; n0 < pb.N; n0 += plan.images)
    for (index_t p0 = 0; p0 < pb.P; p0 += plan.rows)
      f(conv_tile{n0, n0 + plan.images < pb.N ? plan.images : pb.N - n0, p0,
                  p0 + plan.rows < pb.P ? p0 + plan.rows : pb.P});
}

/// Consecutive 64-byte aligned regions of the given sizes from one workspace allocation.
template <std::size_t K, class M>
std::array<unsigned char*, K> carve(conv2d_workspace<M>& ws, std::array<std::size_t, K> bytes) {
  std::size_t total = 0;
  for (auto& b : bytes) total += b = round_up_64(b);
  unsigned char* p = ws.reserve(total);
  std::array<unsigned char*, K> out{};
  for (std::size_t i = 0; i < K; ++i) out[i] = p, p += bytes[i];
  return out;
}

/// When the implicit-GEMM path (conv/detail/implicit.hpp) is taken, for a pass whose GEMM has
/// `channels` output channels per group and a reduction of `reduction` = channels in * R * S:
///  - at least 16 channels: its channel panels are 32 wide, fewer would leave most unused;
///  - a reduction of at least 64: below that the transposed store of its pixel-major results
///    to NCHW costs more than the GEMM (measured: C*R*S = 9 runs 1.5x faster as im2col + GEMM);
///  - not 1x1 stride 1 unpadded: the GEMM then reads x itself (no im2col to save) and writes y
///    rows directly, 2x faster than the transposed store (C = 64, K = 256, 56 x 56).
inline constexpr index_t implicit_min_channels = 16;
inline constexpr index_t implicit_min_reduction = 64;

inline index_t crs_of(const conv2d_problem& pb, index_t channels_in) {
  return channels_in * pb.R * pb.S;
}
inline bool use_implicit(const conv2d_problem& pb, index_t channels, index_t reduction) {
  return channels >= implicit_min_channels && reduction >= implicit_min_reduction &&
         !pb.pointwise();
}

#if !TESSERA_DEVICE_PASS
/// The implicit-GEMM geometry of conv2d_forward.
inline implicit_conv::geometry forward_geometry(const conv2d_problem& pb, float alpha) {
  const conv2d_params& p = pb.prm;
  return {.N = pb.N,
          .G = pb.G,
          .cin = pb.Cg,
          .cout = pb.Kg,
          .Hin = pb.H,
          .Win = pb.W,
          .Hout = pb.P,
          .Wout = pb.Q,
          .R = pb.R,
          .S = pb.S,
          .sh = p.stride_h,
          .sw = p.stride_w,
          .dh = p.dilation_h,
          .dw = p.dilation_w,
          .pt = p.pad_top,
          .pl = p.pad_left,
          .alpha = alpha};
}

/// The implicit-GEMM geometry of conv2d_backward_data with stride 1: dx is the convolution of
/// dy (cin = K/groups channels per group) with the weights flipped in R and S and transposed per
/// group, padding dilation*(R - 1) - pad (negative when pad is larger: a crop).
inline implicit_conv::geometry backward_data_geometry(const conv2d_problem& pb, float alpha) {
  const conv2d_params& p = pb.prm;
  return {.N = pb.N,
          .G = pb.G,
          .cin = pb.Kg,
          .cout = pb.Cg,
          .Hin = pb.P,
          .Win = pb.Q,
          .Hout = pb.H,
          .Wout = pb.W,
          .R = pb.R,
          .S = pb.S,
          .sh = 1,
          .sw = 1,
          .dh = p.dilation_h,
          .dw = p.dilation_w,
          .pt = p.dilation_h * (pb.R - 1) - p.pad_top,
          .pl = p.dilation_w * (pb.S - 1) - p.pad_left,
          .alpha = alpha};
}

/// The function store_value(k) of the implicit paths returns: the stored value of an fp32 sum v
/// is from_float<P>(e(v + b)) (Bias) or from_float<P>(e(v)), one rounding.
template <class P, class Epi, bool Bias>
struct store_rounded {
  float b = 0.f;
  Epi e;
  storage_t<P> operator()(float v) const {
    if constexpr (Bias) {
      return from_float<P>(e(v + b));
    } else {
      return from_float<P>(e(v));
    }
  }
};

/// The rows consumer of the implicit paths that stores them into an NCHW view (rows of Wout
/// contiguous): out[n, k, p0 + i, :] = f(alpha * sums[i * W + :]), f = store_value(k) (bias,
/// epilogue, rounding). Every producer hands over a channel's rows as one contiguous run (the
/// direct forms through channel_rows, the narrow form by its column blocks), so the store is
/// one loop, which GCC vectorises. A function per channel holds its bias by value (through
/// store_value(k, v) it reloaded the bias per element, the output possibly aliasing it).
template <class O>
struct rows_into {
  O* out;
  index_t ns, cs, W;
  template <class F>
  void operator()(const float* sums, index_t k, index_t n, index_t p0, index_t rows, const F& f,
                  float alpha) const {
    O* dst = out + n * ns + k * cs + p0 * W;
    for (index_t i = 0; i < rows * W; ++i) dst[i] = f(alpha * sums[i]);
  }
};

template <class OV>
rows_into<storage_t<typename OV::precision>> rows_into_view(const OV& out) {
  return {out.data(), out.stride(0), out.stride(1), out.extent(3)};
}

/// Runs the direct form of an implicit convolution (d = implicit_conv::direct_layout_for(g) or,
/// Pairs, implicit_conv::pairs_layout_for(g, ...); d.ok) of `in` with the weights w, wval(w data,
/// group, kk, j) giving B(kk, j) of a group (the element of w, converted by the packing); `rows`
/// (rows_into or another consumer of the same call) takes each channel's output rows of a band as
/// f(alpha * sum), f = store_value(k): the function that turns the fp32 value of output channel k
/// into the stored one (bias, epilogue, rounding). Pairs: the bf16 pairs form (the caller checked
/// implicit_conv::pairs_direct_for(g); wval's values are exact in bf16).
template <bool Pairs, class Exec, class IV, class WV, class M, class WVal, class StoreValue,
          class Rows>
void run_direct_rows(const Exec& exec, const implicit_conv::geometry& g,
                     const implicit_conv::direct_layout& d, const IV& in, const WV& w,
                     conv2d_workspace<M>& ws, const WVal& wval, const StoreValue& store_value,
                     const Rows& rows) {
  namespace ic = implicit_conv;
  const auto parts = static_cast<std::size_t>(ic::parts_for(exec, g, d));
  const std::size_t scratch = round_up_64(sizeof(index_t) * static_cast<std::size_t>(d.steps(g))) +
                              parts * d.part_floats(g) * 4;
  const std::size_t packed_words = Pairs ? d.packed_words(g) : ic::packed_b_floats(g);
  const auto [b_mem, s_mem] = carve<2>(ws, {packed_words * 4, scratch});
  const auto* wd = w.data();
  [[maybe_unused]] const auto wv = [=](index_t gi, index_t kk, index_t j) {
    return wval(wd, gi, kk, j);
  };
  const auto wf = [=](index_t gi, index_t kk, index_t j) { return to_float(wval(wd, gi, kk, j)); };
  if constexpr (Pairs) {
#if TESSERA_GEMM_AMX && TESSERA_GEMM_AVX512BF16
    if (d.amx) {
      ic::pack_weight_tiles(exec, g, d, reinterpret_cast<std::uint32_t*>(b_mem), wv);
    } else {
      ic::pack_weight_pairs(exec, g, d, reinterpret_cast<std::uint32_t*>(b_mem), wv);
    }
#elif TESSERA_GEMM_AVX512BF16
    ic::pack_weight_pairs(exec, g, d, reinterpret_cast<std::uint32_t*>(b_mem), wv);
#endif
  } else {
    ic::pack_weights(exec, g, reinterpret_cast<float*>(b_mem), wf);
  }
  exec.fence();
  const float alpha = g.alpha;
  ic::run_direct<Pairs>(exec, g, d, in.data(), in.stride(0), in.stride(1), in.stride(2), b_mem,
                        s_mem,
                        [&](const float* sums, index_t k, index_t n, index_t p0, index_t count) {
                          rows(sums, k, n, p0, count, store_value(k), alpha);
                        });
  exec.fence();
}

/// Runs an implicit convolution of `in` into `out` (both rank-4 NCHW views): the direct form
/// (run_direct_rows) where its layout applies, else (fp32) the packed form; wval and
/// store_value as for run_direct_rows.
template <bool Pairs = false, class Exec, class IV, class WV, class OV, class M, class WVal,
          class StoreValue>
void run_implicit(const Exec& exec, const implicit_conv::geometry& g, const IV& in, const WV& w,
                  const OV& out, conv2d_workspace<M>& ws, const WVal& wval,
                  const StoreValue& store_value) {
  namespace ic = implicit_conv;
  const ic::direct_layout d = Pairs ? ic::pairs_layout_for(g) : ic::direct_layout_for(g);
  if (d.ok) {
    run_direct_rows<Pairs>(exec, g, d, in, w, ws, wval, store_value, rows_into_view(out));
    return;
  }
  if constexpr (!Pairs) {
    const auto parts = static_cast<std::size_t>(ic::parts_for(exec, g.units()));
    const std::size_t scratch = parts * (ic::a_floats() + ic::c_floats(g)) * 4;
    const auto [b_mem, s_mem] = carve<2>(ws, {ic::packed_b_floats(g) * 4, scratch});
    const auto* wd = w.data();
    ic::pack_weights(
        exec, g, reinterpret_cast<float*>(b_mem),
        [=](index_t gi, index_t kk, index_t j) { return to_float(wval(wd, gi, kk, j)); });
    exec.fence();
    const index_t np = g.npad();
    ic::run(exec, g, in.data(), in.stride(0), in.stride(1), in.stride(2),
            reinterpret_cast<const float*>(b_mem), out.data(), out.stride(0), out.stride(1),
            reinterpret_cast<float*>(s_mem),
            [&](const float* sums, index_t k, auto* dst, index_t count) {
              const auto f = store_value(k);
              for (index_t i = 0; i < count; ++i) dst[i] = f(g.alpha * sums[i * np]);
            });
    exec.fence();
  }
}

/// Runs a narrow convolution (conv/detail/narrow.hpp; d = narrow_conv::layout_for(g, ...),
/// d.ok) of `in` with the weights w; wval, store_value and rows as for run_direct_rows.
template <class Exec, class IV, class WV, class M, class WVal, class StoreValue, class Rows>
void run_narrow(const Exec& exec, const implicit_conv::geometry& g, const narrow_conv::layout& d,
                const IV& in, const WV& w, conv2d_workspace<M>& ws, const WVal& wval,
                const StoreValue& store_value, const Rows& rows) {
  namespace nc = narrow_conv;
  const auto parts = static_cast<std::size_t>(nc::parts_for(exec, g, d));
  const std::size_t scratch = round_up_64(sizeof(index_t) * static_cast<std::size_t>(g.kred())) +
                              parts * d.part_floats(g) * 4;
  const auto [w_mem, s_mem] = carve<2>(ws, {d.weight_floats(g) * 4, scratch});
  auto* pw = reinterpret_cast<float*>(w_mem);
  const auto* wd = w.data();
  nc::pack(exec, g, d, pw,
           [=](index_t gi, index_t kk, index_t j) { return to_float(wval(wd, gi, kk, j)); });
  exec.fence();
  const float alpha = g.alpha;
  nc::run(exec, g, d, in.data(), in.stride(0), in.stride(1), in.stride(2), pw, s_mem,
          [&](const float* sums, index_t k, index_t n, index_t p0, index_t count) {
            rows(sums, k, n, p0, count, store_value(k), alpha);
          });
  exec.fence();
}
#endif

} // namespace tessera::detail
