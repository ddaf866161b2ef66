"""Tests of metricsync._state._sketch against independent oracles: numpy sorting, a
brute-force weighted quantile, the ddsketch package, and exact cell counts."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsync._state._quantile import query
from metricsync._state._sketch import (
    MAX_BYTES,
    MAX_MAGNITUDE,
    MIN_MAGNITUDE,
    SketchLayout,
    clamped_count,
    held_span,
    ingest_numpy,
    ingest_torch,
    sketch_layout,
)

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0)
SLACK = 1e-9  # relative slack on top of the accuracy, for float64 rounding at bucket edges


def _mixed(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(size=n) * rng.lognormal(0.0, 3.0, size=n)
    x[rng.random(n) < 0.1] = 0.0
    return x


DATASETS = {
    "lognormal": lambda rng: rng.lognormal(0.0, 2.5, size=20_000),
    "uniform": lambda rng: rng.uniform(-50.0, 100.0, size=5_000),
    "exponential": lambda rng: rng.exponential(1e-6, size=100_000),
    "mixed": lambda rng: _mixed(rng, 30_000),
    "tiny": lambda rng: rng.choice([0.0, 1.0, -2.0], size=7),
}


def data(name: str, seed: int = 0) -> np.ndarray:
    return np.asarray(DATASETS[name](np.random.default_rng(seed)), dtype=np.float64)


def close(got: float, want: np.ndarray, a: float) -> bool:
    """``got`` lies within relative error ``a`` of at least one of ``want``."""
    return bool(np.any(np.abs(got - want) <= a * (1 + SLACK) * np.abs(want)))


def assert_rank_accurate(got: np.ndarray, x: np.ndarray, qs: tuple[float, ...], a: float) -> None:
    """Each answer is within ``a`` of the sample of rank floor or ceil of q*(n-1)."""
    s = np.sort(x)
    n = s.size
    for g, q in zip(got, qs, strict=True):
        cands = s[[math.floor(q * (n - 1)), math.ceil(q * (n - 1))]]
        assert close(g, cands, a), f"q={q}: got {g!r}, want within {a} of {cands}"
    assert got[0] == s[0] and got[-1] == s[-1]


def sketch_query(
    layout: SketchLayout,
    x: np.ndarray,
    qs: Sequence[float] = QS,
    w: np.ndarray | None = None,
) -> np.ndarray:
    cells = ingest_numpy(layout, x, w)
    keep = x if w is None else x[w > 0]
    return query(layout, cells[None], qs, np.array([keep.min()]), np.array([keep.max()]))[0]


@pytest.mark.parametrize("name", sorted(DATASETS))
@pytest.mark.parametrize("accuracy", [0.01, 0.02])
def test_quantiles_within_accuracy_of_requested_rank(name: str, accuracy: float) -> None:
    layout = sketch_layout(accuracy)
    x = data(name)
    assert_rank_accurate(sketch_query(layout, x), x, QS, accuracy)


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["lognormal", "uniform", "mixed"]),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.floats(0.0, 1.0), max_size=7),
    order=st.randoms(use_true_random=False),
)
def test_merge_of_any_partition_equals_one_ingest(
    name: str, seed: int, cuts: list[float], order: random.Random
) -> None:
    layout = sketch_layout()
    x = data(name, seed=seed % 4)
    shuffled = np.random.default_rng(seed).permutation(x)
    bounds = sorted(int(c * x.size) for c in cuts)
    parts = [ingest_numpy(layout, p) for p in np.split(shuffled, bounds)]
    order.shuffle(parts)
    merged = np.zeros(layout.n_cells)
    for p in parts:
        merged += p
    np.testing.assert_array_equal(merged, ingest_numpy(layout, x))  # counts add exactly
    got = query(layout, merged, QS, x.min(), x.max())
    assert_rank_accurate(got, x, QS, layout.accuracy)


def brute_weighted(x: np.ndarray, w: np.ndarray, q: float) -> np.ndarray:
    """Samples x_(j) whose cumulative weight first reaches q*W (either side of a tie)."""
    keep = w > 0
    order = np.argsort(x[keep], kind="stable")
    xs, cum = x[keep][order], np.cumsum(w[keep][order])
    target = q * cum[-1]
    lo = np.searchsorted(cum, target * (1 - 1e-9), side="left")
    hi = np.searchsorted(cum, target * (1 + 1e-9), side="left")
    return xs[lo : min(hi, xs.size - 1) + 1]


@pytest.mark.parametrize("name", ["lognormal", "uniform", "mixed", "tiny"])
@pytest.mark.parametrize("seed", [1, 2])
def test_weighted_quantiles_match_brute_force(name: str, seed: int) -> None:
    layout = sketch_layout()
    rng = np.random.default_rng(seed)
    x = data(name, seed)
    w = rng.exponential(1.0, size=x.size)
    w[rng.random(x.size) < 0.2] = 0.0
    w[0] = 1.0
    got = sketch_query(layout, x, w=w)
    for g, q in zip(got[1:-1], QS[1:-1], strict=True):
        want = brute_weighted(x, w, q)
        assert close(g, want, layout.accuracy), (q, g, want)
    assert got[0] == x[w > 0].min() and got[-1] == x[w > 0].max()


def test_integer_weights_equal_repeated_samples() -> None:
    layout = sketch_layout()
    rng = np.random.default_rng(3)
    x = _mixed(rng, 2_000)
    w = rng.integers(0, 4, size=x.size)
    np.testing.assert_array_equal(
        ingest_numpy(layout, x, w.astype(float)), ingest_numpy(layout, np.repeat(x, w))
    )


@pytest.mark.parametrize("name", ["lognormal", "uniform", "mixed"])
def test_agrees_with_ddsketch_package(name: str) -> None:
    ddsketch = pytest.importorskip("ddsketch")
    layout = sketch_layout()
    x = data(name, seed=5)[:5_000]
    reference = ddsketch.DDSketch(relative_accuracy=layout.accuracy)
    for v in x:
        reference.add(float(v))
    theirs = np.array([reference.get_quantile_value(q) for q in QS[1:-1]])
    ours = sketch_query(layout, x, QS[1:-1])
    s, n = np.sort(x), x.size
    for q, o, t in zip(QS[1:-1], ours, theirs, strict=True):
        cands = s[[math.floor(q * (n - 1)), math.ceil(q * (n - 1))]]
        assert close(o, cands, layout.accuracy) and close(t, cands, layout.accuracy)


def test_layout_size_and_range() -> None:
    layout = sketch_layout()
    assert layout.n_cells * 8 <= MAX_BYTES
    assert ingest_numpy(layout, np.ones(3)).nbytes <= MAX_BYTES
    assert sketch_layout(0.02).n_cells < layout.n_cells
    assert sketch_layout(0.01) is layout  # cached
    assert layout.gamma ** (layout.min_index - 1) < MIN_MAGNITUDE
    assert layout.gamma**layout.max_index >= MAX_MAGNITUDE
    edges = np.array([MIN_MAGNITUDE, -MIN_MAGNITUDE, MAX_MAGNITUDE, -MAX_MAGNITUDE, 1.0])
    cells = ingest_numpy(layout, edges)
    assert clamped_count(layout, cells[None])[0] == 0
    for v in edges:
        got = query(layout, ingest_numpy(layout, np.array([v, v])), [0.5], v - 1e-3 * abs(v), v)
        assert close(got[0], np.array([v]), layout.accuracy)


@pytest.mark.parametrize("accuracy", [0.0, 1.0, -0.1, float("nan"), 0.005, 0.009])
def test_unsupported_accuracy_raises(accuracy: float) -> None:
    with pytest.raises(ValueError):
        sketch_layout(accuracy)


def test_finest_suggested_accuracy_fits() -> None:
    with pytest.raises(ValueError, match="use an accuracy >= ") as info:
        sketch_layout(0.005)
    finest = float(str(info.value).rsplit(" ", 1)[-1])
    assert sketch_layout(finest).n_cells * 8 <= MAX_BYTES


def test_clamped_values_are_counted_and_clipped() -> None:
    layout = sketch_layout()
    x = np.array([1e40, -1e40, 1e-40, -1e-40, 5e-324, 1.0, 0.0, -0.0])
    w = np.array([1.0, 2.0, 0.5, 0.25, 1.0, 1.0, 1.0, 1.0])
    assert clamped_count(layout, ingest_numpy(layout, x)[None]).tolist() == [5.0]
    assert clamped_count(layout, ingest_numpy(layout, x, w)).tolist() == 4.75
    assert clamped_count(layout, ingest_numpy(layout, x[5:])[None]).tolist() == [0.0]
    got = query(layout, ingest_numpy(layout, np.array([1e40, 3e40])), [0.5], 1e40, 3e40)
    assert 1e40 <= got[0] <= 3e40
    assert ingest_numpy(layout, x).sum() == x.size + 5  # each sample once, plus the counter


def test_special_values() -> None:
    layout = sketch_layout()
    inf = np.inf
    rows = [
        np.array([1.0, np.nan, 2.0]),
        np.array([1.0, 2.0, inf, inf]),
        np.array([-inf, -inf, 1.0, 2.0]),
        np.array([0.0, 0.0, 0.0]),
        np.array([]),
    ]
    cells = np.stack([ingest_numpy(layout, r) for r in rows])
    vmin = np.array([1.0, 1.0, -inf, 0.0, inf])
    vmax = np.array([2.0, inf, 2.0, 0.0, -inf])
    got = query(layout, cells, [0.0, 0.25, 0.5, 0.9, 1.0], vmin, vmax)
    assert np.isnan(got[0]).all() and np.isnan(got[4]).all()
    assert got[1].tolist()[3:] == [inf, inf] and got[1][0] == 1.0
    assert close(got[1][2], np.array([2.0]), layout.accuracy)  # rank 1 of 4
    assert got[2].tolist()[:3] == [-inf, -inf, -inf] and got[2][4] == 2.0
    assert got[3].tolist() == [0.0] * 5
    # A zero-weight NaN contributes nothing.
    ok = ingest_numpy(layout, np.array([np.nan, 1.0]), np.array([0.0, 1.0]))
    assert query(layout, ok, [0.5], 1.0, 1.0).tolist() == [1.0]


def test_query_is_vectorized_over_rows_and_clips() -> None:
    layout = sketch_layout()
    rows = [data(n, seed=7) for n in ("lognormal", "uniform", "mixed")]
    cells = np.stack([ingest_numpy(layout, r) for r in rows])
    vmin, vmax = np.array([r.min() for r in rows]), np.array([r.max() for r in rows])
    got = query(layout, cells, QS, vmin, vmax)
    assert got.shape == (3, len(QS))
    for i in range(3):
        np.testing.assert_array_equal(got[i], query(layout, cells[i], QS, vmin[i], vmax[i]))
        assert np.all((got[i] >= vmin[i]) & (got[i] <= vmax[i]))
    with pytest.raises(ValueError):
        query(layout, cells, [1.5], vmin, vmax)
    with pytest.raises(ValueError):
        query(layout, cells[:, :-1], [0.5], vmin, vmax)


def _specials(rng: np.random.Generator) -> np.ndarray:
    """Mixed data over several ingest chunks, with special values scattered through it."""
    extra = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e40, -1e40, 1e-40, -5e-324, 1e19, -1e-16]
    return rng.permutation(np.concatenate([_mixed(rng, 150_000), extra]))


def test_numpy_dtypes_shapes_and_inputs_unchanged() -> None:
    layout = sketch_layout()
    rng = np.random.default_rng(12)
    x = _specials(rng)
    x32 = np.clip(x, -1e38, 1e38).astype(np.float32)  # keeps inf and NaN
    before = x32.copy()
    cells = ingest_numpy(layout, x32.reshape(-1, 1))
    np.testing.assert_array_equal(x32, before)
    np.testing.assert_array_equal(cells, ingest_numpy(layout, x32.astype(np.float64)))
    ints = rng.integers(-1000, 1000, size=(30, 40))
    np.testing.assert_array_equal(
        ingest_numpy(layout, ints), ingest_numpy(layout, ints.ravel().astype(float))
    )
    np.testing.assert_array_equal(ingest_numpy(layout, x, 1.0), ingest_numpy(layout, x))
    assert ingest_numpy(layout, np.array([True, False])).sum() == 2
    with pytest.raises(TypeError):
        ingest_numpy(layout, np.array(["a"]))


def test_torch_cells_equal_numpy_cells() -> None:
    layout = sketch_layout()
    rng = np.random.default_rng(11)
    x = _specials(rng)
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(ingest_torch(layout, t).numpy(), ingest_numpy(layout, x))
    w = rng.integers(0, 8, size=x.size) / 4  # dyadic: every sum is exact in any order
    got = ingest_torch(layout, t, torch.from_numpy(w))
    assert got.dtype == torch.float64 and got.shape == (layout.n_cells,)
    np.testing.assert_array_equal(got.numpy(), ingest_numpy(layout, x, w))
    w = rng.random(x.size)
    np.testing.assert_allclose(
        ingest_torch(layout, t, torch.from_numpy(w)).numpy(), ingest_numpy(layout, x, w)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_torch_dtypes_and_shapes(dtype: torch.dtype) -> None:
    layout = sketch_layout()
    t = (torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 100).to(dtype)
    np.testing.assert_array_equal(
        ingest_torch(layout, t).numpy(), ingest_numpy(layout, t.double().numpy())
    )
    w = torch.rand(4, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    np.testing.assert_allclose(
        ingest_torch(layout, t, w).numpy(),
        ingest_numpy(layout, t.double().numpy(), w.numpy()),
    )


def test_torch_meta_device_never_reads_values() -> None:
    layout = sketch_layout()
    for weights in (None, torch.rand(100, device="meta")):
        out = ingest_torch(layout, torch.randn(100, device="meta"), weights)
        assert out.device.type == "meta"
        assert out.shape == (layout.n_cells,) and out.dtype == torch.float64


_ANY_FLOAT = st.floats(allow_nan=False, width=64) | st.sampled_from(
    [0.0, -0.0, 5e-324, -5e-324, 1e-17, 1e20, -1e20, math.inf, -math.inf]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ANY_FLOAT, min_size=1, max_size=20), st.sampled_from([0.01, 0.02, 0.1]))
def test_window_of_the_extremes_holds_the_cell_of_every_sample(
    values: list[float], accuracy: float
) -> None:
    """The window a sync sends (scalar logarithms) covers the cells numpy placed every
    sample in, and stays inside the value-ordered cells."""
    from metricsync._state._quantile import window
    from metricsync._state._sketch import cells_numpy

    layout = sketch_layout(accuracy)
    x = np.array(values)
    lo, hi = window(layout, float(x.min()), float(x.max()))
    cells, _ = cells_numpy(layout, x)
    assert lo >= 0 and hi <= layout.nan_cell
    assert lo <= int(cells.min()) and int(cells.max()) < hi


_SAMPLES = st.lists(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False) | st.sampled_from([0.0, -0.0]),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_SAMPLES, st.booleans()), min_size=1, max_size=12),
    st.lists(st.sampled_from([0.0, 0.001, 0.1, 0.5, 0.9, 0.99, 1.0]), min_size=1, max_size=4),
    st.sampled_from(["linear", "inverted_cdf"]),
)
def test_sketches_answered_one_by_one_equal_the_vectorized_answer(
    groups: list[tuple[list[float], bool]], qs: list[float], method: str
) -> None:
    """``query_sketches`` answers a few sketches with a binary search per quantile and
    many with comparisons over every cell: both give ``query``'s answer, bit for bit
    (weighted or not, up to 8 sketches and past it)."""
    from metricsync._state._quantile import query_sketches

    layout = sketch_layout()
    qs = sorted(set(qs))
    cells, vmin, vmax = [], [], []
    for values, weighted in groups:
        x = np.array(values)
        w = np.linspace(0.5, 2.0, len(x)) if weighted else None
        cells.append(ingest_numpy(layout, x, w))
        vmin.append(x.min())
        vmax.append(x.max())
    lo, hi = np.array(vmin), np.array(vmax)
    got = query_sketches(layout, cells, qs, lo, hi, method)
    want = query(layout, np.stack(cells), qs, lo, hi, method)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([0.0, -0.0, 1.0, 3.5, float("nan"), float("inf")]), min_size=1, max_size=64
    )
)
def test_held_span_is_first_to_last_nonzero_cell(values: list[float]) -> None:
    """The window the encoder sends: from the first cell flatnonzero finds to the last."""
    cells = np.array(values)
    held = np.flatnonzero(cells)
    expect = (int(held[0]), int(held[-1]) + 1 - int(held[0])) if len(held) else (0, 0)
    assert held_span(cells) == expect
