"""Two ``Metrics`` on one process group: what the small one pays for sharing the large one's layout.

Run: .venv/bin/python bench/several.py [--worlds 2] [--metrics 1000 10000] [--repeats 40]

On each of N local gloo ranks (127.0.0.1), a training ``Metrics`` of K names (a glob
rule among its rules) and a validation ``Metrics`` of 2 names (an exact rule) are
synced in turn, each sync followed by ``compute()``. The validation sync is timed two
ways, alternating in the same processes:

- **shared**: on the group the training ``Metrics`` syncs on, so it packs its state
  in the layout of both (room for the K training names);
- **own group**: on a process group of the same ranks made for it (``new_group``),
  whose layout holds its 2 names only: the way to keep them apart.

The table gives the slowest rank's median per sync, the ratio, and the bytes each
validation sync hands to its collective.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

import metricsync as ms
from metricsync.testing import count_collectives, run_distributed


def _rank(rank: int, world: int, k: int, repeats: int) -> dict[str, float]:
    own = dist.new_group(list(range(world)))
    train = ms.Metrics({"train/timing/*": ms.Spec("max")})
    for i in range(k):
        train.record(f"train/m{i:05d}", float(i + rank))
    val = ms.Metrics({"val/acc": ms.Spec("max")})
    val.record("val/loss", 0.5 + rank)
    val.record("val/acc", 0.25 * (rank + 1))
    groups: dict[str, Any] = {"shared": None, "own group": own}
    for group in groups.values():  # the layouts agreed, untimed
        for _ in range(2):
            train.sync().compute()
            val.sync(group).compute()
    times: dict[str, list[float]] = {name: [] for name in groups}
    for r in range(repeats):
        for name in list(groups)[r % 2 :] + list(groups)[: r % 2]:
            train.sync().compute()
            dist.barrier()
            start = time.perf_counter()
            val.sync(groups[name]).compute()
            times[name].append(time.perf_counter() - start)
    out = {}
    for name, seconds in times.items():
        per_call = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(per_call, op=dist.ReduceOp.MAX)  # the slowest rank's, per sync
        out[f"t_{name}"] = float(statistics.median(per_call.tolist()))
        train.sync()
        with count_collectives() as seen:
            val.sync(groups[name])
        out[f"bytes_{name}"] = float(seen.bytes)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2])
    parser.add_argument("--metrics", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    print(
        "validation sync + compute (2 names) beside a training Metrics of K names; "
        "slowest rank, median"
    )
    print(
        f"{'ranks':>5} {'K':>6} {'shared':>9} {'own group':>10} {'ratio':>6}"
        f" {'bytes shared':>13} {'bytes own':>10}"
    )
    for world in args.worlds:
        for k in args.metrics:
            row = run_distributed(_rank, world, args=(k, args.repeats), timeout=600)[0]
            shared, alone = row["t_shared"], row["t_own group"]
            print(
                f"{world:>5} {k:>6} {shared * 1e3:>7.2f}ms {alone * 1e3:>8.2f}ms"
                f" {shared / alone:>5.1f}x {row['bytes_shared']:>13,.0f}"
                f" {row['bytes_own group']:>10,.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
