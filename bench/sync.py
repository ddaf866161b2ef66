"""Sync cost against the baselines, for K = 100, 1,000, 10,000 metrics on 2 and 4 gloo ranks.

Run: .venv/bin/python bench/sync.py [--repeats R] [--worlds 2 4] [--metrics 100 1000 10000]

Each configuration runs in its own set of local gloo processes (127.0.0.1);
every approach is timed in the same processes, so the ratios compare like with
like: metricsync's sync + compute, OLMo-core's ``reduce_metrics`` (replicated),
the floor (metricsync's own collectives on buffers packed in advance) and the floor
plus building a dict of K floats (the least a sync of these bytes that returns
``compute()``'s dict costs),
``all_gather_object`` and one ``all_reduce`` per metric; then syncs whose
layout changed, bytes per sync and per quantile metric, and the CPU a call costs
every rank's process together (on fewer cores than ranks, a call takes at least that
over the cores). See
``metricsync/_cli/_benchmark.py`` for what each approach does.
"""

from __future__ import annotations

import argparse
import sys

from metricsync._cli._benchmark import format_rows, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--metrics", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args()
    rows = []
    for world in args.worlds:
        for k in args.metrics:
            row = run(
                world_size=world, metrics=k, repeats=args.repeats, progress=sys.stderr.isatty()
            )[0]
            rows += [row]
            print(
                f"{world} ranks, K={k:,}: sync+compute {row['t_metricsync'] * 1e3:.2f} ms,"
                f" {row['t_metricsync'] / row['t_olmo_core']:.2f}x olmo_core,"
                f" {row['t_metricsync'] / row['t_floor']:.2f}x the floor"
                f" (the floor plus compute()'s dict alone: {row['t_floor_dict'] / row['t_floor']:.2f}x);"
                f" after a record {row['t_after_record'] * 1e3:.2f} ms,"
                f" {row['t_after_record'] / row['t_olmo_core']:.2f}x olmo_core;"
                f" changed layout {row['t_changed'] / row['t_steady_recorded']:.1f}x",
                flush=True,
            )
    print()
    print(format_rows(rows))


if __name__ == "__main__":
    main()
