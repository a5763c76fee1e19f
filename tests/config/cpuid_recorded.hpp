#pragma once
// CPUID tables (leaf, subleaf -> eax, ebx, ecx, edx) and XCR0 of the CPUs tessera is tuned
// for, in the format tests/config/dump_cpuid.cpp prints (the leaves config/cpu_model.hpp reads).
//
// Provenance:
//   zen4: RECORDED on the development machine (AMD EPYC, family 0x19 model 0x11 stepping 1,
//         Genoa, a 2-vCPU KVM guest) with dump_cpuid, 2026-11-24. The guest hides SMT and
//         reports its own topology (L3 shared by 2 logical processors), and leaf 0x80000006's L3
//         field (edx) reads 20 MiB where leaf 0x8000001D reads 32 MiB: a hypervisor artefact,
//         kept as recorded (the model reads 0x8000001D first).
//   zen5: RECONSTRUCTED (no Zen 5 at hand) from AMD's documentation of CPUID (APM vol. 3,
//         appendix E; "Processor Programming Reference for AMD Family 1Ah", leaf 0x8000001D)
//         and the cache sizes of an EPYC 9005 "Turin" core (48 KiB 12-way L1d, 32 KiB 8-way
//         L1i, 1 MiB 16-way L2, 32 MiB 16-way L3 per 8-core CCD shared by 16 threads), family
//         0x1A (base 0xF + extended 0xB) model 0x02 stepping 1. The feature words are the
//         recorded Zen 4's with AVX-VNNI added to leaf 7.1 (Zen 5 has both); XCR0 with PKRU.
//   spr:  RECONSTRUCTED from Intel's SDM vol. 2A (CPUID leaves 1, 4, 7) for a 56-core Xeon
//         Platinum 8480+ (Sapphire Rapids, family 6 model 0x8F stepping 8, signature 0x806F8):
//         48 KiB 12-way L1d, 32 KiB 8-way L1i, 2 MiB 16-way L2 per core, 105 MiB 15-way L3
//         (1.875 MiB per core slice) shared by up to 128 logical processors (the 112 threads,
//         rounded up in CPUID's field); leaf 7.0 edx with AMX-BF16 (22), AVX512_FP16 (23),
//         AMX-TILE (24), AMX-INT8 (25); XCR0 0x602E7 (x87, SSE, AVX, opmask, ZMM, PKRU,
//         XTILECFG, XTILEDATA).
//   emr:  RECORDED on a session machine (Intel Xeon, family 6 model 0xCF stepping 2: Emerald
//         Rapids, 5th generation Xeon Scalable; a 2-vCPU KVM guest) with dump_cpuid, 2026-11-28.
//         The first Intel CPU with AMX that tessera's AMX kernel ran on. The guest reports
//         48 KiB L1d, 2 MiB L2, and a 300 MiB L3 shared by 2 logical processors (its own
//         topology; the host's L3 is not 300 MiB per 2 threads).
//   zen3: RECORDED on a session machine (AMD EPYC, family 0x19 model 0x01 stepping 1: Milan,
//         Zen 3; a 2-vCPU KVM guest) with dump_cpuid, 2026-12-02. AVX2 and FMA, no AVX-512
//         (XCR0 0x207: no opmask or ZMM state), 32 KiB L1d, 512 KiB L2, 32 MiB L3 shared by 2
//         logical processors (the guest's topology). The first CPU without AVX-512 that
//         tessera's suite ran on.
// Reconstructed words other than those the model reads (vendor, signature, the feature bits
// named in config/cpu_model.hpp, cache leaves) are plausible, not copied from a real dump.

#include <tessera/config/cpu_model.hpp>

namespace tessera::testing::recorded {

inline cpu::cpuid_source zen4() {
  return cpu::cpuid_source(
      {
          {0x00000000, 0, {0x0000001c, 0x68747541, 0x444d4163, 0x69746e65}},
          {0x00000001, 0, {0x00a10f11, 0x01020800, 0xfffa3203, 0x178bfbff}},
          {0x00000004, 0, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
          {0x00000007, 0, {0x00000001, 0xf1bf07ab, 0x00405fc6, 0x00000010}},
          {0x00000007, 1, {0x00000020, 0x00000000, 0x00000000, 0x00000000}},
          {0x80000000, 0, {0x80000021, 0x68747541, 0x444d4163, 0x69746e65}},
          {0x80000001, 0, {0x00a10f11, 0x40000000, 0x004003f3, 0x2fd3fbff}},
          {0x80000005, 0, {0xff48ff40, 0xff48ff40, 0x20080140, 0x20080140}},
          {0x80000006, 0, {0x5c002200, 0x6c004200, 0x04006140, 0x0a009140}},
          {0x8000001d, 0, {0x00000121, 0x01c0003f, 0x0000003f, 0x00000000}},
          {0x8000001d, 1, {0x00000122, 0x01c0003f, 0x0000003f, 0x00000000}},
          {0x8000001d, 2, {0x00000143, 0x01c0003f, 0x000007ff, 0x00000002}},
          {0x8000001d, 3, {0x00004163, 0x03c0003f, 0x00007fff, 0x00000001}},
          {0x8000001d, 4, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
      },
      0xe7);
}

inline cpu::cpuid_source zen3() {
  return cpu::cpuid_source(
      {
          {0x00000000, 0, {0x00000010, 0x68747541, 0x444d4163, 0x69746e65}},
          {0x00000001, 0, {0x00a00f11, 0x00020800, 0xfffa3203, 0x178bfbff}},
          {0x00000004, 0, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
          {0x00000007, 0, {0x00000000, 0x219c07ab, 0x0040069c, 0x88000010}},
          {0x80000000, 0, {0x80000022, 0x68747541, 0x444d4163, 0x69746e65}},
          {0x80000001, 0, {0x00a00f11, 0x40000000, 0x004003f3, 0x2fd3fbff}},
          {0x80000005, 0, {0xff40ff40, 0xff40ff40, 0x20080140, 0x20080140}},
          {0x80000006, 0, {0x48002200, 0x68004200, 0x02006140, 0x08009140}},
          {0x8000001d, 0, {0x00000121, 0x01c0003f, 0x0000003f, 0x00000000}},
          {0x8000001d, 1, {0x00000122, 0x01c0003f, 0x0000003f, 0x00000000}},
          {0x8000001d, 2, {0x00000143, 0x01c0003f, 0x000003ff, 0x00000002}},
          {0x8000001d, 3, {0x00004163, 0x03c0003f, 0x00007fff, 0x00000001}},
          {0x8000001d, 4, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
      },
      0x207);
}

inline cpu::cpuid_source zen5() {
  return cpu::cpuid_source(
      {
          {0x00000000, 0, {0x00000010, 0x68747541, 0x444d4163, 0x69746e65}},
          {0x00000001, 0, {0x00b00f21, 0x00200800, 0x7ed8320b, 0x178bfbff}},
          {0x00000007, 0, {0x00000001, 0xf1bf07ab, 0x00405fc6, 0x00000010}},
          {0x00000007, 1, {0x00000030, 0x00000000, 0x00000000, 0x00000000}},
          {0x80000000, 0, {0x80000028, 0x68747541, 0x444d4163, 0x69746e65}},
          {0x80000001, 0, {0x00b00f21, 0x40000000, 0x75c237ff, 0x2fd3fbff}},
          {0x80000005, 0, {0xff48ff40, 0xff48ff40, 0x300c0140, 0x20080140}},
          {0x80000006, 0, {0x5c002200, 0x6c004200, 0x04008140, 0x01009140}},
          {0x8000001d, 0, {0x00004121, 0x02c0003f, 0x0000003f, 0x00000000}},
          {0x8000001d, 1, {0x00004122, 0x01c0003f, 0x0000003f, 0x00000000}},
          {0x8000001d, 2, {0x00004143, 0x03c0003f, 0x000003ff, 0x00000002}},
          {0x8000001d, 3, {0x0003c163, 0x03c0003f, 0x00007fff, 0x00000001}},
          {0x8000001d, 4, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
      },
      0x2e7);
}

inline cpu::cpuid_source sapphire_rapids() {
  return cpu::cpuid_source(
      {
          {0x00000000, 0, {0x00000020, 0x756e6547, 0x6c65746e, 0x49656e69}},
          {0x00000001, 0, {0x000806f8, 0x00800800, 0x7ffefbff, 0xbfebfbff}},
          {0x00000004, 0, {0xfc004121, 0x02c0003f, 0x0000003f, 0x00000000}},
          {0x00000004, 1, {0xfc004122, 0x01c0003f, 0x0000003f, 0x00000000}},
          {0x00000004, 2, {0xfc004143, 0x03c0003f, 0x000007ff, 0x00000000}},
          {0x00000004, 3, {0xfc1fc163, 0x0380003f, 0x0001bfff, 0x00000004}},
          {0x00000004, 4, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
          {0x00000007, 0, {0x00000002, 0xf3bffbfb, 0x1bc1fffe, 0xffddc51c}},
          {0x00000007, 1, {0x00000030, 0x00000000, 0x00000000, 0x00000000}},
          {0x80000000, 0, {0x80000008, 0x00000000, 0x00000000, 0x00000000}},
          {0x80000001, 0, {0x00000000, 0x00000000, 0x00000121, 0x2c100800}},
          {0x80000006, 0, {0x00000000, 0x00000000, 0x08007040, 0x00000000}},
      },
      0x602e7);
}

inline cpu::cpuid_source emerald_rapids() {
  return cpu::cpuid_source(
      {
          {0x00000000, 0, {0x00000020, 0x756e6547, 0x6c65746e, 0x49656e69}},
          {0x00000001, 0, {0x000c06f2, 0x01020800, 0xfffa3203, 0x1f8bfbff}},
          {0x00000004, 0, {0x04000121, 0x02c0003f, 0x0000003f, 0x00000000}},
          {0x00000004, 1, {0x04000122, 0x01c0003f, 0x0000003f, 0x00000000}},
          {0x00000004, 2, {0x04000143, 0x03c0003f, 0x000007ff, 0x00000000}},
          {0x00000004, 3, {0x04004163, 0x04c0003f, 0x0003bfff, 0x00000004}},
          {0x00000004, 4, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
          {0x00000007, 0, {0x00000002, 0xf1bf27eb, 0x1b415fde, 0xbfd14410}},
          {0x00000007, 1, {0x00001c30, 0x00000000, 0x00000000, 0x00000000}},
          {0x80000000, 0, {0x80000008, 0x00000000, 0x00000000, 0x00000000}},
          {0x80000001, 0, {0x00000000, 0x00000000, 0x00000121, 0x2c100800}},
          {0x80000005, 0, {0x00000000, 0x00000000, 0x00000000, 0x00000000}},
          {0x80000006, 0, {0x00000000, 0x00000000, 0x08007040, 0x00000000}},
      },
      0x602e7);
}

} // namespace tessera::testing::recorded
