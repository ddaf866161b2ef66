"""A launch-bound training step on a GPU: metricsync's records against the ``.item()`` way.

Run: .venv/bin/python bench/gpu_step.py [--steps 30] [--micro-batches 8] [--layers 2]

Each step runs, per micro-batch, a small transformer's forward and backward
(``--layers`` encoder layers of width ``--d-model`` on ``(--batch, --seq)``
tokens: many small kernels, so the CPU that launches them is the bottleneck),
then records what ``bench/step.py`` records per micro-batch: 60 scalar 0-d
tensors (``mean``) and 6 per-token ``(batch, seq)`` tensors under a response
mask (token means; one also ``max`` and ``min``). The step ends with
``compute()`` (metricsync) or the means of the host lists (the ``.item()`` way).

Two ways run interleaved, step by step, in the same process (the order
alternates every step), on the same tensors:

- **metricsync**: ``Metrics.record`` of every tensor; ``compute()`` and
  ``reset()`` once per step;
- **the .item() way**: ``.item()`` of every scalar, ``((t * mask).sum() /
  mask.sum()).item()`` of every per-token tensor (``masked_select`` with
  ``max``/``min`` for the one that asks), appended to lists, ``np.mean`` at
  the end of the step.

Two variants: **GPU work queued** (records follow the backward at once, as a
training loop does: each ``.item()`` waits for the queued work, a record does
not) and **tensors ready** (a synchronize before the records). The table gives
per-step medians and the median of the per-step ratios; targets on a GPU:
<= 0.8x queued, <= 1.0x ready. The two ways are checked to agree first.

Without CUDA it runs on the CPU with the sizes given, as a smoke test of the
loop (its timings say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import metricsync as ms

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, also when loaded by path
import step as rl  # bench/step.py: the RL step's metrics
from _interleave import interleaved
from step import N_SCALARS, TOKEN_NAMES

SPECS = {"critic/advantages": rl.SPECS["critic/advantages"]}  # the one token max and min


class Workload:
    """The model, its micro-batches and the metric tensors each one yields."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(
            args.d_model, args.heads, 2 * args.d_model, dropout=0.0, batch_first=True
        )
        self.model = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
        self.model.to(device)
        self.inputs = [
            torch.randn(args.batch, args.seq, args.d_model, generator=gen).to(device)
            for _ in range(args.micro_batches)
        ]
        lengths = torch.randint(args.seq // 4, args.seq + 1, (args.batch,), generator=gen)
        self.mask = (torch.arange(args.seq).unsqueeze(0) < lengths.unsqueeze(1)).to(device)
        self.scales = torch.linspace(0.5, 1.5, N_SCALARS).to(device)
        self.device = device

    def micro_batch(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Forward and backward of one micro-batch; its 60 scalars and 6 per-token tensors."""
        out = self.model(x)
        loss = out.pow(2).mean()
        loss.backward()
        detached = out.detach()
        scalars = list((loss.detach() * self.scales).unbind())  # 60 0-d tensors
        per_token = detached.mean(-1)
        tokens = [per_token * (i + 1) for i in range(len(TOKEN_NAMES))]
        return scalars, tokens


def ours(work: Workload, metrics: ms.Metrics, ready: bool) -> dict[str, float]:
    for x in work.inputs:
        scalars, tokens = work.micro_batch(x)
        if ready:
            _sync(work.device)
        for i, s in enumerate(scalars):
            metrics.record(f"actor/scalar_{i}", s)
        for name, t in zip(TOKEN_NAMES, tokens):
            metrics.record(name, t, mask=work.mask)
    out = metrics.compute()
    metrics.reset()
    return out


def theirs(work: Workload, ready: bool) -> dict[str, float]:
    lists: dict[str, list[float]] = defaultdict(list)
    num: dict[str, float] = defaultdict(float)
    den: dict[str, float] = defaultdict(float)
    for x in work.inputs:
        scalars, tokens = work.micro_batch(x)
        if ready:
            _sync(work.device)
        for i, s in enumerate(scalars):
            lists[f"actor/scalar_{i}"].append(s.item())
        count = work.mask.sum()
        for name, t in zip(TOKEN_NAMES, tokens):
            num[name] += (t * work.mask).sum().item()  # a global token mean, as metricsync's
            den[name] += count.item()
            if name == "critic/advantages":
                valid = torch.masked_select(t, work.mask)
                lists[f"{name}/max"].append(valid.max().item())
                lists[f"{name}/min"].append(valid.min().item())
    out = {k: float(np.mean(v)) for k, v in lists.items()}
    out["critic/advantages/max"] = max(lists["critic/advantages/max"])
    out["critic/advantages/min"] = min(lists["critic/advantages/min"])
    for name in TOKEN_NAMES:
        out[name if name != "critic/advantages" else f"{name}/mean"] = num[name] / den[name]
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def check(a: dict[str, float], b: dict[str, float]) -> None:
    """The two ways agree (float32 sums on one side, float64 on the other)."""
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for key, want in b.items():
        assert math.isclose(a[key], want, rel_tol=1e-4, abs_tol=1e-6), (key, a[key], want)


def run(args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    """Per variant: median ms per step of each way, and the median per-step ratio."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = Workload(args, device)
    metrics = ms.Metrics(SPECS)
    check(ours(work, metrics, True), theirs(work, True))
    out = {}
    for variant, ready in (("GPU work queued", False), ("tensors ready", True)):
        sides: dict[str, Callable[[], Any]] = {
            "ours": lambda ready=ready: ours(work, metrics, ready),
            "theirs": lambda ready=ready: theirs(work, ready),
        }
        out[variant] = interleaved(sides, args.steps, args.warmup, lambda: _sync(device))
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    return p


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float, float]]:
    args = parser().parse_args(argv)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (a smoke test)"
    results = run(args)
    print(f"gpu_step on {where}: {args.micro_batches} micro-batches, medians of {args.steps} steps")
    print(f"  {'variant':<18} {'metricsync':>11} {'.item() way':>12} {'ratio':>7}  target")
    for variant, (ours_ms, theirs_ms, ratio) in results.items():
        target = 0.8 if variant == "GPU work queued" else 1.0
        print(f"  {variant:<18} {ours_ms:>8.2f} ms {theirs_ms:>9.2f} ms {ratio:>6.2f}x  <={target}")
    return results


if __name__ == "__main__":
    main()
