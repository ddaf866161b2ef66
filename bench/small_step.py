"""A newcomer's small step: 20 metrics, 4 micro-batches, 2 DDP ranks, three ways, interleaved.

Run: .venv/bin/python bench/small_step.py [--worlds 2] [--steps 40] [--warmup 3]

Each step, on every local gloo rank (127.0.0.1), a 2-layer MLP runs forward and
backward on 4 micro-batches; each micro-batch records 18 scalar 0-d tensors
(losses and norms, ``mean``) and 1 token count (``sum``); the step records the
learning rate (``last``). Then the ranks reduce and compute. Three ways run in the
same processes, the order rotating every step:

- **metricsync**: ``Metrics.record`` for everything, ``sync().compute()``, ``reset()``;
- **all_gather_object**: ``.item()`` into a dict of lists, ``all_gather_object`` of
  the dict, ``np.mean``/``np.sum`` per key (the hand-rolled way of most trainers);
- **all_reduce per key**: ``.item()`` into a dict of lists, then one ``all_reduce``
  of a float64 tensor per key.

Two figures per way: the metrics' own time (records, reduction, compute) and the
whole step (the MLP's forward and backward included). A step's time is the slowest
rank's; the table gives medians over steps and the median of per-step ratios
against ``all_gather_object`` (target: metrics' own time <= 0.7x).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import metricsync as ms
from metricsync.testing import run_distributed

N_MEAN, MICRO_BATCHES, BATCH, HIDDEN = 18, 4, 16, 64
SPECS = {"tokens": ms.Spec("sum", fmt=",.0f"), "lr": ms.Spec("last", fmt=".2e")}
WAYS = ("metricsync", "all_gather_object", "all_reduce per key")


def _micro_batch(model: torch.nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Forward and backward of one micro-batch; its 19 numbers as 0-d tensors."""
    inputs = torch.randn(BATCH, HIDDEN, generator=gen)
    target = torch.randn(BATCH, 1, generator=gen)
    out = model(inputs)
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    values = {
        f"loss/part_{i:02d}": (out[i % BATCH, 0] - target[i % BATCH, 0]).detach() ** 2
        for i in range(N_MEAN - 1)
    }
    values["loss/total"] = loss.detach()
    values["tokens"] = torch.tensor(BATCH)
    return values


def _metricsync(metrics: ms.Metrics, batches: list[dict[str, torch.Tensor]], lr: float) -> Any:
    for values in batches:
        for key, value in values.items():
            metrics.record(key, value)
    metrics.record("lr", lr)
    result = metrics.sync(timeout=60).compute()
    metrics.reset()
    return result


def _lists(batches: list[dict[str, torch.Tensor]], lr: float) -> dict[str, list[float]]:
    data: dict[str, list[float]] = {}
    for values in batches:
        for key, value in values.items():
            data.setdefault(key, []).append(value.item())
    data["lr"] = [lr]
    return data


def _all_gather_object(batches: list[dict[str, torch.Tensor]], lr: float) -> Any:
    data = _lists(batches, lr)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, data)
    out = {}
    for key in data:
        joined = [v for part in gathered for v in part.get(key, [])]
        if key == "tokens":
            out[key] = float(np.sum(joined))
        elif key == "lr":
            out[key] = float(gathered[0][key][-1])
        else:
            out[key] = float(np.mean(joined))
    return out


def _all_reduce_per_key(batches: list[dict[str, torch.Tensor]], lr: float) -> Any:
    data = _lists(batches, lr)
    world = dist.get_world_size()
    out = {}
    for key, values in data.items():
        total = torch.tensor([sum(values), len(values)], dtype=torch.float64)
        dist.all_reduce(total)
        if key == "tokens":
            out[key] = float(total[0])
        elif key == "lr":
            out[key] = float(total[0] / world)
        else:
            out[key] = float(total[0] / total[1])
    return out


def _rank(rank: int, world: int, steps: int, warmup: int) -> list[dict[str, tuple[float, float]]]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    metrics = ms.Metrics(SPECS)
    gen = torch.Generator().manual_seed(rank)
    timings: list[dict[str, tuple[float, float]]] = []
    # The three agree on every key over the same samples.
    batches = [_micro_batch(ddp, gen) for _ in range(MICRO_BATCHES)]
    expected = _metricsync(metrics, batches, 1e-3)
    for other in (_all_gather_object(batches, 1e-3), _all_reduce_per_key(batches, 1e-3)):
        assert other.keys() == expected.keys()
        for key, value in other.items():
            assert abs(expected[key] - value) <= 1e-9 * max(1.0, abs(value)), key
    for step in range(steps + warmup):
        row: dict[str, tuple[float, float]] = {}
        for k in range(len(WAYS)):
            way = WAYS[(step + k) % len(WAYS)]
            dist.barrier()
            start = time.perf_counter()
            batches = [_micro_batch(ddp, gen) for _ in range(MICRO_BATCHES)]
            model_done = time.perf_counter()
            lr = 1e-3 / (1 + step)
            if way == "metricsync":
                _metricsync(metrics, batches, lr)
            elif way == "all_gather_object":
                _all_gather_object(batches, lr)
            else:
                _all_reduce_per_key(batches, lr)
            end = time.perf_counter()
            row[way] = (end - model_done, end - start)
        if step >= warmup:
            timings.append(row)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    print(
        "| ranks | way | metrics µs | step µs | metrics / all_gather_object | step / all_gather_object |"
    )
    print("|---|---|---|---|---|---|")
    for world in args.worlds:
        ranks = run_distributed(_rank, world, timeout=600, args=(args.steps, args.warmup))
        steps = [
            {way: tuple(max(r[i][way][j] for r in ranks) for j in (0, 1)) for way in WAYS}
            for i in range(len(ranks[0]))
        ]
        for way in WAYS:
            own = statistics.median(s[way][0] for s in steps) * 1e6
            whole = statistics.median(s[way][1] for s in steps) * 1e6
            ratio_own = statistics.median(s[way][0] / s["all_gather_object"][0] for s in steps)
            ratio_step = statistics.median(s[way][1] / s["all_gather_object"][1] for s in steps)
            print(
                f"| {world} | {way} | {own:,.0f} | {whole:,.0f} | {ratio_own:.2f}x | "
                f"{ratio_step:.2f}x |"
            )


if __name__ == "__main__":
    main()
