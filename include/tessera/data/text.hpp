#pragma once
/// \file data/text.hpp
/// Character-level text data for language models: a corpus read from a directory of plain-text
/// files, its character (byte) vocabulary, the train / validation split, and a seeded sampler of
/// training contexts that a few lines of Python reproduce bit for bit
/// (benchmarks/gpt/torch_char_gpt.py does).
///
///   auto corpus = tessera::data::read_text_directory("/usr/share/games/fortunes");
///   tessera::data::char_vocab vocab(corpus.bytes);            // 114 characters for fortunes
///   auto split = tessera::data::split_text(vocab.encode(corpus.bytes), 128);
///   tessera::data::context_sampler sampler(split.train.size(), 128, seed);
///   sampler.start(step, i);   // first index of context i of batch `step` (T + 1 ids)
///
/// ## Rules
/// - Corpus: every regular file directly in the directory whose name has no '.' (no extension:
///   skips fortune's *.dat indexes and *.u8 links), not following symbolic links (a link is
///   skipped, whatever it points to) and not descending into subdirectories; read in ascending
///   byte order of the names and concatenated as bytes.
/// - Vocabulary: the distinct bytes of the corpus in ascending order; id k is the k-th of them.
/// - Split: train = the first floor(0.9 n) ids, validation = the rest (n ids in all).
/// - Sampler: context i (0-based) of step s (0-based) starts at counter_rng{seed, s}.bits(i) mod
///   (m - T), m the train split's length, T the context: T + 1 ids, the inputs and the targets
///   shifted by one. counter_rng (tensor/random.hpp) is SplitMix64's finaliser of
///   mix(seed ^ s * 0x9e3779b97f4a7c15) + i * 0x9e3779b97f4a7c15, all mod 2^64. The modulo's bias
///   is below (m - T) / 2^64 (about 1e-13 for fortunes).
/// - Validation contexts: `count` contexts at the offsets floor(j (v - T - 1) / (count - 1)),
///   j = 0 .. count - 1 (v the validation split's length; offset 0 alone when count is 1).
///
/// Everything here is host memory (std::string, std::vector): to feed ids to a model whose
/// inputs live in a device memory space, fill a Kokkos::create_mirror_view of the input View
/// and Kokkos::deep_copy it (examples/train_char_gpt.cpp's batch_views), or for a tensor
/// tessera::host_mirror and copy_from_host (tensor/host_mirror.hpp).
///
/// Errors (tessera::value_error naming the directory, the file or the sizes): a missing path, a
/// path that is not a directory, an unreadable file, a corpus with no matching file or no byte,
/// a split shorter than one context of T + 1 ids, ids outside the vocabulary, a sampler over a
/// train split no longer than the context.

#include <tessera/config/error.hpp>
#include <tessera/tensor/random.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace tessera::data {

/// The concatenated bytes of a directory's text files and the files' names, in reading order.
struct text_corpus {
  std::vector<std::uint8_t> bytes;
  std::vector<std::string> files;
};

/// Reads the corpus of `dir` by the rule in the file comment. Throws value_error for a missing
/// path, a path that is not a directory, an unreadable file, or no bytes at all.
inline text_corpus read_text_directory(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const std::string who = "tessera::data::read_text_directory";
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (ec || !fs::exists(st))
    throw value_error(who + ": '" + dir.string() + "' does not exist (for the fortunes corpus: " +
                      "apt-get install fortunes, or scripts/bootstrap.sh)");
  if (!fs::is_directory(st)) throw value_error(who + ": '" + dir.string() + "' is not a directory");
  std::vector<std::string> names;
  fs::directory_iterator it(dir, ec);
  if (ec) throw value_error(who + ": cannot list '" + dir.string() + "': " + ec.message());
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (name.find('.') != std::string::npos) continue;
    std::error_code e2;
    if (e.is_symlink(e2) || !e.is_regular_file(e2)) continue;
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  text_corpus c;
  for (const auto& n : names) {
    const fs::path p = dir / n;
    std::ifstream in(p, std::ios::binary);
    if (!in) throw value_error(who + ": cannot open '" + p.string() + "'");
    c.bytes.insert(c.bytes.end(), std::istreambuf_iterator<char>(in),
                   std::istreambuf_iterator<char>());
    if (in.bad()) throw value_error(who + ": error reading '" + p.string() + "'");
    c.files.push_back(n);
  }
  if (c.bytes.empty())
    throw value_error(who + ": the corpus in '" + dir.string() + "' is empty (" +
                      std::to_string(names.size()) +
                      " regular files without an extension, 0 bytes in all)");
  return c;
}

/// The character vocabulary of a byte string: its distinct bytes in ascending order.
class char_vocab {
public:
  /// Throws value_error for empty text.
  explicit char_vocab(std::span<const std::uint8_t> text) {
    if (text.empty()) throw value_error("tessera::data::char_vocab: the text is empty");
    std::array<bool, 256> seen{};
    for (auto b : text) seen[b] = true;
    id_.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (seen[static_cast<std::size_t>(b)]) {
        id_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(chars_.size());
        chars_.push_back(static_cast<std::uint8_t>(b));
      }
  }

  /// Number of characters (1..256).
  std::int32_t size() const noexcept { return static_cast<std::int32_t>(chars_.size()); }
  /// The characters, ascending; chars()[id] is the byte of id.
  const std::vector<std::uint8_t>& chars() const noexcept { return chars_; }

  /// The id of every byte; throws value_error naming the byte and its position if one is not in
  /// the vocabulary.
  std::vector<std::int32_t> encode(std::span<const std::uint8_t> text) const {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      const std::int32_t id = id_[text[i]];
      if (id < 0)
        throw value_error("tessera::data::char_vocab::encode: byte " + std::to_string(text[i]) +
                          " at position " + std::to_string(i) + " is not in the vocabulary");
      ids[i] = id;
    }
    return ids;
  }
  std::vector<std::int32_t> encode(const std::string& text) const {
    return encode(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()),
                                                text.size()));
  }

  /// The bytes of ids; throws value_error naming an id outside [0, size()).
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string s(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= size())
        throw value_error("tessera::data::char_vocab::decode: id " + std::to_string(ids[i]) +
                          " at position " + std::to_string(i) + " is outside [0, " +
                          std::to_string(size()) + ")");
      s[i] = static_cast<char>(chars_[static_cast<std::size_t>(ids[i])]);
    }
    return s;
  }

private:
  std::array<std::int32_t, 256> id_{};
  std::vector<std::uint8_t> chars_;
};

/// The train and validation ids.
struct text_split {
  std::vector<std::int32_t> train, val;
};

/// train = the first floor(0.9 n) ids, val = the rest. Throws value_error unless both hold at
/// least one context of context + 1 ids (naming n, the two lengths and the context).
inline text_split split_text(std::span<const std::int32_t> ids, std::int64_t context) {
  const std::int64_t n = static_cast<std::int64_t>(ids.size());
  if (context < 1)
    throw value_error("tessera::data::split_text: context must be >= 1, got " +
                      std::to_string(context));
  const std::int64_t cut = n / 10 * 9 + (n % 10) * 9 / 10; // floor(0.9 n) without overflow
  if (cut < context + 1 || n - cut < context + 1)
    throw value_error(
        "tessera::data::split_text: the corpus of " + std::to_string(n) +
        " characters splits into " + std::to_string(cut) + " for training and " +
        std::to_string(n - cut) + " for validation; each needs at least one context of " +
        std::to_string(context + 1) + " (context " + std::to_string(context) + " + 1) characters");
  text_split s;
  s.train.assign(ids.begin(), ids.begin() + cut);
  s.val.assign(ids.begin() + cut, ids.end());
  return s;
}

/// The seeded sampler of training contexts (rule in the file comment). A value type: the
/// contexts of a step are a pure function of (seed, step, i), so resuming at step s needs only s.
class context_sampler {
public:
  /// Throws value_error unless length > context >= 1.
  context_sampler(std::int64_t length, std::int64_t context, std::uint64_t seed)
      : length_(length), context_(context), seed_(seed) {
    if (context < 1 || length <= context)
      throw value_error("tessera::data::context_sampler: a train split of " +
                        std::to_string(length) + " ids is shorter than one context of " +
                        std::to_string(context + 1) + " (context " + std::to_string(context) +
                        " + 1)");
  }

  std::int64_t context() const noexcept { return context_; }
  std::uint64_t seed() const noexcept { return seed_; }

  /// First index of context i of step `step`, in [0, length - context - 1].
  std::int64_t start(std::uint64_t step, std::uint64_t i) const noexcept {
    const std::uint64_t range = static_cast<std::uint64_t>(length_ - context_);
    return static_cast<std::int64_t>(counter_rng{seed_, step}.bits(i) % range);
  }

  /// The batch of step `step`: batch rows of context + 1 ids each, row-major, from `ids` (the
  /// train split the sampler was made for; value_error if its length differs).
  std::vector<std::int32_t> batch(std::span<const std::int32_t> ids, std::uint64_t step,
                                  std::int64_t batch) const {
    if (static_cast<std::int64_t>(ids.size()) != length_)
      throw value_error("tessera::data::context_sampler::batch: ids has " +
                        std::to_string(ids.size()) + " elements, the sampler was made for " +
                        std::to_string(length_));
    if (batch < 1)
      throw value_error("tessera::data::context_sampler::batch: batch must be >= 1, got " +
                        std::to_string(batch));
    const std::size_t row = static_cast<std::size_t>(context_ + 1);
    std::vector<std::int32_t> out(static_cast<std::size_t>(batch) * row);
    for (std::int64_t i = 0; i < batch; ++i) {
      const auto s = static_cast<std::size_t>(start(step, static_cast<std::uint64_t>(i)));
      std::copy_n(ids.begin() + static_cast<std::ptrdiff_t>(s), row,
                  out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * row));
    }
    return out;
  }

private:
  std::int64_t length_, context_;
  std::uint64_t seed_;
};

/// The first indices of `count` validation contexts of context + 1 ids, evenly spaced over a
/// split of `length` ids (rule in the file comment). Throws value_error unless count >= 1 and
/// length >= context + 1.
inline std::vector<std::int64_t> eval_offsets(std::int64_t length, std::int64_t context,
                                              std::int64_t count) {
  if (count < 1 || context < 1 || length < context + 1)
    throw value_error("tessera::data::eval_offsets: need count >= 1 and a split of at least "
                      "context + 1 ids, got count " +
                      std::to_string(count) + ", length " + std::to_string(length) + ", context " +
                      std::to_string(context));
  std::vector<std::int64_t> out(static_cast<std::size_t>(count));
  const std::int64_t last = length - context - 1;
  for (std::int64_t j = 0; j < count; ++j)
    out[static_cast<std::size_t>(j)] = count == 1 ? 0 : j * last / (count - 1);
  return out;
}

} // namespace tessera::data
