// Fuzz target: tessera's checkpoint loader (train/detail/checkpoint_format.hpp's parser and
// train/checkpoint.hpp's load_checkpoint).
//
// Input: one mode byte, then the file. Mode bit 0 set: before anything else the target rewrites
// the record and file checksums (FNV-1a 64) wherever the file's structure puts them, so that
// mutations reach the checks behind the checksums (types, shapes, values); clear: the bytes are
// used as they are (checksums, truncation, corruption).
//
// Properties:
// 1. The parser accepts or throws tessera::value_error (nothing else, no out-of-bounds access).
// 2. What it accepts is canonical: serialising the parsed records gives back the same bytes.
// 3. load_checkpoint into a fixed training state (2 parameters, AdamW after one step, a dynamic
//    scaler with a hysteresis policy, a delayed- and a current-scaling fp8 state) either throws a
//    tessera::error and leaves the state as it was (saving it gives the same bytes as before),
//    or succeeds, and then saving the state gives exactly the records of the file (any order).
//
// TESSERA_FUZZ_VERBOSE=1: print how far each input got (refused by the parser or by the load,
// with the message, or loaded).
// TESSERA_FUZZ_WRITE_SEED=<path>: the program writes that state's checkpoint to <path> (the
// seed corpus's valid checkpoint, tests/fuzz/corpus/checkpoint/) and exits.
#include "fuzz_kokkos.hpp"
#include "fuzz_support.hpp"

#include <tessera/tensor.hpp>
#include <tessera/train.hpp>
#include <tessera/train/checkpoint.hpp>

#include <Kokkos_Core.hpp>
#include <boost/hana/tuple.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

namespace {

namespace ckpt = tessera::train::detail::ckpt;
namespace train = tessera::train;
using tessera::extents;

/// The training state the loader restores into, always built the same way.
struct state {
  tessera::nn::parameter<extents<4, 3>> w{"fz.weight", {}};
  tessera::nn::parameter<extents<4>> b{"fz.bias", {}};
  train::adamw opt{.lr = 0.05f};
  train::dynamic_scaler<train::hysteresis_policy<2>> scaler{{.growth_interval = 5}};
  train::fp8_meta<train::delayed_scaling> w_meta{{.history_len = 4}};
  train::fp8_meta<train::current_scaling> g_meta{{.margin = 1}};
  train::run_state run{.step = 3, .epoch = 1, .data_seed = 12345, .precision = "fp32"};

  auto parameters() const { return boost::hana::make_tuple(w, b); }

  state() {
    tessera::fill_uniform(w.value, 1, -0.5f, 0.5f);
    tessera::fill_uniform(b.value, 2, -0.5f, 0.5f);
    tessera::fill_uniform(w.grad, 3, -1.f, 1.f);
    tessera::fill_uniform(b.grad, 4, -1.f, 1.f);
    opt.step(Kokkos::DefaultExecutionSpace{}, parameters()); // AdamW slots, default memory
    w_meta.record(0.75f);
    w_meta.record(1.5f);
    g_meta.record(0.25f);
  }
  void save(const std::filesystem::path& p) const {
    train::save_checkpoint(p, parameters(), opt, scaler, run, w_meta, g_meta);
  }
  void load(const std::filesystem::path& p) {
    train::load_checkpoint(p, parameters(), opt, scaler, run, w_meta, g_meta);
  }
};

std::uint64_t fnv(const unsigned char* p, std::size_t n) {
  ckpt::fnv1a64 h;
  h.add(p, n);
  return h.h;
}

/// Rewrites the checksums where the file's structure (as far as it is well-formed) puts them.
void fix_checksums(std::vector<unsigned char>& b) {
  std::size_t pos = 0;
  const auto have = [&](std::size_t n) { return b.size() - pos >= n; };
  const auto u64 = [&](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  if (!have(24)) return;
  const std::uint64_t count = u64(16);
  pos = 24;
  for (std::uint64_t k = 0; k < count && k < 4096; ++k) {
    const std::size_t begin = pos;
    if (!have(4)) return;
    std::uint32_t name_len;
    std::memcpy(&name_len, b.data() + pos, 4);
    pos += 4;
    if (!have(name_len)) return;
    pos += name_len;
    if (!have(4)) return;
    const std::size_t rank = b[pos + 1];
    pos += 4;
    if (!have(8 * rank + 8)) return;
    pos += 8 * rank;
    const std::uint64_t len = u64(pos);
    pos += 8;
    if (!have(len)) return;
    pos += len;
    if (!have(8)) return;
    const std::uint64_t h = fnv(b.data() + begin, pos - begin);
    std::memcpy(b.data() + pos, &h, 8);
    pos += 8;
  }
  if (!have(16)) return;
  pos += 8; // the end marker, left as it is
  const std::uint64_t h = fnv(b.data(), pos);
  std::memcpy(b.data() + pos, &h, 8);
}

using record_key = std::tuple<int, std::vector<std::int64_t>, std::vector<unsigned char>>;

/// The records of a valid file by name.
std::map<std::string, record_key> records_of(const std::vector<unsigned char>& b) {
  std::map<std::string, record_key> m;
  for (const auto& r : ckpt::parse("fuzz", "fuzz", b))
    m[r.name] = {static_cast<int>(r.type), r.shape,
                 std::vector<unsigned char>(r.data, r.data + r.bytes)};
  return m;
}

struct fixture {
  tessera::fuzz::scratch_file in{"ckpt_in"}, out{"ckpt_out"};
  std::vector<unsigned char> initial; ///< the fresh state's checkpoint
  bool verbose = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  fixture() {
    state().save(out.path());
    initial = tessera::fuzz::read_all(out.path());
  }
};

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::initialize_kokkos();
  if (const char* seed = std::getenv("TESSERA_FUZZ_WRITE_SEED")) {
    state().save(seed);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const fixture fx;
  std::vector<unsigned char> b(data + 1, data + size);
  if (data[0] & 1) fix_checksums(b);

  // 1 and 2: the parser alone.
  std::vector<ckpt::parsed_record> parsed;
  try {
    parsed = ckpt::parse("fuzz", "fuzz", b);
  } catch (const tessera::value_error& e) {
    if (fx.verbose) std::fprintf(stderr, "  parser refuses: %s\n", e.what());
    return 0;
  }
  std::vector<ckpt::record> again;
  for (const auto& r : parsed)
    again.push_back(
        {r.name, r.type, r.shape, std::vector<unsigned char>(r.data, r.data + r.bytes)});
  TESSERA_FUZZ_CHECK(ckpt::serialize(again) == b,
                     "the parser accepted a %zu-byte file that is not what its records serialise "
                     "to",
                     b.size());

  // 3: load into the state; refusal leaves it untouched, success restores exactly the file.
  state s; // as fresh as the one fx.initial was saved from
  fx.in.write(b.data(), b.size());
  bool loaded = true;
  try {
    s.load(fx.in.path());
  } catch (const tessera::error& e) {
    if (fx.verbose) std::fprintf(stderr, "  load refuses: %s\n", e.what());
    loaded = false;
  }
  if (loaded && fx.verbose) std::fprintf(stderr, "  loaded\n");
  s.save(fx.out.path());
  const auto saved = tessera::fuzz::read_all(fx.out.path());
  if (!loaded) {
    TESSERA_FUZZ_CHECK(saved == fx.initial, "a refused load changed the caller's state");
  } else {
    TESSERA_FUZZ_CHECK(records_of(saved) == records_of(b),
                       "after a successful load, saving the state does not give the file's "
                       "records back");
  }
  return 0;
}
