"""The straggler view, ``Spec(argrank=True)``, on 3 and 4 gloo ranks against brute force.

Every rank regenerates every rank's raw samples from a shared seed, records
its own, syncs, and the ranks holding the largest and smallest sample are
found again by brute force over the raw samples (lowest rank on ties; under
``nan="propagate"`` a NaN is both the largest and the smallest). The same run
checks that the ranks ride in the state gather (no extra collective, exactly
the extra words expected), what ``merge`` and local records do with synced
ranks, the binary format, and ``metricsync show --ranks`` over a real
Tracker log.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _compare import same

torch = pytest.importorskip("torch")

import metricsync as ms  # noqa: E402
from metricsync.testing import count_collectives, run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
NAN = math.nan
INF = math.inf

SPECS = {
    "timing/step": ms.Spec("max", argrank=True, fmt=".3f"),  # carries min for its rank only
    "timing/gen": ms.Spec(("min", "max", "mean"), argrank=True, nan="ignore"),
    "len": ms.Spec(("min", "p50", "max"), argrank=True),  # a sketch metric
    "loss": ms.Spec(("min", "max"), argrank=True, nan="error"),
    "plain": ms.Spec(("min", "max")),  # no argrank: no rank keys
    "pg": ms.Spec("sum", across="mean"),  # an aggregate after the state columns
}
RANKED = [name for name, spec in SPECS.items() if spec.argrank]
#: words an argrank sync sends beyond the same specs without it: two ranks per argrank
#: metric, and the minimum of timing/step (a max-only spec), which only its rank needs
EXTRA_WORDS = 2 * len(RANKED) + 1
TRIALS = 30

P_VALUES = np.array([1, 3, 3, 3, 3, 1, 1]) / 15
Samples = dict[str, tuple[np.ndarray, np.ndarray]]


def _rank_data(seed: int, trial: int, rank: int) -> Samples:
    """One rank's raw samples and weights per metric: few distinct values (ties), NaN, inf,
    zero weights, names missing, and now and then a rank with nothing at all."""
    rng = np.random.default_rng([seed, trial, rank])
    data: Samples = {}
    if rng.random() < 0.15:
        return data
    for name, spec in SPECS.items():
        if rng.random() < 0.25:
            continue
        n = int(rng.integers(1, 6))
        if spec.nan == "error":
            values = rng.choice([-1.0, 0.0, 2.0, 3.0], n)
        else:
            values = rng.choice([-INF, -1.0, 0.0, 2.0, 3.0, INF, NAN], n, p=P_VALUES)
        weights = rng.choice([0.0, 1.0, 2.0], n) if rng.random() < 0.4 else np.ones(n)
        data[name] = (values, weights)
    return data


def _record(m: ms.Metrics, data: Samples, rank: int) -> None:
    for i, (name, (values, weights)) in enumerate(sorted(data.items())):
        path = (i + rank) % 3
        if path == 0:
            m.record(name, values, weight=weights)
        elif path == 1:
            m.record(name, torch.tensor(values), weight=torch.tensor(weights))
        else:  # Python floats; the unweighted ones take the fast path
            for v, w in zip(values.tolist(), weights.tolist()):
                m.record(name, v) if w == 1.0 else m.record(name, v, weight=w)


def _extreme(kept: list[np.ndarray], largest: bool) -> tuple[float, int]:
    """The extreme over the union of ``kept`` (one array per rank) and the lowest rank holding it."""
    nan_ranks = [r for r, v in enumerate(kept) if np.isnan(v).any()]
    if nan_ranks:
        return NAN, nan_ranks[0]
    per_rank = {r: (v.max() if largest else v.min()) for r, v in enumerate(kept) if len(v)}
    best = max(per_rank.values()) if largest else min(per_rank.values())
    return float(best), min(r for r, x in per_rank.items() if x == best)


def _expected(per_rank: list[Samples]) -> dict[str, tuple[float, int, float, int]]:
    """name -> (max, max rank, min, min rank) for every argrank name some rank holds samples of."""
    out = {}
    for name in RANKED:
        kept = []
        for data in per_rank:
            values, weights = data.get(name, (np.zeros(0), np.zeros(0)))
            values = values[weights > 0]
            if SPECS[name].nan == "ignore":
                values = values[np.isfinite(values)]
            kept.append(values)
        if any(len(v) for v in kept):
            out[name] = (*_extreme(kept, True), *_extreme(kept, False))
    return out


def _union(parts: list[Samples]) -> Samples:
    """One rank's samples of several steps together."""
    out: Samples = {}
    for data in parts:
        for name, (values, weights) in data.items():
            old_values, old_weights = out.get(name, (np.zeros(0), np.zeros(0)))
            out[name] = (np.append(old_values, values), np.append(old_weights, weights))
    return out


def _value_keys(name: str) -> tuple[str | None, str | None]:
    """The keys of ``name``'s max and min statistics (None where the spec has none)."""
    spec = SPECS[name]
    keys = dict(zip(spec.reduce, spec.output_keys(name)))
    return keys.get("max"), keys.get("min")


def _without_argrank(spec: ms.Spec) -> ms.Spec:
    return ms.Spec(spec.reduce, across=spec.across, fmt=spec.fmt, nan=spec.nan)


def _ranks_of(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if k.endswith(("/max_rank", "/min_rank"))}


def _worker(rank: int, world: int, seed: int, log_dir: str) -> dict[str, Any]:
    synced, windows = [], []
    window = ms.Metrics(SPECS)
    for trial in range(TRIALS):
        m = ms.Metrics(SPECS)
        _record(m, _rank_data(seed, trial, rank), rank)
        assert not _ranks_of(m.compute()), "ranks before any sync"
        g = m.sync(timeout=60)
        synced.append(g.compute())
        window.merge(g)  # synced results of one group, merged over steps
        windows.append(window.compute())
    roundtrip = ms.Metrics.from_bytes(g.to_bytes()).compute()

    # a sample no sync has seen carries no rank: its extreme hides the key, a smaller one not
    g = ms.Metrics({"t": ms.Spec("max", argrank=True)})
    g.record("t", float(rank + 1))
    g = g.sync()
    local = {}
    for value in (1.5, 100.0):
        g.record("t", value)
        local[value] = _ranks_of(g.compute())
    # a synced result synced again counts in the group of the new sync
    resynced = _ranks_of((g if rank == world - 1 else ms.Metrics()).sync().compute())

    # no extra collective: steady syncs of the same samples with and without argrank
    counts = []
    # (without the sketch metric: the cells it sends follow the range seen so far)
    no_sketch = {n: s for n, s in SPECS.items() if not s.needs_sketch}
    for specs in ({n: _without_argrank(s) for n, s in no_sketch.items()}, no_sketch):
        m = ms.Metrics(specs)
        for name in specs:
            m.record(name, [1.0 + rank, -2.0 * rank])
        m.sync()  # agrees the layout
        with count_collectives() as seen:
            m.sync()
        counts.append((dict(seen.calls), seen.bytes))

    if rank == 0:
        with ms.Tracker(backends=("jsonl",), run_dir=log_dir) as tracker:
            for step in (1, 2):
                m = ms.Metrics(SPECS)
                _record(m, _rank_data(seed, step, rank), rank)
                tracker.log(m.sync(), step=step)
    else:
        for step in (1, 2):
            m = ms.Metrics(SPECS)
            _record(m, _rank_data(seed, step, rank), rank)
            m.sync()
    return {
        "synced": synced,
        "windows": windows,
        "roundtrip": roundtrip,
        "local": local,
        "resynced": resynced,
        "counts": counts,
    }


def _check_values(got: dict[str, float], want: dict[str, tuple[float, int, float, int]]) -> None:
    expected_ranks = {}
    for name, (vmax, rmax, vmin, rmin) in want.items():
        expected_ranks[f"{name}/max_rank"] = float(rmax)
        expected_ranks[f"{name}/min_rank"] = float(rmin)
        kmax, kmin = _value_keys(name)
        for key, value in ((kmax, vmax), (kmin, vmin)):
            if key is not None:
                assert got[key] == value or (math.isnan(got[key]) and math.isnan(value)), key
    assert _ranks_of(got) == expected_ranks


@pytest.mark.parametrize("world", [3, 4])
def test_argrank_matches_brute_force(world: int, tmp_path: Path, sync_path: str) -> None:
    seed = 1000 + world
    results = run_distributed(_worker, world, args=(seed, str(tmp_path)), timeout=120)
    per_trial = [[_rank_data(seed, t, r) for r in range(world)] for t in range(TRIALS)]
    ranked_trials = 0
    for out in results:
        assert out["synced"] == results[0]["synced"] or same(out["synced"], results[0]["synced"])
        for trial, got in enumerate(out["synced"]):
            want = _expected(per_trial[trial])
            ranked_trials += bool(want)
            _check_values(got, want)
        for trial, got in enumerate(out["windows"]):  # merge over steps = sync of the union
            union = [_union([per_trial[t][r] for t in range(trial + 1)]) for r in range(world)]
            _check_values(got, _expected(union))
        assert _ranks_of(out["roundtrip"]) == _ranks_of(out["synced"][-1])
        assert out["local"][1.5] == {"t/max_rank": world - 1.0, "t/min_rank": 0.0}
        assert out["local"][100.0] == {"t/min_rank": 0.0}
        assert out["resynced"] == {"t/max_rank": world - 1.0, "t/min_rank": world - 1.0}
        (plain_calls, plain_bytes), (ranked_calls, ranked_bytes) = out["counts"]
        if sync_path == "reduce":  # a MAX and a SUM; a third MAX where ranks tie
            assert plain_calls == {"all_reduce": 2} and ranked_calls["all_reduce"] in (2, 3)
            continue
        # one gather (gloo's all-to-all form of it); the cells ride along
        assert plain_calls == ranked_calls == {"all_to_all_single": 1}
        assert ranked_bytes - plain_bytes == 8 * (EXTRA_WORDS - 2)  # "len" left out
    assert ranked_trials > TRIALS  # most trials had samples to rank
    _check_show_ranks(tmp_path, seed, world)


def _check_show_ranks(log_dir: Path, seed: int, world: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "metricsync", "show", str(log_dir), "--ranks", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:  # non-finite values travel as strings ("nan", "-inf")
        got = {key: float(value) for key, value in row["values"].items()}
        want = _expected([_rank_data(seed, row["step"], r) for r in range(world)])
        _check_values(got, want)
        shown = set()
        for name in want:
            shown |= {k for k in _value_keys(name) if k is not None}
            shown |= {f"{name}/max_rank", f"{name}/min_rank"}
        assert set(got) == shown


def _lacking_worker(rank: int, world: int) -> list[dict[str, float]]:
    specs = {"a": ms.Spec("mean"), "t": ms.Spec(("min", "max"), argrank=True)}
    out = []
    for _ in range(2):  # the first sync agrees the layout; the second packs into it
        m = ms.Metrics(specs)
        m.record("a", 1.0)  # slot 0 holds samples on every rank
        if rank == world - 1:
            m.record("t", [-INF, -INF])  # extremes equal to "no samples"
        out.append(m.sync(timeout=60).compute())
    return out


@pytest.mark.usefixtures("sync_path")
def test_a_rank_lacking_a_name_claims_none_of_its_extremes() -> None:
    """Ranks without the name tie with its holder's -inf maximum: only the holder's rank
    may be named (the lowest rank wins ties, so a lacking rank that claimed would win)."""
    for out in run_distributed(_lacking_worker, 3, timeout=120):
        for got in out:
            assert got == {
                "a": 1.0,
                "t/min": -INF,
                "t/max": -INF,
                "t/max_rank": 2.0,
                "t/min_rank": 2.0,
            }


@pytest.mark.parametrize("across", ["mean", "sum", "min", "max", "first"])
def test_argrank_needs_pooled_samples(across: str) -> None:
    with pytest.raises(ValueError, match="argrank needs across='exact'"):
        ms.Spec("max", across=across, argrank=True)


def test_a_sync_without_a_process_group_is_rank_0s() -> None:
    m = ms.Metrics({"t": ms.Spec(("min", "max"), argrank=True)})
    m.record("t", [2.0, 5.0])
    assert m.compute() == {"t/min": 2.0, "t/max": 5.0}  # ranks are known after a sync
    ranked = {"t/min": 2.0, "t/max": 5.0, "t/max_rank": 0.0, "t/min_rank": 0.0}
    assert m.sync().compute() == ranked  # one rank's sync (tests/distributed/test_sync_alone.py)
    assert m.key_formats()["t/max_rank"] == ",.0f"
