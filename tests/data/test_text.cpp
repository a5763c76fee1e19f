// data/text.hpp: the corpus rule (regular files without an extension, sorted, no links, no
// subdirectories), the vocabulary and encode / decode, the 90/10 split, the seeded sampler
// against values computed independently in Python (the SplitMix64 formula of the file comment),
// the validation offsets, and the errors for a missing directory, an empty corpus and a corpus
// shorter than one context.
#include "support/messages.hpp"

#include <tessera/data/text.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT
namespace fs = std::filesystem;

namespace {

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& tag)
      : path(fs::temp_directory_path() /
             ("tessera_text_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
};

std::string as_string(const std::vector<std::uint8_t>& b) {
  return {b.begin(), b.end()};
}

} // namespace

TEST_CASE("read_text_directory: the fortunes rule", "[data][text]") {
  scratch_dir d("rule");
  d.write("zeta", "Z1\n");
  d.write("alpha", "A1\n");
  d.write("Beta", "B1\n"); // 'B' < 'a' in byte order
  d.write("alpha.dat", "index");
  d.write("notes.txt", "skip");
  fs::create_symlink(d.path / "alpha", d.path / "alpha2"); // a link without extension: skipped
  fs::create_directories(d.path / "off");
  d.write("off/hidden", "skip");
  const auto c = data::read_text_directory(d.path);
  CHECK(c.files == std::vector<std::string>{"Beta", "alpha", "zeta"});
  CHECK(as_string(c.bytes) == "B1\nA1\nZ1\n");
}

TEST_CASE("read_text_directory: errors", "[data][text]") {
  scratch_dir d("errors");
  CHECK_THROWS_MATCHES(data::read_text_directory(d.path / "missing"), value_error,
                       what_contains({"read_text_directory", "missing", "does not exist"}));
  d.write("file", "x");
  CHECK_THROWS_MATCHES(data::read_text_directory(d.path / "file"), value_error,
                       what_contains({"is not a directory"}));
  scratch_dir e("empty");
  CHECK_THROWS_MATCHES(data::read_text_directory(e.path), value_error,
                       what_contains({"is empty", "0 regular files"}));
  e.write("only.dat", "index only");
  e.write("blank", "");
  CHECK_THROWS_MATCHES(data::read_text_directory(e.path), value_error,
                       what_contains({"is empty", "1 regular files", "0 bytes"}));
}

TEST_CASE("char_vocab: sorted distinct bytes, encode / decode round trip", "[data][text]") {
  const std::string text = "hello, world\n";
  const std::vector<std::uint8_t> bytes(text.begin(), text.end());
  const data::char_vocab v(bytes);
  // distinct bytes ascending: '\n' ' ' ',' 'd' 'e' 'h' 'l' 'o' 'r' 'w'
  CHECK(v.size() == 10);
  CHECK(as_string(v.chars()) == "\n ,dehlorw");
  const auto ids = v.encode(bytes);
  CHECK(ids == std::vector<std::int32_t>{5, 4, 6, 6, 7, 2, 1, 9, 7, 8, 6, 3, 0});
  CHECK(v.decode(ids) == text);
  CHECK_THROWS_MATCHES(v.encode(std::string("hex")), value_error,
                       what_contains({"encode", "byte 120", "position 2"}));
  const std::vector<std::int32_t> bad{0, 10};
  CHECK_THROWS_MATCHES(v.decode(bad), value_error, what_contains({"decode", "id 10", "[0, 10)"}));
  CHECK_THROWS_AS(data::char_vocab(std::vector<std::uint8_t>{}), value_error);
}

TEST_CASE("split_text: floor(0.9 n), and a corpus shorter than a context", "[data][text]") {
  std::vector<std::int32_t> ids(1005);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i % 7);
  const auto s = data::split_text(ids, 16);
  CHECK(s.train.size() == 904); // floor(904.5)
  CHECK(s.val.size() == 101);
  CHECK(s.train.front() == 0);
  CHECK(s.val.front() == ids[904]);
  // 100 ids: 90 / 10; a context of 10 needs 11 in each
  const std::vector<std::int32_t> small(100, 1);
  CHECK(data::split_text(small, 9).val.size() == 10);
  CHECK_THROWS_MATCHES(data::split_text(small, 10), value_error,
                       what_contains({"split_text", "100 characters", "90 for training",
                                      "10 for validation", "11"}));
  CHECK_THROWS_AS(data::split_text(small, 0), value_error);
}

TEST_CASE("context_sampler: the documented SplitMix64 rule, as Python computes it",
          "[data][text]") {
  // Python (benchmarks/gpt/torch_char_gpt.py's sampler): bits(seed, step, i) % (1000 - 16)
  const data::context_sampler s(1000, 16, 1234);
  CHECK(s.start(0, 0) == 381);
  CHECK(s.start(0, 1) == 933);
  CHECK(s.start(0, 2) == 821);
  CHECK(s.start(0, 3) == 708);
  CHECK(s.start(7, 0) == 103);
  CHECK(s.start(7, 3) == 918);
  CHECK(counter_rng{7, 3}.bits(5) == 15440732306985336618ull);
  const data::context_sampler z(1000, 16, 0);
  CHECK(z.start(0, 0) == 0);
  CHECK(z.start(0, 1) == 679);
  // a batch copies T + 1 ids from each start
  std::vector<std::int32_t> ids(1000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  const auto b = s.batch(ids, 7, 2);
  REQUIRE(b.size() == 34);
  CHECK(b[0] == 103);
  CHECK(b[16] == 119);
  CHECK(b[17] == 442);
  // every start in range over many steps
  for (std::uint64_t st = 0; st < 200; ++st)
    for (std::uint64_t i = 0; i < 16; ++i) {
      const auto v = s.start(st, i);
      CHECK((v >= 0 && v <= 1000 - 17));
    }
  CHECK_THROWS_MATCHES(data::context_sampler(16, 16, 1), value_error,
                       what_contains({"context_sampler", "16 ids", "17"}));
  CHECK_THROWS_AS(s.batch(std::vector<std::int32_t>(999), 0, 1), value_error);
}

TEST_CASE("eval_offsets: evenly spaced, last context ends at the split's end", "[data][text]") {
  CHECK(data::eval_offsets(100, 9, 4) == std::vector<std::int64_t>{0, 30, 60, 90});
  CHECK(data::eval_offsets(101, 9, 3) == std::vector<std::int64_t>{0, 45, 91});
  CHECK(data::eval_offsets(50, 9, 1) == std::vector<std::int64_t>{0});
  CHECK_THROWS_AS(data::eval_offsets(9, 9, 2), value_error);
}
