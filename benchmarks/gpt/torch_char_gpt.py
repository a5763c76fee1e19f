#!/usr/bin/env python3
"""The character GPT of examples/train_char_gpt.cpp in plain PyTorch (written for 1.13, Debian's
python3-torch), for the loss and speed comparison of issue 14.

Same model (nanoGPT shape, no dropout, lm_head not tied), same data rule, vocabulary, split and
sampler (data/text.hpp's rules, reproduced bit for bit below), same initialisation rules
(nn.Linear's default; embeddings N(0, 0.02); LayerNorm 1 / 0; not the same random numbers),
same AdamW recipe (lr 1e-3, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on parameters of rank
>= 2 only), same schedule (linear warm-up lr (s + 1) / (warmup + 1), cosine to lr / 10 at
--steps) and clipping (global L2 norm 1.0).

The vocabulary is the corpus' distinct bytes; the model's vocabulary dimension is the smallest
of 128 or 256 that holds it (rows beyond the vocabulary are never targets), as the C++ example
does.

Prints `val loss <value>` at step 0, every --eval-every steps and after the last step (mean
cross-entropy over 64 validation contexts at evenly spaced offsets), and tokens/s of training.

  python3 benchmarks/gpt/torch_char_gpt.py --steps 300 --threads 1 --precision fp32
"""
import argparse
import math
import os
import sys
import time

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    """SplitMix64's finaliser (tessera::counter_rng::mix)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def rng_bits(seed, stream, i):
    """tessera::counter_rng{seed, stream}.bits(i)."""
    return mix((mix(seed ^ ((stream * GOLDEN) & MASK64)) + i * GOLDEN) & MASK64)


def read_corpus(directory):
    """Regular files directly in `directory` whose name has no '.', no symlinks, sorted by name
    (bytes), concatenated (tessera::data::read_text_directory)."""
    if not os.path.isdir(directory):
        sys.exit(f"torch_char_gpt: '{directory}' is not a directory (apt-get install fortunes)")
    names = sorted(
        n for n in os.listdir(directory)
        if '.' not in n and not os.path.islink(os.path.join(directory, n))
        and os.path.isfile(os.path.join(directory, n)))
    data = b''.join(open(os.path.join(directory, n), 'rb').read() for n in names)
    if not data:
        sys.exit(f"torch_char_gpt: the corpus in '{directory}' is empty")
    return data


def build_vocab(data):
    chars = sorted(set(data))
    ids = {c: k for k, c in enumerate(chars)}
    return chars, ids


def split(ids, context):
    n = len(ids)
    cut = n // 10 * 9 + (n % 10) * 9 // 10
    if cut < context + 1 or n - cut < context + 1:
        sys.exit(f"torch_char_gpt: corpus of {n} characters is shorter than a context")
    return ids[:cut], ids[cut:]


def batch_starts(seed, step, batch, length, context):
    """tessera::data::context_sampler::start for i = 0 .. batch - 1."""
    return [rng_bits(seed, step, i) % (length - context) for i in range(batch)]


def eval_offsets(length, context, count):
    last = length - context - 1
    return [0] if count == 1 else [j * last // (count - 1) for j in range(count)]


def lr_at(step, lr, min_lr, warmup, total):
    """tessera::train::warmup_cosine::lr_at."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= total:
        return min_lr
    p = (step - warmup) / (total - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--steps', type=int, default=2000)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--precision', choices=['fp32', 'bf16'], default='fp32')
    ap.add_argument('--batch', type=int, default=16)
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument('--warmup', type=int, default=100)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--eval-every', type=int, default=100)
    ap.add_argument('--data', default='/usr/share/games/fortunes')
    ap.add_argument('--layers', type=int, default=4)
    ap.add_argument('--context', type=int, default=128)
    ap.add_argument('--width', type=int, default=128)
    ap.add_argument('--heads', type=int, default=4)
    ap.add_argument('--check-sampler', action='store_true',
                    help='print the first starts of steps 0 and 1 and exit (no torch needed)')
    a = ap.parse_args()
    if a.steps < 1 or a.batch < 1 or a.threads < 1 or a.eval_every < 1:
        sys.exit('torch_char_gpt: --steps, --batch, --threads and --eval-every must be >= 1')
    if a.layers < 1 or a.context < 2 or a.heads < 1 or a.width < 1 or a.width % a.heads:
        sys.exit('torch_char_gpt: --layers >= 1, --context >= 2, --heads >= 1 dividing --width')

    T, D, H, L = a.context, a.width, a.heads, a.layers
    data = read_corpus(a.data)
    chars, index = build_vocab(data)
    ids = [index[b] for b in data]
    train, val = split(ids, T)
    if a.check_sampler:
        for s in (0, 1):
            print(s, batch_starts(a.seed, s, a.batch, len(train), T))
        print('vocab', len(chars), 'train', len(train), 'val', len(val))
        return

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    V = 128 if len(chars) <= 128 else 256

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D, eps=1e-5)
            self.qkv = nn.Linear(D, 3 * D)
            self.proj = nn.Linear(D, D)
            self.ln2 = nn.LayerNorm(D, eps=1e-5)
            self.fc = nn.Linear(D, 4 * D)
            self.out = nn.Linear(4 * D, D)

        def forward(self, x):
            B, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
            q = q.view(B, t, H, D // H).transpose(1, 2)
            k = k.view(B, t, H, D // H).transpose(1, 2)
            v = v.view(B, t, H, D // H).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float('-inf'))
            att = F.softmax(att.float(), dim=-1).to(v.dtype)
            y = (att @ v).transpose(1, 2).contiguous().view(B, t, D)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(V, D)
            self.pos = nn.Embedding(T, D)
            nn.init.normal_(self.tok.weight, 0.0, 0.02)
            nn.init.normal_(self.pos.weight, 0.0, 0.02)
            self.blocks = nn.Sequential(*[Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(D, eps=1e-5)
            self.head = nn.Linear(D, V)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t))
            return self.head(self.ln_f(self.blocks(x)))

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.1},
                             {'params': no_decay, 'weight_decay': 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    train_t = torch.tensor(train, dtype=torch.long)
    val_t = torch.tensor(val, dtype=torch.long)
    autocast = (torch.autocast('cpu', dtype=torch.bfloat16) if a.precision == 'bf16'
                else torch.autocast('cpu', enabled=False))

    def loss_of(xy):
        with autocast:
            logits = model(xy[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, V), xy[:, 1:].reshape(-1))

    offsets = eval_offsets(len(val), T, 64)
    val_batch = torch.stack([val_t[o:o + T + 1] for o in offsets])

    def evaluate(step):
        model.eval()
        with torch.no_grad():
            v = sum(loss_of(val_batch[i:i + 16]).item() * len(val_batch[i:i + 16])
                    for i in range(0, len(val_batch), 16)) / len(val_batch)
        model.train()
        print(f'step {step} val loss {v:.4f}', flush=True)

    evaluate(0)
    tokens = 0
    seconds = 0.0
    for step in range(a.steps):
        t0 = time.perf_counter()  # like the C++ example: sampling the batch counts too
        starts = batch_starts(a.seed, step, a.batch, len(train), T)
        xy = torch.stack([train_t[s:s + T + 1] for s in starts])
        for g in opt.param_groups:
            g['lr'] = lr_at(step, a.lr, a.lr / 10, a.warmup, a.steps)
        loss = loss_of(xy)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seconds += time.perf_counter() - t0
        tokens += a.batch * T
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            print(f'step {step + 1} loss {loss.item():.4f} tokens/s {tokens / seconds:.0f}',
                  flush=True)
            evaluate(step + 1)
    print(f'torch {torch.__version__} precision {a.precision} threads {a.threads} '
          f'batch {a.batch} steps {a.steps}: {tokens / seconds:.0f} tokens/s', flush=True)


if __name__ == '__main__':
    main()
