// conv2d_forward, conv2d_backward_data and conv2d_backward_weight (+ bias) in fp32 against the
// direct double-precision reference (tests/support/reference_conv.hpp) on random shapes, on every
// enabled execution space, with three workspace budgets (conv_passes.hpp): the default (several
// small images per tile: gather / scatter paths), 4 KiB (about one image or a few rows per tile)
// and 1 byte (one output row per tile: the accumulating col2im and beta = 1 paths). The other
// precisions: test_conv2d_lowp.cpp. Tolerances: conv_testing.hpp.
#include "conv_passes.hpp"
#include "support/exec_spaces.hpp"

#include <catch2/catch.hpp>

#include <tuple>
#include <type_traits>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT

TEST_CASE("conv2d fp32: all passes match the reference on random shapes", "[conv][fp32]") {
  random_cases<fp32, fp32, fp32>(1, 150);
}

// Every space that runs on default-memory tensors (each enabled host space in a host build, the
// device space in a device build): 30 random shapes each, beside the 150 above on the default.
TEMPLATE_LIST_TEST_CASE("conv2d fp32 on every enabled execution space matches the reference",
                        "[conv][fp32][spaces]", default_memory_exec_spaces) {
  INFO("execution space " << TestType::name());
  random_cases<fp32, fp32, fp32, TestType>(2, 30);
}

TEST_CASE("conv2d fp32 with 16-64 channels per group (implicit GEMM on the host)",
          "[conv][fp32][implicit]") {
  std::mt19937_64 rng(9);
  for (int i = 0; i < 32; ++i) {
    const auto s = random_wide_shape(rng);
    const std::uint64_t seed = 9000 + static_cast<std::uint64_t>(i);
    check_all_passes<fp32, fp32, fp32>(Kokkos::DefaultExecutionSpace{}, s, seed, budgets[i % 3]);
    if (i % 4 == 0) // a low-precision output from fp32 operands
      check_all_passes<fp32, fp32, bf16>(Kokkos::DefaultExecutionSpace{}, s, seed, budgets[0]);
    // The first host space (Serial where enabled) as well, where it is not the default.
    using first_space = std::tuple_element_t<0, default_memory_exec_spaces>;
    if constexpr (!std::is_same_v<first_space, Kokkos::DefaultExecutionSpace>)
      if (i % 4 == 1) check_all_passes<fp32, fp32, fp32>(first_space{}, s, seed, budgets[0]);
  }
}
