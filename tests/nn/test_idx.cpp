// tessera/data/idx.hpp: round trips through plain and gzipped IDX files written here, every
// error (missing file, bad magic, bad rank, truncated header or data, corrupt gzip), and the
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

TEST_CASE("data::read_idx: missing, malformed and truncated files are refused", "[nn][idx]") {
  temp_dir dir;
  const std::string missing = (dir.path / "nope.gz").string();
  CHECK_THROWS_WITH(read_idx(missing), Catch::Contains("cannot open") && Catch::Contains(missing));
  for (bool gz : {false, true}) {
    INFO((gz ? "gzipped" : "plain"));
    auto bad_magic = idx_bytes({2}, {1, 2});
    bad_magic[2] = 0x0D; // float elements: not unsigned bytes
    CHECK_THAT(message_of(dir.write("m", bad_magic, gz)), Catch::Contains("magic"));
    auto bad_rank = idx_bytes({2}, {1, 2});
    bad_rank[3] = 0;
    CHECK_THAT(message_of(dir.write("r", bad_rank, gz)), Catch::Contains("rank 0"));
    auto short_data = idx_bytes({10, 3}, std::vector<unsigned char>(29, 1)); // one byte short
    CHECK_THAT(message_of(dir.write("t", short_data, gz)), Catch::Contains("truncated"));
    auto short_header = idx_bytes({10, 3}, {});
    short_header.resize(9); // inside the second dimension
    CHECK_THAT(message_of(dir.write("h", short_header, gz)),
               Catch::Contains("truncated") && Catch::Contains("dimensions"));
    CHECK_THAT(message_of(dir.write("e", {}, gz)), Catch::Contains("truncated"));
  }
  // A gzip stream cut in the middle (its end and checksum missing).
  const auto full = dir.write("full.gz", idx_bytes({1000}, std::vector<unsigned char>(1000, 7)),
                              true);
  std::ifstream in(full, std::ios::binary);
  std::vector<char> gzb((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gzb.resize(gzb.size() / 2);
  const auto cut = (dir.path / "cut.gz").string();
  std::ofstream(cut, std::ios::binary).write(gzb.data(), std::streamsize(gzb.size()));
  CHECK_THROWS_AS(read_idx(cut), tessera::value_error);
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
