#pragma once
// The character GPT of examples/train_char_gpt.cpp (nanoGPT's shape), shared with its test
// tests/examples/test_gpt_memorise.cpp:
//
//   x = tok_emb[ids] + pos_emb[0..t)                                    (B, t, D)
//   block: x = x + Attn(LN1(x)); x = x + MLP(LN2(x)), MLP = Linear(D, 4D) GELU Linear(4D, D)
//   logits = Linear(D, V)(LN_f(x))  (lm_head with bias, not tied to tok_emb)
//
// Compile-time: the precision P of the Linear layers, the vocabulary bound V, the width D, the
// heads H and the context bound T. Run time: the number of blocks (a std::vector of identical
// block objects) and the context t <= T the model is trained and sampled with.
//
// Initialisation and parameter names are those of the single nn::Sequential this model used to
// be: layer i of [pos, attn_0, mlp_0, ..., attn_{L-1}, mlp_{L-1}, LN_f, lm_head] is seeded by
// counter_rng{seed, i}.bits(0) and its parameters are named "<i>.<name>"; the token table is
// "tok.weight" from stream 1000. parameters() returns a Hana tuple whose middle element is a
// std::vector of the blocks' parameter tuples (a parameter sequence of run-time length, which
// tessera's optimizers, scalers and checkpoints walk: train/detail/optimizer_state.hpp).
#include <tessera/nn.hpp>

#include <boost/hana/concat.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>

#include <cstddef>
#include <cstdint>
#include <ratio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace chargpt {

using tessera::index_t;

/// The norms write their output in the activation precision of the layer after them (bf16
/// for bf16 and fp8, fp32 for fp32): the residual stream stays fp32 and the next GEMM reads the
/// rounded copy without a cast pass of its own.
template <index_t D, class P>
using layer_norm = tessera::nn::LayerNorm<D, std::ratio<1, 100000>, tessera::nn::activation_t<P>>;
template <index_t D, index_t H, class P>
using attn_block =
    tessera::nn::Residual<layer_norm<D, P>, tessera::nn::CausalSelfAttention<D, H, P>>;
template <index_t D, class P>
using mlp_block = tessera::nn::Residual<layer_norm<D, P>, tessera::nn::Linear<D, 4 * D, P>,
                                        tessera::nn::GELU, tessera::nn::Linear<4 * D, D, P>>;

/// The parameters of `layer` renamed "<index>.<name>".
template <class Layer>
auto numbered_parameters(const Layer& layer, std::size_t index) {
  const std::string prefix = std::to_string(index) + ".";
  return boost::hana::transform(layer.parameters(), [&](auto p) {
    p.name = prefix + p.name;
    return p;
  });
}

template <class P, index_t V, index_t D, index_t H, index_t T>
class char_gpt {
public:
  using attn_type = attn_block<D, H, P>;
  using mlp_type = mlp_block<D, P>;
  static constexpr index_t vocab_bound = V, width = D, heads = H, max_context = T;

  /// `layers` blocks (>= 1), trained on contexts of `context` characters (1..T).
  char_gpt(std::uint64_t seed, std::size_t layers, index_t context)
      : tok(tessera::counter_rng{seed, 1000}.bits(0)), pos(stream(seed, 0)),
        ln_f(stream(seed, 1 + 2 * layers)), head(stream(seed, 2 + 2 * layers)), context_(context) {
    if (layers < 1)
      throw tessera::value_error("chargpt::char_gpt: the model needs at least one block");
    if (context < 1 || context > T)
      throw tessera::value_error("chargpt::char_gpt: context " + std::to_string(context) +
                                 " is not in 1.." + std::to_string(T) +
                                 " (the compiled context bound)");
    attn.reserve(layers);
    mlp.reserve(layers);
    for (std::size_t b = 0; b < layers; ++b) {
      attn.emplace_back(stream(seed, 1 + 2 * b));
      mlp.emplace_back(stream(seed, 2 + 2 * b));
    }
  }

  std::size_t layers() const noexcept { return attn.size(); }
  index_t context() const noexcept { return context_; }

  /// "tok.weight", "0.weight" (positions), the blocks' "<i>.<name>", LN_f's and lm_head's.
  auto parameters() const {
    using block_params = decltype(block_parameters(0));
    std::vector<block_params> blocks;
    blocks.reserve(layers());
    for (std::size_t b = 0; b < layers(); ++b) blocks.push_back(block_parameters(b));
    auto t = boost::hana::transform(tok.parameters(), [](auto p) {
      p.name = "tok." + p.name;
      return p;
    });
    return boost::hana::make_tuple(t, numbered_parameters(pos, 0), std::move(blocks),
                                   numbered_parameters(ln_f, 1 + 2 * layers()),
                                   numbered_parameters(head, 2 + 2 * layers()));
  }
  /// The fp8 scaling states (empty tuples unless P is fp8): block by block, then lm_head's.
  auto fp8_states() {
    using block_states = decltype(boost::hana::concat(std::declval<attn_type&>().fp8_states(),
                                                      std::declval<mlp_type&>().fp8_states()));
    std::vector<block_states> blocks;
    for (std::size_t b = 0; b < layers(); ++b)
      blocks.push_back(boost::hana::concat(attn[b].fp8_states(), mlp[b].fp8_states()));
    return boost::hana::make_tuple(std::move(blocks), head.fp8_states());
  }

  /// Logits (B, t, V) of ids (B, t), t <= T.
  template <class Exec, class Ids>
  auto forward(const Exec& exec, const Ids& ids) {
    auto x = pos.forward(exec, tok.forward(exec, ids));
    for (std::size_t b = 0; b < layers(); ++b) {
      x = attn[b].forward(exec, x);
      x = mlp[b].forward(exec, x);
    }
    return head.forward(exec, ln_f.forward(exec, x));
  }
  /// Writes every parameter's gradient from dL/dlogits of the last forward.
  template <class Exec, class DY>
  void backward(const Exec& exec, const DY& dlogits) {
    auto dx = ln_f.backward(exec, head.backward(exec, dlogits, true), true);
    for (std::size_t b = layers(); b-- > 0;) {
      dx = mlp[b].backward(exec, dx, true);
      dx = attn[b].backward(exec, dx, true);
    }
    tok.backward(exec, pos.backward(exec, dx, true));
  }

  tessera::nn::Embedding<V, D> tok;
  tessera::nn::PositionEmbedding<T, D> pos;
  std::vector<attn_type> attn;
  std::vector<mlp_type> mlp;
  layer_norm<D, P> ln_f;
  tessera::nn::Linear<D, V, P> head;

private:
  static std::uint64_t stream(std::uint64_t seed, std::size_t i) {
    return tessera::counter_rng{seed, i}.bits(0);
  }
  auto block_parameters(std::size_t b) const {
    return boost::hana::concat(numbered_parameters(attn[b], 1 + 2 * b),
                               numbered_parameters(mlp[b], 2 + 2 * b));
  }

  index_t context_;
};

/// Generation with the attention's key/value caches: feed(ids, first, n, restart) runs
/// positions first .. first + n - 1 (ids already in `ids`) through the blocks, each attention
/// appending to its cache, and returns the logits (1, n, V). One new character costs one
/// position's work (projections, MLP, lm_head) plus attention over the cached positions: linear
/// in the context.
template <class Model, class Exec>
class generator {
public:
  static constexpr index_t D = Model::width;
  using attn_type =
      std::remove_cvref_t<decltype(std::declval<typename Model::attn_type&>().template layer<1>())>;

  generator(Model& m, const Exec& exec) : m_(m), exec_(exec) {
    for (std::size_t b = 0; b < m.layers(); ++b) caches_.emplace_back(1, m.context());
  }

  /// ids[first .. first + n) at positions 0 .. n - 1 of fresh caches (a restart), or at the
  /// positions after the cached ones.
  template <class Ids>
  auto feed(const Ids& ids, std::size_t first, std::size_t n, bool restart) {
    if (restart)
      for (auto& c : caches_) c.reset();
    const index_t p0 = caches_[0].length();
    x_type x("gen.x", 1, static_cast<index_t>(n));
    {
      const auto tok = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{},
                                                           m_.tok.weight().value.kokkos_view());
      const auto pos = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{},
                                                           m_.pos.weight().value.kokkos_view());
      const auto hx = Kokkos::create_mirror_view(x.kokkos_view());
      for (std::size_t j = 0; j < n; ++j)
        for (index_t d = 0; d < D; ++d)
          hx(j * D + static_cast<std::size_t>(d)) =
              tok(static_cast<std::size_t>(ids[first + j]) * D + static_cast<std::size_t>(d)) +
              pos(static_cast<std::size_t>(p0 + static_cast<index_t>(j)) * D +
                  static_cast<std::size_t>(d));
      Kokkos::deep_copy(x.kokkos_view(), hx);
    }
    for (std::size_t b = 0; b < m_.layers(); ++b) {
      auto& ar = m_.attn[b];
      const auto h = ar.template layer<0>().forward(exec_, x);
      const auto a = ar.template layer<1>().decode(exec_, h, caches_[b]);
      const x_type x1 = add(x, a);
      x = widen(m_.mlp[b].forward(exec_, x1)); // the MLP residual returns x1 + f(x1)
    }
    return m_.head.forward(exec_, m_.ln_f.forward(exec_, x));
  }
  index_t length() const { return caches_[0].length(); }

private:
  using x_type = tessera::Tensor<tessera::fp32, tessera::extents<tessera::dyn, tessera::dyn, D>>;

  /// x + a (a in any precision), in fp32.
  template <class A>
  x_type add(const x_type& x, const A& a) {
    x_type y("gen.residual", x.extent(0), x.extent(1));
    float* py = y.data();
    const float* px = x.data();
    const auto* pa = a.data();
    Kokkos::parallel_for(
        "chargpt::generator::residual",
        Kokkos::RangePolicy<Exec>(exec_, 0, static_cast<index_t>(y.size())),
        KOKKOS_LAMBDA(const index_t i) { py[i] = px[i] + tessera::to_float(pa[i]); });
    exec_.fence();
    return y;
  }
  /// y in fp32 (a copy, so that the next block's forward does not overwrite it).
  template <class Y>
  x_type widen(const Y& y) {
    x_type out("gen.widen", y.extent(0), y.extent(1));
    float* po = out.data();
    const auto* py = y.data();
    Kokkos::parallel_for(
        "chargpt::generator::widen",
        Kokkos::RangePolicy<Exec>(exec_, 0, static_cast<index_t>(out.size())),
        KOKKOS_LAMBDA(const index_t i) { po[i] = tessera::to_float(py[i]); });
    exec_.fence();
    return out;
  }

  Model& m_;
  const Exec& exec_;
  std::vector<typename attn_type::cache> caches_;
};

} // namespace chargpt
