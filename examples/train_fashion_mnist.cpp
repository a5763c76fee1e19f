// Trains FashionCNN on Fashion-MNIST in fp32, bf16, fp16 or fp8 (hybrid, fp32 masters) and reports
// train loss, test accuracy on all 10,000 test images, seconds and images/s per epoch.
//
//   train_fashion_mnist                          # fp32, 6,000 training images, one epoch
//   train_fashion_mnist --precision bf16 --full  # all 60,000 images, 3 epochs
//   train_fashion_mnist --precision fp16         # IEEE half: needs the loss scaler (below)
//   train_fashion_mnist --precision fp8 --epochs 2 --threads 2 --checkpoint ck.bin
//   train_fashion_mnist --precision fp8 --epochs 3 --threads 2 --resume ck.bin  # epoch 3 only
//   OMP_NUM_THREADS=1 mpiexec -n 8 train_fashion_mnist --plan data=2,tensor=2,pipeline=2
//   OMP_NUM_THREADS=1 mpiexec -n 3 train_fashion_mnist --plan data=3
//
// --plan data=D,tensor=T,pipeline=P (D any of 1..4096, T and P each 1, 2 or 4; missing ones are
// 1) trains with tessera::parallel::plan<data<dyn>, tensor<T>, pipeline<P>> over MPI (fp32, bf16
// or fp8; fp8's scaling states are kept equal on the ranks sharing a tensor and current scaling's
// amax is agreed on in every cast, parallel/fp8_sync.hpp: data and tensor splits differ from one
// process only in the order of fp32 sums, micro-batches within fp8 rounding; built only when CMake
// found MPI, TESSERA_EXAMPLE_WITH_MPI): T and P pick one of the nine
// compile-time plans, the data degree is taken at run time (data<dyn>). Each of the D data
// replicas takes 1/D of every batch, the Linear and Conv2d pairs are split T ways (Megatron
// column/row parts; FashionCNN's split widths, 32 channels and 128 features, divide by 4), and
// the layers are cut into P stages (balanced by FLOPs) fed 4 micro-batches on the 1F1B schedule.
// The run needs exactly D * T * P processes; otherwise every rank prints why and the job stops.
// Batches are cut to a multiple of D (times 4 with a pipeline); only rank 0 prints. An error on any
// rank ends the whole job with that rank's message; a rank that waits longer than
// --collective-timeout SECONDS (default 300, 0: forever) in one collective or transfer names the
// ranks that did not arrive and ends the job.
//
// --recompute switches on FashionCNN's nn::Recompute segments (tessera/nn/recompute.hpp: the two
// conv blocks and the hidden Linear block): each keeps only its input between forward and
// backward and re-runs its forward during backward. Without it they run as the plain layers.
// The weights are the same either way and train to the same bits (the "masters fnv1a" hash
// below), with or without --plan; the switch is not training state, so a run may be resumed
// with or without it. Either way the first step of a single-process run prints the bytes of
// activations the model keeps between forward and backward (nn::saved_activation_bytes).
//
// --accum K (with --plan) accumulates the gradients of K consecutive batches per optimizer step
// (parallel::plan_stage::forward_backward_accumulated): each batch's forward and backward without
// the data-parallel reduction, their mean reduced once per step (DDP's no_sync); a tail of
// fewer than K whole batches per epoch is left out. The weights equal the single process's with
// --batch K x B within the signature bound below.
//
// Every flag's value is checked whole and range-checked (train_fashion_mnist_options.hpp); a bad
// one prints what is wrong and the usage line and exits with code 2.
//
// Model (FashionCNN): Conv2d(1,32,3,pad 1) ReLU MaxPool2d(2); Conv2d(32,64,3,pad 1) ReLU
// MaxPool2d(2); Flatten; Linear(3136,128) ReLU; Linear(128,10). SGD lr 0.05, momentum 0.9,
// batch 64, reshuffled every epoch from a fixed seed. Inputs normalised as (x/255 - 0.2860) /
// 0.3530 (Fashion-MNIST's training mean and standard deviation). bf16, fp16 and fp8 runs use a
// dynamic loss scaler (PyTorch GradScaler rules); fp32 runs none.
//
// --checkpoint FILE saves the whole training state (fp32 masters, SGD momentum, loss scaler, fp8
// scaling states, epoch, data seed and precision; tessera/train/checkpoint.hpp) atomically after
// every epoch; that FILE can be written is checked before training starts. --resume FILE restores
// it and continues with the next epoch up to --epochs: the result is bit-identical to the
// uninterrupted run with the same thread count (the data order of an epoch depends only on the seed
// and the epoch).
//
// With --plan, --checkpoint DIR saves a plan checkpoint (tessera/parallel/checkpoint.hpp: a
// directory of one shard per rank and a manifest) after every epoch, and --resume DIR restores
// one saved under the same plan (another plan is refused, naming both): again bit-identical to
// the uninterrupted run. A single-process --resume DIR given a plan checkpoint merges it first
// into DIR/merged.tsr (parallel::merge_plan_checkpoint) and continues from that, as one process. At
// the end the example prints an FNV-1a hash of the master weights, so two runs can be compared
// exactly, and one signature line per parameter (the sum of its weights with pseudo-random signs,
// in units of 1e-6), so runs whose fp32 sums differ in order only (a --plan run and the single
// process) can be compared within a bound. Under --plan the weights are first gathered whole (over
// the tensor group, then the pipeline stages): the same hash as the single process under plan
// data=1,tensor=1,pipeline=1.
//
// --zero 1|2 (with --plan) trains under plan<data<dyn, zero<S>>, ...>: ZeRO stage 1 shards the
// SGD momentum and the update over the D data replicas (the gradients reduce-scattered during
// backward, the updated weights all-gathered), stage 2 also the reduced gradients (kept as a
// shard, staged through two bucket-sized buffers; parallel/zero.hpp). The weights equal those
// of the same --plan without --zero (bit-identical with D <= 2). Once per run rank 0 prints its
// bytes of weights + reduced gradients + optimizer state per parameter next to the formula for SGD
// with momentum (K = 4 bytes of state per parameter: 4 + 4 + 4/D at stage 1, 4 + 8/D at stage 2;
// the ZeRO paper's mixed-precision counting gives 4 + 8/D and 2 + 10/D). With --checkpoint each
// rank also saves its shard of the optimizer state; --resume continues bit-identically under the
// same plan and --zero stage (another stage or plan is refused, naming both), and a single-process
// --resume merges the shards as above.
#include "example_instances.hpp"
#include "kokkos_args.hpp"
#include "train_fashion_mnist_options.hpp"

#include <tessera/data/idx.hpp>
#include <tessera/nn.hpp>
#include <tessera/tensor/host_mirror.hpp>
#include <tessera/train/checkpoint.hpp>
#include <tessera/train/grad_accumulation.hpp>
#include <tessera/train/loss_scaler.hpp>
#include <tessera/train/sgd.hpp>
#include <tessera/train/step.hpp>
#include <tessera/train/team.hpp>

#include <boost/hana/for_each.hpp>

#if defined(TESSERA_EXAMPLE_WITH_MPI)
#include <tessera/parallel/checkpoint.hpp>
#include <tessera/parallel/mpi.hpp>
#include <tessera/parallel/runner.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace nn = tessera::nn;
using tessera::dyn;
using tessera::index_t;

/// FashionCNN: the two conv blocks and the hidden Linear block are nn::Recompute segments,
/// switched on by --recompute (nn::set_recompute) and off otherwise, when they run as the plain
/// layers (bit-identical either way; the same initial weights as the unwrapped layers). Under
/// --plan each segment pairs as its Conv2d or Linear (parallel::TensorParallelRecompute).
template <class P>
using FashionCNN = nn::Sequential<
    nn::Recompute<
        nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}, P>,
                       nn::ReLU, nn::MaxPool2d<2>>>,
    nn::Recompute<nn::Sequential<nn::Conv2d<32, 64, 3, nn::conv_options{.pad = 1}, P>, nn::ReLU,
                                 nn::MaxPool2d<2>>>,
    nn::Flatten, nn::Recompute<nn::Sequential<nn::Linear<3136, 128, P>, nn::ReLU>>,
    nn::Linear<128, 10, P>>;

using fashion::options;

/// The message, then the usage line, on stderr; exit code 2.
[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr, "train_fashion_mnist: %s\n%s\n", msg.c_str(), fashion::usage_text());
  std::exit(2);
}

/// Images as their pixels (N, 28*28 bytes, as stored in the files) and labels as ints. The
/// pixels are normalised as each batch is gathered (batch_buffers::fill): a quarter of the
/// bytes of normalised floats to keep in memory and to read per batch. A batch's 64 rows lie
/// at random places of the set, so its gather runs at the memory's latency: measured on an AMD
/// EPYC Zen 5 (fp32, 2 threads), gathering 64 rows of floats cost 0.53 ms of a 7.8 ms step,
/// and 64 rows of bytes, normalised on the way, 0.04 ms.
struct dataset {
  std::vector<std::uint8_t> pixels;
  std::vector<int> y;
  index_t n = 0;
};

/// A pixel as the model sees it: Fashion-MNIST's training-set mean and standard deviation of
/// x / 255 taken out.
inline float normalised(std::uint8_t pixel) {
  constexpr float mean = 0.2860f, stddev = 0.3530f;
  return (static_cast<float>(pixel) / 255.f - mean) / stddev;
}

dataset load(const std::string& dir, const std::string& split, index_t limit) {
  const auto raw = tessera::data::load_mnist_like(dir, split);
  if (raw.images.dims[1] != 28 || raw.images.dims[2] != 28)
    throw tessera::value_error("train_fashion_mnist: " + dir + " " + split +
                               " images are not 28x28");
  dataset d;
  d.n = raw.count();
  if (limit > 0 && limit < d.n) d.n = limit;
  d.pixels.assign(raw.images.data.begin(), raw.images.data.begin() + d.n * 784);
  d.y.resize(static_cast<std::size_t>(d.n));
  for (index_t i = 0; i < d.n; ++i) d.y[static_cast<std::size_t>(i)] = raw.labels.data[i];
  return d;
}

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// The batch buffers in the default memory space (a GPU's in a device build) and their host
/// mirrors, which the batch is written into and copied from (on a host build the mirrors are
/// the buffers themselves and the copies do nothing). Made again only when the batch size
/// changes, not per batch.
struct batch_buffers {
  using x_type = tessera::Tensor<tessera::fp32, tessera::extents<dyn, 1, 28, 28>>;
  x_type x;
  tessera::host_mirror_t<x_type> hx;
  Kokkos::View<int*> y;
  Kokkos::View<int*>::HostMirror hy;
  /// Gathers images order[begin .. end) and their labels. On a host space the images are
  /// split over its team as the first layer's work is (contiguous ranges of the batch), so each
  /// thread writes the images it then reads; a device space's batch is gathered on the host.
  template <class Exec>
  void fill(const Exec& exec, const dataset& d, const std::vector<index_t>& order, index_t begin,
            index_t end) {
    const index_t b = end - begin;
    if (x.extent(0) != b) {
      x = x_type("batch.x", b);
      hx = tessera::host_mirror(x);
      y = Kokkos::View<int*>("batch.y", static_cast<std::size_t>(b));
      hy = Kokkos::create_mirror_view(y);
    }
    const std::uint8_t* pixels = d.pixels.data();
    const index_t* rows = order.data() + begin;
    float* to = hx.data();
    const auto image = [=](const index_t i) {
      const std::uint8_t* src = pixels + rows[i] * 784;
      float* dst = to + i * 784;
      for (index_t k = 0; k < 784; ++k) dst[k] = normalised(src[k]);
    };
    if constexpr (Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible) {
      Kokkos::parallel_for("train_fashion_mnist::batch", Kokkos::RangePolicy<Exec>(exec, 0, b),
                           image);
      exec.fence();
    } else {
      for (index_t i = 0; i < b; ++i) image(i);
    }
    for (index_t i = 0; i < b; ++i) hy(i) = d.y[static_cast<std::size_t>(rows[i])];
    tessera::copy_from_host(x, hx);
    Kokkos::deep_copy(y, hy);
  }
  void fill(const dataset& d, const std::vector<index_t>& order, index_t begin, index_t end) {
    fill(Kokkos::DefaultHostExecutionSpace{}, d, order, begin, end);
  }
};

template <class Model, class Exec>
double test_accuracy(Model& model, const Exec& exec, const dataset& test) {
  // 1000 images per forward: large GEMMs, and 10 calls cover the test set.
  constexpr index_t eval_batch = 1000;
  std::vector<index_t> order(static_cast<std::size_t>(test.n));
  std::iota(order.begin(), order.end(), index_t{0});
  batch_buffers buf;
  index_t correct = 0;
  for (index_t b = 0; b < test.n; b += eval_batch) {
    const index_t e = std::min(test.n, b + eval_batch);
    buf.fill(test, order, b, e);
    const auto logits = tessera::host_mirror_copy(model.forward(exec, buf.x));
    for (index_t i = 0; i < e - b; ++i) {
      index_t best = 0;
      for (index_t j = 1; j < 10; ++j)
        if (tessera::to_float(logits(i, j)) > tessera::to_float(logits(i, best))) best = j;
      correct += best == buf.hy(i) ? 1 : 0;
    }
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(test.n);
}

/// The master weights, in parameter order, as one vector; and where each parameter starts.
struct flat_masters {
  std::vector<std::string> names;
  std::vector<std::size_t> offsets; // names.size() + 1 entries
  std::vector<float> values;
};

template <class Params>
flat_masters layout_of(const Params& params) {
  flat_masters f;
  f.offsets.push_back(0);
  boost::hana::for_each(params, [&](const auto& p) {
    f.names.push_back(p.name);
    f.offsets.push_back(f.offsets.back() + static_cast<std::size_t>(p.size()));
  });
  f.values.assign(f.offsets.back(), 0.f);
  return f;
}

template <class Params>
flat_masters flatten(const Params& params) {
  flat_masters f = layout_of(params);
  std::size_t k = 0;
  boost::hana::for_each(params, [&](const auto& p) {
    const auto host = tessera::host_mirror_copy(p.value);
    std::memcpy(f.values.data() + f.offsets[k++], host.data(),
                static_cast<std::size_t>(p.size()) * sizeof(float));
  });
  return f;
}

/// "masters fnv1a H after epoch E" (FNV-1a 64 over the bytes of every master weight, in
/// parameter order), then per parameter "masters signature NAME S": S = round(1e6 sum_i s_i w_i)
/// with s_i = +1 or -1 by a hash of i (a misplaced or missing update moves it; an fp32 summation
/// order barely does).
void print_masters(const flat_masters& f, long epoch) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(f.values.data());
  for (std::size_t i = 0; i < f.values.size() * sizeof(float); ++i)
    h = (h ^ bytes[i]) * 0x100000001b3ull;
  std::printf("masters fnv1a %016llx after epoch %ld\n", static_cast<unsigned long long>(h), epoch);
  for (std::size_t k = 0; k < f.names.size(); ++k) {
    double sig = 0;
    for (std::size_t i = f.offsets[k]; i < f.offsets[k + 1]; ++i) {
      const std::uint32_t mix = static_cast<std::uint32_t>(i - f.offsets[k]) * 2654435761u;
      sig += (mix >> 31) != 0 ? double(f.values[i]) : -double(f.values[i]);
    }
    std::printf("masters signature %s %lld\n", f.names[k].c_str(), std::llround(sig * 1e6));
  }
  std::fflush(stdout);
}

template <class Prec>
int run(const options& o) {
  using exec_space = Kokkos::DefaultExecutionSpace;
  const exec_space exec;
  // A checkpoint that cannot be written fails now, not after the first epoch.
  if (!o.checkpoint.empty()) tessera::train::check_checkpoint_writable(o.checkpoint);
  const auto train_set = load(o.data, "train", o.limit);
  const auto test_set = load(o.data, "t10k", o.test_limit);
  std::fprintf(stderr,
               "[train] %s, %ld training images, %ld test images, batch %ld, %d thread(s)\n",
               o.precision.c_str(), long(train_set.n), long(test_set.n), long(o.batch),
               exec_space().concurrency());

  FashionCNN<Prec> model(o.seed);
  nn::set_recompute(model, o.recompute);
  nn::SoftmaxCrossEntropy loss;
  tessera::train::sgd opt{.lr = o.lr, .momentum = 0.9f};
  constexpr bool scaled = !std::is_same_v<Prec, tessera::fp32>;
  tessera::train::dynamic_scaler<> scaler;
  const auto params = model.parameters();
  const auto fp8_states = model.fp8_states();
  // The precision is saved with the checkpoint; a resume in another precision is refused.
  tessera::train::run_state state{
      .step = 0, .epoch = 0, .data_seed = o.seed, .precision = o.precision};
  if (!o.resume.empty()) {
    std::string from = o.resume;
#if defined(TESSERA_EXAMPLE_WITH_MPI)
    if (tessera::parallel::is_plan_checkpoint(from)) { // a --plan run's: merge it first
      const std::string merged = (std::filesystem::path(from) / "merged.tsr").string();
      tessera::parallel::merge_plan_checkpoint(from, merged);
      std::fprintf(stderr, "[train] merged the plan checkpoint %s into %s\n", from.c_str(),
                   merged.c_str());
      from = merged;
    }
#endif
    tessera::train::load_checkpoint(from, params, opt, scaler, state, fp8_states);
    if (state.data_seed != o.seed)
      throw tessera::value_error("train_fashion_mnist: " + o.resume + " was trained with --seed " +
                                 std::to_string(state.data_seed) + ", not " +
                                 std::to_string(o.seed));
    std::fprintf(stderr, "[train] resumed from %s after epoch %ld (%ld steps)\n", o.resume.c_str(),
                 long(state.epoch), long(state.step));
  }

  // Steps run on the whole thread team, or on a smaller one while that measures faster (another
  // process holding a core); --fixed-team: always the whole team.
  tessera::train::team_governor<exec_space> team(exec, {}, !o.fixed_team);
  batch_buffers buf;
  std::vector<index_t> order(static_cast<std::size_t>(train_set.n));
  for (int epoch = static_cast<int>(state.epoch) + 1; epoch <= o.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), index_t{0});
    std::mt19937_64 rng(o.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    const auto t0 = clock_type::now();
    auto last_bar = t0;
    double loss_sum = 0;
    index_t seen = 0, steps = 0, skipped = 0;
    for (index_t b = 0; b < train_set.n; b += o.batch) {
      const index_t e = std::min(train_set.n, b + o.batch);
      const bool first = steps == 0 && epoch == static_cast<int>(state.epoch) + 1;
      float l = 0;
      // One step on the team the governor picks (see train/team.hpp), the batch's gather
      // included.
      team.run(e - b, [&](const auto& ex) {
        buf.fill(ex, train_set, order, b, e);
        const auto logits = model.forward(ex, buf.x);
        if (first)
          std::fprintf(stderr,
                       "[train] saved activations between forward and backward: %zu bytes "
                       "per step of %ld images (%s)\n",
                       nn::saved_activation_bytes(model), long(e - b),
                       o.recompute ? "--recompute" : "no recomputation");
        const float s = scaled ? scaler.scale() : 1.f;
        auto lg = loss.forward_backward(ex, logits, buf.y, s);
        l = lg.loss;
        model.backward(ex, lg.dlogits);
        if constexpr (scaled) {
          skipped += tessera::train::step(ex, opt, scaler, params) ? 0 : 1;
        } else {
          opt.step(ex, params);
        }
      });
      loss_sum += static_cast<double>(l) * static_cast<double>(e - b);
      seen += e - b;
      ++steps;
      if (o.progress && (seconds_since(last_bar) > 0.25 || e == train_set.n)) {
        last_bar = clock_type::now();
        const int width = 30, fill = static_cast<int>(width * e / train_set.n);
        std::fprintf(stderr, "\r  epoch %d [%.*s%*s] %6ld/%ld  loss %.4f  %.0f images/s ", epoch,
                     fill, "##############################", width - fill, "", long(e),
                     long(train_set.n), loss_sum / static_cast<double>(seen),
                     static_cast<double>(seen) / seconds_since(t0));
      }
    }
    const double secs = seconds_since(t0);
    if (o.progress) std::fprintf(stderr, "\n");
    const double acc = test_accuracy(model, exec, test_set);
    std::printf("epoch %d  %s  train loss %.4f  test accuracy %.2f%%  %.1f s  %.0f images/s", epoch,
                o.precision.c_str(), loss_sum / static_cast<double>(seen), acc, secs,
                static_cast<double>(seen) / secs);
    if (scaled) std::printf("  (loss scale %g, %ld skipped steps)", scaler.scale(), long(skipped));
    std::printf("\n");
    std::fflush(stdout);
    if (team.adaptive())
      std::fprintf(stderr, "[train] steps so far on %d threads: %ld, on %d: %ld (%ld switches)\n",
                   team.threads(false), long(team.schedule().steps(false)), team.threads(true),
                   long(team.schedule().steps(true)), long(team.schedule().switches()));
    state.step += steps;
    state.epoch = epoch;
    if (!o.checkpoint.empty())
      tessera::train::save_checkpoint(o.checkpoint, params, opt, scaler, state, fp8_states);
  }
  print_masters(flatten(params), long(state.epoch));
  return 0;
}

#if defined(TESSERA_EXAMPLE_WITH_MPI)
/// The whole master weights of a plan run, on every rank: each stage's parameters gathered over
/// its tensor group, then each stage's part broadcast over the pipeline group (a stage holds
/// the contiguous layers [bounds[s], bounds[s + 1]), so its parameters are one contiguous range
/// of the flat vector).
template <class Stage>
flat_masters gather_masters(Stage& stage, std::uint64_t seed) {
  using bounds = typename Stage::bounds;
  const FashionCNN<tessera::fp32> whole(seed); // the names and sizes, in parameter order
  flat_masters f = layout_of(whole.parameters());
  const auto mine = stage.gather_parameters();
  const auto layer_of = [&](std::size_t k) {
    return static_cast<std::size_t>(std::stoul(f.names[k].substr(0, f.names[k].find('.'))));
  };
  for (std::size_t k = 0; k < f.names.size(); ++k) {
    const auto it = mine.find(f.names[k]);
    if (it == mine.end()) continue;
    if (it->second.size() != f.offsets[k + 1] - f.offsets[k])
      throw tessera::value_error("train_fashion_mnist: gathered '" + f.names[k] + "' has " +
                                 std::to_string(it->second.size()) + " values, the model " +
                                 std::to_string(f.offsets[k + 1] - f.offsets[k]));
    std::copy(it->second.begin(), it->second.end(), f.values.begin() + long(f.offsets[k]));
  }
  for (int s = 0; s < Stage::stages; ++s) {
    std::size_t lo = f.values.size(), hi = 0;
    for (std::size_t k = 0; k < f.names.size(); ++k)
      if (layer_of(k) >= bounds::value[std::size_t(s)] &&
          layer_of(k) < bounds::value[std::size_t(s) + 1]) {
        lo = std::min(lo, f.offsets[k]);
        hi = std::max(hi, f.offsets[k + 1]);
      }
    if (lo < hi) stage.mesh().pipeline.broadcast(f.values.data() + lo, std::int64_t(hi - lo), s);
  }
  return f;
}

/// --zero: rank 0's bytes per parameter (weights + reduced gradients + SGD momentum) next to the
/// formula for SGD with momentum (K = 4), tessera's and the ZeRO paper's.
void print_zero_memory(const tessera::parallel::zero_memory& m) {
  namespace tp = tessera::parallel;
  const double n = double(m.parameters);
  std::printf("zero stage %d, D=%d, optimizer SGD with momentum (K = 4 bytes/parameter): rank 0 "
              "holds %ld parameters: weights %.3f + reduced gradients %.3f + optimizer state "
              "%.3f = %.3f bytes/parameter; formula %s = %.3f (ZeRO paper, mixed precision: %s = "
              "%.3f); not counted: the layers' gradient buffers %.3f and the communication staging "
              "buffers %.3f bytes/parameter\n",
              m.stage, m.data, long(m.parameters), double(m.parameter_bytes) / n,
              double(m.gradient_bytes) / n, double(m.optimizer_bytes) / n, m.per_parameter(),
              tp::zero_formula_text(m.stage, 4).c_str(),
              tp::zero_bytes_per_parameter(m.stage, m.data, 4),
              tp::zero_formula_text(m.stage, 4, true).c_str(),
              tp::zero_paper_bytes_per_parameter(m.stage, m.data, 4),
              double(m.local_gradient_bytes) / n, double(m.staging_bytes) / n);
  std::fflush(stdout);
}

/// Training under plan<data<dyn, zero<Z>>, tensor<T>, pipeline<P>> on D = o.plan_data replicas:
/// see the file comment.
template <class Prec, int T, int P, int Z>
int run_plan(const options& o) {
  namespace tp = tessera::parallel;
  using Plan = tp::plan<tp::data<tessera::dyn, tp::zero<Z>>, tp::tensor<T>, tp::pipeline<P>>;
  using exec_space = Kokkos::DefaultExecutionSpace;
  constexpr int micro_batches = P > 1 ? 4 : 1;
  const int D = o.plan_data;
  const index_t granule = index_t(D) * micro_batches; // a global batch is a multiple of it
  constexpr bool scaled = !std::is_same_v<Prec, tessera::fp32>;
  const exec_space exec;
  // The watchdog: a rank that waits longer than --collective-timeout in one operation names
  // the ranks that did not arrive and ends the job (the mesh's groups inherit the timeout).
  auto world = tp::mpi_communicator::world();
  world.set_collective_timeout(o.collective_timeout);
  if (world.size() != D * T * P) { // every rank sees the same sizes: all print, then stop
    std::fprintf(stderr,
                 "train_fashion_mnist: rank %d of %d: --plan %s needs data x tensor x pipeline = "
                 "%d processes but the world has %d (launch it with mpiexec -n %d)\n",
                 world.rank(), world.size(), o.plan.c_str(), D * T * P, world.size(), D * T * P);
    std::fflush(stderr);
    world.barrier();
    world.abort(1);
  }
  auto mesh = tp::make_mesh_or_abort<Plan>(world);
  const bool root = mesh.world.rank() == 0;
  // A checkpoint directory that cannot be written fails now, not after the first epoch.
  if (!o.checkpoint.empty()) tp::check_plan_checkpoint_writable(o.checkpoint);
  const auto train_set = load(o.data, "train", o.limit);
  const auto test_set = load(o.data, "t10k", o.test_limit);
  if (root)
    std::fprintf(stderr,
                 "[train] %s, %s on %d processes, %ld training images, %ld test images, batch "
                 "%ld, %d micro-batch(es), %d thread(s) per process\n",
                 o.precision.c_str(), mesh.shape.name().c_str(), mesh.shape.world(),
                 long(train_set.n), long(test_set.n), long(o.batch), micro_batches,
                 exec_space().concurrency());
  tp::with_plan_stage<Plan, FashionCNN<Prec>, tp::one_f_one_b, micro_batches>(
      mesh, o.seed, std::size_t(1) << 20, [&](auto& stage) {
        nn::SoftmaxCrossEntropy loss;
        tessera::train::sgd opt{.lr = o.lr, .momentum = 0.9f};
        tessera::train::dynamic_scaler<> scaler;
        tessera::train::grad_accumulator accumulator; // --accum
        const auto params = stage.parameters();
        nn::set_recompute(stage.stage(), o.recompute); // this rank's Recompute segments
        // --zero: the optimizer sharded over the data group (the unsharded `opt` then unused).
        auto sharded = [&] {
          if constexpr (Z > 0)
            return stage.make_optimizer(opt);
          else
            return 0;
        }();
        if constexpr (Z == 0) (void)sharded;
        tessera::train::run_state state{
            .step = 0, .epoch = 0, .data_seed = o.seed, .precision = o.precision};
        if (!o.resume.empty()) {
          if constexpr (Z > 0) // the sharded optimizer's state: this rank's shard
            tp::load_plan_checkpoint(o.resume, stage, sharded, scaler, state);
          else
            tp::load_plan_checkpoint(o.resume, stage, opt, scaler, state);
          if (state.data_seed != o.seed)
            throw tessera::value_error(
                "train_fashion_mnist: " + o.resume + " was trained with --seed " +
                std::to_string(state.data_seed) + ", not " + std::to_string(o.seed));
          if (root)
            std::fprintf(stderr, "[train] resumed from %s after epoch %ld (%ld steps)\n",
                         o.resume.c_str(), long(state.epoch), long(state.step));
        }
        batch_buffers buf;
        std::vector<index_t> order(static_cast<std::size_t>(train_set.n));
        for (int epoch = static_cast<int>(state.epoch) + 1; epoch <= o.epochs; ++epoch) {
          std::iota(order.begin(), order.end(), index_t{0});
          std::mt19937_64 rng(o.seed * 1000003 + static_cast<std::uint64_t>(epoch));
          std::shuffle(order.begin(), order.end(), rng); // the same order on every rank
          const auto t0 = clock_type::now();
          auto last_bar = t0;
          double loss_sum = 0;
          index_t seen = 0, skipped = 0, steps = 0;
          // --accum K: K batches per optimizer step (a tail of fewer than K whole batches is
          // left out), each summed without the data-parallel reduction, reduced once.
          const index_t per_step = o.batch * o.accum;
          for (index_t b = 0; b < train_set.n; b += per_step) {
            const index_t e = std::min(train_set.n, b + o.batch);
            const index_t used = (e - b) / granule * granule, share = used / D;
            if (used == 0) continue;
            if (o.accum > 1 && b + per_step > train_set.n) break;
            ++steps;
            const float s = scaled ? scaler.scale() : 1.f;
            float l = 0;
            if (o.accum > 1) {
              l = stage.forward_backward_accumulated(
                  exec, o.accum,
                  [&](int k) {
                    const index_t first = b + index_t(k) * o.batch + mesh.at.data * share;
                    buf.fill(train_set, order, first, first + share);
                    return std::make_pair(buf.x, buf.y);
                  },
                  loss, accumulator, s);
            } else {
              const index_t first = b + mesh.at.data * share;
              buf.fill(train_set, order, first, first + share);
              l = stage.forward_backward(exec, buf.x, buf.y, loss, s);
            }
            if constexpr (Z > 0 && scaled) {
              skipped += sharded.step(exec, scaler, mesh.world) ? 0 : 1;
            } else if constexpr (Z > 0) {
              sharded.step(exec);
            } else if constexpr (scaled) {
              skipped += tp::consistent_step(exec, opt, scaler, params, mesh.world) ? 0 : 1;
            } else {
              opt.step(exec, params);
            }
            loss_sum += static_cast<double>(l) * static_cast<double>(used * o.accum);
            seen += used * o.accum;
            if (root && o.progress && (seconds_since(last_bar) > 0.25 || e == train_set.n)) {
              last_bar = clock_type::now();
              const int width = 30, fill = static_cast<int>(width * e / train_set.n);
              std::fprintf(stderr, "\r  epoch %d [%.*s%*s] %6ld/%ld  loss %.4f  %.0f images/s ",
                           epoch, fill, "##############################", width - fill, "", long(e),
                           long(train_set.n), loss_sum / static_cast<double>(seen),
                           static_cast<double>(seen) / seconds_since(t0));
            }
          }
          const double secs = seconds_since(t0);
          if (root && o.progress) std::fprintf(stderr, "\n");
          // Test accuracy: up to 1000 images per global batch, each data replica 1/D of them
          // (a remainder of fewer than D images left out).
          std::vector<index_t> test_order(static_cast<std::size_t>(test_set.n));
          std::iota(test_order.begin(), test_order.end(), index_t{0});
          index_t correct = 0, counted = 0;
          for (index_t b = 0; b < test_set.n; b += 1000) {
            const index_t share = (std::min(test_set.n, b + 1000) - b) / D;
            if (share == 0) continue;
            const index_t first = b + mesh.at.data * share;
            buf.fill(test_set, test_order, first, first + share);
            const tp::evaluation r = stage.evaluate(exec, buf.x, buf.y, loss);
            correct += r.correct;
            counted += r.count;
          }
          if (root) {
            std::printf("epoch %d  %s  %s  train loss %.4f  test accuracy %.2f%%  %.1f s  %.0f "
                        "images/s",
                        epoch, o.precision.c_str(), mesh.shape.name().c_str(),
                        loss_sum / static_cast<double>(seen),
                        counted > 0 ? 100.0 * double(correct) / double(counted) : 0.0, secs,
                        static_cast<double>(seen) / secs);
            if (scaled)
              std::printf("  (loss scale %g, %ld skipped steps)", scaler.scale(), long(skipped));
            std::printf("\n");
            std::fflush(stdout);
          }
          state.step += steps;
          state.epoch = epoch;
          if (!o.checkpoint.empty()) {
            if constexpr (Z > 0)
              tp::save_plan_checkpoint(o.checkpoint, stage, sharded, scaler, state);
            else
              tp::save_plan_checkpoint(o.checkpoint, stage, opt, scaler, state);
          }
        }
        if constexpr (Z > 0)
          if (root) print_zero_memory(stage.memory(sharded));
        const flat_masters whole = gather_masters(stage, o.seed);
        if (root) print_masters(whole, long(state.epoch));
      });
  return 0;
}

template <class Prec>
int run_any_plan(const options& o) {
  return examples::with_plan_degrees("train_fashion_mnist", o.plan_tensor, o.plan_pipeline,
                                     [&](auto t, auto p) {
                                       constexpr int T = decltype(t)::value, P = decltype(p)::value;
                                       return o.zero == 2   ? run_plan<Prec, T, P, 2>(o)
                                              : o.zero == 1 ? run_plan<Prec, T, P, 1>(o)
                                                            : run_plan<Prec, T, P, 0>(o);
                                     });
}
#endif

} // namespace

int main(int argc, char* argv[]) {
  options o;
  try {
    o = fashion::parse_options(argc, argv);
  } catch (const fashion::usage_error& e) {
    usage(e.what());
  }
#if defined(TESSERA_EXAMPLE_WITH_MPI)
  // MPI only for --plan: the default run stays a plain process.
  std::optional<tessera::parallel::mpi_environment> mpi;
  if (!o.plan.empty()) mpi.emplace(argc, argv);
#else
  if (!o.plan.empty())
    usage("--plan needs MPI, and this train_fashion_mnist was built without it (CMake did not "
          "find MPI)");
#endif
  examples::kokkos_args kargs(argv[0], o.threads); // --threads as Kokkos' flag
  Kokkos::ScopeGuard kokkos(kargs.argc, kargs.argv());
  try {
#if defined(TESSERA_EXAMPLE_WITH_MPI)
    // An error on one rank ends the whole job with that rank's message (MPI_Abort) rather than
    // leaving the other ranks waiting for it in a collective.
    if (!o.plan.empty())
      return tessera::parallel::abort_on_error("train_fashion_mnist", [&] {
        if (o.precision == "fp32") return run_any_plan<tessera::fp32>(o);
        if (o.precision == "bf16") return run_any_plan<tessera::bf16>(o);
        return run_any_plan<nn::fp8<>>(o);
      });
#endif
    if (o.precision == "fp32") return run<tessera::fp32>(o);
    if (o.precision == "bf16") return run<tessera::bf16>(o);
    if (o.precision == "fp16") return run<tessera::fp16>(o);
    return run<nn::fp8<>>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
