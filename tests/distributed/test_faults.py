"""Fault injection across 2-4 gloo ranks: a correct result or an error, never a hang.

Every case ends, on every surviving rank and within the sync timeout, in a
result equal to brute force over the raw samples, or in ``SyncError`` /
``SpecMismatchError``:

- a rank that exits (``os._exit``) before a sync, and one that exits in the
  middle of a sync, between two of its collectives;
- a rank that never calls ``sync`` (and the next sync after that failure);
- a rank that hits ``nan="error"`` at ``record`` and lets the error end it;
- NaN under each ``nan`` policy, spec conflicts of every kind (recorded,
  declared only, across mode, glob), and a bad record caught on its rank:
  each followed by a sync that must be correct again in the same group;
- 200 randomized heterogeneous scenarios in a row in one process group:
  random names, specs (every statistic, every ``across`` mode, both NaN
  policies, glob rules), record kinds (fast-path numbers, numpy with
  weights, torch with masks, empty records), empty ranks, NaNs, reused
  ``Metrics`` over several rounds, and injected spec conflicts; each
  compared with brute force and checked identical on every rank.

The scenarios also run through sync's accelerator code path (torch
operations and device-resident states instead of numpy), on CPU tensors over
gloo, so the NCCL path's arithmetic is checked on machines without a GPU.

Ranks that are meant to die run under ``run_distributed(...,
allow_failures=True)``, which notices a rank whose process exited without
reporting at once and gives a ``RankFailure`` for it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync.testing import RankFailure, run_distributed  # noqa: E402

# ranks that die, hang or time out: minutes of waiting, so make test-slow (CI) runs them
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT = 4.0  # seconds each sync may wait for a missing rank
SLACK = 6.0  # what a SyncError may take beyond TIMEOUT
N_SCENARIOS = 200


def _timed_sync(m: ms.Metrics) -> tuple[str, float]:
    start = time.monotonic()
    try:
        m.sync(timeout=TIMEOUT)
    except ms.SyncError:
        return "SyncError", time.monotonic() - start
    return "ok", time.monotonic() - start


# ------------------------------------------------------------- dying ranks


def _exit_before_sync(rank: int, world: int) -> Any:
    m = ms.Metrics({"n": ms.Spec(("sum", "max"))})
    for step in range(3):
        m.reset()
        m.record("n", float(rank + step))
        got = m.sync(timeout=TIMEOUT).compute()
        want = [float(r + step) for r in range(world)]
        assert got == {"n/sum": sum(want), "n/max": max(want)}
    if rank == world - 1:
        os._exit(3)  # dies holding data, before the fourth sync
    return [_timed_sync(m), _timed_sync(m)]  # and the next attempt fails as fast


def _exit_mid_sync(rank: int, world: int) -> Any:
    import metricsync._sync._comm

    m = ms.Metrics({"q": ms.Spec(("p50", "mean"))})
    m.record("q", np.arange(100.0) * (rank + 1))
    m.sync(timeout=TIMEOUT)
    m.record(f"new/{rank}", 1.0)  # new names: the next sync agrees on them in three gathers
    if rank == 1:  # dies after the first collective (a gather or a reduce), mid-sync
        comm = metricsync._sync._comm.Comm
        gather, reduce = comm.all_gather, comm.all_reduce
        calls = []

        def dying(original: Any) -> Any:
            def call(self: Any, array: Any, *rest: Any) -> Any:
                calls.append(rest[-1])  # what the collective is
                if len(calls) == 2:
                    os._exit(4)
                return original(self, array, *rest)

            return call

        comm.all_gather = dying(gather)  # type: ignore[method-assign]
        comm.all_reduce = dying(reduce)  # type: ignore[method-assign]
    return [_timed_sync(m)]


@pytest.mark.usefixtures("sync_path")
@pytest.mark.parametrize("fn, world", [(_exit_before_sync, 3), (_exit_mid_sync, 4)])
def test_a_rank_that_exits_makes_the_others_raise_sync_error(fn: Any, world: int) -> None:
    results = run_distributed(fn, world, timeout=60, allow_failures=True)
    dead = [r for r, res in enumerate(results) if isinstance(res, RankFailure) and res.exitcode]
    assert dead == [world - 1 if fn is _exit_before_sync else 1], results
    for rank, res in enumerate(results):
        if rank in dead:
            continue
        for outcome, seconds in res:
            assert outcome == "SyncError" and seconds < TIMEOUT + SLACK, (rank, res)


# ---------------------------------------------- absent and failing ranks


def _never_syncs(rank: int, world: int) -> Any:
    m = ms.Metrics()
    m.record("x", 1.0)
    if rank == 2:
        time.sleep(2 * TIMEOUT + 2.0)  # never calls sync; outlives both attempts
        return "absent"
    return [_timed_sync(m), _timed_sync(m)]


def _error_ends_a_rank(rank: int, world: int) -> Any:
    m = ms.Metrics({"kl": ms.Spec("mean", nan="error")})
    m.record("kl", 0.5)
    if rank == 0:
        m.record("kl", [1.0, math.nan])  # ValueError at record; not caught: the rank ends
    return [_timed_sync(m)]


@pytest.mark.usefixtures("sync_path")
def test_a_rank_that_never_syncs_or_fails_makes_the_others_raise_in_time() -> None:
    results = run_distributed(_never_syncs, 4, timeout=60, allow_failures=True)
    assert results[2] == "absent"
    for rank in (0, 1, 3):
        for outcome, seconds in results[rank]:
            assert outcome == "SyncError" and seconds < TIMEOUT + SLACK, (rank, results[rank])

    results = run_distributed(_error_ends_a_rank, 3, timeout=60, allow_failures=True)
    failure = results[0]
    assert isinstance(failure, RankFailure) and "ValueError: metric 'kl'" in str(failure.traceback)
    for rank in (1, 2):
        ((outcome, seconds),) = results[rank]
        assert outcome == "SyncError" and seconds < TIMEOUT + SLACK, (rank, results[rank])


# ---------------------------------- NaN policies and conflicts, one group


def _nan_and_conflicts(rank: int, world: int) -> list[str]:
    import metricsync._record._convert

    done = []
    finite = [1.0 + rank, 2.0 * rank]
    specs = {
        "p": ms.Spec(("mean", "max", "count", "p50")),
        "pa": ms.Spec("mean", across="max"),
        "i": ms.Spec(("mean", "min", "count"), nan="ignore"),
        "ia": ms.Spec("mean", across="mean", nan="ignore"),
        "e": ms.Spec(("sum", "count"), nan="error"),
    }
    m = ms.Metrics(specs)
    m.record("p", [*finite, math.nan] if rank == 1 else finite)
    m.record("pa", math.nan if rank == 2 else 1.0)
    m.record("i", finite + [math.nan] * rank)  # rank r drops r NaNs
    m.record("ia", [math.nan] if rank == 0 else [float(rank)])  # rank 0: no sample left
    m.record("e", finite)
    if rank == 3:
        with pytest.raises(ValueError, match="'e'"):
            m.record("e", torch.tensor([5.0, math.nan]))  # host data: raises at record
    got = m.sync(timeout=30).compute()
    everyone = [v for r in range(world) for v in (1.0 + r, 2.0 * r)]
    assert got["p/count"] == len(everyone) + 1 and math.isnan(got["p/max"])
    assert all(math.isnan(got[k]) for k in ("p/mean", "p/p50", "pa"))
    assert got["i/mean"] == pytest.approx(np.mean(everyone)) and got["i/min"] == 0.0
    assert got["i/count"] == len(everyone) and got["i/nan_dropped"] == sum(range(world))
    assert got["ia"] == pytest.approx(np.mean(range(1, world))) and got["ia/nan_dropped"] == 1.0
    assert got["e/sum"] == pytest.approx(sum(everyone))  # the failed record left nothing
    done.append("nan policies")

    # a device record under nan="error" fails at sync: on its rank ValueError, elsewhere SyncError
    metricsync._record._convert.HOST_DEVICE_TYPES = (
        frozenset()
    )  # treat CPU tensors as accelerator ones
    try:
        d = ms.Metrics(specs)
        d.record("e", torch.tensor([1.0, math.nan] if rank == 1 else [1.0]))
        expected = ValueError if rank == 1 else ms.SyncError
        with pytest.raises(expected, match="'e'" if rank == 1 else "another rank"):
            d.sync(timeout=30)
    finally:
        metricsync._record._convert.HOST_DEVICE_TYPES = frozenset({"cpu"})
    done.append("device error")

    conflicts = {
        "recorded": ({"c": ms.Spec("max" if rank == 2 else "mean")}, ["c"]),
        "declared only": ({"d": ms.Spec("min")} if rank == 0 else {}, ["d"] if rank else []),
        "across": ({"a": ms.Spec("sum", across="mean" if rank == 1 else "exact")}, ["a"]),
        "glob": ({"t/*": ms.Spec("max")} if rank == 3 else {}, ["t/x"] if rank != 3 else []),
        "quantile accuracy": ({"q": ms.Spec("p50", accuracy=0.02 if rank else 0.01)}, ["q"]),
    }
    for label, (rules, names) in conflicts.items():
        c = ms.Metrics(rules)
        c.record("ok", 1.0)
        for name in names:
            c.record(name, 1.0)
        with pytest.raises(ms.SpecMismatchError):
            c.sync(timeout=30)
        # the group is still usable, and correct
        again = ms.Metrics()
        again.record("ok", float(rank))
        assert again.sync(timeout=30).compute() == {"ok": np.mean(range(world))}
        done.append(label)
    return done


@pytest.mark.usefixtures("sync_path")
def test_nan_policies_and_spec_conflicts_end_correctly_in_one_group() -> None:
    results = run_distributed(_nan_and_conflicts, 4, timeout=120)
    assert all(r == results[0] for r in results) and len(results[0]) == 7


# ------------------------------------------------ randomized scenarios

STATS = ("mean", "sum", "count", "min", "max", "last", "std", "var", "p0", "p50", "p90", "p100")
ACROSS = ("exact", "exact", "exact", "mean", "sum", "min", "max")
QUANTILE_TOL = 0.0101


def _spec(rng: np.random.Generator) -> ms.Spec:
    stats = tuple(rng.choice(STATS, int(rng.integers(1, 4)), replace=False).tolist())
    return ms.Spec(
        stats, across=str(rng.choice(ACROSS)), nan=str(rng.choice(["propagate", "ignore"]))
    )


def _plan(seed: int, world: int) -> dict[str, Any]:
    """One scenario, the same on every rank: specs, rounds of per-rank records, a conflict."""
    rng = np.random.default_rng(seed)
    names = [f"m{i}" for i in range(int(rng.integers(1, 5)))] + ["g/a", "g/b"][
        : int(rng.integers(0, 3))
    ]
    rules = {n: _spec(rng) for n in names if not n.startswith("g/")}
    rules["g/*"] = _spec(rng)
    conflict = None
    if rng.random() < 0.1:
        conflict = (int(rng.integers(world)), str(rng.choice(names)))
    rounds = []
    for _ in range(1 if conflict else int(rng.integers(1, 4))):
        per_rank = []
        for _rank in range(world):
            records = []
            if rng.random() > 0.15:  # else an empty rank
                for name in names:
                    if rng.random() < 0.3:
                        continue
                    for _ in range(int(rng.integers(1, 4))):
                        n = int(rng.integers(0, 7))
                        x = np.round(rng.normal(0.0, 10.0, n), 3)
                        if n and rng.random() < 0.1:
                            x[int(rng.integers(n))] = math.nan
                        kind = str(rng.choice(["fast", "numpy", "torch"]))
                        w = rng.integers(0, 4, n).astype(float) if rng.random() < 0.4 else None
                        if kind == "torch" and w is not None:
                            w = (w > 0).astype(float)  # a mask
                        if kind == "fast":
                            w = None
                        records.append((name, kind, x.tolist(), None if w is None else w.tolist()))
            per_rank.append(records)
        rounds.append(per_rank)
    return {"rules": rules, "rounds": rounds, "conflict": conflict}


def _record(m: ms.Metrics, records: list[Any]) -> None:
    for name, kind, x, w in records:
        if kind == "fast":
            for v in x:
                m.record(name, float(v))
        elif kind == "numpy":
            m.record(name, np.array(x), weight=None if w is None else np.array(w))
        else:
            mask = None if w is None else torch.tensor(w, dtype=torch.bool)
            m.record(name, torch.tensor(x, dtype=torch.float64), mask=mask)


def _samples(records: list[Any], name: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ws = [], []
    for n, _, x, w in records:
        if n == name:
            xs += x
            ws += [1.0] * len(x) if w is None else w
    return np.array(xs, dtype=float), np.array(ws, dtype=float)


def _bounds(stat: str, x: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """[lo, hi] the library's answer must lie in, for samples x with weights w (some w > 0)."""
    keep = w > 0
    xk, wk = x[keep], w[keep]
    if np.isnan(xk).any() and stat != "count" and stat != "last":
        return math.nan, math.nan
    total = wk.sum()
    mean = float(np.sum(wk * xk) / total)
    if stat in ("mean", "sum", "count", "var", "std"):
        var = float(np.sum(wk * (xk - mean) ** 2) / total)
        value = {"mean": mean, "sum": float(np.sum(wk * xk)), "count": float(total)}.get(stat)
        value = value if value is not None else (var if stat == "var" else math.sqrt(var))
        return value, value
    if stat in ("min", "max", "last"):
        value = float({"min": xk.min(), "max": xk.max(), "last": xk[-1]}[stat])
        return value, value
    q = float(stat[1:]) / 100.0
    if q in (0.0, 1.0):
        value = float(xk.min() if q == 0.0 else xk.max())
        return value, value
    # linear, weights relative to their mean W / n (docs/definitions.md): h = q (n - 1)
    # between the samples whose cumulative weight first exceeds floor(h) W / n and the next
    order = np.argsort(xk, kind="stable")
    xs, cum = xk[order], np.cumsum(wk[order])
    n = len(xs)
    h = q * (n - 1)
    near = []
    for j in (math.floor(h), min(math.floor(h) + 1, n - 1)):
        for tie in (1 - 1e-9, 1 + 1e-9):  # a boundary met up to rounding: either side
            past = np.flatnonzero(cum * n > j * cum[-1] * tie)
            near.append(float(xs[past[0]] if len(past) else xs[-1]))
    lo, hi = min(near), max(near)
    return lo - QUANTILE_TOL * abs(lo), hi + QUANTILE_TOL * abs(hi)


def _expected(plan: dict[str, Any], per_rank: list[list[Any]]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    table = ms.Metrics(plan["rules"])
    names = sorted({r[0] for records in per_rank for r in records})
    for name in names:
        spec = table.spec(name)
        parts, dropped = [], 0
        for records in per_rank:
            x, w = _samples(records, name)
            if spec.nan == "ignore":
                bad = ~np.isfinite(x) & (w > 0)
                dropped += int(bad.sum())
                w = np.where(bad, 0.0, w)
            if (w > 0).any():
                parts.append((x, w))
        keys = spec.output_keys(name)
        if parts and spec.across == "exact":
            x = np.concatenate([p[0] for p in parts])
            w = np.concatenate([p[1] for p in parts])
            for key, stat in zip(keys, spec.reduce):
                out[key] = _bounds(stat, x, w)
        elif parts:
            combine = {"mean": np.mean, "sum": np.sum, "max": np.max, "min": np.min}[spec.across]
            for key, stat in zip(keys, spec.reduce):
                bounds = np.array([_bounds(stat, x, w) for x, w in parts])
                out[key] = (float(combine(bounds[:, 0])), float(combine(bounds[:, 1])))
        if spec.nan == "ignore" and (dropped or parts):
            out[f"{name}/nan_dropped"] = (float(dropped), float(dropped))
    return out


def _within(got: float, lo: float, hi: float) -> bool:
    if math.isnan(lo):
        return math.isnan(got)
    if math.isinf(lo) and lo == hi:
        return got == lo
    tol = 1e-9 * max(1.0, abs(lo), abs(hi))
    return lo - tol <= got <= hi + tol


def _digest(values: dict[str, float]) -> Any:
    text = json.dumps(sorted((k, repr(v)) for k, v in values.items()))
    return torch.frombuffer(bytearray(hashlib.sha256(text.encode()).digest()), dtype=torch.uint8)


def _scenarios(rank: int, world: int, count: int, seed0: int) -> dict[str, int]:
    tally = {"scenarios": 0, "rounds": 0, "conflicts": 0, "keys": 0}
    for seed in range(seed0, seed0 + count):
        plan = _plan(seed, world)
        rules = dict(plan["rules"])
        conflict = plan["conflict"]
        if conflict is not None and conflict[0] == rank:  # this rank disagrees on one name
            name = conflict[1]
            own = ms.Metrics(rules).spec(name)
            rules[name] = ms.Spec("max" if own.reduce != ("max",) else "min", nan=own.nan)
        m = ms.Metrics(rules)
        for per_rank in plan["rounds"]:
            m.reset()
            for r in range(world):  # ranks record in turn, so "last" has a global order
                if r == rank:
                    _record(m, per_rank[rank])
                    time.sleep(0.001)  # the clock passes this rank's (strictly increasing) stamps
                dist.barrier()
            if conflict is not None:
                # a conflict shows once any rank holds the name: the rank that disagrees
                # either holds it itself or has a rule for a name another rank holds
                held = any(rec[0] == conflict[1] for records in per_rank for rec in records)
                try:
                    m.sync(timeout=30)
                except ms.SpecMismatchError:
                    assert held, (seed, "a conflict on a name no rank holds")
                    tally["conflicts"] += 1
                else:
                    assert not held, (seed, "a conflict went unnoticed")
                continue
            before = m.to_bytes()
            got = m.sync(timeout=30).compute()
            assert m.to_bytes() == before, (seed, "sync changed its input")
            want = _expected(plan, per_rank)
            assert got.keys() == want.keys(), (seed, sorted(got.keys() ^ want.keys()))
            for key, (lo, hi) in want.items():
                assert _within(got[key], lo, hi), (seed, key, got[key], lo, hi)
            digest = _digest(got)
            gathered = [torch.empty_like(digest) for _ in range(world)]
            dist.all_gather(gathered, digest)
            assert all(bool((g == digest).all()) for g in gathered), (seed, "ranks differ")
            tally["rounds"] += 1
            tally["keys"] += len(want)
        tally["scenarios"] += 1
    return tally


def _scenarios_on_torch_ops(rank: int, world: int, count: int, seed0: int) -> dict[str, int]:
    """The scenarios through sync's accelerator path (device states, buffers moved as for
    NCCL), on CPU."""
    import metricsync._record._convert
    import metricsync._sync._comm

    original = metricsync._sync._comm.Comm.__init__

    def device_path(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.host = False

    metricsync._sync._comm.Comm.__init__ = device_path  # type: ignore[method-assign]
    metricsync._record._convert.HOST_DEVICE_TYPES = frozenset()  # CPU tensors as accelerator ones
    return _scenarios(rank, world, count, seed0)


@pytest.mark.usefixtures("sync_path")
@pytest.mark.parametrize(
    "fn, world, count",
    [(_scenarios, 3, N_SCENARIOS), (_scenarios_on_torch_ops, 2, 50)],
    ids=["numpy path, 3 ranks", "torch path, 2 ranks"],
)
def test_randomized_heterogeneous_scenarios_match_brute_force(
    fn: Any, world: int, count: int
) -> None:
    results = run_distributed(fn, world, args=(count, 50_000), timeout=240)
    assert all(r == results[0] for r in results)
    tally = results[0]
    assert tally["scenarios"] == count and tally["conflicts"] >= count // 40
    assert tally["rounds"] > count and tally["keys"] > 10 * count
