"""bench/record.py's paths on two revisions of metricsync in one process, interleaved.

Run: .venv/bin/python bench/ab_record.py [--base REV] [--repeats R] [--scale S]

Exports the package of ``--base`` (default ``HEAD``) as ``metricsync_base`` (as
``bench/ab.py`` does), loads ``bench/record.py`` once per side, and times each of its
metricsync paths (the final ``compute()`` included) on both sides, alternating which
goes first. A second table times the ``record()`` calls alone (no ``compute()``), per
kind of value (a 0-d tensor on the meta device among them), the more sensitive figure,
and bench/step.py's recording phase;
then the aten ops per device record, which must be equal. Times are CPU time of the
process (``time.process_time``: a machine shared with other work stretches wall time
far more). Each line gives both sides' fastest repeat, their ratio (working tree /
base), and the median of the pairwise ratios.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from ab import export  # bench/ab.py: the base revision as metricsync_base

HERE = Path(__file__).resolve().parent


def load_record(package: str) -> ModuleType:
    """bench/record.py with every ``metricsync`` import naming ``package``."""
    source = (HERE / "record.py").read_text().replace("metricsync", package)
    module = ModuleType(f"record_{package}")
    module.__file__ = str(HERE / "record.py")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def paths(rec: ModuleType, scale: float) -> dict[str, Callable[[], Any]]:
    def n(base: int) -> int:
        return max(8, int(base * scale) // 8 * 8)

    found = (
        rec.float_paths(n(20_000))
        + rec.tensor_paths(n(400))
        + rec.array_paths(n(2_000), n(400))
        + [rec.big_masked_path(1_000_000)]
    )
    out: dict[str, Callable[[], Any]] = {}
    for path in found:
        if path.label.startswith("float: the signature"):
            continue
        out.setdefault(f"{path.label} ({path.records:,})", path.ours)
    return out


def record_only(ms: Any, testing: Any) -> dict[str, Callable[[], float]]:
    """Per kind: seconds per ``record()`` over a fresh ``Metrics`` (first records untimed)."""
    names = [f"m/{i}" for i in range(8)]
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(4, 256, generator=gen)
    mask = torch.arange(256).unsqueeze(0) < torch.tensor([[40], [256], [100], [7]])
    kinds: dict[str, tuple[list[Any], dict[str, Any], int]] = {
        "float": ([float(v) for v in rng.normal(size=64)], {}, 20_000),
        "float, weight=": ([float(v) for v in rng.normal(size=64)], {"weight": 2.0}, 20_000),
        "list of 8 ints": ([[int(v) for v in rng.integers(0, 99, 8)] for _ in range(8)], {}, 4_000),
        "numpy array of 64": ([rng.normal(size=64) for _ in range(8)], {}, 4_000),
        "0-d CPU tensor": ([torch.randn((), generator=gen) for _ in range(64)], {}, 8_000),
        "int64 tensor of 8": ([torch.randint(0, 99, (8,), generator=gen)], {}, 4_000),
        "masked (4, 256) tensor": ([t], {"mask": mask}, 1_000),
    }
    out: dict[str, Callable[[], float]] = {}
    for label, (values, kw, count) in kinds.items():

        def run(values: list[Any] = values, kw: dict[str, Any] = kw, count: int = count) -> float:
            m = ms.Metrics()
            record = m.record
            for name in names:
                record(name, values[0], **kw)
            pairs = [(names[i % 8], values[i % len(values)]) for i in range(count)]
            start = time.process_time()
            for name, v in pairs:
                record(name, v, **kw)
            return (time.process_time() - start) / count

        out[label] = run
    meta = torch.device("meta")
    scalar = torch.zeros((), device=meta)

    def device(count: int = 1_000) -> float:
        with testing.meta_records():
            m = ms.Metrics()
            record = m.record
            for name in names:
                record(name, scalar)
            start = time.process_time()
            for i in range(count):  # under the reference bound: no fold
                record(names[i % 8], scalar)
            return (time.process_time() - start) / count

    out["0-d tensor on meta"] = device
    return out


def step_recording(ms: Any) -> Callable[[], float]:
    """Seconds of bench/step.py's recording phase (an odd rank's step, 8 micro-batches);
    the ``Metrics`` computes and resets after each step, untimed."""
    sys.path.insert(0, str(HERE))
    import step as rl  # bench/step.py: the step's data and specs

    specs = {name: ms.Spec.from_json(spec.to_json()) for name, spec in rl.SPECS.items()}
    data = rl.make_data(1, 8)
    metrics = ms.Metrics(specs)

    def run() -> float:
        start = time.process_time()
        rl.record_step(metrics, data)
        seconds = time.process_time() - start
        metrics.compute()
        metrics.reset()
        return seconds

    return run


def compare(cases: dict[str, dict[str, Callable[[], Any]]], repeats: int, timed: bool) -> None:
    """Both sides of every case, alternately; ``timed``: the case returns its own time."""
    for label, sides in cases.items():
        seen: dict[str, list[float]] = {"base": [], "work": []}
        for r in range(repeats + 1):
            for side in ("base", "work") if r % 2 == 0 else ("work", "base"):
                gc.collect()
                start = time.process_time()
                got = sides[side]()
                seconds = got if timed else time.process_time() - start
                if r:
                    seen[side].append(seconds)
        ratio = statistics.median(w / b for w, b in zip(seen["work"], seen["base"]))
        base, work = min(seen["base"]), min(seen["work"])
        print(
            f"  {label:40s} base {base * 1e6:9.2f} us  work {work * 1e6:9.2f} us"
            f"  mins {work / base:.3f}  median ratio {ratio:.3f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--only", choices=["paths", "records", "device"], default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = export(args.base, Path(tmp))
        import metricsync_base.testing as base_testing  # type: ignore[import-not-found]

        import metricsync as work
        import metricsync.testing as work_testing

        recs = {"base": load_record("metricsync_base"), "work": load_record("metricsync")}
        print(f"base {args.base} against the working tree; medians of {args.repeats} repeats")
        if args.only in (None, "paths"):
            print("bench/record.py paths (whole path, compute() included), per path:")
            by = {side: paths(rec, args.scale) for side, rec in recs.items()}
            compare({k: {s: by[s][k] for s in by} for k in by["work"]}, args.repeats, False)
        if args.only in (None, "records"):
            print("record() calls alone, seconds per record:")
            mods = {"base": (base, base_testing), "work": (work, work_testing)}
            by = {side: record_only(*mods[side]) for side in mods}
            for side, ms in (("base", base), ("work", work)):
                by[side]["bench/step.py recording phase (per step)"] = step_recording(ms)
            compare({k: {s: by[s][k] for s in by} for k in by["work"]}, args.repeats, True)
        if args.only in (None, "device"):
            ops = {side: rec.device_op_counts() for side, rec in recs.items()}
            print("aten ops per device record (meta), base / work:")
            for label in ops["work"]:
                print(f"  {label:44s} {ops['base'][label]:.4f} / {ops['work'][label]:.4f}")
            assert ops["base"] == ops["work"], ops


if __name__ == "__main__":
    main()
