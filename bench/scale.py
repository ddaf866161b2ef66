"""How a steady sync's cost per rank grows with the group: the gather path against the reduce path.

Run: .venv/bin/python bench/scale.py [--metrics 2000] [--quantiles 20] [--real 2 4 8 16]

1. Simulated, W = 2 ... 1,024 in one process: W ranks' real states (8 distinct
   tables, packed with W rank labels) are packed and merged as the gather path does
   on one rank (pack, then merge every rank's row), and one rank's side of the reduce
   path runs its two rounds (pack, keys, sums, assembly) on a loopback that hands
   each buffer back as reduced: the CPU a rank spends, the reduction inside the
   backend aside (a ring all_reduce adds about its payload once per rank).
2. Real gloo ranks (``--real``, default 2 4; 8 and 16 run 16 processes on this
   machine's cores, slowly): each path forced in turn, the wall time and process CPU
   of a steady sync on rank 0, and the bytes it receives.
3. A cost model to 4,096 ranks from the measured sizes and the simulated CPU.

Bytes received: what the collectives hand back (a gather: every rank's state, W x G);
wire: what a rank takes off the network (a gather: (W - 1) x G; a ring all_reduce:
2 (W - 1) / W of its payload).
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np

import metricsync as ms
from metricsync._state._table import StateTable
from metricsync._sync._allreduce import ENV, Reduced, choose, received_bytes, wire_bytes
from metricsync._sync._layout import NO_WINDOW, Layout, Window
from metricsync._sync._reduce import (
    HEADER,
    header,
    merge_ranks,
    pack,
    pack_cells,
    pack_index,
    positions,
    sum_cells,
)
from metricsync.testing import count_collectives, run_distributed


def make_metrics(k: int, q: int, seed: int) -> ms.Metrics:
    """``k`` means and ``q`` quantile metrics, as a trainer's step records them."""
    rng = np.random.default_rng(seed)
    m = ms.Metrics({"q/*": ms.Spec(("mean", "p50", "p90"))})
    for i in range(k):
        m.record(f"loss/{i}", float(rng.normal()))
    for i in range(q):
        m.record(f"q/{i}", rng.normal(5.0, 1.0, size=64))
    return m


def _table(m: ms.Metrics) -> StateTable:
    return m._store.folded()  # a benchmark reads the state it syncs


class _Loopback:
    """A Comm stand-in: every collective hands its buffer back (one rank's CPU only)."""

    def __init__(self, world: int) -> None:
        self.log: list[tuple[str, int]] = []
        self.ctx = SimpleNamespace(rank=0, world=world)  # what Reduced reads of the group

    def all_reduce(self, array: np.ndarray, op: Any, what: str) -> np.ndarray:
        self.log.append(("all_reduce", array.nbytes))
        return array.copy()


def _windows(layout: Layout, tables: list[StateTable]) -> list[Window]:
    """The agreed windows after a first sync of these tables (from their merge)."""
    from metricsync._sync._reduce import widened

    rows = [_pack(t, layout, r, [NO_WINDOW] * len(layout.sketch))[0] for r, t in enumerate(tables)]
    merged = merge_ranks(layout, np.stack(rows)[:, : layout.data_size])
    return widened(layout, [NO_WINDOW] * len(layout.sketch), merged)


def _pack(
    table: StateTable, layout: Layout, rank: int, windows: list[Window]
) -> tuple[np.ndarray, np.ndarray]:
    where = positions(table, layout)
    data = pack(table, layout, where, rank, pack_index(len(table), layout, where))
    return np.concatenate([data, pack_cells(table, layout, where, windows)]), where


def _best(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _gather_once(
    table: StateTable, layout: Layout, windows: list[Window], packed: np.ndarray
) -> None:
    """One rank's gather-path work: pack its state, merge every rank's row."""
    _pack(table, layout, 0, windows)
    merged = merge_ranks(layout, packed[:, : layout.data_size])
    sum_cells(merged, layout, windows, packed[:, layout.data_size :])


def _reduce_once(
    table: StateTable,
    layout: Layout,
    windows: list[Window],
    where: np.ndarray,
    index: tuple[np.ndarray, ...],
    loop: _Loopback,
    world: int,
) -> None:
    """One rank's reduce-path work: pack, round A, round B (the loopback reduces nothing)."""
    loop.log.clear()
    data = pack(table, layout, where, 0, index)
    red = Reduced(loop, layout)  # type: ignore[arg-type]
    head = header(
        magic=1, seq=2, layout=layout.fingerprint, size=len(layout), flags=0, clash=0, tag=0, blob=0
    )
    red.round_a(head, data)
    red.round_b(data, table, where, windows, None, None)


def simulate(k: int, q: int, worlds: list[int], repeats: int) -> tuple[list[dict[str, Any]], Any]:
    """Part 1: the CPU and bytes of one rank's steady sync, per path, for each W."""
    tables = [_table(make_metrics(k, q, seed)) for seed in range(8)]
    layout = Layout(zip(tables[0].names, tables[0].specs))
    windows = _windows(layout, tables)
    g = HEADER + layout.data_size + sum(w.hi - w.lo + 2 for w in windows)
    rows = []
    table0 = tables[0]
    where = positions(table0, layout)
    index = pack_index(len(table0), layout, where)
    for world in worlds:
        packed = np.stack([_pack(tables[r % 8], layout, r, windows)[0] for r in range(world)])
        loop = _Loopback(world)
        gather = partial(_gather_once, tables[0], layout, windows, packed)
        reduce = partial(_reduce_once, table0, layout, windows, where, index, loop, world)
        t_gather, t_reduce = _best(gather, repeats), _best(reduce, repeats)
        n = sum(size for _, size in loop.log)
        rows.append(
            {
                "W": world,
                "gather_received": received_bytes("all_to_all_single", 8 * g, world),
                "gather_wire": wire_bytes("all_to_all_single", 8 * g, world),
                "reduce_received": float(n),
                "reduce_wire": sum(wire_bytes(a, s, world) for a, s in loop.log),
                "gather_ms": t_gather * 1e3,
                "reduce_ms": t_reduce * 1e3,
                "auto": "reduce"
                if choose(world, layout, dict(zip(layout.sketch_entries, windows)))
                else "gather",
            }
        )
    return rows, (g * 8, n)


def _real_rank(rank: int, world: int, k: int, q: int, repeats: int) -> dict[str, Any]:
    m = make_metrics(k, q, rank)
    m.sync()
    out: dict[str, Any] = {}
    for path in ("gather", "reduce"):
        os.environ[ENV] = path
        m.sync()  # steady
        walls, cpus = [], []
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            with count_collectives() as seen:
                m.sync()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        out[path] = {
            "wall_ms": 1e3 * float(np.median(walls)),
            "cpu_ms": 1e3 * float(np.median(cpus)),
            "received": sum(received_bytes(a, s, world) for a, s in seen.log),
            "wire": sum(wire_bytes(a, s, world) for a, s in seen.log),
            "calls": seen.total,
        }
    os.environ.pop(ENV)
    return out


def model(g: int, n: int, sim: list[dict[str, Any]]) -> list[str]:
    """Part 3: bytes, collectives and merge CPU per rank, to 4,096 ranks (CPU: a line
    fitted to the simulated gather merge; the reduce path's, its largest simulated)."""
    ws = np.array([r["W"] for r in sim], dtype=float)
    slope, base = np.polyfit(ws, [r["gather_ms"] for r in sim], 1)
    reduce_ms = max(r["reduce_ms"] for r in sim)
    lines = [
        "| W | gather: received / wire (KB) | reduce: received / wire (KB) | collectives "
        "(gather / reduce) | ring steps (gather / reduce) | merge CPU ms (gather / reduce) |",
        "|---:|---:|---:|---|---|---:|",
    ]
    for world in [2**i for i in range(1, 13)]:
        gw = wire_bytes("all_gather", g, world)
        rw = wire_bytes("all_reduce", n, world)
        steps_g = "1" if world <= 64 else str(world - 1)  # gloo: all-to-all up to 64 ranks
        lines.append(
            f"| {world:,} | {world * g / 1e3:,.0f} / {gw / 1e3:,.0f} | {n / 1e3:,.0f} / "
            f"{rw / 1e3:,.0f} | 1 / 2 | {steps_g} / {4 * (world - 1)} | "
            f"{base + slope * world:,.2f} / {reduce_ms:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=int, default=2000)
    parser.add_argument("--quantiles", type=int, default=20)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2**i for i in range(1, 11)])
    parser.add_argument("--real", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    k, q = args.metrics, args.quantiles
    print(f"{k:,} means and {q} quantile metrics ({k + q:,} metrics)\n")
    sim, (g, n) = simulate(k, q, args.worlds, args.repeats)
    print("simulated in one process (one rank's CPU; bytes per rank, KB):\n")
    print(
        "| W | gather received / wire | reduce received / wire | gather CPU ms | "
        "reduce CPU ms | auto |"
    )
    print("|---:|---:|---:|---:|---:|---|")
    for r in sim:
        print(
            f"| {r['W']:,} | {r['gather_received'] / 1e3:,.1f} / {r['gather_wire'] / 1e3:,.1f} | "
            f"{r['reduce_received'] / 1e3:,.1f} / {r['reduce_wire'] / 1e3:,.1f} | "
            f"{r['gather_ms']:.2f} | {r['reduce_ms']:.2f} | {r['auto']} |"
        )
    if args.real:
        print("\nreal gloo ranks on 127.0.0.1 (rank 0; median of the repeats):\n")
        print(
            "| W | path | collectives | received KB | wire KB | wall ms | CPU ms |\n"
            "|---:|---|---:|---:|---:|---:|---:|"
        )
        for world in args.real:
            repeats = max(3, args.repeats // max(world // 4, 1))
            res = run_distributed(
                _real_rank, world, args=(k, q, repeats), timeout=60.0 + 20.0 * world
            )[0]
            for path in ("gather", "reduce"):
                r = res[path]
                print(
                    f"| {world} | {path} | {r['calls']} | {r['received'] / 1e3:,.1f} | "
                    f"{r['wire'] / 1e3:,.1f} | {r['wall_ms']:.2f} | {r['cpu_ms']:.2f} |",
                    flush=True,
                )
    kb = f"G = {g / 1e3:.1f} KB gathered, N = {n / 1e3:.1f} KB reduced"
    print(f"\ncost model per rank ({kb}; ring steps: a ring all_reduce's, 2 (W - 1) each):\n")
    print("\n".join(model(g, n, sim)))


if __name__ == "__main__":
    main()
