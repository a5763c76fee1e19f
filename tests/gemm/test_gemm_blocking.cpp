// host_packed with each blocking the CPU model may choose (gemm/detail/blocking.hpp), forced
// explicitly, not only the one this machine picks: the fp32 FMA kernel and (where compiled) the
// AVX512_BF16 and AMX kernels, on the random shapes and operand forms of the other gemm tests,
// against the double reference with the bound of tests/support/tolerance.hpp.
// The blockings: those chosen for the three recorded CPUs (tests/config/cpuid_recorded.hpp:
// Zen 4 and Zen 5 share one), the halved KC of a 256 KiB L2, and a tiny one (KC of a few
// elements, one micro-panel per block, B blocks of one panel) that sends every shape through
// many K slices, row blocks and column blocks.
// Built twice: test_gemm_blocking, and test_gemm_amx_emulated (TESSERA_GEMM_AMX_EMULATE: the AMX
// kernel on the software tiles of gemm/detail/amx_emulation.hpp, on a machine without AMX).
#include "gemm_testing.hpp"

#include <tessera/gemm/detail/host.hpp>

#include <algorithm>
#include <random>
#include <vector>

using namespace tessera;
using namespace tessera::testing;
namespace hg = tessera::detail::hostgemm;

namespace {

constexpr std::size_t mib = std::size_t(1) << 20;

/// The blockings every kernel is run with (see the file comment).
template <class Kern>
std::vector<std::pair<std::string, hg::blocking>> blockings_of() {
  const hg::kernel_shape s = Kern::shape;
  return {
      {"1 MiB L2 (Zen 4, Zen 5)", hg::choose_blocking(s, 1 * mib, 32 * mib)},
      {"2 MiB L2 (Sapphire Rapids)", hg::choose_blocking(s, 2 * mib, 105 * mib)},
      {"256 KiB L2", hg::choose_blocking(s, mib / 4, 8 * mib)},
      {"tiny", hg::blocking{Kern::k_align * 3, Kern::MR, Kern::NR, 1}},
  };
}

/// A gemm_config-like runner: host_packed's driver with kernel Kern and one blocking.
template <class Kern>
struct blocked_runner {
  static inline std::string label;
  static inline hg::blocking bk{};
  static std::string name() { return label; }
  template <class A, class B, class C>
  static float run(const A& a, const B& b, const C& c, const gemm_options& opts) {
    detail::gemm_problem<A, B, C, detail::op_pack<>, false> pr{a, b, c};
    pr.m = a.extent(0);
    pr.k = a.extent(1);
    pr.n = b.extent(1);
    pr.alpha = opts.alpha;
    pr.beta = opts.beta;
    if (pr.m == 0 || pr.n == 0) return 0.f;
    return hg::run_parallel<Kern>(Kokkos::DefaultHostExecutionSpace{}, pr, bk);
  }
};

/// Random shapes (issue 3's sizes, K up to 1000 so that the Zen blockings see 2 K slices) and
/// forms, precisions PA x PB -> PC, through kernel Kern with each blocking.
template <class Kern, class PA, class PB, class PC>
void random_cases(std::uint64_t seed, int cases) {
  for (const auto& [label, bk] : blockings_of<Kern>()) {
    blocked_runner<Kern>::label = std::string(Kern::name) + " blocking " + label + " (KC " +
                                  std::to_string(bk.kc) + ", MC " + std::to_string(bk.mc) + ")";
    blocked_runner<Kern>::bk = bk;
    std::mt19937_64 rng(seed);
    for (int i = 0; i < cases; ++i) {
      const index_t m = random_size(rng, 300), n = random_size(rng, 300),
                    k = random_size(rng, 1001);
      const bool ta = rng() & 1, tb = rng() & 1, tc = rng() & 1;
      const float beta = (rng() & 1) ? 0.f : 0.5f;
      check_gemm_case<blocked_runner<Kern>, PA, PB, PC>(m, n, k, random_form(rng, ta),
                                                        random_form(rng, tb), random_form(rng, tc),
                                                        1.25f, beta, seed + 100 * i);
    }
    // Block edges: one past MC, NR and KC of this blocking.
    check_gemm_case<blocked_runner<Kern>, PA, PB, PC>(bk.mc + 1, Kern::NR + 1, bk.kc + 1,
                                                      {false, 0, 0}, {false, 0, 0}, {false, 0, 0},
                                                      1.f, 1.f, seed + 7);
  }
}

} // namespace

#if TESSERA_GEMM_AMX
// Real AMX where the build targets it; else (test_gemm_amx_emulated, TESSERA_GEMM_AMX_EMULATE)
// the same kernel code on the software tiles of gemm/detail/amx_emulation.hpp.
#if defined(TESSERA_GEMM_AMX_EMULATE)
#define TESSERA_TEST_AMX_NAME "host_packed AMX kernel on software tiles: every blocking"
#else
#define TESSERA_TEST_AMX_NAME "host_packed AMX kernel: every blocking the model may choose"
#endif
TEST_CASE(TESSERA_TEST_AMX_NAME, "[gemm][bf16][amx]") {
  if (!TESSERA_GEMM_AMX_EMULATED && !cpu::amx_bf16_usable()) {
    WARN("AMX compiled but not usable on this CPU / OS: kernel not run");
    return;
  }
  random_cases<hg::amx_kernel, bf16, bf16, fp32>(0xb10c0004, 8);
  random_cases<hg::amx_kernel, fp8_e5m2, fp8_e4m3, bf16>(0xb10c0005, 4);
}
#endif

// test_gemm_amx_emulated runs only the AMX case above (on an AMX machine the real tiles; its
// test names differ from test_gemm_blocking's, which CTest needs unique).
#if !defined(TESSERA_GEMM_AMX_EMULATE)

TEST_CASE("host_packed fp32 FMA kernel: every blocking the model may choose", "[gemm][fp32]") {
  if constexpr (hg::have_simd) {
    random_cases<hg::fma_kernel, fp32, fp32, fp32>(0xb10c0001, 10);
  } else {
    WARN("no SIMD: host_packed runs gemm_direct, no blocking to test");
  }
}

#if TESSERA_GEMM_AVX512BF16
TEST_CASE("host_packed AVX512_BF16 kernel: every blocking the model may choose", "[gemm][bf16]") {
  if (!cpu::has_avx512bf16()) {
    WARN("this CPU has no AVX512_BF16: kernel not run");
    return;
  }
  random_cases<hg::dpbf16_kernel, bf16, bf16, fp32>(0xb10c0002, 8);
  random_cases<hg::dpbf16_kernel, fp8_e4m3, bf16, bf16>(0xb10c0003, 4);
}
#endif

TEST_CASE("host_packed: a blocking that does not fit the kernel is refused", "[gemm]") {
  if constexpr (hg::have_simd) {
    using K = hg::fma_kernel;
    for (const hg::blocking bad :
         {hg::blocking{K::KC * 2, K::MR, K::NR, mib}, hg::blocking{K::KC, K::MR + 1, K::NR, mib},
          hg::blocking{K::KC, K::MC + K::MR, K::NR, mib},
          hg::blocking{K::KC, K::MR, K::NC_max + K::NR, mib}})
      CHECK_THROWS_AS(hg::check_blocking<K>(bad), value_error);
    CHECK_NOTHROW(hg::check_blocking<K>(hg::host_blocking<K>()));
  }
}

TEST_CASE("host_packed: the compiled AVX-512 kernels have the shapes the model tests expect",
          "[gemm]") {
  // tests/config/test_cpu_model.cpp checks the choices for kernel shapes written out there.
  if constexpr (hg::have_simd && hg::fma_kernel::L == 16) {
    constexpr hg::kernel_shape s = hg::fma_kernel::shape;
    CHECK((s.mr == 14 && s.kc == 512 && s.k_align == 1 && s.max_panels == 24 &&
           s.panels_at_1mib == 12));
  }
#if TESSERA_GEMM_AVX512BF16
  constexpr hg::kernel_shape s = hg::dpbf16_kernel::shape;
  CHECK((s.mr == 14 && s.kc == 1024 && s.k_align == 2 && s.max_panels == 16 &&
         s.panels_at_1mib == 8));
#endif
}

TEST_CASE("host_packed: a product is shared out only in parts of at least 64^3 multiply-adds, "
          "at most one per thread and per micro-tile",
          "[gemm]") {
  constexpr index_t unit = hg::min_part_macs; // 64^3
  CHECK(unit == 64 * 64 * 64);
  CHECK(hg::parts_for(2, 64, 64, 64, 14, 32) == 1);  // 0.51x on 2 threads (see host.hpp)
  CHECK(hg::parts_for(2, 64, 64, 127, 14, 32) == 1); // just under two parts' work
  CHECK(hg::parts_for(2, 64, 64, 128, 14, 32) == 2); // two parts of 64^3
  CHECK(hg::parts_for(2, 128, 128, 128, 14, 32) == 2);
  CHECK(hg::parts_for(8, 128, 128, 128, 14, 32) == 8);
  CHECK(hg::parts_for(2, 300, 300, 0, 14, 32) == 1);    // K == 0: C = beta C, one pass
  CHECK(hg::parts_for(4, 14, 32, 100000, 14, 32) == 1); // one micro-tile
  CHECK(hg::parts_for(1, 4096, 4096, 4096, 14, 32) == 1);
  // No overflow of m n k (about 2^93 here) and never more parts than threads or tiles.
  CHECK(hg::parts_for(64, index_t(1) << 31, index_t(1) << 31, index_t(1) << 31, 14, 32) == 64);
  std::mt19937_64 rng(0x9a27);
  for (int i = 0; i < 2000; ++i) {
    const index_t t = 1 + static_cast<index_t>(rng() % 16),
                  m = 1 + static_cast<index_t>(rng() % 400),
                  n = 1 + static_cast<index_t>(rng() % 400), k = static_cast<index_t>(rng() % 400);
    const index_t p = hg::parts_for(t, m, n, k, 14, 32);
    const index_t tiles = (m + 13) / 14 * ((n + 31) / 32);
    INFO("threads " << t << " m " << m << " n " << n << " k " << k << " parts " << p);
    REQUIRE(p >= 1);
    REQUIRE(p <= std::min(t, tiles));
    REQUIRE((p == 1 || p * unit <= m * n * k)); // every part has its 64^3
    // and as many as that allows: one more would break a bound
    REQUIRE((p == t || p == tiles || (p + 1) * unit > m * n * k));
  }
}

#endif // !TESSERA_GEMM_AMX_EMULATE
