"""The log tools on large logs: ``show --last`` and ``plot`` on 10x more steps.

Run: .venv/bin/python bench/cli.py [--steps 100000] [--keys 50] [--repeats 5]

Writes two JSONL logs with the same keys (``--steps`` steps and a tenth of
that), then runs each command on both, alternately, in fresh processes,
``--repeats`` times, and prints the median wall time, the children's CPU time
and the peak RSS of each, with the ratio large / small. ``show --last N``
reads from the end of the file, so its cost should not follow the file's size;
``plot`` reads every step (downsampled to min/max envelopes before drawing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROG = [sys.executable, "-m", "metricsync"]


def write_log(path: Path, steps: int, keys: list[str]) -> None:
    """A metricsync JSONL log: a header, then one line per step with every key."""
    rng = random.Random(0)
    with path.open("w") as f:
        header = {"metricsync": 1, "formats": dict.fromkeys(keys), "time": 0.0, "complete": True}
        f.write(json.dumps(header) + "\n")
        for step in range(steps):
            decay = math.exp(-step / (steps / 5))
            values = {k: decay * (1 + 0.3 * rng.random()) * (i + 1) for i, k in enumerate(keys)}
            f.write(json.dumps({"step": step, "time": float(step), "values": values}) + "\n")


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one run of ``cmd``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    groups = ("actor", "critic", "timing", "perf", "response")
    keys = [f"{groups[i % len(groups)]}/m{i}" for i in range(args.keys)]
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for label, steps in (("large", args.steps), ("small", args.steps // 10)):
            runs[label] = Path(tmp, label)
            runs[label].mkdir()
            write_log(runs[label] / "metrics.jsonl", steps, keys)
        sizes = {k: (p / "metrics.jsonl").stat().st_size / 1e6 for k, p in runs.items()}
        commands = {
            "show --last 5": lambda run: [*PROG, "show", "--last", "5", str(run)],
            "plot --smooth 0.9": lambda run: [
                *PROG,
                "plot",
                str(run),
                "--smooth",
                "0.9",
                "-o",
                str(run / "plot.png"),
            ],
        }
        print(
            f"{args.steps:,} and {args.steps // 10:,} steps x {args.keys} keys:"
            f" {sizes['large']:.1f} MB and {sizes['small']:.1f} MB"
        )
        print(f"{'command':<20}{'log':>7}{'wall':>10}{'cpu':>10}{'peak RSS':>11}{'ratio':>8}")
        for name, make in commands.items():
            walls: dict[str, list[float]] = {"large": [], "small": []}
            cpus: dict[str, list[float]] = {"large": [], "small": []}
            peaks: dict[str, float] = {"large": 0.0, "small": 0.0}
            for i in range(args.repeats):
                order = ("large", "small") if i % 2 == 0 else ("small", "large")
                for label in order:
                    wall, cpu, peak = timed(make(runs[label]))
                    peaks[label] = max(peaks[label], peak)
                    walls[label].append(wall)
                    cpus[label].append(cpu)
            ratio = statistics.median(
                a / b for a, b in zip(walls["large"], walls["small"], strict=True)
            )
            for label in ("large", "small"):
                print(
                    f"{name:<20}{label:>7}{statistics.median(walls[label]):>9.2f}s"
                    f"{statistics.median(cpus[label]):>9.2f}s"
                    f"{peaks[label]:>7.0f} MiB" + (f"{ratio:>7.2f}x" if label == "large" else "")
                )


if __name__ == "__main__":
    main()
