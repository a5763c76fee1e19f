// Checkpoints: round trip bit-identical, resume bit-identical (N steps == k steps + save + load
// + N - k steps), truncation at every byte offset and a flipped byte at every offset refused,
// mismatched names / shapes / optimizers / scalers / fp8 recipes refused, the caller's state
// untouched on refusal, atomic replacement (an existing checkpoint survives a failed write);
// another precision or parameter layout refused naming the saved and the expected value;
// directories and absurd length fields refused with tessera errors naming the file.
//
// The model is a tiny least-squares regression y = W x + b written directly on parameters (no nn
// layers): W is fake-quantized to fp8 E4M3 with a delayed-scaling fp8_meta and the gradient of W
// to E5M2 with a current-scaling one, so the fp8 states shape the trajectory; some steps get an
// injected inf so that the dynamic scaler skips them and backs off.
#include "support/messages.hpp"
#include "train_testing.hpp"

#include <tessera/train.hpp>
#include <tessera/train/checkpoint.hpp>

#include <catch2/catch.hpp>

#include <boost/hana/at.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <csignal>
#include <sys/resource.h>
#include <unistd.h>

using namespace tessera;          // NOLINT: test file, not a header
using namespace tessera::testing; // NOLINT
namespace fs = std::filesystem;
namespace hana = boost::hana;

namespace {

constexpr int in_dim = 3, out_dim = 4, samples = 64, batch = 8;

/// A scratch directory, removed at the end of the test.
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& tag)
      : path(fs::temp_directory_path() /
             ("tessera_train_ckpt_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<unsigned char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const fs::path& p, const std::vector<unsigned char>& b, std::size_t n) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(n));
}

/// The fixed data set: x uniform in [-1, 1), y = A x + c + noise, from counter-based streams.
struct dataset {
  std::vector<float> x, y;
  dataset() : x(samples * in_dim), y(samples * out_dim) {
    const counter_rng rx{7, 0}, ry{7, 1};
    for (int i = 0; i < samples * in_dim; ++i) x[i] = 2.f * rx.uniform01(i) - 1.f;
    for (int s = 0; s < samples; ++s)
      for (int o = 0; o < out_dim; ++o) {
        float v = 0.1f * static_cast<float>(o) + 0.05f * (ry.uniform01(s * out_dim + o) - 0.5f);
        for (int i = 0; i < in_dim; ++i) v += 0.5f * static_cast<float>(o - i) * x[s * in_dim + i];
        y[s * out_dim + o] = v;
      }
  }
};

/// Everything a training run owns.
template <class Opt, class Scaler>
struct run {
  nn::parameter<extents<out_dim, in_dim>> w{"lsq.weight", {}};
  nn::parameter<extents<out_dim>> b{"lsq.bias", {}};
  Opt opt;
  Scaler scaler;
  train::fp8_meta<train::delayed_scaling> w_meta{{.history_len = 4}};
  train::fp8_meta<train::current_scaling> g_meta{{.margin = 1}};
  train::run_state state{.step = 0, .epoch = 0, .data_seed = 12345, .precision = ""};

  run(Opt o, Scaler s, std::uint64_t init_seed) : opt(std::move(o)), scaler(std::move(s)) {
    fill_uniform(w.value, init_seed, -0.5f, 0.5f);
    fill_uniform(b.value, init_seed + 1, -0.5f, 0.5f);
  }
  auto parameters() const { return hana::make_tuple(w, b); }

  void save(const fs::path& p) const {
    train::save_checkpoint(p, parameters(), opt, scaler, state, w_meta, g_meta);
  }
  void load(const fs::path& p) {
    train::load_checkpoint(p, parameters(), opt, scaler, state, w_meta, g_meta);
  }

  /// Mean over the data set of 0.5 |W x + b - y|^2 (unquantized W).
  double loss(const dataset& d) const {
    const auto wv = snapshot(w.value), bv = snapshot(b.value);
    double l = 0;
    for (int s = 0; s < samples; ++s)
      for (int o = 0; o < out_dim; ++o) {
        double r = bv[o] - d.y[s * out_dim + o];
        for (int i = 0; i < in_dim; ++i) r += double(wv[o * in_dim + i]) * d.x[s * in_dim + i];
        l += 0.5 * r * r;
      }
    return l / samples;
  }

  /// One training step; the steps in `inject` get an inf in dW.
  void step(const dataset& d, const std::vector<std::int64_t>& inject) {
    const auto exec = exec_space(); // the default space, where the parameters live
    // Forward with W fake-quantized to E4M3 by the delayed-scaling state.
    const auto wv = snapshot(w.value), bv = snapshot(b.value);
    const float sw = w_meta.scale<fp8_e4m3>();
    std::vector<float> wq(wv.size());
    float amax_w = 0.f;
    for (std::size_t i = 0; i < wv.size(); ++i) {
      wq[i] = to_float(from_float<fp8_e4m3, saturate>(wv[i] * sw)) / sw;
      amax_w = std::max(amax_w, std::abs(wv[i]));
    }
    w_meta.record(amax_w);
    // The batch: `batch` samples drawn from (data_seed, epoch, step).
    const counter_rng pick{state.data_seed, static_cast<std::uint64_t>(state.epoch)};
    std::vector<float> gw(wv.size(), 0.f), gb(bv.size(), 0.f);
    const float scale = scaler.scale();
    for (int k = 0; k < batch; ++k) {
      const auto s =
          static_cast<int>(pick.bits(static_cast<std::uint64_t>(state.step * batch + k)) % samples);
      for (int o = 0; o < out_dim; ++o) {
        float pred = bv[o];
        for (int i = 0; i < in_dim; ++i) pred += wq[o * in_dim + i] * d.x[s * in_dim + i];
        const float r = (pred - d.y[s * out_dim + o]) * scale / batch; // scaled dloss/dpred
        gb[o] += r;
        for (int i = 0; i < in_dim; ++i) gw[o * in_dim + i] += r * d.x[s * in_dim + i];
      }
    }
    // dW through E5M2 with current scaling.
    float amax_g = 0.f;
    for (const float g : gw) amax_g = std::max(amax_g, std::abs(g));
    const float sg = g_meta.scale<fp8_e5m2>(amax_g);
    for (auto& g : gw) g = to_float(from_float<fp8_e5m2, saturate>(g * sg)) / sg;
    g_meta.record(amax_g);
    for (const auto t : inject)
      if (t == state.step) gw[5] = std::numeric_limits<float>::infinity();
    upload(w.grad, gw);
    upload(b.grad, gb);
    train::step(exec, opt, scaler, parameters());
    ++state.step;
    if (state.step % 8 == 0) ++state.epoch;
  }
};

/// Every bit of a run's state, for comparisons.
template <class R>
std::vector<std::vector<float>> full_state(const R& r) {
  std::vector<std::vector<float>> s = {snapshot(r.w.value), snapshot(r.b.value)};
  for (auto& b : snapshot_state(r.opt.state)) s.push_back(b);
  s.push_back({static_cast<float>(r.opt.steps()), r.scaler.scale(),
               static_cast<float>(r.state.step), static_cast<float>(r.state.epoch),
               static_cast<float>(r.state.data_seed), r.w_meta.scale_amax(),
               r.g_meta.scale_amax()});
  if constexpr (requires { r.scaler.growth_tracker(); })
    s.push_back({static_cast<float>(r.scaler.growth_tracker()),
                 static_cast<float>(r.scaler.policy().state())});
  s.push_back(r.w_meta.history());
  return s;
}
template <class R>
bool same_state(const R& a, const R& b) {
  const auto x = full_state(a), y = full_state(b);
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!bitwise_equal(x[i], y[i])) return false;
  return true;
}

using sgd_run = run<train::sgd, train::dynamic_scaler<train::hysteresis_policy<2>>>;
using adamw_run = run<train::adamw, train::static_scaler>;

sgd_run make_sgd_run(std::uint64_t seed) {
  return sgd_run(train::sgd{.lr = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-3f},
                 train::dynamic_scaler<train::hysteresis_policy<2>>(
                     {.init_scale = 1024.f, .growth_interval = 3}),
                 seed);
}
adamw_run make_adamw_run(std::uint64_t seed) {
  return adamw_run(train::adamw{.lr = 0.05f}, train::static_scaler{8.f}, seed);
}

// Steps 5, 6 and 11 overflow: with hysteresis 2 the 6th backs off, the 11th does not.
const std::vector<std::int64_t> overflow_steps = {5, 6, 11};

} // namespace

TEST_CASE("checkpoint round trip is bit-identical, and saving it again gives the same bytes",
          "[train][checkpoint]") {
  const scratch_dir dir("roundtrip");
  const dataset d;
  auto a = make_sgd_run(1);
  for (int s = 0; s < 9; ++s) a.step(d, overflow_steps);
  REQUIRE(a.opt.steps() == 7); // two of the 9 steps were skipped
  a.save(dir.path / "a.tsr");

  auto b = make_sgd_run(99); // other weights, no optimizer state, default scaler state
  REQUIRE_FALSE(same_state(a, b));
  b.load(dir.path / "a.tsr");
  REQUIRE(same_state(a, b));
  b.save(dir.path / "b.tsr");
  REQUIRE(read_bytes(dir.path / "a.tsr") == read_bytes(dir.path / "b.tsr"));

  // Before the first step (no optimizer state yet) too.
  auto c = make_adamw_run(3);
  c.save(dir.path / "c.tsr");
  auto e = make_adamw_run(4);
  for (int s = 0; s < 3; ++s) e.step(d, {});
  e.load(dir.path / "c.tsr");
  REQUIRE(same_state(c, e));
  REQUIRE(e.opt.steps() == 0);
}

TEST_CASE("resuming from a checkpoint gives the uninterrupted run's bits", "[train][checkpoint]") {
  const scratch_dir dir("resume");
  const dataset d;
  constexpr int total = 24;
  auto check = [&](auto make) {
    auto straight = make(5);
    for (int s = 0; s < total; ++s) straight.step(d, overflow_steps);
    for (const int k : {0, 1, 5, 6, 7, 12, 23}) {
      INFO("checkpoint after " << k << " steps");
      auto before = make(5);
      for (int s = 0; s < k; ++s) before.step(d, overflow_steps);
      before.save(dir.path / "mid.tsr");
      auto resumed = make(77); // a fresh process: other initial weights, empty state
      resumed.load(dir.path / "mid.tsr");
      REQUIRE(same_state(before, resumed));
      for (int s = k; s < total; ++s) resumed.step(d, overflow_steps);
      REQUIRE(same_state(straight, resumed));
    }
  };
  check(make_sgd_run);
  check(make_adamw_run);

  // The run really trains (the loss over the whole data set at least halves) and the scaler
  // follows the script. Scale by hand (init 1024, growth every 3 clean steps, hysteresis 2):
  // steps 0-2 clean -> 2048; 3-4 clean; 5 overflow (tolerated); 6 overflow -> 1024; 7-9 clean
  // -> 2048; 10 clean; 11 overflow (tolerated, count restarts); 12-14 -> 4096; 15-17 -> 8192;
  // 18-20 -> 16384; 21-23 -> 32768. Applied steps: 24 - 3 skipped = 21.
  auto r = make_sgd_run(5);
  const double loss0 = r.loss(d);
  for (int s = 0; s < total; ++s) r.step(d, overflow_steps);
  INFO("loss " << loss0 << " -> " << r.loss(d));
  REQUIRE(r.loss(d) < 0.5 * loss0);
  REQUIRE(r.scaler.scale() == 32768.f);
  REQUIRE(r.opt.steps() == 21);
}

TEST_CASE("a truncated checkpoint is refused at every length, changing nothing",
          "[train][checkpoint]") {
  const scratch_dir dir("truncate");
  const dataset d;
  auto a = make_sgd_run(1);
  for (int s = 0; s < 4; ++s) a.step(d, {});
  a.save(dir.path / "full.tsr");
  const auto bytes = read_bytes(dir.path / "full.tsr");
  REQUIRE(bytes.size() > 500);

  auto b = make_sgd_run(2);
  for (int s = 0; s < 2; ++s) b.step(d, {});
  const auto before = full_state(b);
  std::size_t refused = 0;
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(dir.path / "cut.tsr", bytes, n);
    try {
      b.load(dir.path / "cut.tsr");
    } catch (const tessera::error&) {
      ++refused;
    }
  }
  REQUIRE(refused == bytes.size());
  REQUIRE(full_state(b) == before);
  // Error messages name the file and say what is wrong.
  write_bytes(dir.path / "cut.tsr", bytes, bytes.size() / 2);
  REQUIRE_THROWS_WITH(b.load(dir.path / "cut.tsr"),
                      Catch::Contains("cut.tsr") && Catch::Contains("truncated"));
  // A missing file.
  REQUIRE_THROWS_WITH(b.load(dir.path / "none.tsr"), Catch::Contains("none.tsr"));
  // Trailing garbage.
  auto longer = bytes;
  longer.push_back(0);
  write_bytes(dir.path / "long.tsr", longer, longer.size());
  REQUIRE_THROWS_WITH(b.load(dir.path / "long.tsr"), Catch::Contains("unexpected bytes"));
  REQUIRE(full_state(b) == before);
}

TEST_CASE("a flipped byte anywhere is refused, changing nothing", "[train][checkpoint]") {
  const scratch_dir dir("flip");
  const dataset d;
  auto a = make_adamw_run(1);
  for (int s = 0; s < 3; ++s) a.step(d, {});
  a.save(dir.path / "good.tsr");
  const auto bytes = read_bytes(dir.path / "good.tsr");
  auto b = make_adamw_run(2);
  b.step(d, {});
  const auto before = full_state(b);
  for (const unsigned char mask : {0x01, 0x80}) {
    std::size_t refused = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      auto bad = bytes;
      bad[i] ^= mask;
      write_bytes(dir.path / "bad.tsr", bad, bad.size());
      try {
        b.load(dir.path / "bad.tsr");
      } catch (const tessera::error&) {
        ++refused;
      }
    }
    INFO("mask " << int(mask));
    REQUIRE(refused == bytes.size());
  }
  REQUIRE(full_state(b) == before);
  // A corrupted payload is reported as a checksum mismatch of its record: flip a byte of the
  // last float of W's payload (the first record; its checksum follows the payload).
  const std::string first = "param/lsq.weight";
  const std::size_t name_at = 24 + 4; // header, then the record's name length
  REQUIRE(std::string(bytes.begin() + name_at, bytes.begin() + name_at + first.size()) == first);
  const std::size_t payload_end = name_at + first.size() + 4 + 2 * 8 + 8 + 12 * 4;
  auto bad = bytes;
  bad[payload_end - 1] ^= 0x10;
  write_bytes(dir.path / "bad.tsr", bad, bad.size());
  REQUIRE_THROWS_WITH(b.load(dir.path / "bad.tsr"), Catch::Contains("bad.tsr") &&
                                                        Catch::Contains(first) &&
                                                        Catch::Contains("checksum"));
}

TEST_CASE("mismatched names, shapes, optimizers, scalers and fp8 states are refused",
          "[train][checkpoint]") {
  const scratch_dir dir("mismatch");
  const dataset d;
  auto a = make_sgd_run(1);
  for (int s = 0; s < 3; ++s) a.step(d, {});
  const fs::path file = dir.path / "a.tsr";
  a.save(file);

  auto b = make_sgd_run(2);
  b.step(d, {});
  const auto before = full_state(b);
  train::run_state rs = b.state;
  const auto w = b.w;
  const auto bias = b.b;

  SECTION("a parameter of another name") {
    nn::parameter<extents<out_dim>> renamed("lsq.offset", {});
    REQUIRE_THROWS_WITH(train::load_checkpoint(file, hana::make_tuple(w, renamed), b.opt, b.scaler,
                                               rs, b.w_meta, b.g_meta),
                        Catch::Contains("lsq.offset") && Catch::Contains("a.tsr"));
  }
  SECTION("a parameter of another shape") {
    nn::parameter<extents<in_dim, out_dim>> transposed("lsq.weight", {});
    REQUIRE_THROWS_AS(train::load_checkpoint(file, hana::make_tuple(transposed, bias), b.opt,
                                             b.scaler, rs, b.w_meta, b.g_meta),
                      shape_error);
  }
  SECTION("a parameter more, or fewer") {
    nn::parameter<extents<2>> extra("extra", {});
    REQUIRE_THROWS_WITH(train::load_checkpoint(file, hana::make_tuple(w, bias, extra), b.opt,
                                               b.scaler, rs, b.w_meta, b.g_meta),
                        Catch::Contains("param/extra"));
    REQUIRE_THROWS_WITH(
        train::load_checkpoint(file, hana::make_tuple(w), b.opt, b.scaler, rs, b.w_meta, b.g_meta),
        Catch::Contains("lsq.bias"));
  }
  SECTION("another optimizer") {
    train::adamw other{};
    REQUIRE_THROWS_WITH(
        train::load_checkpoint(file, b.parameters(), other, b.scaler, rs, b.w_meta, b.g_meta),
        Catch::Contains("optim/adamw/step"));
    REQUIRE(other.steps() == 0);
  }
  SECTION("another scaler, or a scaler whose bounds exclude the saved scale") {
    train::static_scaler st{2.f};
    REQUIRE_THROWS_AS(
        train::load_checkpoint(file, b.parameters(), b.opt, st, rs, b.w_meta, b.g_meta),
        value_error);
    REQUIRE(st.scale() == 2.f);
    train::dynamic_scaler<train::torch_policy> torch;
    REQUIRE_THROWS_WITH(
        train::load_checkpoint(file, b.parameters(), b.opt, torch, rs, b.w_meta, b.g_meta),
        Catch::Contains("policy"));
    train::dynamic_scaler<train::hysteresis_policy<2>> narrow(
        {.init_scale = 4096.f, .growth_interval = 3, .min_scale = 4096.f}); // saved: 2048
    REQUIRE_THROWS_WITH(
        train::load_checkpoint(file, b.parameters(), b.opt, narrow, rs, b.w_meta, b.g_meta),
        Catch::Contains("min_scale"));
  }
  SECTION("fp8 states: fewer, more, another recipe") {
    REQUIRE_THROWS_AS(train::load_checkpoint(file, b.parameters(), b.opt, b.scaler, rs, b.w_meta),
                      value_error);
    train::fp8_meta<train::current_scaling> more;
    REQUIRE_THROWS_AS(
        train::load_checkpoint(file, b.parameters(), b.opt, b.scaler, rs, b.w_meta, b.g_meta, more),
        value_error);
    train::fp8_meta<train::delayed_scaling> longer{{.history_len = 8}};
    REQUIRE_THROWS_WITH(
        train::load_checkpoint(file, b.parameters(), b.opt, b.scaler, rs, longer, b.g_meta),
        Catch::Contains("fp8/0/delayed/recipe"));
    REQUIRE_THROWS_WITH(
        train::load_checkpoint(file, b.parameters(), b.opt, b.scaler, rs, b.g_meta, b.w_meta),
        Catch::Contains("fp8/0"));
  }
  SECTION("not a checkpoint at all") {
    std::vector<unsigned char> junk(200, 'x');
    write_bytes(dir.path / "junk.tsr", junk, junk.size());
    REQUIRE_THROWS_WITH(b.load(dir.path / "junk.tsr"), Catch::Contains("magic"));
  }
  REQUIRE(full_state(b) == before);
  REQUIRE(rs.step == b.state.step);

  // fp8 states may be passed as ranges, pointers or Hana sequences: the same records.
  std::vector<train::fp8_meta<train::current_scaling>> gs = {b.g_meta};
  train::load_checkpoint(file, b.parameters(), b.opt, b.scaler, rs, hana::make_tuple(&b.w_meta),
                         gs);
  REQUIRE(gs[0].scale_amax() == a.g_meta.scale_amax());
  REQUIRE(b.w_meta.history() == a.w_meta.history());
  REQUIRE(rs.step == a.state.step);
}

TEST_CASE("saving is atomic: a failed write leaves the previous checkpoint intact",
          "[train][checkpoint]") {
  const scratch_dir dir("atomic");
  const dataset d;
  auto a = make_sgd_run(1);
  a.step(d, {});
  const fs::path file = dir.path / "ckpt.tsr";
  a.save(file);
  const auto old_bytes = read_bytes(file);

  // A larger state to write, and a file-size limit that stops the write half way (as a full
  // disk would). RLIMIT_FSIZE applies even to root; SIGXFSZ is ignored so write() fails with
  // EFBIG instead of killing the process.
  nn::parameter<extents<20000>> big("big", {});
  fill_uniform(big.value, 5, -1.f, 1.f);
  train::sgd opt{.lr = 0.1f};
  const auto params = hana::make_tuple(a.w, a.b, big);
  rlimit old_limit{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 40000; // the new file is over 80000 bytes
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  bool threw = false;
  std::string message;
  try {
    train::save_checkpoint(file, params, opt, a.scaler, a.state, a.w_meta, a.g_meta);
  } catch (const value_error& e) {
    threw = true;
    message = e.what();
  }
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  std::signal(SIGXFSZ, old_handler);
  INFO(message);
  REQUIRE(threw);
  REQUIRE_THAT(message, Catch::Contains("ckpt.tsr"));
  REQUIRE(read_bytes(file) == old_bytes);
  // No temporary file left behind.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    INFO(e.path());
    ++files;
  }
  REQUIRE(files == 1);
  // The old checkpoint still loads.
  auto b = make_sgd_run(3);
  b.load(file);
  REQUIRE(same_state(a, b));

  // Without the limit the same save succeeds and replaces the file.
  train::save_checkpoint(file, params, opt, a.scaler, a.state, a.w_meta, a.g_meta);
  REQUIRE(read_bytes(file).size() > 80000);

  // A directory that does not exist: refused, nothing created.
  REQUIRE_THROWS_WITH(a.save(dir.path / "missing" / "x.tsr"), Catch::Contains("missing"));
  REQUIRE_FALSE(fs::exists(dir.path / "missing"));
}

TEST_CASE("save refuses duplicate parameter names and state of other parameters",
          "[train][checkpoint]") {
  const scratch_dir dir("savecheck");
  const dataset d;
  auto a = make_sgd_run(1);
  a.step(d, {});
  nn::parameter<extents<out_dim>> dup("lsq.weight", {});
  REQUIRE_THROWS_AS(train::save_checkpoint(dir.path / "x.tsr", hana::make_tuple(a.w, dup), a.opt,
                                           a.scaler, a.state),
                    value_error);
  REQUIRE_THROWS_AS(
      train::save_checkpoint(dir.path / "x.tsr", hana::make_tuple(a.w), a.opt, a.scaler, a.state),
      shape_error);
  REQUIRE_FALSE(fs::exists(dir.path / "x.tsr"));
}

TEST_CASE("round trip over parameters of many shapes (scalar, empty, prime, rank 4)",
          "[train][checkpoint]") {
  const scratch_dir dir("shapes");
  const auto exec = exec_space(); // the default space, where the parameters live
  auto make = [] {
    return hana::make_tuple(
        nn::parameter<extents<>>("scalar", {}), nn::parameter<extents<0, 3>>("empty", {}),
        nn::parameter<extents<1>>("one", {}), nn::parameter<extents<97>>("prime", {}),
        nn::parameter<extents<2, 3, 5, 7>>("rank4", {}),
        nn::parameter<extents<129, 31>>("matrix", {}));
  };
  const auto p = make();
  randomize_params(p, 40);
  train::adamw opt{.lr = 0.01f};
  train::dynamic_scaler<train::torch_policy> scaler({.growth_interval = 5});
  std::vector<train::fp8_meta<train::delayed_scaling>> metas(
      3, train::fp8_meta<train::delayed_scaling>{
             {.history_len = 5, .amax_algo = train::amax_algorithm::most_recent}});
  for (int s = 0; s < 7; ++s) {
    randomize_params(p, 50 + s);
    train::step(exec, opt, scaler, p);
    for (std::size_t m = 0; m < metas.size(); ++m)
      metas[m].record(static_cast<float>(s * 3 + m) + 0.5f);
  }
  const train::run_state run{
      .step = 7, .epoch = 2, .data_seed = 0xfeedfacecafebeefull, .precision = "bf16"};
  train::save_checkpoint(dir.path / "s.tsr", p, opt, scaler, run, metas);

  const auto q = make();
  randomize_params(q, 41);
  train::adamw opt2{.lr = 0.01f};
  train::dynamic_scaler<train::torch_policy> scaler2({.growth_interval = 5});
  std::vector<train::fp8_meta<train::delayed_scaling>> metas2(
      3, train::fp8_meta<train::delayed_scaling>{
             {.history_len = 5, .amax_algo = train::amax_algorithm::most_recent}});
  train::run_state run2;
  run2.precision = "bf16"; // as saved: checked, not restored
  train::load_checkpoint(dir.path / "s.tsr", q, opt2, scaler2, run2, metas2);

  const auto pv = snapshot_params(p), qv = snapshot_params(q);
  for (std::size_t t = 0; t < pv.size(); t += 2) REQUIRE(bitwise_equal(pv[t], qv[t])); // values
  REQUIRE(snapshot_state(opt.state) == snapshot_state(opt2.state));
  REQUIRE(opt2.steps() == opt.steps());
  REQUIRE(scaler2.scale() == scaler.scale());
  REQUIRE(scaler2.growth_tracker() == scaler.growth_tracker());
  for (std::size_t m = 0; m < metas.size(); ++m) {
    REQUIRE(metas2[m].history() == metas[m].history());
    REQUIRE(metas2[m].scale<fp8_e4m3>() == metas[m].scale<fp8_e4m3>());
  }
  REQUIRE(run2.step == 7);
  REQUIRE(run2.epoch == 2);
  REQUIRE(run2.data_seed == 0xfeedfacecafebeefull);
  // One more step from each gives the same bits.
  randomize_params(p, 90);
  randomize_params(q, 90);
  train::step(exec, opt, scaler, p);
  train::step(exec, opt2, scaler2, q);
  REQUIRE(snapshot_params(p) == snapshot_params(q));
}

TEST_CASE("a checkpoint of another precision is refused, naming both precisions",
          "[train][checkpoint]") {
  const scratch_dir dir("precision");
  const dataset d;
  for (const auto& [saved, expected] : {std::pair<std::string, std::string>{"fp32", "bf16"},
                                        {"bf16", "fp32"},
                                        {"fp8", "bf16"},
                                        {"bf16", ""}}) {
    INFO("saved " << saved << ", resumed as " << expected);
    auto a = make_sgd_run(1);
    a.state.precision = saved;
    for (int s = 0; s < 3; ++s) a.step(d, {});
    a.save(dir.path / "a.tsr");
    auto b = make_sgd_run(2);
    b.state.precision = expected;
    b.step(d, {});
    const auto before = full_state(b);
    REQUIRE_THROWS_WITH(b.load(dir.path / "a.tsr"),
                        Catch::Contains("a.tsr") && Catch::Contains("run/precision") &&
                            Catch::Contains("saved '" + saved + "', expected '" + expected + "'"));
    REQUIRE(full_state(b) == before);
    REQUIRE(b.state.precision == expected);
    // The same precision loads.
    b.state.precision = saved;
    b.load(dir.path / "a.tsr");
    REQUIRE(same_state(a, b));
    REQUIRE(b.state.precision == saved);
  }
}

TEST_CASE("a parameter layout mismatch names the parameter, the saved and the expected layout",
          "[train][checkpoint]") {
  const scratch_dir dir("layout");
  auto a = make_sgd_run(1);
  const fs::path file = dir.path / "a.tsr";
  a.save(file);
  auto b = make_sgd_run(2);
  train::run_state rs = b.state;
  nn::parameter<extents<in_dim, out_dim>> transposed("lsq.weight", {});
  REQUIRE_THROWS_MATCHES(
      train::load_checkpoint(file, hana::make_tuple(transposed, b.b), b.opt, b.scaler, rs, b.w_meta,
                             b.g_meta),
      shape_error,
      what_contains(
          {"parameter layout", "'param/lsq.weight': saved fp32 (4, 3), expected fp32 (3, 4)"}));
  nn::parameter<extents<out_dim>> renamed("lsq.offset", {});
  REQUIRE_THROWS_MATCHES(train::load_checkpoint(file, hana::make_tuple(b.w, renamed), b.opt,
                                                b.scaler, rs, b.w_meta, b.g_meta),
                         value_error,
                         what_contains({"'param/lsq.offset': saved none, expected fp32 (4)",
                                        "'param/lsq.bias': saved fp32 (4), expected none"}));
}

TEST_CASE("directories, missing directories and old versions give tessera errors naming the file",
          "[train][checkpoint]") {
  const scratch_dir dir("paths");
  auto a = make_sgd_run(1);
  // A directory where a checkpoint file is expected: a tessera error, not std::ios_base::failure.
  const fs::path sub = dir.path / "adir";
  fs::create_directories(sub);
  REQUIRE_THROWS_MATCHES(a.load(sub), value_error, what_contains({"adir", "is a directory"}));
  REQUIRE_THROWS_MATCHES(a.save(sub), value_error, what_contains({"adir", "is a directory"}));
  REQUIRE(fs::is_directory(sub));
  // check_checkpoint_writable: before training, without leaving anything behind.
  REQUIRE_THROWS_MATCHES(train::check_checkpoint_writable(dir.path / "no" / "such" / "c.tsr"),
                         value_error, what_contains({"c.tsr", "does not exist"}));
  REQUIRE_THROWS_WITH(train::check_checkpoint_writable(sub), Catch::Contains("is a directory"));
  REQUIRE_NOTHROW(train::check_checkpoint_writable(dir.path / "c.tsr"));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++entries;
  REQUIRE(entries == 1); // adir only: the probe file is gone, no checkpoint was created
  // A version-1 file: refused as unsupported.
  a.save(dir.path / "v.tsr");
  auto bytes = read_bytes(dir.path / "v.tsr");
  bytes[8] = 1; // the version field
  write_bytes(dir.path / "v.tsr", bytes, bytes.size());
  REQUIRE_THROWS_WITH(a.load(dir.path / "v.tsr"),
                      Catch::Contains("v.tsr") &&
                          Catch::Contains("unsupported checkpoint format version 1"));
}

TEST_CASE("absurd lengths in a corrupt file are refused before anything is allocated",
          "[train][checkpoint]") {
  const scratch_dir dir("lengths");
  auto a = make_sgd_run(1);
  const auto before = full_state(a);
  // A hand-made file: header, then one record whose fields claim huge sizes.
  const auto file_with = [&](std::uint64_t count, std::uint32_t name_len, std::uint8_t rank,
                             std::int64_t extent, std::uint64_t length) {
    std::vector<unsigned char> b;
    const auto put = [&](const auto v) {
      const auto* p = reinterpret_cast<const unsigned char*>(&v);
      b.insert(b.end(), p, p + sizeof(v));
    };
    for (const char c : std::string("TSSRCKPT")) b.push_back(static_cast<unsigned char>(c));
    put(std::uint32_t{2});
    put(std::uint32_t{0});
    put(count);
    put(name_len);
    for (const char c : std::string("param/x")) b.push_back(static_cast<unsigned char>(c));
    b.push_back(1); // fp32
    b.push_back(rank);
    put(std::uint16_t{0});
    for (int k = 0; k < rank; ++k) put(extent);
    put(length);
    b.resize(b.size() + 64, 0); // a little payload
    write_bytes(dir.path / "bad.tsr", b, b.size());
  };
  const std::int64_t huge = std::int64_t(1) << 40;
  const std::vector<std::string> expect = {"more than the file holds", "more than the file holds",
                                           "declares", "name length", "checksum"};
  std::size_t k = 0;
  for (const auto& make : std::vector<std::function<void()>>{
           [&] { file_with(1, 7, 2, huge, std::uint64_t(huge) * std::uint64_t(huge) * 4); },
           [&] { file_with(1, 7, 1, std::int64_t(1) << 28, std::uint64_t(1) << 30); },
           [&] { file_with(1, 7, 1, 4, ~std::uint64_t(0)); },
           [&] { file_with(1, 0xFFFFFFFFu, 1, 4, 16); },
           [&] { file_with(~std::uint64_t(0), 7, 1, 4, 16); }}) {
    make();
    INFO("case " << k);
    REQUIRE_THROWS_MATCHES(a.load(dir.path / "bad.tsr"), tessera::error,
                           what_contains({"bad.tsr", expect[k]}));
    ++k;
  }
  REQUIRE(full_state(a) == before);
}

// Checkpoints stage parameter values and optimizer state through host buffers, so a file
// written from parameters in one memory space loads into parameters in another. On a host build
// both spaces are host memory; on a device build the default one is the device's.
TEST_CASE("a checkpoint saved from HostSpace parameters loads into default-space ones and back",
          "[train][checkpoint][memory]") {
  const scratch_dir dir("spaces");
  using dev_space = Kokkos::DefaultExecutionSpace::memory_space;
  const auto host_params =
      hana::make_tuple(train::parameter<extents<37, 5>, Kokkos::HostSpace>("w", {}),
                       train::parameter<extents<11>, Kokkos::HostSpace>("b", {}));
  const auto dev_params = hana::make_tuple(train::parameter<extents<37, 5>, dev_space>("w", {}),
                                           train::parameter<extents<11>, dev_space>("b", {}));
  randomize_params(host_params, 7);
  randomize_params(dev_params, 8); // different values: the load must replace them all
  train::sgd opt{.lr = 0.1f};
  train::static_scaler scaler;
  const train::run_state run{.step = 3, .epoch = 1, .data_seed = 5, .precision = "fp32"};
  train::save_checkpoint(dir.path / "host.tsr", host_params, opt, scaler, run);

  // to_host always copies into fresh host memory: an independent read of each space.
  const auto values = [](const auto& params) {
    std::vector<std::vector<float>> out;
    hana::for_each(params, [&](const auto& p) {
      const auto h = to_host(p.value);
      out.emplace_back(h.data(), h.data() + h.size());
    });
    return out;
  };
  const auto saved = values(host_params);
  REQUIRE(values(dev_params) != saved);
  train::sgd opt2{.lr = 0.1f};
  train::static_scaler scaler2;
  train::run_state run2;
  run2.precision = "fp32";
  train::load_checkpoint(dir.path / "host.tsr", dev_params, opt2, scaler2, run2);
  const auto loaded = values(dev_params);
  REQUIRE(loaded.size() == saved.size());
  for (std::size_t k = 0; k < saved.size(); ++k) REQUIRE(bitwise_equal(loaded[k], saved[k]));
  REQUIRE(run2.step == 3);

  // And back: saved from the default space, loaded into fresh HostSpace parameters.
  fill_uniform(hana::at_c<0>(dev_params).value, 9, -2.f, 2.f);
  train::save_checkpoint(dir.path / "dev.tsr", dev_params, opt2, scaler2, run2);
  const auto host2 = hana::make_tuple(train::parameter<extents<37, 5>, Kokkos::HostSpace>("w", {}),
                                      train::parameter<extents<11>, Kokkos::HostSpace>("b", {}));
  train::sgd opt3{.lr = 0.1f};
  train::static_scaler scaler3;
  train::run_state run3;
  run3.precision = "fp32";
  train::load_checkpoint(dir.path / "dev.tsr", host2, opt3, scaler3, run3);
  const auto dev_values = values(dev_params), host2_values = values(host2);
  REQUIRE_FALSE(bitwise_equal(dev_values[0], saved[0])); // the refill changed w
  for (std::size_t k = 0; k < dev_values.size(); ++k)
    REQUIRE(bitwise_equal(host2_values[k], dev_values[k]));
}
