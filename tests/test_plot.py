"""``metricsync plot``: pictures read back, and the numerics behind them against brute force."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from metricsync._cli._plot_data import band, ema, envelope, load_runs, make_panels
from metricsync._cli._plot_draw import BINS, build_figure
from metricsync._cli._plotting import plot_runs
from metricsync._tracking._tracker import Tracker

matplotlib_image = pytest.importorskip("matplotlib.image")


def _log(run_dir: Path, steps: int, seed: int = 0, shift: float = 0.0) -> Path:
    rng = np.random.default_rng(seed)
    with Tracker(run_dir=run_dir) as tracker:
        for step in range(steps):
            lens = rng.integers(10, 300, 32)
            tracker.log(
                {
                    "actor/loss": 1.0 / (1 + step / 50) + shift + 0.2 * rng.normal(),
                    "actor/lr": 1e-3 * 0.97**step,  # 300 steps: 1e-3 down to 1e-7, 4 decades
                    "len/mean": float(lens.mean()),
                    "len/min": float(lens.min()),
                    "len/max": float(lens.max()),
                    "len/p50": float(np.median(lens)),
                    "len/p99": float(np.percentile(lens, 99)),
                    "len/std": float(lens.std()),
                    "score": float(step) - 100.0,
                },
                step,
            )
    return run_dir


def _lines(ax: object) -> list[object]:
    return [line for line in ax.get_lines() if line.get_linestyle() != "None"]  # type: ignore[attr-defined]


def test_panels_group_families_and_prefixes() -> None:
    panels = make_panels(["actor/loss", "actor/lr", "len/mean", "len/min", "len/p99", "len/std"])
    assert [(p.group, p.title, sorted(p.members)) for p in panels] == [
        ("actor", "loss", [""]),
        ("actor", "lr", [""]),
        ("len", "len", ["mean", "min", "p99"]),
        ("len", "std", [""]),
    ]
    # a lone statistic is not a family
    assert make_panels(["x/mean", "y"])[0].members == {"": "x/mean"}


def test_figure_axes_lines_scales_and_png_size(tmp_path: Path) -> None:
    run = _log(tmp_path / "a", 300)
    runs, keys = load_runs([run], None)
    figure = build_figure(runs, keys)
    axes = [ax for ax in figure.get_axes() if ax.get_visible()]
    titles = [ax.get_title() for ax in axes]
    assert titles == ["actor/loss", "actor/lr", "len", "len/std", "score"]
    by_title = dict(zip(titles, axes))
    family = by_title["len"]
    assert len(family.collections) == 1  # the min-max band
    assert len(_lines(family)) == 3  # mean, p50, p99
    assert {line.get_linestyle() for line in _lines(family)} == {"-", "--", "-."}
    assert by_title["actor/lr"].get_yscale() == "log"  # positive, over 3 decades: automatic
    assert by_title["actor/loss"].get_yscale() == "linear"
    assert by_title["score"].get_yscale() == "linear"
    out = plot_runs([run], tmp_path / "x.png")
    # 5 panels, 3 columns; actor/ (2 panels) and len/ (2) share rows with score
    assert matplotlib_image.imread(out).shape[:2] == (600, 1200)
    logged = plot_runs([run], tmp_path / "log.png", keys="actor/*", logy=True)
    assert matplotlib_image.imread(logged).shape[:2] == (335, 800)
    figure = build_figure(runs, ["score", "actor/lr"], logy=True)
    score, lr = figure.get_axes()
    assert lr.get_yscale() == "log"
    assert score.get_yscale() == "linear" and "(linear: values <= 0)" in score.get_title()


def test_smoothing_draws_the_ema_over_the_faint_raw_curve(tmp_path: Path) -> None:
    run = _log(tmp_path / "a", 400)
    runs, _ = load_runs([run], None)
    raw_fig = build_figure(runs, ["actor/loss"])
    smooth_fig = build_figure(runs, ["actor/loss"], smooth=0.9)
    [raw_line] = _lines(raw_fig.get_axes()[0])
    faint, smooth = _lines(smooth_fig.get_axes()[0])
    assert faint.get_alpha() < 0.5 and smooth.get_alpha() in (None, 1.0)
    np.testing.assert_array_equal(faint.get_ydata(), raw_line.get_ydata())
    _, y = runs[0].series["actor/loss"]
    np.testing.assert_allclose(smooth.get_ydata(), ema(y, 0.9))
    assert np.std(np.diff(smooth.get_ydata())) < 0.3 * np.std(np.diff(y))

    # and in the pixels: the smoothed picture differs from the raw one where the curve is
    a = matplotlib_image.imread(plot_runs([run], tmp_path / "raw.png", keys="actor/loss"))
    b = matplotlib_image.imread(
        plot_runs([run], tmp_path / "smooth.png", keys="actor/loss", smooth=0.9)
    )
    assert a.shape == b.shape
    differs = np.abs(a[..., :3] - b[..., :3]).sum(axis=2) > 0.3
    assert differs.mean() > 0.01
    # the smoothed curve's saturated blue sits in fewer rows per column than the raw band
    blue = np.array([0.12, 0.47, 0.71])
    strong = lambda img: (np.abs(img[..., :3] - blue).sum(axis=2) < 0.15).sum()  # noqa: E731
    assert strong(b) < 0.7 * strong(a)


def test_several_runs_share_panels_with_a_legend(tmp_path: Path) -> None:
    a = _log(tmp_path / "exp" / "a", 100, seed=1)
    b = _log(tmp_path / "exp" / "b", 120, seed=2, shift=0.5)
    runs, keys = load_runs([a, b / "metrics.jsonl"], "actor/*,score")
    assert [r.label for r in runs] == ["a", "b"]
    figure = build_figure(runs, keys)
    [legend] = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b"]
    loss = next(ax for ax in figure.get_axes() if ax.get_title() == "actor/loss")
    lines = _lines(loss)
    assert len(lines) == 2 and lines[0].get_color() != lines[1].get_color()
    assert [len(line.get_xdata()) for line in lines] == [100, 120]
    png = plot_runs([a, b], tmp_path / "two.png", keys="actor/*")
    assert matplotlib_image.imread(png).shape[:2] == (380, 800)  # legend band, heading, 1 row


def test_a_resumed_run_never_draws_backwards(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    steps = [*range(0, 50), *range(30, 60), 60, 60]  # a resume from step 30, a repeat at 60
    path.write_text("".join(json.dumps({"step": s, "data": {"x": s * 1.0}}) + "\n" for s in steps))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = plot_runs([path], tmp_path / "x.png")
    assert out.exists() and any("logged again" in str(w.message) for w in caught)
    runs, keys = load_runs([path], None)
    [line] = _lines(build_figure(runs, keys).get_axes()[0])
    x = np.asarray(line.get_xdata())
    assert np.all(np.diff(x) > 0) and x[0] == 0 and x[-1] == 60


def test_envelope_keeps_every_bins_extremes_and_order() -> None:
    rng = np.random.default_rng(3)
    x = np.cumsum(rng.integers(1, 4, 100_000)).astype(float)
    y = rng.normal(size=x.size)
    y[12_345] = 50.0
    ex, ey = envelope(x, y, BINS)
    assert ex.size <= 4 * BINS and np.all(np.diff(ex) > 0)
    which = np.minimum(((x - x[0]) / (x[-1] - x[0]) * BINS).astype(int), BINS - 1)
    kept = np.minimum(((ex - x[0]) / (x[-1] - x[0]) * BINS).astype(int), BINS - 1)
    for b in rng.choice(BINS, 50, replace=False):
        inside = which == b
        assert ey[kept == b].max() == y[inside].max()
        assert ey[kept == b].min() == y[inside].min()
        assert ex[kept == b][0] == x[inside][0] and ex[kept == b][-1] == x[inside][-1]
    assert ey.max() == 50.0
    xs, lo, hi = band(x, y - 1, y + 1, BINS)
    assert xs.size == 2 * BINS and lo.min() == (y - 1).min() and hi.max() == (y + 1).max()


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.9, 0.999])
def test_ema_matches_the_plain_recurrence(weight: float) -> None:
    y = np.random.default_rng(4).normal(size=1000)
    z, want = 0.0, []
    for t, v in enumerate(y):
        z = weight * z + (1 - weight) * v
        want.append(z / (1 - weight ** (t + 1)))
    np.testing.assert_allclose(ema(y, weight), want, rtol=1e-9, atol=1e-12)


def test_100k_steps_draw_from_a_few_thousand_points(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    rng = np.random.default_rng(5)
    values = np.cumsum(rng.normal(size=100_000))
    path.write_text(
        "".join(
            json.dumps({"step": i, "data": {"v": float(v)}}) + "\n" for i, v in enumerate(values)
        )
    )
    runs, keys = load_runs([path], None)
    for smooth in (0.0, 0.95):
        lines = _lines(build_figure(runs, keys, smooth=smooth).get_axes()[0])
        assert all(len(line.get_xdata()) <= 4 * BINS for line in lines)
    [line] = _lines(build_figure(runs, keys).get_axes()[0])
    assert max(line.get_ydata()) == values.max() and min(line.get_ydata()) == values.min()


def test_non_finite_values_are_marked_not_drawn(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        for step in range(10):
            tracker.log({"x": math.nan if step in (3, 7) else float(step)}, step)
    runs, keys = load_runs([tmp_path], None)
    ax = build_figure(runs, keys).get_axes()[0]
    assert ax.get_title() == "x  (2 nan/inf)"
    [curve] = _lines(ax)
    assert list(curve.get_xdata()) == [0, 1, 2, 4, 5, 6, 8, 9]


def _family_log(run_dir: Path, stats: dict[str, float], steps: int = 80) -> Path:
    with Tracker(run_dir=run_dir) as tracker:
        for step in range(steps):
            tracker.log({f"x/{s}": v * (1 + step / steps) for s, v in stats.items()}, step)
    return run_dir


def _style_of(artist: object) -> tuple[object, object]:
    return artist.get_linestyle(), artist.get_marker()  # type: ignore[attr-defined]


def _check_family_styles(tmp: Path, stats: list[str], steps: int = 80, runs: int = 2) -> None:
    """Draw the family ``x/<stat>`` of ``runs`` runs; check the panel's legend and artists."""
    paths = [
        _family_log(tmp / f"run{r}", {s: 1.0 + r + i for i, s in enumerate(stats)}, steps)
        for r in range(runs)
    ]
    loaded, keys = load_runs(paths, None)
    [ax] = build_figure(loaded, keys).get_axes()
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    banded = "min" in stats and "max" in stats
    lined = [s for s in stats if not (banded and s in ("min", "max"))]
    assert sorted(labels) == sorted(lined + (["min-max"] if banded else []))
    handles = {label: h for label, h in zip(labels, legend.legend_handles)}
    keyed = {s: _style_of(handles[s]) for s in lined}
    assert len(set(keyed.values())) == len(lined)  # a reader tells every statistic apart
    colors = [f"C{r}" for r in range(runs)]
    for color in colors:  # each run's lines: one per statistic, styled as its legend entry
        lines = [line for line in _lines(ax) if line.get_color() == color and line.get_gid()]
        assert sorted(line.get_gid() for line in lines) == sorted(lined)
        for line in lines:
            assert _style_of(line) == keyed[line.get_gid()]
    assert {line.get_color() for line in _lines(ax)} == (set(colors) if lined else set())
    if banded:
        assert [c.get_gid() for c in ax.collections] == ["min-max"] * runs


@pytest.mark.parametrize(
    "stats",
    [
        ["mean", "max", "p50", "p99"],  # issue 47: max and p99 were both dotted, alike
        ["max", "p99"],
        ["min", "p1"],
        ["max", "p50", "p90", "p99"],
        ["mean", "last", "min", "p1", "p5", "p25", "p50", "p75", "p95", "p99", "p99.9"],
        ["mean", "min", "max", "p50", "p90"],  # min and max as a band
        ["mean", "last", "min", "max", "p50", "p90", "p99"],
        ["min", "max"],  # before: a band alone had no legend
        ["mean", "last"],
    ],
)
@pytest.mark.parametrize("steps", [80, 30])  # 30: at most 50 points, dotted
def test_every_statistic_of_a_family_has_its_own_style(
    tmp_path: Path, stats: list[str], steps: int
) -> None:
    # before (30 steps): the curves had dots the legend did not show
    _check_family_styles(tmp_path, stats, steps)


_FAMILY = ["mean", "last", "min", "max", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p99"]


@settings(max_examples=25, deadline=None)
@given(
    stats=st.lists(st.sampled_from(_FAMILY), min_size=2, max_size=len(_FAMILY), unique=True),
    steps=st.sampled_from([12, 80]),
    runs=st.integers(1, 2),
)
def test_any_family_draws_each_statistic_as_its_legend_entry_shows(
    stats: list[str], steps: int, runs: int
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _check_family_styles(Path(tmp), stats, steps, runs)


def test_every_subset_of_a_family_gets_distinct_styles() -> None:
    from itertools import combinations

    from metricsync._cli._plot_styles import stat_styles

    pool = [*_FAMILY, "p99.9", "std", "sum", "count"]
    for size in range(1, 5):
        for stats in combinations(pool, size):
            styles = stat_styles(list(stats))
            assert len({(s.linestyle, s.marker) for s in styles.values()}) == len(stats), stats
    styles = stat_styles(pool)
    assert len({(s.linestyle, s.marker) for s in styles.values()}) == len(pool)


@pytest.mark.parametrize(
    "values",
    [
        [1e308, -1e308, 1.0, 2.0],
        [1.7e308, 1.7e308, 1.7e308],
        [-1e308, 5e-324, 3.0],
        [5e-324, 1e300, 1e-300, 2.0],  # positive over 600 decades: a log axis
        [1e300, -1e300, 0.0],  # at the limit: drawn
    ],
)
def test_values_beyond_the_draw_limit_are_marked_not_drawn(
    tmp_path: Path, values: list[float]
) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        for step, value in enumerate(values):
            tracker.log({"x": value, "band/min": -abs(value), "band/max": abs(value)}, step)
    runs, keys = load_runs([tmp_path], None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way
        out = plot_runs([tmp_path], tmp_path / "x.png")  # before: "arange: cannot compute length"
        figure = build_figure(runs, keys)
    assert out.stat().st_size > 0
    kept = [v for v in values if abs(v) <= 1e300]  # the documented limit
    beyond = len(values) - len(kept)
    ax = next(a for a in figure.get_axes() if a.get_title().startswith("x"))
    assert ax.get_title() == ("x" if not beyond else f"x  ({beyond} beyond \u00b11e+300)")
    if kept:
        [curve] = _lines(ax)
        assert list(curve.get_ydata()) == kept
    else:
        assert not _lines(ax) or not len(_lines(ax)[0].get_ydata())


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example([1e308, -1e308], ["y"], False)  # before: "arange: cannot compute length"
@example([5e-324, 1e300, 3.0], ["x/mean", "x/p99"], True)
@given(
    st.lists(st.floats(width=64), min_size=1, max_size=6),
    st.lists(st.sampled_from(["x/mean", "x/min", "x/max", "x/p99", "y"]), min_size=1, max_size=5),
    st.booleans(),
)
def test_any_float64_values_plot_without_error_or_warning(
    tmp_path_factory: pytest.TempPathFactory, values: list[float], keys: list[str], logy: bool
) -> None:
    path = tmp_path_factory.mktemp("any") / "m.jsonl"
    rows = [{"step": i, "data": {k: v for k in keys}} for i, v in enumerate(values)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_runs([path], path.with_suffix(".png"), logy=logy, smooth=0.5)
    assert out.stat().st_size > 0


@pytest.mark.parametrize(
    "values",
    [[5e-324, 1e-322, 2e-323, 1e-321], [5e-324, 5e-324], [1e-321, 1e-321], [1e-310, 1e-300]],
)
def test_a_log_axis_of_subnormal_values_rises_and_holds_every_point(
    tmp_path: Path, values: list[float]
) -> None:
    path = tmp_path / "tiny.jsonl"
    path.write_text(
        "".join(f'{{"step": {s}, "data": {{"tiny": {v!r}}}}}\n' for s, v in enumerate(values))
    )
    runs, _ = load_runs([path], None)
    [ax] = build_figure(runs, ["tiny"], logy=True).get_axes()
    low, high = ax.get_ylim()
    # before: ylim (1e-320, ~1e-321) for the first, inverted: a rising curve drawn falling
    assert ax.get_yscale() == "log" and not ax.yaxis_inverted()
    assert 0.0 < low < high
    [line] = _lines(ax)
    np.testing.assert_array_equal(line.get_ydata(), values)
    assert low <= min(values) and max(values) <= high  # every point inside the axis
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
    assert labels and all(label.startswith("$10^{-3") for label in labels)
    assert plot_runs([path], tmp_path / "tiny.png", logy=True).stat().st_size > 0
