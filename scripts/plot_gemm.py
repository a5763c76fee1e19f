#!/usr/bin/python3
"""GFLOP/s against size from bench_gemm's Google Benchmark JSON output.

    bench_gemm --benchmark_out=gemm.json --benchmark_out_format=json
    scripts/plot_gemm.py gemm.json docs/gemm.png

One panel per thread count; square sizes on the x axis (log 2), one line per implementation
(the best repetition of each, as bench_gemm's tables), the measured fp32 FMA and bf16
VDPBF16PS peaks of the threads used as dashed lines.
"""
import json
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {  # implementation: (label, colour, line style)
    "openblas_fp32": ("OpenBLAS fp32", "tab:gray", ":"),
    "onednn_fp32": ("oneDNN fp32", "tab:blue", "--"),
    "onednn_bf16": ("oneDNN bf16", "tab:orange", "--"),
    "tessera_fp32": ("tessera fp32", "tab:blue", "-"),
    "tessera_bf16": ("tessera bf16", "tab:orange", "-"),
    "tessera_e4m3": ("tessera e4m3", "tab:green", "-"),
    "tessera_e5m2": ("tessera e5m2", "tab:red", "-"),
    "tessera_e4m3xe5m2": ("tessera e4m3 x e5m2", "tab:purple", "-"),
}


def load(path):
    """{threads: {impl: {size: best GFLOP/s}}} for the square shapes, and the context."""
    with open(path) as f:
        data = json.load(f)
    best = defaultdict(lambda: defaultdict(dict))
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or "GFLOP/s" not in b:
            continue
        m = re.match(r"(\d+)x(\d+)x(\d+)/threads:(\d+)/(\w+)", b["name"])
        if not m:
            continue
        mm, n, k, threads, impl = m.groups()
        if not (mm == n == k):
            continue
        size, threads = int(mm), int(threads)
        best[threads][impl][size] = max(best[threads][impl].get(size, 0.0), b["GFLOP/s"])
    return best, data.get("context", {})


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    best, ctx = load(sys.argv[1])
    peaks = {
        "fp32 FMA peak": float(ctx.get("fp32_peak_gflops_per_core", 0)),
        "bf16 VDPBF16PS peak": float(ctx.get("bf16_peak_gflops_per_core", 0)),
    }
    threads = sorted(best)
    fig, axes = plt.subplots(1, len(threads), figsize=(6.5 * len(threads), 5), squeeze=False)
    for ax, t in zip(axes[0], threads):
        for impl, (label, colour, ls) in STYLE.items():
            pts = sorted(best[t].get(impl, {}).items())
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=colour, marker="o",
                        markersize=3, label=label)
        for (label, peak), colour in zip(peaks.items(), ("tab:blue", "tab:orange")):
            if peak > 0:
                ax.axhline(peak * t, color=colour, linewidth=0.8, linestyle=(0, (6, 4)),
                           alpha=0.6)
                ax.text(64, peak * t, f" {label}", fontsize=7,
                        va="bottom", color=colour)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M = N = K")
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"GEMM, {t} thread{'s' if t > 1 else ''}")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="lower right", handlelength=3.5)
    fig.suptitle("tessera::gemm beside OpenBLAS and oneDNN (bench_gemm, fastest batch of calls)", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
