"""``metricsync demo``: a simulated multi-rank RL training run over gloo on this machine.

N local processes record what a PPO-shaped trainer records, ``sync()`` each step, and rank 0
logs to the console and JSONL; it ends by printing where the log and a plot are.

>>> from metricsync._cli._demo import SPECS
>>> SPECS["actor/lr"]
Spec('last', fmt='.2e')
"""

from __future__ import annotations

import fnmatch
import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._facade._metrics import Metrics
from .._log._logfile import MAX_LINE_BYTES, parse_record
from .._state._spec import Spec
from .._tracking._tracker import Tracker
from ._progress import Progress

__all__ = ["SPECS", "main"]

SPECS = {
    "actor/entropy": Spec("mean"),  # token mean over response tokens of every rank
    "actor/pg_loss": Spec("sum", across="mean"),  # sum over micro-batches, mean over DP ranks
    "actor/kl": Spec("mean"),  # weighted by the micro-batch's token count
    "actor/grad_norm": Spec("max"),
    "actor/lr": Spec("last", fmt=".2e"),
    "response_length": Spec(("mean", "min", "max", "p50", "p99"), fmt=".0f"),
    "critic/score": Spec(("mean", "std")),
    "perf/tokens_per_s": Spec("sum", across="sum", fmt=",.0f"),
    "timing/*": Spec("max", fmt=".3f"),
}
MICRO_BATCHES = 4
BATCH = 8
MAX_LEN = 256


def _learning_rate(step: int, steps: int) -> float:
    warmup = max(1, steps // 10)
    if step < warmup:
        return 1e-6 * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 1e-7 + (1e-6 - 1e-7) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _train_step(metrics: Any, rank: int, step: int, steps: int, rng: np.random.Generator) -> None:
    import torch

    start = time.perf_counter()
    progress = step / max(1, steps - 1)
    tokens = 0
    if rank % 2 == 0:  # only the ranks that generate measure generation time
        metrics.record("timing/gen", 0.02 + 0.01 * rng.random())
    for _ in range(MICRO_BATCHES):
        lengths = rng.integers(16, MAX_LEN, BATCH) if rank else rng.integers(64, MAX_LEN, BATCH)
        mask = torch.arange(MAX_LEN)[None, :] < torch.as_tensor(lengths)[:, None]
        entropy = torch.rand(BATCH, MAX_LEN, dtype=torch.float32) * (2.0 - 1.2 * progress)
        metrics.record("actor/entropy", entropy, mask=mask)
        n_tokens = int(lengths.sum())
        tokens += n_tokens
        loss = (0.5 - 0.4 * progress) / MICRO_BATCHES + 0.02 * rng.normal()
        metrics.record("actor/pg_loss", loss)
        metrics.record("actor/kl", abs(0.01 * progress + 0.002 * rng.normal()), weight=n_tokens)
        metrics.record("actor/grad_norm", float(rng.lognormal(0.0, 0.3)))
        metrics.record("response_length", torch.as_tensor(lengths))
        metrics.record("critic/score", torch.as_tensor(rng.normal(progress, 1.0, BATCH)))
    metrics.record("actor/lr", _learning_rate(step, steps))
    time.sleep(0.02)
    elapsed = time.perf_counter() - start
    metrics.record("perf/tokens_per_s", tokens / elapsed)
    metrics.record("timing/update", elapsed)


def _rank_main(rank: int, world_size: int, steps: int, out: str, backends: tuple[str, ...]) -> str:
    rng = np.random.default_rng(1234 + rank)
    metrics = Metrics(SPECS)
    # rank 0 draws a bar on stderr when it is a terminal (tqdm when installed)
    bar = Progress(steps if rank == 0 else 0, "demo", unit="step", minimum=1)
    with bar, Tracker(backends=backends, run_dir=out, rank=rank) as tracker:
        for step in range(steps):
            metrics.reset()
            _train_step(metrics, rank, step, steps, rng)
            synced = metrics.sync(timeout=60.0)
            bar.clear()  # the console backend's lines go to the same terminal
            tracker.log(synced, step=step)
            if rank == 0:
                sys.stdout.flush()
            bar.update(1)
    return str(Path(out) / "metrics.jsonl")


def _clear(out: Path) -> None:
    """Remove an earlier demo's log, curves and TensorBoard events from ``out``, so the
    log of a second demo starts afresh instead of reading as a resumed run. A log the
    demo did not write (keys outside :data:`SPECS`) is left alone: ``ValueError``.
    Nothing else there is touched."""
    log = out / "metrics.jsonl"
    if not log.exists():
        return
    if not _is_demo_log(log):
        raise ValueError(f"{log} holds metrics the demo does not record; pass another --out")
    for path in [log, out / "metrics.png", *out.glob("events.out.tfevents.*")]:
        path.unlink(missing_ok=True)


def _is_demo_log(log: Path) -> bool:
    """Whether the first line of ``log`` is a metricsync header of the demo's keys alone."""
    with log.open("rb") as file:
        first = file.readline(MAX_LINE_BYTES + 1).rstrip(b"\n")
    try:
        formats = parse_record(first).formats
    except ValueError:  # not a log line (a torn one included)
        return False
    keys = [out for name, spec in SPECS.items() for out in spec.output_keys(name)]
    return bool(formats) and all(any(fnmatch.fnmatchcase(f, k) for k in keys) for f in formats)


def main(world_size: int = 2, steps: int = 20, out: str = "runs/demo") -> int:
    """Run the demo: ``world_size`` gloo ranks for ``steps`` steps, logging under ``out``."""
    from ..testing import run_distributed

    backends: tuple[str, ...] = ("console", "jsonl")
    if importlib.util.find_spec("tensorboard") is not None:
        backends += ("tensorboard",)
    print(
        f"metricsync demo: {world_size} gloo ranks on 127.0.0.1, {steps} steps, "
        f"logging to {', '.join(backends)} under {out}",
        flush=True,
    )
    _clear(Path(out))
    begun = time.monotonic()
    results = run_distributed(_rank_main, world_size, args=(steps, out, backends), timeout=300.0)
    jsonl = Path(results[0])
    print(f"\ndone in {time.monotonic() - begun:.1f}s")
    print(f"JSONL log:   {jsonl}")
    try:
        from ._plotting import plot_jsonl

        png = plot_jsonl(jsonl, Path(out) / "metrics.png")
        print(f"curves:      {png}")
    except ImportError as exc:
        print(f"curves:      skipped ({exc})")
    print(f"table:       metricsync show {jsonl} --last 5")
    return 0
