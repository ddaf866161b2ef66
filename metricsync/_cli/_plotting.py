"""Curves of JSONL metric logs: ``metricsync plot RUN [RUN ...] -o OUT.png``.

matplotlib is imported only when drawing, on an explicit Agg canvas (headless, no global
backend switch).

>>> import tempfile, pathlib
>>> from metricsync._tracking._tracker import Tracker
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> with Tracker(run_dir=run_dir) as tracker:
...     for step in range(1, 6):
...         tracker.log({"loss": 1.0 / step, "lr": 1e-4 * step}, step)
>>> plot_runs([run_dir], run_dir / "curves.png").stat().st_size > 0
True
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from ._plot_data import load_runs
from ._plot_draw import MAX_COLUMNS, PANEL_INCHES, PLOT_DPI, build_figure

__all__ = ["MAX_COLUMNS", "PANEL_INCHES", "PLOT_DPI", "plot_jsonl", "plot_runs"]


def plot_runs(
    runs: Sequence[str | os.PathLike[str]],
    out_png: str | os.PathLike[str],
    *,
    keys: str | None = None,
    smooth: float = 0.0,
    logy: bool = False,
) -> Path:
    """Plot the metrics matching ``keys`` of one or more runs into ``out_png``; return its path.

    ``runs`` are run directories or .jsonl files (metricsync's or verl's);
    ``keys`` is a glob or comma-separated globs over the union of their keys
    (None: every metric). ``smooth`` in [0, 1) is the EMA weight (0: none);
    ``logy`` puts every axis whose values are all positive on a log scale.
    Each run's steps are those of its timeline, so no line goes backwards
    in step. Raises ``ValueError`` when no metric matches or nothing is
    logged, ``FileNotFoundError`` for a missing log, ``ImportError``
    (naming ``metricsync[plot]``) without matplotlib.

    >>> import tempfile, pathlib, matplotlib.image
    >>> from metricsync._tracking._tracker import Tracker
    >>> run_dir = pathlib.Path(tempfile.mkdtemp())
    >>> with Tracker(run_dir=run_dir) as tracker:
    ...     tracker.log({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, step=1)
    >>> png = plot_runs([run_dir], run_dir / "out.png", keys="a,b,c,d")
    >>> matplotlib.image.imread(png).shape[:2]   # 2 rows x 3 columns of panels
    (600, 1200)
    """
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"expected a smoothing weight in [0, 1), got {smooth}")
    if not runs:
        raise ValueError("expected at least one run to plot")
    from ._plot_draw import _imports

    _imports()  # fail early, before reading, without matplotlib
    loaded, chosen = load_runs(runs, keys)
    for run in loaded:
        if run.repeats:
            warnings.warn(
                f"{run.path}: {run.repeats} record(s) logged again for an earlier or equal step "
                "(a resumed run?); plotting the values logged last",
                UserWarning,
                stacklevel=2,
            )
    figure = build_figure(loaded, chosen, smooth=smooth, logy=logy)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=PLOT_DPI)
    return out


def plot_jsonl(
    path: str | os.PathLike[str], out_png: str | os.PathLike[str], keys: str | None = None
) -> Path:
    """Plot one log (or run directory): :func:`plot_runs` with a single run."""
    return plot_runs([path], out_png, keys=keys)
