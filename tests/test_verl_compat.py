"""metricsync.verl_compat on its own (verl not needed): numpy brute force over the raw values.

Side by side with verl's real functions: ``test_verl_side_by_side.py``.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms
import metricsync.verl_compat as vc
from metricsync.verl_compat import AggregationType, Metric, reduce_metrics

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
# One list of micro-batch values per DP rank; ranks hold different numbers of values.
ranks_of_values = st.lists(st.lists(finite, min_size=0, max_size=6), min_size=1, max_size=5)


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
    flat = [v for values in per_rank for v in values]
    expected = {"sum": float(np.mean([np.sum(v) for v in per_rank]))}  # an empty rank sums to 0
    if flat:
        expected.update(min=float(np.min(flat)), max=float(np.max(flat)))
    counts = {len(values) for values in per_rank if values}
    if len(counts) == 1:  # ranks holding values hold the same number: the mean of them all
        expected["mean"] = float(np.mean(flat))
    for kind, want in expected.items():
        got = Metric.aggregate_dp(dp_metrics(kind, per_rank))
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6), (kind, got, want)
    if len(counts) > 1:  # an unweighted MEAN: verl raises, and so does this (no third number)
        with pytest.raises(ValueError, match="different numbers of values"):
            Metric.aggregate_dp(dp_metrics("mean", per_rank))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(finite, st.integers(0, 50)), min_size=0, max_size=6),
        min_size=1,
        max_size=5,
    )
)
def test_weighted_mean_of_uneven_ranks_is_the_token_mean(
    per_rank: list[list[tuple[float, int]]],
) -> None:
    # (micro-batch token mean, its token count) per micro-batch: the oracle is the token mean.
    ranks = []
    for batches in per_rank:
        m = Metric("mean")
        for value, tokens in batches:
            m.append(value, weight=tokens)
        ranks.append(m)
    tokens = sum(t for batches in per_rank for _, t in batches)
    got = Metric.aggregate_dp(ranks)
    if not tokens:
        assert math.isnan(got)
        return
    want = sum(v * t for batches in per_rank for v, t in batches) / tokens
    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6)
    assert isinstance(got, vc.WeightedMean) and got.weight == tokens


def test_unequal_counts_sum_is_mean_of_rank_sums() -> None:
    # verl's array form raises here; the rank sums are 3 and 12.
    assert Metric.aggregate_dp(dp_metrics("sum", [[1.0, 2.0], [3.0, 4.0, 5.0]])) == 7.5


def test_an_empty_rank_sums_to_zero_and_counts() -> None:
    # The documented rule: the mean of the rank sums, an empty sum 0.0 (before: 7.0).
    assert Metric.aggregate_dp(dp_metrics("sum", [[], [3.0, 4.0]])) == 3.5


def test_uneven_unweighted_mean_names_the_metric_and_counts() -> None:
    gathered = vc.allgather_dict_into_dict({"actor/ppo_kl": Metric("mean", [0.1, 0.2])})
    assert float(Metric.aggregate_dp(gathered["actor/ppo_kl"])) == pytest.approx(0.15)
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        Metric.aggregate_dp(dp_metrics("mean", [[1.0, 2.0], [3.0, 4.0, 5.0]]))


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
    # The oracle can tell a mean of means from the token mean on this data ...
    means = [float(m) for r in ranks for m in naive[ranks.index(r)].values]
    assert not close(float(np.mean(means)), truth)
    # ... and that mean of means, on uneven ranks, is refused rather than returned.
    with pytest.raises(ValueError, match="different numbers of values"):
        Metric.aggregate_dp(naive)


def test_weights_and_masks_of_zero_are_ignored_by_min_max() -> None:
    m = Metric("max")
    m.append(torch.tensor([1.0, 50.0, 3.0]), weight=torch.tensor([1.0, 0.0, 1.0]))
    assert m.aggregate() == 3.0
    low = Metric("min", [5.0, -9.0], weight=0)  # no value counts: empty, as verl's empty min
    with pytest.raises(ValueError, match="without values"):
        low.aggregate()


# ------------------------------------------------------------------ tensors are not read


@pytest.fixture
def no_item(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise AssertionError("a recorded tensor was read element by element")

    # verl reads every appended tensor with .item(); float()/int() would do the same.
    # CPU tensors are host memory that metricsync reads like numpy data, so CPU
    # plays the accelerator here.
    monkeypatch.setattr("metricsync._record._convert.HOST_DEVICE_TYPES", frozenset())
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


def test_reduce_metrics_plain_lists_follow_verl_key_rule_in_place() -> None:
    data: dict[str, Any] = {
        "loss": [1.0, 2.0, 3.0],
        "max_reward": [5.0, 8.0, 6.0],
        "min_error": [0.1, 0.05, 0.2],
        "actor/minibatch_loss": [4.0, 1.0, 7.0],  # contains "min": verl takes the min
        "seq_max_min": [2.0, 9.0],  # "max" is checked first
        "scalar": 0.5,
        "nested": [[1.0, 2.0], [3.0]],  # ragged: flattened
    }
    raw = {k: v for k, v in data.items()}
    out = reduce_metrics(data)
    assert out is data  # in place, as verl
    assert out == {
        "loss": np.mean(raw["loss"]),
        "max_reward": np.max(raw["max_reward"]),
        "min_error": np.min(raw["min_error"]),
        "actor/minibatch_loss": 1.0,
        "seq_max_min": 9.0,
        "scalar": 0.5,
        "nested": 2.0,
    }
    assert all(type(v) is np.float64 for v in out.values())


def test_reduce_metrics_empty_lists_follow_verl() -> None:
    assert math.isnan(reduce_metrics({"loss": []})["loss"])
    with pytest.raises(ValueError):
        reduce_metrics({"max_len": []})


def test_reduce_metrics_over_metrics_and_lists_of_them() -> None:
    per_micro_batch = [Metric("mean", v, weight=w) for v, w in ((1.0, 3.0), (5.0, 1.0))]
    out = reduce_metrics(
        {
            "actor/pg_loss": Metric("mean", [1.0, 2.0, 6.0]),
            "actor/grad_norm": Metric("max", [3.0, 1.0]),
            "actor/clipfrac": per_micro_batch,  # pooled: (3*1 + 1*5) / 4
            "nested_max": [[Metric("max", 1.0)], [Metric("max", [7.0, 2.0])]],
            "perf/throughput": [0.5, 1.5],
            "timing/step": [0.5, 1.5],  # "timing" contains "min": verl's rule takes the min
        }
    )
    assert out == {
        "actor/pg_loss": 3.0,
        "actor/grad_norm": 3.0,
        "actor/clipfrac": 2.0,
        "nested_max": 7.0,
        "perf/throughput": 1.0,
        "timing/step": 0.5,
    }


def test_reduce_metrics_refuses_a_list_of_sum_metrics() -> None:
    # One Metric per micro-batch (what verl's own append_to_dict builds when verl's modules are
    # not switched) would be read as DP ranks: averaged instead of added. It raises instead.
    micro_batches = {"critic/vf_loss": [Metric("sum", v) for v in (0.25, 0.5, 0.125, 0.25)]}
    with pytest.raises(ValueError, match=r"install\(\)"):
        reduce_metrics(micro_batches)
    with pytest.raises(ValueError, match="mixes"):
        reduce_metrics({"x": [Metric("mean", 1.0), 2.0]})


def test_reduce_metrics_expands_metricsync_metrics() -> None:
    workers = []
    for values in ([1.0, 2.0], [6.0]):
        m = ms.Metrics({"actor/entropy": ms.Spec("mean"), "perf/tokens": ms.Spec("sum")})
        m.record("actor/entropy", values)
        m.record("perf/tokens", len(values))
        workers.append(m)
    out = reduce_metrics({"loss": [1.0, 3.0], "metricsync": [workers[0], None, workers[1]]})
    assert out == {"loss": 2.0, "actor/entropy": 3.0, "perf/tokens": 3.0}
    assert reduce_metrics({"m": workers[0]}) == {"actor/entropy": 1.5, "perf/tokens": 2.0}


def test_reduce_metrics_specs_override_the_key_rule() -> None:
    out = reduce_metrics(
        {"actor/minibatch_loss": [4.0, 1.0, 7.0], "len": [1.0, 3.0], "empty_max": []},
        specs={
            "actor/*": ms.Spec("mean"),
            "len": ms.Spec(("min", "max")),
            "empty_*": ms.Spec("max"),
        },
    )
    assert out["actor/minibatch_loss"] == 4.0
    assert out["len/min"] == 1.0 and out["len/max"] == 3.0 and "len" not in out
    assert math.isnan(out["empty_max"])


def test_reduce_metrics_tensor_lists(no_item: None) -> None:
    out = reduce_metrics({"entropy": [torch.tensor(1.0), torch.tensor([2.0, 6.0])]})
    assert out == {"entropy": 3.0}


# ------------------------------------------------------------------ values


def test_values_list_as_verl_and_captured_at_append() -> None:
    t = torch.tensor([1.0, 2.0])
    m = Metric("sum", 0.5)
    m.append(3)
    m.append(t)
    m.append(np.array([4.0]))
    t.fill_(100.0)
    assert m.values == [0.5, 3, 1.0, 2.0, 4.0]
    assert m.aggregate() == 10.5
    other = Metric("sum", [7.0])
    m.extend(other)
    assert m.values[-1] == 7.0 and m.aggregate() == 17.5


def test_values_can_be_turned_off() -> None:
    off = Metric("mean", [1.0, 2.0], keep_values=False)
    assert off.aggregate() == 1.5
    with pytest.raises(AttributeError, match="keep_values"):
        _ = off.values
    on = Metric("mean", 1.0)
    on.extend(off)  # pooling a metric without values: the list would be incomplete
    with pytest.raises(AttributeError):
        _ = on.values
    previous = Metric.keep_values
    try:
        Metric.keep_values = False
        with pytest.raises(AttributeError):
            _ = Metric("max", 1.0).values
        assert Metric("max", 1.0, keep_values=True).values == [1.0]
    finally:
        Metric.keep_values = previous


def test_synced_metrics_keep_no_values() -> None:
    with pytest.raises(AttributeError, match="sync"):
        _ = Metric("sum", 1.0).sync().values


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


def test_from_dict_init_list_aggregate_helper() -> None:
    made = Metric.from_dict({"a": 1.0, "b": torch.tensor([2.0, 4.0])}, aggregation="mean")
    assert {k: v.aggregate() for k, v in made.items()} == {"a": 1.0, "b": 3.0}
    assert all(v.aggregation is AggregationType.MEAN for v in made.values())
    fresh = made["b"].init_list()
    assert fresh.aggregation is AggregationType.MEAN and math.isnan(fresh.aggregate())
    weighted = Metric.from_dict({"kl": 0.5}, "mean", weight=3.0)["kl"]
    weighted.append(1.0, weight=1.0)
    assert weighted.aggregate() == 0.625
    assert Metric._aggregate([1.0, 2.0, 4.0], AggregationType.SUM) == 7.0
    assert Metric._aggregate(np.array([1.0, 2.0]), "max") == 2.0


def test_empty_results_follow_verl() -> None:
    assert Metric("sum").aggregate() == 0.0
    assert Metric.aggregate_dp([Metric("sum"), Metric("sum")]) == 0.0
    assert math.isnan(Metric("mean").aggregate())
    for kind in ("min", "max"):
        with pytest.raises(ValueError, match="without values"):
            Metric(kind).aggregate()


def test_errors() -> None:
    with pytest.raises(ValueError, match="median"):
        Metric("median")
    with pytest.raises(ValueError):
        Metric(3)  # type: ignore[arg-type]
    for bad in ("1.0", None, 1j, {"a": 1.0}):
        with pytest.raises(ValueError, match="Unsupported value"):
            Metric("mean").append(bad)
    with pytest.raises(TypeError):
        Metric("mean").extend(1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        Metric.aggregate_dp([])
    with pytest.raises(ValueError, match="mismatch"):
        Metric.aggregate_dp([Metric("sum", 1.0), Metric("mean", 1.0)])
    with pytest.raises(TypeError, match="Metric objects"):
        Metric.aggregate_dp([1.0])  # type: ignore[list-item]


def test_a_verl_metric_is_refused_with_the_install_hint() -> None:
    fake = type("Metric", (), {"__module__": "verl.utils.metric.utils"})()
    calls = [
        lambda: Metric.aggregate_dp([Metric("sum", 1.0), fake]),
        lambda: Metric("sum").append(fake),
        lambda: Metric("sum").extend(fake),
        lambda: reduce_metrics({"loss": fake}),
        lambda: reduce_metrics({"loss": [Metric("mean", 1.0), fake]}),
        lambda: vc.append_to_dict({"loss": fake}, {"loss": Metric("sum", 1.0)}),
        lambda: vc.allgather_dict_into_dict({"loss": fake}),
    ]
    for call in calls:
        with pytest.raises(vc.MixedMetricError, match=r"install\(\)"):
            call()
    assert issubclass(vc.MixedMetricError, ValueError)


def test_pickle_goes_through_the_binary_format() -> None:
    ranks = dp_metrics("sum", [[1.0, 2.0], [3.0, 4.0, 5.0]])
    shipped = [pickle.loads(pickle.dumps(m)) for m in ranks]
    assert [m.aggregation for m in shipped] == [AggregationType.SUM] * 2
    assert Metric.aggregate_dp(shipped) == 7.5
    assert shipped[1].values == [3.0, 4.0, 5.0]
    assert isinstance(shipped[0].state, ms.Metrics)
    off = pickle.loads(pickle.dumps(Metric("max", 2.0, keep_values=False)))
    assert off.aggregate() == 2.0
    with pytest.raises(AttributeError):
        _ = off.values


def test_numeric_types_are_verls() -> None:
    assert vc.NumericType == (int, float, torch.Tensor, np.ndarray)
    assert isinstance(torch.tensor(1.0), vc.Numeric) and not isinstance("1", vc.Numeric)
    with pytest.raises(AttributeError):
        _ = vc.NoSuchName  # type: ignore[attr-defined]


def test_sync_without_process_group_is_a_copy() -> None:
    m = Metric("sum", [1.0, 2.0])
    copy = m.sync()
    m.append(10.0)
    assert copy.aggregate() == 3.0 and copy.aggregation is AggregationType.SUM


# ------------------------------------------------------------------ verl's helpers, one process


def test_append_to_dict_collects_micro_batches() -> None:
    acc: dict[str, Any] = {}
    for loss, clip in ((0.5, 0.1), (0.25, 0.3)):
        vc.append_to_dict(acc, {"pg_loss": Metric("sum", loss), "clip": clip, "ids": [1, 2]}, "a/")
    assert set(acc) == {"a/pg_loss", "a/clip", "a/ids"}
    assert acc["a/pg_loss"].aggregate() == 0.75 and acc["a/pg_loss"].values == [0.5, 0.25]
    assert acc["a/clip"] == [0.1, 0.3] and acc["a/ids"] == [1, 2, 1, 2]


def test_allgather_without_a_group_holds_this_rank() -> None:
    data = {
        "pg_loss": Metric("sum", [0.5, 0.25]),
        "kl": Metric("mean", [1.0, 3.0], weight=[3.0, 1.0]),
        "clip": [0.1, 0.3],
        "ratio_max": [1.5, 2.0],
        "lr": 3e-4,
    }
    out = vc.allgather_dict_into_dict(data)
    assert [len(v) for v in out.values()] == [1] * 5
    assert Metric.aggregate_dp(out["pg_loss"]) == 0.75
    assert Metric.aggregate_dp(out["kl"]) == 1.5
    assert close(Metric.aggregate_dp(out["clip"][0]), 0.2)
    assert Metric.aggregate_dp(out["ratio_max"][0]) == 2.0
    assert close(Metric.aggregate_dp(out["lr"]), 3e-4)


def test_reduce_metrics_names_a_key_holding_none() -> None:
    for value in (None, [None, None]):  # verl raises too; before, the key vanished
        with pytest.raises(ValueError, match="'actor/grad_norm'"):
            reduce_metrics({"actor/grad_norm": value, "loss": [1.0]})


def test_a_number_plus_a_metric_is_the_number_plus_its_aggregate() -> None:
    assert sum([Metric("mean", [0.5, 1.5]), Metric("max", [4.0])]) == 5.0
    assert 1 + Metric("sum", [2.0, 3.0]) == 6.0
    with pytest.raises(TypeError):
        _ = "a" + Metric("sum", 1.0)  # type: ignore[operator]


def test_collect_metrics_merges_worker_results() -> None:
    a, b = ms.Metrics({"s": ms.Spec("sum")}), ms.Metrics({"s": ms.Spec("sum")})
    a.record("s", [1.0, 2.0])
    b.record("s", 4.0)
    assert vc.collect_metrics(None, [a, None, b]).compute() == {"s": 7.0}
    assert vc.collect_metrics(None, a).compute() == {"s": 3.0}  # RANK_ZERO: one result
    with pytest.raises(TypeError, match="DataProto"):
        vc.collect_metrics(None, [a, 1.0])


def test_token_mean_metrics_weight_by_valid_tokens() -> None:
    short = torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)  # 2 tokens
    long = torch.ones(2, 4, dtype=torch.bool)  # 8 tokens
    ranks = [
        vc.token_mean_metrics({"kl": torch.tensor(0.5)}, short)["kl"],
        vc.token_mean_metrics({"kl": torch.tensor(0.25)}, long)["kl"],
    ]
    assert close(Metric.aggregate_dp(ranks), (0.5 * 2 + 0.25 * 8) / 10)
