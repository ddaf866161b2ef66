"""Async sync against blocking sync: the time the training thread spends in metricsync.

Run: .venv/bin/python bench/async.py [--world 4] [--steps 30] [--warmup 3] [--rounds 3]

On each of N local gloo ranks (127.0.0.1), a loop whose "training" is a
20 ms sleep per step, plus RL-shaped records: per micro-batch (8 of them)
60 scalar 0-d tensors (``mean``), 6 per-token ``(4, 256)`` float32 tensors
with a response mask (token means; ``critic/advantages`` also ``max`` and
``min``) and the 4 response lengths into ``(mean, max, min, p50, p99)``; per
step 30 timings (``max``), 20 throughputs (``sum``), the lr (``last``) and
82 other host floats: 200 metrics, 206 logged keys. Rank 0 logs every step
to a JSONL Tracker.

Two loops run in the same processes, in alternating order, round after
round, on the same data:

- **blocking**: ``tracker.log(metrics.sync(timeout=60), step)``, then
  ``metrics.reset()``;
- **async**: ``previous.wait()`` (the sync started one step earlier), then
  ``handle = metrics.sync(timeout=60, async_op=True)``,
  ``tracker.log(handle, step)`` and ``metrics.reset()``; the collectives,
  ``compute()`` and the JSONL write happen in the background, during the next
  step's training.

The time measured is the training thread's in that sync section (wait,
``sync()``, ``log`` and ``reset``; the recording, the same in both loops, is
given apart), per step the slowest rank's, median over steps; the target is
async <= 10% of blocking. After the
timing, the benchmark checks that the two loops logged identical values at
every step of every round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import metricsync as ms
from metricsync._log._logread import read_jsonl
from metricsync.testing import run_distributed

N_SCALARS, N_TIMING, N_PERF, N_HOST = 60, 30, 20, 82
TOKEN_NAMES = (
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "critic/vf_clipfrac",
    "critic/values",
    "critic/advantages",
)
BATCH, SEQ = 4, 256
TRAIN_S = 0.020
N_DATA = 4  # data sets per rank, used in turn: the same steps see the same data in both loops

SPECS = {
    "critic/advantages": ms.Spec(("mean", "max", "min")),
    "response_length": ms.Spec(("mean", "max", "min", "p50", "p99"), fmt=".0f"),
    "timing_s/*": ms.Spec("max", fmt=".3f"),
    "perf/*": ms.Spec("sum", fmt=",.0f"),
    "actor/lr": ms.Spec("last", fmt=".2e"),
}


def make_data(rank: int, index: int, micro_batches: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(10_000 * index + rank)
    mbs = []
    for _ in range(micro_batches):
        lengths = torch.randint(16, SEQ + 1, (BATCH,), generator=gen, dtype=torch.int64)
        mbs.append(
            {
                "scalars": [
                    (f"actor/metric_{i:02d}", torch.randn((), generator=gen))
                    for i in range(N_SCALARS)
                ],
                "tokens": [
                    (name, torch.randn(BATCH, SEQ, generator=gen) * 0.5 + i)
                    for i, name in enumerate(TOKEN_NAMES)
                ],
                "mask": torch.arange(SEQ).unsqueeze(0) < lengths.unsqueeze(1),
                "lengths": lengths,
            }
        )
    rng = np.random.default_rng([index, rank])
    host = [(f"timing_s/section_{i:02d}", float(rng.uniform(0.1, 5))) for i in range(N_TIMING)]
    host += [(f"perf/throughput_{i:02d}", float(rng.uniform(1e3, 1e5))) for i in range(N_PERF)]
    host += [(f"train/stat_{i:02d}", float(rng.normal())) for i in range(N_HOST)]
    host.append(("actor/lr", 3e-6 * (1 + index)))
    return {"mbs": mbs, "host": host}


def record(metrics: ms.Metrics, data: dict[str, Any]) -> None:
    rec = metrics.record
    for mb in data["mbs"]:
        for name, t in mb["scalars"]:
            rec(name, t)
        mask = mb["mask"]
        for name, t in mb["tokens"]:
            rec(name, t, mask=mask)
        rec("response_length", mb["lengths"])
    for name, v in data["host"]:
        rec(name, v)


def run_loop(
    mode: str, rank: int, data: list[dict[str, Any]], steps: int, run_dir: Path
) -> list[list[float]]:
    """One loop of ``steps`` steps; per step the seconds of: record, wait, sync call, log + reset."""
    metrics = ms.Metrics(SPECS)
    times = []
    previous: ms.SyncHandle | None = None
    with ms.Tracker("jsonl", run_dir=run_dir, rank=rank) as tracker:
        dist.barrier()
        for step in range(steps):
            time.sleep(TRAIN_S)  # the training step
            t0 = time.perf_counter()
            record(metrics, data[step % len(data)])
            t1 = time.perf_counter()
            if previous is not None:
                previous.wait()
            t2 = time.perf_counter()
            if mode == "blocking":
                synced: Any = metrics.sync(timeout=60)
            else:
                synced = previous = metrics.sync(timeout=60, async_op=True)
            t3 = time.perf_counter()
            tracker.log(synced, step)
            metrics.reset()
            t4 = time.perf_counter()
            times.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t1])
        tracker.flush()
    return times


def _bench_rank(
    rank: int, world: int, steps: int, warmup: int, rounds: int, micro_batches: int, out: str
) -> dict[str, Any]:
    data = [make_data(rank, i, micro_batches) for i in range(N_DATA)]
    dist.barrier()
    start = time.perf_counter()
    ms.bookkeeping_group()  # what the first async sync would do: once per process group
    created = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(created, op=dist.ReduceOp.MAX)
    per_mode: dict[str, list[list[float]]] = {"blocking": [], "async": [], "create": [[]]}
    per_mode["create"][0].append(float(created))
    for rnd in range(rounds):
        order = ["blocking", "async"] if rnd % 2 == 0 else ["async", "blocking"]
        for mode in order:
            times = run_loop(mode, rank, data, warmup + steps, Path(out) / f"{mode}-{rnd}")
            rows = torch.tensor(times[warmup:], dtype=torch.float64)
            dist.all_reduce(rows, op=dist.ReduceOp.MAX)  # the slowest rank's, per step
            per_mode[mode] += rows.tolist()
    return per_mode


def compare_logs(out: Path, rounds: int) -> tuple[int, int]:
    """(steps, keys) compared; raises if a round's two logs differ anywhere."""
    steps = keys = 0
    for rnd in range(rounds):
        _, blocking = read_jsonl(out / f"blocking-{rnd}")
        _, async_ = read_jsonl(out / f"async-{rnd}")
        assert blocking == async_, f"round {rnd}: the async log differs from the blocking one"
        steps += len(blocking)
        keys = len(blocking[0][1])
    return steps, keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30, help="measured steps per loop")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured first steps per loop")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both loops")
    parser.add_argument("--micro-batches", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        results = run_distributed(
            _bench_rank,
            args.world,
            args=(args.steps, args.warmup, args.rounds, args.micro_batches, out),
            timeout=1800,
        )
        steps, keys = compare_logs(Path(out), args.rounds)
    per_mode = results[0]
    created = per_mode.pop("create")[0][0]
    med = {mode: [statistics.median(col) for col in zip(*rows)] for mode, rows in per_mode.items()}
    print(
        f"{args.world} gloo ranks, 200 metrics ({keys} keys), {args.micro_batches} micro-batches, "
        f"{TRAIN_S * 1e3:.0f} ms of training per step; {args.rounds} rounds x {args.steps} steps "
        f"per loop (after {args.warmup}); per step the slowest rank, then medians over steps"
    )
    print("loop       record ms | wait ms  sync() ms  log+reset ms | sync section ms")
    for mode, (rec, wait, call, rest, section) in med.items():
        print(
            f"{mode:<9} {rec * 1e3:>9.2f} | {wait * 1e3:>7.3f} {call * 1e3:>10.3f} "
            f"{rest * 1e3:>13.3f} | {section * 1e3:>15.3f}"
        )
    ratio = med["async"][4] / med["blocking"][4]
    verdict = "met" if ratio <= 0.10 else "missed"
    print(f"async / blocking, sync section: {ratio:.1%} (target <= 10%: {verdict})")
    print(f"logged values identical in both loops: {steps} steps x {keys} keys")
    print(f"creating the bookkeeping group (once, every rank): {created * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
