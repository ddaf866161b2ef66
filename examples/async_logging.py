"""A training loop that syncs and logs its metrics off the training thread.

Two gloo ranks on 127.0.0.1 each run a simulated loop: every step records a
loss, a per-token entropy under a response mask and the response lengths;
every ``--every`` steps ``tracker.log_every`` starts an async sync of what
was recorded since the last one, resets the metrics and hands the pending
sync to the Tracker, whose background thread writes the step when the sync
completes. The loop goes on training meanwhile. Run it with::

    python examples/async_logging.py --steps 12 --every 4 --out runs/async

and read the log with ``metricsync show runs/async``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import metricsync as ms
from metricsync.testing import run_distributed

SPECS = {
    "loss": ms.Spec("mean", fmt=".4f"),
    "entropy": ms.Spec("mean", fmt=".4f"),  # token mean: masked elements only
    "response_length": ms.Spec(("mean", "max", "p50"), fmt=".0f"),
}


def train(rank: int, world: int, steps: int, every: int, out: str) -> int:
    """One rank's loop; returns the number of steps it handed to the Tracker."""
    ms.bookkeeping_group()  # every rank, once: the gloo group async syncs run on
    gen = torch.Generator().manual_seed(rank)
    metrics = ms.Metrics(SPECS)
    logged = 0
    with ms.Tracker(("console", "jsonl"), run_dir=out, rank=rank) as tracker:
        for step in range(1, steps + 1):
            time.sleep(0.01)  # the training step
            lengths = torch.randint(8, 64, (4,), generator=gen)
            mask = torch.arange(64) < lengths.unsqueeze(1)
            metrics.record("loss", torch.rand((), generator=gen) / step)
            metrics.record("entropy", torch.rand(4, 64, generator=gen), mask=mask)
            metrics.record("response_length", lengths)
            if tracker.log_every(every, metrics, step, timeout=60) is not None:
                logged += 1
    return logged  # leaving the block flushed every pending step to disk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--out", default="runs/async")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(run_distributed(train, 2, args=(args.steps, args.every, args.out)))


if __name__ == "__main__":
    main()
