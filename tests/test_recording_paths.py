"""Every recording path gives the same statistics, and numpy's over the raw samples.

The paths: Python numbers (the lock-free buffers), small arrays (buffered),
large arrays (reduced when recorded; under a mask alone, up to 4,096 kept samples
are buffered), CPU tensors (numpy views, ``float()`` for 0-d) and the accelerator
path (CPU treated as an accelerator: a device buffer folded by segment reductions). Hypothesis draws the samples, weights,
masks, NaN and the spec, including ``ddof``, quantiles and NaN policies. Samples are floats,
or integers of int8, uint8 or int64 over their whole range (a reduction in their own
dtype wraps).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from _compare import same
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import metricsync as ms
from metricsync._record._store import Store

torch = pytest.importorskip("torch")

PLAIN = ("mean", "sum", "count", "min", "max", "var", "std", "last")
FINITE = st.floats(-1e6, 1e6, allow_nan=False, width=32)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw: st.DrawFn) -> tuple[ms.Spec, list[tuple[np.ndarray, np.ndarray | None, bool]]]:
    nan = draw(st.sampled_from(["propagate", "ignore"]))
    stats = tuple(draw(st.sets(st.sampled_from((*PLAIN, "p50", "p90")), min_size=1, max_size=4)))
    spec = ms.Spec(stats, nan=nan, ddof=draw(st.sampled_from([0, 1])))
    records = []
    for _ in range(draw(st.integers(1, 5))):
        # small arrays are buffered, big ones reduced when recorded; a mask alone keeps its
        # samples buffered up to 4,096 of them (huge: 60% of 4,000-9,000 straddles that)
        size = draw(st.sampled_from([(1, 12), (300, 600), (4000, 9000)]))
        n = draw(st.integers(*size))
        seed = draw(st.integers(0, 2**31))
        rng = np.random.default_rng(seed)
        # integers over their whole range: a reduction in the samples' own dtype wraps
        dtype = draw(st.sampled_from(["float64", "float64", "float32", "int8", "uint8", "int64"]))
        if dtype.startswith("float"):
            x = rng.normal(10.0, 3.0, size=n).astype(dtype)
        else:
            info = np.iinfo(dtype)
            x = rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)
        if nan == "ignore" and dtype.startswith("float") and draw(st.booleans()):
            x[rng.integers(0, n)] = math.nan
        kind = draw(st.sampled_from(["none", "weight", "mask"]))
        w = None
        if kind == "weight":
            w = rng.integers(0, 4, size=n).astype(np.float64)
        elif kind == "mask":
            w = rng.random(n) < 0.6
        records.append((x, w, kind == "mask"))
    return spec, records


def _record(m: ms.Metrics, path: str, x: np.ndarray, w: np.ndarray | None, is_mask: bool) -> None:
    kw: dict[str, Any] = {}
    if w is not None:
        kw = {"mask": w} if is_mask else {"weight": w}
    if path == "numbers":
        for i, v in enumerate(x.tolist()):
            if w is None:
                m.record("v", v)
            elif is_mask:
                if w[i]:
                    m.record("v", v)
            else:
                m.record("v", v, weight=float(w[i]))
    elif path == "numpy":
        m.record("v", x, **kw)
    else:  # "tensor" and "device": torch tensors (CPU), the device path differs by a hook
        tw = {k: torch.from_numpy(np.asarray(v)) for k, v in kw.items()}
        m.record("v", torch.from_numpy(x), **tw)


def _oracle(
    spec: ms.Spec, records: list[tuple[np.ndarray, np.ndarray | None, bool]]
) -> dict[str, float]:
    xs = np.concatenate([x.astype(np.float64) for x, _, _ in records])
    ws = np.concatenate(
        [np.ones(len(x)) if w is None else w.astype(np.float64) for x, w, _ in records]
    )
    dropped = 0.0
    if spec.nan == "ignore":
        bad = ~np.isfinite(xs) & (ws > 0)
        dropped = float(bad.sum())
        ws = np.where(bad, 0.0, ws)
    keep = ws > 0
    x, w = xs[keep], ws[keep]
    out: dict[str, float] = {}
    if not len(x):
        return {"v/nan_dropped": dropped} if spec.nan == "ignore" and dropped else {}
    mean = float(np.sum(w * x) / np.sum(w))
    dof = np.sum(w) - spec.ddof * np.sum(w * w) / np.sum(w)  # reliability weights
    var = float(np.sum(w * (x - mean) ** 2) / dof) if dof > 0 else math.nan
    values = {
        "mean": mean, "sum": float(np.sum(w * x)), "count": float(np.sum(w)),
        "min": float(x.min()), "max": float(x.max()), "var": var,
        "std": math.sqrt(var) if not math.isnan(var) else math.nan, "last": float(x[-1]),
    }  # fmt: skip
    keys = spec.output_keys("v")
    for key, stat in zip(keys, spec.reduce):
        out[key] = values.get(stat, math.nan)
    if spec.nan == "ignore":
        out["v/nan_dropped"] = dropped
    return out


@SETTINGS
@given(cases())
def test_every_path_agrees_with_the_others_and_with_numpy(
    case: tuple[ms.Spec, list[tuple[np.ndarray, np.ndarray | None, bool]]],
) -> None:
    spec, records = case
    results = {}
    for path in ("numbers", "numpy", "tensor", "device"):
        with pytest.MonkeyPatch.context() as mp:
            if path == "device":
                mp.setattr("metricsync._record._convert.HOST_DEVICE_TYPES", frozenset())
            m = ms.Metrics({"v": spec})
            for x, w, is_mask in records:
                _record(m, path, x, w, is_mask)
            results[path] = m.compute()
    want = _oracle(spec, records)
    for path, got in results.items():
        assert got.keys() == want.keys(), (path, got, want)
        for key, value in got.items():
            stat = key.rsplit("/", 1)[-1] if "/" in key else spec.reduce[0]
            if stat in ("p50", "p90"):
                continue  # checked against numpy in test_quantile_metrics; here: paths agree
            assert same(value, want[key], rel=1e-9, abs=1e-9), (path, key, value, want[key])
        for key, value in got.items():  # and every path agrees with the first, quantiles too
            assert same(value, results["numpy"][key], rel=1e-9, abs=1e-9), (path, key, value)


def test_masked_cpu_tensors_agree_with_numpy_whatever_their_form() -> None:
    """Large float CPU tensors under a boolean mask (reduced where recorded, past the
    general path's conversion) give numpy's statistics in every form: float32, views,
    autograd, negative views, 0/1 masks, half precisions; a mask of another shape raises,
    recording nothing."""
    rng = np.random.default_rng(7)
    spec = ms.Spec(("mean", "max", "min", "count"), nan="ignore")
    m = ms.Metrics({"v": spec})
    m.record("v", 1.0)  # the name's buffer is open: later masked tensors take the short path
    xs, ws = [np.array([1.0])], [np.array([True])]
    base = torch.from_numpy(rng.normal(3.0, 2.0, size=(24, 40)).astype(np.float32))
    base[0, 0] = math.nan
    mask = torch.from_numpy(rng.random((24, 40)) < 0.7)
    grad = base.clone().requires_grad_(True)
    forms = [
        (base, mask),
        (base.double(), mask),
        (base.t(), mask.t()),  # non-contiguous views
        (grad * 1.0, mask),  # autograd
        (base.neg().conj(), mask),  # a plain neg: no lazy bit on real tensors
        (torch.neg(base)._neg_view() if hasattr(base, "_neg_view") else -base, mask),
        (base, mask.to(torch.float32)),  # a 0/1 numeric mask takes the general path
        (base.half(), mask),  # half and bfloat16 take the general path too
        (base.bfloat16(), mask),
    ]
    for x, mk in forms:
        m.record("v", x, mask=mk)
        xs.append(x.detach().resolve_neg().double().numpy().reshape(-1))  # as recorded
        ws.append(mk.numpy().reshape(-1) != 0)
    with pytest.raises(ValueError, match="mask has shape"):
        m.record("v", base, mask=mask[:, :10])
    x = np.concatenate(xs)[np.concatenate(ws)]
    dropped = int(np.count_nonzero(np.isnan(x)))
    x = x[~np.isnan(x)]
    got = m.compute()
    assert got["v/count"] == len(x) and got["v/nan_dropped"] == dropped
    assert got["v/max"] == x.max() and got["v/min"] == x.min()
    assert same(got["v/mean"], float(x.mean()), rel=1e-12, abs=1e-12)


def test_names_added_between_observations_fold_with_the_right_slots() -> None:
    # compute() reads the number buffers in the order of their names; names added (and
    # one whose spec changes, which moves its buffer to the end) extend what it read
    # before. Each wave's results are checked against numpy over every sample so far.
    rng = np.random.default_rng(11)
    m = ms.Metrics({"late/*": ms.Spec(("mean", "last"))})  # "lazy" starts as a mean
    samples: dict[str, list[float]] = {}
    for wave in range(6):
        fresh = [f"w{wave}/{i}" for i in range(3)] + [f"late/{wave}"]
        if wave == 0:
            fresh.append("lazy")
        if wave == 3:
            m.reset()
            samples.clear()
            m.define("lazy", ms.Spec("sum"))  # empty now: its buffer is dropped and reopened
        for name in [*samples, *fresh]:
            for value in rng.normal(size=2).tolist():
                m.record(name, value)
                samples.setdefault(name, []).append(value)
        for name in samples:  # an array after the numbers: `last` orders them by time
            if name.startswith("late/") and wave % 2:
                value = float(rng.normal())
                m.record(name, np.array([value]))
                samples[name].append(value)
        got = m.compute()
        for name, values in samples.items():
            if name.startswith("late/"):
                assert got[f"{name}/mean"] == pytest.approx(np.mean(values))
                assert got[f"{name}/last"] == values[-1]
            elif name == "lazy":
                want = np.sum(values) if wave >= 3 else np.mean(values)
                assert got[name] == pytest.approx(want)
            else:
                assert got[name] == pytest.approx(np.mean(values))


def test_a_masked_array_keeps_its_samples_buffered_up_to_the_masked_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mask alone on the general path (a numpy array, a name's first tensor) buffers the
    kept samples as a masked CPU tensor's later records do; more than 4,096 are reduced
    when recorded. Counted: the reductions made on arrival."""
    import metricsync._record._store as store

    reduced: list[int] = []
    original = store.reduce_record
    monkeypatch.setattr(
        store, "reduce_record", lambda x, *a: reduced.append(len(x)) or original(x, *a)
    )
    x = np.arange(10_000.0)
    m = ms.Metrics({"v": ms.Spec(("mean", "max", "p50"))})
    # the name's first record (a tensor), then a numpy array: 450 and 334 kept, buffered
    m.record("v", torch.from_numpy(x[:900]), mask=torch.from_numpy(x[:900] % 2 == 0))
    m.record("v", x[:1000], mask=x[:1000] % 3 == 0)
    assert reduced == []
    m.record("v", x, mask=x % 2 == 0)  # 5,000 kept: reduced now
    assert reduced == [5000]
    kept = np.concatenate([x[:900][x[:900] % 2 == 0], x[:1000][x[:1000] % 3 == 0], x[::2]])
    got = m.compute()
    assert got["v/mean"] == pytest.approx(kept.mean(), rel=1e-12)
    assert got["v/max"] == kept.max()


FORMS = ["number", "list", "numpy", "ints", "tensor", "0-d", "masked"]


@SETTINGS
@given(
    st.lists(
        st.tuples(st.sampled_from(FORMS), st.integers(1, 80), st.integers(0, 2**31)), max_size=12
    ),
    st.sampled_from([("mean", "min", "max", "count"), ("sum", "std", "p50"), ("mean", "last")]),
)
@example([("list", 65, 0), ("number", 1, 0)], ("mean", "min", "max", "count"))
def test_every_host_form_under_one_name_agrees_with_numpy_and_folds_as_few_runs(
    records: list[tuple[str, int, int]], stats: tuple[str, ...]
) -> None:
    """Numbers, lists, small numpy arrays (floats and ints), CPU tensors, 0-d tensors and
    masked tensors mixed under one name, the first record of any form: numpy's statistics
    over the samples, and, but for a ``last`` metric (whose buffer takes numbers only), one
    run a fold for every record of at most 64 samples and one for the larger arrays."""
    import metricsync._record._store as store

    spec = ms.Spec(stats)
    m = ms.Metrics({"v": spec})
    runs: list[int] = []
    original = store.fold

    def counting(batch: Any, *args: Any) -> Any:
        runs.append(len(batch.slot))
        return original(batch, *args)

    kept: list[np.ndarray] = []
    for form, n, seed in records:
        x = np.random.default_rng(seed).normal(5.0, 2.0, size=n)
        if form == "number":
            x = x[:1]
            m.record("v", float(x[0]))
        elif form == "list":
            m.record("v", x.tolist())
        elif form == "ints":
            x = np.round(x * 10).astype(np.int64)
            m.record("v", x)
        elif form == "numpy":
            m.record("v", x)
        elif form == "tensor":
            m.record("v", torch.from_numpy(x))
        elif form == "0-d":
            x = x[:1]
            m.record("v", torch.tensor(x[0]))
        else:
            mask = np.arange(n) % 3 != 0
            m.record("v", torch.from_numpy(x), mask=torch.from_numpy(mask))
            x = x[mask]
        kept.append(x.astype(np.float64))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store, "fold", counting)
        got = m.compute()
    x = np.concatenate([np.empty(0), *kept])
    if not x.size:
        assert got == {}
        return
    want = {
        "mean": x.mean(), "min": x.min(), "max": x.max(), "count": float(len(x)),
        "sum": x.sum(), "std": x.std(), "last": x[-1],
    }  # fmt: skip
    for key, stat in zip(spec.output_keys("v"), spec.reduce):
        if stat == "p50":
            s = np.sort(x)
            lo, hi = s[(len(s) - 1) // 2], s[len(s) // 2]
            assert min(lo * 0.99, lo * 1.01) <= got[key] <= max(hi * 0.99, hi * 1.01), (key, got)
        else:
            assert same(got[key], float(want[stat]), rel=1e-9, abs=1e-9), (
                key,
                got[key],
                want[stat],
            )
    if "last" not in stats:
        # a list of any length joins the number buffer, which defining the name opened (the
        # lock-free path); an array joins it when it holds at most 64 samples
        into = [len(k) <= 64 or f == "list" for k, (f, _, _) in zip(kept, records)]
        joined = any(len(k) and j for k, j in zip(kept, into))
        listed = any(len(k) and not j for k, j in zip(kept, into))
        assert runs == [int(joined) + int(listed)], (runs, joined, listed)


@pytest.mark.parametrize(
    "value",
    [[1.0, 2**64], (1, 2**64), [-1, 2**63], [1, -(2**70)], [1.0, 2**1100], [1, "x"]],
    ids=["uint64-overflow", "tuple", "int64-overflow", "negative", "beyond-float64", "str"],
)
def test_a_list_of_python_numbers_is_taken_alike_first_and_later(value: Any) -> None:
    """A name's first list takes the checked path, its later ones the number buffer:
    either way Python ints beyond int64 are floats (as a single int is), and an int
    beyond float64 or a non-number raises naming the metric, with nothing recorded."""

    def outcome(opened: bool) -> Any:
        m = ms.Metrics()
        if opened:
            m.record("a", 1.0)  # the name's number buffer exists: the lock-free path
        try:
            m.record("a", value)
        except (TypeError, ValueError) as exc:
            assert "'a'" in str(exc)
            assert m.compute() == ({"a": 1.0} if opened else {})
            return type(exc)
        return m.compute()["a"]

    first, later = outcome(False), outcome(True)
    try:
        floats = [float(v) for v in value]  # what a single record of each would be
    except (TypeError, ValueError, OverflowError):
        assert isinstance(first, type) and later is first
        return
    assert first == pytest.approx(np.mean(floats), rel=1e-12)
    assert later == pytest.approx(np.mean([1.0, *floats]), rel=1e-12)


_FIRST_VALUES = {
    "float": 2.5,
    "int": -3,
    "np.float64": np.float64(0.25),
    "nan": math.nan,
    "int beyond float64": 2**1100,
    "bool": True,
    "0-d float32": torch.tensor(1.5),
    "0-d int8": torch.tensor(-7, dtype=torch.int8),
    "0-d bfloat16": torch.tensor(0.5, dtype=torch.bfloat16),
    "0-d bool": torch.tensor(True),
    "0-d in a graph": torch.tensor(4.0, requires_grad=True) * 2,
    "0-d complex": torch.tensor(1 + 0j),
    "1-d": torch.tensor([1.0]),
}


@pytest.mark.parametrize("value", _FIRST_VALUES.values(), ids=_FIRST_VALUES.keys())
@pytest.mark.parametrize(
    "spec", [ms.Spec(("mean", "min")), ms.Spec("last"), ms.Spec("max", nan="error")], ids=str
)
def test_a_names_first_number_opens_it_as_the_checked_path_would(
    value: Any, spec: ms.Spec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``record`` opens a name with its first Python number or 0-d CPU tensor without the
    checked path (``update`` always takes it): the same results and state (bytes for
    bytes where no time is kept), or the same error naming the metric, nothing recorded."""

    def outcome(record: Any) -> Any:
        m = ms.Metrics({"x": spec, "y": ms.Spec()})
        m.record("y", torch.tensor(1.0))  # another name is open (and tensors are known)
        try:
            record(m)
        except (TypeError, ValueError) as exc:
            assert "'x'" in str(exc) and m.compute() == {"y": 1.0}
            return type(exc), str(exc)
        m.record("x", 8.0)  # the name's later numbers join its buffer
        stamped = "last" in spec.reduce  # its bytes hold the records' times
        return str(m.compute()), m.names, None if stamped else m.to_bytes()  # NaN alike

    checked = outcome(lambda m: m.update({"x": value}))
    calls = []
    original = Store.prepare

    def counted(self: Store, *args: Any) -> Any:
        calls.append(args[0])
        return original(self, *args)

    monkeypatch.setattr(Store, "prepare", counted)
    assert outcome(lambda m: m.record("x", value)) == checked
    if isinstance(checked[0], type):
        return  # the same error, whichever path raised it
    number = type(value) in (float, int, np.float64) or getattr(value, "ndim", None) == 0
    assert ("x" not in calls) == (number and spec.nan != "error"), calls


@pytest.mark.parametrize("value", _FIRST_VALUES.values(), ids=_FIRST_VALUES.keys())
def test_an_empty_name_is_refused_before_its_value_is_read(value: Any) -> None:
    m = ms.Metrics()
    m.record("y", torch.tensor(1.0))  # tensors are known: a 0-d one could open a name
    for record in (lambda: m.record("", value), lambda: m.update({"": value})):
        with pytest.raises(TypeError, match="a metric name must be a non-empty string"):
            record()
    assert m.compute() == {"y": 1.0}
