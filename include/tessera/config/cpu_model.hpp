#pragma once
/// \file config/cpu_model.hpp
/// A model of the host CPU read at run time from CPUID: vendor, family and model, the cache
/// sizes, the instruction sets that this CPU and OS allow, and the width of the datapath that
/// executes AVX-512. gemm/detail/blocking.hpp derives the GEMM's blocking from it.
///
/// The model is built from a cpuid_source: the live CPU (cpuid_source::live()) or a table of
/// recorded register values (leaf, subleaf -> eax, ebx, ecx, edx) and a recorded XCR0, so that
/// the choices made for CPUs other than the one at hand can be tested
/// (tests/config/test_cpu_model.cpp; tests/config/dump_cpuid.cpp prints this machine's table).
/// host_model() is the live model, read once per process (a function-local static const).
///
/// What is read (Intel SDM vol. 2A "CPUID"; AMD APM vol. 3 appendix E):
///   leaf 0           max leaf, vendor string (ebx, edx, ecx)
///   leaf 1           family / model / stepping (eax), FMA (ecx 12), OSXSAVE (ecx 27), AVX (28)
///   leaf 7.0         AVX2 (ebx 5), AVX-512F (ebx 16), AVX-512BW (ebx 30), AMX-BF16 (edx 22),
///                    AMX-TILE (edx 24)
///   leaf 7.1         AVX512_BF16 (eax 5)
///   leaf 4.n         Intel deterministic cache parameters: type (eax 4:0), level (eax 7:5),
///                    logical processors sharing - 1 (eax 25:14), ways - 1 (ebx 31:22),
///                    partitions - 1 (ebx 21:12), line size - 1 (ebx 11:0), sets - 1 (ecx)
///   0x80000000       max extended leaf
///   0x80000001       AMD TOPOEXT (ecx 22): leaf 0x8000001D is valid
///   0x8000001D.n     AMD cache parameters, the format of leaf 4
///   0x80000005/6     AMD fallback: L1d KiB (0x80000005 ecx 31:24), L2 KiB (0x80000006 ecx
///                    31:16), L3 in 512 KiB units (0x80000006 edx 31:18)
/// XCR0 (xgetbv 0) says which register state the OS saves: bits 1-2 (XMM, YMM) for AVX, 5-7
/// (opmask, ZMM) for AVX-512, 17-18 (XTILECFG, XTILEDATA) for AMX. Linux also requires a
/// per-process permission for AMX (cpu::amx_bf16_usable in config/cpu.hpp): the live model asks
/// for it; a recorded model takes it as granted when XCR0 allows the tile state.

#include <tessera/config/cpu.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#if !TESSERA_DEVICE_PASS && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <cpuid.h>
#define TESSERA_CPU_HAS_CPUID 1
#else
#define TESSERA_CPU_HAS_CPUID 0
#endif

namespace tessera::cpu {

/// The four registers one CPUID query returns.
struct cpuid_regs {
  std::uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

/// One recorded CPUID query: leaf (eax in) and subleaf (ecx in) -> registers.
struct cpuid_record {
  std::uint32_t leaf = 0, subleaf = 0;
  cpuid_regs r{};
};

/// Where CPUID values come from: the live CPU, or a recorded table (queries not in the table
/// read as zeros, which CPUID itself returns for unsupported subleaves).
class cpuid_source {
public:
  /// The CPU this runs on (all zeros where there is no CPUID: the model then has no features
  /// and fallback cache sizes).
  static cpuid_source live() { return cpuid_source(); }
  /// A recorded table and XCR0.
  cpuid_source(std::initializer_list<cpuid_record> table, std::uint64_t xcr0)
      : table_(table), xcr0_(xcr0), live_(false) {}
  cpuid_source(std::vector<cpuid_record> table, std::uint64_t xcr0)
      : table_(std::move(table)), xcr0_(xcr0), live_(false) {}

  bool is_live() const noexcept { return live_; }

  cpuid_regs query(std::uint32_t leaf, std::uint32_t subleaf = 0) const noexcept {
    if (!live_) {
      for (const auto& e : table_)
        if (e.leaf == leaf && e.subleaf == subleaf) return e.r;
      return {};
    }
    cpuid_regs r{};
#if TESSERA_CPU_HAS_CPUID
    const unsigned top = __get_cpuid_max(leaf & 0x80000000u, nullptr);
    if (leaf > top) return r;
    unsigned a = 0, b = 0, c = 0, d = 0;
    __cpuid_count(leaf, subleaf, a, b, c, d);
    r = {a, b, c, d};
#else
    (void)leaf;
    (void)subleaf;
#endif
    return r;
  }

  /// XCR0, the register state the OS enables (0 when OSXSAVE is off or there is no CPUID).
  std::uint64_t xcr0() const noexcept {
    if (!live_) return xcr0_;
#if TESSERA_CPU_HAS_CPUID
    if (!((query(1).ecx >> 27) & 1u)) return 0;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<std::uint64_t>(hi) << 32) | lo;
#else
    return 0;
#endif
  }

private:
  cpuid_source() = default;
  std::vector<cpuid_record> table_;
  std::uint64_t xcr0_ = 0;
  bool live_ = true;
};

enum class cpu_vendor { intel, amd, other };

/// The run-time model of one CPU (see the file comment for where each field comes from).
struct cpu_model {
  cpu_vendor vendor = cpu_vendor::other;
  unsigned family = 0, model = 0, stepping = 0; ///< display family / model (base + extended)

  // Instruction sets the CPU reports and the OS enables (XCR0).
  bool fma = false, avx2 = false;
  bool avx512f = false, avx512bw = false, avx512bf16 = false;
  bool amx_bf16 = false; ///< AMX-TILE and AMX-BF16, tile state enabled (and permitted, if live)

  // Caches in bytes. l1d and l2 are per core on every CPU this library targets; l3 is one L3
  // instance (a CCD's on AMD, the whole socket's on Intel) shared by l3_sharing logical
  // processors (CPUID's count, which is an upper bound rounded to the topology's bit field).
  std::size_t l1d = 0, l2 = 0, l3 = 0;
  unsigned l3_sharing = 1;
  bool caches_from_cpuid = false; ///< false: some sizes are the fallbacks below

  /// Width in bits of the datapath that executes AVX-512 (or the widest vector ISA): 512 when
  /// a 512-bit FMA issues at the rate of a 256-bit one (two per cycle), 256 when it takes twice
  /// as long (double-pumped or split over the two 256-bit pipes), so that 512-bit code has the
  /// FLOP rate of 256-bit code. See datapath_bits() for the rule and its limits.
  unsigned simd_datapath_bits = 128;

  /// Fallback sizes where CPUID reports no cache (VMs that hide leaf 4, non-x86): those of a
  /// small current core, so that blocking errs toward fitting.
  static constexpr std::size_t fallback_l1d = 32 << 10, fallback_l2 = 512 << 10,
                               fallback_l3 = 8 << 20;
};

namespace detail_model {

inline std::uint32_t bits(std::uint32_t v, unsigned lo, unsigned hi) noexcept {
  const unsigned n = hi - lo + 1;
  return n >= 32 ? v >> lo : (v >> lo) & ((1u << n) - 1u);
}

/// Cache sizes from the leaf-4 format (Intel leaf 4, AMD 0x8000001D): data or unified caches of
/// levels 1, 2, 3.
inline bool read_cache_leaf(const cpuid_source& src, std::uint32_t leaf, cpu_model& m) {
  bool any = false;
  for (std::uint32_t sub = 0; sub < 16; ++sub) {
    const cpuid_regs r = src.query(leaf, sub);
    const std::uint32_t type = bits(r.eax, 0, 4);
    if (type == 0) break;
    if (type == 2) continue; // instruction cache
    const std::uint32_t level = bits(r.eax, 5, 7);
    const std::size_t size = std::size_t(bits(r.ebx, 22, 31) + 1) * (bits(r.ebx, 12, 21) + 1) *
                             (bits(r.ebx, 0, 11) + 1) * (std::size_t(r.ecx) + 1);
    const unsigned sharing = bits(r.eax, 14, 25) + 1;
    if (level == 1) m.l1d = size;
    if (level == 2) m.l2 = size;
    if (level == 3) {
      m.l3 = size;
      m.l3_sharing = sharing;
    }
    any = true;
  }
  return any;
}

} // namespace detail_model

/// The datapath width rule (cpu_model::simd_datapath_bits):
///   - no AVX-512F (or the OS does not save ZMM state): 256 with AVX2, else 128;
///   - AMD family 0x19 (Zen 4; Zen 3 has no AVX-512): 256, AVX-512 runs on the 256-bit pipes
///     (AMD, "Software Optimization Guide for the AMD Zen4 Microarchitecture", 57647, 2.11);
///   - AMD family 0x1A and later (Zen 5): 512 (Zen 5 optimisation guide 58455: four 512-bit
///     FP pipes on desktop and server parts);
///   - Intel family 6 server cores with two 512-bit FMA units: Skylake-SP / Cascade Lake (model
///     0x55), Ice Lake-SP (0x6A, 0x6C), Sapphire Rapids (0x8F), Emerald Rapids (0xCF), Granite
///     Rapids (0xAD, 0xAE): 512; any Intel part with AMX-BF16 (all are such servers): 512;
///   - other Intel parts with AVX-512 (client Ice Lake, Tiger Lake, Rocket Lake: ports 0 and 1
///     fuse into one 512-bit FMA): 256.
/// Limits: CPUID does not say how many FMA units a part has, so this is a table by family and
/// model. Skylake-SP / Cascade Lake Bronze, Silver and some Gold 5xxx parts have one 512-bit
/// unit (their real width is 256) and are counted as 512; Zen 5 mobile parts (Strix Point)
/// execute AVX-512 on 256-bit datapaths and are counted as 512 (family only); a hypervisor
/// that reports another family or model misleads it as it does the cache sizes.
inline unsigned datapath_bits(const cpu_model& m) noexcept {
  if (!m.avx512f) return m.avx2 ? 256 : 128;
  if (m.vendor == cpu_vendor::amd) return m.family >= 0x1A ? 512 : 256;
  if (m.vendor == cpu_vendor::intel) {
    if (m.amx_bf16) return 512;
    if (m.family == 6) {
      switch (m.model) {
      case 0x55:
      case 0x6A:
      case 0x6C:
      case 0x8F:
      case 0xCF:
      case 0xAD:
      case 0xAE:
        return 512;
      default:
        return 256;
      }
    }
  }
  return 256;
}

/// Reads the model from src (see the file comment). amx_permitted: whether the OS lets this
/// process use the tile state beyond XCR0 (Linux's per-process request); the live model passes
/// cpu::amx_bf16_usable().
inline cpu_model read_cpu_model(const cpuid_source& src, bool amx_permitted = true) {
  using detail_model::bits;
  cpu_model m;
  const cpuid_regs l0 = src.query(0);
  const std::uint32_t max_leaf = l0.eax;
  const auto is = [&](const char(&s)[13]) {
    const auto word = [&](int i) {
      return std::uint32_t(std::uint8_t(s[i])) | std::uint32_t(std::uint8_t(s[i + 1])) << 8 |
             std::uint32_t(std::uint8_t(s[i + 2])) << 16 |
             std::uint32_t(std::uint8_t(s[i + 3])) << 24;
    };
    return l0.ebx == word(0) && l0.edx == word(4) && l0.ecx == word(8);
  };
  if (is("GenuineIntel")) m.vendor = cpu_vendor::intel;
  if (is("AuthenticAMD")) m.vendor = cpu_vendor::amd;

  const std::uint64_t xcr0 = src.xcr0();
  const bool os_avx = (xcr0 & 0x6u) == 0x6u;
  const bool os_avx512 = os_avx && (xcr0 & 0xE0u) == 0xE0u;
  const bool os_amx = ((xcr0 >> 17) & 3u) == 3u;
  if (max_leaf >= 1) {
    const cpuid_regs l1 = src.query(1);
    const std::uint32_t base_family = bits(l1.eax, 8, 11), base_model = bits(l1.eax, 4, 7);
    m.stepping = bits(l1.eax, 0, 3);
    m.family = base_family == 0xF ? base_family + bits(l1.eax, 20, 27) : base_family;
    m.model = base_family == 0x6 || base_family == 0xF ? (bits(l1.eax, 16, 19) << 4) + base_model
                                                       : base_model;
    const bool osxsave = (l1.ecx >> 27) & 1u, avx = (l1.ecx >> 28) & 1u;
    m.fma = osxsave && avx && os_avx && ((l1.ecx >> 12) & 1u);
    if (max_leaf >= 7) {
      const cpuid_regs l7 = src.query(7, 0);
      m.avx2 = osxsave && avx && os_avx && ((l7.ebx >> 5) & 1u);
      m.avx512f = m.avx2 && os_avx512 && ((l7.ebx >> 16) & 1u);
      m.avx512bw = m.avx512f && ((l7.ebx >> 30) & 1u);
      if (l7.eax >= 1) m.avx512bf16 = m.avx512bw && ((src.query(7, 1).eax >> 5) & 1u);
      m.amx_bf16 = os_amx && amx_permitted && ((l7.edx >> 22) & 1u) && ((l7.edx >> 24) & 1u);
    }
  }

  const std::uint32_t max_ext = src.query(0x80000000u).eax;
  bool caches = false;
  if (m.vendor == cpu_vendor::amd) {
    if (max_ext >= 0x8000001Du && ((src.query(0x80000001u).ecx >> 22) & 1u))
      caches = detail_model::read_cache_leaf(src, 0x8000001Du, m);
    if (!caches && max_ext >= 0x80000006u) {
      m.l1d = std::size_t(bits(src.query(0x80000005u).ecx, 24, 31)) << 10;
      const cpuid_regs l6 = src.query(0x80000006u);
      m.l2 = std::size_t(bits(l6.ecx, 16, 31)) << 10;
      m.l3 = std::size_t(bits(l6.edx, 18, 31)) << 19;
      caches = m.l1d && m.l2;
    }
  } else if (max_leaf >= 4) {
    caches = detail_model::read_cache_leaf(src, 4, m);
  }
  m.caches_from_cpuid = caches && m.l1d && m.l2 && m.l3;
  if (!m.l1d) m.l1d = cpu_model::fallback_l1d;
  if (!m.l2) m.l2 = cpu_model::fallback_l2;
  if (!m.l3) m.l3 = cpu_model::fallback_l3;
  m.simd_datapath_bits = datapath_bits(m);
  return m;
}

/// The model of the CPU this process runs on, read once (host only).
inline const cpu_model& host_model() {
  static const cpu_model m = read_cpu_model(cpuid_source::live(), amx_bf16_usable());
  return m;
}

} // namespace tessera::cpu
