"""Each recording path of metricsync against its hand-rolled twin, the final fold included.

Run: .venv/bin/python bench/record.py [--repeats 9] [--scale 1.0]

Every row records N values round-robin into 8 names, then reads the result
once (``Metrics.compute()``: the deferred fold is part of the cost; the twin
reduces its lists with numpy). Both sides run interleaved, the order
alternating every repeat, in one process with 1 torch thread; the table
gives the median time per record and the ratio of the medians. Each pair
is checked to agree on the result before it is timed.

| path | metricsync | hand-rolled twin | target |
|---|---|---|---|
| float | ``record(name, x)`` | ``defaultdict(list)`` append, ``np.mean`` | 3x |
| float | same | verl's ``Metric.append`` | (faster) |
| float | the twin's append in a method of ``record``'s signature | the twin | (its floor) |
| weighted float | ``record(name, x, weight=w)`` | two appends, sum-product | 3x |
| 0-d CPU tensor | ``record(name, t)`` | ``.item()`` + append | 3x |
| 8 ints, int64 tensor | into ``(mean, p50, p99)`` | ``.tolist()`` + extend, numpy | 3x |
| 8 ints, list | into ``(mean, p50, p99)`` | extend, numpy | 3x |
| numpy array of 64 | ``record(name, a)`` | ``list.extend(a)``, ``np.mean`` | 3x |
| masked (4, 256) tensor | ``record(name, t, mask=m)`` | ``((t*m).sum()/m.sum()).item()`` | 1.5x |
| masked 1M-element tensor | ``(mean, sum, count, min, max)`` | torch's own masked reductions | 3x |

It also prints the aten ops a ``record()`` of a device tensor dispatches,
counted on the meta device (``metricsync.testing.count_device_ops``: on a GPU
each is a kernel launch) over 512 records and the fold among them, and the CPU
time of a 0-d device record (``--device-only`` prints just these).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import metricsync as ms
from metricsync._record._device_refs import REF_LIMIT
from metricsync.testing import count_device_ops, meta_records

NAMES = [f"actor/metric_{i}" for i in range(8)]
QUANTILE_SPEC = ms.Spec(("mean", "p50", "p99"))


@dataclass
class Path:
    """One row: a metricsync workload, its twin, the records each makes, and the target ratio."""

    label: str
    twin_label: str
    ours: Callable[[], dict[str, float]]
    twin: Callable[[], dict[str, float]]
    records: int
    target: float | None
    check: Callable[[dict[str, float], dict[str, float]], None]


def close(rel: float = 1e-9) -> Callable[[dict[str, float], dict[str, float]], None]:
    def check(ours: dict[str, float], twin: dict[str, float]) -> None:
        assert ours.keys() == twin.keys(), (sorted(ours), sorted(twin))
        for k, v in twin.items():
            assert math.isclose(ours[k], v, rel_tol=rel, abs_tol=1e-12), (k, ours[k], v)

    return check


def quantile_check(
    samples: dict[str, np.ndarray],
) -> Callable[[dict[str, float], dict[str, float]], None]:
    """Means equal; each pNN within 1% of the order statistics numpy interpolates between."""

    def check(ours: dict[str, float], twin: dict[str, float]) -> None:
        assert ours.keys() == twin.keys()
        for k, v in twin.items():
            name, stat = k.rsplit("/", 1)
            if stat == "mean":
                assert math.isclose(ours[k], v, rel_tol=1e-9), (k, ours[k], v)
                continue
            s = np.sort(samples[name])
            pos = float(stat[1:]) / 100.0 * (s.size - 1)
            lo, hi = s[math.floor(pos)], s[math.ceil(pos)]
            assert lo * 0.99 <= ours[k] <= hi * 1.01, (k, ours[k], lo, hi)

    return check


# --- the paths ---------------------------------------------------------------


def float_paths(n: int) -> list[Path]:
    rng = np.random.default_rng(0)
    pairs = [(NAMES[i % 8], v) for i, v in enumerate(rng.normal(size=n).tolist())]
    weights = rng.uniform(0.5, 2.0, size=n).tolist()
    triples = [(k, v, w) for (k, v), w in zip(pairs, weights)]

    def ours() -> dict[str, float]:
        m = ms.Metrics()
        record = m.record
        for k, v in pairs:
            record(k, v)
        return m.compute()

    def twin() -> dict[str, float]:
        d: defaultdict[str, list[float]] = defaultdict(list)
        for k, v in pairs:
            d[k].append(v)
        return {k: float(np.mean(vs)) for k, vs in d.items()}

    def verl() -> dict[str, float]:
        d: dict[str, VerlMetric] = {}
        for k, v in pairs:
            if k not in d:
                d[k] = VerlMetric()
            d[k].append(v)
        return {k: float(np.mean(m.values)) for k, m in d.items()}

    def ours_weighted() -> dict[str, float]:
        m = ms.Metrics()
        record = m.record
        for k, v, w in triples:
            record(k, v, weight=w)
        return m.compute()

    def twin_weighted() -> dict[str, float]:
        vals: defaultdict[str, list[float]] = defaultdict(list)
        wts: defaultdict[str, list[float]] = defaultdict(list)
        for k, v, w in triples:
            vals[k].append(v)
            wts[k].append(w)
        return {k: float(np.dot(vals[k], wts[k]) / np.sum(wts[k])) for k in vals}

    def bound() -> dict[str, float]:
        m = BareSignature()
        record = m.record
        for k, v in pairs:
            record(k, v)
        return m.compute()

    return [
        Path("float", "dict append + np.mean", ours, twin, n, 3.0, close()),
        Path(
            "float: the signature's floor (below)",
            "dict append + np.mean",
            bound,
            twin,
            n,
            None,
            close(),
        ),
        Path("float", "verl Metric.append", ours, verl, n, None, close()),
        Path(
            "float, weight=",
            "2 appends + sum-product",
            ours_weighted,
            twin_weighted,
            n,
            3.0,
            close(),
        ),
    ]


class BareSignature:
    """The twin's append behind a method of ``Metrics.record``'s signature (keyword-only
    ``weight`` and ``mask``, fixed by the API): no check, no bound on memory. What it
    costs over the twin is what any ``record`` with that signature pays per float."""

    def __init__(self) -> None:
        self.lists: defaultdict[str, list[float]] = defaultdict(list)

    def record(self, name: str, value: Any, *, weight: Any = None, mask: Any = None) -> None:
        self.lists[name].append(value)

    def compute(self) -> dict[str, float]:
        return {k: float(np.mean(vs)) for k, vs in self.lists.items()}


class VerlMetric:
    """What verl's ``Metric.append`` does for each value (``verl/utils/metric/utils.py``)."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def append(self, value: Any) -> None:
        if isinstance(value, VerlMetric):
            self.values.extend(value.values)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError("only scalar tensors can be converted to float")
            value = value.detach().item()
        if not isinstance(value, (int, float, torch.Tensor)):
            raise ValueError(f"unsupported value type {type(value)}")
        self.values.append(value)


def tensor_paths(n: int) -> list[Path]:
    gen = torch.Generator().manual_seed(1)
    scalars = [(NAMES[i % 8], torch.randn((), generator=gen)) for i in range(n)]

    def ours_scalar() -> dict[str, float]:
        m = ms.Metrics()
        record = m.record
        for k, t in scalars:
            record(k, t)
        return m.compute()

    def twin_scalar() -> dict[str, float]:
        d: defaultdict[str, list[float]] = defaultdict(list)
        for k, t in scalars:
            d[k].append(t.item())
        return {k: float(np.mean(vs)) for k, vs in d.items()}

    # 8 ints per record; each name always gets the same 8 (so every side's answer is exact)
    ints = {k: torch.randint(16, 4097, (8,), generator=gen, dtype=torch.int64) for k in NAMES}
    int_lists = {k: t.tolist() for k, t in ints.items()}
    int_records = [(NAMES[i % 8], ints[NAMES[i % 8]]) for i in range(n)]
    list_records = [(NAMES[i % 8], int_lists[NAMES[i % 8]]) for i in range(n)]
    samples = {k: np.tile(np.asarray(v, dtype=np.float64), n // 8) for k, v in int_lists.items()}

    def ours_ints(records: list[tuple[str, Any]]) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            m = ms.Metrics({"actor/*": QUANTILE_SPEC})
            record = m.record
            for k, v in records:
                record(k, v)
            return m.compute()

        return run

    def reduce_ints(d: dict[str, list[int]]) -> dict[str, float]:
        out = {}
        for k, vs in d.items():
            a = np.asarray(vs, dtype=np.float64)
            p50, p99 = np.percentile(a, [50, 99])
            out |= {f"{k}/mean": float(a.mean()), f"{k}/p50": float(p50), f"{k}/p99": float(p99)}
        return out

    def twin_int_tensor() -> dict[str, float]:
        d: defaultdict[str, list[int]] = defaultdict(list)
        for k, t in int_records:
            d[k].extend(t.tolist())
        return reduce_ints(d)

    def twin_int_list() -> dict[str, float]:
        d: defaultdict[str, list[int]] = defaultdict(list)
        for k, v in list_records:
            d[k].extend(v)
        return reduce_ints(d)

    return [
        Path("0-d CPU tensor", ".item() + append", ours_scalar, twin_scalar, n, 3.0, close()),
        Path(
            "8 ints (int64 tensor) -> mean,p50,p99",
            ".tolist() + extend + numpy",
            ours_ints(int_records),
            twin_int_tensor,
            n,
            3.0,
            quantile_check(samples),
        ),
        Path(
            "8 ints (list) -> mean,p50,p99",
            "extend + numpy",
            ours_ints(list_records),
            twin_int_list,
            n,
            3.0,
            quantile_check(samples),
        ),
    ]


def array_paths(n_arrays: int, n_masked: int) -> list[Path]:
    rng = np.random.default_rng(2)
    arrays = {k: rng.normal(size=64) for k in NAMES}
    array_records = [(NAMES[i % 8], arrays[NAMES[i % 8]]) for i in range(n_arrays)]

    def ours_array() -> dict[str, float]:
        m = ms.Metrics()
        record = m.record
        for k, a in array_records:
            record(k, a)
        return m.compute()

    def twin_array() -> dict[str, float]:
        d: defaultdict[str, list[Any]] = defaultdict(list)
        for k, a in array_records:
            d[k].extend(a)
        return {k: float(np.mean(vs)) for k, vs in d.items()}

    gen = torch.Generator().manual_seed(3)
    masked = {}
    for k in NAMES:
        lengths = torch.randint(16, 257, (4,), generator=gen)
        mask = torch.arange(256).unsqueeze(0) < lengths.unsqueeze(1)
        masked[k] = (torch.randn(4, 256, generator=gen), mask)
    masked_records = [(NAMES[i % 8], *masked[NAMES[i % 8]]) for i in range(n_masked)]

    def ours_masked() -> dict[str, float]:
        m = ms.Metrics()
        record = m.record
        for k, t, mask in masked_records:
            record(k, t, mask=mask)
        return m.compute()

    def twin_masked() -> dict[str, float]:
        d: defaultdict[str, list[float]] = defaultdict(list)
        for k, t, mask in masked_records:
            d[k].append(((t * mask).sum() / mask.sum()).item())
        return {k: float(np.mean(vs)) for k, vs in d.items()}

    return [
        Path(
            "numpy array of 64",
            "list.extend + np.mean",
            ours_array,
            twin_array,
            n_arrays,
            3.0,
            close(),
        ),
        Path(
            "masked (4, 256) tensor",
            "(t*m).sum()/m.sum() + .item()",
            ours_masked,
            twin_masked,
            n_masked,
            1.5,
            close(1e-6),  # float32 sums on the twin's side
        ),
    ]


def big_masked_path(n_elements: int) -> Path:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_elements, generator=gen, dtype=torch.float32)
    mask = torch.rand(n_elements, generator=gen) < 0.7
    spec = ms.Spec(("mean", "sum", "count", "min", "max"))

    def twin() -> dict[str, float]:
        kept = torch.where(mask, x, 0.0)
        total = kept.sum(dtype=torch.float64)
        count = mask.sum()
        lo = torch.where(mask, x, float("inf")).min()
        hi = torch.where(mask, x, float("-inf")).max()
        t, c, mn, mx = torch.stack([total, count.double(), lo.double(), hi.double()]).tolist()
        return {"e/mean": t / c, "e/sum": t, "e/count": c, "e/min": mn, "e/max": mx}

    def ours() -> dict[str, float]:
        m = ms.Metrics({"e": spec})
        m.record("e", x, mask=mask)
        return m.compute()

    label = f"masked {n_elements:,}-element tensor"
    return Path(label, "torch's own masked reductions", ours, twin, 1, 3.0, close(1e-6))


# --- timing and report ---------------------------------------------------------


def interleaved_medians(path: Path, repeats: int) -> tuple[float, float]:
    """Median seconds of each side, run alternately (the order flips every repeat)."""
    times: dict[str, list[float]] = {"ours": [], "twin": []}
    sides = {"ours": path.ours, "twin": path.twin}
    for r in range(repeats):
        for side in ("ours", "twin") if r % 2 == 0 else ("twin", "ours"):
            gc.collect()
            start = time.perf_counter()
            sides[side]()
            times[side].append(time.perf_counter() - start)
    return statistics.median(times["ours"]), statistics.median(times["twin"])


def fmt_time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e9:.0f} ns"


def device_op_counts(window: int = 512) -> dict[str, float]:
    """aten ops per ``record()`` on the meta device, per tensor path: the mean over
    ``window`` records that include the fold they trigger."""
    meta = torch.device("meta")
    specs = {"e": ms.Spec("mean"), "a": ms.Spec(("mean", "max", "min")), "len": QUANTILE_SPEC}
    t = torch.zeros(4, 256, device=meta)
    mask = torch.zeros(4, 256, dtype=torch.bool, device=meta)
    scalar = torch.zeros((), device=meta)
    ints = torch.zeros(8, dtype=torch.int64, device=meta)
    cases: dict[str, Callable[[ms.Metrics], None]] = {  # inputs made outside the count
        "0-d tensor (mean)": lambda m: m.record("s", scalar),
        "masked (4, 256) tensor, mean": lambda m: m.record("e", t, mask=mask),
        "masked (4, 256) tensor, (mean, max, min)": lambda m: m.record("a", t, mask=mask),
        "8 ints (int64 tensor), (mean, p50, p99)": lambda m: m.record("len", ints),
    }
    out = {}
    with meta_records():  # meta tensors stand in for an accelerator's
        for label, fn in cases.items():
            m = ms.Metrics(specs)
            for _ in range(REF_LIMIT - window // 2):  # the fold falls inside the window
                fn(m)
            with count_device_ops() as ops:
                for _ in range(window):
                    fn(m)
            out[label] = ops.total() / window
    return out


def device_cpu_cost(repeats: int) -> dict[str, float]:
    """Seconds of CPU per 0-d ``record()`` of a device tensor, medians of interleaved
    repeats of ``REF_LIMIT`` records each (so each repeat holds one fold): on the meta
    device (no kernel runs; the fold's ``torch.stack`` there is torch's Python meta
    kernel, slower than the C++ one a GPU runs), between folds only, and on CPU tensors
    sent down the accelerator path (C++ kernels, tiny data); against a Python float
    record into the same names."""
    from metricsync._record import _convert

    names = [f"s/{i}" for i in range(64)]
    per = REF_LIMIT // len(names)

    def run(values: list[Any]) -> Callable[[], dict[str, float]]:
        m = ms.Metrics({"s/*": ms.Spec("mean")})
        for name, x in zip(names, values):
            m.record(name, x)

        def go() -> dict[str, float]:
            for _ in range(per):
                for name, x in zip(names, values):
                    m.record(name, x)
            return {}

        return go

    out: dict[str, list[float]] = defaultdict(list)
    with meta_records():
        sides = {
            "meta, a fold included": run([torch.zeros((), device="meta") for _ in names]),
            "float": run([1.0 for _ in names]),
        }
        for r in range(repeats):
            for label, fn in sides.items() if r % 2 == 0 else reversed(sides.items()):
                start = time.process_time()
                fn()
                out[label].append(time.process_time() - start)
        scalars = [torch.zeros((), device="meta") for _ in names]
        for _ in range(repeats):  # records only: a fresh Metrics, fewer than the bound
            m = ms.Metrics({"s/*": ms.Spec("mean")})
            for name, x in zip(names, scalars):
                m.record(name, x)
            start = time.process_time()
            for _ in range(per // 2):
                for name, x in zip(names, scalars):
                    m.record(name, x)
            out["meta, between folds"].append((time.process_time() - start) * 2)
    held = _convert.HOST_DEVICE_TYPES
    _convert.HOST_DEVICE_TYPES = frozenset()  # CPU tensors down the accelerator path
    try:
        cpu = run([torch.zeros(()) for _ in names])
        for _ in range(repeats):
            start = time.process_time()
            cpu()
            out["CPU as the accelerator, a fold included"].append(time.process_time() - start)
    finally:
        _convert.HOST_DEVICE_TYPES = held
    return {label: statistics.median(t) / (per * len(names)) for label, t in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repeats (default 9)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply the records per row (default 1)"
    )
    parser.add_argument("--elements", type=int, default=1_000_000, help="the big masked tensor")
    parser.add_argument("--device-only", action="store_true", help="only the device figures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.device_only:
        device_figures(args.repeats)
        return

    def n(base: int) -> int:
        return max(8, int(base * args.scale) // 8 * 8)

    paths = (
        float_paths(n(20_000))
        + tensor_paths(n(400))
        + array_paths(n(2_000), n(400))
        + [big_masked_path(args.elements)]
    )
    print(f"median of {args.repeats} interleaved repeats; per record, final compute() included")
    head = f"{'path':<40} {'records':>7} {'metricsync':>11} {'twin':>11} {'ratio':>7}  target  twin"
    print(head)
    for path in paths:
        path.check(path.ours(), path.twin())
        ours, twin = interleaved_medians(path, args.repeats)
        ratio = ours / twin
        if path.target is None:
            verdict = f"{twin / ours:.2f}x faster" if ratio < 1 else "slower"
        else:
            verdict = f"<={path.target:g}x {'met' if ratio <= path.target else 'MISSED'}"
        print(
            f"{path.label:<40} {path.records:>7,} {fmt_time(ours / path.records):>11}"
            f" {fmt_time(twin / path.records):>11} {ratio:>6.2f}x  {verdict:<13} {path.twin_label}",
            flush=True,
        )
    print()
    device_figures(args.repeats)


def device_figures(repeats: int) -> None:
    """The device rows: ops per record on meta, and CPU per 0-d record."""
    print("aten ops per record() of a device tensor, counted on the meta device,")
    print("amortized over 512 records and the fold among them")
    print("(budgets: 0-d <= 0.1, masked (4, 256) (mean, max, min) <= 1)")
    for label, count in device_op_counts().items():
        print(f"  {label:<42} {count:>7.3f}")
    print("CPU per 0-d record() of a device tensor (budget: <= 2 us on meta, median):")
    for label, seconds in device_cpu_cost(repeats).items():
        print(f"  {label:<42} {fmt_time(seconds):>9}")


if __name__ == "__main__":
    main()
