// Parallel plans measured: one table per mode, printed as markdown by rank 0.
//
//   OMP_NUM_THREADS=1 bench_parallel throughput                 # one process
//   OMP_NUM_THREADS=1 mpiexec -n N --oversubscribe bench_parallel throughput  # N = 2, 4, 8
//   OMP_NUM_THREADS=1 mpiexec -n P bench_parallel bubble        # pipeline=P, P = 2 or 4
//   OMP_NUM_THREADS=1 mpiexec -n 8 --oversubscribe bench_parallel volume
//   OMP_NUM_THREADS=1 mpiexec -n 8 --oversubscribe bench_parallel zero
//   benchmarks/parallel/run.sh build                            # all of them
//
// throughput  FashionCNN fp32 training (SGD momentum), global batch 128 (best of 3 windows of
//             6 steps): images/s (wall clock) and images per CPU-second (getrusage user +
//             system time summed over all ranks: what the plan costs however the cores are
//             shared, so it holds on an oversubscribed machine). On N ranks: data=N with 64 KiB
//             gradient buckets (all-reduces start during backward) and with one bucket (no
//             overlap), data=N under ZeRO 1 and 2, and for even N data=N/2 with tensor=2, and
//             with pipeline=2 on 1F1B and interleaved 1F1B (V = 2), M = 4.
// bubble      plan<pipeline<P>> on a uniform MLP (8 x Linear(512, 512) + ReLU, then
//             Linear(512, 10)), global batch 512 in M micro-batches, GPipe, 1F1B and
//             interleaved 1F1B (V = 2): each stage's idle fraction (1 - compute time / step
//             time, pipeline_stats) beside the schedule's (simulate() of its table with equal
//             forward and backward costs, and the closed form (P - 1)/(V M + P - 1), V = 1 for
//             GPipe and 1F1B).
// volume      FashionCNN fp32, global batch 16, M = 2 (1F1B) with a pipeline: the bytes each
//             axis's collectives and sends carry in one step, summed over the ranks, counted by
//             counting_communicator, beside the analytic formula computed from the static
//             shapes, the split roles, the stage cuts and the schedule table (see volume());
//             then the data axis under ZeRO 0, 1, 2 on D = 2, 4, 8 by kind of collective, and
//             the ring algorithm's wire bytes against 2 (D - 1)/D (see zero_volume_row()).
// zero        FashionCNN fp32 under plan<data<dyn, zero<S>>> on D = 1, 2, 4, 8 ranks, S = 0, 1,
//             2, AdamW and SGD with momentum, after one step: the bytes per parameter a rank
//             holds (weights + reduced gradients + optimizer state; the largest over the ranks)
//             beside the formula (parallel/zero.hpp) and the ZeRO paper's mixed-precision one.
#include <tessera/nn.hpp>
#include <tessera/parallel/counting.hpp>
#include <tessera/parallel/mpi.hpp>
#include <tessera/parallel/runner.hpp>
#include <tessera/parallel/zero.hpp>
#include <tessera/train/adamw.hpp>
#include <tessera/train/sgd.hpp>

#include <boost/hana/for_each.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <sys/resource.h>
#include <tuple>
#include <vector>

namespace {

namespace nn = tessera::nn;
namespace tp = tessera::parallel;
using tessera::dyn;
using tessera::index_t;

using FashionCNN =
    nn::Sequential<nn::Input<1, 28, 28>, nn::Conv2d<1, 32, 3, nn::conv_options{.pad = 1}>, nn::ReLU,
                   nn::MaxPool2d<2>, nn::Conv2d<32, 64, 3, nn::conv_options{.pad = 1}>, nn::ReLU,
                   nn::MaxPool2d<2>, nn::Flatten, nn::Linear<3136, 128>, nn::ReLU,
                   nn::Linear<128, 10>>;
using L512 = nn::Linear<512, 512>;
using UniformMLP =
    nn::Sequential<L512, nn::ReLU, L512, nn::ReLU, L512, nn::ReLU, L512, nn::ReLU, L512, nn::ReLU,
                   L512, nn::ReLU, L512, nn::ReLU, L512, nn::ReLU, nn::Linear<512, 10>>;

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// A synthetic batch for Model: inputs uniform in [-1, 1), labels in [0, 10).
template <class Model>
struct batch {
  using first = std::remove_cvref_t<decltype(std::declval<Model&>().template layer<0>())>;
  tessera::Tensor<tessera::fp32, typename first::input_extents> x;
  Kokkos::View<int*> y;
  explicit batch(index_t n, std::uint32_t seed) : x("x", n), y("y", std::size_t(n)) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (index_t i = 0; i < x.size(); ++i) x.data()[i] = u(g);
    for (index_t i = 0; i < n; ++i) y(i) = int(g() % 10);
  }
};

// ---------------------------------------------------------------------------------------------
// throughput

/// CPU seconds (user + system, all threads) this process has used.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct speed {
  double images_per_second = 0;     ///< wall clock, best window
  double images_per_cpu_second = 0; ///< CPU time summed over the ranks, best window
};

template <class Plan, class Kind = tp::one_f_one_b, int M = 1>
speed images_per_second(tp::mpi_communicator world, index_t global_batch, std::size_t bucket_bytes,
                        int steps) {
  using C = tp::mpi_communicator;
  Kokkos::DefaultExecutionSpace exec;
  tp::mesh<Plan, C> mesh(world);
  speed best;
  tp::with_plan_stage<Plan, FashionCNN, Kind, M>(mesh, 1, bucket_bytes, [&](auto& stage) {
    nn::SoftmaxCrossEntropy loss;
    tessera::train::sgd opt{.lr = 0.01f, .momentum = 0.9f};
    auto z = stage.make_optimizer(opt); // ZeRO plans: sharded state, reduce-scatter, gather
    batch<FashionCNN> b(global_batch / mesh.shape.data, 7u + unsigned(mesh.at.data));
    auto step = [&] {
      stage.forward_backward(exec, b.x, b.y, loss);
      if constexpr (Plan::zero_stage > 0)
        z.step(exec);
      else
        opt.step(exec, stage.parameters());
    };
    for (int i = 0; i < 2; ++i) step(); // warm-up: buffers, workspaces, MPI connections
    // The best of 3 windows (rank 0's clock; the windows start and end with a barrier): the
    // machine may be shared, and a window another program slowed down measures that program.
    // CPU time counts what the plan computes however the cores are shared (and MPI's busy
    // waiting, so it errs against data=2).
    for (int window = 0; window < 3; ++window) {
      mesh.world.barrier();
      const auto t0 = clock_type::now();
      const double c0 = cpu_seconds();
      for (int i = 0; i < steps; ++i) step();
      double cpu = cpu_seconds() - c0;
      mesh.world.barrier();
      const double images = double(global_batch) * steps;
      best.images_per_second = std::max(best.images_per_second, images / seconds_since(t0));
      MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_SUM, world.native());
      best.images_per_cpu_second = std::max(best.images_per_cpu_second, images / cpu);
    }
  });
  return best;
}

int throughput(tp::mpi_communicator world) {
  // 128: each data=2 replica gets 64 samples. Below 64 rows gemm's automatic choice takes the
  // direct loop (min(M, N, K) < 64), several times slower on this model's Linear layers, which
  // would measure that choice rather than the plan.
  constexpr index_t global_batch = 128;
  constexpr int steps = 6;
  const int threads = Kokkos::DefaultExecutionSpace().concurrency();
  auto row = [&](const char* plan, const char* buckets, speed v) {
    if (world.rank() == 0)
      std::printf("| %s | %d | %d | %s | %.0f | %.0f |\n", plan, world.size(), threads, buckets,
                  v.images_per_second, v.images_per_cpu_second);
  };
  if (world.rank() == 0)
    std::printf("| plan | processes | threads per process | gradient buckets | images/s | images "
                "per CPU-second |\n|---|---|---|---|---|---|\n");
  const int n = world.size();
  const std::string d = std::to_string(n), half = std::to_string(n / 2);
  using data_plan = tp::plan<tp::data<dyn>>;
  if (n == 1) {
    row("one process", "-", images_per_second<tp::plan<>>(world, global_batch, 1 << 16, steps));
    return 0;
  }
  row(("data=" + d).c_str(), "64 KiB (overlapped)",
      images_per_second<data_plan>(world, global_batch, 1 << 16, steps));
  row(("data=" + d).c_str(), "one (no overlap)",
      images_per_second<data_plan>(world, global_batch, std::size_t(1) << 40, steps));
  row(("data=" + d + ", ZeRO 1").c_str(), "64 KiB (overlapped reduce-scatter)",
      images_per_second<tp::plan<tp::data<dyn, tp::zero<1>>>>(world, global_batch, 1 << 16, steps));
  row(("data=" + d + ", ZeRO 1").c_str(), "one (no overlap)",
      images_per_second<tp::plan<tp::data<dyn, tp::zero<1>>>>(world, global_batch,
                                                              std::size_t(1) << 40, steps));
  row(("data=" + d + ", ZeRO 2").c_str(), "64 KiB (overlapped reduce-scatter)",
      images_per_second<tp::plan<tp::data<dyn, tp::zero<2>>>>(world, global_batch, 1 << 16, steps));
  if (n % 2 == 0) {
    row(("data=" + half + ", tensor=2").c_str(), "64 KiB (overlapped)",
        images_per_second<tp::plan<tp::data<dyn>, tp::tensor<2>>>(world, global_batch, 1 << 16,
                                                                  steps));
    using pipe_plan = tp::plan<tp::data<dyn>, tp::pipeline<2>>;
    row(("data=" + half + ", pipeline=2, 1F1B M=4").c_str(), "64 KiB (overlapped)",
        images_per_second<pipe_plan, tp::one_f_one_b, 4>(world, global_batch, 1 << 16, steps));
    row(("data=" + half + ", pipeline=2, interleaved V=2 M=4").c_str(), "64 KiB (overlapped)",
        images_per_second<pipe_plan, tp::interleaved_1f1b<2>, 4>(world, global_batch, 1 << 16,
                                                                 steps));
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// bubble

template <int P, class Kind, int M>
void bubble_row(tp::mpi_communicator world, const char* kind) {
  using Plan = tp::plan<tp::pipeline<P>>;
  using S = tp::schedule<Kind, P, M>;
  Kokkos::DefaultExecutionSpace exec;
  tp::mesh<Plan, tp::mpi_communicator> mesh(world);
  constexpr index_t global_batch = 512; // micro-batches of >= 64 rows (see throughput())
  constexpr int steps = 9;
  tp::with_plan_stage<Plan, UniformMLP, Kind, M>(mesh, 1, 1 << 20, [&](auto& stage) {
    nn::SoftmaxCrossEntropy loss;
    tessera::train::sgd opt{.lr = 0.001f};
    batch<UniformMLP> b(global_batch, 11);
    // Medians over the steps (robust to a step another program slowed down).
    std::vector<double> idles, busys, walls;
    int recomputed = 0;
    for (int i = 0; i < steps + 1; ++i) {
      mesh.world.barrier();
      stage.forward_backward(exec, b.x, b.y, loss);
      opt.step(exec, stage.parameters());
      if (i == 0) continue; // warm-up
      const tp::pipeline_stats& s = stage.last_pipeline_stats();
      idles.push_back(s.idle_fraction());
      busys.push_back(s.busy_seconds);
      walls.push_back(s.wall_seconds);
      recomputed = s.recomputed;
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double idle = median(idles), busy = median(busys), wall = median(walls);
    double mine[4] = {idle, busy * 1e3, wall * 1e3, double(recomputed)}, all[4 * P];
    MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, world.native());
    if (world.rank() == 0) {
      double mean = 0;
      std::string idle_each, busy_each, wall_each, rec_each;
      char cell[32];
      for (int r = 0; r < P; ++r) {
        mean += all[4 * r] / P;
        const char* sep = r + 1 < P ? " / " : "";
        std::snprintf(cell, sizeof cell, "%.3f%s", all[4 * r], sep);
        idle_each += cell;
        std::snprintf(cell, sizeof cell, "%.1f%s", all[4 * r + 1], sep);
        busy_each += cell;
        std::snprintf(cell, sizeof cell, "%.1f%s", all[4 * r + 2], sep);
        wall_each += cell;
        std::snprintf(cell, sizeof cell, "%d%s", int(all[4 * r + 3]), sep);
        rec_each += cell;
      }
      // The schedule's idle fraction: simulated (forward = backward cost), and its closed form.
      std::printf("| %s | %d | %d | %.3f | %.3f | %.3f | %s | %s | %s | %s |\n", kind, P, M,
                  S::simulated.bubble(), S::bubble_fraction, mean, idle_each.c_str(),
                  busy_each.c_str(), wall_each.c_str(), rec_each.c_str());
    }
  });
}

template <int P>
void bubble_rows(tp::mpi_communicator world) {
  if constexpr (P == 2) bubble_row<P, tp::gpipe, 2>(world, "GPipe");
  bubble_row<P, tp::gpipe, 4>(world, "GPipe");
  bubble_row<P, tp::gpipe, 8>(world, "GPipe");
  if constexpr (P == 2) bubble_row<P, tp::one_f_one_b, 2>(world, "1F1B");
  bubble_row<P, tp::one_f_one_b, 4>(world, "1F1B");
  bubble_row<P, tp::one_f_one_b, 8>(world, "1F1B");
  if constexpr (P == 2) bubble_row<P, tp::interleaved_1f1b<2>, 2>(world, "interleaved V=2");
  bubble_row<P, tp::interleaved_1f1b<2>, 4>(world, "interleaved V=2");
  bubble_row<P, tp::interleaved_1f1b<2>, 8>(world, "interleaved V=2");
}

int bubble(tp::mpi_communicator world) {
  if (world.size() != 2 && world.size() != 4) {
    std::fprintf(stderr, "bench_parallel bubble: run on 2 or 4 processes (pipeline=P)\n");
    return 2;
  }
  if (world.rank() == 0)
    std::printf("| schedule | P | M | schedule idle (simulated, f = b) | closed form | measured "
                "idle (mean) | idle per stage | busy ms per stage | step ms per stage | "
                "recomputed forwards per stage |\n|---|---|---|---|---|---|---|---|---|---|\n");
  if (world.size() == 2)
    bubble_rows<2>(world);
  else
    bubble_rows<4>(world);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// volume

/// Elements per sample of layer I's output in Model (static shapes).
template <class Model, std::size_t I>
constexpr index_t out_elements() {
  using L = typename tp::model_traits<Model>::template layer<I>;
  using E = typename L::template output_extents<typename tp::layer_input<Model, I>::type>;
  index_t n = 1;
  for (std::size_t d = 1; d < E::rank; ++d) n *= E::static_extent(d);
  return n;
}
template <class Model, std::size_t I>
constexpr index_t in_elements() {
  using E = typename tp::layer_input<Model, I>::type;
  index_t n = 1;
  for (std::size_t d = 1; d < E::rank; ++d) n *= E::static_extent(d);
  return n;
}

/// Forwards a stage recomputes in one step: backwards whose micro-batch is not the stage's
/// latest forward (run_pipeline_stage's rule), from the schedule table.
template <class Kind>
int recomputes(int stages, int micro_batches, int s) {
  std::vector<tp::step> table(std::size_t(2 * stages * micro_batches));
  tp::fill_schedule(Kind{}, stages, micro_batches, table.data());
  int latest = -1, n = 0;
  for (int k = 0; k < 2 * micro_batches; ++k) {
    const tp::step& t = table[std::size_t(s * 2 * micro_batches + k)];
    if (t.kind == tp::pass::forward)
      latest = t.micro_batch;
    else if (t.micro_batch != latest)
      ++n, latest = t.micro_batch;
  }
  return n;
}

struct axis_bytes {
  double data = 0, tensor = 0, pipeline = 0;
};

/// The analytic bytes per step, summed over all ranks, of Plan training Model (fp32) on a
/// global batch B in M micro-batches on schedule Kind; b = B / D samples per replica, mb = b / M
/// per micro-batch, f_s = M + (forwards stage s recomputes, from the schedule table).
///   data (D > 1):     every rank all-reduces the gradients of its shard of its stage, 4 bytes
///                     each: D * 4 * sum over layers of (whole size for column-parallel layers,
///                     T * size for replicated ones, weight + T * bias for row-parallel ones);
///                     plus the 4-byte loss average on every rank.
///   tensor (T > 1):   each of the T ranks of a row-parallel layer on stage s all-reduces its
///                     fp32 output, mb * (output elements), f_s times; each of the T ranks of a
///                     column-parallel layer all-reduces its input gradient, mb * (input
///                     elements), M times, unless it is on the first stage with no parameters
///                     before it. Times D replicas.
///   pipeline (P > 1): at each cut, each of the D * T ranks on either side sends b * (cut
///                     activation elements, divided by T when the cut lies inside a column/row
///                     pair) * 4 bytes (activations forward, gradients backward); plus the
///                     4-byte loss broadcast on every rank.
///   interleaved_1f1b<V> (T = 1 here): the model is cut into P V chunks, so P V - 1 cuts.
template <class Plan, class Model, class Kind, int M>
axis_bytes analytic(index_t B) {
  constexpr int D = Plan::data_size, T = Plan::tensor_size, P = Plan::pipeline_size;
  constexpr int V = tp::virtual_stages_v<Kind>;
  static_assert(V == 1 || T == 1, "analytic: interleaved rows are counted without a tensor split");
  using bounds = tp::stage_bounds<Model, P * V, typename Plan::cuts>;
  constexpr auto roles = tp::tensor_split_roles<Model>;
  const double b = double(B) / D, mb = b / M, world = double(Plan::world_size);
  axis_bytes v;
  Model whole(0);
  auto stage_of = [&](std::size_t i) {
    int s = 0;
    while (s + 1 < P && bounds::value[std::size_t(s) + 1] <= i) ++s;
    return s;
  };
  bool params_before = false;
  std::vector<index_t> out_of(tp::model_traits<Model>::size);
  tp::for_each_layer(whole, [&](auto index, auto& layer) {
    constexpr std::size_t I = decltype(index)::value;
    constexpr tp::split_role role = T > 1 ? roles[I] : tp::split_role::replicate;
    out_of[I] = out_elements<Model, I>();
    const int s = stage_of(I);
    index_t n = 0;
    boost::hana::for_each(layer.parameters(), [&](const auto& p) { n += p.size(); });
    double data_elements = double(T) * double(n); // over the T ranks of one replica
    if constexpr (role == tp::split_role::column) {
      data_elements = double(n);
    } else if constexpr (role == tp::split_role::row) {
      const double bias = double(layer.bias().size());
      data_elements = double(n) - bias + T * bias;
    }
    if (D > 1) v.data += 4.0 * D * data_elements;
    if constexpr (role == tp::split_role::row) {
      const int forwards = M + recomputes<Kind>(P, M, s);
      v.tensor += 4.0 * D * T * forwards * mb * double(out_elements<Model, I>());
    } else if constexpr (role == tp::split_role::column) {
      if (s > 0 || params_before)
        v.tensor += 4.0 * D * T * M * mb * double(in_elements<Model, I>());
    }
    params_before = params_before || n > 0;
  });
  if (D > 1) v.data += 4.0 * world;
  for (int s = 0; s + 1 < P * V; ++s) {
    const std::size_t last_of_s = bounds::value[std::size_t(s) + 1] - 1;
    bool inside_pair = false;
    for (std::size_t i = 0; i <= last_of_s; ++i)
      if (roles[i] != tp::split_role::replicate) inside_pair = roles[i] == tp::split_role::column;
    const double act = double(out_of[last_of_s]) / (T > 1 && inside_pair ? T : 1);
    v.pipeline += 2.0 * D * T * b * act * 4.0;
  }
  if (P > 1) v.pipeline += 4.0 * world;
  return v;
}

template <class Plan, class Kind, int M>
void volume_row(tp::mpi_communicator world) {
  using C = tp::counting_communicator<tp::mpi_communicator>;
  constexpr index_t B = 16;
  const int N = Plan::world_size;
  // The plan runs on the first N ranks; the others wait.
  auto sub = world.split(world.rank() < N ? 0 : 1, world.rank());
  double measured[3] = {0, 0, 0};
  if (world.rank() < N) {
    Kokkos::DefaultExecutionSpace exec;
    tp::mesh<Plan, C> mesh{C(sub)};
    tp::with_plan_stage<Plan, FashionCNN, Kind, M>(mesh, 1, 1 << 16, [&](auto& stage) {
      nn::SoftmaxCrossEntropy loss;
      batch<FashionCNN> bt(B / Plan::data_size, 3);
      stage.forward_backward(exec, bt.x, bt.y, loss); // warm-up, not counted
      mesh.data.reset_counts();
      mesh.tensor.reset_counts();
      mesh.pipeline.reset_counts();
      stage.forward_backward(exec, bt.x, bt.y, loss);
      measured[0] = double(mesh.data.counts().total());
      measured[1] = double(mesh.tensor.counts().total());
      measured[2] = double(mesh.pipeline.counts().total());
    });
  }
  double sum[3] = {0, 0, 0};
  MPI_Reduce(measured, sum, 3, MPI_DOUBLE, MPI_SUM, 0, world.native());
  if (world.rank() == 0) {
    const axis_bytes a = analytic<Plan, FashionCNN, Kind, M>(B);
    auto cell = [](double got, double want) {
      static char text[96];
      std::snprintf(text, sizeof text, "%.0f / %.0f %s", got, want, got == want ? "(=)" : "(!)");
      return std::string(text);
    };
    std::printf("| %s%s | %d | %s | %s | %s |\n", Plan::name().c_str(),
                tp::virtual_stages_v<Kind> > 1 ? ", interleaved V=2" : "", M,
                cell(sum[0], a.data).c_str(), cell(sum[1], a.tensor).c_str(),
                cell(sum[2], a.pipeline).c_str());
  }
  world.barrier();
}

template <int S>
void zero_volume_row(tp::mpi_communicator world, int d); // below

int volume(tp::mpi_communicator world) {
  if (world.size() != 8) {
    std::fprintf(stderr, "bench_parallel volume: run on 8 processes\n");
    return 2;
  }
  if (world.rank() == 0)
    std::printf("FashionCNN fp32, global batch 16, bytes per step summed over ranks, measured / "
                "analytic\n\n| plan | micro-batches | data axis | tensor axis | pipeline axis "
                "|\n|---|---|---|---|---|\n");
  using K = tp::one_f_one_b;
  volume_row<tp::plan<>, K, 1>(world);
  volume_row<tp::plan<tp::data<2>>, K, 1>(world);
  volume_row<tp::plan<tp::tensor<2>>, K, 1>(world);
  volume_row<tp::plan<tp::pipeline<2>>, K, 2>(world);
  volume_row<tp::plan<tp::data<2>, tp::tensor<2>>, K, 1>(world);
  volume_row<tp::plan<tp::data<2>, tp::pipeline<2>>, K, 2>(world);
  volume_row<tp::plan<tp::tensor<2>, tp::pipeline<2>>, K, 2>(world);
  volume_row<tp::plan<tp::data<2>, tp::tensor<2>, tp::pipeline<2>>, K, 2>(world);
  using I = tp::interleaved_1f1b<2>; // 4 chunks: 3 cuts, each crossed both ways
  volume_row<tp::plan<tp::pipeline<2>>, I, 2>(world);
  volume_row<tp::plan<tp::data<2>, tp::pipeline<2>>, I, 2>(world);
  if (world.rank() == 0)
    std::printf("\nData axis under ZeRO, FashionCNN fp32, SGD momentum, one step (forward_backward "
                "+ optimizer step), bytes summed over ranks: handed to all-reduce / "
                "reduce-scatter / all-gather (measured), their total measured / analytic, the "
                "bytes a ring algorithm puts on the wire for those calls (from the measured "
                "counts) / the ring formula, and that per parameter per rank over 4 n\n\n| D | "
                "ZeRO stage | all-reduce / reduce-scatter / all-gather | handed, measured / "
                "analytic | ring wire, measured / formula | ring wire / (4 n D) |\n"
                "|---|---|---|---|---|---|\n");
  for (int d : {2, 4, 8}) {
    zero_volume_row<0>(world, d);
    zero_volume_row<1>(world, d);
    zero_volume_row<2>(world, d);
  }
  return 0;
}

/// The data axis under ZeRO stage S on D ranks (FashionCNN fp32, SGD momentum, one step:
/// forward_backward and the sharded optimizer's step), counted by kind and summed over the
/// ranks, beside the analytic count (n parameters, c = ceil(n / D) a shard, the 4-byte loss
/// all-reduce on each rank):
///   S = 0:     all-reduce 4 n (the gradient buckets)                            per rank
///   S = 1, 2:  reduce-scatter 4 n (the buckets), all-gather 4 c (updated shard) per rank
/// and the bytes a ring algorithm puts on the wire for those calls, from the measured counts
/// (all-reduce 2 (D - 1)/D of the buffer, reduce-scatter (D - 1)/D, all-gather D - 1 times the
/// part), beside the ring formula for the step: 2 (D - 1)/D 4 n per rank for S = 0,
/// (D - 1)/D 4 n + (D - 1) 4 c at S = 1 and 2 (the ZeRO paper: stages 1 and 2 move what data
/// parallelism does).
template <int S>
void zero_volume_row(tp::mpi_communicator world, int d) {
  using C = tp::counting_communicator<tp::mpi_communicator>;
  using Plan = tp::plan<tp::data<dyn, tp::zero<S>>>;
  auto sub = world.split(world.rank() < d ? 0 : 1, world.rank());
  double mine[4] = {0, 0, 0, 0}; // all-reduce, reduce-scatter, all-gather, parameters
  if (world.rank() < d) {
    Kokkos::DefaultExecutionSpace exec;
    tp::mesh<Plan, C> mesh{C(sub)};
    tp::with_plan_stage<Plan, FashionCNN>(mesh, 1, 1 << 16, [&](auto& stage) {
      auto z = stage.make_optimizer(tessera::train::sgd{.lr = 0.05f, .momentum = 0.9f});
      nn::SoftmaxCrossEntropy loss;
      batch<FashionCNN> bt(16 / d, 3);
      stage.forward_backward(exec, bt.x, bt.y, loss); // warm-up, not counted
      z.step(exec);
      mesh.data.reset_counts();
      stage.forward_backward(exec, bt.x, bt.y, loss);
      z.step(exec);
      const tp::comm_counts c = mesh.data.counts();
      mine[0] = double(c.all_reduce);
      mine[1] = double(c.reduce_scatter);
      mine[2] = double(c.all_gather);
      boost::hana::for_each(stage.parameters(), [&](const auto& p) { mine[3] += p.size(); });
    });
  }
  double sum[4] = {0, 0, 0, 0};
  MPI_Reduce(mine, sum, 4, MPI_DOUBLE, MPI_SUM, 0, world.native());
  if (world.rank() == 0) {
    const double D = d, n = sum[3] / D, c = std::ceil(n / D);
    const double loss_bytes = d > 1 ? 4.0 * D : 0.0;
    double want[3] = {0, 0, 0};
    if (d > 1) {
      want[0] = (S == 0 ? 4.0 * n * D : 0.0) + loss_bytes;
      want[1] = S >= 1 ? 4.0 * n * D : 0.0;
      want[2] = S >= 1 ? 4.0 * c * D : 0.0;
    }
    const double handed = sum[0] + sum[1] + sum[2], handed_want = want[0] + want[1] + want[2];
    const double ring = sum[0] * 2.0 * (D - 1) / D + sum[1] * (D - 1) / D + sum[2] * (D - 1);
    const double ring_formula =
        D * (S == 0 ? 2.0 * (D - 1) / D * 4.0 * n : (D - 1) / D * 4.0 * n + (D - 1) * 4.0 * c) +
        loss_bytes * 2.0 * (D - 1) / D;
    std::printf("| %d | %d | %.0f / %.0f / %.0f | %.0f / %.0f %s | %.0f / %.0f %s | %.2f |\n", d, S,
                sum[0], sum[1], sum[2], handed, handed_want, handed == handed_want ? "(=)" : "(!)",
                ring, ring_formula, std::fabs(ring - ring_formula) < 1 ? "(=)" : "(!)",
                ring / (4.0 * n * D));
  }
  world.barrier();
}

// ---------------------------------------------------------------------------------------------
// zero

/// The zero rows' gradient buckets: 256 KiB, so FashionCNN's gradient is seven buckets (its
/// first Linear weight, 95% of it, cut across six) and stage 2 stages two of them.
constexpr std::size_t zero_bucket_bytes = std::size_t(1) << 18;

template <int S, class Optimizer>
void zero_row(tp::mpi_communicator world, int d, const char* name, const Optimizer& opt,
              int state_bytes) {
  using Plan = tp::plan<tp::data<dyn, tp::zero<S>>>;
  auto sub = world.split(world.rank() < d ? 0 : 1, world.rank());
  // bytes per parameter (largest), not counted: layers' gradients, transient staging
  double mine[3] = {0, 0, 0};
  if (world.rank() < d) {
    Kokkos::DefaultExecutionSpace exec;
    tp::mesh<Plan, tp::mpi_communicator> mesh(sub);
    tp::with_plan_stage<Plan, FashionCNN>(mesh, 1, zero_bucket_bytes, [&](auto& stage) {
      auto z = stage.make_optimizer(opt);
      nn::SoftmaxCrossEntropy loss;
      batch<FashionCNN> bt(16 / d, 3);
      stage.forward_backward(exec, bt.x, bt.y, loss);
      z.step(exec); // the optimizer state exists from the first step
      const tp::zero_memory m = stage.memory(z);
      mine[0] = m.per_parameter();
      mine[1] = double(m.local_gradient_bytes) / double(m.parameters);
      mine[2] = double(m.staging_bytes) / double(m.parameters);
    });
  }
  double worst[3] = {0, 0, 0};
  MPI_Reduce(mine, worst, 3, MPI_DOUBLE, MPI_MAX, 0, world.native());
  if (world.rank() == 0)
    std::printf("| %s | %d | %d | %.4f | %s = %.4f | %s = %.4f | %.1f | %.2f |\n", name, d, S,
                worst[0], tp::zero_formula_text(S, state_bytes).c_str(),
                tp::zero_bytes_per_parameter(S, d, state_bytes),
                tp::zero_formula_text(S, state_bytes, true).c_str(),
                tp::zero_paper_bytes_per_parameter(S, d, state_bytes), worst[1], worst[2]);
  world.barrier();
}

int zero(tp::mpi_communicator world) {
  if (world.size() != 8) {
    std::fprintf(stderr, "bench_parallel zero: run on 8 processes\n");
    return 2;
  }
  if (world.rank() == 0)
    std::printf("FashionCNN fp32 (421,642 parameters), bytes per parameter per rank after one "
                "step (largest over the ranks): weights + reduced gradients + optimizer state, "
                "measured, beside the formula (tessera: fp32 weights are the masters) and the "
                "ZeRO paper's (fp16 weights and gradients); the layers' own gradient buffers "
                "and the transient staging (the all-gather's, stage 2's two bucket-sized "
                "reduce-scatter buffers; buckets of 256 KiB) are not in either\n\n| optimizer | D "
                "| ZeRO stage | measured | formula | paper | layers' gradients | staging "
                "|\n|---|---|---|---|---|---|---|---|\n");
  const tessera::train::adamw adam{.lr = 1e-3f};
  const tessera::train::sgd sgd{.lr = 0.05f, .momentum = 0.9f};
  for (int d : {1, 2, 4, 8}) {
    zero_row<0>(world, d, "AdamW", adam, 8);
    zero_row<1>(world, d, "AdamW", adam, 8);
    zero_row<2>(world, d, "AdamW", adam, 8);
  }
  for (int d : {1, 2, 4, 8}) {
    zero_row<0>(world, d, "SGD momentum", sgd, 4);
    zero_row<1>(world, d, "SGD momentum", sgd, 4);
    zero_row<2>(world, d, "SGD momentum", sgd, 4);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  tessera::parallel::mpi_environment mpi(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  int rc = 2;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    auto world = tp::mpi_communicator::world();
    if (mode == "throughput")
      rc = throughput(world);
    else if (mode == "bubble")
      rc = bubble(world);
    else if (mode == "volume")
      rc = volume(world);
    else if (mode == "zero")
      rc = zero(world);
    else if (world.rank() == 0)
      std::fprintf(stderr,
                   "usage: bench_parallel throughput|bubble|volume|zero (see the source)\n");
  }
  return rc;
}
