"""The ``metricsync`` command line (also ``python -m metricsync``).

Subcommands ``demo``, ``show``, ``plot``, ``compare`` and ``bench``; a ``RUN`` is a run
directory or a ``.jsonl`` log (metricsync's or verl's). Errors print one line and exit 1, bad
usage exits 2; ``metricsync --help`` lists the options.

>>> import tempfile, pathlib
>>> from metricsync._tracking._tracker import Tracker
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
from collections.abc import Callable
from typing import Any

from .. import __version__
from ._render import render_table
from ._show import FORMATS, compare, show

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


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0.01 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0.01 to 3600 seconds, got {text}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _show(args: argparse.Namespace) -> int:
    return show(
        args.run,
        keys=args.keys,
        last=args.last,
        fmt=args.format,
        transpose=args.transpose,
        ranks=args.ranks,
        follow=args.follow,
        interval=args.interval,
        width=args.width,
    )


def _compare(args: argparse.Namespace) -> int:
    return compare(args.run_a, args.run_b, step=args.step, keys=args.keys, width=args.width)


def _plot(args: argparse.Namespace) -> int:
    from ._plotting import plot_runs

    out = plot_runs(args.runs, args.output, keys=args.keys, smooth=args.smooth, logy=args.logy)
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
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__}", help="print the version"
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
        "--out",
        metavar="DIR",
        default="runs/demo",
        help="run directory (default runs/demo); an earlier demo's log there is replaced",
    )
    demo.set_defaults(run_command=_demo)

    run_help = "a run directory holding metrics.jsonl, or a .jsonl file"
    keys_help = "metrics to include (globs, comma-separated; or one key holding commas)"
    width_help = "wrap tables to N columns (default: the terminal's width; unlimited in a pipe)"
    show = commands.add_parser("show", help="table of logged steps (or CSV, JSON)")
    show.add_argument("run", metavar="RUN", help=run_help)
    show.add_argument("--keys", metavar="GLOB", help=keys_help)
    show.add_argument(
        "--last", metavar="N", type=_count(0), help="only the last N steps (read from the end)"
    )
    show.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default table)"
    )
    show.add_argument(
        "--transpose", action="store_true", help="one row per metric, one column per step"
    )
    show.add_argument(
        "--ranks",
        action="store_true",
        help="straggler view: NAME/max_rank and NAME/min_rank with their values",
    )
    show.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="after the last steps (10 unless --last), print new steps as they come; Ctrl-C stops",
    )
    show.add_argument(
        "--interval", metavar="S", type=_seconds, default=1.0, help="--follow polling period"
    )
    show.add_argument("--width", metavar="N", type=_count(20), help=width_help)
    show.set_defaults(run_command=_show)

    plot = commands.add_parser("plot", help="curves of one or more runs")
    plot.add_argument("runs", metavar="RUN", nargs="+", help=run_help + "; several overlay")
    plot.add_argument("--keys", metavar="GLOB", help=keys_help)
    plot.add_argument(
        "--smooth",
        metavar="A",
        type=_fraction,
        default=0.0,
        help="exponential moving average weight in [0, 1), raw curve drawn faintly behind",
    )
    plot.add_argument(
        "--logy",
        action="store_true",
        help="log scale on y (automatic for positive curves spanning over 3 decades)",
    )
    plot.add_argument("-o", "--output", metavar="OUT.png", required=True, help="PNG to write")
    plot.set_defaults(run_command=_plot)

    comp = commands.add_parser("compare", help="one step of two runs side by side")
    comp.add_argument("run_a", metavar="RUN_A", help=run_help)
    comp.add_argument("run_b", metavar="RUN_B", help=run_help)
    comp.add_argument(
        "--step", metavar="S", type=_integer, help="the step to compare (default: each run's last)"
    )
    comp.add_argument("--keys", metavar="GLOB", help=keys_help)
    comp.add_argument("--width", metavar="N", type=_count(20), help=width_help)
    comp.set_defaults(run_command=_compare)

    bench = commands.add_parser("bench", help="sync cost against the baselines")
    bench.add_argument(
        "--world-size", metavar="N", type=_count(1), default=2, help="ranks (default 2)"
    )
    bench.add_argument(
        "--metrics", metavar="K", type=_count(1), default=100, help="metric names (default 100)"
    )
    bench.set_defaults(run_command=_bench)
    return parser


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "input nested too deeply to read"
    if isinstance(exc, MemoryError):
        return "out of memory"
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or 'no such file'}"
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
    run: Callable[[argparse.Namespace], int] = args.run_command
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = _warning_printer()
            code = run(args)
        sys.stdout.flush()
    except BrokenPipeError:  # `metricsync show ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (OSError, ValueError, ImportError, ArithmeticError, RecursionError, MemoryError) as exc:
        print(f"{PROG}: error: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return code


def _warning_printer() -> Callable[..., None]:
    """A ``warnings.showwarning`` printing each distinct message once, as it is raised,
    as a ``metricsync: warning: ...`` line (so ``show --follow`` shows them as they come)."""
    printed: set[str] = set()

    def show(message: Warning | str, *_: Any, **__: Any) -> None:
        line = f"{PROG}: warning: {' '.join(str(message).split())}"
        if line not in printed:
            printed.add(line)
            print(line, file=sys.stderr, flush=True)

    return show
