"""What each kept cache buys: every one switched off in turn, in one process, interleaved.

Run: PYTHONPATH=$PWD .venv/bin/python bench/cache_ablation.py [--rounds 30] [NAME ...]

Each round times, with all caches on and then with each cache replaced by a stub that
keeps nothing, bench/ab.py's cases (the RL step by phase, sync+compute of K=10000
metrics, a record/fold+compute/reset cycle of them) plus a single controller's step
(four workers' K=1000 blobs decoded, merged and computed) and a worker's ``to_bytes``.
Each line gives the median over rounds of the paired ratio (off / on), per quantity.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import ab  # bench/ab.py: the step, sync and cycle cases
import step as rl

import metricsync as ms
from metricsync._cli._benchmark import _specs
from metricsync._record import _store
from metricsync._state import _codec, _sketch, _spec, _tokens

Case = Callable[[], dict[str, float]]


class NoCache:
    """An LRU that keeps nothing."""

    def get(self, key: Any) -> None:
        return None

    def put(self, key: Any, value: Any) -> None:
        return None

    def setdefault(self, key: Any, value: Any) -> Any:
        return value

    def latest(self) -> None:
        return None

    def __len__(self) -> int:
        return 0


CACHES: dict[str, tuple[Any, str]] = {
    "_codec._HEADERS": (_codec, "_HEADERS"),
    "_store._AGREED": (_store, "_AGREED"),
    "_tokens._KEPT": (_tokens, "_KEPT"),
    "_spec._CANONICAL": (_spec, "_CANONICAL"),
    "_tokens._DERIVED": (_tokens, "_DERIVED"),
    "_sketch._layout": (_sketch._layout, "cache"),
}


def controller_case(k: int) -> Case:
    specs = dict(_specs(k))
    specs["t/*"] = ms.Spec("max")
    blobs = []
    for r in range(4):
        m = ms.Metrics(specs)
        for i, name in enumerate(_specs(k)):
            m.record(name, float(i + r))
        m.record(f"t/{r % 2}", 1.0)
        blobs.append(m.to_bytes())
    worker = ms.Metrics(specs)
    for i, name in enumerate(_specs(k)):
        worker.record(name, float(i))

    def run() -> dict[str, float]:
        t0 = time.perf_counter()
        ms.merge([ms.Metrics.from_bytes(b) for b in blobs]).compute()
        t1 = time.perf_counter()
        worker.to_bytes()
        t2 = time.perf_counter()
        return {f"controller K={k}": t1 - t0, f"encode K={k}": t2 - t1}

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("names", nargs="*", help="the caches to switch off (default: all)")
    args = parser.parse_args()
    toggles = {k: v for k, v in CACHES.items() if not args.names or k in args.names}
    with ab.one_rank_group():
        data = rl.make_data(1, 8)
        cases = [
            ab.step_case(ms, data),
            ab.sync_case(ms, 10000, 1),
            ab.cycle_case(ms, 10000),
            controller_case(1000),
        ]
        seen: dict[str | None, list[dict[str, float]]] = {}
        for r in range(args.rounds + 2):
            for name in [None, *toggles]:
                if name is not None:
                    module, attr = toggles[name]
                    saved = getattr(module, attr)
                    setattr(module, attr, NoCache())
                try:
                    got: dict[str, float] = {}
                    for case in cases:
                        for _ in range(2):  # the second call: what a steady program sees
                            got.update(case())
                finally:
                    if name is not None:
                        setattr(module, attr, saved)
                if r >= 2:
                    seen.setdefault(name, []).append(got)
    keys = list(seen[None][0])
    on = seen[None]
    print(f"{'cache off':18s} " + " ".join(f"{k:>21s}" for k in keys))
    medians = [statistics.median(g[k] for g in on) * 1e6 for k in keys]
    print(f"{'(all on, us)':18s} " + " ".join(f"{m:21.0f}" for m in medians))
    for name in toggles:
        row = [statistics.median(a[k] / b[k] for a, b in zip(seen[name], on)) for k in keys]
        print(f"{name:18s} " + " ".join(f"{x:21.3f}" for x in row))


if __name__ == "__main__":
    main()
