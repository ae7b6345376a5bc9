"""Attention-probability dropout on a (batch, 12 heads, 128, 128) tensor, p = 0.1, forward and backward: torch's
F.dropout against cheaper ways to draw the mask, interleaved in random order.

- F.dropout: what eager attention calls (bernoulli_ into a tensor of x's dtype, then a multiply);
- rand >= p, where / scaled mask: the same independent Bernoulli(1 - p) per element, drawn by torch.rand (fp32:
  P(drop) = ceil(p * 2^24) / 2^24, within 6e-8 of p);
- shared across heads: one mask per (batch, query, key) broadcast over the heads: each element still dropped with
  probability p, but the heads of one position dropped together, so not the same joint distribution.
Usage: python lab/experiments/backbone-dropout/dropout_masks.py [--batch 8] [--rounds 25] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F

P = 0.1


def ways(shape: tuple[int, ...]) -> dict:
    keep_scale = 1 / (1 - P)
    return {
        "F.dropout": lambda x: F.dropout(x, P, training=True),
        "rand >= p, where": lambda x: torch.where(torch.rand(shape) >= P, x * keep_scale, 0),
        "rand >= p, scaled mask": lambda x: x * ((torch.rand(shape) >= P).to(x.dtype) * keep_scale),
        "shared across heads": lambda x: x * torch.empty((shape[0], 1, *shape[2:]), dtype=x.dtype)
        .bernoulli_(1 - P).div_(1 - P),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = (args.batch, 12, 128, 128)
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.softmax(torch.randn(shape), -1).to(dtype)
        times = {name: [] for name in ways(shape)}
        for _ in range(args.rounds):
            order = list(ways(shape).items())
            random.shuffle(order)
            for name, dropout in order:
                x = base.clone().requires_grad_(True)
                started = time.perf_counter()
                dropout(x).sum().backward()
                times[name].append(time.perf_counter() - started)
        reference = statistics.median(times["F.dropout"][3:])
        for name, values in times.items():
            median, quartiles = statistics.median(values[3:]), statistics.quantiles(values[3:], n=4)
            print(f"{str(dtype):15s} {name:24s} {1e3 * median:6.1f} ms (IQR {1e3 * quartiles[0]:.0f}-"
                  f"{1e3 * quartiles[2]:.0f})  {median / reference:.2f}x F.dropout")


if __name__ == "__main__":
    main()
