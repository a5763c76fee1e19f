#pragma once
/// \file nn/attention.hpp
/// nn::CausalSelfAttention<D, H, Prec>: causal multi-head self-attention on x (B, t, D), t any
/// (dynamic), as in GPT-2 / nanoGPT:
///
///   qkv = x Wqkv^T + bqkv                      nn::Linear<D, 3D, Prec> (q | k | v, each D wide)
///   head h (width d = D / H): q_h, k_h, v_h    columns [h d, (h + 1) d) of q, k, v
///   o_h = softmax(q_h k_h^T / sqrt(d) + causal mask) v_h         (B, t, d), heads concatenated
///   y = o Wo^T + bo                            nn::Linear<D, D, Prec>
///
///   tessera::nn::CausalSelfAttention<128, 4> attn(/*seed=*/1);
///   auto y = attn.forward(exec, x);            // x (B, t, 128) -> y (B, t, 128)
///   auto dx = attn.backward(exec, dy);         // writes the four parameters' grad
///
/// The projections are nn::Linear members (tessera::gemm, in compute precision Prec: fp32,
/// bf16 or fp8 hybrid, fp32 masters). The attention core accumulates in fp32 whatever Prec: q,
/// k, v are kept in bf16 when the activations are bf16 (their exact values, half the bytes)
/// and multiplied as bf16 pairs by VDPBF16PS for the scores q k^T and dO v^T where the CPU has
/// AVX512_BF16 (exact products, fp32 sums), else widened to fp32 as they are used; the softmax
/// and its statistics are fp32, o is rounded once to the activation precision. With
/// VDPBF16PS (a head width a multiple of 16 and an even tile), P V and dS K take P and dS
/// rounded to bf16 (as FlashAttention's bf16 kernels do), k and v kept as pairs of adjacent
/// keys; P^T dO and dS^T Q stay fp32 products.
///
/// The core is computed tile by tile with an online softmax (the FlashAttention idea, Dao et
/// al. 2022; backward as FlashAttention-2, Dao 2023): one work item per (batch, head, tile of
/// `tile()` query rows) walks the key tiles up to the diagonal keeping, per row, the running
/// maximum m and sum l of exp(s - m) and the unnormalised output in fp32 scratch of
/// tile x (tile + d) floats; the t x t score matrix is never formed. Forward saves, per row,
/// the log-sum-exp L = m + log l. Backward recomputes each probability tile as exp(s - L) and
/// uses D_i = rowsum(dO_i * o_i): dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ = dS K / sqrt d,
/// dK = dS^T Q / sqrt d, in one pass per (batch, head): for each key tile, over the query tiles at
/// or after it, dK and dV of the key tile in scratch and dQ accumulated in place in dqkv (owned by
/// the work item: no atomics, the same sums on every run); each probability tile is recomputed
/// once. Memory besides the activations is linear in t: q, k, v (and k^T, v^T for unit-stride
/// inner loops; in bf16 when the activations are bf16, exact since they are the QKV
/// projection's bf16 output, else fp32), dO per head, L and D per row, and the per-work-item
/// scratch, reused across steps.
/// The tile products are register-blocked (block_rows query rows by block_cols keys for the
/// scores, block_rows rows by the head width for P V and dS K, two keys (four from bf16) by the
/// head width for P^T dO and dS^T Q), their innermost loops unit-stride and of compile-time length
/// (vectorisable), and skip the blocks the causal mask hides.
///
/// decode(exec, x_new, cache) appends n new positions (x_new (B, n, D), n >= 1; generation
/// uses n = 1, a prompt may be fed whole) to a key/value cache (nn::CausalSelfAttention::cache,
/// fp32, capacity fixed at construction) and returns their outputs (B, n, D); each new row
/// costs time linear in the cached length. decode reuses the projections' buffers: a forward
/// must come between a decode and a backward.
///
/// Layer declarations (nn/layer.hpp): forward_flops for inputs of static t (the projections'
/// 8 t D^2 plus the causal core's 2 t (t + 1) D); no tensor_split, so it is replicated by the
/// tensor split (the head split is parallel/'s to write).

#include <tessera/config/cpu.hpp>
#include <tessera/config/kokkos_compat.hpp>
#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/detail/row_math.hpp>
#include <tessera/nn/layer.hpp>
#include <tessera/nn/linear.hpp>
#include <tessera/simd/lanes.hpp> // xsimd, host passes only

#include <boost/hana/flatten.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>

#if !TESSERA_DEVICE_PASS && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
/// P V and dS K on VDPBF16PS (see tiled_attention_core::key_pairs_possible) compiled in.
#define TESSERA_NN_ATTENTION_PAIRS 1
#else
#define TESSERA_NN_ATTENTION_PAIRS 0
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace tessera::nn {
namespace detail {

/// The tiled causal attention core of nn::CausalSelfAttention (see the file comment) on NH heads
/// of width W / NH: q, k, v read from a QKV projection's output (B, t, 3W) (q | k | v, each W
/// wide, head h in columns [h d, (h + 1) d) of each), o written as (B, t, W). The whole layer
/// runs it on its H heads (W = D); parallel::HeadParallelAttention on a rank's H/T heads
/// (W = D/T, the columns of its shard of the QKV projection): the same kernels, the same sums
/// per head. Keeps q, k, k^T, v, v^T (kv_type: bf16 under bf16 activations, else fp32) and the
/// per-row log-sum-exp between a forward and its backward (5 B t W kv_type and B NH t floats);
/// backward allocates dO (B t W, bf16 where it arrives in bf16 and the core is paired, else
/// fp32) and D (B NH t floats).
template <index_t W, index_t NH, class Act, class M = default_memory_space>
class tiled_attention_core {
  static_assert(W >= 1 && NH >= 1 && W % NH == 0,
                "tessera::nn::detail::tiled_attention_core<W, NH>: NH must divide W.");

public:
  static constexpr index_t head_dim = W / NH;

  index_t tile() const noexcept { return tile_; }
  /// Sets the tile (1 to 256 rows); value_error naming `who` otherwise.
  void set_tile(index_t rows, const char* who) {
    if (rows < 1 || rows > 256)
      throw value_error(std::string(who) + "::set_tile: " + std::to_string(rows) +
                        " rows; the tile must be 1 to 256 rows");
    tile_ = rows;
  }
  /// Bytes of the last forward and backward's core memory (see CausalSelfAttention::scratch_bytes).
  std::size_t scratch_bytes() const noexcept { return scratch_bytes_; }
  /// The element type forward keeps q, k, k^T, v and v^T in: bf16 where the activations are
  /// bf16 (the QKV projection's output, so exact; half the bytes written and read), else fp32.
  /// Every product accumulates in fp32 either way; the scores are scaled by 1/sqrt d as they
  /// are stored.
  using kv_type = std::conditional_t<std::is_same_v<storage_t<Act>, bfloat16>, bfloat16, float>;
  /// Whether k^T and v^T are kept as pairs of adjacent head columns, (d/2, t) pairs per head
  /// (pair (e/2, j) = {k[j][e], k[j][e + 1]}, 32 bits): bf16 and an even head width. That is
  /// the operand layout of AVX512_BF16's VDPBF16PS, which then computes the scores q k^T and
  /// dO v^T from bf16 q and dO rows two head columns per instruction (half the instructions of
  /// widening each element to fp32); without it the pairs are widened two lanes at a time.
  static constexpr bool paired = std::is_same_v<kv_type, bfloat16> && head_dim % 2 == 0;
  /// Whether k and v can be kept as pairs of adjacent keys, (t/2, d) pairs per head (pair
  /// (j/2, e) = {k[j][e], k[j + 1][e]}, the last key of an odd t paired with a zero): the
  /// operand layout of VDPBF16PS for P V (forward) and dS K (backward), which then take P and
  /// dS rounded to bf16 (as FlashAttention's bf16 kernels do; fp32 sums), two keys per
  /// instruction. forward keeps them so where the scores use VDPBF16PS, the head width is a
  /// whole number of 16-lane vectors and the tile is even (tiles then start on a pair);
  /// backward reads the layout forward chose.
  static constexpr bool key_pairs_possible = paired && head_dim % 16 == 0;
  /// The bytes forward keeps for backward: q, k, k^T, v, v^T and the log-sum-exp per row.
  /// (k and v as key pairs: t rounded up to even for those two.)
  static constexpr std::size_t saved_bytes(index_t B, index_t t, bool key_pairs = false) {
    return std::size_t(B * NH * t) * sizeof(float) +
           std::size_t(3 * B * t * W + 2 * B * key_rows(t, key_pairs) * W) * sizeof(kv_type);
  }
  /// Whether the scores use VDPBF16PS where it can (paired, the translation unit compiled for
  /// AVX512_BF16 and the CPU reporting it): true by default; tests set false to check the
  /// widening path on the same machine.
  void set_dot_products(bool on) noexcept { dot_products_ = on; }
  /// Whether the last forward kept k and v as key pairs (key_pairs_possible).
  bool key_pairs() const noexcept { return key_pairs_; }
  bool dot_products() const noexcept {
#if !TESSERA_DEVICE_PASS && defined(__AVX512BF16__) && defined(__AVX512BW__)
    return paired && dot_products_ && cpu::has_avx512bf16();
#else
    return false;
#endif
  }

  /// out (B, t, W) = the heads' causal attention of qkv (B, t, 3W); keeps what backward needs.
  template <class Exec, class S>
  void forward(const Exec& exec, const S* qkv, index_t B, index_t t, storage_t<Act>* out) {
    const bool dot = dot_products();
    const bool kp = key_pairs_ = uses_key_pairs<Exec, S>(dot);
    pack(exec, qkv, B, t, kp);
    const index_t tile = tile_, tiles = (t + tile - 1) / tile, tk = key_rows(t, kp);
    float* lse = lse_.get(B * NH * t);
    const kv_type *q = q_.data(), *kt = kt_.data(), *v = v_.data();
    constexpr index_t d = head_dim;
    const float scale = 1.f / std::sqrt(float(d));
    using policy_t = Kokkos::TeamPolicy<Exec>;
    using member_t = typename policy_t::member_type;
    using scratch_view = scratch_view_t<Exec>;
    // (and, with key pairs, the probabilities in bf16: tile x pair_ld(tile) of them)
    const index_t ld16 = pair_ld(tile);
    const std::size_t floats =
        std::size_t(tile * tile + tile * d + 2 * tile) + (kp ? std::size_t(tile * ld16 / 2) : 0);
    const int level = scratch_level(floats);
    Kokkos::parallel_for(
        "tessera::nn::CausalSelfAttention::forward[core]",
        policy_t(exec, int(B * NH * tiles), 1)
            .set_scratch_size(level, Kokkos::PerTeam(scratch_view::shmem_size(floats))),
        KOKKOS_LAMBDA(const member_t& team) {
          const index_t w = team.league_rank();
          const index_t bh = w / tiles, i0 = (w % tiles) * tile;
          const index_t i1 = i0 + tile < t ? i0 + tile : t, nq = i1 - i0;
          const index_t b = bh / NH, h = bh % NH;
          const scratch_view sv(team.team_scratch(level), floats);
          float* s = sv.data();               // scores, then probabilities (tile x tile)
          float* acc = s + tile * tile;       // unnormalised output (tile x d)
          float* m = acc + tile * d;          // running maximum per row
          float* l = m + tile;                // running sum per row
          const kv_type* qh = q + bh * t * d; // (t, d)
          const kv_type* kth = kt + bh * d * t;
          const kv_type* vh = v + bh * tk * d;
          for (index_t r = 0; r < nq; ++r) {
            m[r] = -3.0e38f;
            l[r] = 0.f;
            for (index_t c = 0; c < d; ++c) acc[r * d + c] = 0.f;
          }
          for (index_t j0 = 0; j0 < i1; j0 += tile) {
            const index_t j1 = j0 + tile < i1 ? j0 + tile : i1, nk = j1 - j0;
            scores(s, qh, kth + j0 * kstep, i0, j0, nq, nk, tile, t, scale, dot);
            for (index_t r = 0; r < nq; ++r) {
              // j0 <= i0 (both multiples of the tile): every row sees at least key j0. The
              // probabilities past it are zeroed as far as accumulate reads them (to the last
              // row of the row's register block).
              const index_t valid = causal_keys(i0 + r, j0, nk);
              const index_t nz = valid + block_rows - 1 < nk ? valid + block_rows - 1 : nk;
              float* sr = s + r * tile;
              const float mx = row_max(sr, valid);
              if (j0 == 0) {
                // The first key tile: no running sum or output to correct.
                m[r] = mx;
                l[r] = exp_shifted(sr, valid, nz, mx);
                continue;
              }
              if (mx > m[r]) {
                const float corr = kmath::exp(m[r] - mx);
                m[r] = mx;
                l[r] *= corr;
                float* ar = acc + r * d;
                for (index_t c = 0; c < d; ++c) ar[c] *= corr;
              }
              l[r] += exp_shifted(sr, valid, nz, m[r]);
            }
#if TESSERA_NN_ATTENTION_PAIRS
            if (kp) {
              accumulate_pairs(acc, d, s, tile, reinterpret_cast<std::uint16_t*>(l + tile), ld16,
                               vh + j0 * d, i0, j0, nq, nk);
              continue;
            }
#endif
            accumulate(acc, d, s, vh + j0 * d, i0, j0, nq, nk, tile);
          }
          for (index_t r = 0; r < nq; ++r) {
            const float inv = 1.f / l[r];
            const index_t i = i0 + r;
            storage_t<Act>* orow = out + (b * t + i) * W + h * d;
            float* ar = acc + r * d;
#if !TESSERA_DEVICE_PASS
            if constexpr (tessera::detail::is_host_exec_v<Exec>) {
              // Rounded by convert_n (vectorised; the same rounding as from_float).
              for (index_t c = 0; c < d; ++c) ar[c] *= inv;
              convert_n<Act>(ar, orow, std::size_t(d));
            } else
#endif
            {
              for (index_t c = 0; c < d; ++c) orow[c] = from_float<Act>(ar[c] * inv);
            }
            lse[bh * t + i] = m[r] + kmath::log(l[r]);
          }
        });
    exec.fence();
    fwd_scratch_ = std::size_t(tessera::concurrency(exec)) * floats * sizeof(float);
    scratch_bytes_ = saved_bytes(B, t, kp) + fwd_scratch_;
  }

  /// dqkv (B, t, 3W, fp32) of dout = dL/do (B, t, W) and o (B, t, W), the last forward's.
  template <class Exec, class G, class O>
  void backward(const Exec& exec, const G* g, const O* o, index_t B, index_t t, float* dst) {
    constexpr index_t d = head_dim;
    // dO per head (B, NH, t, d), bf16 when it arrives in bf16 and the core is paired (exact;
    // the scores' operand layout), else fp32; and D_i = rowsum(dO_i * o_i) in fp32, summed in
    // 16 interleaved partial sums (vectorised; any order satisfies the same error bound).
    using do_type = std::conditional_t<paired && std::is_same_v<G, bfloat16>, bfloat16, float>;
    do_type* dop_w;
    if constexpr (std::is_same_v<do_type, float>)
      dop_w = do_.get(B * t * W);
    else
      dop_w = do16_.get(B * t * W);
    {
      do_type* dop = dop_w;
      float* di = di_.get(B * NH * t);
      Kokkos::parallel_for(
          "tessera::nn::CausalSelfAttention::backward[dO]",
          Kokkos::RangePolicy<Exec>(exec, 0, B * NH * t), KOKKOS_LAMBDA(const index_t k) {
            const index_t bh = k / t, i = k % t, b = bh / NH, h = bh % NH;
            const G* gr = g + (b * t + i) * W + h * d;
            const O* orow = o + (b * t + i) * W + h * d;
            do_type* dr = dop + k * d;
#if !TESSERA_DEVICE_PASS && defined(__AVX512F__)
            if constexpr (tessera::detail::is_host_exec_v<Exec> && d % 16 == 0 && fp32_or_bf16<G> &&
                          fp32_or_bf16<O>) {
              // 16 columns per batch, lane l the partial sum l of lane_sum (the same sums,
              // reduced by the same pairwise tree).
              using V = xsimd::batch<float, xsimd::default_arch>;
              __m512 part = _mm512_setzero_ps();
              for (index_t c = 0; c < d; c += 16) {
                const __m512 gv = load_widened<V>(gr + c);
                part = _mm512_fmadd_ps(gv, load_widened<V>(orow + c), part);
                if constexpr (std::is_same_v<do_type, G>)
                  std::memcpy(dr + c, gr + c, 16 * sizeof(G));
                else
                  _mm512_storeu_ps(dr + c, gv);
              }
              di[k] = _mm512_reduce_add_ps(part);
              return;
            }
#endif
            for (index_t c = 0; c < d; ++c) {
              if constexpr (std::is_same_v<do_type, G>)
                dr[c] = gr[c];
              else
                dr[c] = to_float(gr[c]);
            }
            di[k] = lane_sum<d>([&](index_t c) { return to_float(gr[c]) * to_float(orow[c]); });
          });
    }
    const index_t tile = tile_;
    const kv_type *q = q_.data(), *k = k_.data(), *kt = kt_.data(), *vt = vt_.data();
    const float *lse = lse_.data(), *di = di_.data();
    const do_type* dop = dop_w;
    const float scale = 1.f / std::sqrt(float(d));
    const bool dot = dot_products();
    // k as key pairs when forward kept it so (dS in bf16 then: tile x pair_ld(tile) more).
    const bool kp = key_pairs_;
    const index_t tk = key_rows(t, kp), ld16 = pair_ld(tile);
    using policy_t = Kokkos::TeamPolicy<Exec>;
    using member_t = typename policy_t::member_type;
    using scratch_view = scratch_view_t<Exec>;
    const std::size_t floats =
        std::size_t(2 * tile * tile + 2 * tile * d) + (kp ? std::size_t(tile * ld16 / 2) : 0);
    const int level = scratch_level(floats);
    // One pass, one work item per (batch, head): for each key tile, over the query tiles at or
    // after it, dV_j += P^T dO_i, dK_j += dS^T Q_i and dQ_i += dS K_j, dQ accumulated in place in
    // dqkv's q columns (the work item owns them: no atomics, the same sums on every run). Each
    // probability tile is recomputed once.
    Kokkos::parallel_for(
        "tessera::nn::CausalSelfAttention::backward[core]",
        policy_t(exec, int(B * NH), 1)
            .set_scratch_size(level, Kokkos::PerTeam(scratch_view::shmem_size(floats))),
        KOKKOS_LAMBDA(const member_t& team) {
          const index_t bh = team.league_rank();
          const index_t b = bh / NH, h = bh % NH;
          const scratch_view sv(team.team_scratch(level), floats);
          float* s = sv.data();
          float* dp = s + tile * tile;
          float* dk = dp + tile * tile;
          float* dv = dk + tile * d;
          const kv_type* qh = q + bh * t * d;
          const kv_type* kh = k + bh * tk * d;
          const kv_type* kth = kt + bh * d * t;
          const kv_type* vth = vt + bh * d * t;
          const do_type* doh = dop + bh * t * d;
          float* dqh = dst + b * t * 3 * W + h * d; // row i at dqh + i * 3D
          for (index_t i = 0; i < t; ++i)
            for (index_t e = 0; e < d; ++e) dqh[i * 3 * W + e] = 0.f;
          for (index_t j0 = 0; j0 < t; j0 += tile) {
            const index_t j1 = j0 + tile < t ? j0 + tile : t, nk = j1 - j0;
            for (index_t c = 0; c < nk * d; ++c) dk[c] = dv[c] = 0.f;
            for (index_t i0 = j0; i0 < t; i0 += tile) {
              const index_t i1 = i0 + tile < t ? i0 + tile : t, nq = i1 - i0;
              probs_and_dscores(s, dp, qh, kth, doh, vth, lse + bh * t, di + bh * t, i0, j0, nq, nk,
                                tile, t, scale, dot);
              accumulate_t(dv, dk, s, dp, doh + i0 * d, qh + i0 * d, i0, j0, nq, nk, tile);
#if TESSERA_NN_ATTENTION_PAIRS
              if (kp) {
                accumulate_pairs(dqh + i0 * 3 * W, 3 * W, dp, tile,
                                 reinterpret_cast<std::uint16_t*>(dv + tile * d), ld16, kh + j0 * d,
                                 i0, j0, nq, nk);
                continue;
              }
#endif
              accumulate(dqh + i0 * 3 * W, 3 * W, dp, kh + j0 * d, i0, j0, nq, nk, tile);
            }
            // dK = dS^T q / sqrt d.
            for (index_t c = 0; c < nk; ++c)
              for (index_t e = 0; e < d; ++e) {
                float* row = dst + (b * t + j0 + c) * 3 * W + h * d + e;
                row[W] = dk[c * d + e] * scale;
                row[2 * W] = dv[c * d + e];
              }
          }
          for (index_t i = 0; i < t; ++i)
            for (index_t e = 0; e < d; ++e) dqh[i * 3 * W + e] *= scale;
        });
    exec.fence();
    scratch_bytes_ =
        saved_bytes(B, t, kp) + std::size_t(B * t * W) * sizeof(do_type) +
        std::size_t(B * NH * t) * sizeof(float) +
        std::max(fwd_scratch_, std::size_t(tessera::concurrency(exec)) * floats * sizeof(float));
  }

  /// Adds what forward kept for backward to l.
  void count(activation_ledger& l) const {
    lse_.count(l);
    for (const auto* b : {&q_, &k_, &kt_, &v_, &vt_}) b->count(l);
  }
  /// Frees it.
  void release() noexcept {
    lse_.release();
    for (auto* b : {&q_, &k_, &kt_, &v_, &vt_}) b->release();
  }

private:
  template <class Exec>
  using scratch_view_t = Kokkos::View<float*, typename Exec::scratch_memory_space,
                                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  /// Level 0 (fast, small on GPUs) when the scratch fits in 32 KiB, else level 1.
  static int scratch_level(std::size_t floats) {
    return floats * sizeof(float) <= 32768 ? 0 : 1;
  }

  /// The number of keys j0 .. j0 + nk - 1 that row i may see (j <= i), possibly <= 0.
  KOKKOS_INLINE_FUNCTION static index_t causal_keys(index_t i, index_t j0, index_t nk) {
    const index_t v = i - j0 + 1;
    return v < nk ? v : nk;
  }

  /// Rows per register block of the tile products, and columns (keys) per block of scores.
  static constexpr index_t block_rows = 4, block_cols = 16;

  /// An input element as kept in k and v: its bits where it is already kv_type, else rounded
  /// once (fp32 activations into an fp32 core: unchanged).
  template <class S>
  KOKKOS_INLINE_FUNCTION static kv_type kept(const S& x) {
    if constexpr (std::is_same_v<S, kv_type>)
      return x;
    else
      return from_float<std::conditional_t<std::is_same_v<kv_type, float>, fp32, bf16>>(
          to_float(x));
  }
  /// A saved k/v element as fp32.
  KOKKOS_INLINE_FUNCTION static float widen(float x) {
    return x;
  }
  KOKKOS_INLINE_FUNCTION static float widen(bfloat16 x) {
    return x.to_float();
  }

#if !TESSERA_DEVICE_PASS
  /// Whether load_widened reads T: fp32 or bf16 storage.
  template <class T>
  static constexpr bool fp32_or_bf16 = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;
  /// V::size saved k/v elements from p (unaligned) as fp32 lanes: bf16 is the top half of an
  /// fp32, so a zero-extending load shifted left by 16.
  template <class V, class T>
  static V load_widened(const T* p) {
    if constexpr (std::is_same_v<T, float>) {
      return V::load_unaligned(p);
    } else {
      using A = typename V::arch_type;
      return xsimd::bitwise_cast<V>(tessera::detail::simd::load_widened<A, 2>(p) << 16);
    }
  }
#endif

  /// The largest number of keys j0 .. j0 + nk - 1 that rows r0 .. r0 + nr - 1 of the query tile
  /// at i0 may see (that of the last row).
  KOKKOS_INLINE_FUNCTION static index_t block_keys(index_t i0, index_t r0, index_t nr, index_t j0,
                                                   index_t nk) {
    return causal_keys(i0 + r0 + nr - 1, j0, nk);
  }

  /// Elements between key j and key j + 1 in a row of k^T / v^T: 2 when paired, else 1.
  static constexpr index_t kstep = paired ? 2 : 1;
  /// Where element (e, j) of a head's k^T / v^T is, relative to column 0 of its key tile, rows
  /// of t keys (pairs of rows when paired).
  KOKKOS_INLINE_FUNCTION static index_t kt_at(index_t e, index_t j, index_t t) {
    if constexpr (paired)
      return (e / 2) * 2 * t + 2 * j + e % 2;
    else
      return e * t + j;
  }

#if !TESSERA_DEVICE_PASS
  /// Paired scores on the host, columns c0.. in whole SIMD batches: VDPBF16PS where `dot` (bf16
  /// rows a, AVX512_BF16), else each pair widened to two fp32 lanes (x << 16 and x & 0xffff0000:
  /// bf16 is the top half of an fp32) and two FMAs. Returns the first column not done.
  template <index_t NR, class A>
  static index_t score_rows_paired(float* s, const A* a, const kv_type* bt, index_t nc, index_t ld,
                                   index_t t, float scale, bool dot) {
    constexpr index_t d2 = head_dim / 2;
    index_t c0 = 0;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    if constexpr (std::is_same_v<A, bfloat16>) {
      if (dot) {
        const __m512 sc = _mm512_set1_ps(scale);
        // Two vectors of 16 keys by NR rows: 2 NR accumulators; per pair of head columns two
        // loads of k^T pairs, NR broadcasts of a row's pair, 2 NR VDPBF16PS.
        for (; c0 + 32 <= nc; c0 += 32) {
          __m512 acc0[NR], acc1[NR];
          for (index_t r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
          for (index_t e2 = 0; e2 < d2; ++e2) {
            const kv_type* br = bt + e2 * 2 * t + 2 * c0;
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(br);
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(br + 32);
            for (index_t r = 0; r < NR; ++r) {
              std::int32_t pair;
              std::memcpy(&pair, a + r * head_dim + 2 * e2, sizeof pair);
              const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
              acc0[r] = _mm512_dpbf16_ps(acc0[r], av, b0);
              acc1[r] = _mm512_dpbf16_ps(acc1[r], av, b1);
            }
          }
          for (index_t r = 0; r < NR; ++r) {
            _mm512_storeu_ps(s + r * ld + c0, _mm512_mul_ps(acc0[r], sc));
            _mm512_storeu_ps(s + r * ld + c0 + 16, _mm512_mul_ps(acc1[r], sc));
          }
        }
        for (; c0 + 16 <= nc; c0 += 16) {
          __m512 acc[NR];
          for (index_t r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
          for (index_t e2 = 0; e2 < d2; ++e2) {
            const __m512bh b = (__m512bh)_mm512_loadu_si512(bt + e2 * 2 * t + 2 * c0);
            for (index_t r = 0; r < NR; ++r) {
              std::int32_t pair;
              std::memcpy(&pair, a + r * head_dim + 2 * e2, sizeof pair);
              acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(pair), b);
            }
          }
          for (index_t r = 0; r < NR; ++r)
            _mm512_storeu_ps(s + r * ld + c0, _mm512_mul_ps(acc[r], sc));
        }
        return c0;
      }
    }
#else
    (void)dot;
#endif
    if constexpr (tessera::detail::simd::available) {
      using V = xsimd::batch<float, xsimd::default_arch>;
      using L = xsimd::batch<std::int32_t, xsimd::default_arch>;
      constexpr index_t w = index_t(V::size);
      const L high(static_cast<std::int32_t>(0xffff0000u));
      for (; c0 + w <= nc; c0 += w) {
        V acc[NR];
        for (index_t r = 0; r < NR; ++r) acc[r] = V(0.f);
        for (index_t e2 = 0; e2 < d2; ++e2) {
          const L x =
              L::load_unaligned(reinterpret_cast<const std::int32_t*>(bt + e2 * 2 * t + 2 * c0));
          const V lo = xsimd::bitwise_cast<V>(x << 16), hi = xsimd::bitwise_cast<V>(x & high);
          for (index_t r = 0; r < NR; ++r) {
            acc[r] = xsimd::fma(V(to_float(a[r * head_dim + 2 * e2])), lo, acc[r]);
            acc[r] = xsimd::fma(V(to_float(a[r * head_dim + 2 * e2 + 1])), hi, acc[r]);
          }
        }
        for (index_t r = 0; r < NR; ++r) (acc[r] * V(scale)).store_unaligned(s + r * ld + c0);
      }
    }
    return c0;
  }
#endif

  /// Scores of NR rows: s (NR rows, stride ld), columns [0, nc) = scale times a (NR x d, rows of
  /// d) times bt (d x nc: k^T or v^T from the key tile's column 0, see kt_at). Full blocks of
  /// columns accumulate in registers.
  template <index_t NR, class A, class T>
  KOKKOS_INLINE_FUNCTION static void score_rows(float* s, const A* a, const T* bt, index_t nc,
                                                index_t ld, index_t t, float scale, bool dot) {
    constexpr index_t CB = block_cols;
    index_t c0 = 0;
#if !TESSERA_DEVICE_PASS
    if constexpr (paired) {
      c0 = score_rows_paired<NR>(s, a, bt, nc, ld, t, scale, dot);
    } else if constexpr (tessera::detail::simd::available) {
      // Host: NR rows by two SIMD batches of columns (32 on AVX-512, 16 on AVX2): 2 NR
      // accumulators, independent FMA chains enough to hide the FMA latency on two pipes,
      // each loaded k^T batch reused NR times. Then one batch at a time.
      using V = xsimd::batch<float, xsimd::default_arch>;
      constexpr index_t w = index_t(V::size);
      for (; c0 + 2 * w <= nc; c0 += 2 * w) {
        V acc0[NR], acc1[NR];
        for (index_t r = 0; r < NR; ++r) acc0[r] = acc1[r] = V(0.f);
        for (index_t e = 0; e < head_dim; ++e) {
          const V b0 = load_widened<V>(bt + e * t + c0), b1 = load_widened<V>(bt + e * t + c0 + w);
          for (index_t r = 0; r < NR; ++r) {
            const V av(to_float(a[r * head_dim + e]));
            acc0[r] = xsimd::fma(av, b0, acc0[r]);
            acc1[r] = xsimd::fma(av, b1, acc1[r]);
          }
        }
        for (index_t r = 0; r < NR; ++r) {
          (acc0[r] * V(scale)).store_unaligned(s + r * ld + c0);
          (acc1[r] * V(scale)).store_unaligned(s + r * ld + c0 + w);
        }
      }
      for (; c0 + w <= nc; c0 += w) {
        V acc[NR];
        for (index_t r = 0; r < NR; ++r) acc[r] = V(0.f);
        for (index_t e = 0; e < head_dim; ++e) {
          const V b = load_widened<V>(bt + e * t + c0);
          for (index_t r = 0; r < NR; ++r)
            acc[r] = xsimd::fma(V(to_float(a[r * head_dim + e])), b, acc[r]);
        }
        for (index_t r = 0; r < NR; ++r) (acc[r] * V(scale)).store_unaligned(s + r * ld + c0);
      }
    }
#else
    (void)dot;
#endif
    for (; c0 + CB <= nc; c0 += CB) {
      float acc[NR][CB];
      for (index_t r = 0; r < NR; ++r)
        for (index_t c = 0; c < CB; ++c) acc[r][c] = 0.f;
      for (index_t e = 0; e < head_dim; ++e) {
        for (index_t r = 0; r < NR; ++r) {
          const float av = to_float(a[r * head_dim + e]);
          for (index_t c = 0; c < CB; ++c) acc[r][c] += av * widen(bt[kt_at(e, c0 + c, t)]);
        }
      }
      for (index_t r = 0; r < NR; ++r)
        for (index_t c = 0; c < CB; ++c) s[r * ld + c0 + c] = acc[r][c] * scale;
    }
    for (; c0 < nc; ++c0)
      for (index_t r = 0; r < NR; ++r) {
        float sum = 0.f;
        for (index_t e = 0; e < head_dim; ++e)
          sum += to_float(a[r * head_dim + e]) * widen(bt[kt_at(e, c0, t)]);
        s[r * ld + c0] = sum * scale;
      }
  }

  /// s (nq x nk, row stride ld) = a (the head's rows of d, query tile at i0) times bt (d x nk,
  /// row stride t, key tile at j0), for the keys each row block may see (the causal mask)
  /// rounded up to block_cols; the columns past that are left unset, those between a row's
  /// last key and it hold scores of keys the row must not see (the callers mask them).
  template <class A, class T>
  KOKKOS_INLINE_FUNCTION static void scores(float* s, const A* a, const T* bt, index_t i0,
                                            index_t j0, index_t nq, index_t nk, index_t ld,
                                            index_t t, float scale, bool dot) {
    constexpr index_t R = block_rows;
    const A* ai = a + i0 * head_dim;
    // A block's key count rounded up to block_cols (within the tile): whole vector blocks, no
    // scalar tail on the diagonal; the extra columns are masked by the callers.
    const auto keys = [&](index_t r, index_t nr) {
      const index_t k = block_keys(i0, r, nr, j0, nk),
                    up = (k + block_cols - 1) / block_cols * block_cols;
      return up < nk ? up : nk;
    };
    index_t r0 = 0;
    for (; r0 + R <= nq; r0 += R)
      score_rows<R>(s + r0 * ld, ai + r0 * head_dim, bt, keys(r0, R), ld, t, scale, dot);
    for (; r0 < nq; ++r0)
      score_rows<1>(s + r0 * ld, ai + r0 * head_dim, bt, keys(r0, 1), ld, t, scale, dot);
  }

  /// NR rows of out (stride ostride, d wide) += p (NR rows, stride ld, nc columns) times rows
  /// (nc x d, rows of d), accumulated in registers.
  template <index_t NR, class T>
  KOKKOS_INLINE_FUNCTION static void accumulate_rows(float* out, index_t ostride, const float* p,
                                                     const T* rows, index_t nc, index_t ld) {
    constexpr index_t d = head_dim;
    float acc[NR][d];
    for (index_t r = 0; r < NR; ++r)
      for (index_t e = 0; e < d; ++e) acc[r][e] = out[r * ostride + e];
    for (index_t c = 0; c < nc; ++c) {
      if constexpr (std::is_same_v<T, float>) {
        const float* vr = rows + c * d;
        for (index_t r = 0; r < NR; ++r) {
          const float pv = p[r * ld + c];
          for (index_t e = 0; e < d; ++e) acc[r][e] += pv * vr[e];
        }
      } else {
        // The row widened once, then used by the NR rows.
        float vr[d];
        for (index_t e = 0; e < d; ++e) vr[e] = widen(rows[c * d + e]);
        for (index_t r = 0; r < NR; ++r) {
          const float pv = p[r * ld + c];
          for (index_t e = 0; e < d; ++e) acc[r][e] += pv * vr[e];
        }
      }
    }
    for (index_t r = 0; r < NR; ++r)
      for (index_t e = 0; e < d; ++e) out[r * ostride + e] = acc[r][e];
  }

  /// out (nq rows of d, stride ostride) += p (nq x nk, stride ld; zero where masked) times
  /// rows (nk x d: the key tile's v or k rows), over the keys each row block may see.
  template <class T>
  KOKKOS_INLINE_FUNCTION static void accumulate(float* out, index_t ostride, const float* p,
                                                const T* rows, index_t i0, index_t j0, index_t nq,
                                                index_t nk, index_t ld) {
    constexpr index_t R = block_rows;
    index_t r0 = 0;
    for (; r0 + R <= nq; r0 += R)
      accumulate_rows<R>(out + r0 * ostride, ostride, p + r0 * ld, rows,
                         block_keys(i0, r0, R, j0, nk), ld);
    for (; r0 < nq; ++r0)
      accumulate_rows<1>(out + r0 * ostride, ostride, p + r0 * ld, rows,
                         block_keys(i0, r0, 1, j0, nk), ld);
  }

  /// Rows of k and v kept per head: t, or t rounded up to a whole pair with key pairs.
  static constexpr index_t key_rows(index_t t, bool key_pairs) {
    return key_pairs ? (t + 1) / 2 * 2 : t;
  }
  /// Query rows per register block of the key-pair products (8: 16 independent accumulators
  /// over a head width of 32, enough to hide VDPBF16PS's latency on two pipes).
  static constexpr index_t pair_rows = 8;
  /// Row stride of the bf16 probabilities: a row's key count plus a block's extra keys, in
  /// whole 32-lane batches.
  static constexpr index_t pair_ld(index_t tile) {
    return (tile + pair_rows + 31) / 32 * 32;
  }
  /// Whether forward keeps k and v as key pairs (see key_pairs_possible): `dot` (the scores on
  /// VDPBF16PS), an even tile, a host space and inputs already in kv_type (copied bit for bit).
  template <class Exec, class S>
  bool uses_key_pairs(bool dot) const noexcept {
    if constexpr (key_pairs_possible && std::is_same_v<S, kv_type> &&
                  tessera::detail::is_host_exec_v<Exec>)
      return TESSERA_NN_ATTENTION_PAIRS && dot && tile_ % 2 == 0;
    else
      return false;
  }

#if TESSERA_NN_ATTENTION_PAIRS
  /// Rows r < nq of p (fp32, row stride ld; the query tile at i0, the key tile at j0) rounded
  /// to bf16 (round to nearest even) into p16 (row stride ld16): the columns below the row's key
  /// count exact roundings, the rest zero as far as a register block of pair_rows rows and the
  /// partner of its last key read (the masked entries of p are not read).
  static void round_probs(const float* p, index_t ld, std::uint16_t* p16, index_t ld16, index_t i0,
                          index_t j0, index_t nq, index_t nk) {
    for (index_t r = 0; r < nq; ++r) {
      const index_t valid = causal_keys(i0 + r, j0, nk);
      const index_t n = std::min((valid + pair_rows + 31) / 32 * 32, ld16);
      const float* pr = p + r * ld;
      std::uint16_t* out = p16 + r * ld16;
      for (index_t c = 0; c < n; c += 32) {
        const __m512 lo = _mm512_maskz_loadu_ps(avx512::first_lanes(valid - c), pr + c);
        const __m512 hi = _mm512_maskz_loadu_ps(avx512::first_lanes(valid - c - 16), pr + c + 16);
        _mm512_storeu_si512(out + c, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      }
    }
  }
  /// NR rows of out (stride ostride, d wide) += p16 (NR rows of bf16, stride ld16) times rows2
  /// (the key tile's k or v as key pairs) over keys [0, nc) (and the odd last key's partner,
  /// whose probability is zero): per pair of keys, d/16 loads and NR broadcasts of a row's pair
  /// of probabilities, NR d/16 VDPBF16PS.
  template <index_t NR>
  static void accumulate_rows_pairs(float* out, index_t ostride, const std::uint16_t* p16,
                                    index_t ld16, const kv_type* rows2, index_t nc) {
    constexpr index_t V = head_dim / 16;
    __m512 acc[NR][V];
    for (index_t r = 0; r < NR; ++r)
      for (index_t k = 0; k < V; ++k) acc[r][k] = _mm512_loadu_ps(out + r * ostride + 16 * k);
    const index_t n2 = (nc + 1) / 2;
    for (index_t c2 = 0; c2 < n2; ++c2) {
      __m512bh b[V];
      for (index_t k = 0; k < V; ++k)
        b[k] = (__m512bh)_mm512_loadu_si512(rows2 + 2 * (c2 * head_dim + 16 * k));
      for (index_t r = 0; r < NR; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, p16 + r * ld16 + 2 * c2, sizeof pair);
        const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
        for (index_t k = 0; k < V; ++k) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], a, b[k]);
      }
    }
    for (index_t r = 0; r < NR; ++r)
      for (index_t k = 0; k < V; ++k) _mm512_storeu_ps(out + r * ostride + 16 * k, acc[r][k]);
  }
  /// out (nq rows of d, stride ostride) += p (nq x nk fp32, stride ld) times rows2 (the key
  /// tile's k or v as key pairs), p rounded to bf16 first (into p16, stride ld16), over the keys
  /// each row block may see.
  static void accumulate_pairs(float* out, index_t ostride, const float* p, index_t ld,
                               std::uint16_t* p16, index_t ld16, const kv_type* rows2, index_t i0,
                               index_t j0, index_t nq, index_t nk) {
    round_probs(p, ld, p16, ld16, i0, j0, nq, nk);
    index_t r0 = 0;
    for (; r0 + pair_rows <= nq; r0 += pair_rows)
      accumulate_rows_pairs<pair_rows>(out + r0 * ostride, ostride, p16 + r0 * ld16, ld16, rows2,
                                       block_keys(i0, r0, pair_rows, j0, nk));
    for (; r0 + 4 <= nq; r0 += 4)
      accumulate_rows_pairs<4>(out + r0 * ostride, ostride, p16 + r0 * ld16, ld16, rows2,
                               block_keys(i0, r0, 4, j0, nk));
    for (; r0 < nq; ++r0)
      accumulate_rows_pairs<1>(out + r0 * ostride, ostride, p16 + r0 * ld16, ld16, rows2,
                               block_keys(i0, r0, 1, j0, nk));
  }
  /// The key pairs of rows a and b (b null: a zero row), d bf16 each, into dst (d pairs).
  static void interleave_keys(const kv_type* a, const kv_type* b, kv_type* dst) {
    for (index_t e = 0; e < head_dim; e += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(a + e)));
      const __m512i hi =
          b ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b + e))),
                                16)
            : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * e, _mm512_or_si512(lo, hi));
    }
  }
#endif

  /// NC keys (columns c0 .. of the tile) of dv += P^T g and dk += dS^T a over query rows
  /// [r0, nq) (P, dS zero where masked), accumulated in registers.
  template <index_t NC, class G, class A>
  KOKKOS_INLINE_FUNCTION static void
  accumulate_t_cols(float* dv, float* dk, const float* s, const float* dp, const G* g, const A* a,
                    index_t c0, index_t r0, index_t nq, index_t ld) {
    constexpr index_t d = head_dim;
    float av[NC][d], ak[NC][d];
    for (index_t c = 0; c < NC; ++c)
      for (index_t e = 0; e < d; ++e) {
        av[c][e] = dv[(c0 + c) * d + e];
        ak[c][e] = dk[(c0 + c) * d + e];
      }
    for (index_t r = r0; r < nq; ++r) {
      // bf16 rows widened once, then used by the NC keys.
      float gw[d], aw[d];
      const float* gr = gw;
      const float* ar = aw;
      if constexpr (std::is_same_v<G, float>)
        gr = g + r * d;
      else
        for (index_t e = 0; e < d; ++e) gw[e] = widen(g[r * d + e]);
      if constexpr (std::is_same_v<A, float>)
        ar = a + r * d;
      else
        for (index_t e = 0; e < d; ++e) aw[e] = widen(a[r * d + e]);
      for (index_t c = 0; c < NC; ++c) {
        const float pv = s[r * ld + c0 + c], dsv = dp[r * ld + c0 + c];
        for (index_t e = 0; e < d; ++e) {
          av[c][e] += pv * gr[e];
          ak[c][e] += dsv * ar[e];
        }
      }
    }
    for (index_t c = 0; c < NC; ++c)
      for (index_t e = 0; e < d; ++e) {
        dv[(c0 + c) * d + e] = av[c][e];
        dk[(c0 + c) * d + e] = ak[c][e];
      }
  }

  /// dv (nk x d) += P^T g and dk (nk x d) += dS^T a, g and a the query tile's dO and q rows
  /// (nq x d); key c is seen by query rows i >= j0 + c only.
  template <class G, class A>
  KOKKOS_INLINE_FUNCTION static void
  accumulate_t(float* dv, float* dk, const float* s, const float* dp, const G* g, const A* a,
               index_t i0, index_t j0, index_t nq, index_t nk, index_t ld) {
    // Keys per register block: 4 where the rows are widened from bf16 (the widening then
    // serves four keys), else 2.
    constexpr index_t C = std::is_same_v<G, float> && std::is_same_v<A, float> ? 2 : 4;
    static_assert(C <= block_rows,
                  "probs_and_dscores zeroes block_rows - 1 keys past a row's last");
    // The first query row that sees key c0 (the rows before it have P = dS = 0 there).
    const index_t off = j0 - i0;
    index_t c0 = 0;
    for (; c0 + C <= nk; c0 += C)
      accumulate_t_cols<C>(dv, dk, s, dp, g, a, c0, off + c0 > 0 ? off + c0 : 0, nq, ld);
    for (; c0 < nk; ++c0)
      accumulate_t_cols<1>(dv, dk, s, dp, g, a, c0, off + c0 > 0 ? off + c0 : 0, nq, ld);
  }

  /// The backward tile of queries i0 .. i0 + nq - 1 and keys j0 .. j0 + nk - 1 of one head:
  /// recomputes the scores and dP = dO V^T, then overwrites s with P = exp(s - L) and dp with
  /// dS = P (dP - D) (lse_h and di_h: the head's L and D per row), both zero where masked.
  template <class T, class G>
  KOKKOS_INLINE_FUNCTION static void
  probs_and_dscores(float* s, float* dp, const T* qh, const T* kth, const G* doh, const T* vth,
                    const float* lse_h, const float* di_h, index_t i0, index_t j0, index_t nq,
                    index_t nk, index_t ld, index_t t, float scale, bool dot) {
    scores(s, qh, kth + j0 * kstep, i0, j0, nq, nk, ld, t, scale, dot);
    scores(dp, doh, vth + j0 * kstep, i0, j0, nq, nk, ld, t, 1.f, dot);
    for (index_t r = 0; r < nq; ++r) {
      const index_t valid = causal_keys(i0 + r, j0, nk);
      const float L = lse_h[i0 + r], Di = di_h[i0 + r];
      float* sr = s + r * ld;
      float* dpr = dp + r * ld;
      // Zero past the row's last key as far as accumulate and accumulate_t read (the last row
      // of its register block of rows, the last key of its block of keys).
      const index_t nz = valid + block_rows - 1 < nk ? valid + block_rows - 1 : nk;
      exp_shifted(sr, valid, nz, L);
      for (index_t c = 0; c < valid; ++c) dpr[c] = sr[c] * (dpr[c] - Di);
      for (index_t c = valid < 0 ? 0 : valid; c < nz; ++c) dpr[c] = 0.f;
    }
  }

  /// qkv (B, t, 3W) -> q, k, v (B, NH, t, d) and k^T, v^T (B, NH, d, t; as pairs when paired,
  /// see kt_at) in kv_type; k and v as key pairs (B, NH, t/2, d pairs) where `key_pairs`.
  template <class Exec, class S>
  void pack(const Exec& exec, const S* in, index_t B, index_t t, bool key_pairs) {
    constexpr index_t d = head_dim;
    const index_t n = B * t * W, nkv = B * key_rows(t, key_pairs) * W;
    kv_type *q = q_.get(n), *k = k_.get(nkv), *kt = kt_.get(n), *v = v_.get(nkv), *vt = vt_.get(n);
    // One work item per (batch, head, block of RB rows): the rows' q, k, v copied, then the
    // block's columns of k^T, v^T written RB contiguous floats at a time from the k, v rows
    // just written (still in cache); a row at a time would write k^T with a stride of t floats.
    constexpr index_t RB = 16; // at most 16: the rows of one transpose_words
    static_assert(RB <= 16);
    const index_t blocks = (t + RB - 1) / RB;
    Kokkos::parallel_for(
        "tessera::nn::CausalSelfAttention::forward[pack]",
        Kokkos::RangePolicy<Exec>(exec, 0, B * NH * blocks), KOKKOS_LAMBDA(const index_t w) {
          const index_t bh = w / blocks, i0 = (w % blocks) * RB, b = bh / NH, h = bh % NH;
          const index_t i1 = i0 + RB < t ? i0 + RB : t;
#if TESSERA_NN_ATTENTION_PAIRS
          if constexpr (key_pairs_possible && std::is_same_v<S, kv_type> &&
                        tessera::detail::is_host_exec_v<Exec>) {
            if (key_pairs) {
              // q rows copied; k, v rows i, i + 1 (i0 even) interleaved into key pairs; k^T and
              // v^T transposed from the input rows (pairs of head columns are its 32-bit words).
              const index_t tk = key_rows(t, true);
              for (index_t i = i0; i < i1; ++i)
                std::memcpy(q + (bh * t + i) * d, in + (b * t + i) * 3 * W + h * d,
                            d * sizeof(kv_type));
              for (index_t i = i0; i < i1; i += 2) {
                const S* r0 = in + (b * t + i) * 3 * W + h * d;
                const S* r1 = i + 1 < t ? r0 + 3 * W : nullptr;
                interleave_keys(r0 + W, r1 ? r1 + W : nullptr, k + (bh * tk + i) * d);
                interleave_keys(r0 + 2 * W, r1 ? r1 + 2 * W : nullptr, v + (bh * tk + i) * d);
              }
              const S* base = in + (b * t + i0) * 3 * W + h * d;
              const index_t rows = i1 - i0, lds = 3 * W * index_t(sizeof(kv_type));
              tessera::detail::hostgemm::transpose_words(base + W, lds, rows, d / 2,
                                                         kt + bh * d * t + 2 * i0, t, rows);
              tessera::detail::hostgemm::transpose_words(base + 2 * W, lds, rows, d / 2,
                                                         vt + bh * d * t + 2 * i0, t, rows);
              return;
            }
          }
#endif
          for (index_t i = i0; i < i1; ++i) {
            const auto* row = in + (b * t + i) * 3 * W + h * d;
            const index_t o = (bh * t + i) * d;
            if constexpr (std::is_same_v<S, kv_type> && tessera::detail::is_host_exec_v<Exec>) {
              // The same bits: whole rows copied (an element loop of 16-bit stores is not
              // vectorised).
              std::memcpy(q + o, row, d * sizeof(kv_type));
              std::memcpy(k + o, row + W, d * sizeof(kv_type));
              std::memcpy(v + o, row + 2 * W, d * sizeof(kv_type));
              continue;
            }
            for (index_t e = 0; e < d; ++e) {
              q[o + e] = kept(row[e]);
              k[o + e] = kept(row[W + e]);
              v[o + e] = kept(row[2 * W + e]);
            }
          }
#if !TESSERA_DEVICE_PASS
          if constexpr (paired && tessera::detail::is_host_exec_v<Exec>) {
            // A pair is a 32-bit word of a row, so the block's pair rows of k^T and v^T are the
            // transpose of its rows of d/2 words: 16 x 16 words in AVX-512 registers, written
            // as whole 64-byte rows (a row at a time would store 2 bytes per key).
            const index_t rows = i1 - i0;
            tessera::detail::hostgemm::transpose_words(k + (bh * t + i0) * d,
                                                       d * index_t(sizeof(kv_type)), rows, d / 2,
                                                       kt + bh * d * t + 2 * i0, t, rows);
            tessera::detail::hostgemm::transpose_words(v + (bh * t + i0) * d,
                                                       d * index_t(sizeof(kv_type)), rows, d / 2,
                                                       vt + bh * d * t + 2 * i0, t, rows);
            return;
          }
#endif
          for (index_t e = 0; e < d; ++e) {
            kv_type* ktr = kt + bh * d * t + kt_at(e, 0, t);
            kv_type* vtr = vt + bh * d * t + kt_at(e, 0, t);
            for (index_t i = i0; i < i1; ++i) {
              ktr[i * kstep] = k[(bh * t + i) * d + e];
              vtr[i * kstep] = v[(bh * t + i) * d + e];
            }
          }
        });
    exec.fence();
  }

  raw_buffer<float, M> lse_{"attention.lse"}, do_{"attention.do"}, di_{"attention.di"};
  raw_buffer<kv_type, M> q_{"attention.q"}, k_{"attention.k"}, kt_{"attention.kt"},
      v_{"attention.v"}, vt_{"attention.vt"}, do16_{"attention.do"};
  index_t tile_ = 64;
  bool dot_products_ = true;
  bool key_pairs_ = false; // the layout of k_ and v_ the last forward chose
  std::size_t scratch_bytes_ = 0, fwd_scratch_ = 0;
};

} // namespace detail

template <index_t D, index_t H, class Prec = fp32>
class CausalSelfAttention {
  static_assert(D >= 1 && H >= 1 && D % H == 0,
                "tessera::nn::CausalSelfAttention<D, H>: the heads H must divide the width D.");
  using M = detail::default_memory_space;

public:
  /// The width of one head.
  static constexpr index_t head_dim = D / H;
  using compute_precision = Prec;
  using activation_precision = activation_t<Prec>;

  /// (B, t, D), t static or dynamic.
  template <class InExt>
  static constexpr bool accepts = InExt::rank == 3 &&
                                  (InExt::static_extent(2) == D || InExt::static_extent(2) == dyn);
  template <class InExt>
  using output_extents = extents<dyn, InExt::static_extent(1), D>;
  /// nn/layer.hpp, for a static t: the QKV and output projections (2 t D 3D + 2 t D D) and the
  /// causal core (q k^T and p v over t (t + 1) / 2 pairs, 2 d FLOPs each per head).
  template <class InExt>
  requires(InExt::rank == 3 &&
           InExt::static_extent(1) != dyn) static constexpr double forward_flops = [] {
    const double t = double(InExt::static_extent(1));
    return 8.0 * t * double(D) * double(D) + 2.0 * t * (t + 1.0) * double(D);
  }();

  /// The key/value cache of decode: keys and values of up to `capacity` positions of `batch`
  /// sequences, fp32, (batch, H, capacity, head_dim) each.
  class cache {
  public:
    cache(index_t batch, index_t capacity)
        : k_(Kokkos::view_alloc(Kokkos::WithoutInitializing, "attention.cache.k"),
             std::size_t(batch * H * capacity * head_dim)),
          v_(Kokkos::view_alloc(Kokkos::WithoutInitializing, "attention.cache.v"),
             std::size_t(batch * H * capacity * head_dim)),
          batch_(batch), capacity_(capacity) {
      if (batch < 1 || capacity < 1)
        throw value_error("tessera::nn::CausalSelfAttention::cache: batch " +
                          std::to_string(batch) + " and capacity " + std::to_string(capacity) +
                          " must be >= 1");
    }
    index_t batch() const noexcept { return batch_; }
    index_t capacity() const noexcept { return capacity_; }
    /// Positions cached so far.
    index_t length() const noexcept { return length_; }
    /// Forget every position (a new sequence).
    void reset() noexcept { length_ = 0; }

  private:
    friend class CausalSelfAttention;
    Kokkos::View<float*, M> k_, v_;
    index_t batch_, capacity_, length_ = 0;
  };

  /// The projections initialised as nn::Linear (PyTorch's default), from streams 0 and 1 of
  /// `seed`.
  explicit CausalSelfAttention(std::uint64_t seed = 0)
      : qkv_(counter_rng{seed, 0}.bits(0)), proj_(counter_rng{seed, 1}.bits(0)), o_("attention.o"),
        dqkv_("attention.dqkv"), dec_o_("attention.decode.o") {}

  /// The QKV projection, Linear<D, 3D, Prec> (rows [0, D) of its weight give q, [D, 2D) k,
  /// [2D, 3D) v), and the output projection, Linear<D, D, Prec>.
  Linear<D, 3 * D, Prec>& qkv() noexcept { return qkv_; }
  Linear<D, D, Prec>& proj() noexcept { return proj_; }
  /// (qkv.weight, qkv.bias, proj.weight, proj.bias) as a boost::hana::tuple of handles.
  auto parameters() const {
    const auto named = [](const char* prefix) {
      return [prefix](auto p) {
        p.name = std::string(prefix) + p.name;
        return p;
      };
    };
    return boost::hana::flatten(
        boost::hana::make_tuple(boost::hana::transform(qkv_.parameters(), named("qkv.")),
                                boost::hana::transform(proj_.parameters(), named("proj."))));
  }
  auto fp8_states() {
    return boost::hana::flatten(boost::hana::make_tuple(qkv_.fp8_states(), proj_.fp8_states()));
  }

  /// Query (and key) rows per work item of the tiled core (default 64).
  index_t tile() const noexcept { return core_.tile(); }
  /// Sets the tile (1 to 256 rows); value_error otherwise.
  void set_tile(index_t rows) { core_.set_tile(rows, "tessera::nn::CausalSelfAttention"); }
  /// Bytes of the core's memory allocated by the last forward and backward: the copies of q, k,
  /// k^T, v, v^T (fp32, or bf16 under bf16 activations), the per-row statistics, dO and D (not the
  /// projections' buffers nor the activations o and dqkv, which any implementation has), plus the
  /// work items' scratch (tile x (tile + d) floats forward, 2 tile (tile + d) backward) times the
  /// concurrency.
  std::size_t scratch_bytes() const noexcept { return core_.scratch_bytes(); }

  /// y = attention(x); x (B, t, D) in any precision, y in activation_precision.
  template <class Exec, class XP, class XE>
  Tensor<activation_precision, output_extents<XE>, layout_right, M>
  forward(const Exec& exec, const Tensor<XP, XE, layout_right, M>& x) {
    static_assert(accepts<XE>, "tessera::nn::CausalSelfAttention::forward: x must be (B, t, D).");
    check_input("forward", x);
    const index_t B = x.extent(0), t = x.extent(1);
    const auto qkv = qkv_.forward(exec, x);
    auto o = o_.get(extents<dyn, XE::static_extent(1), D>::from_all({B, t, D}));
    core_.forward(exec, qkv.data(), B, t, o.data());
    const auto y = proj_.forward(exec, o);
    shape_.save(y.extents());
    return y;
  }

  /// From dy (B, t, D) of the last forward: writes the projections' gradients and returns dx
  /// (B, t, D) in activation_precision (empty when !need_dx).
  template <class Exec, class DP, class DE>
  Tensor<activation_precision, output_extents<DE>, layout_right, M>
  backward(const Exec& exec, const Tensor<DP, DE, layout_right, M>& dy, bool need_dx = true) {
    static_assert(DE::rank == 3,
                  "tessera::nn::CausalSelfAttention::backward: dy must be (B, t, D).");
    detail::require_saved_like("tessera::nn::CausalSelfAttention::backward", dy, shape_);
    const index_t B = shape_.dims[0], t = shape_.dims[1];
    const auto dout = proj_.backward(exec, dy, true); // dL/do (B, t, D)
    auto dqkv = dqkv_.get(extents<dyn, DE::static_extent(1), 3 * D>::from_all({B, t, 3 * D}));
    core_.backward(exec, dout.data(), o_.get(extents<dyn, D>(B * t)).data(), B, t, dqkv.data());
    return qkv_.backward(exec, dqkv, need_dx);
  }

  /// Appends x_new (B, n, D) at positions length() .. length() + n - 1 of `c` and returns their
  /// outputs (B, n, D), each row attending to every cached position and to the new ones up to
  /// itself. Throws shape_error if B differs from the cache's batch or the cache would
  /// overflow. Overwrites the state a backward needs (run forward again before backward).
  template <class Exec, class XP, class XE>
  Tensor<activation_precision, output_extents<XE>, layout_right, M>
  decode(const Exec& exec, const Tensor<XP, XE, layout_right, M>& x, cache& c) {
    static_assert(accepts<XE>, "tessera::nn::CausalSelfAttention::decode: x must be (B, n, D).");
    check_input("decode", x);
    const index_t B = x.extent(0), n = x.extent(1), len = c.length_, cap = c.capacity_;
    if (B != c.batch_ || len + n > cap)
      throw shape_error("tessera::nn::CausalSelfAttention::decode: x has shape " +
                        shape_string(x.extents()) + " but the cache holds " +
                        std::to_string(c.batch_) + " sequences of " + std::to_string(len) +
                        " positions with room for " + std::to_string(cap) +
                        "; the batch must match and length + n must not exceed the capacity");
    shape_ = {}; // the forward state is gone
    const auto qkv = qkv_.forward(exec, x);
    const auto* in = qkv.data();
    float* kc = c.k_.data();
    float* vc = c.v_.data();
    constexpr index_t d = head_dim;
    Kokkos::parallel_for(
        "tessera::nn::CausalSelfAttention::decode[append]",
        Kokkos::RangePolicy<Exec>(exec, 0, B * H * n), KOKKOS_LAMBDA(const index_t w) {
          const index_t bh = w / n, r = w % n, b = bh / H, h = bh % H;
          const auto* row = in + (b * n + r) * 3 * D + h * d;
          float* kr = kc + (bh * cap + len + r) * d;
          float* vr = vc + (bh * cap + len + r) * d;
          for (index_t e = 0; e < d; ++e) {
            kr[e] = to_float(row[D + e]);
            vr[e] = to_float(row[2 * D + e]);
          }
        });
    exec.fence();
    auto o = dec_o_.get(extents<dyn, XE::static_extent(1), D>::from_all({B, n, D}));
    auto* out = o.data();
    const float scale = 1.f / std::sqrt(float(d));
    Kokkos::parallel_for(
        "tessera::nn::CausalSelfAttention::decode[core]",
        Kokkos::RangePolicy<Exec>(exec, 0, B * H * n), KOKKOS_LAMBDA(const index_t w) {
          const index_t bh = w / n, r = w % n, b = bh / H, h = bh % H;
          const auto* row = in + (b * n + r) * 3 * D + h * d;
          float qv[d], acc[d];
          for (index_t e = 0; e < d; ++e) {
            qv[e] = scale * to_float(row[e]);
            acc[e] = 0.f;
          }
          float m = -3.0e38f, l = 0.f;
          const index_t keys = len + r + 1;
          for (index_t j = 0; j < keys; ++j) {
            const float* kr = kc + (bh * cap + j) * d;
            float s = 0.f;
            for (index_t e = 0; e < d; ++e) s += qv[e] * kr[e];
            const float mnew = s > m ? s : m;
            const float corr = detail::kmath::exp(m - mnew), p = detail::kmath::exp(s - mnew);
            l = l * corr + p;
            m = mnew;
            const float* vr = vc + (bh * cap + j) * d;
            for (index_t e = 0; e < d; ++e) acc[e] = acc[e] * corr + p * vr[e];
          }
          const float inv = 1.f / l;
          for (index_t e = 0; e < d; ++e)
            out[(b * n + r) * D + h * d + e] = from_float<activation_precision>(acc[e] * inv);
        });
    exec.fence();
    c.length_ = len + n;
    return proj_.forward(exec, o);
  }

  /// nn/layer.hpp: what the last forward left for backward: both projections' (nn::Linear's),
  /// the attention output o, q, k, k^T, v, v^T and the per-row log-sum-exp.
  void count_activations(activation_ledger& l) const {
    qkv_.count_activations(l);
    proj_.count_activations(l);
    o_.count(l);
    core_.count(l);
  }
  /// nn/layer.hpp: frees them; backward then needs a forward first.
  void release_activations() noexcept {
    qkv_.release_activations();
    proj_.release_activations();
    o_.release();
    core_.release();
    shape_ = {};
  }

private:
  template <class T>
  void check_input(const char* what, const T& x) const {
    if (x.extent(2) != D)
      throw shape_error(std::string("tessera::nn::CausalSelfAttention<") + std::to_string(D) +
                        ", " + std::to_string(H) + ">::" + what + ": x has shape " +
                        shape_string(x.extents()) + "; it must be (B, t, " + std::to_string(D) +
                        ")");
  }

  Linear<D, 3 * D, Prec> qkv_;
  Linear<D, D, Prec> proj_;
  detail::buffer<activation_precision> o_;
  detail::buffer<fp32> dqkv_;
  detail::tiled_attention_core<D, H, activation_precision> core_;
  detail::buffer<activation_precision> dec_o_;
  detail::saved_shape shape_; // the last forward's output (B, t, D)
};

} // namespace tessera::nn
