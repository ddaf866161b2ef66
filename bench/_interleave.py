"""Two ways of one step timed interleaved, step by step, in one process: shared by the
GPU benchmarks (``gpu_step.py``, ``gpu_check.py``'s RL step).

>>> ours, theirs, ratio = interleaved({"ours": lambda: None, "theirs": lambda: None}, 3)
>>> ratio > 0
True
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved(
    sides: dict[str, Callable[[], Any]],
    steps: int,
    warmup: int = 2,
    sync: Callable[[], Any] = lambda: None,
) -> tuple[float, float, float]:
    """Median ms per step of ``sides["ours"]`` and ``sides["theirs"]``, and the median of
    the per-step ratios ours / theirs: ``warmup + steps`` steps, the order alternating
    every step, each timed between two ``sync()`` calls (the device drained)."""
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for i in range(steps + warmup):
        for side in ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours"):
            sync()
            start = time.perf_counter()
            sides[side]()
            sync()
            if i >= warmup:
                times[side].append(time.perf_counter() - start)
    ratio = statistics.median(o / t for o, t in zip(times["ours"], times["theirs"]))
    return statistics.median(times["ours"]) * 1e3, statistics.median(times["theirs"]) * 1e3, ratio
