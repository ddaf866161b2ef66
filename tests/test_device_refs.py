"""Kept references of accelerator records: never a wrong number, and the same results as
the host path.

A record of an accelerator tensor keeps a reference to it until a fold. CPU tensors
play the accelerator here (``HOST_DEVICE_TYPES`` emptied), so values can be checked:
a tensor changed in place before the fold raises naming the metric; a view into a
large tensor is copied at the record, so a later change of the large tensor changes
nothing recorded; and any mix of records gives what the host path gives.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _compare import same

torch = pytest.importorskip("torch")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync._record import _convert  # noqa: E402
from metricsync._record import _device as device_state  # noqa: E402
from metricsync._state import _algebra as al  # noqa: E402


@contextlib.contextmanager
def cpu_as_accelerator(ref_limit: int | None = None) -> Iterator[None]:
    """CPU tensors take the accelerator path; ``ref_limit`` pending references fold."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_convert, "HOST_DEVICE_TYPES", frozenset())
        if ref_limit is not None:
            mp.setattr(device_state, "REF_LIMIT", ref_limit)
        yield


SPECS = {
    "x": ms.Spec(("mean", "sum", "count", "min", "max", "last", "std")),
    "q": ms.Spec(("mean", "p50", "p90")),
    "ign": ms.Spec(("mean", "count", "last"), nan="ignore"),
    "err": ms.Spec(("mean", "max"), nan="error"),
}


# --- changed in place before the fold ----------------------------------------


def _changes() -> list[tuple[str, Any]]:
    """Ways to change a recorded tensor (or its weight or mask) in place after the record."""

    def scalar(m: ms.Metrics) -> Any:
        t = torch.tensor(5.0)
        m.record("x", t)
        return lambda: t.add_(100.0)

    def tokens(m: ms.Metrics) -> Any:
        t = torch.arange(8.0).reshape(2, 4)
        m.record("x", t, mask=torch.ones(2, 4, dtype=torch.bool))
        return lambda: t.mul_(3.0)

    def mask(m: ms.Metrics) -> Any:
        keep = torch.tensor([True, False, True])
        m.record("x", torch.tensor([1.0, 2.0, 3.0]), mask=keep)
        return lambda: keep.fill_(True)

    def weight(m: ms.Metrics) -> Any:
        w = torch.tensor([1.0, 2.0])
        m.record("x", torch.tensor([1.0, 2.0]), weight=w)
        return lambda: w.zero_()

    def small_base(m: ms.Metrics) -> Any:
        stats = torch.tensor([1.0, 2.0, 3.0])  # a small tensor: its view is referenced
        m.record("x", stats[1])
        return lambda: stats.mul_(10.0)  # through the base: the view's version moves too

    def in_graph(m: ms.Metrics) -> Any:
        p = torch.tensor([1.0, 2.0], requires_grad=True)
        out = p * 2.0
        m.record("x", out)
        return lambda: out.detach().add_(1.0)

    return [
        ("0-d", scalar),
        ("masked", tokens),
        ("mask", mask),
        ("weight", weight),
        ("view of a small tensor", small_base),
        ("detached from a graph", in_graph),
    ]


@pytest.mark.parametrize(
    ("label", "record_then_change"), _changes(), ids=[c[0] for c in _changes()]
)
def test_a_tensor_changed_in_place_before_the_fold_raises_naming_the_metric(
    label: str, record_then_change: Any
) -> None:
    m = ms.Metrics(SPECS)
    with cpu_as_accelerator():
        m.record("x", torch.tensor(1.0))
        m.record("q", torch.tensor([4.0, 6.0]))
        change = record_then_change(m)
        change()
        with pytest.raises(ValueError, match=r"metric 'x'.*changed in place") as info:
            m.compute()
        assert "discarded" in str(info.value)
        with pytest.raises(ValueError, match=r"metric 'x'.*changed in place"):
            m.compute()  # the error stays until reset()


def test_a_name_whose_only_record_changed_holds_nothing() -> None:
    # every pending record of the device left out: the fold has nothing, the row stays
    # empty and flagged (the flag stays: each compute() raises until reset())
    state = device_state.DeviceState(torch.device("cpu"))
    state.add(0, ms.Spec(), torch.tensor(3.0), None, None, now=1.0)
    stats = torch.tensor([1.0, 2.0])
    state.add(1, ms.Spec(), stats[0], None, None, now=2.0)
    stats.add_(1.0)
    for _ in range(2):
        slots, cols, _, errors = state.snapshot()
        assert slots == [0, 1] and errors.tolist() == [0.0, device_state.BAD_CHANGED]
        assert cols[al.W].tolist() == [1.0, 0.0] and cols[al.S].tolist() == [3.0, 0.0]


def test_a_change_after_the_fold_changes_nothing() -> None:
    m = ms.Metrics(SPECS)
    with cpu_as_accelerator(ref_limit=2):
        m.record("x", torch.tensor(1.0))  # a name's first record takes the checked path
        t = torch.tensor(5.0)
        m.record("x", t)  # the later ones its lane, without the lock
        m.record("x", torch.tensor(7.0))  # the lane's second reference folds all three
        t.add_(100.0)
        assert m.compute()["x/sum"] == 13.0


def test_a_view_into_a_large_live_tensor_keeps_its_value_at_the_record() -> None:
    # a view whose storage is large is copied at the record: it holds none of that memory,
    # and a later change of the large tensor (seen by its version or not) changes nothing
    big = torch.arange(100_000, dtype=torch.float64)
    mask = torch.zeros(100_000, dtype=torch.bool)
    mask[:8] = True
    m = ms.Metrics(SPECS)
    with cpu_as_accelerator():
        m.record("x", big[3])  # 0-d view
        m.record("x", big[10:14], mask=mask[:4])  # a view and its mask, both of large tensors
        m.record("x", big[20:22].detach(), weight=big[:2].detach() + 1.0)  # detached views
        big.fill_(-1.0)
        big.data.fill_(-2.0)  # not even seen by the version counter
        mask.fill_(False)
        got = m.compute()
    samples = np.array([3.0, 10.0, 11.0, 12.0, 13.0, 20.0, 21.0])
    weights = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0])
    assert got["x/sum"] == float(np.sum(samples * weights))
    assert got["x/count"] == float(weights.sum())
    assert (got["x/min"], got["x/max"], got["x/last"]) == (3.0, 21.0, 21.0)


def test_a_kept_reference_holds_no_autograd_graph() -> None:
    import weakref

    m = ms.Metrics()
    with cpu_as_accelerator():
        p = torch.tensor(3.0, requires_grad=True)
        a = p * 1.0  # an intermediate the graph saves
        loss = a * a
        saved = weakref.ref(a)
        del a
        assert saved() is not None  # held by the graph
        m.record("loss", loss)  # opens the name
        m.record("loss", loss)  # a reference, detached
        del loss
        assert saved() is None  # the graph is gone: nothing metricsync keeps holds it
        assert m.compute() == {"loss": 9.0}


# --- inputs in a graph, or made under inference mode --------------------------

BIG = 1_100_000  # more than half the copy buffer's bound: folds on its own at the record
PAIR = {"x": ms.Spec(("mean", "sum", "count")), "y": ms.Spec("sum")}


def _graph_inputs() -> list[tuple[str, Any]]:
    """Records whose value, weight or mask requires grad: ``(record, sum, count)``."""

    def big_value(m: ms.Metrics) -> tuple[float, float]:
        p = torch.ones(BIG, requires_grad=True)
        m.record("x", p * 2.0)  # a loss-like tensor still in its graph
        return 2.0 * BIG, float(BIG)

    def big_weight(m: ms.Metrics) -> tuple[float, float]:
        w = torch.ones(BIG, requires_grad=True) * 1.0
        m.record("x", torch.ones(BIG), weight=w)
        return float(BIG), float(BIG)

    def float_mask(m: ms.Metrics) -> tuple[float, float]:
        mask = torch.tensor([1.0, 0.0], requires_grad=True) * 1.0
        m.record("x", torch.tensor([1.0, 2.0]), mask=mask)
        return 1.0, 1.0

    def weight(m: ms.Metrics) -> tuple[float, float]:
        w = torch.tensor([1.0, 3.0], requires_grad=True) * 1.0
        m.record("x", torch.tensor([2.0, 4.0]), weight=w)
        return 14.0, 4.0

    def big_masked(m: ms.Metrics) -> tuple[float, float]:
        mask = torch.ones(BIG, requires_grad=True) * 1.0
        m.record("x", torch.full((BIG,), 3.0, requires_grad=True) * 1.0, mask=mask)
        return 3.0 * BIG, float(BIG)

    return [
        ("large value", big_value),
        ("large weight", big_weight),
        ("float mask", float_mask),
        ("weight", weight),
        ("large masked", big_masked),
    ]


@pytest.mark.parametrize(("label", "record"), _graph_inputs(), ids=[c[0] for c in _graph_inputs()])
def test_an_input_that_requires_grad_keeps_no_graph_and_every_metric_computes(
    label: str, record: Any
) -> None:
    m = ms.Metrics(PAIR)
    with cpu_as_accelerator():
        m.record("y", 1.0)
        total, count = record(m)
        got = m.compute()  # was: "Can't call numpy() on Tensor that requires grad"
        m.record("x", torch.tensor(1.0))  # the state stays usable after it
        again = m.compute()
    assert got["x/sum"] == pytest.approx(total) and got["x/count"] == count
    assert again["x/sum"] == pytest.approx(total + 1.0) and again["x/count"] == count + 1
    assert got["y"] == again["y"] == 1.0


@pytest.mark.parametrize(
    "view",
    [lambda p: p[0], lambda p: p.view(-1)[1:], lambda p: p[0].view(())],
    ids=["p[0]", "p.view(-1)[1:]", "p[0].view(())"],
)
@pytest.mark.parametrize("role", ["value", "weight", "mask"])
def test_a_view_of_a_parameter_stepped_or_freed_after_its_record_keeps_its_value(
    view: Any, role: str
) -> None:
    # an element or slice of a parameter (a gate of a vector of gates) is a view that
    # requires grad but is no leaf: its optimizer's step changes it in place all the same
    m = ms.Metrics({"t": ms.Spec(("sum", "count"))})
    values, weights = [], []
    with cpu_as_accelerator():
        for step in range(3):
            p = torch.nn.Parameter(torch.full((3,), 1.0 if role == "mask" else 1.0 + step))
            v = view(p)
            x = torch.full(v.shape, 5.0 + step) if role != "value" else v
            kw = {} if role == "value" else {role: v}
            for _ in range(2):  # the second of a name: its lane, for a 0-d plain tensor
                m.record("t", x, **kw)
                xs = x.detach().clone().numpy().ravel()
                ws = v.detach().clone().numpy().ravel() if role != "value" else np.ones(xs.size)
                values.append(xs)
                weights.append(ws)
            with torch.no_grad():
                p.sub_(1.0)  # the optimizer's step (a mask stays 0/1), before anything read it
                p.untyped_storage().resize_(0)  # and its storage freed (FSDP's reshard)
        got = m.compute()
    xs, ws = np.concatenate(values), np.concatenate(weights)
    assert got["t/sum"] == pytest.approx(float(np.sum(xs * ws)))
    assert got["t/count"] == pytest.approx(float(np.sum(ws)))


@pytest.mark.parametrize("shape", [(), (3,)], ids=["0-d", "(3,)"])
@pytest.mark.parametrize("as_param", [True, False], ids=["nn.Parameter", "leaf tensor"])
def test_a_parameter_stepped_or_freed_after_its_record_keeps_its_value(
    shape: tuple[int, ...], as_param: bool
) -> None:
    # a leaf that requires grad (a learned temperature, a gate) is copied at the record: its
    # optimizer changes it in place, and FSDP frees its storage, before the fold reads it
    m = ms.Metrics({"t": ms.Spec(("sum", "count"))})
    with cpu_as_accelerator():
        values = []
        for step in range(3):
            p = torch.full(shape, 2.0 + step, requires_grad=True)
            leaf = torch.nn.Parameter(p.detach()) if as_param else p
            m.record("t", leaf)
            m.record("t", leaf)  # the second of a name: its lane, for a 0-d plain tensor
            values += [2.0 + step] * 2 * max(1, leaf.numel())
            with torch.no_grad():
                leaf.mul_(10.0)  # the optimizer's step, before anything read the record
                leaf.untyped_storage().resize_(0)  # and its storage freed (FSDP's reshard)
        got = m.compute()
    assert got == {"t/sum": sum(values), "t/count": float(len(values))}


@pytest.mark.parametrize("shape", [(), (3,), (BIG,)], ids=["0-d", "(3,)", "large"])
@pytest.mark.parametrize("inside", [False, True], ids=["recorded after", "recorded inside"])
def test_a_tensor_made_under_inference_mode_is_recorded(
    shape: tuple[int, ...], inside: bool
) -> None:
    # an inference tensor has no version counter: it is copied at the record, so a later
    # in-place change (possible inside inference mode) changes nothing recorded
    m = ms.Metrics(PAIR)
    with cpu_as_accelerator():
        m.record("y", 1.0)
        with torch.inference_mode():  # an eval loop
            t = torch.full(shape, 2.0)
            if inside:
                m.record("x", t)
                m.record("x", t)  # the name's later records take the lane
                t.add_(5.0)
        if not inside:
            m.record("x", t)
            m.record("x", t)
        n = 2.0 * t.numel()
        got = m.compute()
        m.record("x", torch.tensor(2.0))  # the state written inside it is usable outside
        again = m.compute()
    assert got["x/sum"] == 2.0 * n and got["x/count"] == n and got["y"] == 1.0
    assert again["x/sum"] == 2.0 * n + 2.0


# --- what an observation reported stays ---------------------------------------


@pytest.mark.parametrize("kind", ["0-d", "(3,)", "weighted", "masked"])
def test_a_change_after_compute_changes_nothing_reported(kind: str) -> None:
    # compute() pins what it read: a later in-place change of a reported tensor (value,
    # weight or mask), or an unrelated record, neither changes nor drops it
    m = ms.Metrics(PAIR)
    with cpu_as_accelerator():
        t = torch.full(() if kind == "0-d" else (3,), 2.0)
        w = torch.tensor([1.0, 2.0, 1.0]) if kind == "weighted" else None
        k = torch.tensor([True, False, True]) if kind == "masked" else None
        m.record("x", t, weight=w, mask=k)
        m.record("x", t, weight=w, mask=k)  # the name's lane: a kept reference
        first = m.compute()
        for changed in (t, w, k):
            if changed is not None:
                changed.logical_not_() if changed.dtype == torch.bool else changed.add_(1.0)
        assert m.compute() == first  # was 6.0 from a stale cache, then...
        m.record("y", 1.0)
        after = m.compute()  # ...was a ValueError naming x, and x gone for good
        m.record("x", torch.tensor(5.0))
        last = m.compute()
    n = {"0-d": 2.0, "(3,)": 6.0, "weighted": 8.0, "masked": 4.0}[kind]
    assert first["x/sum"] == 2.0 * n and first["x/count"] == n
    assert after == {**first, "y": 1.0}
    assert last["x/sum"] == 2.0 * n + 5.0 and last["x/count"] == n + 1.0


# --- an observation never clears an error -------------------------------------


@pytest.mark.parametrize("observe", ["copy", "to_bytes", "compute", "sync"])
def test_an_error_stays_until_reset_whatever_observes_it(observe: str) -> None:
    m = ms.Metrics(PAIR)
    with cpu_as_accelerator():
        m.record("y", 1.0)
        t = torch.tensor([1.0, 2.0])
        m.record("x", t)
        t.add_(1.0)
        with pytest.raises(ValueError, match=r"metric 'x'.*changed in place"):
            getattr(m, observe)()  # was: copy() and to_bytes() cleared m's error
        for again in (m.compute, m.sync, m.copy, m.to_bytes, m.compute):
            with pytest.raises(ValueError, match=r"metric 'x'.*changed in place"):
                again()  # was: {} and no error, x silently gone
        m.reset()
        m.record("x", torch.tensor(4.0))
        assert m.compute() == {"x/mean": 4.0, "x/sum": 4.0, "x/count": 1.0}


# --- the device path equals the host path -------------------------------------

FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32) | st.floats(-1e6, 1e6)


@st.composite
def records(draw: Any) -> list[tuple[str, np.ndarray, Any, Any, str]]:
    """Records: (name, value, weight, mask, dtype)."""
    out = []
    for _ in range(draw(st.integers(1, 12))):
        name = draw(st.sampled_from(sorted(SPECS)))
        shape = draw(st.sampled_from([(), (3,), (2, 3)]))
        size = int(np.prod(shape))
        dtype = draw(st.sampled_from(["float64", "float32", "int64", "bool"]))
        raw = draw(st.lists(FLOATS, min_size=size, max_size=size))
        value = np.array(raw, dtype=np.float64).reshape(shape)
        if dtype in ("int64", "bool"):
            value = np.nan_to_num(value, nan=0.0, posinf=5.0, neginf=-5.0).round() % 7
            value = value.astype(dtype)
        if name == "err":
            value = np.where(np.isfinite(value), value, 1.0) if value.dtype.kind == "f" else value
        kind = draw(
            st.sampled_from(["plain", "float weight", "weight", "mask", "int mask", "both"])
        )
        weight: Any = None
        mask: Any = None
        if kind in ("float weight",):
            weight = draw(st.floats(0.0, 1e3))
        if kind in ("weight", "both"):
            wshape = draw(st.sampled_from([shape, shape[-1:]]))
            weight = np.array(
                draw(
                    st.lists(
                        st.floats(0.0, 1e3),
                        min_size=int(np.prod(wshape)),
                        max_size=int(np.prod(wshape)),
                    )
                )
            ).reshape(wshape)
        if kind in ("mask", "int mask", "both"):
            bits = draw(st.lists(st.booleans(), min_size=size, max_size=size))
            mask = np.array(bits, dtype=bool).reshape(shape)
            if kind == "int mask":
                mask = mask.astype(np.int32)
        out.append((name, value, weight, mask, dtype))
    return out


def _apply(m: ms.Metrics, recs: list[tuple[str, np.ndarray, Any, Any, str]]) -> None:
    for name, value, weight, mask, _ in recs:
        t = torch.from_numpy(np.array(value))
        w = torch.from_numpy(weight) if isinstance(weight, np.ndarray) else weight
        k = None if mask is None else torch.from_numpy(mask)
        m.record(name, t, weight=w, mask=k)


@settings(max_examples=60, deadline=None)
@given(recs=records(), ref_limit=st.sampled_from([2, 5, 1024]), observe=st.booleans())
def test_the_device_path_equals_the_host_path(
    recs: list[tuple[str, np.ndarray, Any, Any, str]], ref_limit: int, observe: bool
) -> None:
    host = ms.Metrics(SPECS)
    _apply(host, recs)
    want = host.compute()
    dev = ms.Metrics(SPECS)
    with cpu_as_accelerator(ref_limit):
        half = len(recs) // 2
        _apply(dev, recs[:half])
        if observe:  # a compute mid-way changes nothing later
            dev.compute()
        _apply(dev, recs[half:])
        got = dev.compute()
    assert set(got) == set(want)
    for key, value in want.items():
        if key.endswith(("/p50", "/p90")):  # the sketch: same cells, same quantile
            assert same(got[key], value, rel=1e-9, abs=1e-9) or abs(got[key] - value) <= 0.02 * abs(
                value
            ), key
        else:
            assert same(got[key], value, rel=1e-9, abs=1e-9), (key, got[key], value)


def test_the_device_path_equals_the_host_path_over_many_folds() -> None:
    rng = np.random.default_rng(5)
    recs = []
    for i in range(3000):
        x = rng.normal(size=(4, 8)) * 10
        mask = rng.random((4, 8)) < 0.6
        recs.append(("x", np.array(x[0, 0]), None, None, "float64"))
        recs.append(("x", x, None, mask, "float64"))
        if i % 7 == 0:
            recs.append(("q", np.abs(x[1]), rng.random(8), None, "float64"))
            nan_x = np.where(rng.random(8) < 0.2, np.nan, x[2])
            recs.append(("ign", nan_x, None, None, "float64"))
    host = ms.Metrics(SPECS)
    _apply(host, recs)
    dev = ms.Metrics(SPECS)
    with cpu_as_accelerator():
        _apply(dev, recs)
        got = dev.compute()
    want = host.compute()
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-9), (key, got[key], value)


def _as_views(
    recs: list[tuple[str, np.ndarray, Any, Any, str]], large: bool
) -> tuple[list[tuple[str, Any, Any, Any]], list[torch.Tensor]]:
    """Each record's value as a view into a buffer of its own: a large one (copied at the
    record) or one just twice its size (referenced). Returns the records and the buffers."""
    out, buffers = [], []
    for name, value, weight, mask, _ in recs:
        flat = torch.from_numpy(np.array(value)).reshape(-1)
        size = 50_000 if large else 2 * flat.numel()
        buf = torch.zeros(size, dtype=flat.dtype)
        buf[: flat.numel()] = flat
        view = buf[: flat.numel()].view(np.shape(value))
        w = torch.from_numpy(weight) if isinstance(weight, np.ndarray) else weight
        out.append((name, view, w, None if mask is None else torch.from_numpy(mask)))
        buffers.append(buf)
    return out, buffers


@settings(max_examples=30, deadline=None)
@given(recs=records(), large=st.booleans(), which=st.integers(0, 1000))
def test_views_and_in_place_changes_never_give_a_wrong_number(
    recs: list[tuple[str, np.ndarray, Any, Any, str]], large: bool, which: int
) -> None:
    host = ms.Metrics(SPECS)
    _apply(host, recs)
    want = host.compute()
    dev = ms.Metrics(SPECS)
    with cpu_as_accelerator():
        views, buffers = _as_views(recs, large)
        for name, view, w, k in views:
            dev.record(name, view, weight=w, mask=k)
        changed = which % len(views)
        buf = buffers[changed]  # changed through the base: the view's version moves
        buf.logical_not_() if buf.dtype == torch.bool else buf.add_(1)
        if large:  # copied at the record: nothing changes
            got = dev.compute()
        else:  # referenced: the changed record is refused, naming its metric
            for _ in range(2):  # the error stays until reset()
                with pytest.raises(
                    ValueError, match=f"metric '{recs[changed][0]}'.*changed in place"
                ):
                    dev.compute()
            return
    assert set(got) == set(want)
    for key, value in want.items():
        if key.endswith(("/p50", "/p90")):
            assert same(got[key], value, rel=1e-9, abs=1e-9) or abs(got[key] - value) <= 0.02 * abs(
                value
            ), key
        else:
            assert same(got[key], value, rel=1e-9, abs=1e-9), (key, got[key], value)


# --- 0-d references: the batched copy, the scratch buffer, the counted fold -----

SCALAR_SPECS = {
    "a": ms.Spec(("mean", "sum", "count")),  # sums and counts only: the counted fold
    "b": ms.Spec(("sum", "count")),
    "i": ms.Spec(("mean", "count"), nan="ignore"),  # a policy: the general fold
    "m": ms.Spec(("mean", "max")),  # a max: the general fold, and a merge that is not a sum
}
SCALAR_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64]
SCALAR_DTYPES += [torch.int32, torch.bool]
#: multiples of 1/8: every sum of them is exact in any order
EIGHTHS = st.integers(-8_000_000, 8_000_000).map(lambda i: i / 8)
SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf])


@st.composite
def scalar_records(draw: Any) -> list[tuple[str, float, Any]]:
    names = draw(st.sampled_from([["a", "b"], ["a", "b", "i"], ["a", "m"], ["a", "b", "i", "m"]]))
    rare = draw(st.sampled_from([0, 0, 30, 300]))  # about one in ``rare`` non-finite; 0: none
    out = []
    for _ in range(draw(st.integers(1, 300))):
        special = rare and draw(st.integers(0, rare - 1)) == 0
        value = draw(SPECIAL if special else EIGHTHS)
        out.append((draw(st.sampled_from(names)), value, draw(st.sampled_from(SCALAR_DTYPES))))
    return out


def _sample(value: float, dtype: Any) -> float:
    """What a 0-d tensor of ``dtype`` made from ``value`` holds, as a float."""
    if not dtype.is_floating_point and not math.isfinite(value):
        value = 0.0
    return float(torch.tensor(value).to(dtype).double())


@settings(max_examples=40, deadline=None)
@given(recs=scalar_records(), ref_limit=st.sampled_from([3, 64, 100, 1024]), observe=st.booleans())
def test_0d_references_equal_numpy_and_the_host_path(
    recs: list[tuple[str, float, Any]], ref_limit: int, observe: bool
) -> None:
    # folds of 64 or more 0-d references copy them into a reused scratch buffer with one
    # batched copy per dtype; rows that need only sums and counts fold with one index_add_
    tensors = [(name, torch.tensor(_sample(v, dtype)).to(dtype)) for name, v, dtype in recs]
    host = ms.Metrics(SCALAR_SPECS)
    for name, t in tensors:
        host.record(name, t)
    want = host.compute()
    dev = ms.Metrics(SCALAR_SPECS)
    with cpu_as_accelerator(ref_limit):
        for i, (name, t) in enumerate(tensors):
            dev.record(name, t)
            if observe and i == len(tensors) // 2:
                dev.compute()  # pins what it read; later folds reuse the scratch buffer
        got = dev.compute()
    assert set(got) == set(want)
    for key, value in want.items():
        assert same(got[key], value, rel=1e-9, abs=1e-9), (key, got[key], value)
    for name in ("a", "b"):  # numpy over the raw samples
        xs = np.array([_sample(v, d) for n, v, d in recs if n == name])
        if len(xs) == 0:
            continue
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, as in the sum
            total, mean = float(np.sum(xs)), float(np.mean(xs))
        assert same(got[f"{name}/sum"], total, rel=1e-9, abs=1e-9) and got[f"{name}/count"] == len(
            xs
        ), name
        if name == "a":
            assert same(got["a/mean"], mean, rel=1e-9, abs=1e-9)


def test_a_0d_reference_changed_in_place_in_a_large_fold_raises_naming_the_metric() -> None:
    # 200 pending 0-d references: the fold copies them into the scratch buffer
    m = ms.Metrics(SCALAR_SPECS)
    with cpu_as_accelerator():
        kept = [torch.tensor(float(i)) for i in range(200)]
        for i, t in enumerate(kept):
            m.record("a" if i != 150 else "b", t)
        kept[150].add_(1.0)  # changed before any fold read it
        with pytest.raises(ValueError, match=r"metric 'b'.*changed in place"):
            m.compute()
        m.reset()
    with cpu_as_accelerator(ref_limit=100):  # a fold at 100, then 80 more reuse the buffer
        for t in kept[:180]:
            m.record("a", t)
        got = m.compute()
    want = np.array([float(t) for t in kept[:180]])
    assert got["a/sum"] == float(want.sum()) and got["a/count"] == 180.0


# --- the lane: 0-d references pended without the store's lock --------------------------


def test_a_lane_record_after_an_observation_is_in_the_next_one() -> None:
    # a lane's append moves no change count: the kept fold must still see it (its key counts
    # the references the lanes appended), however many the observation dropped or pinned
    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    with cpu_as_accelerator():
        m.record("x", torch.tensor(1.0))  # the checked path: the name's lane opens
        m.record("x", torch.tensor(2.0))  # the lane
        assert m.compute() == {"x/sum": 3.0, "x/count": 2.0}
        m.record("x", torch.tensor(4.0))  # the lane alone: no @changing call between
        assert m.compute() == {"x/sum": 7.0, "x/count": 3.0}
        assert m.copy().compute() == {"x/sum": 7.0, "x/count": 3.0}
        m.record("x", torch.tensor(8.0))
        assert ms.Metrics.from_bytes(m.to_bytes()).compute() == {"x/sum": 15.0, "x/count": 4.0}


def test_after_reset_a_name_opens_a_new_lane_and_the_old_one_holds_nothing() -> None:
    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    with cpu_as_accelerator(ref_limit=3):
        for v in (1.0, 2.0, 4.0, 8.0):
            m.record("x", torch.tensor(v))
        m.reset()
        for v in (16.0, 32.0, 64.0, 128.0):
            m.record("x", torch.tensor(v))
        assert m.compute() == {"x/sum": 240.0, "x/count": 4.0}


def test_a_lane_takes_only_what_a_reference_may_hold() -> None:
    # each refused tensor takes the checked path, which copies it (or refuses it): the
    # result is the same either way, and nothing is pended twice
    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    with cpu_as_accelerator():
        m.record("x", torch.tensor(1.0))
        big = torch.arange(10_000, dtype=torch.float64)
        with torch.inference_mode():
            frozen = torch.tensor(5.0)  # no version counter
        grad = torch.tensor(7.0, requires_grad=True) * 1.0
        others = [big[3], frozen, grad, torch.tensor(2, dtype=torch.int32), torch.tensor(True)]
        lane = m._store.devices.lanes["x"]
        taken = [lane.take(t) for t in others]
        assert taken == [False, False, True, True, True]
        lane.inbox.clear()
        for t in others:
            m.record("x", t)
        assert [t.requires_grad for _, t, *_ in lane.inbox] == [False, False, False]
        assert m.compute() == {"x/sum": 1.0 + 3.0 + 5.0 + 7.0 + 2.0 + 1.0, "x/count": 6.0}


# --- observations between lane records ----------------------------------------------------

ROUNDING = [1e16, -1e16, 1.0, 0.1, 3.3, 1e-3, -7.25]  # sums that depend on how they group


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.sampled_from(ROUNDING), min_size=2, max_size=14),
    ref_limit=st.sampled_from([2, 3, 4, 5]),
    seen=st.sets(st.integers(0, 13), max_size=4),
)
@example(
    values=[0.1, 1e16, 1e16, -1e16, 3.3, 0.1, 1e16, -1e16, 3.3, -1e16, 1e-3], ref_limit=4, seen={1}
)
def test_observing_between_lane_records_changes_no_later_result(
    values: list[float], ref_limit: int, seen: set[int]
) -> None:
    # an observation pins the lane records it read where they are: the fold points (every
    # ``ref_limit`` references) stay those of the records alone, so the final state is bit
    # for bit that of a run that never observed (moving them out of the inbox let the lane
    # fold ``ref_limit`` more later: other groupings, other roundings)
    def run(observe: set[int]) -> tuple[bytes, dict[str, float]]:
        m = ms.Metrics({"x": ms.Spec(("mean", "sum", "std", "count"))})
        with cpu_as_accelerator(ref_limit):
            for i, v in enumerate(values):
                m.record("x", torch.tensor(v, dtype=torch.float64))
                if i in observe:
                    m.compute()
            return m.to_bytes(), m.compute()

    plain, observed = run(set()), run(seen)
    assert observed[0] == plain[0]
    assert observed[1]["x/count"] == len(values)
    assert same(observed[1]["x/sum"], math.fsum(values), rel=1e-12, abs=4.0)


def test_observing_after_each_lane_record_keeps_the_pending_references_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each observation read every pending reference: without a fold at ``ref_limit`` of
    # them (the lane counted its inbox alone, which each observation emptied) the pending
    # list grew by one per record, and each observation copied all of it
    sizes: list[int] = []
    gather = device_state.gather

    def counting(scalars: Any, *args: Any) -> Any:
        sizes.append(len(scalars))
        return gather(scalars, *args)

    monkeypatch.setattr(device_state, "gather", counting)
    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    values = [float(i % 7) for i in range(100)]
    with cpu_as_accelerator(ref_limit=8):
        for v in values:
            m.record("x", torch.tensor(v))
            m.compute()
    assert m.compute() == {"x/sum": float(np.sum(values)), "x/count": 100.0}
    assert max(sizes) <= 2 * 8, max(sizes)  # the inbox's 8 and the checked path's


LANE_SPECS = {
    "x": ms.Spec(("sum", "count", "min", "max", "last")),
    "i": ms.Spec(("sum", "count", "last"), nan="ignore"),
}
LANE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["tensor", "tensor", "number", "observe", "copy", "reset", "overwrite"]),
        st.sampled_from(["x", "i"]),
        st.sampled_from([1.0, -2.0, 4.0, 0.5, 8.0, math.nan]),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(ops=LANE_OPS, ref_limit=st.sampled_from([2, 3, 5, 1024]))
def test_lane_records_mixed_with_observations_equal_numpy_over_the_samples(
    ops: list[tuple[str, str, float]], ref_limit: int
) -> None:
    # 0-d tensors through their name's lane (the first through the checked path), Python
    # numbers, observations that pin, copies that go on recording, resets, and tensors
    # overwritten after an observation read them: every statistic as numpy gives it over
    # the samples (sums of these values are exact), none lost or counted twice
    m = ms.Metrics(LANE_SPECS)
    samples: dict[str, list[float]] = {"x": [], "i": []}
    with cpu_as_accelerator(ref_limit):
        for kind, name, v in ops:
            v = 3.0 if name == "x" and math.isnan(v) else v
            if kind in ("tensor", "overwrite"):
                t = torch.tensor(v, dtype=torch.float64)
                m.record(name, t)
                if kind == "overwrite":
                    m.compute()
                    t.add_(100.0)  # after the observation read it: changes nothing
            elif kind == "number":
                m.record(name, v)
            elif kind == "observe":
                m.compute()
            elif kind == "copy":
                m = m.copy()
            else:
                m.reset()
                samples = {"x": [], "i": []}
                continue
            if kind != "observe" and kind != "copy":
                samples[name].append(v)
        got = m.compute()
    for name, xs in samples.items():
        kept = np.array([v for v in xs if not math.isnan(v)])
        if not len(xs):
            continue
        assert got[f"{name}/count"] == len(kept), (name, got)
        if len(kept):
            assert got[f"{name}/sum"] == float(np.sum(kept)), (name, got)
            assert got[f"{name}/last"] == kept[-1], (name, got)
        if name == "x":
            assert (got["x/min"], got["x/max"]) == (np.min(kept), np.max(kept))


# --- a fold that fails while a record is pended ---------------------------------------------


@pytest.mark.parametrize("how", ["lane", "weighted", "masked"])
def test_a_fold_that_fails_under_a_record_raises_and_counts_the_record_once(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a record pends its tensor, then the fold it sets off fails (on CUDA: out of memory):
    # the error must reach the caller, and the record stay pended once. Retried on the
    # general path, the failure was swallowed (the retry's fold succeeded) and the record
    # counted twice
    fold = device_state.fold_batch
    failures = [1]

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("CUDA out of memory (simulated)")
        return fold(*args, **kwargs)

    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    values = [1.0, 2.0, 4.0, 8.0]
    with cpu_as_accelerator(ref_limit=3):
        m.record("x", torch.tensor(values[0]))  # the checked path: the name's lane opens
        monkeypatch.setattr(device_state, "fold_batch", failing_once)
        recorded = values[:1]
        with pytest.raises(RuntimeError, match="out of memory"):
            for v in values[1:]:
                recorded.append(v)  # up to the one whose fold fails
                t = torch.tensor(v)
                if how == "lane":
                    m.record("x", t)
                elif how == "weighted":
                    m.record("x", t, weight=1.0)
                else:
                    m.record("x", t.reshape(1), mask=torch.tensor([True]))
        monkeypatch.setattr(device_state, "fold_batch", fold)
        got = m.compute()
    assert got == {"x/sum": float(np.sum(recorded)), "x/count": float(len(recorded))}
