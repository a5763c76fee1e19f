// Trains a character-level GPT (nanoGPT's shape) on the fortunes corpus in fp32, bf16 or fp8
// (hybrid, fp32 masters) and prints validation losses, tokens/s and a generated sample.
//
//   train_char_gpt                                   # fp32, 2000 steps of 16 x 128 characters
//   train_char_gpt --steps 300 --precision bf16 --threads 2
//   train_char_gpt --steps 1000 --checkpoint ck.tsr   # saved at every evaluation and at the end
//   train_char_gpt --steps 2000 --resume ck.tsr       # continues bit for bit
//   scripts/run.sh gpt [flags]                       # bootstraps, builds and runs this
//
// Model (examples/char_gpt_model.hpp): by default context
// T = 128, width D = 128, 4 heads of 32, 4 blocks, MLP hidden 4 D = 512.
//   x = tok_emb[ids] + pos_emb[0..t)                                    (B, t, D)
//   block: x = x + Attn(LN1(x)); x = x + MLP(LN2(x)), MLP = Linear(D, 4D) GELU Linear(4D, D)
//   logits = Linear(D, V)(LN_f(x))  (lm_head with bias, not tied to tok_emb)
//   loss = mean cross-entropy over the B t positions
// Model size flags: --layers N (1..64 blocks: a run-time list of identical blocks), --context T
// (2..128: the position table is compiled for 128 rows, a shorter context uses the first T),
// --width D / --heads H among the compiled pairs 64/2 and 128/4 (chargpt::model_sizes; each
// pair is one more model type per precision and vocabulary bound, so compile time grows with
// the list; other values are refused with the list).
//   train_char_gpt --layers 2 --width 64 --heads 2 --context 64 --steps 300
// V is a compile-time bound: 128 if the corpus has at most 128 distinct bytes (fortunes: 114),
// else 256; the rows beyond the vocabulary are never targets and only receive the softmax's
// push-down (benchmarks/gpt/torch_char_gpt.py does the same).
//
// Data (tessera/data/text.hpp): the regular files without an extension directly in --data,
// sorted, concatenated; vocabulary = its distinct bytes; train = first 90 %, validation = the
// rest. Step s trains on the contexts counter_rng{seed, s}.bits(i) mod (m - T), i < batch (T + 1
// characters each), so batches depend on the seed and the step only: a resumed run sees the same
// batches. Validation loss: mean over 64 contexts at evenly spaced offsets of the validation
// split (batches of 16), at step 0, every --eval-every steps and after the last step.
//
// Recipe: AdamW lr --lr (1e-3), betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on matrices only
// (train::decay_rule::matrices); linear warm-up over --warmup steps, cosine decay to lr / 10 at
// --steps (train::warmup_cosine); gradients clipped to global norm 1.0 after un-scaling
// (train::clipped_step); --accum k splits each batch into k micro-batches whose gradients are
// averaged (train::grad_accumulator). bf16 and fp8 use a dynamic loss scaler (PyTorch's
// GradScaler rules); fp32 a static scale of 1, which still skips a step with a non-finite
// gradient.
//
// --checkpoint FILE saves the whole state (masters, AdamW moments, scaler, fp8 states, schedule
// position, accumulation state, step, seed, precision) atomically at every evaluation and at the
// end (--stop-at N ends the run after step N, the schedule still running to --steps);
// --resume FILE continues from it: bit-identical to the uninterrupted run on the same
// thread count, and refused (naming this run's size) for a checkpoint of another model size
// or precision. The last line before the sample is an FNV-1a hash of the master weights, so two
// runs can be compared exactly.
//
// --plan data=D,tensor=T,pipeline=P (train_fashion_mnist's syntax: D 1..4096, T and P 1, 2 or
// 4; fp32 only; built when CMake found MPI) trains under tessera::parallel::plan<data<dyn>,
// tensor<T>, pipeline<P>> on mpiexec -n D*T*P processes: the model as one Sequential whose first
// layer is nn::TokenEmbedding (pipeline stage 0 reads the ids), the attention split by heads and
// the MLP column- then row-parallel across the tensor group, the blocks cut into P stages (P
// micro-batches), each data replica on its share of every batch; the same recipe and batches,
// initialised with the single process's weights, clipping over the whole model's gradient norm.
// It prints the train loss (no validation loss, no sample) and, from rank 0, the whole weights'
// "masters fnv1a" hash and one "masters signature NAME S" line per parameter (printed by the
// single process too): bit-identical for data=1,tensor=1,pipeline=1, else within a bound
// (tests/examples/check_char_gpt_plan.cmake).
//
// The sample: --sample-len characters generated after a newline, at --temperature, from a
// generator seeded by --seed; each new character runs the blocks on that one position with the
// attention's key/value cache (cost linear in the context). When the context is full (T
// characters), the cache restarts from the last T / 2 characters.
#include "char_gpt_model.hpp"
#include "example_instances.hpp"
#include "kokkos_args.hpp"
#include "train_char_gpt_options.hpp"

#include <tessera/data/text.hpp>
#include <tessera/nn.hpp>
#include <tessera/train.hpp>

#include <boost/hana/concat.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/transform.hpp>

#if defined(TESSERA_EXAMPLE_WITH_MPI)
#include <tessera/parallel/mpi.hpp>
#include <tessera/parallel/runner.hpp>

#include <map>
#include <optional>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace nn = tessera::nn;
namespace train = tessera::train;
namespace data = tessera::data;
using tessera::index_t;

constexpr std::int64_t eval_contexts = 64, eval_batch = 16;
constexpr double clip_norm = 1.0;

/// The recipe's optimizer (GPT_SPEC: AdamW, betas 0.9 / 0.95, weight decay 0.1 on matrices
/// only); its learning rate comes from schedule(o) at every step.
train::adamw recipe_optimizer() {
  return train::adamw{.lr = 0.f,
                      .beta1 = 0.9f,
                      .beta2 = 0.95f,
                      .eps = 1e-8f,
                      .weight_decay = 0.1f,
                      .decay_on = train::decay_rule::matrices};
}
/// Linear warm-up over --warmup steps, then cosine to lr / 10 at --steps (validated).
train::lr_scheduler recipe_schedule(const chargpt::options& o) {
  train::lr_scheduler sched{
      .schedule = {
          .lr = o.lr, .min_lr = o.lr / 10.0, .warmup_steps = o.warmup, .total_steps = o.steps}};
  sched.schedule.validate();
  return sched;
}

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// Inputs (B, T) and targets (B, T) from rows of T + 1 ids. The views and their host mirrors
/// (the views themselves in host memory) are made again only when B changes, not per batch.
struct batch_views {
  using view_type = Kokkos::View<std::int32_t**>;
  view_type x, y;
  view_type::HostMirror hx, hy;
  void fill(const std::int32_t* rows, std::int64_t b, index_t T) {
    if (static_cast<std::int64_t>(x.extent(0)) != b || static_cast<index_t>(x.extent(1)) != T) {
      x = view_type("batch.x", b, T);
      y = view_type("batch.y", b, T);
      hx = Kokkos::create_mirror_view(x);
      hy = Kokkos::create_mirror_view(y);
    }
    for (std::int64_t i = 0; i < b; ++i)
      for (index_t j = 0; j < T; ++j) {
        hx(i, j) = rows[i * (T + 1) + j];
        hy(i, j) = rows[i * (T + 1) + j + 1];
      }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(y, hy);
  }
};

/// Mean validation loss over the fixed contexts.
template <class Model, class Exec>
double val_loss(Model& model, const Exec& exec, const std::vector<std::int32_t>& val,
                const std::vector<std::int64_t>& offsets) {
  const index_t T = model.context();
  nn::SoftmaxCrossEntropy loss;
  batch_views buf;
  std::vector<std::int32_t> rows;
  double sum = 0;
  for (std::size_t first = 0; first < offsets.size(); first += eval_batch) {
    const std::size_t n = std::min<std::size_t>(eval_batch, offsets.size() - first);
    rows.assign(n * (T + 1), 0);
    for (std::size_t i = 0; i < n; ++i)
      std::copy_n(val.begin() + offsets[first + i], T + 1, rows.begin() + i * (T + 1));
    buf.fill(rows.data(), static_cast<std::int64_t>(n), T);
    const auto logits = model.forward(exec, buf.x);
    sum += static_cast<double>(loss.forward(exec, logits, buf.y)) * static_cast<double>(n);
  }
  return sum / static_cast<double>(offsets.size());
}

/// Appends the id drawn from softmax(logits[first + c] / temperature), c < vocab (the logits'
/// rows beyond the vocabulary ignored), by inverse CDF at u in [0, 1).
template <class Flat>
void next_char(std::vector<std::int32_t>& ids, const Flat& flat, std::size_t first,
               std::int32_t vocab, float temperature, float u, std::vector<float>& probs) {
  const auto logits = [&](std::int32_t c) {
    return tessera::to_float(flat(first + static_cast<std::size_t>(c)));
  };
  float mx = -INFINITY;
  for (std::int32_t c = 0; c < vocab; ++c) mx = std::max(mx, logits(c) / temperature);
  double sum = 0;
  for (std::int32_t c = 0; c < vocab; ++c) {
    probs[static_cast<std::size_t>(c)] = std::exp(logits(c) / temperature - mx);
    sum += probs[static_cast<std::size_t>(c)];
  }
  double acc = 0;
  const double target = static_cast<double>(u) * sum;
  std::int32_t pick = vocab - 1;
  for (std::int32_t c = 0; c < vocab; ++c) {
    acc += probs[static_cast<std::size_t>(c)];
    if (acc > target) {
      pick = c;
      break;
    }
  }
  ids.push_back(pick);
}

/// FNV-1a 64 over the bytes of every master weight, in parameter order.
template <class Params>
std::uint64_t masters_hash(const Params& params) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  train::for_each_parameter(params, [&](const auto& p, std::size_t) {
    const auto host =
        Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, p.value.kokkos_view());
    const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(p.size()) * sizeof(float); ++i)
      h = (h ^ bytes[i]) * 0x100000001b3ull;
  });
  return h;
}

/// Per parameter "masters signature NAME S": S = round(1e6 sum_i s_i w_i), s_i = +-1 from a
/// hash of i (train_fashion_mnist's), so runs whose sums differ in order only (a --plan run and
/// the single process) can be compared within a bound.
template <class Params>
void print_signatures(const Params& params) {
  train::for_each_parameter(params, [&](const auto& p, std::size_t) {
    const auto host =
        Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, p.value.kokkos_view());
    double sig = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(p.size()); ++i) {
      const std::uint32_t mix = static_cast<std::uint32_t>(i) * 2654435761u;
      sig += (mix >> 31) != 0 ? double(host.data()[i]) : -double(host.data()[i]);
    }
    std::printf("masters signature %s %lld\n", p.name.c_str(), std::llround(sig * 1e6));
  });
}

/// --sample-len characters after a newline (see the file comment).
template <class Model, class Exec>
std::string generate(Model& model, const Exec& exec, const data::char_vocab& vocab,
                     const chargpt::options& o) {
  const auto nl = vocab.encode(std::string("\n"));
  std::vector<std::int32_t> ids{nl.empty() ? 0 : nl[0]};
  const tessera::counter_rng rng{o.seed, 0x5a4d504c45ull};
  std::vector<float> probs(static_cast<std::size_t>(vocab.size()));
  chargpt::generator<Model, Exec> gen(model, exec);
  const index_t T = model.context();
  auto logits = gen.feed(ids, 0, 1, true);
  for (std::int64_t k = 0; k < o.sample_len; ++k) {
    const std::size_t n = static_cast<std::size_t>(logits.extent(1));
    const auto hl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, logits.kokkos_view());
    next_char(ids, hl, (n - 1) * static_cast<std::size_t>(Model::vocab_bound), vocab.size(),
              o.temperature, rng.uniform01(static_cast<std::uint64_t>(k)), probs);
    if (gen.length() < T) {
      logits = gen.feed(ids, ids.size() - 1, 1, false);
    } else { // the context is full: restart from the last T / 2 characters
      const std::size_t keep = T / 2;
      logits = gen.feed(ids, ids.size() - keep, keep, true);
    }
  }
  return vocab.decode(std::vector<std::int32_t>(ids.begin() + 1, ids.end()));
}

template <class P, index_t V, index_t D, index_t H>
int run(const chargpt::options& o, const data::char_vocab& vocab, const data::text_split& split) {
  using exec_space = Kokkos::DefaultExecutionSpace;
  const exec_space exec;
  if (!o.checkpoint.empty()) train::check_checkpoint_writable(o.checkpoint);
  constexpr bool scaled = !std::is_same_v<P, tessera::fp32>;
  using scaler_type = std::conditional_t<scaled, train::dynamic_scaler<>, train::static_scaler>;

  const index_t T = o.context;
  chargpt::char_gpt<P, V, D, H, chargpt::max_context> model(o.seed,
                                                            static_cast<std::size_t>(o.layers), T);
  const auto params = model.parameters();
  const auto fp8_states = model.fp8_states();
  nn::SoftmaxCrossEntropy loss;
  train::adamw opt = recipe_optimizer();
  scaler_type scaler{};
  train::lr_scheduler sched = recipe_schedule(o);
  train::grad_accumulator acc;
  // The checkpoint's precision record names the model size too, so that a checkpoint of
  // another size (even one with the same parameters: another --context) is refused on load.
  train::run_state state{
      .step = 0, .epoch = 0, .data_seed = o.seed, .precision = chargpt::model_tag(o)};
  if (!o.resume.empty()) {
    try {
      train::load_checkpoint(o.resume, params, opt, scaler, state, sched, acc, fp8_states);
    } catch (const std::exception& e) {
      throw tessera::value_error("cannot resume from " + o.resume + " with this model (" +
                                 chargpt::model_tag(o) +
                                 "; a checkpoint resumes only the model size and precision it "
                                 "was saved with): " +
                                 e.what());
    }
    if (state.data_seed != o.seed)
      throw tessera::value_error("train_char_gpt: " + o.resume + " was trained with --seed " +
                                 std::to_string(state.data_seed) + ", not " +
                                 std::to_string(o.seed));
    std::fprintf(stderr, "[train] resumed from %s after step %ld\n", o.resume.c_str(),
                 long(state.step));
  }
  std::int64_t n_params = 0;
  train::for_each_parameter(params, [&](const auto& p, std::size_t) { n_params += p.size(); });
  std::fprintf(stderr,
               "[train] %s, vocabulary %d (bound %ld), %ld train / %ld validation characters, "
               "%ld parameters, batch %ld x %ld (%ld micro-batch(es)), %d thread(s)\n",
               chargpt::model_tag(o).c_str(), vocab.size(), long(V), long(split.train.size()),
               long(split.val.size()), long(n_params), long(o.batch), long(T), long(o.accum),
               exec_space().concurrency());

  const data::context_sampler sampler(static_cast<std::int64_t>(split.train.size()), T, o.seed);
  const auto offsets =
      data::eval_offsets(static_cast<std::int64_t>(split.val.size()), T, eval_contexts);
  const auto evaluate = [&](std::int64_t step) {
    std::printf("step %ld val loss %.4f\n", long(step), val_loss(model, exec, split.val, offsets));
    std::fflush(stdout);
  };
  const auto save = [&] {
    if (!o.checkpoint.empty())
      train::save_checkpoint(o.checkpoint, params, opt, scaler, state, sched, acc, fp8_states);
  };
  if (state.step == 0) evaluate(0);

  batch_views buf;
  const std::int64_t micro = o.batch / o.accum;
  const auto t0 = clock_type::now();
  auto last_bar = t0;
  double train_seconds = 0, loss_sum = 0;
  std::int64_t tokens = 0, skipped = 0, since_eval = 0;
  const std::int64_t last = o.stop_at > 0 ? o.stop_at : o.steps;
  while (state.step < last) {
    const auto ts = clock_type::now();
    const auto rows = sampler.batch(split.train, static_cast<std::uint64_t>(state.step), o.batch);
    double step_loss = 0;
    for (std::int64_t m = 0; m < o.accum; ++m) {
      buf.fill(rows.data() + m * micro * (T + 1), micro, T);
      const auto logits = model.forward(exec, buf.x);
      const float s = scaler.scale();
      const auto [l, dlogits] = loss.forward_backward(exec, logits, buf.y, s);
      model.backward(exec, dlogits);
      if (o.accum > 1) acc.accumulate(exec, params);
      step_loss += static_cast<double>(l) / static_cast<double>(o.accum);
    }
    if (o.accum > 1) acc.finish(exec, params);
    opt.set_lr(sched.next());
    const auto r = train::clipped_step(exec, opt, scaler, params, clip_norm);
    skipped += r.applied ? 0 : 1;
    ++state.step;
    train_seconds += seconds_since(ts);
    tokens += o.batch * T;
    loss_sum += step_loss;
    ++since_eval;
    const bool eval_now = state.step % o.eval_every == 0 || state.step == last;
    if (o.progress && (seconds_since(last_bar) > 0.25 || eval_now)) {
      last_bar = clock_type::now();
      const int width = 30;
      const int fill = static_cast<int>(width * state.step / o.steps);
      std::fprintf(stderr, "\r  step [%.*s%*s] %ld/%ld  loss %.4f  %.0f tokens/s ", fill,
                   "##############################", width - fill, "", long(state.step),
                   long(o.steps), step_loss, static_cast<double>(tokens) / train_seconds);
    }
    if (eval_now) {
      if (o.progress) std::fprintf(stderr, "\n");
      std::printf("step %ld train loss %.4f  %.0f tokens/s  lr %.3g", long(state.step),
                  loss_sum / static_cast<double>(since_eval),
                  static_cast<double>(tokens) / train_seconds, double(opt.lr));
      if (scaled)
        std::printf("  (loss scale %g, %ld skipped)", double(scaler.scale()), long(skipped));
      std::printf("\n");
      loss_sum = 0;
      since_eval = 0;
      evaluate(state.step);
      save();
    }
  }
  if (tokens > 0)
    std::printf("trained %ld tokens in %.1f s: %.0f tokens/s (%s, %d thread(s))\n", long(tokens),
                train_seconds, static_cast<double>(tokens) / train_seconds, o.precision.c_str(),
                exec_space().concurrency());
  std::printf("masters fnv1a %016llx after step %ld\n",
              static_cast<unsigned long long>(masters_hash(params)), long(state.step));
  print_signatures(params);
  if (o.sample_len > 0) {
    const std::string text = generate(model, exec, vocab, o);
    std::printf("sample (temperature %g, seed %llu):\n%s\n", double(o.temperature),
                static_cast<unsigned long long>(o.seed), text.c_str());
  }
  std::fflush(stdout);
  return 0;
}

#if defined(TESSERA_EXAMPLE_WITH_MPI)
/// The GPT as the plans take it: one Sequential whose layer 0 is the token embedding (ids (B, T)
/// in), so pipeline stage 0 reads the ids; the layers after it are char_gpt's body.
/// The plans are compiled for the default size only (4 blocks of width 128, 4 heads, context
/// 128; the parser refuses --plan with other sizes).
constexpr index_t plan_D = 128, plan_H = 4, plan_T = 128;
constexpr std::size_t plan_layers = 4;
using plan_attn = chargpt::attn_block<plan_D, plan_H, tessera::fp32>;
using plan_mlp = chargpt::mlp_block<plan_D, tessera::fp32>;
template <index_t V>
using plan_gpt =
    nn::Sequential<nn::TokenEmbedding<V, plan_D, plan_T>, nn::PositionEmbedding<plan_T, plan_D>,
                   plan_attn, plan_mlp, plan_attn, plan_mlp, plan_attn, plan_mlp, plan_attn,
                   plan_mlp, nn::LayerNorm<plan_D>, nn::Linear<plan_D, V, tessera::fp32>>;

/// char_gpt's parameter name as plan_gpt's: "tok.weight" -> "0.weight", "k.x" -> "k+1.x".
inline std::string plan_name(const std::string& name) {
  if (name.rfind("tok.", 0) == 0) return "0." + name.substr(4);
  const auto dot = name.find('.');
  return std::to_string(std::stoul(name.substr(0, dot)) + 1) + name.substr(dot);
}

/// Training under plan<data<dyn>, tensor<Tn>, pipeline<Pn>> (fp32, vocabulary bound 128): the
/// single-process recipe (AdamW, warm-up and cosine, clipping to global norm 1.0) on the same
/// batches, each data replica on its share of a batch in Pn micro-batches, initialised with
/// char_gpt's initial weights. Prints the train loss every --eval-every steps (no validation
/// loss, no sample) and, from rank 0, the whole weights' hash and signatures, which equal the
/// single process's (bit for bit on one rank, else up to the order of the fp32 sums).
template <int Tn, int Pn>
int run_plan(const chargpt::options& o, const data::char_vocab& vocab,
             const data::text_split& split) {
  namespace tp = tessera::parallel;
  constexpr index_t V = 128;
  constexpr int micro_batches = Pn;
  using Plan = tp::plan<tp::data<tessera::dyn>, tp::tensor<Tn>, tp::pipeline<Pn>>;
  using Model = plan_gpt<V>;
  using exec_space = Kokkos::DefaultExecutionSpace;
  const exec_space exec;
  const int Dn = o.plan_data;
  auto world = tp::mpi_communicator::world();
  if (world.size() != Dn * Tn * Pn) { // every rank sees the same sizes: all print, then stop
    std::fprintf(stderr,
                 "train_char_gpt: rank %d of %d: --plan %s needs data x tensor x pipeline = %d "
                 "processes but the world has %d (launch it with mpiexec -n %d)\n",
                 world.rank(), world.size(), o.plan.c_str(), Dn * Tn * Pn, world.size(),
                 Dn * Tn * Pn);
    std::fflush(stderr);
    world.barrier();
    world.abort(1);
  }
  if (vocab.size() > V)
    throw tessera::value_error("train_char_gpt --plan: the corpus has " +
                               std::to_string(vocab.size()) +
                               " distinct bytes; the plans are built for at most 128");
  if (o.batch % (std::int64_t(Dn) * micro_batches) != 0)
    throw tessera::value_error("train_char_gpt --plan " + o.plan + ": --batch " +
                               std::to_string(o.batch) + " must be a multiple of data x " +
                               "micro-batches = " + std::to_string(Dn * micro_batches));
  auto mesh = tp::make_mesh_or_abort<Plan>(world);
  const bool root = mesh.world.rank() == 0;
  if (root)
    std::fprintf(stderr, "[train] fp32, %s on %d processes, batch %ld x %ld, %d micro-batch(es)\n",
                 mesh.shape.name().c_str(), mesh.shape.world(), long(o.batch), long(plan_T),
                 micro_batches);
  chargpt::char_gpt<tessera::fp32, V, plan_D, plan_H, plan_T> whole(
      o.seed, plan_layers, plan_T); // initial weights, then the gathered result
  std::map<std::string, std::vector<float>> init;
  train::for_each_parameter(whole.parameters(), [&](const auto& p, std::size_t) {
    init[plan_name(p.name)].assign(p.value.data(), p.value.data() + p.size());
  });
  tp::with_plan_stage<Plan, Model, tp::one_f_one_b, micro_batches>(
      mesh, o.seed, std::size_t(1) << 20, [&](auto& stage) {
        using stage_type = std::remove_cvref_t<decltype(stage)>;
        stage.scatter_parameters(init);
        const auto params = stage.parameters();
        nn::SoftmaxCrossEntropy loss;
        train::adamw opt = recipe_optimizer();
        train::static_scaler scaler{};
        train::lr_scheduler sched = recipe_schedule(o);
        const data::context_sampler sampler(static_cast<std::int64_t>(split.train.size()), plan_T,
                                            o.seed);
        const std::int64_t share = o.batch / Dn;
        batch_views buf;
        double loss_sum = 0;
        std::int64_t since = 0;
        for (std::int64_t step = 0; step < o.steps;) {
          const auto rows = sampler.batch(split.train, static_cast<std::uint64_t>(step), o.batch);
          buf.fill(rows.data() + mesh.at.data * share * (plan_T + 1), share, plan_T);
          loss_sum += double(stage.forward_backward(exec, buf.x, buf.y, loss));
          opt.set_lr(sched.next());
          if constexpr (Tn == 1 && Pn == 1) {
            // Whole gradients on every rank: the single process's step exactly.
            train::clipped_step(exec, opt, scaler, params, clip_norm);
          } else {
            // The global norm over the whole model: this stage's whole gradients (gathered
            // over the tensor group), squares summed in double, then over the stages.
            const auto grads = tp::gather_gradients(stage.stage(), stage.tensor());
            double sq = 0;
            for (const auto& [name, g] : grads)
              for (float v : g) sq += double(v) * double(v);
            float sq32 = float(sq);
            if constexpr (stage_type::stages > 1) mesh.pipeline.all_reduce_sum(&sq32, 1);
            const double norm = std::sqrt(double(sq32));
            if (std::isfinite(norm)) {
              const double coef = clip_norm / (norm + 1e-6);
              if (coef < 1.0) train::scale_grads(exec, params, static_cast<float>(coef));
              opt.step(exec, params);
            }
          }
          ++step;
          ++since;
          if (root && (step % o.eval_every == 0 || step == o.steps)) {
            std::printf("step %ld train loss %.4f\n", long(step), loss_sum / double(since));
            std::fflush(stdout);
            loss_sum = 0;
            since = 0;
          }
        }
        // The whole weights, in char_gpt's order: each stage's gathered over its tensor group,
        // then broadcast from the stage that holds it over the pipeline group.
        using bounds = typename stage_type::bounds;
        const auto mine = stage.gather_parameters();
        train::for_each_parameter(whole.parameters(), [&](const auto& p, std::size_t) {
          const std::string name = plan_name(p.name);
          const std::size_t layer = std::stoul(name.substr(0, name.find('.')));
          int owner = 0;
          while (layer >= bounds::value[std::size_t(owner) + 1]) ++owner;
          const auto it = mine.find(name);
          if (it != mine.end()) std::copy(it->second.begin(), it->second.end(), p.value.data());
          if constexpr (stage_type::stages > 1)
            mesh.pipeline.broadcast(p.value.data(), std::int64_t(p.size()), owner);
        });
      });
  if (root) {
    std::printf("masters fnv1a %016llx after step %ld\n",
                static_cast<unsigned long long>(masters_hash(whole.parameters())), long(o.steps));
    print_signatures(whole.parameters());
    std::fflush(stdout);
  }
  return 0;
}

int run_any_plan(const chargpt::options& o, const data::char_vocab& vocab,
                 const data::text_split& split) {
  return examples::with_plan_degrees(
      "train_char_gpt", o.plan_tensor, o.plan_pipeline, [&](auto t, auto p) {
        return run_plan<decltype(t)::value, decltype(p)::value>(o, vocab, split);
      });
}
#endif

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr, "train_char_gpt: %s\n%s\n", msg.c_str(), chargpt::usage_text());
  std::exit(2);
}

template <class P, index_t D, index_t H>
int run_vocab(const chargpt::options& o, const data::char_vocab& vocab,
              const data::text_split& split) {
  if (vocab.size() <= 128) return run<P, 128, D, H>(o, vocab, split);
  if constexpr (examples::reduced_build)
    throw examples::not_in_reduced_build("train_char_gpt: a corpus of " +
                                         std::to_string(vocab.size()) +
                                         " distinct bytes (vocabulary bound 256)");
  else
    return run<P, 256, D, H>(o, vocab, split);
}

/// The compiled (width, heads) pairs (chargpt::model_sizes; the parser refuses the others).
template <class P>
int run_precision(const chargpt::options& o, const data::char_vocab& vocab,
                  const data::text_split& split) {
  if constexpr (examples::reduced_build) {
    if (o.width != 128)
      throw examples::not_in_reduced_build("train_char_gpt --width " + std::to_string(o.width));
  } else if (o.width == 64) {
    return run_vocab<P, 64, 2>(o, vocab, split);
  }
  return run_vocab<P, 128, 4>(o, vocab, split);
}

} // namespace

int main(int argc, char* argv[]) {
  chargpt::options o;
  try {
    o = chargpt::parse_options(argc, argv);
  } catch (const chargpt::usage_error& e) {
    usage(e.what());
  }
#if defined(TESSERA_EXAMPLE_WITH_MPI)
  // MPI only for --plan: the default run stays a plain process.
  std::optional<tessera::parallel::mpi_environment> mpi;
  if (!o.plan.empty()) mpi.emplace(argc, argv);
#else
  if (!o.plan.empty())
    usage("--plan needs MPI, and this train_char_gpt was built without it (CMake did not find "
          "MPI)");
#endif
  examples::kokkos_args kargs(argv[0], o.threads); // --threads as Kokkos' flag
  Kokkos::ScopeGuard kokkos(kargs.argc, kargs.argv());
  try {
    const auto corpus = data::read_text_directory(o.data);
    const data::char_vocab vocab(corpus.bytes);
    const auto split = data::split_text(vocab.encode(corpus.bytes), o.context);
#if defined(TESSERA_EXAMPLE_WITH_MPI)
    // An error on one rank ends the whole job with that rank's message (MPI_Abort).
    if (!o.plan.empty())
      return tessera::parallel::abort_on_error("train_char_gpt",
                                               [&] { return run_any_plan(o, vocab, split); });
#endif
    if (o.precision == "fp32") return run_precision<tessera::fp32>(o, vocab, split);
    if (o.precision == "bf16") return run_precision<tessera::bf16>(o, vocab, split);
    return run_precision<nn::fp8<>>(o, vocab, split);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_char_gpt: %s\n", e.what());
    return 1;
  }
}
