// config/cpu_model.hpp read from recorded CPUID tables (tests/config/cpuid_recorded.hpp: Zen 4
// recorded on the development machine, Zen 5 and Sapphire Rapids reconstructed from the vendors'
// documentation), and the GEMM blocking gemm/detail/blocking.hpp chooses for each: the numbers
// documented beside the kernels and in blocking.hpp. Also: the fallbacks (no cache leaves, AMD's
// legacy leaves, an OS that does not save ZMM or tile state) and the live model against the
// compiler's own CPU detection.
#include "cpuid_recorded.hpp"

#include <tessera/config/cpu_model.hpp>
#include <tessera/gemm/detail/amx.hpp>
#include <tessera/gemm/detail/blocking.hpp>

#include <catch2/catch.hpp>

using namespace tessera;
namespace hg = tessera::detail::hostgemm;
namespace rec = tessera::testing::recorded;

namespace {

constexpr std::size_t kib = 1024, mib = kib * kib;

// The AVX-512 kernels' shapes as gemm/detail/fma.hpp, avx512bf16.hpp and amx.hpp declare them
// (written out so that the expectations below do not follow an accidental change there; the
// last test case checks the compiled kernels against them).
constexpr hg::kernel_shape fp32_avx512{14, 512, 1, 24, 12};
constexpr hg::kernel_shape bf16_avx512{14, 1024, 2, 16, 8};
// The fp32 kernel compiled for AVX2 (16 vector registers: a 6 x 16 tile).
constexpr hg::kernel_shape fp32_avx2{6, 512, 1, 24, 12};

hg::blocking blk(index_t kc, index_t mc, std::size_t b_bytes = 8 * mib,
                 std::size_t in_place = 1 * mib) {
  return hg::blocking{kc, mc, 1024, b_bytes, in_place};
}

} // namespace

TEST_CASE("cpu model: Zen 4 (recorded)", "[config]") {
  const cpu::cpu_model m = cpu::read_cpu_model(rec::zen4());
  CHECK(m.vendor == cpu::cpu_vendor::amd);
  CHECK(m.family == 0x19);
  CHECK(m.model == 0x11);
  CHECK(m.stepping == 1);
  CHECK((m.fma && m.avx2 && m.avx512f && m.avx512bw && m.avx512bf16));
  CHECK_FALSE(m.amx_bf16);
  CHECK(m.caches_from_cpuid);
  CHECK(m.l1d == 32 * kib);
  CHECK(m.l2 == 1 * mib);
  CHECK(m.l3 == 32 * mib); // leaf 0x8000001D, not the VM's 20 MiB of leaf 0x80000006
  CHECK(m.l3_sharing == 2);
  CHECK(m.simd_datapath_bits == 256);
  // Blocking: Zen 5's numbers (same 1 MiB L2, see blocking.hpp).
  CHECK(hg::choose_blocking(fp32_avx512, m) == blk(512, 168));
  CHECK(hg::choose_blocking(bf16_avx512, m) == blk(1024, 112));
}

TEST_CASE("cpu model: Zen 3 (recorded, AVX2, no AVX-512)", "[config]") {
  const cpu::cpu_model m = cpu::read_cpu_model(rec::zen3());
  CHECK(m.vendor == cpu::cpu_vendor::amd);
  CHECK(m.family == 0x19);
  CHECK(m.model == 0x01);
  CHECK(m.stepping == 1);
  CHECK((m.fma && m.avx2));
  CHECK_FALSE((m.avx512f || m.avx512bw || m.avx512bf16 || m.amx_bf16));
  CHECK(m.caches_from_cpuid);
  CHECK(m.l1d == 32 * kib);
  CHECK(m.l2 == 512 * kib);
  CHECK(m.l3 == 32 * mib);
  CHECK(m.l3_sharing == 2);
  CHECK(m.simd_datapath_bits == 256); // family 0x19 like Zen 4, but no AVX-512: AVX2's width
  // Half of Zen 4's L2: half the micro-panels per A block (6 of 6 rows at KC 512), and B is
  // read in place only up to 640 KiB (1.25 x L2, blocking.hpp).
  CHECK(hg::choose_blocking(fp32_avx2, m) == blk(512, 36, 8 * mib, 640 * kib));
  // The same CPU with the ZMM state enabled would still have no AVX-512 (CPUID says so).
  CHECK_FALSE(
      cpu::read_cpu_model(cpu::cpuid_source(
                              {
                                  {0x00000000, 0, {0x10, 0x68747541, 0x444d4163, 0x69746e65}},
                                  {0x00000001, 0, {0x00a00f11, 0, 0xfffa3203, 0x178bfbff}},
                                  {0x00000007, 0, {0, 0x219c07ab, 0x0040069c, 0x88000010}},
                              },
                              0xe7))
          .avx512f);
}

TEST_CASE("cpu model: Zen 5 (reconstructed)", "[config]") {
  const cpu::cpu_model m = cpu::read_cpu_model(rec::zen5());
  CHECK(m.vendor == cpu::cpu_vendor::amd);
  CHECK(m.family == 0x1A);
  CHECK(m.model == 0x02);
  CHECK((m.fma && m.avx2 && m.avx512f && m.avx512bw && m.avx512bf16));
  CHECK_FALSE(m.amx_bf16);
  CHECK(m.l1d == 48 * kib);
  CHECK(m.l2 == 1 * mib);
  CHECK(m.l3 == 32 * mib);
  CHECK(m.l3_sharing == 16);
  CHECK(m.simd_datapath_bits == 512);
  // The numbers the kernels were tuned with on Zen 5 (fma.hpp, avx512bf16.hpp).
  CHECK(hg::choose_blocking(fp32_avx512, m) == blk(512, 168));
  CHECK(hg::choose_blocking(bf16_avx512, m) == blk(1024, 112));
}

TEST_CASE("cpu model: Sapphire Rapids (reconstructed)", "[config]") {
  const cpu::cpu_model m = cpu::read_cpu_model(rec::sapphire_rapids());
  CHECK(m.vendor == cpu::cpu_vendor::intel);
  CHECK(m.family == 6);
  CHECK(m.model == 0x8F);
  CHECK(m.stepping == 8);
  CHECK((m.fma && m.avx2 && m.avx512f && m.avx512bw && m.avx512bf16 && m.amx_bf16));
  CHECK(m.l1d == 48 * kib);
  CHECK(m.l2 == 2 * mib);
  CHECK(m.l3 == 105 * mib);
  CHECK(m.l3_sharing == 128);
  CHECK(m.l3 / 56 == 1920 * kib); // 1.875 MiB per core slice on the 56-core part
  CHECK(m.simd_datapath_bits == 512);
  CHECK(hg::choose_blocking(fp32_avx512, m) == blk(512, 336));
  CHECK(hg::choose_blocking(bf16_avx512, m) == blk(1024, 224));
  CHECK(hg::choose_blocking(hg::amx_shape, m) == blk(512, 256));
  // Without the OS's tile state (XCR0 bits 17, 18) or Linux's permission: no AMX.
  auto t = rec::sapphire_rapids();
  CHECK_FALSE(cpu::read_cpu_model(cpu::cpuid_source(
                                      {
                                          {0, 0, t.query(0)},
                                          {1, 0, t.query(1)},
                                          {7, 0, t.query(7, 0)},
                                          {7, 1, t.query(7, 1)},
                                      },
                                      0x2e7))
                  .amx_bf16);
  CHECK_FALSE(cpu::read_cpu_model(rec::sapphire_rapids(), false).amx_bf16);
}

TEST_CASE("cpu model: Emerald Rapids (recorded)", "[config]") {
  const cpu::cpu_model m = cpu::read_cpu_model(rec::emerald_rapids());
  CHECK(m.vendor == cpu::cpu_vendor::intel);
  CHECK(m.family == 6);
  CHECK(m.model == 0xCF);
  CHECK(m.stepping == 2);
  CHECK((m.fma && m.avx2 && m.avx512f && m.avx512bw && m.avx512bf16 && m.amx_bf16));
  CHECK(m.l1d == 48 * kib);
  CHECK(m.l2 == 2 * mib);
  CHECK(m.l3 == 300 * mib);
  CHECK(m.l3_sharing == 2);
  CHECK(m.simd_datapath_bits == 512);
  // The Sapphire Rapids choices (same core caches); the B block stays at its 8 MiB cap. The
  // AMX blocking was measured here (docs/performance.md): KC 512 and MC 256 within the noise of
  // the best of KC 128 / 256 / 512 x MC 64 .. 512 at n = 512 .. 2048.
  CHECK(hg::choose_blocking(fp32_avx512, m) == blk(512, 336));
  CHECK(hg::choose_blocking(bf16_avx512, m) == blk(1024, 224));
  CHECK(hg::choose_blocking(hg::amx_shape, m) == blk(512, 256));
  CHECK_FALSE(cpu::read_cpu_model(rec::emerald_rapids(), false).amx_bf16);
}

TEST_CASE("cpu model: fallbacks", "[config]") {
  SECTION("no cache leaves: fallback sizes, not from CPUID") {
    const cpu::cpu_model m = cpu::read_cpu_model(cpu::cpuid_source({}, 0));
    CHECK(m.vendor == cpu::cpu_vendor::other);
    CHECK_FALSE(m.caches_from_cpuid);
    CHECK(m.l1d == cpu::cpu_model::fallback_l1d);
    CHECK(m.l2 == cpu::cpu_model::fallback_l2);
    CHECK(m.l3 == cpu::cpu_model::fallback_l3);
    CHECK_FALSE(m.avx512f);
    CHECK(m.simd_datapath_bits == 128);
  }
  SECTION("AMD without TOPOEXT: legacy leaves 0x80000005 / 0x80000006") {
    const auto z = rec::zen5();
    const cpu::cpu_model m = cpu::read_cpu_model(cpu::cpuid_source(
        {
            {0, 0, z.query(0)},
            {1, 0, z.query(1)},
            {7, 0, z.query(7, 0)},
            {0x80000000u, 0, {0x80000006u, 0, 0, 0}},
            {0x80000005u, 0, z.query(0x80000005u)},
            {0x80000006u, 0, z.query(0x80000006u)},
        },
        0x2e7));
    CHECK(m.l1d == 48 * kib);
    CHECK(m.l2 == 1 * mib);
    CHECK(m.l3 == 32 * mib);
    CHECK(m.caches_from_cpuid);
  }
  SECTION("an OS that does not save ZMM state: no AVX-512, datapath 256") {
    const cpu::cpu_model m =
        cpu::read_cpu_model(cpu::cpuid_source({{0, 0, rec::zen5().query(0)},
                                               {1, 0, rec::zen5().query(1)},
                                               {7, 0, rec::zen5().query(7, 0)},
                                               {7, 1, rec::zen5().query(7, 1)}},
                                              0x7));
    CHECK(m.avx2);
    CHECK_FALSE(m.avx512f);
    CHECK_FALSE(m.avx512bf16);
    CHECK(m.simd_datapath_bits == 256);
  }
  SECTION("small L2 halves KC; small L3 shrinks the B block") {
    // (and B is read in place only up to 1.25 x L2)
    CHECK(hg::choose_blocking(fp32_avx512, 256 * kib, 8 * mib) == blk(256, 84, 2 * mib, 320 * kib));
    CHECK(hg::choose_blocking(fp32_avx512, 512 * kib, 32 * mib) ==
          blk(512, 84, 8 * mib, 640 * kib));
    CHECK(hg::choose_blocking(bf16_avx512, 512 * kib, 32 * mib) ==
          blk(1024, 56, 8 * mib, 640 * kib));
    CHECK(hg::choose_blocking(fp32_avx512, 2 * mib, 32 * mib).in_place_b_bytes == 1 * mib);
  }
}

TEST_CASE("cpu model: the live CPU agrees with the compiler's detection", "[config]") {
  const cpu::cpu_model& m = cpu::host_model();
  CHECK(&m == &cpu::host_model()); // read once
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  CHECK(m.avx2 == static_cast<bool>(__builtin_cpu_supports("avx2")));
  CHECK(m.fma == static_cast<bool>(__builtin_cpu_supports("fma")));
  CHECK(m.avx512f == static_cast<bool>(__builtin_cpu_supports("avx512f")));
  CHECK(m.avx512bf16 == cpu::has_avx512bf16());
  CHECK(m.amx_bf16 == cpu::amx_bf16_usable());
  CHECK(m.vendor != cpu::cpu_vendor::other);
  CHECK(m.l1d >= 16 * kib);
  CHECK(m.l2 >= m.l1d);
  CHECK(m.l3 >= m.l2);
  INFO("family " << m.family << " model " << m.model << ", L1d " << m.l1d << ", L2 " << m.l2
                 << ", L3 " << m.l3 << ", datapath " << m.simd_datapath_bits);
  CHECK(m.simd_datapath_bits >= 256);
#endif
}
