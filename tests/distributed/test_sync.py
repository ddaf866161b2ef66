"""Multi-rank tests of Metrics.sync over gloo, against brute force over the raw samples.

Every rank regenerates every rank's raw data from a shared seed, records only
its own part, syncs, and compares the synced result with numpy over the union.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

SPECS = {
    "loss": ms.Spec(("mean", "std", "var", "count")),
    "tokens": ms.Spec("sum"),
    "len": ms.Spec(("min", "max", "mean", "p50", "p90")),
    "lr": ms.Spec("last"),
    "pg": ms.Spec("sum", across="mean"),
    "kl": ms.Spec("mean", across="max"),
    "clip": ms.Spec("max", across="min"),
    "grad": ms.Spec("sum", across="sum"),
    "ent": ms.Spec("mean"),
}


def _rank_data(seed: int, rank: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One rank's raw samples and weights per metric (some names missing, some ranks empty)."""
    rng = np.random.default_rng([seed, rank])
    data = {}
    if rng.random() < 0.15:  # an all-padding rank: nothing recorded at all
        return data
    for name in SPECS:
        if rng.random() < 0.25:
            continue
        n = int(rng.integers(1, 40))
        values = (
            rng.lognormal(0.0, 1.0, n) * rng.choice([-1.0, 1.0], n)
            if name == "len"
            else rng.normal(3.0, 2.0, n)
        )
        if name == "lr":
            values = np.full(n, 3e-4)
        weights = rng.integers(0, 4, n).astype(float) if name in ("ent", "loss") else np.ones(n)
        data[name] = (values, weights)
    return data


def _record(m: ms.Metrics, data: dict[str, tuple[np.ndarray, np.ndarray]], rank: int) -> None:
    for name, (values, weights) in data.items():
        if (
            name == "ent"
        ):  # per-token tensor with a mask (weights 0/1/2/3 -> mask of w > 0 plus weights)
            m.record(name, torch.tensor(values), weight=torch.tensor(weights))
        elif name == "loss" and rank % 2:
            for v, w in zip(values, weights):
                m.record(name, float(v), weight=float(w))
        elif name in ("pg", "grad", "tokens"):
            for v in values:  # micro-batch scalars on the fast path
                m.record(name, float(v))
        else:
            m.record(name, values, weight=weights)


def _expected(per_rank: list[dict[str, tuple[np.ndarray, np.ndarray]]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, spec in SPECS.items():
        parts = [d[name] for d in per_rank if name in d and d[name][1].sum() > 0]
        if not parts:
            continue
        if spec.across != "exact":
            local = []
            for values, weights in parts:
                local.append(_stat(spec.reduce[0], values, weights))
            combine = {"mean": np.mean, "sum": np.sum, "max": np.max, "min": np.min}[spec.across]
            out[name] = float(combine(local))
            continue
        values = np.concatenate([p[0] for p in parts])
        weights = np.concatenate([p[1] for p in parts])
        keys = spec.output_keys(name)
        for key, stat in zip(keys, spec.reduce):
            out[key] = _stat(stat, values, weights)
    return out


def _stat(stat: str, values: np.ndarray, weights: np.ndarray) -> float:
    kept = values[weights > 0]
    mean = np.sum(weights * values) / np.sum(weights)
    var = np.sum(weights * (values - mean) ** 2) / np.sum(weights)
    return float(
        {
            "mean": mean,
            "sum": np.sum(weights * values),
            "count": np.sum(weights),
            "var": var,
            "std": np.sqrt(var),
            "min": kept.min(),
            "max": kept.max(),
            "last": kept[-1],
            "p50": np.nan,
            "p90": np.nan,
        }[stat]
    )


def _quantile_ok(result: float, values: np.ndarray, q: float) -> bool:
    ordered = np.sort(values)
    lo = ordered[int(np.floor(q * (len(ordered) - 1)))]
    hi = ordered[int(np.ceil(q * (len(ordered) - 1)))]
    lo, hi = min(lo, hi), max(lo, hi)
    tol = 0.0101
    return lo - tol * abs(lo) <= result <= hi + tol * abs(hi)


def _scenarios(rank: int, world: int, n_scenarios: int, seed0: int) -> int:
    checked = 0
    for seed in range(seed0, seed0 + n_scenarios):
        per_rank = [_rank_data(seed, r) for r in range(world)]
        m = ms.Metrics(SPECS)
        _record(m, per_rank[rank], rank)
        before = m.to_bytes()
        synced = m.sync(timeout=60)
        assert m.to_bytes() == before, "sync changed the caller's metrics"
        got = synced.compute()
        want = _expected(per_rank)
        quantile_keys = {k for k in got if k.endswith(("/p50", "/p90"))}
        assert set(got) == set(want) | quantile_keys, (seed, sorted(got), sorted(want))
        for key, value in want.items():
            if key in quantile_keys:
                continue
            assert np.isclose(got[key], value, rtol=1e-9, atol=1e-9), (seed, key, got[key], value)
        for key in quantile_keys:
            q = 0.5 if key.endswith("p50") else 0.9
            values = np.concatenate([d["len"][0] for d in per_rank if "len" in d])
            assert _quantile_ok(got[key], values, q), (seed, key, got[key])
        # identical on every rank
        blob = torch.frombuffer(
            bytearray(synced.to_bytes()[:64].ljust(64, b"\0")), dtype=torch.uint8
        )
        gathered = [torch.empty_like(blob) for _ in range(world)]
        dist.all_gather(gathered, blob)
        assert all(bool((g == blob).all()) for g in gathered)
        checked += 1
    return checked


@pytest.mark.usefixtures("sync_path")
@pytest.mark.parametrize("world", [2, 4])
def test_randomized_scenarios_match_brute_force(world: int) -> None:
    counts = run_distributed(_scenarios, world, args=(25, 1000 * world), timeout=240)
    assert counts == [25] * world


def _steady_state(rank: int, world: int) -> tuple[int, int, int]:
    calls: dict[str, int] = {}
    originals = {}
    for fname in (
        "all_reduce",
        "all_gather",
        "broadcast",
        "all_gather_into_tensor",
        "all_gather_single",
        "reduce_scatter",
        "all_to_all",
        "all_to_all_single",
    ):
        original = getattr(dist, fname)
        originals[fname] = original

        def counted(
            *args: object, _f: str = fname, _o: object = original, **kwargs: object
        ) -> object:
            calls[_f] = calls.get(_f, 0) + 1
            return _o(*args, **kwargs)  # type: ignore[operator]

        setattr(dist, fname, counted)
    for fname in (
        "all_gather_object",
        "broadcast_object_list",
        "gather_object",
        "scatter_object_list",
    ):
        originals[fname] = getattr(dist, fname)
        setattr(
            dist,
            fname,
            lambda *a, **k: (_ for _ in ()).throw(AssertionError("pickle over the wire")),
        )
    try:
        m = ms.Metrics({"t/*": ms.Spec("max"), "q": ms.Spec(("p50", "std"))})
        for i in range(3000):  # many metrics, one of them only on rank 0
            m.record(f"t/{i}", float(i * (rank + 1)))
        if rank == 0:
            m.record("only_rank0", 1.0)
        m.record("q", np.arange(100.0))
        first = m.sync()
        first_calls = sum(calls.values())
        calls.clear()
        for _ in range(3):
            m.reset()
            m.record("t/5", 1.0)
            m.sync()
        steady = sum(calls.values()) // 3
        assert first.compute()["t/2999"] == 2999.0 * world
        return first_calls, steady, calls.get("all_reduce", 0) // 3
    finally:
        for fname, original in originals.items():
            setattr(dist, fname, original)


def test_steady_state_uses_two_collectives_and_no_pickle() -> None:
    for first, steady, reduces in run_distributed(_steady_state, 2):
        assert steady == 1  # the state gather; the quantile cells ride in it (agreed window)
        assert reduces == 0
        # the first, differing layout: a state gather that asks for new entries (their
        # size in its header), a gather of entries, the state gather again, the sketch gather
        assert first == 4


def _spec_conflict(rank: int, world: int) -> str:
    m = ms.Metrics({"x": ms.Spec("max" if rank == 0 else "mean")})
    m.record("x", 1.0)
    m.record("shared", 2.0)
    try:
        m.sync(timeout=30)
    except ms.SpecMismatchError as exc:
        return str(exc)
    return "no error"


@pytest.mark.usefixtures("sync_path")
def test_spec_conflict_raises_on_every_rank() -> None:
    for message in run_distributed(_spec_conflict, 2):
        assert "'x'" in message and "Spec('max')" in message


def _missing_rank(rank: int, world: int) -> str:
    m = ms.Metrics()
    m.record("x", 1.0)
    if rank == 1:
        time.sleep(12.0)  # never calls sync; outlives rank 0's timeout
        return "absent"
    start = time.monotonic()
    try:
        m.sync(timeout=3.0)
    except ms.SyncError:
        return f"SyncError after {time.monotonic() - start:.1f}s"
    return "no error"


@pytest.mark.usefixtures("sync_path")
def test_missing_rank_raises_sync_error_within_timeout() -> None:
    results = run_distributed(_missing_rank, 2, timeout=60)
    assert results[1] == "absent"
    assert results[0].startswith("SyncError"), results[0]
    assert float(results[0].split()[-1].rstrip("s")) < 10.0


def _bad_device_record(rank: int, world: int) -> str:
    import metricsync._record._convert

    # CPU tensors are host data and are checked at record; pretend this one is a GPU
    # tensor so its check is deferred to the sync, as it is for accelerator tensors.
    metricsync._record._convert.HOST_DEVICE_TYPES = ()
    m = ms.Metrics()
    m.record("ok", 1.0)
    if rank == 1:
        m.record("kl", torch.tensor([1.0, 2.0]), weight=torch.tensor([1.0, -1.0]))
    try:
        m.sync(timeout=30)
    except ValueError as exc:
        return f"ValueError: {exc}"
    except ms.SyncError as exc:
        return f"SyncError: {exc}"
    return "no error"


@pytest.mark.usefixtures("sync_path")
def test_invalid_device_data_fails_every_rank() -> None:
    results = run_distributed(_bad_device_record, 2)
    assert results[0].startswith("SyncError")
    assert results[1].startswith("ValueError") and "'kl'" in results[1]


def _subgroups(rank: int, world: int) -> dict[str, float]:
    from torch.distributed.device_mesh import init_device_mesh

    # DP x TP = 2 x 2: ranks 0,1 form TP pair 0; DP groups are {0, 2} and {1, 3}.
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    m = ms.Metrics({"n": ms.Spec(("sum", "max"))})
    m.record("n", [float(rank), 10.0 * rank])
    by_group = m.sync(group=dp_groups[rank % 2], timeout=30).compute()
    by_mesh = m.sync(group=mesh.get_group("dp"), timeout=30).compute()
    assert by_group == by_mesh
    return by_group


@pytest.mark.usefixtures("sync_path")
def test_sync_over_dp_subgroup_and_device_mesh() -> None:
    results = run_distributed(_subgroups, 4)
    for rank, got in enumerate(results):
        members = [0, 2] if rank % 2 == 0 else [1, 3]
        samples = [v for r in members for v in (float(r), 10.0 * r)]
        assert got == {"n/sum": sum(samples), "n/max": max(samples)}


def test_without_process_group_sync_returns_a_copy() -> None:
    m = ms.Metrics()
    m.record("x", [1.0, 2.0])
    synced = m.sync()
    assert synced is not m and synced.compute() == m.compute() == {"x": 1.5}
    synced.record("x", 100.0)
    assert m.compute() == {"x": 1.5}


def _groups_of_one(rank: int, world: int) -> list[tuple[int, bool, bool]]:
    from metricsync.testing import count_collectives

    groups = [dist.new_group([r]) for r in range(world)]  # every rank makes every group
    m = ms.Metrics({"q": ms.Spec(("mean", "p50", "max"))})
    m.record("q", np.arange(10.0) * (rank + 1))
    m.record("loss", float(rank))
    out = []
    for step in range(3):
        if step == 1:  # a name the group's layout lacks
            m.record(f"new/{rank}", 1.0)
        with count_collectives() as seen:
            synced = m.sync(groups[rank], timeout=30)
        hist, local = synced.histograms()["q"], m.histograms()["q"]
        same_hist = (hist.counts == local.counts).all() and (hist.edges == local.edges).all()
        out.append((seen.total, synced.compute() == m.compute(), bool(same_hist)))
    return out


def test_a_group_of_one_rank_syncs_without_a_collective() -> None:
    for syncs in run_distributed(_groups_of_one, 2):
        assert syncs == [(0, True, True)] * 3  # before: a collective per gather (4, 2, 1)


def _gather_kinds(rank: int, world: int) -> list[tuple[dict[str, int], dict[str, float]]]:
    import metricsync._sync._comm as comm
    from metricsync.testing import count_collectives

    out = []
    original = comm.EXCHANGE_MAX
    for limit in (original, 1):  # the all-to-all, then the ring past the limit
        comm.EXCHANGE_MAX = limit
        try:
            m = ms.Metrics({"q": ms.Spec(("mean", "p50", "max"))})
            m.record("loss", float(rank + 1))
            m.record("q", np.arange(10.0) * (rank + 1))
            m.sync()  # agrees the layout
            with count_collectives() as seen:
                got = m.sync().compute()
            out.append((dict(seen.calls), got))
        finally:
            comm.EXCHANGE_MAX = original
    return out


def test_gloo_gathers_by_all_to_all_up_to_a_group_size_then_by_ring() -> None:
    """A steady gloo sync is one all-to-all; past EXCHANGE_MAX ranks one all_gather, and
    both give the same result, bit for bit."""
    for (exchange_calls, exchanged), (ring_calls, ringed) in run_distributed(_gather_kinds, 2):
        assert exchange_calls == {"all_to_all_single": 1}
        assert sum(ring_calls.values()) == 1 and "all_to_all_single" not in ring_calls
        assert exchanged == ringed
        assert exchanged["loss"] == 1.5 and exchanged["q/max"] == 18.0


def _relayout_collectives(rank: int, world: int) -> list[tuple[int, dict[str, float]]]:
    from metricsync.testing import count_collectives

    m = ms.Metrics()
    for i in range(20):
        m.record(f"base/{i:02d}", float(i + rank))
    m.sync()  # agrees the layout
    out = []
    if rank == 1:  # one new name: its entry fits in the room of a state
        m.record("new/small", 5.0)
    with count_collectives() as seen:
        got = m.sync().compute()
    out.append((seen.total, got))
    if rank == 1:  # long new names that do not fit: a gather of their own
        for i in range(50):
            m.record(f"new/{'x' * 100}{i:03d}", float(i))
    with count_collectives() as seen:
        got = m.sync().compute()
    out.append((seen.total, got))
    with count_collectives() as seen:
        got = m.sync().compute()
    out.append((seen.total, got))
    return out


def test_new_names_ride_in_the_state_gather_when_they_fit() -> None:
    world = 3
    results = run_distributed(_relayout_collectives, world)
    for (small_calls, small), (big_calls, big), (steady_calls, steady) in results:
        assert (small_calls, big_calls, steady_calls) == (2, 3, 1)
        base = {f"base/{i:02d}": i + (world - 1) / 2 for i in range(20)}
        assert small == base | {"new/small": 5.0}
        assert big == steady == small | {f"new/{'x' * 100}{i:03d}": float(i) for i in range(50)}
    assert all(r == results[0] for r in results)
