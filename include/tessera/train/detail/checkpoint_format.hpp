#pragma once
/// \file train/detail/checkpoint_format.hpp
/// The byte-level checkpoint format (documented in train/checkpoint.hpp): FNV-1a 64, record
/// serialisation, a validating parser, and atomic file replacement. Private.

#include <tessera/config/error.hpp>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tessera::train::detail::ckpt {

static_assert(std::endian::native == std::endian::little,
              "tessera checkpoints store payloads in little-endian byte order and are written "
              "and read by copying memory: a big-endian host is not supported.");

/// "TSSRCKPT": the first 8 bytes of every checkpoint.
inline constexpr char file_magic[8] = {'T', 'S', 'S', 'R', 'C', 'K', 'P', 'T'};
/// "TSSR_END": the trailer's first 8 bytes.
inline constexpr char end_magic[8] = {'T', 'S', 'S', 'R', '_', 'E', 'N', 'D'};
/// Version 2 added run/precision (a u8 text record); version 1 files are refused.
inline constexpr std::uint32_t format_version = 2;
/// Limits that keep a corrupted length field from requesting absurd allocations.
inline constexpr std::uint32_t max_name_length = 4096;
inline constexpr std::uint8_t max_rank = 8;

/// Element types of a record's payload.
enum class dtype : std::uint8_t {
  f32 = 1,  ///< IEEE binary32 (master weights, optimizer state, scales)
  bf16 = 2, ///< bfloat16
  e4m3 = 3, ///< OCP fp8 E4M3
  e5m2 = 4, ///< OCP fp8 E5M2
  i64 = 16, ///< signed 64-bit integer (counters)
  u64 = 17, ///< unsigned 64-bit integer (seeds)
  u8 = 18   ///< bytes (text, such as the precision's name)
};

inline std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
    return 4;
  case dtype::bf16:
    return 2;
  case dtype::e4m3:
  case dtype::e5m2:
  case dtype::u8:
    return 1;
  case dtype::i64:
  case dtype::u64:
    return 8;
  }
  return 0; // not a dtype
}
inline const char* dtype_name(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
    return "fp32";
  case dtype::bf16:
    return "bf16";
  case dtype::e4m3:
    return "fp8_e4m3";
  case dtype::e5m2:
    return "fp8_e5m2";
  case dtype::i64:
    return "int64";
  case dtype::u64:
    return "uint64";
  case dtype::u8:
    return "bytes";
  }
  return "unknown";
}

/// FNV-1a, 64-bit (Fowler, Noll, Vo; offset basis and prime from the reference description).
/// Any change of a single byte changes the hash: each step is a bijection of the state.
struct fnv1a64 {
  std::uint64_t h = 0xcbf29ce484222325ull;
  void add(const unsigned char* p, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  }
};

/// One record to write.
struct record {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> payload;
};

inline std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

// ---- writing ---------------------------------------------------------------------------------

class byte_sink {
public:
  template <class T>
  void put(T v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T)); // little-endian host (static_assert above)
    bytes.insert(bytes.end(), b, b + sizeof(T));
  }
  void put_bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    bytes.insert(bytes.end(), c, c + n);
  }
  std::vector<unsigned char> bytes;
};

/// The whole file for these records (see the format in train/checkpoint.hpp).
inline std::vector<unsigned char> serialize(const std::vector<record>& records) {
  byte_sink out;
  out.put_bytes(file_magic, 8);
  out.put<std::uint32_t>(format_version);
  out.put<std::uint32_t>(0);
  out.put<std::uint64_t>(records.size());
  for (const auto& r : records) {
    const std::size_t begin = out.bytes.size();
    out.put<std::uint32_t>(static_cast<std::uint32_t>(r.name.size()));
    out.put_bytes(r.name.data(), r.name.size());
    out.put<std::uint8_t>(static_cast<std::uint8_t>(r.type));
    out.put<std::uint8_t>(static_cast<std::uint8_t>(r.shape.size()));
    out.put<std::uint16_t>(0);
    for (const auto d : r.shape) out.put<std::int64_t>(d);
    out.put<std::uint64_t>(r.payload.size());
    out.put_bytes(r.payload.data(), r.payload.size());
    fnv1a64 h;
    h.add(out.bytes.data() + begin, out.bytes.size() - begin);
    out.put<std::uint64_t>(h.h);
  }
  out.put_bytes(end_magic, 8);
  fnv1a64 h;
  h.add(out.bytes.data(), out.bytes.size());
  out.put<std::uint64_t>(h.h);
  return std::move(out.bytes);
}

// ---- reading ---------------------------------------------------------------------------------

/// One record of a parsed file; data points into the file's bytes.
struct parsed_record {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::int64_t> shape;
  const unsigned char* data = nullptr;
  std::size_t bytes = 0;
  std::size_t offset = 0; ///< of the record's first byte in the file
  bool taken = false;
};

/// Parses and validates a whole file: magic, version, every record's structure and checksum,
/// the trailer, the file checksum and the exact length. Throws value_error naming who, the file
/// and the first rule broken.
inline std::vector<parsed_record> parse(const std::string& who, const std::string& file,
                                        const std::vector<unsigned char>& bytes) {
  const auto fail = [&](const std::string& what) -> void {
    throw value_error(who + ": checkpoint '" + file + "' is refused: " + what);
  };
  std::size_t pos = 0;
  const auto need = [&](std::size_t n, const std::string& what) {
    if (bytes.size() - pos < n)
      fail("truncated: " + std::to_string(bytes.size()) + " bytes, but " + what + " at offset " +
           std::to_string(pos) + " needs " + std::to_string(n) + " more");
  };
  const auto get = [&]<class T>(T& v, const std::string& what) {
    need(sizeof(T), what);
    std::memcpy(&v, bytes.data() + pos, sizeof(T));
    pos += sizeof(T);
  };

  need(8, "the magic number");
  if (std::memcmp(bytes.data(), file_magic, 8) != 0)
    fail("the file does not start with the magic bytes \"TSSRCKPT\": not a tessera checkpoint");
  pos = 8;
  std::uint32_t version = 0, reserved = 0;
  std::uint64_t count = 0;
  get(version, "the format version");
  if (version != format_version)
    fail("unsupported checkpoint format version " + std::to_string(version) +
         " (this reader reads version " + std::to_string(format_version) +
         "; version 1 did not record the precision: save the checkpoint again)");
  get(reserved, "the header");
  if (reserved != 0) fail("the header's reserved field is " + std::to_string(reserved) + ", not 0");
  get(count, "the record count");

  std::vector<parsed_record> out;
  for (std::uint64_t k = 0; k < count; ++k) {
    const std::string at = "record " + std::to_string(k);
    parsed_record r;
    r.offset = pos;
    std::uint32_t name_len = 0;
    get(name_len, at + "'s name length");
    if (name_len == 0 || name_len > max_name_length)
      fail(at + " has a name length of " + std::to_string(name_len) + " (must be 1.." +
           std::to_string(max_name_length) + ")");
    need(name_len, at + "'s name");
    r.name.assign(reinterpret_cast<const char*>(bytes.data() + pos), name_len);
    pos += name_len;
    const std::string rec = at + " '" + r.name + "'";
    std::uint8_t type = 0, rank = 0;
    std::uint16_t pad = 0;
    get(type, rec + "'s element type");
    get(rank, rec + "'s rank");
    get(pad, rec + "'s header");
    r.type = static_cast<dtype>(type);
    if (dtype_size(r.type) == 0)
      fail(rec + " has an unknown element type code " + std::to_string(type));
    if (rank > max_rank)
      fail(rec + " has rank " + std::to_string(rank) + " (at most " + std::to_string(max_rank) +
           ")");
    if (pad != 0) fail(rec + "'s reserved field is not 0");
    std::uint64_t elements = 1;
    for (std::uint8_t d = 0; d < rank; ++d) {
      std::int64_t e = 0;
      get(e, rec + "'s shape");
      if (e < 0) fail(rec + " has a negative extent " + std::to_string(e));
      r.shape.push_back(e);
      // Bound the product by the file size so it cannot overflow.
      if (e != 0 && elements > bytes.size() / static_cast<std::uint64_t>(e))
        elements = bytes.size() + 1;
      else
        elements *= static_cast<std::uint64_t>(e);
    }
    std::uint64_t len = 0;
    get(len, rec + "'s byte length");
    if (elements > bytes.size() || len != elements * dtype_size(r.type))
      fail(rec + " of shape " + shape_text(r.shape) + " and type " + dtype_name(r.type) +
           " declares " + std::to_string(len) + " payload bytes; the shape needs " +
           (elements > bytes.size() ? std::string("more than the file holds")
                                    : std::to_string(elements * dtype_size(r.type))));
    need(len, rec + "'s payload");
    r.data = bytes.data() + pos;
    r.bytes = static_cast<std::size_t>(len);
    pos += r.bytes;
    fnv1a64 h;
    h.add(bytes.data() + r.offset, pos - r.offset);
    std::uint64_t stored = 0;
    get(stored, rec + "'s checksum");
    if (stored != h.h) fail(rec + ": checksum mismatch (the record is corrupted)");
    for (const auto& o : out)
      if (o.name == r.name) fail(rec + " appears twice");
    out.push_back(std::move(r));
  }
  need(8, "the end marker");
  if (std::memcmp(bytes.data() + pos, end_magic, 8) != 0)
    fail("no end marker after the " + std::to_string(count) + " records the header announces");
  pos += 8;
  fnv1a64 h;
  h.add(bytes.data(), pos);
  std::uint64_t stored = 0;
  get(stored, "the file checksum");
  if (stored != h.h) fail("file checksum mismatch (the header or the trailer is corrupted)");
  if (pos != bytes.size())
    fail(std::to_string(bytes.size() - pos) + " unexpected bytes after the end of the checkpoint");
  return out;
}

/// The whole file. Throws value_error naming who and the file if it cannot be opened or read,
/// or is not a regular file (a directory, a device). The size comes from fstat, so a file
/// never makes the reader allocate more than it holds.
inline std::vector<unsigned char> read_file(const std::string& who,
                                            const std::filesystem::path& path) {
  const auto fail = [&](const std::string& what, int err) {
    throw value_error(who + ": cannot read checkpoint '" + path.string() + "': " + what +
                      (err ? std::string(": ") + std::strerror(err) : std::string()));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open it", errno);
  struct fd_closer {
    int fd;
    ~fd_closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("fstat failed", errno);
  if (S_ISDIR(st.st_mode)) fail("it is a directory, not a checkpoint file", 0);
  if (!S_ISREG(st.st_mode)) fail("it is not a regular file", 0);
  std::vector<unsigned char> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("reading failed after " + std::to_string(done) + " bytes", errno);
    if (r == 0) break; // shrank while being read: the parser refuses what is there
    done += static_cast<std::size_t>(r);
  }
  bytes.resize(done);
  return bytes;
}

/// Checks that a checkpoint can be written at `path` (as write_file_atomically will): `path` is
/// not a directory and a file can be created in its directory (a temporary one, removed at
/// once). Throws value_error naming who, the file and the reason.
inline void check_writable(const std::string& who, const std::filesystem::path& path) {
  const auto fail = [&](const std::string& what, int err) {
    throw value_error(who + ": cannot write checkpoint '" + path.string() + "': " + what +
                      (err ? std::string(": ") + std::strerror(err) : std::string()));
  };
  if (path.filename().empty()) fail("the path names no file", 0);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("it is a directory", 0);
  const std::filesystem::path dir =
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  if (!std::filesystem::is_directory(dir, ec))
    fail("its directory '" + dir.string() + "' does not exist", 0);
  std::random_device rd;
  std::string name(1, '.');
  name += path.filename().string();
  name += ".probe.";
  name += std::to_string(::getpid());
  name += '.';
  name += std::to_string(rd());
  const std::filesystem::path probe = dir / name;
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot create a file in '" + dir.string() + "'", errno);
  ::close(fd);
  ::unlink(probe.c_str());
}

/// Replaces `path` with `bytes` atomically: writes a new file in the same directory, fsyncs it,
/// renames it over `path` and fsyncs the directory. On any failure the temporary file is
/// removed, `path` is untouched and value_error names who, the file and the system error.
/// POSIX only.
inline void write_file_atomically(const std::string& who, const std::filesystem::path& path,
                                  const std::vector<unsigned char>& bytes) {
  const auto fail = [&](const std::string& what, int err) {
    throw value_error(who + ": cannot write checkpoint '" + path.string() + "': " + what + ": " +
                      std::strerror(err));
  };
  if (path.filename().empty()) fail("the path names no file", EINVAL);
  {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail("it is a directory", EISDIR);
  }
  const std::filesystem::path dir =
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  // A fresh name in the same directory (rename is atomic only within one file system); O_EXCL
  // never reuses an existing file. The suffix is random rather than a process-wide counter (no
  // global state); collisions are retried.
  std::random_device rd;
  std::filesystem::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on "." + string&&.
    std::string name(1, '.');
    name += path.filename().string();
    name += ".tmp.";
    name += std::to_string(::getpid());
    name += '.';
    name += std::to_string(rd());
    tmp = dir / name;
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) fail("cannot create a temporary file in '" + dir.string() + "'", errno);
  const auto abandon = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(what, err);
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      abandon("writing " + tmp.string() + " failed after " + std::to_string(done) + " of " +
                  std::to_string(bytes.size()) + " bytes",
              errno);
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) abandon("fsync of " + tmp.string() + " failed", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("closing " + tmp.string() + " failed", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("renaming " + tmp.string() + " over it failed", err);
  }
  // Make the rename itself durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    fail("the checkpoint was replaced but its directory could not be opened to sync it", errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) fail("the checkpoint was replaced but fsync of its directory failed", err);
}

} // namespace tessera::train::detail::ckpt
