"""Recording cost of metricsync against the floor and a verl-style baseline.

Run: ``.venv/bin/python bench/record.py [--records N] [--names K] [--elements E]``

Prints, in one process:

- float records: ``Metrics.record(name, float)`` (plus one final ``compute()``)
  against ``collections.defaultdict(list)`` appends (the floor: plus a final
  ``np.mean`` per name) and against a verl-style ``Metric.append`` (a list per
  name, ``isinstance`` checks, ``.item()`` on tensors, ``np.mean`` at the end);
- a masked float32 tensor: ``Metrics.record(name, x, mask=mask)`` for a spec
  asking mean, sum, count, min and max, plus ``compute()``, against one pass of
  torch's own masked ``sum``/``count``/``min``/``max`` on the same data.

Each figure is the best of several repeats (seconds per whole workload).
"""

from __future__ import annotations

import argparse
import gc
import time
from collections import defaultdict
from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np
import torch

import metricsync as ms


class AggregationType(Enum):
    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


NumericType = int, float, torch.Tensor, np.ndarray


class VerlStyleMetric:
    """What verl's ``verl/utils/metric/utils.py`` ``Metric`` does on every append."""

    def __init__(self, aggregation: str | AggregationType) -> None:
        self.aggregation = (
            AggregationType(aggregation) if isinstance(aggregation, str) else aggregation
        )
        if not isinstance(self.aggregation, AggregationType):
            raise ValueError(f"unsupported aggregation {aggregation!r}")
        self.values: list[Any] = []

    def append(self, value: Any) -> None:
        if isinstance(value, VerlStyleMetric):
            self.values.extend(value.values)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError("only scalar tensors can be converted to float")
            value = value.detach().item()
        if not isinstance(value, NumericType):
            raise ValueError(f"unsupported value type {type(value)}")
        self.values.append(value)

    def aggregate(self) -> float:
        if self.aggregation is AggregationType.MEAN:
            return float(np.mean(self.values))
        if self.aggregation is AggregationType.SUM:
            return float(np.sum(self.values))
        if self.aggregation is AggregationType.MIN:
            return float(np.min(self.values))
        return float(np.max(self.values))


def best_of(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """The best time of each workload, run round-robin so that drift hits all alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for key, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def float_workload(n_records: int, n_names: int) -> tuple[list[str], list[float]]:
    rng = np.random.default_rng(0)
    names = [f"actor/metric_{i}" for i in range(n_names)]
    keys = [names[i % n_names] for i in range(n_records)]
    values = rng.normal(size=n_records).tolist()
    return keys, values


def bench_floats(n_records: int, n_names: int, repeats: int) -> dict[str, float]:
    keys, values = float_workload(n_records, n_names)
    pairs = list(zip(keys, values))

    def floor() -> object:
        d: defaultdict[str, list[float]] = defaultdict(list)
        for k, v in pairs:
            d[k].append(v)
        return {k: float(np.mean(vs)) for k, vs in d.items()}

    def verl() -> object:  # verl's append_to_dict, then reduce_metrics
        d: dict[str, VerlStyleMetric] = {}
        for k, v in pairs:
            if k not in d:
                d[k] = VerlStyleMetric("mean")
            d[k].append(v)
        return {k: m.aggregate() for k, m in d.items()}

    def metricsync() -> object:
        m = ms.Metrics()
        record = m.record
        for k, v in pairs:
            record(k, v)
        return m.compute()

    # the three agree on the result
    a, b, c = floor(), verl(), metricsync()
    assert isinstance(a, dict) and isinstance(c, dict)
    for k, v in a.items():
        assert abs(v - c[k]) <= 1e-9 * max(1.0, abs(v)), (k, v, c[k])
    del b
    return best_of({"dict": floor, "verl": verl, "metricsync": metricsync}, repeats)


def bench_masked(n_elements: int, repeats: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_elements, generator=gen, dtype=torch.float32)
    mask = torch.rand(n_elements, generator=gen) < 0.7
    spec = ms.Spec(("mean", "sum", "count", "min", "max"))

    def torch_own() -> object:
        kept = torch.where(mask, x, 0.0)
        total = kept.sum(dtype=torch.float64)
        count = mask.sum()
        lo = torch.where(mask, x, float("inf")).min()
        hi = torch.where(mask, x, float("-inf")).max()
        return [float(v) for v in torch.stack([total, count.double(), lo.double(), hi.double()])]

    def metricsync() -> object:
        m = ms.Metrics({"actor/entropy": spec})
        m.record("actor/entropy", x, mask=mask)
        return m.compute()

    total, count, lo, hi = torch_own()  # type: ignore[misc]
    got = metricsync()
    assert isinstance(got, dict)
    assert got["actor/entropy/count"] == count
    assert abs(got["actor/entropy/sum"] - total) <= 1e-6 * max(1.0, abs(total))
    assert got["actor/entropy/min"] == lo and got["actor/entropy/max"] == hi
    return best_of({"torch": torch_own, "metricsync": metricsync}, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--names", type=int, default=20)
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    f = bench_floats(args.records, args.names, args.repeats)
    per = 1e9 / args.records
    print(f"float records: {args.records:,} over {args.names} names, final compute included")
    print(f"  dict[list].append + np.mean : {f['dict']:.3f} s  ({f['dict'] * per:.0f} ns/record)")
    print(f"  verl-style Metric.append    : {f['verl']:.3f} s  ({f['verl'] * per:.0f} ns/record)")
    print(
        f"  metricsync Metrics.record   : {f['metricsync']:.3f} s  "
        f"({f['metricsync'] * per:.0f} ns/record)"
    )
    print(f"  metricsync / dict  = {f['metricsync'] / f['dict']:.2f}x  (target <= 3x)")
    print(f"  verl / metricsync  = {f['verl'] / f['metricsync']:.2f}x faster  (target >= 2x)")

    t = bench_masked(args.elements, args.repeats)
    print(f"masked float32 tensor: {args.elements:,} elements, bool mask, 1 torch thread")
    print(f"  torch masked sum/count/min/max : {t['torch'] * 1e3:.2f} ms")
    print(f"  metricsync record + compute    : {t['metricsync'] * 1e3:.2f} ms")
    print(f"  metricsync / torch = {t['metricsync'] / t['torch']:.2f}x  (target <= 3x)")


if __name__ == "__main__":
    main()
