"""Make the README's plot images with ``metricsync plot``, from two simulated runs.

Run from the repository root: ``python docs/images/make_images.py``. The runs
are seeded, so the images change only when the plot command's drawing does.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import metricsync as ms

STEPS = 601
IMAGES = Path(__file__).resolve().parent


def _learning_rate(step: int) -> float:
    """Linear warmup to 1e-4 over 60 steps, then down to 1e-8 at the last step, exponentially."""
    if step < 60:
        return 1e-4 * (step + 1) / 60
    return 1e-4 * (1e-4 ** ((step - 60) / (STEPS - 1 - 60)))


def _log_run(run_dir: Path, seed: int, shift: float) -> None:
    rng = np.random.default_rng(seed)
    specs = {"response_length": ms.Spec(("mean", "min", "max", "p50", "p90", "p99"), fmt=".0f")}
    with ms.Tracker("jsonl", run_dir=run_dir) as tracker:
        for step in range(STEPS):
            progress = step / (STEPS - 1)
            metrics = ms.Metrics(specs)
            long = rng.random(8192) < 0.2 + 0.25 * progress  # more long answers as it learns
            short = rng.gamma(6.0, 10.0, 8192)
            lengths = np.where(long, rng.normal(350 + 150 * progress, 60, 8192), short)
            lengths = lengths.clip(16, 1024)
            metrics.record("response_length", lengths)
            metrics.record("actor/pg_loss", 0.6 - 0.5 * progress + shift + 0.12 * rng.normal())
            entropy = 1.8 - 0.9 * progress + shift / 2 + 0.03 * rng.normal()
            metrics.record("actor/entropy", entropy)
            metrics.record("actor/lr", _learning_rate(step))
            tracker.log(metrics, step=step)


def _plot(runs: list[Path], keys: str, out: str, *extra: str) -> None:
    command = [sys.executable, "-m", "metricsync", "plot", *map(str, runs)]
    command += ["--keys", keys, *extra, "-o", str(IMAGES / out)]
    print(" ".join(command[1:]))
    subprocess.run(command, check=True)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        _log_run(a, seed=0, shift=0.0)
        _log_run(b, seed=1, shift=0.1)
        _plot([a, b], "actor/pg_loss,actor/entropy", "plot-runs-smoothed.png", "--smooth", "0.9")
        _plot([a], "response_length/*", "plot-family.png")
        _plot([a], "actor/lr", "plot-logy.png")


if __name__ == "__main__":
    main()
