#pragma once
// Shared by tessera's fuzz targets (tests/fuzz/*.cpp): the failure check, a scratch file per
// process, and Kokkos set up once. Each target defines LLVMFuzzerTestOneInput; it is linked
// either with libFuzzer (clang, scripts/fuzz.sh) or with replay_main.cpp (any compiler, CTest).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

/// A property the target asserts: on failure, print it and abort (libFuzzer saves the input as a
/// crash; the replay test fails).
#define TESSERA_FUZZ_CHECK(cond, ...)                                                              \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "tessera fuzz check failed: %s (%s:%d)\n  ", #cond, __FILE__,           \
                   __LINE__);                                                                      \
      std::fprintf(stderr, __VA_ARGS__);                                                           \
      std::fprintf(stderr, "\n");                                                                  \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

namespace tessera::fuzz {

/// A file owned by this process (removed at exit), for code that reads files: in /dev/shm where
/// there is one (checkpoints fsync what they write; memory makes that free), else in the
/// temporary directory.
class scratch_file {
public:
  explicit scratch_file(const std::string& tag)
      : path_(dir() / ("tessera_fuzz_" + tag + "_" + std::to_string(::getpid()))) {}
  ~scratch_file() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  scratch_file(const scratch_file&) = delete;
  scratch_file& operator=(const scratch_file&) = delete;
  const std::filesystem::path& write(const std::uint8_t* data, std::size_t size) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    TESSERA_FUZZ_CHECK(out.good(), "cannot write the scratch file %s", path_.c_str());
    return path_;
  }
  const std::filesystem::path& path() const { return path_; }

private:
  static std::filesystem::path dir() {
    std::error_code ec;
    return std::filesystem::is_directory("/dev/shm", ec) ? std::filesystem::path("/dev/shm")
                                                         : std::filesystem::temp_directory_path();
  }
  std::filesystem::path path_;
};

inline std::vector<unsigned char> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace tessera::fuzz
