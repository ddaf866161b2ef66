"""The ``metricsync`` command line (also ``python -m metricsync``).

::

    metricsync demo  [--world-size N] [--steps S] [--out DIR]   simulated multi-rank training
    metricsync show  FILE.jsonl [--keys GLOB] [--last N]        table of logged steps
    metricsync plot  FILE.jsonl [--keys GLOB] -o OUT.png        curves, one panel per metric
    metricsync bench [--world-size N] [--metrics K]             sync cost against the baselines

``FILE.jsonl`` may also be a run directory holding ``metrics.jsonl``;
``GLOB`` is an ``fnmatch`` pattern, or several separated by commas. Errors
print one line, ``metricsync: error: ...``, on stderr and exit with 1.

>>> import tempfile, pathlib
>>> from metricsync._tracker import Tracker
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> with Tracker(run_dir=run_dir) as tracker:
...     for step in (1, 2):
...         tracker.log({"loss": 1.0 / step, "lr": 3e-4}, step)
>>> main(["show", str(run_dir / "metrics.jsonl")])
step  loss        lr
----  ----  --------
   1     1  3.00e-04
   2   0.5  3.00e-04
0
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ._formatting import format_value
from ._logfile import read_jsonl, resolve_log_path, select_keys

__all__ = ["build_parser", "main", "render_table"]

PROG = "metricsync"


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def render_table(
    steps: Sequence[tuple[int, dict[str, float]]],
    keys: Sequence[str],
    formats: dict[str, str | None],
) -> str:
    """Steps as rows, metrics as right-aligned columns, under a header and a rule.

    Values use their stored format (adaptive when None); a metric missing at
    a step shows ``-``.

    >>> print(render_table([(1, {"a": 0.5}), (20, {"b": 1e-5})], ["a", "b"], {"a": ".1%"}))
    step      a         b
    ----  -----  --------
       1  50.0%         -
      20      -  1.00e-05
    """
    header = ["step", *keys]
    rows = [
        [str(step)]
        + [format_value(values[k], formats.get(k)) if k in values else "-" for k in keys]
        for step, values in steps
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, ["-" * w for w in widths], *rows]
    ]
    return "\n".join(lines)


def _show(args: argparse.Namespace) -> int:
    formats, steps = read_jsonl(args.file)
    if not steps:
        print(f"{PROG}: {resolve_log_path(args.file)} holds no steps yet", file=sys.stderr)
        return 0
    keys = select_keys(steps, args.keys)
    if args.last is not None:
        steps = steps[len(steps) - args.last :]
    print(render_table(steps, keys, formats))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from ._plotting import plot_jsonl

    out = plot_jsonl(args.file, args.output, keys=args.keys)
    print(f"{PROG}: wrote {out}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from . import _demo

    result = _demo.main(world_size=args.world_size, steps=args.steps, out=args.out)
    return int(result or 0)


def _bench(args: argparse.Namespace) -> int:
    from . import _benchmark

    result = _benchmark.main(world_size=args.world_size, metrics=args.metrics)
    return int(result or 0)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``metricsync`` program.

    >>> build_parser().parse_args(["show", "m.jsonl", "--last", "5"]).last
    5
    """
    parser = argparse.ArgumentParser(
        prog=PROG, description="Inspect metricsync logs, run the demo or the benchmark."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="simulated multi-rank training over gloo")
    demo.add_argument(
        "--world-size", metavar="N", type=_count(1), default=2, help="ranks (default 2)"
    )
    demo.add_argument(
        "--steps", metavar="S", type=_count(1), default=20, help="training steps (default 20)"
    )
    demo.add_argument(
        "--out", metavar="DIR", default="runs/demo", help="run directory (default runs/demo)"
    )
    demo.set_defaults(run=_demo)

    show = commands.add_parser("show", help="table of logged steps")
    show.add_argument("file", metavar="FILE.jsonl", help="a metrics.jsonl (or its run dir)")
    show.add_argument("--keys", metavar="GLOB", help="metrics to show (globs, comma-separated)")
    show.add_argument("--last", metavar="N", type=_count(0), help="only the last N steps")
    show.set_defaults(run=_show)

    plot = commands.add_parser("plot", help="curves, one panel per metric")
    plot.add_argument("file", metavar="FILE.jsonl", help="a metrics.jsonl (or its run dir)")
    plot.add_argument("--keys", metavar="GLOB", help="metrics to plot (globs, comma-separated)")
    plot.add_argument("-o", "--output", metavar="OUT.png", required=True, help="PNG to write")
    plot.set_defaults(run=_plot)

    bench = commands.add_parser("bench", help="sync cost against the baselines")
    bench.add_argument(
        "--world-size", metavar="N", type=_count(1), default=2, help="ranks (default 2)"
    )
    bench.add_argument(
        "--metrics", metavar="K", type=_count(1), default=100, help="metric names (default 100)"
    )
    bench.set_defaults(run=_bench)
    return parser


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        return f"{exc.filename}: no such file"
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the ``metricsync`` program on ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Usage errors exit through argparse (code 2); failures print one
    ``metricsync: error: ...`` line and return 1; warnings (a torn last line)
    print as ``metricsync: warning: ...`` lines.

    >>> main(["show", "/nonexistent/metrics.jsonl"])
    1
    """
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    caught: list[Any] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            code = run(args)
        sys.stdout.flush()
    except BrokenPipeError:  # `metricsync show ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (OSError, ValueError, ImportError) as exc:
        _print_warnings(caught)
        print(f"{PROG}: error: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    _print_warnings(caught)
    return code


def _print_warnings(caught: list[Any]) -> None:
    for warning in caught:
        print(f"{PROG}: warning: {' '.join(str(warning.message).split())}", file=sys.stderr)
