#pragma once
/// \file gemm/detail/host.hpp
/// gemm_algo::host_packed: a BLIS/gebp-style blocked GEMM for host execution spaces.
///
/// Loops (outermost first), for the part of C one thread owns:
///   jc: NC columns of C    -> pack B(:, jc) for all of K into NR-column micro-panels
///   ic: MC rows of C       ->
///     pc: KC of K           -> pack A(ic, pc) into MR-row micro-panels
///       jr, ir: one MR x NR micro-tile: the micro-kernel runs over KC, accumulating in
///               registers; between KC blocks the sums are kept in C itself (fp32 C, unit
///               stride along rows) or in an fp32 workspace (MC x NC, thread-local), so that
///               the epilogue, the output scale and the cast are applied once, after the last
///               KC block, whatever C's precision. Full tiles are added into C (or the
///               workspace) by the micro-kernel; edge tiles are computed at their size into a
///               tile buffer and stored from there.
/// Packing converts the operands to the compute format, so the micro-kernels never convert:
/// fp32 for the FMA kernel (gemm/detail/fma.hpp; fp32 B with contiguous rows and <= 1 MiB per
/// thread is read in place instead), bf16 pairs along K for bf16/fp8 inputs: the AMX kernel
/// (gemm/detail/amx.hpp) where AMX is usable, else the AVX512_BF16 kernel
/// (gemm/detail/avx512bf16.hpp), else the FMA kernel. The data movement of packing is in
/// gemm/detail/host_pack.hpp.
///
/// Threads: C is cut into one part per thread of the execution space (along N, or along M
/// when M is the larger extent); each thread packs what its part needs into its own
/// thread_local buffers (the "workspace" of the design: one per host thread, grown on demand,
/// never shrunk or reallocated in steady state), so parts never wait on each other and every C
/// element is reduced over K in the same order for a given thread count (deterministic).

#include <tessera/config/cpu.hpp>
#include <tessera/config/cpu_model.hpp>
#include <tessera/config/error.hpp>
#include <tessera/config/kokkos_compat.hpp>
#include <tessera/gemm/detail/amx.hpp>
#include <tessera/gemm/detail/avx512bf16.hpp>
#include <tessera/gemm/detail/blocking.hpp>
#include <tessera/gemm/detail/fma.hpp>
#include <tessera/gemm/detail/host_pack.hpp>
#include <tessera/gemm/detail/problem.hpp>
#include <tessera/gemm/detail/reference.hpp>
#include <tessera/simd/lanes.hpp>

#include <algorithm>
#include <concepts>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

namespace tessera::detail {

#if !TESSERA_DEVICE_PASS

namespace hostgemm {

/// 64-byte aligned, grow-only scratch memory (one per buffer role per thread).
struct scratch {
  void* p = nullptr;
  std::size_t bytes = 0;
  scratch() = default;
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() { std::free(p); }
  template <class T>
  T* get(std::size_t n) {
    const std::size_t need = (n * sizeof(T) + 63) / 64 * 64;
    if (need > bytes) {
      std::free(p);
      p = std::aligned_alloc(64, need);
      if (!p) throw std::bad_alloc();
      bytes = need;
    }
    return static_cast<T*>(p);
  }
};

/// The per-thread buffers: packed A block, packed B column block, the C tile workspace.
struct thread_buffers {
  scratch a, b, w;
};

/// Buffers of the calling host thread. thread_local by design (documented in the file
/// comment): each OpenMP / Serial worker keeps its own, reused by every later call.
inline thread_buffers& buffers() {
  thread_local thread_buffers tb;
  return tb;
}

inline index_t round_up(index_t x, index_t m) {
  return (x + m - 1) / m * m;
}

/// Rows and columns of one part of C (the share of one thread).
struct part {
  index_t i0, m, j0, n;
};

/// Splits C among `parts` threads: along M when M >= N and each share keeps at least
/// `mr` * 2 rows, else along N in multiples of `nr` columns. Shares are contiguous and fixed
/// by (M, N, parts), so the result is deterministic for a thread count.
inline part split(index_t m, index_t n, int parts, int id, index_t mr, index_t nr) {
  if (parts <= 1) return {0, m, 0, n};
  const bool by_m = (m >= n && m >= parts * 2 * mr) || n < parts * nr;
  const index_t ext = by_m ? m : n, unit = by_m ? mr : nr;
  const index_t units = (ext + unit - 1) / unit;
  const index_t lo = units * id / parts * unit, hi = std::min(ext, units * (id + 1) / parts * unit);
  const index_t b = std::min(lo, ext), e = std::max(b, hi);
  return by_m ? part{b, e - b, 0, n} : part{0, m, b, e - b};
}

/// Stores an MR x NR tile t (row stride NR, fp32 values alpha * AB) rows [0, mr) and columns
/// [0, nr) at (i0, j0) of C through the problem's epilogue. Returns the tile's amax.
template <index_t NR, class Prob>
inline float store_tile(const Prob& pr, const float* t, index_t i0, index_t j0, index_t mr,
                        index_t nr) {
  using VC = decltype(pr.c);
  using Ops = decltype(pr.ops);
  constexpr bool plain = std::is_same_v<typename VC::precision, fp32> &&
                         std::is_same_v<Ops, op_pack<>> && !Prob::scaled_out;
  if constexpr (plain) {
    if (pr.c.stride(1) == 1) {
      const float al = pr.alpha, be = pr.beta;
      for (index_t r = 0; r < mr; ++r) {
        float* crow = pr.c.data() + (i0 + r) * pr.c.stride(0) + j0;
        const float* tr = t + r * NR;
        if (be == 0.f) {
          for (index_t j = 0; j < nr; ++j) crow[j] = al * tr[j];
        } else {
          for (index_t j = 0; j < nr; ++j) crow[j] = al * tr[j] + be * crow[j];
        }
      }
      return 0.f;
    }
  }
  float mx = 0.f;
  for (index_t r = 0; r < mr; ++r)
    for (index_t j = 0; j < nr; ++j) {
      const float a = pr.store(t[r * NR + j], i0 + r, j0 + j);
      mx = a > mx ? a : mx;
    }
  return mx;
}

/// Where partial sums over K live between KC blocks: C itself when it is fp32, unscaled and
/// unit-stride along its rows (it then holds alpha * partial + beta * C_old), else an fp32
/// workspace holding the raw partial sums.
template <class Prob>
constexpr bool c_is_target() {
  return std::is_same_v<typename decltype(std::declval<Prob>().c)::precision, fp32> &&
         !Prob::scaled_out;
}

/// Folds the raw MR x NR sums t of a KC block into C (see c_is_target) or the workspace w.
template <index_t NR, class Prob>
inline float combine(const Prob& pr, const float* t, index_t i0, index_t j0, index_t mr, index_t nr,
                     bool first, bool last, bool direct, float* w, index_t ldw) {
  if (first && last) return store_tile<NR>(pr, t, i0, j0, mr, nr);
  if (direct) {
    const float al = pr.alpha, be = pr.beta;
    const index_t ldc = pr.c.stride(0);
    float* c0 = reinterpret_cast<float*>(pr.c.data()) + i0 * ldc + j0;
    if (first) {
      for (index_t r = 0; r < mr; ++r) {
        float* cr = c0 + r * ldc;
        const float* tr = t + r * NR;
        if (be == 0.f) {
          for (index_t j = 0; j < nr; ++j) cr[j] = al * tr[j];
        } else {
          for (index_t j = 0; j < nr; ++j) cr[j] = al * tr[j] + be * cr[j];
        }
      }
      return 0.f;
    }
    if (!last || std::is_same_v<decltype(pr.ops), op_pack<>>) {
      for (index_t r = 0; r < mr; ++r) {
        float* cr = c0 + r * ldc;
        const float* tr = t + r * NR;
        for (index_t j = 0; j < nr; ++j) cr[j] += al * tr[j];
      }
      return 0.f;
    }
    for (index_t r = 0; r < mr; ++r) {
      float* cr = c0 + r * ldc;
      const float* tr = t + r * NR;
      for (index_t j = 0; j < nr; ++j) cr[j] = pr.ops(cr[j] + al * tr[j], i0 + r, j0 + j);
    }
    return 0.f;
  }
  if (!last) {
    for (index_t r = 0; r < mr; ++r) {
      float* wr = w + r * ldw;
      const float* tr = t + r * NR;
      if (first) {
        for (index_t j = 0; j < nr; ++j) wr[j] = tr[j];
      } else {
        for (index_t j = 0; j < nr; ++j) wr[j] += tr[j];
      }
    }
    return 0.f;
  }
  float mx = 0.f;
  for (index_t r = 0; r < mr; ++r)
    for (index_t j = 0; j < nr; ++j) {
      const float a = pr.store(w[r * ldw + j] + t[r * NR + j], i0 + r, j0 + j);
      mx = a > mx ? a : mx;
    }
  return mx;
}

// ---------------------------------------------------------------------------------------------
// The vectorised store of a finished tile: the epilogue ops on whole vectors of a row
// ---------------------------------------------------------------------------------------------

using vfloat = xsimd::batch<float, arch>;
inline constexpr index_t VL = static_cast<index_t>(vfloat::size);

/// Vector forms of the epilogue ops (tessera::epi): the op on the VL consecutive columns
/// j .. j + VL - 1 of row i, lane by lane equal to the scalar op. Ops without one (gelu_tanh,
/// gelu_erf: their tanh and erf; a caller's own op) leave the tiles to the scalar store. Other
/// headers add forms for their own ops (found by argument-dependent lookup): conv's bias op
/// (conv/detail/passes.hpp).
template <class P>
vfloat vec_op(const epi::bias_row<P>& o, const vfloat& v, index_t i, index_t) {
  return v + vfloat(o.bias[i]);
}
template <class P>
vfloat vec_op(const epi::bias_col<P>& o, const vfloat& v, index_t, index_t j) {
  if constexpr (std::is_same_v<P, fp32>)
    if (o.bias.stride == 1) return v + vfloat::load_unaligned(o.bias.data + j);
  alignas(64) float b[VL];
  for (index_t l = 0; l < VL; ++l) b[l] = o.bias[j + l];
  return v + vfloat::load_aligned(b);
}
template <class P>
vfloat vec_op(const epi::residual<P>& o, const vfloat& v, index_t i, index_t j) {
  if constexpr (std::is_same_v<P, fp32>)
    if (o.r.s1 == 1) return v + vfloat::load_unaligned(o.r.data + i * o.r.s0 + j);
  alignas(64) float r[VL];
  for (index_t l = 0; l < VL; ++l) r[l] = o.r(i, j + l);
  return v + vfloat::load_aligned(r);
}
inline vfloat vec_op(const epi::relu&, const vfloat& v, index_t, index_t) {
  return xsimd::select(v < vfloat(0.f), vfloat(0.f), v); // NaN < 0 is false: NaN stays
}
inline vfloat vec_op(const epi::scale& o, const vfloat& v, index_t, index_t) {
  return v * vfloat(o.factor);
}

template <class Op>
concept vector_op = requires(const Op& o, const vfloat& v, index_t i) {
  { vec_op(o, v, i, i) } -> std::same_as<vfloat>;
};

/// The ops of a pack in order, on one vector (every op a vector_op).
inline vfloat vec_ops(const op_pack<>&, const vfloat& v, index_t, index_t) {
  return v;
}
template <class O, class... R>
vfloat vec_ops(const op_pack<O, R...>& p, const vfloat& v, index_t i, index_t j) {
  return vec_ops(p.tail, vec_op(p.head, v, i, j), i, j);
}

template <class Pack>
inline constexpr bool vector_pack = false;
template <class... Ops>
inline constexpr bool vector_pack<op_pack<Ops...>> = (vector_op<Ops> && ...);

/// True when the last store of a tile into C (alpha, beta, the ops) runs on vectors: a SIMD
/// build, fp32 C without an output scale, and every op with a vector form. (For a bf16 C the
/// scalar store, which the compiler vectorises, was as fast as the vector codec: res1x1_56's
/// forward on Zen 5, 0.91x with the codec.)
template <class Prob>
constexpr bool vector_store() {
  return have_simd && vector_pack<decltype(std::declval<Prob>().ops)> &&
         std::is_same_v<typename decltype(std::declval<Prob>().c)::precision, fp32> &&
         !Prob::scaled_out;
}

/// The last store of the raw sums t of rows [0, mr) and columns [0, nr) of a tile (row stride
/// NR, 64-byte aligned) at (i0, j0) of C (fp32, unit-stride rows: C itself holds the partial
/// sums of earlier KC slices, see c_is_target): v = alpha * t + beta * C_old for a single
/// slice, C + alpha * t after earlier ones (c_partial); then the ops. Whole vectors in
/// registers, the last nr % VL columns one by one. (Full tiles of the fp32 kernel take
/// micro_c_post instead: the ops on its registers.)
template <index_t NR, class Prob>
void store_tile_vec(const Prob& pr, const float* t, index_t i0, index_t j0, index_t mr, index_t nr,
                    bool c_partial) {
  const index_t ldc = pr.c.stride(0);
  const float al = pr.alpha, be = c_partial ? 1.f : pr.beta;
  const vfloat va(al), vb(be);
  for (index_t r = 0; r < mr; ++r) {
    const index_t i = i0 + r;
    float* crow = pr.c.data() + i * ldc + j0;
    const float* tr = t + r * NR;
    index_t j = 0;
    for (; j + VL <= nr; j += VL) {
      vfloat v = va * vfloat::load_aligned(tr + j);
      if (be != 0.f) v = xsimd::fma(vb, vfloat::load_unaligned(crow + j), v);
      vec_ops(pr.ops, v, i, j0 + j).store_unaligned(crow + j);
    }
    for (; j < nr; ++j) {
      float v = al * tr[j];
      if (be != 0.f) v += be * crow[j];
      crow[j] = pr.ops(v, i, j0 + j);
    }
  }
}

/// The blocked loops of the file comment over one part of C, with kernel Kern.
/// The blocking bk (gemm/detail/blocking.hpp) must fit the kernel's buffers: see check_blocking.
template <class Kern, class Prob>
float run_part(const Prob& pr, const part& pt, const blocking& bk) {
  constexpr index_t MR = Kern::MR, NR = Kern::NR;
  const index_t KC = bk.kc, MC = bk.mc;
  using T = typename Kern::packed_t;
  if (pt.m <= 0 || pt.n <= 0) return 0.f;
  const index_t k = pr.k;
  const bool multi = k > KC;
  bool direct = false;
  if constexpr (c_is_target<Prob>()) direct = pr.c.stride(1) == 1;
  const index_t kpad = round_up(std::max<index_t>(k, 1), Kern::k_align);
  // NC: the packed B block (K x NC) stays under b_bytes, and the C block (MC x NC fp32) under
  // NC_max columns (see the kernels).
  index_t nc_cap = static_cast<index_t>(bk.b_bytes / sizeof(T)) / kpad / NR * NR;
  nc_cap = std::clamp<index_t>(nc_cap, NR, bk.nc_max);
  nc_cap = std::min(nc_cap, round_up(pt.n, NR));
  const index_t mc_cap = std::min(MC, round_up(pt.m, MR));
  const index_t kc_cap = std::min(KC, kpad);
  auto& tb = buffers();
  T* pa = tb.a.get<T>(static_cast<std::size_t>(mc_cap * kc_cap));
  T* pb = tb.b.get<T>(static_cast<std::size_t>(round_up(nc_cap, NR) * kpad));
  // Workspace rows padded by 16 floats (64 bytes): a row stride of a multiple of 4 KiB would
  // map all rows of a tile to one L1 set.
  const index_t ldw = round_up(nc_cap, NR) + 16;
  float* ws = multi && !direct ? tb.w.get<float>(static_cast<std::size_t>(mc_cap * ldw)) : nullptr;
  alignas(64) float tile[MR * NR];
  float mx = 0.f;
  constexpr bool no_ops = std::is_same_v<decltype(pr.ops), op_pack<>>;
  float* const cdata = direct ? reinterpret_cast<float*>(pr.c.data()) : nullptr;
  const index_t ldc = pr.c.stride(0);
  if (k == 0) {
    for (index_t j = 0; j < NR * MR; ++j) tile[j] = 0.f;
    for (index_t i = 0; i < pt.m; i += MR)
      for (index_t j = 0; j < pt.n; j += NR) {
        const float m = store_tile<NR>(pr, tile, pt.i0 + i, pt.j0 + j, std::min(MR, pt.m - i),
                                       std::min(NR, pt.n - j));
        mx = m > mx ? m : mx;
      }
    return mx;
  }
  // Kernels that can read B in place (Kern::in_place_b_bytes), when B needs no conversion.
  constexpr bool reads_b = [] {
    if constexpr (requires { Kern::in_place_b_bytes; })
      return std::is_same_v<typename decltype(pr.b)::storage_type, T>;
    else
      return false;
  }();
  // (the kernel's type a parameter of the lambda, so that kernels without micro_c, which never
  // reach a call, compile: Kern::micro_c written here would be looked up when run_part is
  // instantiated; the AMX kernel, the only one without it, did not compile before it was first
  // built, under emulation)
  const auto micro_c = []<class K>(K, index_t kcp, const auto* a, const T* b,
                                   [[maybe_unused]] index_t ldb, float* d, index_t ldd,
                                   const float* ab) {
    if constexpr (reads_b)
      K::micro_c(kcp, a, b, d, ldd, ab, ldb);
    else
      K::micro_c(kcp, a, b, d, ldd, ab);
  };
  Kern::begin();
  for (index_t jc = 0; jc < pt.n; jc += nc_cap) {
    const index_t nc = std::min(nc_cap, pt.n - jc), ncp = round_up(nc, NR);
    // The B block for all of K: KC slices one after another, slice pc at pb + pc * ncp; or
    // (in_place_b) only a last partial panel packed, the full ones read from B itself.
    bool in_place = false;
    if constexpr (reads_b)
      in_place = pr.b.stride(1) == 1 &&
                 k * nc * index_t(sizeof(T)) <=
                     std::min(Kern::in_place_b_bytes, static_cast<index_t>(bk.in_place_b_bytes)) &&
                 pr.b.stride(0) * index_t(sizeof(T)) <= Kern::in_place_b_row_bytes;
    const index_t nfull = in_place ? nc / NR * NR : 0;
    for (index_t pc = 0; nfull < nc && pc < k; pc += KC) {
      const index_t kc = std::min(KC, k - pc);
      Kern::pack_b(pr.b, pc, kc, pt.j0 + jc + nfull, nc - nfull,
                   pb + pc * ncp + nfull * round_up(kc, Kern::k_align));
    }
    for (index_t ic = 0; ic < pt.m; ic += mc_cap) {
      const index_t mc = std::min(mc_cap, pt.m - ic);
      for (index_t pc = 0; pc < k; pc += KC) {
        const index_t kc = std::min(KC, k - pc), kcp = round_up(kc, Kern::k_align);
        const bool first = pc == 0, last = pc + KC >= k;
        Kern::pack_a(pr.a, pt.i0 + ic, mc, pc, kc, pa);
        const T* bslice = pb + pc * ncp;
        for (index_t jr = 0; jr < nc; jr += NR) {
          const bool unpacked = jr < nfull;
          const T* bp = unpacked ? reinterpret_cast<const T*>(pr.b.data()) + pc * pr.b.stride(0) +
                                       pt.j0 + jc + jr
                                 : bslice + jr * kcp;
          const index_t ldb = unpacked ? pr.b.stride(0) : NR;
          for (index_t ir = 0; ir < mc; ir += MR) {
            const index_t mr = std::min(MR, mc - ir), nr = std::min(NR, nc - jr);
            float* w = ws ? ws + ir * ldw + jr : nullptr;
            if constexpr (requires { &Kern::micro_c; }) {
              // Full tiles whose sums go to C (fp32, no epilogue left to apply) or to the
              // workspace (not the last KC slice) are updated by the micro-kernel itself.
              if (mr == MR && nr == NR) {
                if (direct && (!last || no_ops)) {
                  const float ab[2] = {pr.alpha, first ? pr.beta : 1.f};
                  micro_c(Kern{}, kcp, pa + ir * kcp, bp, ldb,
                          cdata + (pt.i0 + ic + ir) * ldc + pt.j0 + jc + jr, ldc, ab);
                  continue;
                }
                if constexpr (vector_store<Prob>() &&
                              requires { &Kern::template micro_c_post<no_post>; }) {
                  // The last KC slice into fp32 C: the ops on the registers before the store.
                  if (direct) {
                    const float ab[2] = {pr.alpha, first ? pr.beta : 1.f};
                    const index_t i0 = pt.i0 + ic + ir, j0 = pt.j0 + jc + jr;
                    Kern::micro_c_post(kcp, pa + ir * kcp, bp, cdata + i0 * ldc + j0, ldc, ab, ldb,
                                       [&](const vfloat& v, index_t r, index_t j) {
                                         return vec_ops(pr.ops, v, i0 + r, j0 + j);
                                       });
                    continue;
                  }
                }
                if (w && !last) {
                  const float ab[2] = {1.f, first ? 0.f : 1.f};
                  micro_c(Kern{}, kcp, pa + ir * kcp, bp, ldb, w, ldw, ab);
                  continue;
                }
              }
            }
            if constexpr (reads_b)
              Kern::micro(kcp, pa + ir * kcp, bp, tile, mr, nr, ldb); // edge tiles: their size
            else if constexpr (requires { Kern::micro(kcp, pa, bp, tile, mr, nr); })
              Kern::micro(kcp, pa + ir * kcp, bp, tile, mr, nr);
            else
              Kern::micro(kcp, pa + ir * kcp, bp, tile);
            if constexpr (vector_store<Prob>()) {
              if (last && direct) {
                store_tile_vec<NR>(pr, tile, pt.i0 + ic + ir, pt.j0 + jc + jr, mr, nr, !first);
                continue;
              }
            }
            const float m = combine<NR>(pr, tile, pt.i0 + ic + ir, pt.j0 + jc + jr, mr, nr, first,
                                        last, direct, w, ldw);
            mx = m > mx ? m : mx;
          }
        }
      }
    }
  }
  Kern::end();
  return mx;
}

/// Throws unless bk fits kernel Kern: KC a multiple of k_align up to Kern::KC, MC a multiple of
/// MR up to Kern::MC, NC up to Kern::NC_max (its buffers are sized by those).
template <class Kern>
void check_blocking(const blocking& bk) {
  if (bk.kc < Kern::k_align || bk.kc > Kern::KC || bk.kc % Kern::k_align != 0 || bk.mc < Kern::MR ||
      bk.mc > Kern::MC || bk.mc % Kern::MR != 0 || bk.nc_max < Kern::NR ||
      bk.nc_max > Kern::NC_max || bk.b_bytes == 0)
    throw value_error("tessera::gemm (host_packed): blocking KC " + std::to_string(bk.kc) +
                      ", MC " + std::to_string(bk.mc) + ", NC " + std::to_string(bk.nc_max) +
                      " does not fit the micro-kernel (KC <= " + std::to_string(Kern::KC) +
                      " in steps of " + std::to_string(Kern::k_align) +
                      ", MC <= " + std::to_string(Kern::MC) + " in steps of " +
                      std::to_string(Kern::MR) + ", NC <= " + std::to_string(Kern::NC_max) + ")");
}

/// The blocking of kernel Kern for this CPU (gemm/detail/blocking.hpp), chosen once.
template <class Kern>
const blocking& host_blocking() {
  static const blocking bk = choose_blocking(Kern::shape, cpu::host_model());
  return bk;
}

/// Multiply-adds each part of a shared-out product must have at least: 64^3. A smaller product
/// runs on the calling thread, since starting and joining a parallel region costs more than
/// the second thread saves. Measured on Zen 5 (AMD EPYC family 0x1a, 2 threads, libgomp's
/// default waiting), 2 threads over 1: 64^3 0.49x in fp32 (0.51x in compare.sh's sitting at
/// 830101e, where oneDNN fp32 lost alike), 80^3 0.78x, 96^3 1.01x, 128^3 1.44x. With
/// OMP_WAIT_POLICY=passive a region costs about 10 us (waking a sleeping thread) and 2 threads
/// lost up to 192^3; the rule is set for spinning workers, the default.
inline constexpr index_t min_part_macs = index_t(1) << 18;

/// Parts (threads) a product of m x n x k with micro-tiles of mr x nr is shared among: at most
/// `threads`, one per micro-tile of C, and one per min_part_macs multiply-adds.
inline int parts_for(index_t threads, index_t m, index_t n, index_t k, index_t mr, index_t nr) {
  const index_t tiles = (m + mr - 1) / mr * ((n + nr - 1) / nr);
  // m * n * k / min_part_macs without overflow (each factor is below 2^31)
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
                      static_cast<double>(min_part_macs);
  const index_t by_work =
      work >= static_cast<double>(threads) ? threads : static_cast<index_t>(work);
  return static_cast<int>(std::max<index_t>(1, std::min({threads, tiles, by_work})));
}

/// Runs kernel Kern over the parts of C, one per thread of exec, with blocking bk (tests pass
/// each configuration; gemm passes host_blocking<Kern>()).
template <class Kern, class Exec, class Prob>
float run_parallel(const Exec& exec, const Prob& pr, const blocking& bk) {
  check_blocking<Kern>(bk);
  const int parts = parts_for(static_cast<index_t>(tessera::concurrency(exec)), pr.m, pr.n, pr.k,
                              Kern::MR, Kern::NR);
  if (parts == 1) return run_part<Kern>(pr, part{0, pr.m, 0, pr.n}, bk);
  float amax = 0.f;
  Kokkos::parallel_reduce(
      "tessera::gemm[host_packed]",
      Kokkos::RangePolicy<Exec, Kokkos::Schedule<Kokkos::Static>>(exec, 0, parts),
      [&](const int id, float& mx) {
        const float m = run_part<Kern>(pr, split(pr.m, pr.n, parts, id, Kern::MR, Kern::NR), bk);
        mx = m > mx ? m : mx;
      },
      Kokkos::Max<float>(amax));
  exec.fence();
  return amax;
}

/// run_parallel with the blocking the CPU model picks for Kern.
template <class Kern, class Exec, class Prob>
float run_parallel(const Exec& exec, const Prob& pr) {
  return run_parallel<Kern>(exec, pr, host_blocking<Kern>());
}

} // namespace hostgemm

#endif // !TESSERA_DEVICE_PASS

template <class Exec, class Prob>
float gemm_host(const Exec& exec, const Prob& pr) {
#if !TESSERA_DEVICE_PASS
  if constexpr (hostgemm::have_simd) {
    if (pr.m == 0 || pr.n == 0) return 0.f;
    // bf16 and fp8 inputs (both): AMX where usable, else AVX512_BF16, else the fp32 kernel.
    using pa = typename Prob::pa;
    using pb = typename Prob::pb;
    if constexpr (hostgemm::amx_input_v<pa> && hostgemm::amx_input_v<pb>) {
#if TESSERA_GEMM_AMX
      if (cpu::amx_bf16_usable()) return hostgemm::run_parallel<hostgemm::amx_kernel>(exec, pr);
#endif
#if TESSERA_GEMM_AVX512BF16
      if (cpu::has_avx512bf16()) return hostgemm::run_parallel<hostgemm::dpbf16_kernel>(exec, pr);
#endif
    }
    return hostgemm::run_parallel<hostgemm::fma_kernel>(exec, pr);
  } else {
    return gemm_direct(exec, pr);
  }
#else
  return gemm_direct(exec, pr);
#endif
}

} // namespace tessera::detail
