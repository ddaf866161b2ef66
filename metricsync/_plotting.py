"""Curves of a JSONL metric log: one small panel per metric, step on x.

matplotlib is imported only here, and drawing goes through an explicit Agg
canvas (no ``pyplot``, no global backend switch), so it works headless and
does not disturb an interactive session.

>>> import tempfile, pathlib
>>> from metricsync._tracker import Tracker
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> with Tracker(run_dir=run_dir) as tracker:
...     for step in range(1, 6):
...         tracker.log({"loss": 1.0 / step, "lr": 1e-4 * step}, step)
>>> plot_jsonl(run_dir / "metrics.jsonl", run_dir / "curves.png").stat().st_size > 0
True
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ._logfile import read_jsonl, resolve_log_path, select_keys

__all__ = ["PANEL_INCHES", "PLOT_DPI", "plot_jsonl"]

PANEL_INCHES = (4.0, 3.0)
"""Width and height of one panel; the figure is ``columns x rows`` panels."""
PLOT_DPI = 100
"""Resolution of the saved PNG: a panel is 400 x 300 pixels."""
MAX_COLUMNS = 3


def plot_jsonl(
    path: str | os.PathLike[str], out_png: str | os.PathLike[str], keys: str | None = None
) -> Path:
    """Plot the metrics of a JSONL log (or run dir) matching ``keys`` into ``out_png``.

        ``keys`` is a glob or comma-separated globs (None: every metric). Panels
        fill a grid of up to 3 columns, each 400 x 300 pixels; NaN and infinite
        values are left out of the curve and marked by red ticks along the bottom,
    with their count in the panel's title. Returns the PNG's path. Raises ``ValueError`` when no
        metric matches or nothing is logged, ``FileNotFoundError`` for a missing
        log, ``ImportError`` (naming ``metricsync[plot]``) without matplotlib.

        >>> import tempfile, pathlib, matplotlib.image
        >>> from metricsync._tracker import Tracker
        >>> run_dir = pathlib.Path(tempfile.mkdtemp())
        >>> with Tracker(run_dir=run_dir) as tracker:
        ...     tracker.log({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, step=1)
        >>> png = plot_jsonl(run_dir, run_dir / "out.png", keys="a,b,c,d")
        >>> matplotlib.image.imread(png).shape[:2]   # 2 rows x 3 columns of panels
        (600, 1200)
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator, PercentFormatter, ScalarFormatter
        from matplotlib.transforms import blended_transform_factory
    except ImportError as exc:
        raise ImportError('plotting needs matplotlib: pip install "metricsync[plot]"') from exc
    file = resolve_log_path(path)
    formats, steps = read_jsonl(file)
    if not steps:
        raise ValueError(f"{file}: no steps logged yet")
    chosen = select_keys(steps, keys)
    columns = min(MAX_COLUMNS, len(chosen))
    rows = math.ceil(len(chosen) / columns)
    figure = Figure(
        figsize=(PANEL_INCHES[0] * columns, PANEL_INCHES[1] * rows),
        dpi=PLOT_DPI,
        layout="constrained",
    )
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, key in enumerate(chosen):
        ax = axes[index // columns][index % columns]
        points = [(step, values[key]) for step, values in steps if key in values]
        finite = [(x, y) for x, y in points if math.isfinite(y)]
        bad = [x for x, y in points if not math.isfinite(y)]
        ax.plot(
            [x for x, _ in finite],
            [y for _, y in finite],
            marker="." if len(finite) <= 50 else None,
            linewidth=1.2,
        )
        title = key if not bad else f"{key}  ({len(bad)} nan/inf)"
        if bad:  # red ticks along the bottom mark steps whose value was not finite
            bottom = blended_transform_factory(ax.transData, ax.transAxes)
            ax.plot(bad, [0.0] * len(bad), "|", color="tab:red", transform=bottom, ms=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
        fmt = formats.get(key)
        if fmt is not None and fmt.endswith("%"):
            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        else:
            scalar = ScalarFormatter(useOffset=False, useMathText=True)
            scalar.set_powerlimits((-3, 5))
            ax.yaxis.set_major_formatter(scalar)
        if not finite:
            ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
    for index in range(len(chosen), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=PLOT_DPI)
    return out
