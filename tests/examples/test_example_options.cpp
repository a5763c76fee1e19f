// The command line of examples/train_fashion_mnist.cpp (fashion::parse_options): every flag
// with good values (parsed to the right value) and bad ones (refused with fashion::usage_error
// naming the flag): non-numbers, trailing junk, scientific notation for integers, signs, out
// of range, non-finite or non-positive learning rates, missing values, unknown flags.
#include "support/messages.hpp"
#include "train_fashion_mnist_options.hpp"

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <vector>

using tessera::testing::what_contains;

namespace {

fashion::options parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"train_fashion_mnist"};
  argv.insert(argv.end(), args.begin(), args.end());
  return fashion::parse_options(static_cast<int>(argv.size()), argv.data());
}

/// `flag value` is refused with a usage_error whose message contains `flag`.
void refused(const char* flag, const char* value) {
  INFO(flag << " '" << value << "'");
  REQUIRE_THROWS_MATCHES(parse({flag, value}), fashion::usage_error, what_contains({flag}));
}

} // namespace

TEST_CASE("no flags: the documented defaults", "[examples][options]") {
  const auto o = parse({});
  CHECK(o.precision == "fp32");
  CHECK(o.epochs == 1);
  CHECK(o.threads == 0);
  CHECK(o.limit == 6000);
  CHECK(o.test_limit == 0);
  CHECK(o.batch == 64);
  CHECK(o.lr == 0.05f);
  CHECK(o.seed == 1);
  CHECK(o.data == "/usr/share/datasets/fashion-mnist");
  CHECK(o.checkpoint.empty());
  CHECK(o.resume.empty());
  CHECK(o.progress);
  CHECK(o.plan.empty());
  CHECK(o.collective_timeout == 300);
  CHECK(o.zero == 0);
}

TEST_CASE("integer flags take whole decimal integers in range", "[examples][options]") {
  CHECK(parse({"--epochs", "7"}).epochs == 7);
  CHECK(parse({"--epochs", "1000000"}).epochs == 1000000);
  CHECK(parse({"--threads", "0"}).threads == 0);
  CHECK(parse({"--threads", "16"}).threads == 16);
  CHECK(parse({"--limit", "0"}).limit == 0);
  CHECK(parse({"--limit", "123"}).limit == 123);
  CHECK(parse({"--test-limit", "500"}).test_limit == 500);
  CHECK(parse({"--batch", "1"}).batch == 1);
  CHECK(parse({"--batch", "1000"}).batch == 1000);
  CHECK(parse({"--seed", "0"}).seed == 0);
  CHECK(parse({"--seed", "18446744073709551615"}).seed == 18446744073709551615ull);
  CHECK(parse({"--collective-timeout", "0"}).collective_timeout == 0);
  CHECK(parse({"--collective-timeout", "30"}).collective_timeout == 30);

  for (const char* flag : {"--epochs", "--threads", "--limit", "--test-limit", "--batch", "--seed",
                           "--collective-timeout"})
    for (const char* bad : {"abc", "", "2x", "1e3", " 3", "3 ", "+3", "0x10", "3.0", "--", "1,000"})
      refused(flag, bad);
  // Out of range, including values that do not fit the type at all.
  for (const char* bad : {"0", "-1", "1000001", "99999999999999999999"}) refused("--epochs", bad);
  for (const char* bad : {"-3", "-1", "4097", "2147483648"}) refused("--threads", bad);
  for (const char* bad : {"0", "-5", "1000001"}) refused("--batch", bad);
  for (const char* bad : {"-1", "1099511627777"}) refused("--limit", bad);
  for (const char* bad : {"-1"}) refused("--test-limit", bad);
  for (const char* bad : {"-1", "18446744073709551616"}) refused("--seed", bad);
  for (const char* bad : {"-1", "86401"}) refused("--collective-timeout", bad);
}

TEST_CASE("the learning rate (--lr) takes a finite positive number", "[examples][options]") {
  CHECK(parse({"--lr", "0.1"}).lr == 0.1f);
  CHECK(parse({"--lr", "1e-3"}).lr == 1e-3f);
  CHECK(parse({"--lr", "2"}).lr == 2.f);
  CHECK(parse({"--lr", ".5"}).lr == 0.5f);
  for (const char* bad : {"inf", "-inf", "nan", "NaN", "infinity", "0", "0.0", "-0.1", "1e-60",
                          "1e39", "2000000", "abc", "", "0.1x", " 0.1", "0x1p-3", "+0.1"})
    refused("--lr", bad);
}

TEST_CASE("string flags: precision names, paths, plans", "[examples][options]") {
  for (const char* p : {"fp32", "bf16", "fp16", "fp8"})
    CHECK(parse({"--precision", p}).precision == p);
  for (const char* bad : {"fp64", "FP32", "", "fp32 ", "bf16x", "fp16 "})
    refused("--precision", bad);

  CHECK(parse({"--data", "/tmp/x"}).data == "/tmp/x");
  CHECK(parse({"--checkpoint", "ck.bin"}).checkpoint == "ck.bin");
  CHECK(parse({"--resume", "ck.bin"}).resume == "ck.bin");
  for (const char* flag : {"--data", "--checkpoint", "--resume", "--plan"}) refused(flag, "");

  const auto p = parse({"--plan", "pipeline=2,data=2"});
  CHECK(p.plan_data == 2);
  CHECK(p.plan_tensor == 1);
  CHECK(p.plan_pipeline == 2);
  const auto t = parse({"--plan", "tensor=2"});
  CHECK((t.plan_data == 1 && t.plan_tensor == 2 && t.plan_pipeline == 1));
  // Any data degree (data<dyn>); tensor and pipeline degrees 1, 2 or 4.
  const auto d3 = parse({"--plan", "data=3"});
  CHECK((d3.plan_data == 3 && d3.plan_tensor == 1 && d3.plan_pipeline == 1));
  const auto big = parse({"--plan", "tensor=4,data=4096,pipeline=4"});
  CHECK((big.plan_data == 4096 && big.plan_tensor == 4 && big.plan_pipeline == 4));
  const auto d7 = parse({"--plan", "pipeline=1,data=7,tensor=2"});
  CHECK((d7.plan_data == 7 && d7.plan_tensor == 2 && d7.plan_pipeline == 1));
  for (const char* bad : {"data=2,data=2",    "tensor",      "tensor=",
                          "tensor=2,",        "gpu=2",       "data=2;tensor=2",
                          "data=02",          "data=0",      "data=-1",
                          "data=+3",          "data=4097",   "data=99999999999",
                          "data=3.0",         "data= 3",     "tensor=3",
                          "tensor=8",         "pipeline=3",  "pipeline=0",
                          "tensor=04",        "pipeline=2x", ",",
                          "data=2,,tensor=2", "=2",          "data==2"})
    refused("--plan", bad);
  // The messages say which rule was broken.
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=0"}), fashion::usage_error,
                         what_contains({"data degree", "1..4096"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "tensor=3"}), fashion::usage_error,
                         what_contains({"tensor=3", "tensor degree must be 1, 2 or 4"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "pipeline=8"}), fashion::usage_error,
                         what_contains({"pipeline=8", "pipeline degree must be 1, 2 or 4"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2,data=3"}), fashion::usage_error,
                         what_contains({"data is given twice"}));
  REQUIRE_THROWS_MATCHES(parse({"--plan", "gpu=2"}), fashion::usage_error,
                         what_contains({"'gpu=2' is not one of"}));
  CHECK(parse({"--plan", "data=2", "--precision", "fp8"}).precision == "fp8");
  CHECK(parse({"--plan", "data=2", "--precision", "fp8", "--zero", "2"}).zero == 2);
  // fp8 plan checkpoints hold each rank's scaling states (parallel/checkpoint.hpp).
  const auto fp8_ck = parse({"--plan", "data=2", "--precision", "fp8", "--checkpoint", "c"});
  CHECK((fp8_ck.precision == "fp8" && fp8_ck.checkpoint == "c"));
  REQUIRE_THROWS_AS(parse({"--plan", "data=2", "--precision", "fp16"}), fashion::usage_error);
  // Plan checkpoints: --checkpoint and --resume name a directory under --plan.
  const auto ck = parse({"--plan", "data=2", "--checkpoint", "c", "--resume", "r"});
  CHECK((ck.plan_data == 2 && ck.checkpoint == "c" && ck.resume == "r"));
}

TEST_CASE("the zero flag (--zero 1|2) takes a ZeRO stage, with --plan only",
          "[examples][options]") {
  CHECK(parse({"--plan", "data=2", "--zero", "1"}).zero == 1);
  CHECK(parse({"--zero", "2", "--plan", "data=3,tensor=2"}).zero == 2);
  for (const char* bad : {"0", "3", "-1", "1.0", "two", "01x"}) {
    INFO("--zero '" << bad << "'");
    REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2", "--zero", bad}), fashion::usage_error,
                           what_contains({"--zero"}));
  }
  REQUIRE_THROWS_MATCHES(parse({"--zero", "1"}), fashion::usage_error,
                         what_contains({"--zero 1", "--plan"}));
  // With plan checkpoints: each rank saves its shard of the optimizer state.
  const auto ck = parse({"--plan", "data=2", "--zero", "2", "--checkpoint", "c", "--resume", "r"});
  CHECK(ck.zero == 2);
  CHECK(ck.checkpoint == "c");
  CHECK(ck.resume == "r");
}

TEST_CASE("switches, missing values and unknown flags", "[examples][options]") {
  CHECK_FALSE(parse({"--no-progress"}).progress);
  const auto full = parse({"--full"});
  CHECK(full.limit == 0);
  CHECK(full.epochs == 3);
  CHECK(parse({"--epochs", "1", "--full"}).epochs == 1); // an explicit --epochs wins
  CHECK(parse({"--full", "--epochs", "2"}).epochs == 2);
  REQUIRE_THROWS_AS(parse({"--full", "--limit", "10"}), fashion::usage_error);
  CHECK(parse({"--kokkos-threads=2", "--epochs", "2"}).epochs == 2); // Kokkos' own flags pass

  for (const char* flag :
       {"--precision", "--epochs", "--threads", "--limit", "--test-limit", "--batch", "--lr",
        "--seed", "--data", "--checkpoint", "--resume", "--plan", "--collective-timeout"}) {
    INFO(flag);
    REQUIRE_THROWS_MATCHES(parse({flag}), fashion::usage_error,
                           what_contains({"missing value after", flag}));
  }
  for (const char* bad : {"--epoch", "epochs", "-e", "--EPOCHS", "", "--no-progress=1"}) {
    INFO(bad);
    REQUIRE_THROWS_MATCHES(parse({bad}), fashion::usage_error, what_contains({"unknown argument"}));
  }
  // A null pointer inside argv (a fuzzer may pass one) is an error, not a crash.
  const char* argv[] = {"train_fashion_mnist", "--epochs", nullptr};
  REQUIRE_THROWS_AS(fashion::parse_options(3, argv), fashion::usage_error);
}

TEST_CASE("the fixed-team flag: a switch, off by default", "[examples][options]") {
  CHECK_FALSE(parse({}).fixed_team);
  CHECK(parse({"--fixed-team"}).fixed_team);
  CHECK(parse({"--threads", "2", "--fixed-team", "--precision", "bf16"}).fixed_team);
  CHECK_THROWS_WITH(parse({"--fixed-team=1"}),
                    Catch::Contains("unknown argument '--fixed-team=1'"));
}

TEST_CASE("the recompute flag: a switch, with any other flag", "[examples][options]") {
  CHECK_FALSE(parse({}).recompute);
  CHECK(parse({"--recompute"}).recompute);
  CHECK(parse({"--recompute", "--precision", "fp8"}).recompute);
  const auto planned = parse({"--recompute", "--plan", "data=2,tensor=2", "--zero", "1"});
  CHECK(planned.recompute);
  CHECK(planned.plan_tensor == 2);
  const auto resumed = parse({"--checkpoint", "ck.bin", "--recompute", "--resume", "r.bin"});
  CHECK(resumed.recompute);
  CHECK(resumed.checkpoint == "ck.bin");
  CHECK(resumed.resume == "r.bin");
}

TEST_CASE("the accum flag (--accum K) takes 1..1024 accumulation steps, with --plan only",
          "[examples][options]") {
  CHECK(parse({}).accum == 1);
  CHECK(parse({"--plan", "data=2", "--accum", "4"}).accum == 4);
  CHECK(parse({"--accum", "1"}).accum == 1); // no accumulation: no plan needed
  for (const char* bad : {"0", "1025", "-2", "2.5", "x"}) {
    INFO("--accum '" << bad << "'");
    REQUIRE_THROWS_MATCHES(parse({"--plan", "data=2", "--accum", bad}), fashion::usage_error,
                           what_contains({"--accum"}));
  }
  REQUIRE_THROWS_MATCHES(parse({"--accum", "2"}), fashion::usage_error,
                         what_contains({"--accum 2", "--plan"}));
}
