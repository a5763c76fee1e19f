#!/usr/bin/env python3
"""FashionCNN on Fashion-MNIST: tessera's examples/train_fashion_mnist against PyTorch, same model,
data, batch, optimizer and epochs, both measured in this one run; prints one markdown table.

    benchmarks/train/compare_pytorch.py                      # 1 epoch on 6,000 images
    benchmarks/train/compare_pytorch.py --epochs 3 --limit 0 # 3 full epochs (the issue's target)
    benchmarks/train/compare_pytorch.py --repeat 3           # medians of 3 rounds, ratio ranges

Recipe (as the example's): Conv2d(1,32,3,pad 1) ReLU MaxPool2d(2); Conv2d(32,64,3,pad 1) ReLU
MaxPool2d(2); Flatten; Linear(3136,128) ReLU; Linear(128,10); PyTorch's default init; SGD lr 0.05,
momentum 0.9; batch 64, reshuffled each epoch; inputs (x/255 - 0.2860) / 0.3530; test accuracy on
all 10,000 test images. PyTorch runs fp32 and bf16 autocast (torch.autocast("cpu")); tessera fp32,
bf16 and fp8 (hybrid E4M3/E5M2, current scaling); fp8 is compared with PyTorch's bf16. images/s is
training throughput (forward, backward, optimizer step; evaluation excluded), at 1 and 2 threads.

Needs PyTorch (Debian's python3-torch; installed with apt-get when missing) and a built example
(--build, default build/; scripts/run.sh builds it).
"""
import argparse
import gzip
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def has_torch(python):
    return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0


def ensure_torch():
    """Imports torch here, or re-runs this script with Debian's /usr/bin/python3 (where
    python3-torch installs; another python3 may come first on PATH), installing it if needed."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    debian = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(debian) and has_torch(debian):
        os.execv(debian, [debian] + sys.argv)
    print("[compare] installing python3-torch with apt-get", file=sys.stderr)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                           "python3-torch"], check=True, env=env, stdout=subprocess.DEVNULL)
    if os.path.realpath(sys.executable) != os.path.realpath(debian) and has_torch(debian):
        os.execv(debian, [debian] + sys.argv)


def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(data_dir, split, limit):
    import torch
    x = read_idx(f"{data_dir}/{split}-images-idx3-ubyte.gz")
    y = read_idx(f"{data_dir}/{split}-labels-idx1-ubyte.gz")
    if limit:
        x, y = x[:limit], y[:limit]
    x = (torch.from_numpy(x.copy()).float() / 255.0 - 0.2860) / 0.3530
    return x.unsqueeze(1).contiguous(), torch.from_numpy(y.astype("int64"))


def torch_run(precision, threads, epochs, limit, batch, data_dir, seed):
    """Trains PyTorch's FashionCNN; returns (test accuracy %, training images/s)."""
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    xtr, ytr = load(data_dir, "train", limit)
    xte, yte = load(data_dir, "t10k", 0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    autocast = precision == "bf16"
    n = xtr.shape[0]
    train_time, images = 0.0, 0
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        model.train()
        t0 = time.perf_counter()
        for b in range(0, n, batch):
            idx = perm[b:b + batch]
            xb, yb = xtr[idx], ytr[idx]
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        train_time += time.perf_counter() - t0
        images += n
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        for b in range(0, xte.shape[0], 1000):
            correct += (model(xte[b:b + 1000]).argmax(1) == yte[b:b + 1000]).sum().item()
    return 100.0 * correct / xte.shape[0], images / train_time


EPOCH_LINE = re.compile(r"epoch (\d+) .*test accuracy ([\d.]+)% +([\d.]+) s +([\d.]+) images/s")


def tessera_run(exe, precision, threads, epochs, limit, batch, data_dir, seed):
    """Runs the example; returns (final test accuracy %, training images/s over all epochs)."""
    cmd = [exe, "--precision", precision, "--threads", str(threads), "--epochs", str(epochs),
           "--limit", str(limit), "--batch", str(batch), "--data", data_dir, "--seed", str(seed),
           "--no-progress"]
    env = dict(os.environ, OMP_PROC_BIND="false")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    acc, secs, imgs = None, 0.0, 0.0
    for line in out.splitlines():
        m = EPOCH_LINE.search(line)
        if m:
            acc = float(m.group(2))
            secs += float(m.group(3))
            imgs += float(m.group(3)) * float(m.group(4))
    if acc is None:
        raise RuntimeError(f"no epoch line in the output of {' '.join(cmd)}:\n{out}")
    return acc, imgs / secs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--limit", type=int, default=6000, help="training images (0: all 60,000)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seeds", default="1",
                    help="comma-separated seeds: each run repeats per seed; the table gives the mean "
                         "accuracy and its range (the run-to-run spread) and the mean images/s")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--precisions", default="fp32,bf16,fp8")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds; each runs every PyTorch and tessera configuration once, in turn. "
                         "The table gives median images/s and the median and range of the "
                         "per-round ratios (a shared machine's speed drifts between runs)")
    args = ap.parse_args()
    if args.repeat < 1:
        sys.exit("--repeat must be >= 1")
    ensure_torch()
    exe = os.path.join(args.build, "examples", "train_fashion_mnist")
    if not os.access(exe, os.X_OK):
        sys.exit(f"{exe} not found: build it first (scripts/run.sh, or cmake --build "
                 f"{args.build} --target train_fashion_mnist)")
    import torch
    threads = [int(t) for t in args.threads.split(",")]
    precisions = args.precisions.split(",")
    seeds = [int(x) for x in args.seeds.split(",")]

    def over_seeds(run):
        accs, speeds = zip(*(run(seed) for seed in seeds))
        return accs, sum(speeds) / len(speeds)

    # runs[(library, precision, threads)]: one (accuracies, images/s) per round.
    runs = {}
    for r in range(args.repeat):
        for t in threads:
            for p in precisions:
                tp = "bf16" if p in ("bf16", "fp8") else "fp32"
                if len(runs.setdefault(("torch", tp, t), [])) == r:
                    print(f"[compare] round {r + 1}/{args.repeat}: PyTorch {tp}, {t} thread(s)",
                          file=sys.stderr)
                    runs[("torch", tp, t)].append(over_seeds(lambda seed: torch_run(
                        tp, t, args.epochs, args.limit, args.batch, args.data, seed)))
                print(f"[compare] round {r + 1}/{args.repeat}: tessera {p}, {t} thread(s)",
                      file=sys.stderr)
                runs.setdefault(("tessera", p, t), []).append(over_seeds(lambda seed: tessera_run(
                    exe, p, t, args.epochs, args.limit, args.batch, args.data, seed)))
    rows = []
    for t in threads:
        for p in precisions:
            tp = "bf16" if p in ("bf16", "fp8") else "fp32"
            pt, tt = runs[("torch", tp, t)], runs[("tessera", p, t)]
            ratios = [b[1] / a[1] for a, b in zip(pt, tt)]
            rows.append((p, t, tp, pt[-1][0], statistics.median(a[1] for a in pt), tt[-1][0],
                         statistics.median(b[1] for b in tt), statistics.median(ratios),
                         min(ratios), max(ratios)))

    def acc(a):
        mean = sum(a) / len(a)
        return f"{mean:.2f}" if len(a) == 1 else f"{mean:.2f} ({min(a):.2f}-{max(a):.2f})"

    n = args.limit if args.limit else 60000
    many = args.repeat > 1
    print(f"\nFashionCNN, {args.epochs} epoch(s) on {n} training images, batch {args.batch}, "
          f"PyTorch {torch.__version__}; accuracy on the 10,000 test images, seeds {args.seeds} "
          f"(mean, and range when several)"
          + (f"; images/s: medians of {args.repeat} rounds" if many else "") + "\n")
    print("| tessera precision | threads | PyTorch (precision) | PyTorch acc % | tessera acc % "
          "| PyTorch img/s | tessera img/s | speed ratio |" + (" ratio range |" if many else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if many else ""))
    for p, t, tp, pa, ps, ta, ts, ratio, lo, hi in rows:
        print(f"| {p} | {t} | {tp} | {acc(pa)} | {acc(ta)} | {ps:.0f} | {ts:.0f} | {ratio:.2f}x |"
              + (f" {lo:.2f}-{hi:.2f}x |" if many else ""))
    # Scaling (issue 11's target: 2 threads >= 1.8x one thread): tessera's own images/s at each
    # thread count over its first, per round.
    if len(threads) > 1:
        t0 = threads[0]
        print(f"\ntessera images/s at more threads over {t0} thread(s), per precision: median"
              + (" (range over the rounds)" if many else "") + "\n")
        print("| threads | " + " | ".join(precisions) + " |")
        print("|---|" + "---|" * len(precisions))
        for t in threads[1:]:
            cells = []
            for p in precisions:
                q = [b[1] / a[1] for a, b in zip(runs[("tessera", p, t0)], runs[("tessera", p, t)])]
                cells.append(f"{statistics.median(q):.2f}"
                             + (f" ({min(q):.2f}-{max(q):.2f})" if many else ""))
            print(f"| {t} / {t0} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
