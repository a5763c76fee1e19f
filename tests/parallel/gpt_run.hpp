#pragma once
// The tiny character GPT of test_mpi_plans_gpt*.cpp in any precision: the plan model, the
// single-process reference (the example's composition, nn::Embedding in front of a Sequential)
// and the check of a plan against it. See test_mpi_plans_gpt.cpp for what is compared and why.
#include "plan_check.hpp"

#include <tessera/nn/embedding.hpp>
#include <tessera/parallel/fp8_sync.hpp>

#include <boost/hana/concat.hpp>

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <ratio>
#include <string>
#include <vector>

namespace tessera_test::gpt {

constexpr tessera::index_t V = 13, D = 8, H = 2, T = 6;

/// The norms write the activation precision of the layer after them, as the example's do.
template <class P>
using layer_norm = nn::LayerNorm<D, std::ratio<1, 100000>, nn::activation_t<P>>;
template <class P>
using attn_block = nn::Residual<layer_norm<P>, nn::CausalSelfAttention<D, H, P>>;
template <class P>
using mlp_block =
    nn::Residual<layer_norm<P>, nn::Linear<D, 4 * D, P>, nn::GELU, nn::Linear<4 * D, D, P>>;

/// The plan model in precision P (the Linear layers' and the attention's projections'):
/// token embedding, position embedding, 2 blocks, LN_f, lm_head.
template <class P>
using GPT =
    nn::Sequential<nn::TokenEmbedding<V, D, T>, nn::PositionEmbedding<T, D>, attn_block<P>,
                   mlp_block<P>, attn_block<P>, mlp_block<P>, layer_norm<P>, nn::Linear<D, V, P>>;
/// The example's body (everything after the token embedding).
template <class P>
using Body = nn::Sequential<nn::PositionEmbedding<T, D>, attn_block<P>, mlp_block<P>, attn_block<P>,
                            mlp_block<P>, layer_norm<P>, nn::Linear<D, V, P>>;

using ids_view = Kokkos::View<std::int32_t**>;

/// Ids and targets in [0, V) of sample s at step t, the same on every rank.
inline void fill_tokens(int step, int first, ids_view& ids, ids_view& targets) {
  for (std::size_t s = 0; s < ids.extent(0); ++s) {
    std::mt19937 g(std::uint32_t(7919 * step + 104729 * (first + int(s)) + 3));
    for (std::size_t i = 0; i < ids.extent(1); ++i) {
      ids(s, i) = std::int32_t(g() % V);
      targets(s, i) = std::int32_t(g() % V);
    }
  }
}

inline constexpr float lr = 0.05f, momentum = 0.9f;

/// "fp32", "bf16", "fp8" for the messages.
template <class P>
const char* precision_name() {
  if constexpr (nn::is_fp8_compute<P>::value)
    return "fp8";
  else
    return tessera::precision_traits<P>::name;
}

/// The single-process reference: nn::Embedding + Body on the whole batch, initialised with the
/// plan model's initial values (tok = "0.weight", body layer k = plan layer k + 1).
template <class P>
std::map<std::string, std::vector<float>> gpt_reference(const run_options& o) {
  Kokkos::DefaultExecutionSpace exec;
  const auto init = values_by_name(GPT<P>(o.seed).parameters());
  nn::Embedding<V, D> tok;
  Body<P> body;
  auto renamed = [](const std::string& name, int shift) {
    const auto dot = name.find('.');
    return std::to_string(std::stoi(name.substr(0, dot)) + shift) + name.substr(dot);
  };
  const auto& w0 = init.at("0.weight");
  std::copy(w0.begin(), w0.end(), tok.weight().value.data());
  boost::hana::for_each(body.parameters(), [&](const auto& p) {
    const auto& w = init.at(renamed(p.name, 1));
    REQUIRE(std::size_t(p.size()) == w.size());
    std::copy(w.begin(), w.end(), p.value.data());
  });
  tessera::train::sgd opt{.lr = lr, .momentum = momentum};
  nn::SoftmaxCrossEntropy loss;
  ids_view ids("ids", o.global_batch, T), targets("targets", o.global_batch, T);
  for (int step = 0; step < o.steps; ++step) {
    fill_tokens(step, 0, ids, targets);
    auto y = body.forward(exec, tok.forward(exec, ids));
    auto [l, dlogits] = loss.forward_backward(exec, y, targets);
    (void)l;
    tok.backward(exec, body.backward(exec, dlogits, true));
    opt.step(exec, boost::hana::concat(tok.parameters(), body.parameters()));
  }
  std::map<std::string, std::vector<float>> out;
  out["0.weight"].assign(tok.weight().value.data(),
                         tok.weight().value.data() + tok.weight().size());
  boost::hana::for_each(body.parameters(), [&](const auto& p) {
    out[renamed(p.name, 1)].assign(p.value.data(), p.value.data() + p.size());
  });
  return out;
}

/// What a plan run leaves: the whole values of this rank's stage's parameters by name, and its
/// stage's fp8 scaling states (each history followed by its scale amax; none but in fp8).
struct plan_result {
  std::map<std::string, std::vector<float>> weights;
  std::vector<float> fp8;
};

/// Training under Plan: this rank's stage of the split GPT<P> on its data share, M
/// micro-batches.
template <class P, class Plan, int M>
plan_result gpt_plan(const run_options& o) {
  auto world = tp::mpi_communicator::world();
  Kokkos::DefaultExecutionSpace exec;
  tp::mesh<Plan, tp::mpi_communicator> mesh(world);
  plan_result result;
  tp::with_plan_stage<Plan, GPT<P>, tp::one_f_one_b, M>(
      mesh, o.seed, o.bucket_bytes, [&](auto& stage) {
        tessera::train::sgd opt{.lr = lr, .momentum = momentum};
        nn::SoftmaxCrossEntropy loss;
        const int share = o.global_batch / mesh.shape.data, first = mesh.at.data * share;
        ids_view ids("ids", share, T), targets("targets", share, T);
        for (int step = 0; step < o.steps; ++step) {
          fill_tokens(step, first, ids, targets);
          stage.forward_backward(exec, ids, targets, loss);
          opt.step(exec, stage.parameters());
        }
        result.weights = stage.gather_parameters();
        tp::for_each_fp8_state(stage.stage(), [&](const auto& meta) {
          const auto& hist = meta.history();
          result.fp8.insert(result.fp8.end(), hist.begin(), hist.end());
          result.fp8.push_back(meta.scale_amax());
        });
      });
  return result;
}

/// The largest |w - w_ref| over this rank's parameters (-1 if a name or size does not match),
/// and the check that every parameter is on D * T ranks.
template <class Plan>
float compare(const std::map<std::string, std::vector<float>>& got,
              const std::map<std::string, std::vector<float>>& reference) {
  float diff = 0;
  for (const auto& [name, values] : got) {
    const auto it = reference.find(name);
    if (it == reference.end() || it->second.size() != values.size()) return -1;
    for (std::size_t i = 0; i < values.size(); ++i)
      diff = std::max(diff, std::fabs(it->second[i] - values[i]));
  }
  int mine = int(got.size()), total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == int(reference.size()) * Plan::data_size * Plan::tensor_size);
  return diff;
}

/// Plan against the single process's `reference` in precision P: the weights within
/// `tolerance` (bit-identical on one rank without splits), and in fp8 every scaling state the
/// same on the ranks of this rank's data group and tensor group (parallel/fp8_sync.hpp).
template <class P, class Plan>
bool check_gpt_plan(const run_options& o,
                    const std::map<std::string, std::vector<float>>& reference, float tolerance) {
  auto world = tp::mpi_communicator::world();
  if (!Plan::fits(world.size())) return false;
  constexpr int M = Plan::pipeline_size > 1 ? 2 : 1;
  REQUIRE(o.global_batch % (Plan::data_size * M) == 0);
  const plan_result got = gpt_plan<P, Plan, M>(o);
  if constexpr (nn::is_fp8_compute<P>::value) {
    tp::mesh<Plan, tp::mpi_communicator> mesh(world);
    INFO("char GPT " << Plan::name() << ": fp8 states shared by the data and tensor groups");
    CHECK(!got.fp8.empty());
    CHECK(same_on_all(mesh.data, got.fp8));
    CHECK(same_on_all(mesh.tensor, got.fp8));
  }
  const float diff = compare<Plan>(got.weights, reference);
  float worst = diff;
  MPI_Allreduce(&diff, &worst, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank() == 0)
    WARN("char GPT " << precision_name<P>() << " " << Plan::name() << " (" << M
                     << " micro-batches): max |w - w_ref| = " << worst);
  INFO("char GPT " << precision_name<P>() << " " << Plan::name());
  CHECK(diff >= 0); // names and sizes match the reference's
  if constexpr (Plan::data_size == 1 && Plan::tensor_size == 1 && Plan::pipeline_size == 1)
    CHECK(diff == 0.f); // the same arithmetic as the single process
  else
    CHECK(diff <= tolerance);
  return true;
}

/// Every plan of all_plans that fits the world against the single process; the number run.
/// The weights must lie within max(tolerance, fraction_of_moved x the largest distance a
/// reference weight moved from its start): in bf16 and fp8 an fp32-ulp difference of the plan's
/// sums can flip a rounding of an activation or operand, which changes the updates it feeds by
/// that rounding's relative size (see test_mpi_plans_gpt_mixed.cpp).
template <class P>
int check_gpt_plans(const run_options& o, float tolerance, float fraction_of_moved = 0) {
  const auto reference = gpt_reference<P>(o);
  // The reference trained (a test that cannot fail otherwise): the lm_head moved.
  const auto start = values_by_name(GPT<P>(o.seed).parameters());
  CHECK(start.at("7.weight") != reference.at("7.weight"));
  float moved = 0;
  for (const auto& [name, v] : reference)
    for (std::size_t i = 0; i < v.size(); ++i)
      moved = std::max(moved, std::fabs(v[i] - start.at(name)[i]));
  const float bound = std::max(tolerance, fraction_of_moved * moved);
  if (tp::mpi_communicator::world().rank() == 0)
    WARN("char GPT " << precision_name<P>() << ": the reference's weights moved up to " << moved
                     << "; bound " << bound);
  return [&]<class... Plans>(std::tuple<Plans...>*) {
    return (int(check_gpt_plan<P, Plans>(o, reference, bound)) + ... + 0);
  }(static_cast<all_plans*>(nullptr));
}

/// How many of all_plans fit a world of n ranks.
inline int plans_for(int n) {
  return n == 1 ? 1 : n == 2 ? 3 : n == 4 ? 3 : n == 8 ? 1 : 0;
}

} // namespace tessera_test::gpt
