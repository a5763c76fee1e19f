#pragma once
// The command line of examples/train_fashion_mnist.cpp: its options and a strict parser.
//
// Every value is parsed whole (no leading or trailing junk, no "1e3" for an integer, no sign
// where none belongs) and range-checked; --lr must be finite and positive. Any bad flag or value
// throws fashion::usage_error saying what is wrong; the parser never exits, never throws
// anything else (allocation failure aside), never touches files or MPI, so it can be tested and
// fuzzed on its own (tests/examples/test_example_options.cpp).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace fashion {

struct options {
  std::string precision = "fp32";
  int epochs = 1;
  int threads = 0; // 0: Kokkos' default
  std::int64_t limit = 6000;
  std::int64_t test_limit = 0; // 0: all 10,000 test images
  std::int64_t batch = 64;
  float lr = 0.05f;
  std::uint64_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint, resume;
  bool progress = true;
  // --recompute: FashionCNN's nn::Recompute segments recompute (any run; not training state)
  bool recompute = false;
  // --fixed-team: every step on the whole thread team (bitwise reproducible for a thread count);
  // default: train::team_governor moves steps to a smaller team when that measures faster (a
  // busy machine). One process only; a --plan run keeps its team.
  bool fixed_team = false;
  std::string plan;                                      // "" : one process, no MPI
  int plan_data = 1, plan_tensor = 1, plan_pipeline = 1; // the sizes --plan asked for
  double collective_timeout = 300; // seconds a --plan rank waits in a collective; 0: forever
  int zero = 0;  // --zero 1|2 (with --plan): the ZeRO stage of the data split; 0: none
  int accum = 1; // --accum K (with --plan): K batches of gradients per optimizer step
};

/// A bad command line; what() says what is wrong.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The usage line (without a trailing newline).
inline const char* usage_text() {
  return "usage: train_fashion_mnist [--precision fp32|bf16|fp16|fp8] [--epochs N (1..1000000)] "
         "[--threads N (0..4096, 0: default)] [--limit N | --full] [--test-limit N] "
         "[--batch N (1..1000000)] [--lr X (finite, > 0)] [--seed N] [--data DIR] "
         "[--checkpoint FILE] [--resume FILE] [--no-progress] [--recompute] [--fixed-team] "
         "[--plan data=D,tensor=T,pipeline=P (D 1..4096, T and P 1, 2 or 4; under mpiexec -n "
         "D*T*P)] "
         "[--collective-timeout SECONDS (0..86400, 0: none; with --plan, default 300)] "
         "[--zero 1|2 (with --plan)] [--accum K (1..1024, with --plan)]";
}

namespace detail {

/// A whole decimal integer in [lo, hi]: digits only (a leading '-' only where lo < 0).
template <class T>
T parse_integer(const std::string& flag, const std::string& text, T lo, T hi) {
  T v{};
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const bool digit_start = !text.empty() && (text[0] == '-' || (text[0] >= '0' && text[0] <= '9'));
  const auto [end, ec] = digit_start ? std::from_chars(first, last, v)
                                     : std::from_chars_result{first, std::errc::invalid_argument};
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc{} && end == last && (v < lo || v > hi)))
    throw usage_error(flag + " " + text + ": out of range (" + std::to_string(lo) + ".." +
                      std::to_string(hi) + ")");
  if (ec != std::errc{} || end != last)
    throw usage_error(flag + " '" + text + "': not a whole decimal integer");
  return v;
}

/// A whole decimal or scientific number, finite, in (0, hi].
inline float parse_positive_float(const std::string& flag, const std::string& text, float hi) {
  double v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const bool number_start =
      !text.empty() && ((text[0] >= '0' && text[0] <= '9') || text[0] == '.' || text[0] == '-');
  const auto [end, ec] = number_start ? std::from_chars(first, last, v)
                                      : std::from_chars_result{first, std::errc::invalid_argument};
  if (ec == std::errc::result_out_of_range) throw usage_error(flag + " " + text + ": out of range");
  if (ec != std::errc{} || end != last) throw usage_error(flag + " '" + text + "': not a number");
  if (!std::isfinite(v) || !(v > 0) || v > double(hi) || !(float(v) > 0.f)) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", double(hi));
    throw usage_error(flag + " " + text + ": must be finite and in (0, " + bound + "]");
  }
  return float(v);
}

/// The tensor and pipeline degrees the example instantiates (compile-time plans); the data
/// degree is free (data<dyn>), up to max_plan_data.
inline constexpr int plan_degrees[] = {1, 2, 4};

inline constexpr int max_plan_data = 4096;

/// --plan data=D,tensor=T,pipeline=P: comma-separated, any order, each at most once; D a whole
/// decimal in 1..max_plan_data without leading zeros, T and P one of plan_degrees.
inline void parse_plan(options& o) {
  const std::string form = "--plan " + o.plan + ": ";
  bool seen[3] = {false, false, false};
  std::size_t at = 0;
  while (at <= o.plan.size()) {
    const std::size_t comma = std::min(o.plan.find(',', at), o.plan.size());
    const std::string item = o.plan.substr(at, comma - at);
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq == std::string::npos ? item.size() : eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    const int k = key == "data" ? 0 : key == "tensor" ? 1 : key == "pipeline" ? 2 : -1;
    if (k < 0 || eq == std::string::npos)
      throw usage_error(form + "'" + item +
                        "' is not one of data=D, tensor=T, pipeline=P (comma-separated)");
    if (seen[k]) throw usage_error(form + key + " is given twice");
    seen[k] = true;
    const bool digits =
        !value.empty() && value[0] >= '1' && value[0] <= '9' &&
        std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int v = digits && value.size() <= 4 ? std::stoi(value) : -1;
    if (k == 0) {
      if (v < 1 || v > max_plan_data)
        throw usage_error(form + "the data degree must be a whole number in 1.." +
                          std::to_string(max_plan_data) +
                          " without leading zeros (got data=" + value + ")");
      o.plan_data = v;
    } else {
      if (std::find(std::begin(plan_degrees), std::end(plan_degrees), v) == std::end(plan_degrees))
        throw usage_error(form + "the " + key +
                          " degree must be 1, 2 or 4, the compile-time plans this example "
                          "instantiates (got " +
                          key + "=" + value + ")");
      (k == 1 ? o.plan_tensor : o.plan_pipeline) = v;
    }
    at = comma + 1;
  }
  if (o.precision == "fp16")
    throw usage_error("--plan trains in fp32, bf16 or fp8 (the example instantiates its plans "
                      "for those three only)");
}

} // namespace detail

/// Parses argv[1..argc); see the file comment. Flags starting "--kokkos" are Kokkos' own and
/// are skipped (with their "=value" part).
inline options parse_options(int argc, const char* const* argv) {
  options o;
  bool seen_limit = false, seen_full = false, seen_epochs = false;
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
      if (o.precision != "fp32" && o.precision != "bf16" && o.precision != "fp16" &&
          o.precision != "fp8")
        throw usage_error("--precision '" + o.precision + "': must be fp32, bf16, fp16 or fp8");
    } else if (a == "--epochs") {
      o.epochs = detail::parse_integer<int>(a, next(), 1, 1000000);
      seen_epochs = true;
    } else if (a == "--threads") {
      o.threads = detail::parse_integer<int>(a, next(), 0, 4096);
    } else if (a == "--limit") {
      o.limit = detail::parse_integer<std::int64_t>(a, next(), 0, std::int64_t(1) << 40);
      seen_limit = true;
    } else if (a == "--test-limit") {
      o.test_limit = detail::parse_integer<std::int64_t>(a, next(), 0, std::int64_t(1) << 40);
    } else if (a == "--full") {
      seen_full = true;
    } else if (a == "--batch") {
      o.batch = detail::parse_integer<std::int64_t>(a, next(), 1, 1000000);
    } else if (a == "--lr") {
      o.lr = detail::parse_positive_float(a, next(), 1e6f);
    } else if (a == "--seed") {
      o.seed = detail::parse_integer<std::uint64_t>(a, next(), 0,
                                                    std::numeric_limits<std::uint64_t>::max());
    } else if (a == "--data") {
      o.data = nonempty(next());
    } else if (a == "--checkpoint") {
      o.checkpoint = nonempty(next());
    } else if (a == "--resume") {
      o.resume = nonempty(next());
    } else if (a == "--no-progress") {
      o.progress = false;
    } else if (a == "--recompute") {
      o.recompute = true;
    } else if (a == "--fixed-team") {
      o.fixed_team = true;
    } else if (a == "--plan") {
      o.plan = nonempty(next());
    } else if (a == "--accum") {
      o.accum = detail::parse_integer<int>(a, next(), 1, 1024);
    } else if (a == "--zero") {
      o.zero = detail::parse_integer<int>(a, next(), 1, 2);
    } else if (a == "--collective-timeout") {
      o.collective_timeout = detail::parse_integer<int>(a, next(), 0, 86400);
    } else if (a.rfind("--kokkos", 0) == 0) {
      continue; // Kokkos' own flags
    } else {
      throw usage_error("unknown argument '" + a + "'");
    }
  }
  if (seen_full && seen_limit) throw usage_error("--full and --limit exclude each other");
  if (seen_full) {
    o.limit = 0;
    if (!seen_epochs) o.epochs = 3;
  }
  if (!o.plan.empty()) detail::parse_plan(o);
  if (o.accum != 1 && o.plan.empty())
    throw usage_error("--accum " + std::to_string(o.accum) +
                      " accumulates gradients under --plan (one data-parallel reduction per "
                      "optimizer step); give --plan data=D,... too");
  if (o.zero != 0 && o.plan.empty())
    throw usage_error("--zero " + std::to_string(o.zero) +
                      " shards the optimizer over the data-parallel ranks of a --plan run; give "
                      "--plan data=D,... too");
  return o;
}

} // namespace fashion
