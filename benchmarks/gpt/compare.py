#!/usr/bin/env python3
"""The character GPT: tessera's examples/train_char_gpt against torch_char_gpt.py (the same model,
data, sampler, recipe and schedule in plain PyTorch), both run in this one sitting; prints one
markdown table of validation loss and training tokens/s.

    benchmarks/gpt/compare.py                          # 300 steps, 1 and 2 threads
    benchmarks/gpt/compare.py --steps 2000 --threads 1
    benchmarks/gpt/compare.py --layers 2 --width 64 --heads 2 --context 64
    benchmarks/gpt/compare.py --steps 100 --repeat 5   # medians of 5 rounds, ratio ranges

PyTorch runs fp32 and bf16 autocast; tessera fp32, bf16 and fp8 (hybrid, fp32 masters); fp8 is
compared with PyTorch's bf16. The val loss is the last `val loss` line of each run (64 fixed
validation contexts). The initial weights are drawn by the same rules, not the same numbers, so
the losses agree only statistically. Needs PyTorch (Debian's python3-torch; installed with
apt-get when missing) and a built example (--build, default build/; `scripts/run.sh gpt` builds
it).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "train"))
from compare_pytorch import ensure_torch  # noqa: E402  (one installer for both comparisons)

VAL = re.compile(r"val loss ([0-9.]+)")
TORCH_SPEED = re.compile(r": ([0-9.]+) tokens/s")
TESSERA_SPEED = re.compile(r"trained \d+ tokens in [0-9.]+ s: ([0-9.]+) tokens/s")


def run(cmd, speed_re, env_extra):
    env = dict(os.environ, OMP_PROC_BIND="false", **env_extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    vals = VAL.findall(out)
    speed = speed_re.search(out)
    if not vals or not speed:
        raise RuntimeError(f"unexpected output of {' '.join(cmd)}:\n{out}")
    return float(vals[-1]), float(speed.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precisions", default="fp32,bf16,fp8")
    ap.add_argument("--seed", type=int, default=1)
    # Shared machines drift by several percent within minutes: --repeat N runs every command N
    # times, PyTorch and tessera in turn, and reports the median speeds and the median (and
    # range) of the ratios of each tessera run to the PyTorch run of the same round.
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    # the model size, passed to both (tessera compiles the width/heads pairs 64/2 and 128/4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args()
    ensure_torch()
    import torch
    exe = os.path.join(args.build, "examples", "train_char_gpt")
    if not os.access(exe, os.X_OK):
        sys.exit(f"{exe} not found: build it first (scripts/run.sh gpt, or cmake --build "
                 f"{args.build} --target train_char_gpt)")
    script = os.path.join(ROOT, "benchmarks", "gpt", "torch_char_gpt.py")
    common = ["--steps", str(args.steps), "--batch", str(args.batch), "--seed", str(args.seed),
              "--eval-every", str(args.steps), "--layers", str(args.layers), "--heads",
              str(args.heads), "--width", str(args.width), "--context", str(args.context)]
    if args.repeat < 1:
        sys.exit("--repeat must be >= 1")
    rows = []
    for t in [int(x) for x in args.threads.split(",")]:
        precisions = args.precisions.split(",")
        torch_of = {p: ("bf16" if p in ("bf16", "fp8") else "fp32") for p in precisions}
        torch_runs = {tp: [] for tp in torch_of.values()}
        tessera_runs = {p: [] for p in precisions}
        for r in range(args.repeat):
            for tp in dict.fromkeys(torch_of.values()):
                print(f"[compare] round {r + 1}/{args.repeat}: PyTorch {tp}, {t} thread(s)",
                      file=sys.stderr)
                torch_runs[tp].append(run(
                    [sys.executable, script, "--precision", tp, "--threads", str(t)] + common,
                    TORCH_SPEED, {"OMP_NUM_THREADS": str(t)}))
            for p in precisions:
                print(f"[compare] round {r + 1}/{args.repeat}: tessera {p}, {t} thread(s)",
                      file=sys.stderr)
                tessera_runs[p].append(run([exe, "--precision", p, "--threads", str(t),
                                            "--no-progress", "--sample-len", "0"] + common,
                                           TESSERA_SPEED, {}))
        for p in precisions:
            tp = torch_of[p]
            pt, tt = torch_runs[tp], tessera_runs[p]
            ratios = [b[1] / a[1] for a, b in zip(pt, tt)]
            rows.append((p, t, tp, pt[-1][0], tt[-1][0], statistics.median(a[1] for a in pt),
                         statistics.median(b[1] for b in tt), statistics.median(ratios),
                         min(ratios), max(ratios)))
    print(f"\nCharacter GPT ({args.layers} layers, {args.heads} heads, width {args.width}, "
          f"context {args.context}), {args.steps} steps of "
          f"batch {args.batch}, seed {args.seed}, PyTorch {torch.__version__}"
          + (f"; medians of {args.repeat} rounds" if args.repeat > 1 else "") + "\n")
    many = args.repeat > 1
    print("| tessera precision | threads | PyTorch (precision) | PyTorch val loss | tessera val loss "
          "| PyTorch tokens/s | tessera tokens/s | speed ratio |" + (" ratio range |" if many else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if many else ""))
    for p, t, tp, pl, tl, ps, ts, ratio, lo, hi in rows:
        print(f"| {p} | {t} | {tp} | {pl:.3f} | {tl:.3f} | {ps:.0f} | {ts:.0f} | {ratio:.2f}x |"
              + (f" {lo:.2f}-{hi:.2f}x |" if many else ""))


if __name__ == "__main__":
    main()
