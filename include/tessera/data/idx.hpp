#pragma once
/// \file data/idx.hpp
/// Reading IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or not, with zlib.
/// Programs including this header link zlib (CMake: find_package(ZLIB), ZLIB::ZLIB).
///
/// IDX (http://yann.lecun.com/exdb/mnist/): a 4-byte magic 0x00 0x00 <type> <rank>, then rank
/// big-endian uint32 dimensions, then the elements row-major. Only type 0x08 (unsigned byte)
/// is read, the type of every MNIST-family file.
///
///   auto images = tessera::data::read_idx("/usr/share/datasets/fashion-mnist/"
///                                          "train-images-idx3-ubyte.gz");  // dims {60000, 28, 28}
///   auto ds = tessera::data::load_mnist_like("/usr/share/datasets/fashion-mnist", "train");
///
/// Errors (tessera::value_error naming the file and what is wrong): a missing or unreadable
/// file, a bad magic (not IDX, or not unsigned bytes), a rank outside 1..4, dimensions whose
/// product overflows, a file shorter than its header announces (truncated, or a corrupt gzip
/// stream), and for load_mnist_like images and labels that disagree.

#include <tessera/config/error.hpp>

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::data {

/// An IDX array of unsigned bytes: its dimensions and its elements, row-major.
struct idx_array {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;

  std::int64_t size() const noexcept {
    std::int64_t s = 1;
    for (auto d : dims) s *= d;
    return s;
  }
};

namespace detail {
struct gz_closer {
  void operator()(gzFile_s* f) const noexcept { gzclose(f); }
};

/// Reads exactly n bytes or throws value_error (truncated file or corrupt stream).
inline void read_exactly(gzFile f, const std::string& path, void* out, std::size_t n,
                         const char* what) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < n) {
    // gzread takes an unsigned count: read in chunks of at most 1 GiB.
    const unsigned chunk = static_cast<unsigned>(n - got < (1u << 30) ? n - got : (1u << 30));
    const int r = gzread(f, p + got, chunk);
    if (r < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw value_error("tessera::data::read_idx: '" + path + "': corrupt data while reading " +
                        what + " (zlib: " + (msg ? msg : "unknown error") + ")");
    }
    if (r == 0)
      throw value_error("tessera::data::read_idx: '" + path + "' is truncated: it ends after " +
                        std::to_string(got) + " of the " + std::to_string(n) + " bytes of " + what);
    got += static_cast<std::size_t>(r);
  }
}
} // namespace detail

/// Reads an IDX file of unsigned bytes (gzip-compressed or plain). See the file comment for
/// the errors it throws.
inline idx_array read_idx(const std::string& path) {
  const std::unique_ptr<gzFile_s, detail::gz_closer> f(gzopen(path.c_str(), "rb"));
  if (!f)
    throw value_error("tessera::data::read_idx: cannot open '" + path +
                      "' (missing or unreadable)");
  unsigned char magic[4];
  detail::read_exactly(f.get(), path, magic, 4, "the magic number");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08)
    throw value_error("tessera::data::read_idx: '" + path +
                      "' is not an IDX file of unsigned "
                      "bytes: its magic must be 00 00 08 <rank>, it starts with " +
                      std::to_string(magic[0]) + " " + std::to_string(magic[1]) + " " +
                      std::to_string(magic[2]));
  const int rank = magic[3];
  if (rank < 1 || rank > 4)
    throw value_error("tessera::data::read_idx: '" + path + "' has rank " + std::to_string(rank) +
                      "; 1 to 4 are supported");
  idx_array a;
  std::int64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    unsigned char b[4];
    detail::read_exactly(f.get(), path, b, 4, "the dimensions");
    const std::int64_t d = (std::int64_t{b[0]} << 24) | (std::int64_t{b[1]} << 16) |
                           (std::int64_t{b[2]} << 8) | std::int64_t{b[3]};
    a.dims.push_back(d);
    total *= d;
    // 2^40 bytes: far beyond any IDX file, and keeps the product from overflowing.
    if (total > (std::int64_t{1} << 40))
      throw value_error("tessera::data::read_idx: '" + path +
                        "' announces more than 2^40 elements");
  }
  a.data.resize(static_cast<std::size_t>(total));
  detail::read_exactly(f.get(), path, a.data.data(), a.data.size(), "the elements");
  return a;
}

/// Images (N, H, W) and labels (N) of an MNIST-family dataset split: <dir>/<split>-images-
/// idx3-ubyte[.gz] and <dir>/<split>-labels-idx1-ubyte[.gz] (split "train" or "t10k").
struct labelled_images {
  idx_array images; ///< (N, H, W) bytes
  idx_array labels; ///< (N) bytes
  std::int64_t count() const noexcept { return labels.dims.empty() ? 0 : labels.dims[0]; }
};

inline labelled_images load_mnist_like(const std::string& dir, const std::string& split) {
  const auto pick = [&](const std::string& stem) {
    const std::string gz = dir + "/" + stem + ".gz";
    if (const std::unique_ptr<gzFile_s, detail::gz_closer> f(gzopen(gz.c_str(), "rb")); f)
      return gz;
    return dir + "/" + stem;
  };
  labelled_images d{read_idx(pick(split + "-images-idx3-ubyte")),
                    read_idx(pick(split + "-labels-idx1-ubyte"))};
  if (d.images.dims.size() != 3 || d.labels.dims.size() != 1 ||
      d.images.dims[0] != d.labels.dims[0])
    throw value_error("tessera::data::load_mnist_like: '" + dir + "' split '" + split +
                      "': images must be (N, H, W) and labels (N) with the same N");
  return d;
}

} // namespace tessera::data
