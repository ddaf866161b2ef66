"""metricsync.verl_compat against numpy brute force over the raw values (no Ray, no processes)."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms
from metricsync.verl_compat import AggregationType, Metric, reduce_metrics

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
# One list of micro-batch values per DP rank; ranks hold different numbers of values.
ranks_of_values = st.lists(st.lists(finite, min_size=1, max_size=6), min_size=1, max_size=5)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def dp_metrics(kind: str, per_rank: list[list[float]]) -> list[Metric]:
    out = []
    for values in per_rank:
        m = Metric(kind)
        for v in values:
            m.append(v)
        out.append(m)
    return out


# ------------------------------------------------------------------ verl's own scenarios


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("sum", 5.0), ("mean", 2.5), ("max", 4.0), ("min", 1.0)],
)
def test_equal_micro_batch_counts_match_verl(kind: str, expected: float) -> None:
    # verl: values [[1, 2], [3, 4]] -> SUM/MEAN take the mean over ranks per micro-batch,
    # then sum/mean; MIN/MAX over everything.
    ranks = dp_metrics(kind, [[1.0, 2.0], [3.0, 4.0]])
    assert Metric.aggregate_dp(ranks) == expected


@settings(max_examples=60, deadline=None)
@given(ranks_of_values)
def test_unequal_micro_batch_counts_against_brute_force(per_rank: list[list[float]]) -> None:
    flat = np.concatenate([np.array(v) for v in per_rank])
    expected = {
        "sum": float(np.mean([np.sum(v) for v in per_rank])),
        "mean": float(np.mean(flat)),
        "min": float(np.min(flat)),
        "max": float(np.max(flat)),
    }
    for kind, want in expected.items():
        got = Metric.aggregate_dp(dp_metrics(kind, per_rank))
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6), (kind, got, want)


def test_unequal_counts_sum_is_mean_of_rank_sums() -> None:
    # verl's array form raises here; the rank sums are 3 and 12.
    assert Metric.aggregate_dp(dp_metrics("sum", [[1.0, 2.0], [3.0, 4.0, 5.0]])) == 7.5


def _ppo_batches(seed: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per DP rank, a list of micro-batches of (per-token loss, response mask)."""
    gen = torch.Generator().manual_seed(seed)
    ranks = []
    for n_micro in (2, 5, 3):  # unequal gradient-accumulation steps per rank
        batches = []
        for _ in range(n_micro):
            bsz, length = 4, int(torch.randint(3, 12, (1,), generator=gen))
            loss = torch.randn(bsz, length, generator=gen, dtype=torch.float64) + 2.0
            lengths = torch.randint(0, length + 1, (bsz,), generator=gen)
            mask = torch.arange(length)[None, :] < lengths[:, None]
            batches.append((loss, mask))
        ranks.append(batches)
    return ranks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_weighted_mean_survives_aggregate_dp(seed: int) -> None:
    ranks = _ppo_batches(seed)
    all_tokens = torch.cat([loss[mask] for batches in ranks for loss, mask in batches])
    truth = float(all_tokens.mean())
    global_tokens = int(all_tokens.numel())
    dp_size = len(ranks)

    # (a) verl's way: each micro-batch loss is sum/global_tokens*dp_size, aggregated as SUM.
    scaled = [Metric(AggregationType.SUM) for _ in ranks]
    # (b) a MEAN weighted by the micro-batch's token count.
    weighted = [Metric(AggregationType.MEAN) for _ in ranks]
    # (c) a sum metric and a count metric, divided after aggregate_dp.
    sums = [Metric("sum") for _ in ranks]
    counts = [Metric("sum") for _ in ranks]
    naive = [Metric("mean") for _ in ranks]  # unweighted mean of micro-batch means
    for r, batches in enumerate(ranks):
        for loss, mask in batches:
            masked_sum = (loss * mask).sum()
            n_tokens = mask.sum()
            scaled[r].append(masked_sum / global_tokens * dp_size)
            sums[r].append(masked_sum)
            counts[r].append(n_tokens)
            if int(n_tokens) > 0:
                weighted[r].append(masked_sum / n_tokens, weight=n_tokens)
                naive[r].append(masked_sum / n_tokens)

    assert close(Metric.aggregate_dp(scaled), truth)
    assert close(Metric.aggregate_dp(weighted), truth)
    assert close(Metric.aggregate_dp(sums) / Metric.aggregate_dp(counts), truth)
    # The oracle can tell a mean of means from the token mean on this data.
    assert not close(Metric.aggregate_dp(naive), truth)


def test_weights_and_masks_of_zero_are_ignored_by_min_max() -> None:
    m = Metric("max")
    m.append(torch.tensor([1.0, 50.0, 3.0]), weight=torch.tensor([1.0, 0.0, 1.0]))
    assert m.aggregate() == 3.0
    low = Metric("min", [5.0, -9.0], weight=0)
    assert math.isnan(low.aggregate())


# ------------------------------------------------------------------ tensors are not read


@pytest.fixture
def no_item(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise AssertionError("a recorded tensor was read element by element")

    # verl reads every appended tensor with .item(); float()/int() would do the same.
    # CPU tensors are host memory that metricsync reads like numpy data, so CPU
    # plays the accelerator here.
    monkeypatch.setattr("metricsync._convert.HOST_DEVICE_TYPES", frozenset())
    for name in ("item", "tolist", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)


def test_appended_tensors_are_not_itemed(no_item: None) -> None:
    gen = torch.Generator().manual_seed(7)
    per_rank = [[torch.randn((), generator=gen) for _ in range(n)] for n in (3, 1, 4)]
    weights = [[torch.rand((), generator=gen) + 0.5 for _ in values] for values in per_rank]
    sums, means = [], []
    for values, ws in zip(per_rank, weights):
        s, m = Metric("sum"), Metric("mean")
        for v, w in zip(values, ws):
            s.append(v)
            m.append(v, weight=w)
        sums.append(s)
        means.append(m)
    vals = [np.array([float(v.numpy()) for v in values]) for values in per_rank]
    wts = [np.array([float(w.numpy()) for w in ws]) for ws in weights]
    assert close(Metric.aggregate_dp(sums), float(np.mean([v.sum() for v in vals])))
    flat_v, flat_w = np.concatenate(vals), np.concatenate(wts)
    assert close(Metric.aggregate_dp(means), float((flat_v * flat_w).sum() / flat_w.sum()))


def test_tensor_values_are_captured_at_append_time(no_item: None) -> None:
    t = torch.tensor([1.0, 2.0, 3.0])
    m = Metric("sum", t)
    t.fill_(100.0)  # a later in-place update must not change what was recorded
    assert m.aggregate() == 6.0


# ------------------------------------------------------------------ reduce_metrics


def test_reduce_metrics_plain_lists_follow_verl_key_rule() -> None:
    data: dict[str, Any] = {
        "loss": [1.0, 2.0, 3.0],
        "max_reward": [5.0, 8.0, 6.0],
        "min_error": [0.1, 0.05, 0.2],
        "actor/minibatch_loss": [4.0, 1.0, 7.0],  # contains "min": verl takes the min
        "seq_max_min": [2.0, 9.0],  # "max" is checked first
        "scalar": 0.5,
    }
    before = {k: list(v) if isinstance(v, list) else v for k, v in data.items()}
    out = reduce_metrics(data)
    assert out == {
        "loss": float(np.mean(data["loss"])),
        "max_reward": float(np.max(data["max_reward"])),
        "min_error": float(np.min(data["min_error"])),
        "actor/minibatch_loss": 1.0,
        "seq_max_min": 9.0,
        "scalar": 0.5,
    }
    assert data == before  # the argument is left unchanged
    assert all(type(v) is float for v in out.values())


def test_reduce_metrics_over_metric_values_and_rank_lists() -> None:
    ranks = dp_metrics("sum", [[1.0, 2.0], [3.0, 4.0, 5.0]])
    out = reduce_metrics(
        {
            "actor/pg_loss": Metric("mean", [1.0, 2.0, 6.0]),
            "actor/grad_norm": Metric("max", [3.0, 1.0]),
            "actor/dp_loss": ranks,
            "perf/throughput": [0.5, 1.5],
            "timing/step": [0.5, 1.5],  # "timing" contains "min": verl's rule takes the min
        }
    )
    assert out == {
        "actor/pg_loss": 3.0,
        "actor/grad_norm": 3.0,
        "actor/dp_loss": 7.5,
        "perf/throughput": 1.0,
        "timing/step": 0.5,
    }


def test_reduce_metrics_specs_override_and_empty_lists() -> None:
    out = reduce_metrics(
        {"actor/minibatch_loss": [4.0, 1.0, 7.0], "len": [1.0, 3.0], "empty_max": []},
        specs={"actor/*": ms.Spec("mean"), "len": ms.Spec(("min", "max"))},
    )
    assert out["actor/minibatch_loss"] == 4.0
    assert out["len/min"] == 1.0 and out["len/max"] == 3.0
    assert math.isnan(out["empty_max"])


def test_reduce_metrics_tensor_lists(no_item: None) -> None:
    out = reduce_metrics({"entropy": [torch.tensor(1.0), torch.tensor([2.0, 6.0])]})
    assert out == {"entropy": 3.0}


# ------------------------------------------------------------------ the rest of the surface


def test_extend_and_append_pool_metrics() -> None:
    a = Metric("sum", [1.0, 2.0])
    a.append(Metric("sum", [3.0, 4.0]))
    a.extend([5.0])
    assert a.aggregate() == 15.0
    # pooling, not a rank: aggregate_dp of [a, b] is still the mean of the two sums
    b = Metric("sum", 5.0)
    assert Metric.aggregate_dp([a, b]) == 10.0
    m = Metric("mean", [1.0, 2.0])
    m.extend(Metric("mean", [3.0, 10.0], weight=0.5))
    assert close(m.aggregate(), (1 + 2 + 0.5 * 13) / 3.0)
    m.extend([4.0, 8.0], weights=[1.0, 0.0])
    assert close(m.aggregate(), (1 + 2 + 0.5 * 13 + 4) / 4.0)
    with pytest.raises(ValueError, match="mismatch"):
        m.extend(Metric("max", 1.0))


def test_from_dict_init_list_union_accumulate() -> None:
    made = Metric.from_dict({"a": 1.0, "b": torch.tensor([2.0, 4.0])}, aggregation="mean")
    assert {k: v.aggregate() for k, v in made.items()} == {"a": 1.0, "b": 3.0}
    assert all(v.aggregation is AggregationType.MEAN for v in made.values())
    fresh = made["b"].init_list()
    assert fresh.aggregation is AggregationType.MEAN and math.isnan(fresh.aggregate())
    u = Metric.union(Metric("min", 4.0), Metric("min", [2.0, 9.0]))
    u.accumulate([1.5, 3.0])
    assert u.aggregate() == 1.5


def test_errors() -> None:
    with pytest.raises(ValueError, match="median"):
        Metric("median")
    with pytest.raises(TypeError):
        Metric(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Metric("mean").append("1.0")
    with pytest.raises(ValueError, match="empty"):
        Metric.aggregate_dp([])
    with pytest.raises(ValueError, match="mismatch"):
        Metric.aggregate_dp([Metric("sum", 1.0), Metric("mean", 1.0)])


def test_pickle_goes_through_the_binary_format() -> None:
    ranks = dp_metrics("sum", [[1.0, 2.0], [3.0, 4.0, 5.0]])
    shipped = [pickle.loads(pickle.dumps(m)) for m in ranks]
    assert [m.aggregation for m in shipped] == [AggregationType.SUM] * 2
    assert Metric.aggregate_dp(shipped) == 7.5
    assert b"verl_compat" in pickle.dumps(ranks[0])  # rebuilt by this module
    assert isinstance(shipped[0].state, ms.Metrics)


def test_sync_without_process_group_is_a_copy() -> None:
    pytest.importorskip("metricsync._sync")
    m = Metric("sum", [1.0, 2.0])
    copy = m.sync()
    m.append(10.0)
    assert copy.aggregate() == 3.0 and copy.aggregation is AggregationType.SUM


MICRO_BATCHES = [[1.0, 2.0], [3.0, 4.0, 5.0], [-1.0]]  # one list per rank, unequal counts


def _sync_rank(rank: int, world_size: int) -> dict[str, float]:
    out = {}
    for kind in ("sum", "mean", "max"):
        m = Metric(kind, MICRO_BATCHES[rank])
        out[kind] = m.sync(timeout=30.0).aggregate()
    return out


@pytest.mark.distributed
def test_sync_over_gloo_equals_aggregate_dp() -> None:
    pytest.importorskip("metricsync._sync")
    testing = pytest.importorskip("metricsync.testing")
    results = testing.run_distributed(_sync_rank, world_size=3, timeout=60.0)
    flat = [v for values in MICRO_BATCHES for v in values]
    want = {
        "sum": float(np.mean([sum(v) for v in MICRO_BATCHES])),
        "mean": float(np.mean(flat)),
        "max": max(flat),
    }
    for got in results:  # identical on every rank
        assert got.keys() == want.keys()
        assert all(close(got[k], want[k]) for k in want), (got, want)
