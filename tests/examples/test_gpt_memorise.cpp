// The character GPT of examples/train_char_gpt.cpp (examples/char_gpt_model.hpp), built tiny
// (width 32, 2 heads, one block), memorises one short sentence: trained with AdamW on that
// sentence as its only context, the mean cross-entropy falls below 0.05 nats per character,
// and greedy decoding with the attention's key/value caches from the first character
// reproduces the whole sentence. The decoding path (one position at a time, the cache holding
// the past) is independent of the training forward (all positions at once, causal mask): a
// model that looks ahead during training (a broken mask) reaches a low loss but decodes
// garbage; a broken optimizer never gets near the bound. Also: the cached decode's logits
// equal the full forward's at every position, and the model with two blocks trains too (its
// parameters are a run-time list: each block's weights must move).
#include "char_gpt_model.hpp"

#include <tessera/nn.hpp>
#include <tessera/train.hpp>

#include <boost/hana/for_each.hpp>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace {

namespace nn = tessera::nn;
namespace train = tessera::train;
using tessera::index_t;

constexpr index_t V = 32, D = 32, H = 2, T = 64;
using model_type = chargpt::char_gpt<tessera::fp32, V, D, H, T>;
using exec_space = Kokkos::DefaultExecutionSpace;

const std::string sentence = "the quick brown fox jumps over the lazy dog";

/// The sentence's characters, sorted, as the vocabulary (ids 0..n-1 < V).
struct vocab {
  std::string chars;
  explicit vocab(const std::string& s) : chars(s) {
    std::sort(chars.begin(), chars.end());
    chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
  }
  std::int32_t id(char c) const { return static_cast<std::int32_t>(chars.find(c)); }
};

struct memorised {
  double first_loss = 0, last_loss = 0;
};

/// Trains `model` on the sentence (inputs s[0..n-1), targets s[1..n)) for `steps` AdamW steps.
memorised train_on_sentence(model_type& model, const vocab& voc, int steps) {
  const exec_space exec;
  const index_t t = static_cast<index_t>(sentence.size()) - 1;
  Kokkos::View<std::int32_t**> x("x", 1, t), y("y", 1, t);
  const auto hx = Kokkos::create_mirror_view(x);
  const auto hy = Kokkos::create_mirror_view(y);
  for (index_t j = 0; j < t; ++j) {
    hx(0, j) = voc.id(sentence[static_cast<std::size_t>(j)]);
    hy(0, j) = voc.id(sentence[static_cast<std::size_t>(j) + 1]);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  const auto params = model.parameters();
  nn::SoftmaxCrossEntropy loss;
  train::adamw opt{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.f};
  train::static_scaler scaler{};
  memorised r;
  for (int s = 0; s < steps; ++s) {
    const auto logits = model.forward(exec, x);
    const auto [l, dlogits] = loss.forward_backward(exec, logits, y, scaler.scale());
    model.backward(exec, dlogits);
    REQUIRE(train::step(exec, opt, scaler, params));
    if (s == 0) r.first_loss = static_cast<double>(l);
    r.last_loss = static_cast<double>(l);
  }
  // the loss after the last step
  r.last_loss = static_cast<double>(loss.forward(exec, model.forward(exec, x), y));
  return r;
}

/// Greedy decoding with the key/value caches from the sentence's first character: argmax of
/// the logits (over the vocabulary's ids) at each new position.
std::string greedy(model_type& model, const vocab& voc, std::size_t n) {
  const exec_space exec;
  chargpt::generator<model_type, exec_space> gen(model, exec);
  std::vector<std::int32_t> ids{voc.id(sentence[0])};
  auto logits = gen.feed(ids, 0, 1, true);
  while (ids.size() < n) {
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, logits.kokkos_view());
    std::int32_t best = 0;
    for (std::int32_t c = 1; c < static_cast<std::int32_t>(voc.chars.size()); ++c)
      if (h(static_cast<std::size_t>(c)) > h(static_cast<std::size_t>(best))) best = c;
    ids.push_back(best);
    if (ids.size() < n) logits = gen.feed(ids, ids.size() - 1, 1, false);
  }
  std::string s;
  for (const auto id : ids) s += voc.chars[static_cast<std::size_t>(id)];
  return s;
}

} // namespace

TEST_CASE("char GPT: a tiny model memorises a sentence and decodes it back with the KV cache",
          "[examples][gpt]") {
  const vocab voc(sentence);
  REQUIRE(voc.chars.size() <= static_cast<std::size_t>(V));
  const index_t t = static_cast<index_t>(sentence.size()) - 1;
  model_type model(/*seed=*/3, /*layers=*/1, t);
  const auto r = train_on_sentence(model, voc, 150);
  INFO("loss " << r.first_loss << " -> " << r.last_loss);
  // Starts near ln(V) (an untrained model), ends near zero.
  CHECK(r.first_loss > 0.7 * std::log(static_cast<double>(V)));
  CHECK(r.last_loss < 0.05);
  CHECK(greedy(model, voc, sentence.size()) == sentence);
}

TEST_CASE("char GPT: the cached decode gives the full forward's logits at every position",
          "[examples][gpt]") {
  const exec_space exec;
  const vocab voc(sentence);
  const index_t t = static_cast<index_t>(sentence.size());
  model_type model(/*seed=*/5, /*layers=*/2, t);
  std::vector<std::int32_t> ids;
  Kokkos::View<std::int32_t**> x("x", 1, t);
  const auto hx = Kokkos::create_mirror_view(x);
  for (index_t j = 0; j < t; ++j) {
    ids.push_back(voc.id(sentence[static_cast<std::size_t>(j)]));
    hx(0, j) = ids.back();
  }
  Kokkos::deep_copy(x, hx);
  const auto full = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{},
                                                        model.forward(exec, x).kokkos_view());
  chargpt::generator<model_type, exec_space> gen(model, exec);
  // the first 5 positions as one prompt, then one at a time
  std::size_t done = 0;
  double worst = 0;
  while (done < ids.size()) {
    const std::size_t n = done == 0 ? 5 : 1;
    const auto l = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace{}, gen.feed(ids, done, n, done == 0).kokkos_view());
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t c = 0; c < static_cast<std::size_t>(V); ++c)
        worst = std::max(worst, std::abs(static_cast<double>(l(j * V + c)) -
                                         static_cast<double>(full((done + j) * V + c))));
    done += n;
  }
  CHECK(gen.length() == t);
  CHECK(worst < 1e-4);
}

/// The first element of every parameter, walking the model's layers themselves (not
/// parameters(), whose run-time block list is what is under test).
std::vector<float> first_elements(const model_type& m) {
  std::vector<float> w;
  const auto add = [&](const auto& layer) {
    boost::hana::for_each(layer.parameters(), [&](const auto& p) {
      const auto h =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, p.value.kokkos_view());
      w.push_back(h.data()[0]);
    });
  };
  add(m.tok);
  add(m.pos);
  for (std::size_t b = 0; b < m.layers(); ++b) {
    add(m.attn[b]);
    add(m.mlp[b]);
  }
  add(m.ln_f);
  add(m.head);
  return w;
}

TEST_CASE("char GPT: every block of a two-block model trains", "[examples][gpt]") {
  const vocab voc(sentence);
  model_type model(/*seed=*/7, /*layers=*/2, static_cast<index_t>(sentence.size()) - 1);
  const auto before = first_elements(model);
  // tok, pos, 2 x (LN 2 + attention 4 + LN 2 + MLP 4), LN_f 2, lm_head 2
  REQUIRE(before.size() == 1 + 1 + 2 * 12 + 2 + 2);
  const auto r = train_on_sentence(model, voc, 150);
  INFO("loss " << r.first_loss << " -> " << r.last_loss);
  CHECK(r.last_loss < 0.1);
  const auto after = first_elements(model);
  REQUIRE(after.size() == before.size());
  std::size_t unchanged = 0;
  for (std::size_t k = 0; k < after.size(); ++k) {
    if (after[k] == before[k]) {
      UNSCOPED_INFO("parameter " << k << " unchanged");
      ++unchanged;
    }
  }
  CHECK(unchanged == 0);
  // parameters() lists the same tensors in the same order, with unique names
  std::vector<std::string> names;
  std::size_t k = 0;
  train::for_each_parameter(model.parameters(), [&](const auto& p, std::size_t i) {
    CHECK(i == k++);
    names.push_back(p.name);
  });
  CHECK(names.size() == before.size());
  CHECK(names[0] == "tok.weight");
  CHECK(names[1] == "0.weight");
  CHECK(names.back() == "6.bias"); // lm_head: layer 2 + 2 * 2
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
}
