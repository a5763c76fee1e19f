// tessera/data/idx.hpp: round trips through plain and gzipped IDX files (and bytes in memory)
// written here, every error (missing file, directory, bad magic, wrong element type, bad rank,
// a zero dimension, truncated header or data, trailing bytes, huge or overflowing declared
// dims, corrupt gzip), each message naming the file, the declared dims and the size, and the
// installed Fashion-MNIST files (shapes, label range, the dataset's 6,000 / 1,000 images per
// class in train / test).
#include <tessera/data/idx.hpp>

#include <catch2/catch.hpp>

#include <zlib.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using tessera::data::read_idx;

std::vector<unsigned char> idx_bytes(const std::vector<std::uint32_t>& dims,
                                     const std::vector<unsigned char>& data) {
  std::vector<unsigned char> b = {0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

struct temp_dir {
  fs::path path = fs::temp_directory_path() /
                  ("tessera_idx_" + std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::vector<unsigned char>& bytes,
                    bool gz) const {
    const auto p = (path / name).string();
    if (gz) {
      gzFile f = gzopen(p.c_str(), "wb");
      REQUIRE(f);
      REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
              static_cast<int>(bytes.size()));
      gzclose(f);
    } else {
      std::ofstream(p, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    }
    return p;
  }
};

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string message_of(const std::string& path) {
  try {
    read_idx(path);
  } catch (const tessera::value_error& e) {
    return e.what();
  }
  return "(no error)";
}

} // namespace

TEST_CASE("data::read_idx: plain and gzipped round trips", "[nn][idx]") {
  temp_dir dir;
  std::vector<unsigned char> data(2 * 3 * 5);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 37);
  for (bool gz : {false, true}) {
    const auto a = read_idx(dir.write(gz ? "a.gz" : "a", idx_bytes({2, 3, 5}, data), gz));
    CHECK(a.dims == std::vector<std::int64_t>{2, 3, 5});
    CHECK(a.size() == 30);
    CHECK(a.data == data);
  }
  const auto l = read_idx(dir.write("l", idx_bytes({4}, {9, 0, 3, 7}), true));
  CHECK(l.dims == std::vector<std::int64_t>{4});
  CHECK(l.data == std::vector<std::uint8_t>{9, 0, 3, 7});
}

TEST_CASE("data::read_idx: missing files, directories and bad headers are refused", "[nn][idx]") {
  temp_dir dir;
  const std::string missing = (dir.path / "nope.gz").string();
  CHECK_THROWS_WITH(read_idx(missing), Catch::Contains("cannot open") && Catch::Contains(missing) &&
                                           Catch::Contains("no such file"));
  const std::string sub = (dir.path / "sub").string();
  fs::create_directories(sub);
  CHECK_THAT(message_of(sub), Catch::Contains(sub) && Catch::Contains("directory"));
  for (bool gz : {false, true}) {
    INFO((gz ? "gzipped" : "plain"));
    auto bad_magic = idx_bytes({2}, {1, 2});
    bad_magic[0] = 'P'; // a PNG, say
    const auto m = dir.write("m", bad_magic, gz);
    CHECK_THAT(message_of(m), Catch::Contains(m) && Catch::Contains("not an IDX file"));
    auto bad_type = idx_bytes({2}, {1, 2});
    bad_type[2] = 0x0D; // float elements: not unsigned bytes
    const auto t = dir.write("ty", bad_type, gz);
    CHECK_THAT(message_of(t), Catch::Contains(t) && Catch::Contains("type code 13") &&
                                  Catch::Contains("unsigned byte"));
    auto bad_rank = idx_bytes({2}, {1, 2});
    bad_rank[3] = 0; // zero dimensions
    CHECK_THAT(message_of(dir.write("r", bad_rank, gz)), Catch::Contains("rank 0"));
    bad_rank[3] = 5;
    CHECK_THAT(message_of(dir.write("r5", bad_rank, gz)), Catch::Contains("rank 5"));
    const auto z = dir.write("z", idx_bytes({3, 0, 2}, {}), gz); // an empty array
    CHECK_THAT(message_of(z), Catch::Contains(z) && Catch::Contains("(3, 0, 2)") &&
                                  Catch::Contains("dimension 1 is 0"));
    auto short_header = idx_bytes({10, 3}, {});
    short_header.resize(9); // inside the second dimension
    CHECK_THAT(message_of(dir.write("h", short_header, gz)),
               Catch::Contains("truncated") && Catch::Contains("dimensions"));
    CHECK_THAT(message_of(dir.write("e", {}, gz)),
               Catch::Contains("truncated") && Catch::Contains("magic"));
  }
}

TEST_CASE("data::read_idx: data shorter or longer than the header declares is refused",
          "[nn][idx]") {
  temp_dir dir;
  for (bool gz : {false, true}) {
    INFO((gz ? "gzipped" : "plain"));
    const auto t = dir.write("t", idx_bytes({10, 3}, std::vector<unsigned char>(29, 1)), gz);
    // The message names the file, the declared dims and what is really there (12-byte header).
    CHECK_THAT(message_of(t),
               Catch::Contains(t) && Catch::Contains("truncated") &&
                   Catch::Contains("dims (10, 3) = 30 bytes of data") &&
                   Catch::Contains(std::string(gz ? "the decompressed stream" : "the file") +
                                   " holds 41 bytes in all (29 of data)"));
    const auto l = dir.write("l", idx_bytes({10, 3}, std::vector<unsigned char>(35, 1)), gz);
    CHECK_THAT(message_of(l), Catch::Contains(l) && Catch::Contains("5 bytes after the 30") &&
                                  Catch::Contains("(10, 3)"));
  }
  // A gzip stream cut in the middle (its end and checksum missing).
  const auto full =
      dir.write("full.gz", idx_bytes({1000}, std::vector<unsigned char>(1000, 7)), true);
  auto gzb = file_bytes(full);
  gzb.resize(gzb.size() / 2);
  const auto cut = dir.write("cut.gz", gzb, false);
  CHECK_THROWS_AS(read_idx(cut), tessera::value_error);
  CHECK_THROWS_AS(tessera::data::read_idx_bytes(gzb.data(), gzb.size()), tessera::value_error);
  // Every element present but the gzip trailer (CRC-32 and length) cut off: the data cannot be
  // verified. (zlib's gzread reports this only as a soft end of file; found by fuzz_idx.)
  auto no_trailer = file_bytes(full);
  no_trailer.resize(no_trailer.size() - 4);
  const auto nt = dir.write("notrailer.gz", no_trailer, false);
  CHECK_THAT(message_of(nt), Catch::Contains(nt) && Catch::Contains("cut short"));
  CHECK_THROWS_AS(tessera::data::read_idx_bytes(no_trailer.data(), no_trailer.size()),
                  tessera::value_error);
}

TEST_CASE("data::read_idx: huge or overflowing declared dims fail before any allocation",
          "[nn][idx]") {
  temp_dir dir;
  for (bool gz : {false, true}) {
    INFO((gz ? "gzipped" : "plain"));
    // An 8-byte file declaring 4 GiB: refused from the file size (plain) or after the first
    // chunk (gzip), never by zeroing 4 GiB.
    const auto h = dir.write("h", idx_bytes({0xFFFFFFFFu}, {}), gz);
    CHECK_THAT(message_of(h), Catch::Contains(h) && Catch::Contains("(4294967295)") &&
                                  Catch::Contains("holds 8 bytes in all (0 of data)"));
    // 2^40 bytes (1 TiB): the old reader's cap let this through to a 1 TiB resize.
    const auto t = dir.write("tb", idx_bytes({65536, 65536, 256}, {1, 2, 3}), gz);
    CHECK_THAT(message_of(t), Catch::Contains("(65536, 65536, 256) = 1099511627776 bytes") &&
                                  Catch::Contains("holds 19 bytes in all (3 of data)"));
    // Products that overflow 64 bits, that wrap to exactly 0 (2^64), or that exceed 2^63.
    const std::vector<std::vector<std::uint32_t>> overflowing = {
        {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu},
        {65536, 65536, 65536, 65536},
        {65536, 65536, 65536, 32768},
        {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}};
    for (const auto& dims : overflowing) {
      const auto o = dir.write("o", idx_bytes(dims, {1}), gz);
      CHECK_THAT(message_of(o), Catch::Contains(o) && Catch::Contains("overflows"));
    }
  }
}

TEST_CASE("data::read_idx_bytes: the same checks on bytes in memory", "[nn][idx]") {
  using tessera::data::read_idx_bytes;
  temp_dir dir;
  std::vector<unsigned char> data(4 * 7);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(255 - i);
  const auto plain = idx_bytes({4, 7}, data);
  const auto gz = file_bytes(dir.write("g", plain, true));
  REQUIRE(gz.size() > 2);
  CHECK(gz[0] == 0x1f);
  for (const auto* b : {&plain, &gz}) {
    const auto a = read_idx_bytes(b->data(), b->size(), "mem");
    CHECK(a.dims == std::vector<std::int64_t>{4, 7});
    CHECK(a.data == data);
  }
  // Two concatenated gzip members read as one stream, as gzread does.
  const auto first = file_bytes(dir.write("g1", {plain.begin(), plain.begin() + 10}, true));
  auto two = file_bytes(dir.write("g2", {plain.begin() + 10, plain.end()}, true));
  two.insert(two.begin(), first.begin(), first.end());
  CHECK(read_idx_bytes(two.data(), two.size()).data == data);
  CHECK(read_idx(dir.write("two", two, false)).data == data);

  const auto msg = [](const std::vector<unsigned char>& b) {
    try {
      read_idx_bytes(b.data(), b.size(), "labels-in-memory");
    } catch (const tessera::value_error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto cut = plain;
  cut.pop_back();
  CHECK_THAT(msg(cut), Catch::Contains("labels-in-memory") && Catch::Contains("truncated") &&
                           Catch::Contains("(4, 7)") && Catch::Contains("the buffer holds 39"));
  CHECK_THAT(msg(idx_bytes({0xFFFFFFFFu}, {})), Catch::Contains("(4294967295)"));
  CHECK_THAT(msg(idx_bytes({65536, 65536, 65536, 65536}, {})), Catch::Contains("overflows"));
  CHECK_THAT(msg({}), Catch::Contains("truncated"));
  CHECK_THAT(msg({0x1f, 0x8b, 8, 0}), Catch::Contains("corrupt")); // a gzip header cut short
}

TEST_CASE("data::load_mnist_like: the installed Fashion-MNIST", "[nn][idx]") {
  const std::string dir = "/usr/share/datasets/fashion-mnist"; // scripts/bootstrap.sh installs it
  for (const auto& [split, n] : {std::pair<std::string, std::int64_t>{"train", 60000},
                                 std::pair<std::string, std::int64_t>{"t10k", 10000}}) {
    INFO(split);
    const auto d = tessera::data::load_mnist_like(dir, split);
    CHECK(d.images.dims == std::vector<std::int64_t>{n, 28, 28});
    CHECK(d.count() == n);
    std::array<std::int64_t, 10> per_class{};
    std::int64_t out_of_range = 0;
    for (auto y : d.labels.data) y < 10 ? ++per_class[y] : ++out_of_range;
    CHECK(out_of_range == 0);
    for (auto c : per_class) CHECK(c == n / 10); // Fashion-MNIST is balanced
  }
  CHECK_THROWS_AS(tessera::data::load_mnist_like(dir, "validation"), tessera::value_error);
}
