"""Every statistic against numpy over the raw samples, under any partition and merge order.

Hypothesis draws records (Python numbers, numpy arrays, CPU torch tensors, with
optional weights and masks), deals them to 1..6 ``Metrics`` objects in time
order, merges those in a random order with ``ms.merge`` and with
``a.merge(b)``, and compares ``compute()`` with numpy over the samples:

- ``sum = sum(w x)``, ``count = sum(w)``, ``mean = sum / count``;
- population ``var = sum(w (x - mean)^2) / sum(w)``, ``std = sqrt(var)``;
- ``min``/``max`` over samples with ``w > 0``; ``last`` the latest such sample;
- ``pNN`` within 1% of the brute-force quantile of the weighted samples (weights
  relative to their mean, infinities by their limit); ``p0``/``p100`` exact;
- scaling every weight by any ``c`` in ``[1e-6, 1e6]`` changes no statistic but
  ``sum`` and ``count`` (which scale by ``c``), up to rounding.

It also checks what every state must satisfy: merging leaves its inputs
unchanged, merging an empty ``Metrics`` changes nothing, and the codec and
pickle round trips give the same ``compute()``.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import pickle
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from _compare import same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metricsync as ms
from metricsync._state import _algebra as state

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

PLAIN = ("mean", "sum", "count", "min", "max", "last", "std", "var")
QUANTILES = ("p0", "p50", "p90", "p99", "p100")
HAS_SKETCH = importlib.util.find_spec("metricsync._state._sketch") is not None
needs_sketch = pytest.mark.skipif(
    not HAS_SKETCH, reason="metricsync._state._sketch not written yet"
)

SETTINGS = settings(  # METRICSYNC_EXAMPLES=2000 for a deeper search
    max_examples=int(os.environ.get("METRICSYNC_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ----------------------------------------------------------------- records


@dataclass
class Rec:
    """One ``record`` call: what is passed, into which part, and its samples."""

    part: int
    value: Any
    weight: Any
    mask: Any
    x: np.ndarray  # the samples, float64, flattened
    w: np.ndarray  # their effective weights (weight * mask), flattened
    fold_after: bool  # call compute() on the part right after this record


# values exact in float32 and float64, so every container holds the same samples
EIGHTHS = st.integers(-4000, 4000).map(lambda i: i / 8)
WEIGHTS = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0])


def _as_kind(values: np.ndarray, kind: str) -> Any:
    if kind == "np64":
        return values.astype(np.float64)
    if kind == "np32":
        return values.astype(np.float32)
    if kind == "list":
        return values.tolist()
    if kind == "t32":
        return torch.tensor(values, dtype=torch.float32)
    return torch.tensor(values, dtype=torch.float64)


def _as_container(arr: np.ndarray, like: str, dtype: str) -> Any:
    """A weight or mask array in numpy or torch (or a list), bool/int/float as asked."""
    if dtype == "bool":
        arr = arr.astype(bool)
    elif dtype == "int":
        arr = arr.astype(np.int64)
    if like == "torch":
        return torch.tensor(arr)
    if like == "list":
        return arr.tolist()
    return arr


@st.composite
def a_record(
    draw: st.DrawFn, n_parts: int, values: st.SearchStrategy[float], weighting: str
) -> Rec:
    part = draw(st.integers(0, n_parts - 1))
    kind = draw(st.sampled_from(["float", "int", "np64", "np32", "list", "t32", "t64"]))
    fold_after = draw(st.booleans()) and draw(st.booleans())
    if kind in ("float", "int"):
        v = float(draw(st.integers(-500, 500))) if kind == "int" else draw(values)
        value: Any = int(v) if kind == "int" else v
        x = np.array([v])
        weight = mask = None
        w = np.ones(1)
        how = draw(st.sampled_from(["none", "weight", "mask"])) if weighting != "none" else "none"
        if how == "weight":
            weight = draw(WEIGHTS if weighting == "real" else st.integers(0, 3).map(float))
            w = np.array([weight])
        elif how == "mask":
            mask = draw(st.booleans())
            w = np.array([float(mask)])
        return Rec(part, value, weight, mask, x, w, fold_after)
    n = draw(st.integers(0, 6))
    raw = np.array(draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float64)
    shape: tuple[int, ...] = (n,)
    if n >= 2 and n % 2 == 0 and draw(st.booleans()):
        shape = (2, n // 2)
    raw = raw.reshape(shape)
    value = _as_kind(raw, kind)
    host_like = draw(st.sampled_from(["numpy", "list"]))
    like = draw(st.sampled_from(["torch", "numpy"])) if kind.startswith("t") else host_like
    full_w = np.ones(shape)
    weight = mask = None
    if weighting != "none":
        how = draw(st.sampled_from(["none", "scalar", "array", "row", "mask", "both"]))
        pool = WEIGHTS if weighting == "real" else st.integers(0, 3).map(float)
        if how == "scalar":
            weight = draw(pool)
            full_w = full_w * weight
        if how in ("array", "both"):
            arr = np.array(draw(st.lists(pool, min_size=n, max_size=n))).reshape(shape)
            integral = bool(np.all(arr == np.round(arr)))
            weight = _as_container(
                arr, like, draw(st.sampled_from(["float", "int"][: 1 + integral]))
            )
            full_w = full_w * arr
        if how == "row":  # broadcast along the last axis
            arr = np.array(draw(st.lists(pool, min_size=shape[-1], max_size=shape[-1])))
            weight = _as_container(arr, like, "float")
            full_w = full_w * arr
        if how in ("mask", "both"):
            keep = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))).reshape(shape)
            mask = _as_container(keep, like, draw(st.sampled_from(["bool", "int"])))
            full_w = full_w * keep
    return Rec(part, value, weight, mask, raw.reshape(-1), full_w.reshape(-1), fold_after)


def build(specs: dict[str, ms.Spec], name: str, recs: list[Rec], n_parts: int) -> list[ms.Metrics]:
    """Replay ``recs`` in time order, each into its own part."""
    parts = [ms.Metrics(specs) for _ in range(n_parts)]
    for rec in recs:
        kwargs = {}
        if rec.weight is not None:
            kwargs["weight"] = rec.weight
        if rec.mask is not None:
            kwargs["mask"] = rec.mask
        parts[rec.part].record(name, rec.value, **kwargs)
        if rec.fold_after:
            parts[rec.part].compute()
    return parts


# ------------------------------------------------------------------ oracle


def plain_oracle(x: np.ndarray, w: np.ndarray) -> dict[str, float] | None:
    """The plain statistics of weighted samples (time order), or None without samples."""
    kept = w > 0
    if not kept.any():
        return None
    count = float(np.sum(w))
    total = float(np.sum(w * x))
    mean = total / count
    var = float(np.sum(w * (x - mean) ** 2) / count)
    return {
        "mean": mean,
        "sum": total,
        "count": count,
        "min": float(x[kept].min()),
        "max": float(x[kept].max()),
        "last": float(x[kept][-1]),
        "var": var,
        "std": math.sqrt(var),
    }


def samples_of(recs: list[Rec]) -> tuple[np.ndarray, np.ndarray]:
    if not recs:
        return np.zeros(0), np.zeros(0)
    return np.concatenate([r.x for r in recs]), np.concatenate([r.w for r in recs])


def expected_plain(spec: ms.Spec, name: str, stats: dict[str, float] | None) -> dict[str, float]:
    if stats is None:
        return {}
    return dict(zip(spec.output_keys(name), (stats[s] for s in spec.reduce)))


def assert_matches(got: dict[str, float], want: dict[str, float], scale: float) -> None:
    assert got.keys() == want.keys(), (got, want)
    for key, value in want.items():
        stat = key.rsplit("/", 1)[-1]
        tol = 1e-9 * max(1.0, scale) ** 2 if stat in ("var", "std") else 1e-9 * max(1.0, scale)
        if stat == "std":
            tol = math.sqrt(tol)
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=tol), (key, got[key], value)


def merge_all_ways(
    parts_a: list[ms.Metrics], parts_b: list[ms.Metrics], rnd: random.Random
) -> tuple[ms.Metrics, ms.Metrics]:
    """``ms.merge`` of ``parts_a`` and a chain of ``a.merge(b)`` over ``parts_b``, random orders.

    Also checks that ``ms.merge`` leaves every input, and ``a.merge(b)`` leaves ``b``, unchanged.
    """
    order = list(range(len(parts_a)))
    rnd.shuffle(order)
    before = [(p.to_bytes(), p.compute()) for p in parts_a]
    merged = ms.merge(parts_a[i] for i in order)
    after = [(p.to_bytes(), p.compute()) for p in parts_a]
    assert [b for b, _ in before] == [b for b, _ in after]
    assert all(same(x, y) for (_, x), (_, y) in zip(before, after))

    rnd.shuffle(order)
    acc = parts_b[order[0]]
    for i in order[1:]:
        other = parts_b[i]
        snapshot = other.to_bytes()
        assert acc.merge(other) is acc
        assert other.to_bytes() == snapshot
    return merged, acc


def check_state_laws(m: ms.Metrics) -> None:
    values = m.compute()
    assert same(ms.Metrics.from_bytes(m.to_bytes()).compute(), values)
    assert same(pickle.loads(pickle.dumps(m)).compute(), values)
    empty = ms.Metrics()
    assert same(m.copy().merge(empty).compute(), values)
    assert same(ms.merge([empty, m, ms.Metrics()]).compute(), values)
    assert empty.to_bytes() == ms.Metrics().to_bytes()
    assert same(m.compute(), values)


# ------------------------------------------------------------ plain stats


@st.composite
def plain_case(draw: st.DrawFn) -> tuple[ms.Spec, int, list[Rec], int]:
    reduce = draw(st.one_of(st.just(PLAIN), st.sampled_from(PLAIN).map(lambda s: (s,))))
    nan = draw(st.sampled_from(["propagate", "ignore", "error"]))
    spec = ms.Spec(reduce, nan=nan)
    n_parts = draw(st.integers(1, 6))
    weighting = draw(st.sampled_from(["none", "real"]))
    recs = draw(st.lists(a_record(n_parts, EIGHTHS, weighting), min_size=0, max_size=14))
    return spec, n_parts, recs, draw(st.integers(0, 2**32))


@SETTINGS
@given(plain_case())
def test_plain_statistics_under_any_partition_and_merge_order(
    case: tuple[ms.Spec, int, list[Rec], int],
) -> None:
    spec, n_parts, recs, seed = case
    name = "m/x"
    specs = {"m/*": spec}
    x, w = samples_of(recs)
    want = expected_plain(spec, name, plain_oracle(x, w))
    if spec.nan == "ignore" and want:
        want[f"{name}/nan_dropped"] = 0.0
    scale = float(np.abs(x).max()) if len(x) else 1.0

    merged, chained = merge_all_ways(
        build(specs, name, recs, n_parts), build(specs, name, recs, n_parts), random.Random(seed)
    )
    assert_matches(merged.compute(), want, scale)
    assert_matches(chained.compute(), want, scale)
    check_state_laws(merged)
    assert (name in merged) == bool(want)


# two sides' rules and records, and whether merging them must raise (None: a key the two
# define apart that no name either holds resolves through: no conflict, as in a sync, and
# the merge keeps the absorbing side's rule)
RULE_CASES = {
    "a name declared apart, one side holding it": (
        ({"x": ms.Spec("sum")}, []),
        ({"x": ms.Spec("max")}, [("x", 1.0), ("x", 2.0)]),
        True,
    ),
    "a slot emptied by reset, the other side's rule apart": (
        ({}, [("x", 1.0), ("reset", 0.0)]),
        ({"x": ms.Spec("max")}, []),
        True,
    ),
    "a name declared apart, neither holding it": (
        ({"x": ms.Spec("sum")}, []),
        ({"x": ms.Spec("max")}, []),
        None,
    ),
    "a glob defined apart, no name under it": (
        ({"timing/*": ms.Spec("max")}, [("loss", 0.0)]),
        ({"timing/*": ms.Spec("sum")}, [("loss", 1.0)]),
        None,
    ),
    "a glob defined apart": (
        ({"t/*": ms.Spec("sum")}, []),
        ({"t/*": ms.Spec("max")}, [("t/a", 3.0)]),
        True,
    ),
    "the same glob, other rules beside it": (
        ({"t/*": ms.Spec("max")}, [("t/a", 1.0)]),
        ({"t/*": ms.Spec("max"), "y": ms.Spec("min")}, [("t/a", 4.0), ("y", 2.0)]),
        False,
    ),
    "a held name under another side's glob": (
        ({"t/a": ms.Spec("max")}, [("t/a", 1.0)]),
        ({"t/*": ms.Spec("sum")}, [("t/b", 2.0)]),
        True,
    ),
    "a held name under another side's longer glob": (
        ({"t/*": ms.Spec("sum")}, []),
        ({"t/a*": ms.Spec("max")}, [("t/ab", 2.0)]),
        True,
    ),
    "a held name given the same spec by another side's rules": (
        ({"t/a": ms.Spec("max")}, [("t/a", 1.0)]),
        ({"t/*": ms.Spec("sum"), "t/a": ms.Spec("max")}, [("t/b", 2.0)]),
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(RULE_CASES))
def test_rules_merge_the_same_in_either_order(case: str) -> None:
    """A name either side holds that resolves to another spec on the other side conflicts
    whichever side absorbs the other (a sync raises on every rank there); otherwise both
    orders give the same results, and the same rules for later records unless a key is
    defined apart with no name under it."""
    (rules_a, recs_a), (rules_b, recs_b), conflict = RULE_CASES[case]

    def side(rules: dict[str, ms.Spec], recs: list[tuple[str, float]]) -> ms.Metrics:
        m = ms.Metrics(rules)
        for name, x in recs:
            if name == "reset":
                m.reset()  # the names keep their slots and specs, with no samples
            else:
                m.record(name, x)
        return m

    results = []
    for first, second in (
        ((rules_a, recs_a), (rules_b, recs_b)),
        ((rules_b, recs_b), (rules_a, recs_a)),
    ):
        for merge in (lambda p, q: ms.merge([p, q]), lambda p, q: p.merge(q)):
            try:
                merged = merge(side(*first), side(*second))
            except ms.SpecMismatchError:
                results.append("SpecMismatchError")
                continue
            before = merged.compute()
            for name in ("t/a", "t/b", "t/c", "x", "y"):
                merged.record(name, 10.0)  # each later record takes the merged rules
            later = (merged.compute(), [merged.spec(n) for n in ("t/c", "x", "y")])
            results.append((before, later if conflict is False else None))
    if conflict:
        assert results == ["SpecMismatchError"] * 4
    else:
        assert "SpecMismatchError" not in results and all(r == results[0] for r in results)


def _calls(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    """Count the calls of method ``name`` of ``cls``: the list's one item (the caller may
    set it back to 0)."""
    original = getattr(cls, name)
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(cls, name, counted)
    return calls


def _empty_merge_memories(monkeypatch: pytest.MonkeyPatch) -> None:
    """What merges keep per pair of tokens, empty for the test: a check of the second merge
    must not meet a memory that earlier tests' merges brought to its bound, where it starts
    over and forgets the first merge's pairs."""
    from metricsync._state._lru import LRU

    monkeypatch.setattr("metricsync._record._store._AGREED", LRU(64))


def test_a_pair_merged_again_is_checked_from_what_agreed_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same workers' results merged at every step: the second merge resolves no name
    against the rules again, gives the same result, and a pair that differs in a spec
    (another token) is checked, and raises, however often its neighbours agreed."""
    from metricsync._state._rules import SpecTable

    rules = {"t/*": ms.Spec("max"), "len": ms.Spec(("mean", "p50"))}

    def worker(rank: int, spec: ms.Spec | None = None) -> ms.Metrics:
        m = ms.Metrics(rules if spec is None else {**rules, "t/step": spec})
        for i in range(20):
            m.record(f"loss/{i}", float(i + rank))
        m.record("t/step", 0.1 * (rank + 1))
        m.record("len", [16.0 + rank, 300.0])
        if rank % 2:
            m.record(f"odd/{rank}", 1.0)
        return m

    _empty_merge_memories(monkeypatch)
    lookups = _calls(monkeypatch, SpecTable, "explicit")
    got = []
    for _ in range(2):
        parts = [worker(r) for r in range(4)]
        lookups[0] = 0
        got.append(ms.merge(parts).compute())
        got.append(lookups[0])
    assert got[0] == got[2] and got[1] > 0
    assert got[3] == 0  # before: every name of both sides at every merge
    for _ in range(2):  # a worker whose rules give t/step another spec: still a conflict
        with pytest.raises(ms.SpecMismatchError, match="'t/step'"):
            ms.merge([worker(0), worker(1), worker(2, ms.Spec("sum"))])


def test_decoded_results_merged_again_look_up_no_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single controller's step: the workers' results arrive decoded and are merged into
    a new result. From the second step the slots of their names are known by token (no
    name looked up); the result equals numpy over the samples, and it and the first part
    (whose names it takes) change apart."""
    from metricsync._state._table import StateTable

    def worker(rank: int) -> bytes:
        m = ms.Metrics({"t/*": ms.Spec("max"), "g": ms.Spec("mean", across="mean")})
        for i in range(5):
            m.record(f"loss/{i}", float(i * rank))
        m.record("t/step", 0.1 * (rank + 1))
        m.record("g", [1.0, 2.0 * rank])
        if rank % 2:
            m.record(f"odd/{rank}", float(rank))
        return m.to_bytes()

    blobs = [worker(r) for r in range(4)]
    want = {f"loss/{i}": float(np.mean([i * r for r in range(4)])) for i in range(5)}
    want |= {"t/step": 0.4, "odd/1": 1.0, "odd/3": 3.0}
    want["g"] = float(np.mean([np.mean([1.0, 2.0 * r]) for r in range(4)]))
    _empty_merge_memories(monkeypatch)
    lookups = _calls(monkeypatch, StateTable, "slots_of")
    seen = []
    for _ in range(2):
        parts = [ms.Metrics.from_bytes(b) for b in blobs]
        lookups[0] = 0
        result = ms.merge(parts)
        seen.append(lookups[0])
        got = result.compute()
        assert got.keys() == want.keys()
        assert all(math.isclose(got[k], want[k], rel_tol=1e-12) for k in want), got
    assert seen[0] > 0 and seen[1] == 0
    result.record("only/result", 1.0)
    parts[0].record("only/part", 2.0)
    assert "only/result" not in parts[0].compute() and "only/part" not in result.compute()
    assert ms.merge([ms.Metrics.from_bytes(b) for b in blobs]).compute() == got


def test_a_decoded_result_merges_from_its_own_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoded worker result has nothing to fold: a merge reads its table without a copy
    (before: one per part). The merge equals numpy over the samples, and afterwards the
    parts and the result change apart (records past a fold, a reset, new names)."""
    from metricsync._state._table import StateTable

    specs = {"len": ms.Spec(("mean", "max", "p50")), "g": ms.Spec("mean", across="max")}
    samples = {r: np.arange(1.0, 20.0 * (r + 1)) for r in range(4)}

    def worker(rank: int) -> ms.Metrics:
        m = ms.Metrics(specs)
        m.record("len", samples[rank])
        m.record("g", [1.0, 2.0 * rank])
        m.record("x", float(rank))
        return ms.Metrics.from_bytes(m.to_bytes())

    copies = _calls(monkeypatch, StateTable, "copy")
    parts = [worker(r) for r in range(4)]
    parts[3].record("x", 7.0)  # a part with a pending sample: folded into a snapshot
    copies[0] = 0
    result = ms.merge(parts)
    assert copies[0] == 1  # the part with a pending sample; before: 4
    pooled = np.concatenate(list(samples.values()))
    want = {"len/mean": float(pooled.mean()), "len/max": float(pooled.max())}
    want |= {"g": max(np.mean([1.0, 2.0 * r]) for r in range(4)), "x": np.mean([0, 1, 2, 3, 7])}
    got = result.compute()
    assert all(math.isclose(got[k], v, rel_tol=1e-12) for k, v in want.items()), got
    assert abs(got["len/p50"] / np.median(pooled) - 1) <= 0.011
    for part in parts:
        for _ in range(5000):  # past a number buffer's bound: a fold into the part's table
            part.record("x", 1e6)
        part.record("len", np.full(300, 1e6))
        part.record("new", 1.0)
    assert result.compute() == got
    for part in parts:
        part.reset()
    assert result.compute() == got
    result.record("len", [1e9])
    result.record("only/result", 1.0)
    for _ in range(2):  # a name the merge gave it: its number buffer opens at its record
        result.record("x", 100.0)
    assert math.isclose(result.compute()["x"], np.mean([0, 1, 2, 3, 7, 100, 100]))
    assert all(p.compute() == {} for p in parts)


def test_a_merge_reads_a_settled_source_under_its_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge reads a settled source's table itself, so a thread recording into the source
    meanwhile (past its buffer's bound: a fold into that table) waits for the merge. It is
    started between the merge's read of the state and of the sketches, and given half a
    second: without the source's lock its fold lands in the merged sketch alone."""
    import threading

    from metricsync._state._table import StateTable

    source = ms.Metrics({"len": ms.Spec(("mean", "p50"))})
    source.record("len", np.arange(1.0, 21.0))
    source = ms.Metrics.from_bytes(source.to_bytes())  # settled: nothing to fold
    want = source.compute()
    original = StateTable.merge_state
    recorder: list[threading.Thread] = []

    def record_past_a_fold() -> None:
        for _ in range(5000):
            source.record("len", 1e6)

    def merge_state(self: StateTable, slots: Any, cols: np.ndarray) -> None:
        original(self, slots, cols)
        if not recorder:  # the result's first merge: its sketches are read next
            recorder.append(threading.Thread(target=record_past_a_fold, daemon=True))
            recorder[0].start()
            recorder[0].join(timeout=0.5)

    monkeypatch.setattr(StateTable, "merge_state", merge_state)
    result = ms.Metrics().merge(source)
    assert result.compute() == want
    assert result.histograms()["len"].total == 20  # without the lock: 4,116 in the sketch
    recorder[0].join(timeout=30)
    assert not recorder[0].is_alive()
    assert source.compute()["len/p50"] == pytest.approx(1e6, rel=0.01)


def test_two_threads_merging_two_metrics_each_way_finish() -> None:
    """Each merge holds both objects' locks, taken in one order whichever way it runs. The
    locks are made to wait, once each thread holds its first, for the other thread to hold
    one too (up to a second): taken in the order of the call, each would hold one lock and
    wait for the other's for ever."""
    import threading

    holds = {"ab": threading.Event(), "ba": threading.Event()}

    class Gated:
        def __init__(self) -> None:
            self.lock = threading.RLock()

        def __enter__(self) -> Gated:
            self.lock.acquire()
            mine = holds.get(threading.current_thread().name)
            if mine is not None and not mine.is_set():
                mine.set()
                other = holds["ba" if threading.current_thread().name == "ab" else "ab"]
                other.wait(timeout=1.0)
            return self

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    a, b = ms.Metrics(), ms.Metrics()
    a.record("x", 1.0)
    b.record("x", 2.0)
    a._store.lock, b._store.lock = Gated(), Gated()  # type: ignore[assignment]
    threads = [
        threading.Thread(target=left.merge, args=(right,), name=name, daemon=True)
        for name, left, right in (("ab", a, b), ("ba", b, a))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert all(e.is_set() for e in holds.values())
    assert sorted([a.compute()["x"], b.compute()["x"]]) in ([4 / 3, 1.5], [1.5, 5 / 3])


def test_a_merge_of_empty_parts_leaves_room_to_record() -> None:
    """An empty result merged with empty parts (workers that recorded nothing) records,
    folds past a buffer's bound and merges into itself as a new one does."""
    results = [ms.merge([ms.Metrics()]), ms.Metrics().merge(ms.Metrics())]
    results.append(ms.merge([ms.Metrics.from_bytes(ms.Metrics().to_bytes())]))
    for r in results:
        for i in range(10_000):  # past the number buffer's bound: a fold into the table
            r.record("x", float(i))
        assert r.compute() == {"x": 4999.5}
        r.merge(r)
        assert r.compute() == {"x": 4999.5}
        r.record("y", 2.0)
        assert r.compute() == {"x": 4999.5, "y": 2.0}


def test_last_follows_record_time_not_merge_order() -> None:
    for reverse in (False, True):
        a, b = ms.Metrics({"lr": ms.Spec("last")}), ms.Metrics({"lr": ms.Spec("last")})
        a.record("lr", 1.0)
        a.record("lr", 2.0)
        b.record("lr", torch.tensor([3.0]))
        b.record("lr", 4.0)
        b.record("lr", 5.0)
        a.record("lr", 6.0)  # the latest sample lives in a, in its pending buffer
        a.record("lr", 7.0)
        parts = [b, a] if reverse else [a, b]
        assert ms.merge(parts).compute() == {"lr": 7.0}
        assert parts[0].merge(parts[1]).compute() == {"lr": 7.0}


def test_last_with_equal_times_keeps_the_larger_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "now_us", lambda: 1e15)  # force equal time stamps
    rows = []
    for value in (3.0, 5.0):
        m = ms.Metrics({"lr": ms.Spec("last")})
        m.record("lr", value)
        rows.append(m)
    assert ms.merge(rows).compute() == {"lr": 5.0}
    assert ms.merge(rows[::-1]).compute() == {"lr": 5.0}


# --------------------------------------------------------------- nan policy


@st.composite
def nan_case(draw: st.DrawFn) -> tuple[int, list[Rec], int, list[int]]:
    n_parts = draw(st.integers(1, 4))
    recs = draw(st.lists(a_record(n_parts, EIGHTHS, "real"), min_size=1, max_size=10))
    # make some samples non-finite after the fact (floats become NaN/inf, arrays get one)
    bad = draw(st.lists(st.integers(0, len(recs) - 1), max_size=4))
    return n_parts, recs, draw(st.integers(0, 2**32)), bad


def _poison(rec: Rec, which: float) -> Rec:
    x = rec.x.copy()
    if len(x) == 0 or isinstance(rec.value, int):
        return rec
    x[-1] = which
    if isinstance(rec.value, float):
        value: Any = float(which)
    elif isinstance(rec.value, list):
        value = np.array(rec.value, dtype=np.float64)
        value.reshape(-1)[-1] = which
        value = value.tolist()
    elif isinstance(rec.value, torch.Tensor):
        value = rec.value.clone()
        value.view(-1)[-1] = which
    else:
        value = rec.value.copy()
        value.reshape(-1)[-1] = which
    return Rec(rec.part, value, rec.weight, rec.mask, x, rec.w, rec.fold_after)


@SETTINGS
@given(nan_case(), st.sampled_from([math.nan, math.inf, -math.inf]))
def test_nan_ignore_drops_non_finite_samples(
    case: tuple[int, list[Rec], int, list[int]], which: float
) -> None:
    n_parts, recs, seed, bad = case
    for i in set(bad):
        recs[i] = _poison(recs[i], which)
    spec = ms.Spec(PLAIN, nan="ignore")
    name = "x"
    x, w = samples_of(recs)
    finite = np.isfinite(x)
    dropped = float(np.sum(~finite & (w > 0)))
    want = expected_plain(spec, name, plain_oracle(np.where(finite, x, 0.0), w * finite))
    if want or dropped:
        want[f"{name}/nan_dropped"] = dropped
    merged, chained = merge_all_ways(
        build({name: spec}, name, recs, n_parts),
        build({name: spec}, name, recs, n_parts),
        random.Random(seed),
    )
    scale = float(np.abs(x[finite]).max()) if finite.any() else 1.0
    assert_matches(merged.compute(), want, scale)
    assert_matches(chained.compute(), want, scale)
    check_state_laws(merged)


# ------------------------------------------------------------------ across


def across_oracle(
    spec: ms.Spec, name: str, per_part: list[tuple[np.ndarray, np.ndarray]]
) -> dict[str, float]:
    results = []
    for x, w in per_part:
        stats = plain_oracle(x, w)
        if stats is not None:  # ranks without samples are left out
            results.append([stats[s] for s in spec.reduce])
    if not results:
        return {}
    table = np.array(results)
    combine = {"mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max}[spec.across]
    return dict(zip(spec.output_keys(name), (float(v) for v in combine(table, axis=0))))


def _tree_merge(parts: list[ms.Metrics], rnd: random.Random) -> ms.Metrics:
    """Merge ``parts`` (each one rank) along a random binary tree."""
    pool = list(parts)
    while len(pool) > 1:
        i, j = sorted(rnd.sample(range(len(pool)), 2))
        right, left = pool.pop(j), pool.pop(i)
        pool.append(ms.merge([left, right]) if rnd.random() < 0.5 else ms.merge([right, left]))
    return pool[0] if pool else ms.Metrics()


@st.composite
def across_case(draw: st.DrawFn) -> tuple[ms.Spec, int, list[Rec], int]:
    reduce = draw(
        st.one_of(
            st.sampled_from(PLAIN).map(lambda s: (s,)),
            st.lists(st.sampled_from(PLAIN), min_size=2, max_size=4, unique=True).map(tuple),
        )
    )
    spec = ms.Spec(reduce, across=draw(st.sampled_from(["mean", "sum", "min", "max"])))
    n_parts = draw(st.integers(1, 6))
    recs = draw(st.lists(a_record(n_parts, EIGHTHS, "real"), min_size=0, max_size=12))
    return spec, n_parts, recs, draw(st.integers(0, 2**32))


@SETTINGS
@given(across_case())
def test_across_combines_per_rank_results(case: tuple[ms.Spec, int, list[Rec], int]) -> None:
    spec, n_parts, recs, seed = case
    name = "actor/pg_loss"
    per_part = [samples_of([r for r in recs if r.part == p]) for p in range(n_parts)]
    want = across_oracle(spec, name, per_part)
    x, _ = samples_of(recs)
    scale = float(np.abs(x).max()) * n_parts if len(x) else 1.0
    rnd = random.Random(seed)
    merged, chained = merge_all_ways(
        build({name: spec}, name, recs, n_parts), build({name: spec}, name, recs, n_parts), rnd
    )
    assert_matches(merged.compute(), want, scale)
    # a.merge(b): the first operand's own samples are its local rank, each other one a rank
    assert_matches(chained.compute(), want, scale)
    assert_matches(
        _tree_merge(build({name: spec}, name, recs, n_parts), rnd).compute(), want, scale
    )
    check_state_laws(merged)


def test_verl_sum_over_micro_batches_mean_over_ranks() -> None:
    spec = {"actor/pg_loss": ms.Spec(reduce="sum", across="mean")}
    ranks = [ms.Metrics(spec) for _ in range(4)]
    micro = [[0.5, 0.25], [1.0], [], [2.0, 2.0, 2.0]]  # rank 2 recorded nothing
    for rank, losses in zip(ranks, micro):
        for loss in losses:
            rank.record("actor/pg_loss", torch.tensor(loss))
    assert ms.merge(ranks).compute() == {"actor/pg_loss": pytest.approx((0.75 + 1.0 + 6.0) / 3)}


def test_across_recording_after_a_merge_is_the_local_rank() -> None:
    spec = {"x": ms.Spec("sum", across="mean")}
    a, b = ms.Metrics(spec), ms.Metrics(spec)
    a.record("x", 2.0)
    b.record("x", 4.0)
    merged = ms.merge([a, b])
    assert merged.compute() == {"x": 3.0}
    merged.record("x", 9.0)
    merged.record("x", 3.0)
    assert merged.compute() == {"x": pytest.approx((2.0 + 4.0 + 12.0) / 3)}


def test_across_max_of_quantity_every_rank_shares() -> None:
    ranks = [ms.Metrics({"lr": ms.Spec("last", across="max")}) for _ in range(3)]
    for r in ranks:
        r.record("lr", 3e-4)
    assert ms.merge(ranks).compute() == {"lr": 3e-4}


# --------------------------------------------------------------- quantiles


POSITIVE = st.floats(2.0**-12, 2.0**20, width=32, allow_subnormal=False)
QVALUES = st.one_of(st.just(0.0), POSITIVE, POSITIVE.map(lambda v: -v))
#: with infinities, a few times in ten (found p90 of [1, inf, inf] NaN, issue 42)
QVALUES_INF = st.one_of(QVALUES, QVALUES, st.sampled_from([math.inf, -math.inf]))


#: docs/definitions.md: a cumulative weight within a relative 2**-36 of a quantile's
#: boundary counts as on it (weights 1e-6 and 3e-6 sum apart from 4 * 1e-6 in float64)
TIE = Fraction(1, 2**36)


def _limit_lerp(x0: float, x1: float, frac: Fraction) -> float:
    """``x0 + frac (x1 - x0)`` and its limit at infinities (NaN only from -inf to +inf)."""
    if frac == 0 or x0 == x1:
        return x0
    if math.isinf(x0) and math.isinf(x1):
        return math.nan
    if math.isinf(x0) or math.isinf(x1):
        return x0 if math.isinf(x0) else x1
    return float(Fraction(x0) + frac * (Fraction(x1) - Fraction(x0)))


def quantile_oracle(
    x: np.ndarray, w: np.ndarray, q: float, method: str
) -> tuple[float, float, float, float]:
    """Brute force over the raw samples, in exact rationals (docs/definitions.md): the
    quantile, and the two samples and fraction it interpolates (for the error bound).

    Weights relative to their mean ``W / n`` (``n`` samples of positive weight), so that
    sample ``j`` is the first whose cumulative weight exceeds ``j W / n``; ``linear``:
    ``h = q (n - 1)`` between ``x_(floor h)`` and ``x_(floor h + 1)``; ``inverted_cdf``:
    the first sample whose cumulative weight reaches ``q W``. numpy's answers for unit
    weights (but where numpy meets ``inf - inf``).
    """
    keep = w > 0
    order = np.argsort(x[keep], kind="stable")
    xs, ws = x[keep][order].tolist(), [Fraction(v) for v in w[keep][order].tolist()]
    n, total = len(xs), sum(ws, Fraction(0))
    if q in (0.0, 1.0):
        v = xs[0] if q == 0.0 else xs[-1]
        return v, v, v, 0.0
    cum = list(itertools.accumulate(ws))
    q_exact = Fraction(repr(q))  # the decimal asked for: p90 is 9/10, not the double 0.9
    if method == "inverted_cdf":  # a boundary within a relative TIE counts as reached
        target = (q_exact - TIE) * total
        v = xs[min(next(i for i, c in enumerate(cum) if c >= target), n - 1)]
        return v, v, v, 0.0
    h = q_exact * (n - 1)
    below = math.floor(h)

    def at(j: int) -> float:  # the first sample whose cumulative weight exceeds j W / n
        bound = j * total * (1 + TIE)  # (within a relative TIE: on it, not past it)
        return xs[next((i for i, c in enumerate(cum) if c * n > bound), n - 1)]

    x0, x1 = at(below), at(below + 1)
    return _limit_lerp(x0, x1, h - below), x0, x1, float(h - below)


def assert_quantile_ok(
    got: float, q: float, x: np.ndarray, w: np.ndarray, method: str = "linear"
) -> None:
    """``got`` is the quantile of the weighted samples within the sketch's 1% accuracy:
    each order statistic is known within 1%, so a linear answer within 1% of the
    interpolation of their magnitudes; infinities and NaN exactly."""
    if np.isnan(x[w > 0]).any():
        assert math.isnan(got), (q, got)
        return
    want, x0, x1, frac = quantile_oracle(x, w, q, method)
    if q in (0.0, 1.0) or math.isnan(want) or math.isinf(want):
        assert got == want or (math.isnan(got) and math.isnan(want)), (q, got, want)
        return
    bound = 0.01 * ((1 - frac) * abs(x0) + (frac * abs(x1) if frac else 0.0))
    assert abs(got - want) <= bound * (1 + 1e-9) + 1e-300, (q, got, want, x0, x1)


@st.composite
def quantile_case(draw: st.DrawFn) -> tuple[int, list[Rec], int]:
    n_parts = draw(st.integers(1, 6))
    weighting = draw(st.sampled_from(["none", "integer", "real"]))
    recs = draw(st.lists(a_record(n_parts, QVALUES_INF, weighting), min_size=1, max_size=12))
    return n_parts, recs, draw(st.integers(0, 2**32))


@needs_sketch
@SETTINGS
@given(quantile_case(), st.sampled_from(["linear", "inverted_cdf"]))
def test_quantiles_under_any_partition_and_merge_order(
    case: tuple[int, list[Rec], int], method: str
) -> None:
    n_parts, recs, seed = case
    recs = [r for r in recs if not isinstance(r.value, int)]  # QVALUES are not integers
    spec = ms.Spec((*QUANTILES, "count", "p10", "p99.9"), quantile_method=method)
    name = "response_length"
    x, w = samples_of(recs)
    merged, chained = merge_all_ways(
        build({name: spec}, name, recs, n_parts),
        build({name: spec}, name, recs, n_parts),
        random.Random(seed),
    )
    for got in (merged.compute(), chained.compute()):
        if not (w > 0).any():
            assert got == {}
            continue
        assert got[f"{name}/count"] == w.sum()
        for stat in (*QUANTILES, "p10", "p99.9"):
            q = float(stat[1:]) / 100
            assert_quantile_ok(got[f"{name}/{stat}"], q, x, w, method)
    check_state_laws(merged)


# ------------------------------------------------------------ scale of the weights

#: every statistic that does not scale with the weights, both quantile definitions
SCALE_FREE = {
    "a": ms.Spec(("mean", "min", "max", "last", "var", "std", "p10", "p50", "p90"), ddof=1),
    "b": ms.Spec(("p10", "p50", "p90", "p99"), quantile_method="inverted_cdf"),
    "c": ms.Spec(("var", "std", "p25", "p75")),
}
SCALES = st.one_of(
    st.sampled_from([1e-6, 1e-3, 0.1, 1.0 / 3.0, 10.0, 1e3, 1e6]),
    st.floats(-6.0, 6.0).map(lambda e: 10.0**e),
)


def _scaled(rec: Rec, c: float) -> Rec:
    """``rec`` with every weight multiplied by ``c`` (a record without one: weight ``c``)."""
    weight = rec.weight
    if weight is None:
        weight = c
    elif isinstance(weight, torch.Tensor):
        weight = weight.to(torch.float64) * c
    elif isinstance(weight, np.ndarray):
        weight = weight.astype(np.float64) * c
    elif isinstance(weight, list):
        weight = (np.array(weight, dtype=np.float64) * c).tolist()
    else:
        weight = float(weight) * c
    return Rec(rec.part, rec.value, weight, rec.mask, rec.x, rec.w * c, rec.fold_after)


@st.composite
def scale_case(draw: st.DrawFn) -> tuple[str, int, list[Rec], int, float]:
    name = draw(st.sampled_from(sorted(SCALE_FREE)))
    n_parts = draw(st.integers(1, 4))
    weighting = draw(st.sampled_from(["none", "integer", "real"]))
    values = draw(st.sampled_from([EIGHTHS, QVALUES_INF]))
    recs = draw(st.lists(a_record(n_parts, values, weighting), min_size=1, max_size=10))
    return name, n_parts, recs, draw(st.integers(0, 2**32)), draw(SCALES)


@needs_sketch
@SETTINGS
@given(scale_case())
def test_scaling_every_weight_changes_no_statistic(
    case: tuple[str, int, list[Rec], int, float],
) -> None:
    """Weights count by their proportions: every weight times ``c`` (1e-6 to 1e6) leaves
    mean, extremes, last, var/std (ddof 0 and 1) and both quantile definitions as they
    were, up to rounding, through any partition and merge (before: linear quantiles
    collapsed to the minimum below a total weight of 1, and ``ddof=1`` gave NaN)."""
    name, n_parts, recs, seed, c = case
    specs = {name: SCALE_FREE[name]}
    x, w = samples_of(recs)
    scaled = [_scaled(r, c) for r in recs]
    order = list(range(n_parts))
    random.Random(seed).shuffle(order)
    got = ms.merge(build(specs, name, recs, n_parts)).compute()
    parts = build(specs, name, scaled, n_parts)
    again = ms.merge(parts[i] for i in order).compute()  # another merge order
    assert got.keys() == again.keys()
    kept = x[w > 0]
    scale = float(np.abs(kept[np.isfinite(kept)]).max(initial=1.0))
    for key in got:
        assert same(got[key], again[key], rel=1e-9, abs=1e-12 * scale**2), (
            key,
            c,
            got[key],
            again[key],
        )
    if not got:
        return
    spec = SCALE_FREE[name]
    for stat in spec.reduce:  # and against the oracles: np.cov's aweights, brute force
        if stat.startswith("p"):
            q = float(stat[1:]) / 100
            assert_quantile_ok(again[f"{name}/{stat}"], q, x, w * c, spec.quantile_method)
        elif stat == "var" and np.isfinite(kept).all() and len(kept) > spec.ddof:
            want = float(np.cov(x[w > 0], aweights=w[w > 0] * c, ddof=spec.ddof))
            assert math.isclose(again[f"{name}/var"], want, rel_tol=1e-9, abs_tol=1e-9 * scale**2)


@needs_sketch
def test_quantiles_of_a_large_sample() -> None:
    rng = np.random.default_rng(0)
    data = rng.lognormal(3.0, 1.0, size=200_000)
    parts = [ms.Metrics({"len": ms.Spec(QUANTILES)}) for _ in range(4)]
    for i, chunk in enumerate(np.array_split(data, 40)):
        value = torch.tensor(chunk) if i % 2 else chunk
        parts[i % 4].record("len", value)
    got = ms.merge(parts).compute()
    for stat in QUANTILES:
        assert_quantile_ok(got[f"len/{stat}"], float(stat[1:]) / 100, data, np.ones(data.size))


@needs_sketch
def test_quantile_across_mean() -> None:
    ranks = [ms.Metrics({"l": ms.Spec("p50", across="mean")}) for _ in range(2)]
    ranks[0].record("l", np.arange(1.0, 102.0))  # median 51
    ranks[1].record("l", np.arange(1001.0, 1102.0))  # median 1051
    got = ms.merge(ranks).compute()["l"]
    assert abs(got - 551.0) <= 0.01 * 1051


# ------------------------------------------------------ numerical stability


def test_std_of_large_offset_samples_is_stable() -> None:
    rng = np.random.default_rng(1)
    data = 1e9 + rng.normal(size=8 * 4096)
    chunks = np.array_split(data, 8)
    parts = []
    for i, chunk in enumerate(chunks):
        m = ms.Metrics({"x": ms.Spec(("std", "var", "mean"))})
        if i % 3 == 0:
            for v in chunk.tolist():  # Python floats: the buffered path
                m.record("x", v)
        elif i % 3 == 1:
            for piece in np.array_split(chunk, 7):
                m.record("x", piece)
        else:
            for piece in np.array_split(chunk, 5):
                m.record("x", torch.tensor(piece, dtype=torch.float64))
        parts.append(m)
    want = float(np.std(data))  # numpy is two-pass in float64
    for merged in (ms.merge(parts), ms.merge(parts[::-1])):
        got = merged.compute()
        assert got["x/std"] == pytest.approx(want, rel=1e-6)
        assert got["x/var"] == pytest.approx(want**2, rel=2e-6)
        assert got["x/mean"] == pytest.approx(float(np.mean(data)), rel=1e-15)
