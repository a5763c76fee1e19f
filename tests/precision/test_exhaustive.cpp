// Exhaustive conversion checks, tagged [exhaustive] (CTest label `exhaustive`):
//  - every one of the 2^32 float bit patterns encodes to bf16, fp16, e4m3 and e5m2 under both
//  overflow
//    policies as the independent reference in reference_rounding.hpp says (scalar from_float),
//    and the vector convert_n gives the scalar's bits exactly (NaN codes included);
//  - every bf16 pattern -> e4m3 / e5m2 and every fp8 code -> fp32 / bf16: vector == scalar;
//  - every fp16 code: its value against the format's formula, the round trip through float,
//    and vector == scalar to and from every other format.
// The 2^32 sweep runs in parallel over chunks of patterns with Kokkos::parallel_reduce; a
// failure lists the first mismatching patterns in hex.
#include "reference_rounding.hpp"

#include <tessera/precision.hpp>
#include <tessera/precision/vector_convert.hpp> // convert_n

#include <Kokkos_Core.hpp>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

namespace {

using tessera::overflow_to_inf_nan;
using tessera::saturate;
using tessera_test::format_spec;

// 2^12 patterns per chunk: a chunk's buffers (16 KiB of floats and their codes) stay in L1/L2
// and below malloc's mmap threshold, so they are recycled instead of page-faulted in afresh.
constexpr std::uint64_t chunk_bits = 12;
constexpr std::uint64_t chunk = std::uint64_t{1} << chunk_bits;
constexpr std::uint64_t n_chunks = (std::uint64_t{1} << 32) / chunk;
constexpr std::uint64_t no_mismatch = std::numeric_limits<std::uint64_t>::max();

enum mismatch_kind : std::uint64_t {
  scalar_saturate_vs_reference = 1,
  scalar_inf_nan_vs_reference,
  vector_saturate_vs_scalar,
  vector_inf_nan_vs_scalar,
};
constexpr const char* kind_name[] = {
    "", "scalar<saturate> != reference", "scalar<overflow_to_inf_nan> != reference",
    "vector<saturate> != scalar", "vector<overflow_to_inf_nan> != scalar"};

template <class S>
std::uint32_t code_of(S s) {
  return s.bits;
}

// Runs check(c, first_mismatch_in_chunk) -> mismatch count over all chunks in parallel and
// fails the test with the first few mismatching patterns (the first one of each failing chunk).
template <class Check>
void sweep_all_chunks(const char* what, Check check) {
  std::vector<std::uint64_t> first(n_chunks, no_mismatch); // per chunk: pattern | kind << 32
  std::uint64_t* first_ptr = first.data();
  std::uint64_t bad = 0;
  // Host-only by design: every bit pattern of the scalar conversions, checked on the host.
  Kokkos::parallel_reduce(
      what,
      Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::Schedule<Kokkos::Dynamic>>(
          0, n_chunks),
      [=](const std::uint64_t c, std::uint64_t& count) { count += check(c, first_ptr[c]); }, bad);
  std::ostringstream msg;
  int listed = 0;
  for (std::uint64_t c = 0; c < n_chunks && listed < 8; ++c) {
    if (first[c] == no_mismatch) continue;
    msg << "  0x" << std::hex << (first[c] & 0xffffffffu) << std::dec << ": "
        << kind_name[first[c] >> 32] << "\n";
    ++listed;
  }
  INFO(what << ": " << bad << " mismatches; first ones (float bit patterns):\n" << msg.str());
  CHECK(bad == 0);
}

// All float patterns -> precision To: scalar vs reference and vector vs scalar, both policies.
template <class To>
void check_all_floats(const format_spec& spec, const char* what) {
  using S = tessera::storage_t<To>;
  const tessera_test::value_table table(spec);
  const tessera_test::value_table* table_ptr = &table;
  sweep_all_chunks(what, [=](std::uint64_t c, std::uint64_t& first) -> std::uint64_t {
    std::vector<std::uint32_t> bits(chunk);
    std::vector<float> in(chunk);
    std::vector<S> vec_sat(chunk), vec_inf(chunk), sc_sat(chunk), sc_inf(chunk);
    const std::uint32_t p0 = static_cast<std::uint32_t>(c << chunk_bits);
    for (std::uint64_t i = 0; i < chunk; ++i) bits[i] = p0 + static_cast<std::uint32_t>(i);
    std::memcpy(in.data(), bits.data(), chunk * sizeof(float));
    tessera::convert_n<To, saturate>(in.data(), vec_sat.data(), chunk);
    tessera::convert_n<To, overflow_to_inf_nan>(in.data(), vec_inf.data(), chunk);
    // Separate tight loops for the scalar conversions: the compiler may vectorise them.
    for (std::uint64_t i = 0; i < chunk; ++i) sc_sat[i] = S::template from_float<saturate>(in[i]);
    for (std::uint64_t i = 0; i < chunk; ++i)
      sc_inf[i] = S::template from_float<overflow_to_inf_nan>(in[i]);
    // A chunk holds one sign and increasing magnitudes, as the sweep needs.
    tessera_test::sweep_rounder rounder(*table_ptr);
    std::uint64_t count = 0;
    auto note = [&](std::uint32_t pattern, mismatch_kind kind) {
      if (count++ == 0) first = pattern | (static_cast<std::uint64_t>(kind) << 32);
    };
    for (std::uint64_t i = 0; i < chunk; ++i) {
      const auto ref = tessera_test::reference_round(rounder, spec, bits[i]);
      const std::uint32_t sat = code_of(sc_sat[i]), inf = code_of(sc_inf[i]);
      if (!tessera_test::reference_accepts<saturate>(spec, ref, sat))
        note(bits[i], scalar_saturate_vs_reference);
      if (!tessera_test::reference_accepts<overflow_to_inf_nan>(spec, ref, inf))
        note(bits[i], scalar_inf_nan_vs_reference);
      if (code_of(vec_sat[i]) != sat) note(bits[i], vector_saturate_vs_scalar);
      if (code_of(vec_inf[i]) != inf) note(bits[i], vector_inf_nan_vs_scalar);
    }
    return count;
  });
}

// All n codes of storage type From -> precision To under Policy: vector == scalar, bitwise.
template <class To, class Policy, class From>
void check_all_codes_vector(std::uint32_t n) {
  using S = tessera::storage_t<To>;
  std::vector<From> in(n);
  for (std::uint32_t i = 0; i < n; ++i)
    in[i] = From::from_bits(static_cast<decltype(in[i].bits)>(i));
  std::vector<S> vec(n);
  tessera::convert_n<To, Policy>(in.data(), vec.data(), n);
  std::uint32_t bad = 0, first = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const S s = tessera::convert<To, Policy>(in[i]);
    if (std::memcmp(&s, &vec[i], sizeof s) != 0 && bad++ == 0) first = i;
  }
  INFO(tessera::precision_traits<To>::name << " from code 0x" << std::hex << first << std::dec
                                           << ": " << bad << " vector != scalar");
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("all 2^32 floats -> bf16: reference, scalar and vector agree", "[exhaustive][bf16]") {
  check_all_floats<tessera::bf16>(tessera_test::bf16_spec, "fp32 -> bf16");
}

TEST_CASE("all 2^32 floats -> e4m3: reference, scalar and vector agree", "[exhaustive][fp8_e4m3]") {
  check_all_floats<tessera::fp8_e4m3>(tessera_test::e4m3_spec, "fp32 -> e4m3");
}

TEST_CASE("all 2^32 floats -> e5m2: reference, scalar and vector agree", "[exhaustive][fp8_e5m2]") {
  check_all_floats<tessera::fp8_e5m2>(tessera_test::e5m2_spec, "fp32 -> e5m2");
}

TEST_CASE("all 2^32 floats -> fp16: reference, scalar and vector agree", "[exhaustive][fp16]") {
  check_all_floats<tessera::fp16>(tessera_test::fp16_spec, "fp32 -> fp16");
}

TEST_CASE("all 65536 fp16 codes: exact value, round trip, vector == scalar", "[exhaustive][fp16]") {
  using namespace tessera;
  const auto& spec = tessera_test::fp16_spec;
  std::uint32_t bad_value = 0, bad_trip = 0, first_value = 0, first_trip = 0;
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const float16 h = float16::from_bits(static_cast<std::uint16_t>(c));
    const float f = h.to_float();
    const std::uint32_t mag = c & 0x7fffu;
    // The value by the format's formula (reference_rounding.hpp), in double.
    bool ok;
    if (spec.is_nan(c)) {
      ok = std::isnan(f) && std::signbit(f) == (c >> 15 != 0);
    } else if (mag == 0x7c00u) {
      ok = std::isinf(f) && std::signbit(f) == (c >> 15 != 0);
    } else {
      const double v = (c >> 15 ? -1.0 : 1.0) * spec.value(mag);
      ok = static_cast<double>(f) == v && std::signbit(f) == (c >> 15 != 0);
    }
    if (!ok && bad_value++ == 0) first_value = c;
    // Back to fp16: the same code, except that a NaN comes back quiet (bit 9 set).
    const std::uint32_t expect = spec.is_nan(c) ? (c | 0x0200u) : c;
    if ((float16::from_float<overflow_to_inf_nan>(f).bits != expect ||
         float16::from_float<saturate>(f).bits !=
             (mag == 0x7c00u ? ((c & 0x8000u) | 0x7bffu) : expect)) &&
        bad_trip++ == 0)
      first_trip = c;
  }
  INFO("value: " << bad_value << " bad, first 0x" << std::hex << first_value << "; round trip: "
                 << std::dec << bad_trip << " bad, first 0x" << std::hex << first_trip);
  CHECK(bad_value == 0);
  CHECK(bad_trip == 0);
  check_all_codes_vector<fp32, overflow_to_inf_nan, float16>(65536);
  check_all_codes_vector<bf16, overflow_to_inf_nan, float16>(65536);
  check_all_codes_vector<bf16, saturate, float16>(65536);
  check_all_codes_vector<fp16, overflow_to_inf_nan, float16>(65536);
  check_all_codes_vector<fp8_e4m3, saturate, float16>(65536);
  check_all_codes_vector<fp8_e5m2, saturate, float16>(65536);
  check_all_codes_vector<fp8_e5m2, overflow_to_inf_nan, float16>(65536);
  check_all_codes_vector<fp16, overflow_to_inf_nan, bfloat16>(65536);
  check_all_codes_vector<fp16, saturate, bfloat16>(65536);
  check_all_codes_vector<fp16, overflow_to_inf_nan, float8_e4m3>(256);
  check_all_codes_vector<fp16, overflow_to_inf_nan, float8_e5m2>(256);
}

TEST_CASE("all bf16 and fp8 codes: vector == scalar for every target", "[exhaustive][fp8]") {
  using namespace tessera;
  check_all_codes_vector<fp8_e4m3, saturate, bfloat16>(65536);
  check_all_codes_vector<fp8_e4m3, overflow_to_inf_nan, bfloat16>(65536);
  check_all_codes_vector<fp8_e5m2, saturate, bfloat16>(65536);
  check_all_codes_vector<fp8_e5m2, overflow_to_inf_nan, bfloat16>(65536);
  check_all_codes_vector<fp32, overflow_to_inf_nan, bfloat16>(65536);
  check_all_codes_vector<bf16, overflow_to_inf_nan, bfloat16>(65536);
  check_all_codes_vector<fp32, overflow_to_inf_nan, float8_e4m3>(256);
  check_all_codes_vector<fp32, overflow_to_inf_nan, float8_e5m2>(256);
  check_all_codes_vector<bf16, overflow_to_inf_nan, float8_e4m3>(256);
  check_all_codes_vector<bf16, saturate, float8_e4m3>(256);
  check_all_codes_vector<bf16, overflow_to_inf_nan, float8_e5m2>(256);
  check_all_codes_vector<bf16, saturate, float8_e5m2>(256);
  check_all_codes_vector<fp8_e5m2, saturate, float8_e4m3>(256);
  check_all_codes_vector<fp8_e4m3, saturate, float8_e5m2>(256);
  check_all_codes_vector<fp8_e4m3, overflow_to_inf_nan, float8_e5m2>(256);
}
