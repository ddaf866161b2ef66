"""Drawing ``metricsync plot``'s figure with matplotlib (an explicit Agg canvas, no pyplot).

One small panel per metric or statistics family, grouped by prefix; runs differ by color,
statistics by line style and marker (:mod:`metricsync._cli._plot_styles`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._plot_data import Panel, Run, band, ema, envelope, make_panels
from ._plot_styles import MARKS, Style, stat_order, stat_styles

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
DRAW_LIMIT = 1e300
"""Values beyond +-1e300 are marked as not drawn, like NaN: an axis spanning them overflows."""
TITLE_CHARS = 60  # a longer panel title is cut in its middle
_LONE = Style("-", None)  # a panel of one metric
DOTTED_POINTS = 50
"""A curve of at most this many points, of a style with no marker, has a dot on each."""


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
    style: Style = _LONE,
    width: float = 1.3,
    raw_alpha: float = 0.25,
    gid: str | None = None,
) -> Any:
    """One curve, downsampled; with ``smooth`` the EMA over the faint raw curve. Returns
    the marker drawn (what the panel's legend shows).

    The style's marker sits on about :data:`~metricsync._cli._plot_styles.MARKS`
    points spread along the curve; a curve of at most :data:`DOTTED_POINTS`
    points without one marks each point with a dot.
    """
    marker = style.marker if style.marker is not None else "." if x.size <= DOTTED_POINTS else None

    def marks(points: int) -> dict[str, Any]:
        if style.marker is None:
            return {"marker": marker}
        return {"marker": marker, "markevery": max(1, points // MARKS), "ms": 4}

    if smooth > 0.0 and x.size > 1:
        rx, ry = envelope(x, y, BINS)
        ax.plot(rx, ry, color=color, ls=style.linestyle, alpha=raw_alpha, linewidth=1.0, zorder=2)
        sx, sy = envelope(x, ema(y, smooth), BINS)
        ax.plot(
            sx,
            sy,
            color=color,
            ls=style.linestyle,
            linewidth=width + 0.3,
            zorder=3,
            gid=gid,
            **marks(sx.size),
        )
    else:
        ex, ey = envelope(x, y, BINS)
        ax.plot(
            ex,
            ey,
            color=color,
            ls=style.linestyle,
            linewidth=width,
            zorder=3,
            gid=gid,
            **marks(ex.size),
        )
    return marker


class _Points:
    """One curve's points split into those drawn and the steps of those that cannot be."""

    def __init__(self, run: Run, key: str) -> None:
        x, y = run.series[key]
        with np.errstate(invalid="ignore"):
            ok = np.abs(y) <= DRAW_LIMIT  # False for NaN
        finite = np.isfinite(y)
        self.x, self.y = x[ok], y[ok]
        self.nonfinite = x[~finite]
        self.huge = x[finite & ~ok]


def _title_text(text: str) -> str:
    """``text`` cut in its middle to :data:`TITLE_CHARS` characters."""
    if len(text) <= TITLE_CHARS:
        return text
    head = TITLE_CHARS * 2 // 3
    return text[:head] + "\u2026" + text[len(text) - (TITLE_CHARS - head - 1) :]


_LOG_TINIEST = math.log10(5e-324)  # the smallest positive float64 (subnormal)


def _set_log_scale(ax: Any, values: np.ndarray) -> None:
    """A log y axis; near the ends of float64 its limits and ticks are set here, as
    matplotlib's own (5% margins, ticks a stride beyond the data) would pass 1e308."""
    mpl = _imports()
    low, high = math.log10(values.min()), math.log10(values.max())
    pad = 0.05 * (high - low)
    if low - pad >= -300 and high + pad <= 300:
        ax.set_yscale("log")
        return
    bottom = max(low - pad, _LOG_TINIEST)
    top = max(min(high + pad, 307.0), bottom + 1.0)  # a decade at least, never inverted
    limits = max(10**bottom, 5e-324), 10**top
    ax.set_ylim(*limits)  # no autoscaling (which would pass 1e308)
    ax.set_yscale("log")
    ax.set_ylim(*limits)  # again: a linear axis took limits below 1e-287 as (-0.05, 0.05)
    first, last = math.ceil(bottom), math.floor(top)
    stride = max(1, math.ceil((last - first) / 5))
    ticks = 10.0 ** np.arange(first, last + 1, stride, dtype=np.float64)
    ax.yaxis.set_major_locator(mpl.ticker.FixedLocator(ticks))
    ax.yaxis.set_minor_locator(mpl.ticker.NullLocator())
    ax.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(_decade_label))  # subnormals too


def _decade_label(value: float, _: object = None) -> str:
    """The label of the tick at the decade ``value``.

    >>> _decade_label(1e-323), _decade_label(1e300)
    ('$10^{-323}$', '$10^{300}$')
    """
    return f"$10^{{{round(math.log10(value))}}}$"


def _draw_panel(
    ax: Any, panel: Panel, runs: Sequence[Run], colors: Sequence[str], smooth: float, logy: bool
) -> None:
    mpl = _imports()
    drawn: list[np.ndarray] = []
    nonfinite: list[np.ndarray] = []
    huge: list[np.ndarray] = []
    handles: dict[str, Any] = {}
    markers: dict[str, set[Any]] = {}  # each statistic's markers as drawn, over the runs
    fmt = next(
        (run.formats.get(k) for run in runs for k in panel.members.values() if k in run.formats),
        None,
    )
    styles = stat_styles(list(panel.members))
    for run, color in zip(runs, colors):
        members = {stat: key for stat, key in panel.members.items() if key in run.series}
        if not members:
            continue
        points = {stat: _Points(run, key) for stat, key in members.items()}
        for p in points.values():
            nonfinite.append(p.nonfinite)
            huge.append(p.huge)
        if not panel.family:
            p = points[""]
            _curve(ax, p.x, p.y, color, smooth, gid="")
            drawn.append(p.y)
            continue
        banded = "min" in points and "max" in points
        if banded:
            low, high = points["min"], points["max"]
            common, i0, i1 = np.intersect1d(low.x, high.x, assume_unique=True, return_indices=True)
            bx, blo, bhi = band(common, low.y[i0], high.y[i1], BINS)
            ax.fill_between(
                bx, blo, bhi, color=color, alpha=0.18, linewidth=0, zorder=1, gid="min-max"
            )
            drawn += [blo, bhi]
            handles["min-max"] = mpl.patches.Patch(color="0.5", alpha=0.35, label="min-max")
        for stat in stat_order(list(points)):
            if banded and stat in ("min", "max"):
                continue
            p, style = points[stat], styles[stat]
            main = stat in ("mean", "last")
            marker = _curve(
                ax, p.x, p.y, color, smooth, style=style, width=1.3 if main else 1.0, gid=stat
            )
            markers.setdefault(stat, set()).add(marker)
            drawn.append(p.y)
    for stat, seen in markers.items():  # dots in the legend only where every run has them
        style = styles[stat]
        marker = seen.pop() if len(seen) == 1 else style.marker
        handles[stat] = mpl.lines.Line2D(
            [], [], color="0.3", ls=style.linestyle, marker=marker, ms=4, label=stat
        )
    if panel.family and handles:  # a band alone is named too
        band_first = ["min-max"] if "min-max" in handles else []
        order = band_first + stat_order([s for s in handles if s != "min-max"])
        ax.legend(
            handles=[handles[s] for s in order],
            fontsize=7,
            loc="best",
            framealpha=0.6,
            handlelength=3.0,
        )
    title = _title_text(panel.title)
    nonfinite_x = np.unique(np.concatenate(nonfinite)) if nonfinite else np.empty(0)
    huge_x = np.unique(np.concatenate(huge)) if huge else np.empty(0)
    notes = [f"{nonfinite_x.size} nan/inf"] if nonfinite_x.size else []
    notes += [f"{huge_x.size} beyond \u00b1{DRAW_LIMIT:.0e}"] if huge_x.size else []
    if notes:
        title += f"  ({', '.join(notes)})"
        bottom = mpl.transforms.blended_transform_factory(ax.transData, ax.transAxes)
        bad_x = np.union1d(nonfinite_x, huge_x)
        ax.plot(bad_x, np.zeros(bad_x.size), "|", color="tab:red", transform=bottom, ms=8)
    values = np.concatenate(drawn) if drawn else np.empty(0)
    scale = "linear"
    if values.size and values.min() > 0:
        spread = math.log10(values.max()) - math.log10(values.min())
        if logy or spread > AUTO_LOG_DECADES:
            scale = "log"
    elif values.size and logy:
        title += "  (linear: values <= 0)"
    if scale == "log":
        _set_log_scale(ax, values)
    else:
        ax.set_yscale(scale)
    ax.set_title(title, fontsize=10, parse_math=False)
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
            figure.text(
                0.1 / width,
                1 - (y + 0.05) / height,
                _title_text(heading),
                fontsize=11,
                va="top",
                parse_math=False,
            )
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
            mpl.lines.Line2D([], [], color=c, linewidth=2, label=_title_text(run.label))
            for run, c in zip(runs, colors)
        ]
        legend = figure.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, 1.0),
            ncols=min(len(runs), 4),
            fontsize=9,
            frameon=False,
        )
        for text in legend.get_texts():
            text.set_parse_math(False)  # a "$" in a run's name is text, not TeX
    return figure
