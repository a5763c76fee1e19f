#pragma once
/// \file gemm/detail/blocking.hpp
/// The cache blocking of gemm_algo::host_packed (KC, MC, NC of gemm/detail/host.hpp), chosen at
/// run time from the CPU model (config/cpu_model.hpp). The micro-kernel's register tile (MR x
/// NR) is fixed at compile time by the instruction set the translation unit targets (32 vector
/// registers with AVX-512: 14 x 32 fp32; 16 with AVX2: 6 x 16; AMX: 32 x 32 in 4 tiles); the
/// blocks around it are data, so one compiled kernel serves every CPU of its ISA and the
/// choice costs no extra template instantiations.
///
/// The rule (the numbers of the fp32 and AVX512_BF16 kernels were measured on the Zen 5 they
/// were tuned on, 1 thread: see the kernels' comments; the rule scales them by the caches):
///
///   KC (depth of one block of K): the kernel's KC, 512 fp32 / 1024 bf16 pairs / 512 AMX. For
///     the FMA and AVX512_BF16 kernels the B micro-panel (KC x NR: 64 KiB) is larger than the
///     L1d of every target (32 KiB Zen 4, 48 KiB Zen 5 and Sapphire Rapids) and streams from L2
///     at 2 vectors per 14 to 28 cycles, a small share of what L2 delivers; larger KC halves how
///     often the C tiles are read and written. The L1d size therefore does not move KC: on Zen 4
///     (32 KiB L1d, 256-bit datapath: a zmm FMA takes two cycles of the two pipes) the stream
///     from L2 is half as fast as on Zen 5 for the same tile. KC is halved only when L2 is too
///     small to hold an A block of at least 4 micro-panels at full KC (256 KiB L2 parts).
///   MC (rows of the packed A block, MC x KC, kept in L2): the Zen 5 numbers (12 micro-panels,
///     168 rows, a 336 KiB fp32 block; 8 panels, 112 rows, a 224 KiB bf16 block) are for its
///     1 MiB L2; other L2 sizes keep the block's share of L2: panels = anchor x L2 / 1 MiB,
///     rounded down, at least 2 (the A block and the B micro-panels then share L2 as they did
///     where it was measured). Zen 4 (1 MiB): the Zen 5 numbers. Sapphire Rapids (2 MiB): 336
///     fp32 rows, 224 bf16 rows; its L3 is a mesh farther away than a Zen CCD's, so a larger A
///     block, which amortises each B micro-panel brought from L3 over twice as many tiles, is
///     worth more there. AMX: 8 panels of 32 rows at 2 MiB (256 rows, 256 KiB). Measured on
///     an Intel Xeon Emerald Rapids (family 6 model 0xCF, 2 MiB L2, 1 thread, bf16 n^3 at
///     n = 256 .. 2048, 2026-11-28): KC 512 with MC 256 was within run-to-run noise (~10%) of
///     the best of KC 128 / 256 / 512 x MC 64 / 128 / 256 / 512 at every n; KC 128 lost 10 to
///     40% (the C tiles are loaded and stored once per KC slice).
///   NC (columns of the packed B block, K x NC, kept in L3): at most 1024 columns (the C block
///     MC x NC fp32 across the KC slices) and the B block under min(8 MiB, L3 / 4): 8 MiB on all
///     three targets (32 MiB per Zen CCD; 105 MiB on a 56-core Sapphire Rapids, 1.875 MiB per
///     core); a quarter of smaller L3s (8 MiB client parts: 2 MiB).
///   B in place (the fp32 FMA kernel reads a B with contiguous rows unpacked, fma.hpp): while
///     the part of B a thread uses is at most 1.25 x L2 and 1 MiB (measured on Zen 5's 1 MiB
///     L2: 1 MiB). Each block of A rows re-reads all of it, so it must mostly stay in L2. On
///     Zen 3 (AMD EPYC family 0x19 model 0x01, AVX2, 512 KiB L2, 1 thread, 2026-12-02, ratios
///     to OpenBLAS in the same rounds): 512^3 (B 1 MiB) in place 0.78-0.83, packed 0.94-0.98;
///     384^3 (B 576 KiB) in place 0.95-1.03, packed 0.87-0.91. Zen 4, Zen 5 and the Xeons
///     (L2 >= 1 MiB) keep 1 MiB.
/// Checked on Zen 4 (EPYC family 0x19 model 0x11, 1 thread, CPU time, best of 5, n^3 at n = 1024
/// and 2048, issue 11): fp32 KC 256 and 384 ran 1.5 to 4% slower than 512, MC 112 and 224 within
/// 1% of 168; bf16 KC 512 2 to 4% slower than 1024, MC 56 and 168 within 1% of 112. So the Zen 5
/// numbers hold there, and MC is not sensitive within a factor of 2 of the rule's value.
/// The datapath width (cpu_model::simd_datapath_bits) moves none of these on the three targets:
/// a 256-bit datapath halves the FLOP rate of the same instruction stream, which halves the
/// bandwidth each block needs, so blocks that fit at 512 bits fit at 256. The register tile
/// does not change with it either: 28 zmm accumulators cover the FMA latency x throughput (4 x
/// 2 on Zen 5, 4 x 1 on Zen 4) many times over.
/// Limits: the sizes are per core as CPUID reports them; with several threads each thread packs
/// its own B block (host.hpp), so on many cores of one L3 the blocks exceed their share of it
/// (measured only up to 2 threads).

#include <tessera/config/cpu_model.hpp>
#include <tessera/tensor/extents.hpp>

#include <algorithm>
#include <cstddef>

namespace tessera::detail::hostgemm {

/// What the blocking rule needs to know of a micro-kernel (each kernel has a constexpr `shape`).
struct kernel_shape {
  index_t mr = 1;             ///< rows of the register tile (MC is a multiple of it)
  index_t kc = 1;             ///< the kernel's KC (also the largest its buffers allow)
  index_t k_align = 1;        ///< KC is a multiple of it
  index_t max_panels = 1;     ///< the most MR-row micro-panels its buffers allow in an A block
  index_t panels_at_1mib = 1; ///< micro-panels per A block on a 1 MiB L2 (the anchor)
};

/// One blocking of the loops of gemm/detail/host.hpp.
struct blocking {
  index_t kc = 0, mc = 0, nc_max = 0;
  std::size_t b_bytes = 0; ///< the packed B block (K x NC) stays under this
  /// A kernel that can read B in place (the fp32 FMA kernel, fma.hpp: in_place_b_bytes) does so
  /// only while the part of B a thread uses is at most this (and its own bound): 1.25 x L2, at
  /// most 1 MiB (see the file comment).
  std::size_t in_place_b_bytes = std::size_t(1) << 20;
  friend constexpr bool operator==(const blocking&, const blocking&) = default;
};

/// The blocking for kernel shape s on a CPU with L2 and L3 sizes l2 and l3 bytes (see the file
/// comment for the rule and where its numbers come from).
constexpr blocking choose_blocking(const kernel_shape& s, std::size_t l2, std::size_t l3) {
  constexpr std::size_t mib = std::size_t(1) << 20;
  blocking b;
  b.kc = s.kc;
  const auto panels = [&](index_t kc) {
    // panels_at_1mib x (L2 / 1 MiB), in whole panels; the A block at KC = kc scales the same
    // way as at the kernel's KC (a halved KC doubles the panels that fit).
    return static_cast<index_t>(static_cast<std::size_t>(s.panels_at_1mib) * l2 *
                                static_cast<std::size_t>(s.kc / kc) / mib);
  };
  index_t p = panels(b.kc);
  if (p < 4 && s.kc / 2 >= s.k_align && (s.kc / 2) % s.k_align == 0) {
    b.kc = s.kc / 2;
    p = panels(b.kc);
  }
  p = std::clamp<index_t>(p, 2, s.max_panels);
  b.mc = p * s.mr;
  b.nc_max = 1024;
  b.b_bytes = std::min<std::size_t>(8 * mib, std::max<std::size_t>(l3 / 4, mib));
  b.in_place_b_bytes = std::min(l2 + l2 / 4, mib);
  return b;
}

inline blocking choose_blocking(const kernel_shape& s, const cpu::cpu_model& m) {
  return choose_blocking(s, m.l2, m.l3);
}

} // namespace tessera::detail::hostgemm
