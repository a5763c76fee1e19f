#pragma once
// The command line of examples/train_char_gpt.cpp: its options and a strict parser, with the
// number parsing of examples/train_fashion_mnist_options.hpp (values parsed whole and
// range-checked; no "1e3" for an integer, no sign where none belongs). Any bad flag or value
// throws chargpt::usage_error (= fashion::usage_error) saying what is wrong; the parser never
// exits, never touches files, so it is tested on its own (tests/examples/test_char_gpt_options).
#include "train_fashion_mnist_options.hpp"

#include <cstdint>
#include <limits>
#include <string>

namespace chargpt {

using fashion::usage_error;

/// The compiled context bound: --context is 1..max_context.
inline constexpr std::int64_t max_context = 128;
/// The compiled (width, heads) pairs; each one is a model type instantiated for every
/// precision and vocabulary bound, so the list stays short (compile time).
struct model_size {
  std::int64_t width, heads;
};
inline constexpr model_size model_sizes[] = {{64, 2}, {128, 4}};
/// "64/2, 128/4": the list in error messages and the usage line.
inline std::string model_sizes_text() {
  std::string s;
  for (const auto& m : model_sizes)
    s += (s.empty() ? "" : ", ") + std::to_string(m.width) + "/" + std::to_string(m.heads);
  return s;
}

struct options {
  std::string precision = "fp32";
  int threads = 0;               // 0: Kokkos' default
  std::int64_t steps = 2000;     // optimizer steps; the cosine reaches lr / 10 here
  std::int64_t warmup = 100;     // linear warm-up steps (<= steps)
  std::int64_t stop_at = 0;      // stop after this step (0: at --steps); resume later
  std::int64_t batch = 16;       // contexts per optimizer step
  std::int64_t accum = 1;        // micro-batches per step (divides batch)
  float lr = 1e-3f;              // peak learning rate
  std::uint64_t seed = 1;        // model initialisation, batches and the sample
  std::int64_t eval_every = 100; // steps between `val loss` lines
  std::int64_t sample_len = 400; // characters generated at the end (0: none)
  float temperature = 0.8f;      // sampling temperature
  std::string data = "/usr/share/games/fortunes";
  std::string checkpoint, resume;
  bool progress = true;
  std::int64_t layers = 4;    // transformer blocks (run time)
  std::int64_t context = 128; // characters per context (1..max_context)
  std::int64_t width = 128;   // model width, one of model_sizes with heads
  std::int64_t heads = 4;     // attention heads
  std::string plan;           // "": one process, no MPI
  int plan_data = 1, plan_tensor = 1, plan_pipeline = 1; // the sizes --plan asked for
};

/// The usage line (without a trailing newline).
inline const char* usage_text() {
  return "usage: train_char_gpt [--precision fp32|bf16|fp8] [--threads N (0..4096, 0: default)] "
         "[--steps N (1..10000000)] [--warmup N (0..steps)] [--stop-at N (1..steps)] [--batch N "
         "(1..4096)] "
         "[--accum N (micro-batches per step, divides --batch)] [--lr X (finite, > 0)] "
         "[--seed N] [--eval-every N (1..10000000)] [--sample-len N (0..100000)] "
         "[--temperature X (finite, in (0, 100])] [--data DIR] [--checkpoint FILE (DIR under "
         "--plan)] "
         "[--resume FILE (DIR)] [--no-progress] [--layers N (1..64)] [--context N (2..128)] "
         "[--width D --heads H (D/H: 64/2 or 128/4)] "
         "[--plan data=D,tensor=T,pipeline=P (D 1..4096, T and P 1, 2 or 4; fp32 and the "
         "default model size; under mpiexec -n D*T*P)]";
}

/// Parses argv[1..argc); flags starting "--kokkos" are Kokkos' own and are skipped.
inline options parse_options(int argc, const char* const* argv) {
  using fashion::detail::parse_integer;
  using fashion::detail::parse_positive_float;
  options o;
  bool seen_warmup = false, seen_width = false, seen_heads = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i] ? argv[i] : "";
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc || !argv[i + 1]) throw usage_error("missing value after " + a);
      return argv[++i];
    };
    const auto nonempty = [&](std::string v) {
      if (v.empty()) throw usage_error(a + ": the value is empty");
      return v;
    };
    if (a == "--precision") {
      o.precision = next();
      if (o.precision != "fp32" && o.precision != "bf16" && o.precision != "fp8")
        throw usage_error("--precision '" + o.precision + "': must be fp32, bf16 or fp8");
    } else if (a == "--threads") {
      o.threads = parse_integer<int>(a, next(), 0, 4096);
    } else if (a == "--steps") {
      o.steps = parse_integer<std::int64_t>(a, next(), 1, 10000000);
    } else if (a == "--warmup") {
      o.warmup = parse_integer<std::int64_t>(a, next(), 0, 10000000);
      seen_warmup = true;
    } else if (a == "--stop-at") {
      o.stop_at = parse_integer<std::int64_t>(a, next(), 1, 10000000);
    } else if (a == "--batch") {
      o.batch = parse_integer<std::int64_t>(a, next(), 1, 4096);
    } else if (a == "--accum") {
      o.accum = parse_integer<std::int64_t>(a, next(), 1, 4096);
    } else if (a == "--lr") {
      o.lr = parse_positive_float(a, next(), 10.f);
    } else if (a == "--seed") {
      o.seed =
          parse_integer<std::uint64_t>(a, next(), 0, std::numeric_limits<std::uint64_t>::max());
    } else if (a == "--eval-every") {
      o.eval_every = parse_integer<std::int64_t>(a, next(), 1, 10000000);
    } else if (a == "--sample-len") {
      o.sample_len = parse_integer<std::int64_t>(a, next(), 0, 100000);
    } else if (a == "--temperature") {
      o.temperature = parse_positive_float(a, next(), 100.f);
    } else if (a == "--data") {
      o.data = nonempty(next());
    } else if (a == "--checkpoint") {
      o.checkpoint = nonempty(next());
    } else if (a == "--resume") {
      o.resume = nonempty(next());
    } else if (a == "--layers") {
      o.layers = parse_integer<std::int64_t>(a, next(), 1, 64);
    } else if (a == "--context") {
      o.context = parse_integer<std::int64_t>(a, next(), 2, max_context);
    } else if (a == "--width") {
      o.width = parse_integer<std::int64_t>(a, next(), 1, 1 << 20);
      seen_width = true;
    } else if (a == "--heads") {
      o.heads = parse_integer<std::int64_t>(a, next(), 1, 1 << 20);
      seen_heads = true;
    } else if (a == "--no-progress") {
      o.progress = false;
    } else if (a == "--plan") {
      o.plan = nonempty(next());
    } else if (a.rfind("--kokkos", 0) == 0) {
      continue; // Kokkos' own flags
    } else {
      throw usage_error("unknown argument '" + a + "'");
    }
  }
  // --width alone takes its compiled heads, --heads alone its compiled width; the pair must be
  // one of model_sizes.
  for (const auto& m : model_sizes) {
    if (seen_width && !seen_heads && m.width == o.width) o.heads = m.heads;
    if (seen_heads && !seen_width && m.heads == o.heads) o.width = m.width;
  }
  bool compiled = false;
  for (const auto& m : model_sizes)
    compiled = compiled || (m.width == o.width && m.heads == o.heads);
  if (!compiled)
    throw usage_error("--width " + std::to_string(o.width) + " --heads " + std::to_string(o.heads) +
                      ": not a compiled model size; the supported width/heads pairs are " +
                      model_sizes_text());
  // The default warm-up shrinks with a short run (at most a tenth of it); a given one must fit.
  if (!seen_warmup && o.warmup > o.steps / 10) o.warmup = o.steps / 10;
  if (o.warmup > o.steps)
    throw usage_error("--warmup " + std::to_string(o.warmup) + ": exceeds --steps " +
                      std::to_string(o.steps));
  if (o.stop_at > o.steps)
    throw usage_error("--stop-at " + std::to_string(o.stop_at) + ": exceeds --steps " +
                      std::to_string(o.steps));
  if (o.batch % o.accum != 0)
    throw usage_error("--accum " + std::to_string(o.accum) + ": must divide --batch " +
                      std::to_string(o.batch));
  if (!o.plan.empty()) { // train_fashion_mnist's syntax and rules (fashion::detail::parse_plan)
    if (o.accum != 1)
      throw usage_error("--plan does not take --accum (the plan run splits the batch into "
                        "micro-batches itself)");
    if (o.layers != 4 || o.context != max_context || o.width != 128 || o.heads != 4)
      throw usage_error("--plan trains the default model size (4 layers, width 128, heads 4, "
                        "context 128; the example instantiates its plans for that size only)");
    fashion::options f;
    f.plan = o.plan;
    fashion::detail::parse_plan(f);
    o.plan_data = f.plan_data;
    o.plan_tensor = f.plan_tensor;
    o.plan_pipeline = f.plan_pipeline;
  }
  return o;
}

/// "fp32, layers 4, width 128, heads 4, context 128": the precision and model size, written
/// into checkpoints (run_state::precision) so that resuming checks both.
inline std::string model_tag(const options& o) {
  return o.precision + ", layers " + std::to_string(o.layers) + ", width " +
         std::to_string(o.width) + ", heads " + std::to_string(o.heads) + ", context " +
         std::to_string(o.context);
}

} // namespace chargpt
