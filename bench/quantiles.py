"""Benchmark the metricsync quantile sketch against numpy.quantile and the ddsketch package.

Run: ``.venv/bin/python bench/quantiles.py [--n 1000000] [--repeats 7] [--observe-only]``

For ``n`` lognormal float32 values it times, in one process, the full path a
metric takes from raw samples to p50/p90/p99:

1. ``ingest_numpy`` + exact min/max + ``query``;
2. ``ingest_torch`` (CPU) + ``aminmax`` + ``query``;
3. ``numpy.quantile(values, [0.5, 0.9, 0.99])``;
4. the ``ddsketch`` package's per-value ``add`` loop + ``get_quantile_value``
   (timed on at most 100k values and scaled linearly to ``n``).

It prints median times, the ratios against the baselines, the largest
relative error of our quantiles against numpy's, and the state size per metric.

Then, what observing a ``Metrics`` of Q quantile metrics costs after each step's
records (8 new samples each): ``compute()`` folds the pending samples into a copy of
the table, every dense sketch included; it prints the median time of a call and the
minor page faults counted around it (the allocator handing the freed copies back to
the system and faulting them in again: it depends on the process's history).
"""

from __future__ import annotations

import argparse
import importlib
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metricsync._state._quantile import query
from metricsync._state._sketch import ingest_numpy, ingest_torch, sketch_layout

QS = (0.5, 0.9, 0.99)
DDSKETCH_MAX = 100_000


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _optional_module(name: str) -> Any:
    """The module ``name``, or None when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def observe_after_records(metrics: int, steps: int = 200) -> tuple[float, float]:
    """Median seconds and minor page faults of a ``compute()`` after each step's records."""
    import metricsync as ms

    m = ms.Metrics({"q/*": ms.Spec(("mean", "p50", "p99"))})
    rng = np.random.default_rng(0)
    for i in range(metrics):
        m.record(f"q/{i}", rng.integers(16, 4097, 100))
    m.compute()
    times, faults = [], []
    for _ in range(steps):
        for i in range(metrics):
            m.record(f"q/{i}", rng.integers(16, 4097, 8))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        m.compute()
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(times), statistics.median(faults)


def _print_observations() -> int:
    for q in (2, 10):
        seconds, faults = observe_after_records(q)
        print(
            f"compute() after each step's records, {q:>2} quantile metrics: "
            f"{seconds * 1e6:7.1f} us, {faults:.0f} minor page faults a call (median)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="number of samples")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per method")
    parser.add_argument("--accuracy", type=float, default=0.01, help="relative accuracy")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: numpy and ddsketch run on one core too)",
    )
    parser.add_argument(
        "--observe-only",
        action="store_true",
        help="only the compute() after records (a fresh process: no large buffer freed before)",
    )
    args = parser.parse_args(argv)
    if args.observe_only:
        return _print_observations()

    layout = sketch_layout(args.accuracy)
    values = np.random.default_rng(0).lognormal(0.0, 2.0, size=args.n).astype(np.float32)

    def ours_numpy() -> np.ndarray:
        cells = ingest_numpy(layout, values)
        return query(layout, cells, QS, values.min(), values.max())

    rows: list[tuple[str, float, str]] = []
    t_ours = median_seconds(ours_numpy, args.repeats)
    rows.append(("metricsync ingest_numpy + query", t_ours, ""))

    torch = _optional_module("torch")
    if torch is not None:
        torch.set_num_threads(args.torch_threads)
        tensor = torch.from_numpy(values)

        def ours_torch() -> np.ndarray:
            cells = ingest_torch(layout, tensor)
            lo, hi = torch.aminmax(tensor)
            return query(layout, cells.numpy(), QS, float(lo), float(hi))

        t_torch = median_seconds(ours_torch, args.repeats)
        note = f"{args.torch_threads} torch thread(s)"
        rows.append(("metricsync ingest_torch (CPU) + query", t_torch, note))

    t_numpy = median_seconds(lambda: np.quantile(values, QS), args.repeats)
    rows.append(("numpy.quantile", t_numpy, ""))

    t_dd = None
    ddsketch = _optional_module("ddsketch")
    if ddsketch is None:
        rows.append(("ddsketch add loop", float("nan"), "not installed"))
    else:
        sub = values[: min(args.n, DDSKETCH_MAX)].tolist()

        def dd_loop() -> list[float | None]:
            sketch = ddsketch.DDSketch(relative_accuracy=args.accuracy)
            for v in sub:
                sketch.add(v)
            return [sketch.get_quantile_value(q) for q in QS]

        scale = args.n / len(sub)
        t_dd = median_seconds(dd_loop, max(1, min(args.repeats, 3))) * scale
        note = f"timed on {len(sub):,} values, x{scale:g}" if scale != 1 else ""
        rows.append(("ddsketch per-value add loop", t_dd, note))

    print(f"{args.n:,} lognormal float32 values, p50/p90/p99, median of {args.repeats} runs")
    print(f"{'method':40s} {'time':>10s}  note")
    for name, seconds, note in rows:
        print(f"{name:40s} {seconds * 1e3:8.2f} ms  {note}")
    print()
    ours = ours_numpy()
    exact = np.quantile(values.astype(np.float64), QS)
    rel = np.abs(ours - exact) / np.abs(exact)
    print(f"numpy.quantile / ours:        {t_numpy / t_ours:8.2f}x  (target > 1)")
    if t_dd is not None:
        print(f"ddsketch loop / ours:         {t_dd / t_ours:8.1f}x  (target >= 100)")
    print(f"max relative error vs numpy:  {rel.max():.4%}  (accuracy {args.accuracy:.2%})")
    print(
        f"state per metric:             {layout.n_cells * 8:,} bytes "
        f"({layout.n_cells} float64 cells, limit 65,536)"
    )
    print()
    _print_observations()
    met = t_numpy > t_ours and (t_dd is None or t_dd >= 100 * t_ours)
    print("targets met" if met else "TARGETS MISSED")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
