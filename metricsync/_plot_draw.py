"""Drawing ``metricsync plot``'s figure with matplotlib (an explicit Agg canvas, no pyplot).

One small panel per metric or statistics family, grouped by prefix under a
heading per group; several runs share each panel in distinct colors with one
legend for the figure. A family panel draws the mean (or last) as a line,
the min-max range as a band and quantiles as dashed lines. With smoothing
the raw curve stays, faint, behind the smoothed one. Axes turn logarithmic
on request, or by themselves for positive curves spanning over 3 decades.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._plot_data import Panel, Run, band, ema, envelope, make_panels

__all__ = ["MAX_COLUMNS", "PANEL_INCHES", "PLOT_DPI", "build_figure"]

PANEL_INCHES = (4.0, 3.0)
"""Width and height of one panel; a figure is up to 3 panels wide."""
PLOT_DPI = 100
"""Resolution of the saved PNG: a panel is 400 x 300 pixels."""
MAX_COLUMNS = 3
WIDE_COLUMNS = 5  # for more than 12 panels, so 50 metrics do not make a tall strip
GROUP_INCHES = 0.35  # a group's heading
LEGEND_INCHES = 0.45  # the runs' legend above the panels
BINS = 1000  # downsampling bins per curve: about 2.5 per pixel column
AUTO_LOG_DECADES = 3.0
_MARGINS = (0.7, 0.15, 0.35, 0.45)  # inches around a panel's axes: left, right, top, bottom
_QUANTILE_STYLES = ("--", ":", "-.")


def _imports() -> Any:
    try:
        import matplotlib.figure
        import matplotlib.lines
        import matplotlib.patches
        import matplotlib.ticker
        import matplotlib.transforms
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise ImportError('plotting needs matplotlib: pip install "metricsync[plot]"') from exc
    del FigureCanvasAgg
    return matplotlib


def _curve(
    ax: Any,
    x: np.ndarray,
    y: np.ndarray,
    color: str,
    smooth: float,
    *,
    style: str = "-",
    width: float = 1.3,
    raw_alpha: float = 0.25,
) -> None:
    """One curve, downsampled; with ``smooth`` the EMA over the faint raw curve."""
    marker = "." if x.size <= 50 else None
    if smooth > 0.0 and x.size > 1:
        rx, ry = envelope(x, y, BINS)
        ax.plot(rx, ry, style, color=color, alpha=raw_alpha, linewidth=1.0, zorder=2)
        sx, sy = envelope(x, ema(y, smooth), BINS)
        ax.plot(sx, sy, style, color=color, linewidth=width + 0.3, zorder=3)
    else:
        ex, ey = envelope(x, y, BINS)
        ax.plot(ex, ey, style, color=color, linewidth=width, marker=marker, zorder=3)


def _finite(run: Run, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = run.series[key]
    ok = np.isfinite(y)
    return x[ok], y[ok], x[~ok]


def _draw_panel(
    ax: Any, panel: Panel, runs: Sequence[Run], colors: Sequence[str], smooth: float, logy: bool
) -> None:
    mpl = _imports()
    drawn: list[np.ndarray] = []
    bad: list[np.ndarray] = []
    styles: dict[str, Any] = {}
    fmt = next(
        (run.formats.get(k) for run in runs for k in panel.members.values() if k in run.formats),
        None,
    )
    for run, color in zip(runs, colors):
        members = {stat: key for stat, key in panel.members.items() if key in run.series}
        if not members:
            continue
        if not panel.family:
            x, y, nonfinite = _finite(run, members[""])
            _curve(ax, x, y, color, smooth)
            drawn.append(y)
            bad.append(nonfinite)
            continue
        for stat in ("min", "max"):
            if stat in members:
                bad.append(_finite(run, members[stat])[2])
        if "min" in members and "max" in members:
            (x0, lo, _), (x1, hi, _) = _finite(run, members["min"]), _finite(run, members["max"])
            common, i0, i1 = np.intersect1d(x0, x1, assume_unique=True, return_indices=True)
            bx, blo, bhi = band(common, lo[i0], hi[i1], BINS)
            ax.fill_between(bx, blo, bhi, color=color, alpha=0.18, linewidth=0, zorder=1)
            drawn += [blo, bhi]
            styles["min-max"] = mpl.patches.Patch(color="0.5", alpha=0.35, label="min-max")
        else:
            for stat in ("min", "max"):
                if stat in members:
                    x, y, _ = _finite(run, members[stat])
                    _curve(ax, x, y, color, smooth, style=":", width=1.0)
                    drawn.append(y)
                    styles[stat] = mpl.lines.Line2D([], [], color="0.3", ls=":", label=stat)
        main = next((s for s in ("mean", "last") if s in members), None)
        if main is not None:
            x, y, nonfinite = _finite(run, members[main])
            _curve(ax, x, y, color, smooth)
            drawn.append(y)
            bad.append(nonfinite)
            styles[main] = mpl.lines.Line2D([], [], color="0.3", ls="-", label=main)
        quantiles = sorted((s for s in members if s.startswith("p")), key=lambda s: float(s[1:]))
        for i, stat in enumerate(quantiles):
            style = _QUANTILE_STYLES[i % len(_QUANTILE_STYLES)]
            x, y, nonfinite = _finite(run, members[stat])
            _curve(ax, x, y, color, smooth, style=style, width=1.0)
            drawn.append(y)
            bad.append(nonfinite)
            styles[stat] = mpl.lines.Line2D([], [], color="0.3", ls=style, label=stat)
    if styles and len(styles) > 1:
        ax.legend(handles=list(styles.values()), fontsize=7, loc="best", framealpha=0.6)
    title = panel.title
    bad_x = np.unique(np.concatenate(bad)) if bad else np.empty(0)
    if bad_x.size:
        title += f"  ({bad_x.size} nan/inf)"
        bottom = mpl.transforms.blended_transform_factory(ax.transData, ax.transAxes)
        ax.plot(bad_x, np.zeros(bad_x.size), "|", color="tab:red", transform=bottom, ms=8)
    values = np.concatenate(drawn) if drawn else np.empty(0)
    scale = "linear"
    if values.size and values.min() > 0:
        spread = math.log10(values.max() / values.min()) if values.max() > 0 else 0.0
        if logy or spread > AUTO_LOG_DECADES:
            scale = "log"
    elif values.size and logy:
        title += "  (linear: values <= 0)"
    ax.set_yscale(scale)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(nbins=5, integer=True))
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    if scale == "linear":
        if fmt is not None and fmt.endswith("%"):
            ax.yaxis.set_major_formatter(mpl.ticker.PercentFormatter(xmax=1.0))
        else:
            scalar = mpl.ticker.ScalarFormatter(useOffset=False)
            scalar.set_powerlimits((-3, 5))
            ax.yaxis.set_major_formatter(scalar)
    if not values.size:
        ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)


def _sections(panels: Sequence[Panel], columns: int) -> list[tuple[str, list[Panel]]]:
    """Rows of panels: a prefix group filling at least a row gets its own heading;
    smaller groups share rows (their panels titled with the full name) so no row
    holds a lone panel when others could sit beside it.

    >>> [(h, [p.title for p in ps]) for h, ps in _sections(make_panels(
    ...     ["a/x", "a/y", "b/z", "c/w", "loss"]), 2)]
    [('a/', ['x', 'y']), ('', ['b/z', 'c/w', 'loss'])]
    """
    groups: dict[str, list[Panel]] = {}
    for panel in panels:
        groups.setdefault(panel.group, []).append(panel)
    sections: list[tuple[str, list[Panel]]] = []
    mixed: list[Panel] = []
    for group, members in groups.items():
        if group and len(members) >= max(columns, 2):
            if mixed:
                sections.append(("", mixed))
                mixed = []
            sections.append((f"{group}/", members))
        else:
            mixed.extend(
                Panel(
                    p.group,
                    f"{p.group}/{p.title}" if p.group and p.title != p.group else p.title,
                    p.members,
                )
                for p in members
            )
    if mixed:
        sections.append(("", mixed))
    return sections


def build_figure(
    runs: Sequence[Run], keys: Sequence[str], *, smooth: float = 0.0, logy: bool = False
) -> Any:
    """The matplotlib ``Figure`` of ``keys`` over ``runs`` (attached to an Agg canvas).

    Its size is ``columns x rows`` panels of 400 x 300 pixels (up to 3
    columns, 5 beyond 12 panels), plus a heading per prefix group that fills a row, plus a
    legend band when there are several runs.
    """
    mpl = _imports()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    present = {key for run in runs for key in run.series}
    panels = make_panels([k for k in keys if k in present])
    columns = min(len(panels), MAX_COLUMNS if len(panels) <= 12 else WIDE_COLUMNS)
    sections = _sections(panels, columns)
    rows = [math.ceil(len(members) / columns) for _, members in sections]
    heights = [
        r * PANEL_INCHES[1] + (GROUP_INCHES if heading else 0.0)
        for r, (heading, _) in zip(rows, sections)
    ]
    legend = LEGEND_INCHES if len(runs) > 1 else 0.0
    width, height = PANEL_INCHES[0] * columns, sum(heights) + legend
    # A fixed layout (no constrained layout): panels are all alike, and measuring every
    # tick label of 50 panels would cost more than drawing them.
    figure = mpl.figure.Figure(figsize=(width, height), dpi=PLOT_DPI)
    FigureCanvasAgg(figure)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    left, right, top, bottom = _MARGINS
    y = legend  # inches from the top
    for (heading, members), count in zip(sections, rows):
        if heading:
            figure.text(0.1 / width, 1 - (y + 0.05) / height, heading, fontsize=11, va="top")
            y += GROUP_INCHES
        for index, panel in enumerate(members):
            row, column = divmod(index, columns)
            rect = (
                (column * PANEL_INCHES[0] + left) / width,
                1 - (y + (row + 1) * PANEL_INCHES[1] - bottom) / height,
                (PANEL_INCHES[0] - left - right) / width,
                (PANEL_INCHES[1] - top - bottom) / height,
            )
            _draw_panel(figure.add_axes(rect), panel, runs, colors, smooth, logy)
        y += count * PANEL_INCHES[1]
    if len(runs) > 1:
        handles = [
            mpl.lines.Line2D([], [], color=c, linewidth=2, label=run.label)
            for run, c in zip(runs, colors)
        ]
        figure.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 1.0),
            ncols=min(len(runs), 4),
            fontsize=9,
            frameon=False,
        )
    return figure
