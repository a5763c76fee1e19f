// Fuzz target: tessera/data/idx.hpp. The same bytes go through both readers, from memory
// (read_idx_bytes, tessera's own inflate loop) and from a file (read_idx, zlib's gzread), which
// must agree: both refuse (tessera::value_error, nothing else), or both return the same array.
// An accepted array must be consistent with its header: rank 1..4, every dimension >= 1, data
// of exactly the product of the dimensions and, for plain (not gzip) input, exactly the bytes
// after the header.
#include "fuzz_support.hpp"

#include <tessera/data/idx.hpp>

#include <cstring>
#include <optional>

namespace {

std::optional<tessera::data::idx_array> try_read(auto&& read) {
  try {
    return read();
  } catch (const tessera::value_error&) {
    return std::nullopt;
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using tessera::data::idx_array;
  static const tessera::fuzz::scratch_file file("idx");
  const auto mem = try_read([&] { return tessera::data::read_idx_bytes(data, size, "fuzz"); });
  const auto& path = file.write(data, size);
  const auto disk = try_read([&] { return tessera::data::read_idx(path.string()); });
  TESSERA_FUZZ_CHECK(mem.has_value() == disk.has_value(),
                     "read_idx_bytes %s but read_idx %s the same %zu bytes",
                     mem ? "accepts" : "refuses", disk ? "accepts" : "refuses", size);
  if (!mem) return 0;
  TESSERA_FUZZ_CHECK(mem->dims == disk->dims && mem->data == disk->data,
                     "the two readers return different arrays");
  const idx_array& a = *mem;
  TESSERA_FUZZ_CHECK(a.dims.size() >= 1 && a.dims.size() <= 4, "rank %zu", a.dims.size());
  std::uint64_t product = 1;
  for (const auto d : a.dims) {
    TESSERA_FUZZ_CHECK(d >= 1 && d <= 0xFFFFFFFFll, "dimension %lld", static_cast<long long>(d));
    product *= static_cast<std::uint64_t>(d); // cannot overflow: bounded by the data present
  }
  TESSERA_FUZZ_CHECK(product == a.data.size(), "%zu elements for a dims product of %llu",
                     a.data.size(), static_cast<unsigned long long>(product));
  TESSERA_FUZZ_CHECK(a.size() == static_cast<std::int64_t>(product), "size() disagrees");
  const bool gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!gz) {
    const std::size_t header = 4 + 4 * a.dims.size();
    TESSERA_FUZZ_CHECK(size == header + a.data.size() &&
                           std::memcmp(data + header, a.data.data(), a.data.size()) == 0,
                       "a plain file of %zu bytes gave %zu elements after a %zu-byte header", size,
                       a.data.size(), header);
  }
  return 0;
}
