// The command line of examples/train_char_gpt.cpp (chargpt::parse_options): defaults, every flag
// with a good value parsed to that value, bad values refused with a usage_error naming the flag,
// and the cross-flag rules (--warmup <= --steps, --accum divides --batch, the default warm-up
// capped at a tenth of a short run), and --plan (train_fashion_mnist's syntax, any precision, not
// with --accum).
#include "support/messages.hpp"
#include "train_char_gpt_options.hpp"

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <vector>

using tessera::testing::what_contains;

namespace {

chargpt::options parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"train_char_gpt"};
  argv.insert(argv.end(), args.begin(), args.end());
  return chargpt::parse_options(static_cast<int>(argv.size()), argv.data());
}

void refused(const char* flag, const char* value) {
  INFO(flag << " '" << value << "'");
  REQUIRE_THROWS_MATCHES(parse({flag, value}), chargpt::usage_error, what_contains({flag}));
}

} // namespace

TEST_CASE("train_char_gpt: the documented defaults", "[examples][options]") {
  const auto o = parse({});
  CHECK(o.precision == "fp32");
  CHECK(o.threads == 0);
  CHECK(o.steps == 2000);
  CHECK(o.warmup == 100);
  CHECK(o.stop_at == 0);
  CHECK(o.batch == 16);
  CHECK(o.accum == 1);
  CHECK(o.lr == 1e-3f);
  CHECK(o.seed == 1);
  CHECK(o.eval_every == 100);
  CHECK(o.sample_len == 400);
  CHECK(o.temperature == 0.8f);
  CHECK(o.data == "/usr/share/games/fortunes");
  CHECK(o.checkpoint.empty());
  CHECK(o.resume.empty());
  CHECK(o.progress);
  CHECK(o.layers == 4);
  CHECK(o.context == 128);
  CHECK(o.width == 128);
  CHECK(o.heads == 4);
}

TEST_CASE("train_char_gpt: every flag parsed", "[examples][options]") {
  const auto o = parse({"--precision",  "bf16",   "--threads",     "2",
                        "--steps",      "300",    "--stop-at",     "200",
                        "--warmup",     "30",     "--batch",       "8",
                        "--accum",      "4",      "--lr",          "3e-4",
                        "--seed",       "7",      "--eval-every",  "50",
                        "--sample-len", "0",      "--temperature", "1.5",
                        "--data",       "/tmp/x", "--checkpoint",  "c.tsr",
                        "--resume",     "r.tsr",  "--no-progress", "--kokkos-threads=1",
                        "--layers",     "2",      "--context",     "32",
                        "--width",      "64",     "--heads",       "2"});
  CHECK(o.precision == "bf16");
  CHECK(o.threads == 2);
  CHECK(o.steps == 300);
  CHECK(o.warmup == 30);
  CHECK(o.stop_at == 200);
  CHECK(o.batch == 8);
  CHECK(o.accum == 4);
  CHECK(o.lr == 3e-4f);
  CHECK(o.seed == 7);
  CHECK(o.eval_every == 50);
  CHECK(o.sample_len == 0);
  CHECK(o.temperature == 1.5f);
  CHECK(o.data == "/tmp/x");
  CHECK(o.checkpoint == "c.tsr");
  CHECK(o.resume == "r.tsr");
  CHECK_FALSE(o.progress);
  CHECK(o.layers == 2);
  CHECK(o.context == 32);
  CHECK(o.width == 64);
  CHECK(o.heads == 2);
  CHECK(parse({"--precision", "fp8"}).precision == "fp8");
}

TEST_CASE("train_char_gpt: bad values refused naming the flag", "[examples][options]") {
  refused("--precision", "fp16");
  refused("--precision", "FP32");
  for (const char* v : {"0", "-1", "1e3", "10000001", "3x", ""}) refused("--steps", v);
  for (const char* v : {"0", "4097", "+4"}) refused("--batch", v);
  refused("--accum", "0");
  refused("--stop-at", "0");
  refused("--threads", "4097");
  for (const char* v : {"0", "-1e-3", "nan", "inf", "11", "abc"}) refused("--lr", v);
  refused("--temperature", "0");
  refused("--temperature", "101");
  refused("--eval-every", "0");
  refused("--sample-len", "100001");
  refused("--seed", "-1");
  refused("--data", "");
  refused("--checkpoint", "");
  for (const char* v : {"0", "65", "-1", "2.5"}) refused("--layers", v);
  for (const char* v : {"0", "1", "129", "x"}) refused("--context", v);
  refused("--width", "0");
  refused("--heads", "0");
  REQUIRE_THROWS_MATCHES(parse({"--steps"}), chargpt::usage_error,
                         what_contains({"missing value after --steps"}));
  refused("--plan", "");
  REQUIRE_THROWS_MATCHES(parse({"--plans", "data=2"}), chargpt::usage_error,
                         what_contains({"unknown argument '--plans'"}));
}

TEST_CASE("train_char_gpt: cross-flag rules", "[examples][options]") {
  CHECK(parse({"--steps", "20"}).warmup == 2); // default capped at steps / 10
  CHECK(parse({"--steps", "5"}).warmup == 0);
  CHECK(parse({"--steps", "20", "--warmup", "20"}).warmup == 20);
  REQUIRE_THROWS_MATCHES(parse({"--steps", "20", "--warmup", "21"}), chargpt::usage_error,
                         what_contains({"--warmup 21", "--steps 20"}));
  REQUIRE_THROWS_MATCHES(parse({"--steps", "20", "--stop-at", "21"}), chargpt::usage_error,
                         what_contains({"--stop-at 21", "--steps 20"}));
  REQUIRE_THROWS_MATCHES(parse({"--batch", "16", "--accum", "3"}), chargpt::usage_error,
                         what_contains({"--accum 3", "--batch 16"}));
}

TEST_CASE("train_char_gpt: model sizes", "[examples][options]") {
  // every compiled pair, given whole or by one of its two numbers
  for (const auto& m : chargpt::model_sizes) {
    const auto w = std::to_string(m.width), h = std::to_string(m.heads);
    const auto both = parse({"--width", w.c_str(), "--heads", h.c_str()});
    CHECK((both.width == m.width && both.heads == m.heads));
    const auto by_width = parse({"--width", w.c_str()});
    CHECK((by_width.width == m.width && by_width.heads == m.heads));
    const auto by_heads = parse({"--heads", h.c_str()});
    CHECK((by_heads.width == m.width && by_heads.heads == m.heads));
  }
  CHECK(chargpt::model_sizes_text() == "64/2, 128/4");
  CHECK(chargpt::model_tag(parse({})) == "fp32, layers 4, width 128, heads 4, context 128");
  CHECK(chargpt::model_tag(
            parse({"--precision", "bf16", "--layers", "2", "--width", "64", "--context", "16"})) ==
        "bf16, layers 2, width 64, heads 2, context 16");
  CHECK(parse({"--context", "128"}).context == chargpt::max_context);
  CHECK(parse({"--layers", "64"}).layers == 64);
  // anything else is refused with the list of the compiled pairs
  for (const auto& args :
       std::vector<std::vector<const char*>>{{"--width", "96"},
                                             {"--width", "256"},
                                             {"--heads", "8"},
                                             {"--width", "64", "--heads", "4"},
                                             {"--width", "128", "--heads", "2"}}) {
    std::vector<const char*> argv{"train_char_gpt"};
    argv.insert(argv.end(), args.begin(), args.end());
    REQUIRE_THROWS_MATCHES(chargpt::parse_options(static_cast<int>(argv.size()), argv.data()),
                           chargpt::usage_error,
                           what_contains({"not a compiled model size",
                                          "the supported width/heads pairs are 64/2, 128/4"}));
  }
}

TEST_CASE("train_char_gpt: --plan, with train_fashion_mnist's syntax and rules",
          "[examples][options]") {
  const auto none = parse({});
  CHECK(none.plan.empty());
  CHECK((none.plan_data == 1 && none.plan_tensor == 1 && none.plan_pipeline == 1));
  const auto o = parse({"--plan", "pipeline=4,data=3,tensor=2"});
  CHECK(o.plan == "pipeline=4,data=3,tensor=2");
  CHECK((o.plan_data == 3 && o.plan_tensor == 2 && o.plan_pipeline == 4));
  const auto t = parse({"--plan", "tensor=4"});
  CHECK((t.plan_data == 1 && t.plan_tensor == 4 && t.plan_pipeline == 1));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "tensor=3"}), chargpt::usage_error,
                         what_contains({"--plan tensor=3", "1, 2 or 4"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2,data=2"}), chargpt::usage_error,
                         what_contains({"data is given twice"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=02"}), chargpt::usage_error,
                         what_contains({"leading zeros"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "width=2"}), chargpt::usage_error,
                         what_contains({"'width=2' is not one of"}));
  // Plans train in every precision.
  for (const char* prec : {"fp32", "bf16", "fp8"})
    CHECK(parse({"--plan", "data=2", "--precision", prec}).precision == prec);
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2", "--accum", "2"}), chargpt::usage_error,
                         what_contains({"--plan does not take --accum"}));
  // A plan run saves and resumes plan checkpoints (directories) and may stop early.
  const auto ck =
      parse({"--plan", "data=2", "--checkpoint", "d", "--stop-at", "2", "--steps", "4"});
  CHECK((ck.checkpoint == "d" && ck.stop_at == 2));
  CHECK(parse({"--plan", "data=2", "--resume", "d"}).resume == "d");
  REQUIRE_THROWS_MATCHES(parse({"--plan", ""}), chargpt::usage_error, what_contains({"--plan"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2", "--layers", "2"}), chargpt::usage_error,
                         what_contains({"--plan trains the default model size"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2", "--width", "64"}), chargpt::usage_error,
                         what_contains({"--plan trains the default model size"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2", "--context", "64"}), chargpt::usage_error,
                         what_contains({"--plan trains the default model size"}));
}
