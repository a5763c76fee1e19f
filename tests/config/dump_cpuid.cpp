// Prints the CPUID leaves config/cpu_model.hpp reads, and XCR0, as a C++ table that
// tests/config/cpuid_recorded.hpp takes as it is (cpu::cpuid_record initialisers), followed by
// the model read from them. Not a test: run it on a machine to record it.
#include <tessera/config/cpu_model.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  using namespace tessera::cpu;
  const cpuid_source live = cpuid_source::live();
  std::vector<cpuid_record> rec;
  const auto add = [&](std::uint32_t leaf, std::uint32_t sub) {
    rec.push_back({leaf, sub, live.query(leaf, sub)});
    return rec.back().r;
  };
  const std::uint32_t max_leaf = add(0, 0).eax;
  if (max_leaf >= 1) add(1, 0);
  if (max_leaf >= 4)
    for (std::uint32_t s = 0; s < 16; ++s)
      if ((add(4, s).eax & 31u) == 0) break;
  if (max_leaf >= 7 && add(7, 0).eax >= 1) add(7, 1);
  const std::uint32_t max_ext = add(0x80000000u, 0).eax;
  if (max_ext >= 0x80000001u) add(0x80000001u, 0);
  if (max_ext >= 0x80000005u) add(0x80000005u, 0);
  if (max_ext >= 0x80000006u) add(0x80000006u, 0);
  if (max_ext >= 0x8000001Du)
    for (std::uint32_t s = 0; s < 16; ++s)
      if ((add(0x8000001Du, s).eax & 31u) == 0) break;
  std::printf("// xcr0 = 0x%llx\n", static_cast<unsigned long long>(live.xcr0()));
  for (const auto& e : rec)
    std::printf("{0x%08x, %u, {0x%08x, 0x%08x, 0x%08x, 0x%08x}},\n", e.leaf, e.subleaf, e.r.eax,
                e.r.ebx, e.r.ecx, e.r.edx);
  const cpu_model& m = host_model();
  std::printf("// vendor %d family 0x%x model 0x%x stepping %u; fma %d avx2 %d avx512f %d "
              "avx512bw %d avx512bf16 %d amx_bf16 %d; L1d %zu L2 %zu L3 %zu (shared by %u) "
              "from cpuid %d; datapath %u\n",
              static_cast<int>(m.vendor), m.family, m.model, m.stepping, m.fma, m.avx2, m.avx512f,
              m.avx512bw, m.avx512bf16, m.amx_bf16, m.l1d, m.l2, m.l3, m.l3_sharing,
              m.caches_from_cpuid, m.simd_datapath_bits);
}
