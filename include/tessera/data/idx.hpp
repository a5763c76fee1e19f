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
///   auto a = tessera::data::read_idx_bytes(bytes, size, "in-memory labels");  // same checks
///
/// The header is validated against the data actually present before any element storage is
/// allocated: a plain file's size is known up front and must be exactly header + product of
/// the dimensions; a gzip stream is read in growing chunks (storage at most twice the bytes
/// seen), so a few corrupt header bytes can never request gigabytes.
///
/// Errors (tessera::value_error naming the file and what is wrong): a missing file, a path
/// that is a directory, an unreadable file, a bad magic, an element type other than unsigned
/// byte, a rank outside 1..4, a dimension of 0 (an empty array is not a dataset), dimensions
/// whose product overflows, a file shorter than its header announces (truncated, or a corrupt
/// gzip stream; the message gives the declared dimensions and the bytes present), bytes after
/// the data the header announces, and for load_mnist_like images and labels that disagree.

#include <tessera/config/checked.hpp>
#include <tessera/config/error.hpp>

#include <zlib.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace tessera::data {

/// An IDX array of unsigned bytes: its dimensions and its elements, row-major, in host memory
/// (a std::vector). To feed a tensor in any memory space (a GPU's included), write the
/// converted elements into tessera::host_mirror(t) and copy_from_host(t, mirror)
/// (tensor/host_mirror.hpp): on a host build the mirror is t itself and nothing is copied.
struct idx_array {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;

  /// The product of the dimensions (== data.size() for an array read_idx returned).
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

inline std::string idx_dims_text(const std::vector<std::int64_t>& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

/// Reads a gzip-compressed or plain file through zlib. read() returns fewer bytes than asked
/// only at the end of the data; it throws value_error on a corrupt stream.
class idx_file_source {
public:
  idx_file_source(std::string name, gzFile f, std::optional<std::uint64_t> plain_size)
      : name_(std::move(name)), f_(f), plain_size_(plain_size) {}

  std::size_t read(void* out, std::size_t n) {
    auto* p = static_cast<unsigned char*>(out);
    std::size_t got = 0;
    while (got < n) {
      // gzread takes an unsigned count: read in chunks of at most 1 GiB.
      const unsigned chunk = static_cast<unsigned>(n - got < (1u << 30) ? n - got : (1u << 30));
      const int r = gzread(f_.get(), p + got, chunk);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(f_.get(), &code);
        throw value_error("tessera::data::read_idx: '" + name_ +
                          "': corrupt data (zlib: " + (msg ? msg : "unknown error") + ")");
      }
      if (r == 0) {
        // gzread reports a gzip stream cut short (its end or its checksum missing) as a
        // soft end of file, Z_BUF_ERROR: refuse it (the data could not be verified).
        int code = Z_OK;
        gzerror(f_.get(), &code);
        if (code == Z_BUF_ERROR)
          throw value_error("tessera::data::read_idx: '" + name_ +
                            "': corrupt data (the gzip stream is cut short)");
        break;
      }
      got += static_cast<std::size_t>(r);
    }
    return got;
  }
  /// The total byte count when the file is not compressed (known before reading).
  std::optional<std::uint64_t> plain_size() const { return plain_size_; }
  const std::string& name() const { return name_; }
  const char* unit() const { return plain_size_ ? "the file" : "the decompressed stream"; }

private:
  std::string name_;
  std::unique_ptr<gzFile_s, gz_closer> f_;
  std::optional<std::uint64_t> plain_size_;
};

/// Reads bytes in memory: copied as they are, or inflated if they start with the gzip magic
/// 1f 8b (several concatenated gzip members are read one after the other, as gzread does).
class idx_memory_source {
public:
  idx_memory_source(std::string name, const unsigned char* p, std::size_t n)
      : name_(std::move(name)), p_(p), n_(n), gz_(n >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
    if (gz_) {
      zs_ = std::make_unique<z_stream>();
      std::memset(zs_.get(), 0, sizeof(z_stream));
      if (inflateInit2(zs_.get(), 16 + MAX_WBITS) != Z_OK) {
        zs_.reset();
        throw value_error("tessera::data::read_idx: '" + name_ + "': zlib initialisation failed");
      }
      zs_->next_in = const_cast<unsigned char*>(p_); // zlib's API is not const-correct
      zs_->avail_in = static_cast<uInt>(n_ < (1u << 30) ? n_ : (1u << 30));
      pos_ = zs_->avail_in;
    }
  }
  ~idx_memory_source() {
    if (zs_) inflateEnd(zs_.get());
  }
  idx_memory_source(const idx_memory_source&) = delete;
  idx_memory_source& operator=(const idx_memory_source&) = delete;

  std::size_t read(void* out, std::size_t n) {
    if (!gz_) {
      const std::size_t k = n < n_ - pos_ ? n : n_ - pos_;
      if (k) std::memcpy(out, p_ + pos_, k);
      pos_ += k;
      return k;
    }
    auto* o = static_cast<unsigned char*>(out);
    std::size_t got = 0;
    const auto feed = [&] { // the next piece of input, once zlib has used the last one
      if (zs_->avail_in != 0 || pos_ == n_) return;
      const std::size_t k = n_ - pos_ < (1u << 30) ? n_ - pos_ : (1u << 30);
      zs_->next_in = const_cast<unsigned char*>(p_ + pos_);
      zs_->avail_in = static_cast<uInt>(k);
      pos_ += k;
    };
    while (got < n && !done_) {
      feed();
      const std::size_t want = n - got < (1u << 30) ? n - got : (1u << 30);
      zs_->next_out = o + got;
      zs_->avail_out = static_cast<uInt>(want);
      const int rc = inflate(zs_.get(), Z_NO_FLUSH);
      got += want - zs_->avail_out;
      if (rc == Z_STREAM_END) {
        // Another gzip member may follow; anything else after a member is ignored (as gzread
        // does).
        feed();
        if (zs_->avail_in >= 2 && zs_->next_in[0] == 0x1f && zs_->next_in[1] == 0x8b)
          inflateReset(zs_.get());
        else
          done_ = true;
      } else if (rc == Z_BUF_ERROR) { // no progress possible: the input has run out
        throw value_error("tessera::data::read_idx: '" + name_ +
                          "': corrupt data (the gzip stream is cut short)");
      } else if (rc != Z_OK) {
        throw value_error("tessera::data::read_idx: '" + name_ + "': corrupt data (zlib: " +
                          (zs_->msg ? zs_->msg : "error " + std::to_string(rc)) + ")");
      }
    }
    return got;
  }
  std::optional<std::uint64_t> plain_size() const {
    return gz_ ? std::nullopt : std::optional<std::uint64_t>(n_);
  }
  const std::string& name() const { return name_; }
  const char* unit() const { return gz_ ? "the decompressed stream" : "the buffer"; }

private:
  std::string name_;
  const unsigned char* p_;
  std::size_t n_, pos_ = 0;
  bool gz_, done_ = false;
  std::unique_ptr<z_stream> zs_;
};

/// Reads exactly n header bytes or throws value_error naming what was cut.
template <class Source>
void read_header_bytes(Source& src, void* out, std::size_t n, std::size_t offset,
                       const char* what) {
  const std::size_t got = src.read(out, n);
  if (got < n)
    throw value_error("tessera::data::read_idx: '" + src.name() + "' is truncated: it ends after " +
                      std::to_string(offset + got) + " bytes, inside " + what);
}

/// The IDX parser shared by the file and the memory readers.
template <class Source>
idx_array parse_idx(Source& src) {
  const std::string who = "tessera::data::read_idx: '" + src.name() + "'";
  unsigned char magic[4];
  read_header_bytes(src, magic, 4, 0, "the magic number");
  if (magic[0] != 0 || magic[1] != 0)
    throw value_error(who + " is not an IDX file: its magic must be 00 00 <type> <rank>, it " +
                      "starts with " + std::to_string(magic[0]) + " " + std::to_string(magic[1]));
  if (magic[2] != 0x08)
    throw value_error(who + " holds elements of IDX type code " + std::to_string(magic[2]) +
                      "; only 8 (unsigned byte) is supported");
  const int rank = magic[3];
  if (rank < 1 || rank > 4)
    throw value_error(who + " has rank " + std::to_string(rank) + "; 1 to 4 are supported");
  idx_array a;
  std::int64_t count = 1;
  bool overflow = false;
  for (int i = 0; i < rank; ++i) {
    unsigned char b[4];
    read_header_bytes(src, b, 4, 4 + 4 * static_cast<std::size_t>(i), "the dimensions");
    const std::uint32_t d = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) |
                            (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
    a.dims.push_back(d);
    overflow = overflow || !tessera::detail::checked_mul(count, std::int64_t{d}, count);
  }
  const std::uint64_t header = 4 + 4 * static_cast<std::uint64_t>(rank);
  for (int i = 0; i < rank; ++i)
    if (a.dims[static_cast<std::size_t>(i)] == 0)
      throw value_error(who + " declares dims " + detail::idx_dims_text(a.dims) + ": dimension " +
                        std::to_string(i) + " is 0 (an empty array)");
  // The product must fit a size_t, an int64 element count, and the header + data length.
  if (overflow || count > INT64_MAX - 64 || static_cast<std::uint64_t>(count) > SIZE_MAX)
    throw value_error(who + " declares dims " + detail::idx_dims_text(a.dims) +
                      " whose product overflows (more than 2^63 elements)");
  const auto total = static_cast<std::uint64_t>(count);
  const auto too_short = [&](std::uint64_t present) {
    return value_error(who + " is truncated: its header declares dims " +
                       detail::idx_dims_text(a.dims) + " = " + std::to_string(total) +
                       " bytes of data after the " + std::to_string(header) + "-byte header, " +
                       src.unit() + " holds " + std::to_string(present) + " bytes in all (" +
                       std::to_string(present > header ? present - header : 0) + " of data)");
  };
  const auto too_long = [&](std::uint64_t extra) {
    return value_error(who + " has " + std::to_string(extra) + " bytes after the " +
                       std::to_string(total) + " bytes of data its header declares (dims " +
                       detail::idx_dims_text(a.dims) + ")");
  };
  if (const auto size = src.plain_size()) {
    // Known size: check before allocating anything.
    if (*size < header || *size - header < total) throw too_short(*size);
    if (*size - header > total) throw too_long(*size - header - total);
    a.data.resize(static_cast<std::size_t>(total));
    const std::size_t got = src.read(a.data.data(), a.data.size());
    if (got < a.data.size()) throw too_short(header + got); // the file shrank meanwhile
  } else {
    // A compressed stream: grow the storage as the data arrives (doubling, from 1 MiB), so
    // what is allocated stays within twice what the stream really holds.
    std::size_t got = 0;
    while (got < total) {
      const std::size_t step = got < (std::size_t{1} << 20) ? (std::size_t{1} << 20) : got;
      const std::size_t want =
          static_cast<std::size_t>(total - got < step ? total - got : std::uint64_t{step});
      a.data.resize(got + want);
      const std::size_t r = src.read(a.data.data() + got, want);
      got += r;
      if (r < want) throw too_short(header + got);
    }
  }
  unsigned char extra[4096];
  std::uint64_t more = 0;
  for (std::size_t r; (r = src.read(extra, sizeof extra)) > 0;) more += r;
  if (more) throw too_long(more);
  return a;
}
} // namespace detail

/// Reads an IDX file of unsigned bytes (gzip-compressed or plain). See the file comment for
/// the errors it throws.
inline idx_array read_idx(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st))
    throw value_error("tessera::data::read_idx: cannot open '" + path + "': no such file");
  if (fs::is_directory(st))
    throw value_error("tessera::data::read_idx: cannot open '" + path +
                      "': it is a directory, not a file");
  std::unique_ptr<gzFile_s, detail::gz_closer> f(gzopen(path.c_str(), "rb"));
  if (!f)
    throw value_error("tessera::data::read_idx: cannot open '" + path +
                      "' (unreadable: " + std::strerror(errno) + ")");
  // gzdirect() says whether the file is plain (zlib looks at its first bytes); then its size
  // on disk is the size of the data.
  std::optional<std::uint64_t> plain;
  if (gzdirect(f.get())) {
    const auto size = fs::is_regular_file(st) ? fs::file_size(path, ec) : std::uintmax_t{0};
    if (fs::is_regular_file(st) && !ec) plain = size;
  }
  detail::idx_file_source src(path, f.release(), plain);
  return detail::parse_idx(src);
}

/// Reads IDX bytes held in memory (gzip-compressed if they start with 1f 8b, else plain), with
/// the checks of read_idx; `name` stands for the file in error messages.
inline idx_array read_idx_bytes(const void* bytes, std::size_t size,
                                const std::string& name = "<memory>") {
  detail::idx_memory_source src(name, static_cast<const unsigned char*>(bytes), size);
  return detail::parse_idx(src);
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
    std::error_code ec;
    return std::filesystem::is_regular_file(gz, ec) ? gz : dir + "/" + stem;
  };
  labelled_images d{read_idx(pick(split + "-images-idx3-ubyte")),
                    read_idx(pick(split + "-labels-idx1-ubyte"))};
  if (d.images.dims.size() != 3 || d.labels.dims.size() != 1 ||
      d.images.dims[0] != d.labels.dims[0])
    throw value_error("tessera::data::load_mnist_like: '" + dir + "' split '" + split +
                      "': images must be (N, H, W) and labels (N) with the same N, they are " +
                      detail::idx_dims_text(d.images.dims) + " and " +
                      detail::idx_dims_text(d.labels.dims));
  return d;
}

} // namespace tessera::data
