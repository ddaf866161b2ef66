"""A verl-shaped PPO loop on Ray: two worker groups, each a 2-rank gloo DP group.

The driver starts an "actor" group and a "critic" group of Ray actors. Within
a group the ranks form a torch.distributed (gloo) process group. Every step,
each rank simulates its share of a PPO update (per-token entropy under a
response mask, per-micro-batch losses under gradient accumulation with a
different number of micro-batches per rank, response lengths, the learning
rate), records it into a :class:`metricsync.Metrics`, and ``sync()``s it
within its group; rank 0 of each group returns the synced metrics. The driver
merges the two groups and logs the result with :class:`metricsync._tracking._tracker.Tracker`.

Everything is simulated; nothing leaves 127.0.0.1. Run it with::

    python examples/verl_style_trainer.py --steps 5 --out runs/verl_style
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from datetime import timedelta
from typing import Any

import ray
import torch

import metricsync as ms
from metricsync._facade._collect import collect
from metricsync._tracking._tracker import Tracker

SPECS = {
    "actor/entropy": ms.Spec("mean", fmt=".4f"),  # token mean: masked elements only
    # sum over gradient-accumulation micro-batches, mean over DP ranks
    "actor/pg_loss": ms.Spec("sum", across="mean", fmt=".4f"),
    "actor/lr": ms.Spec("last", fmt=".2e"),
    "critic/vf_loss": ms.Spec("sum", across="mean", fmt=".4f"),
    "critic/values": ms.Spec("mean", fmt=".3f"),
    "critic/lr": ms.Spec("last", fmt=".2e"),
    "response_length": ms.Spec(("mean", "max", "min", "p99"), fmt=".0f"),
    "perf/tokens": ms.Spec("sum", fmt=",.0f"),
    "timing/update": ms.Spec("max", fmt=".3f"),
}
WORLD_SIZE = 2
BATCH, MAX_LEN = 8, 64


class PPOWorker:
    """One DP rank of a worker group ("actor" or "critic"), living in a Ray actor."""

    def __init__(self, role: str, rank: int, port: int, base_lr: float) -> None:
        self.role, self.rank, self.port, self.base_lr = role, rank, port, base_lr
        self.metrics = ms.Metrics(SPECS)

    def setup(self) -> None:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo on loopback
        torch.set_num_threads(1)
        torch.distributed.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{self.port}",
            rank=self.rank,
            world_size=WORLD_SIZE,
            timeout=timedelta(seconds=60),
        )

    def update(self, step: int) -> ms.Metrics | None:
        """One simulated PPO update; returns the group-synced metrics on rank 0."""
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(1000 * step + 10 * self.rank + len(self.role))
        self.metrics.reset()
        grad_accum = 2 + self.rank  # ranks hold different numbers of micro-batches
        for _ in range(grad_accum):
            lengths = torch.randint(1, MAX_LEN + 1, (BATCH,), generator=gen)
            mask = torch.arange(MAX_LEN)[None, :] < lengths[:, None]  # response mask
            tokens = mask.sum()
            if self.role == "actor":
                entropy = torch.rand(BATCH, MAX_LEN, generator=gen) * 2.0 / (1 + 0.1 * step)
                self.metrics.record("actor/entropy", entropy, mask=mask)
                per_token = torch.randn(BATCH, MAX_LEN, generator=gen) * 0.1 + 0.5 / (1 + step)
                loss = (per_token * mask).sum() / tokens / grad_accum  # scaled for accumulation
                self.metrics.record("actor/pg_loss", loss)
                self.metrics.record("response_length", lengths)
                self.metrics.record("perf/tokens", tokens)
            else:
                values = torch.randn(BATCH, MAX_LEN, generator=gen) + 0.1 * step
                self.metrics.record("critic/values", values, mask=mask)
                vf = ((values - 0.5) ** 2 * mask).sum() / tokens / grad_accum
                self.metrics.record("critic/vf_loss", vf)
        lr = self.base_lr * min(1.0, (step + 1) / 3)  # warm-up
        self.metrics.record(f"{self.role}/lr", lr)
        self.metrics.record("timing/update", time.perf_counter() - start)
        synced = self.metrics.sync(timeout=60.0)
        return synced if self.rank == 0 else None

    def close(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args(argv)
    run_dir = args.out or tempfile.mkdtemp(prefix="verl_style_")

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        worker_cls: Any = ray.remote(num_cpus=0.5)(PPOWorker)
        groups = {
            role: [worker_cls.remote(role, rank, port, lr) for rank in range(WORLD_SIZE)]
            for role, port, lr in (("actor", free_port(), 1e-6), ("critic", free_port(), 1e-5))
        }
        everyone: list[Any] = [w for group in groups.values() for w in group]
        ray.get([w.setup.remote() for w in everyone], timeout=120)
        with Tracker(backends=("console", "jsonl"), run_dir=run_dir) as tracker:
            for step in range(1, args.steps + 1):
                refs = [w.update.remote(step) for w in everyone]  # non-zero ranks return None
                merged = collect(refs, timeout=120)  # actor group and critic group together
                tracker.log(merged, step=step)
        ray.get([w.close.remote() for w in everyone], timeout=60)
    finally:
        ray.shutdown()
    print(f"metrics written to {os.path.join(run_dir, 'metrics.jsonl')}")


if __name__ == "__main__":
    main()
