"""metricsync.verl_compat next to verl 0.9.1's own metric code, on the same data.

verl is a test extra (installed with ``--no-deps``). Its objects are held in
``VERL`` (a namespace, not module globals: ``install()`` replaces verl's
objects wherever a module's globals hold them, this test module included).
Every probe runs verl's function and ours on the same input; outcomes must
agree except where the module docs declare a difference, and there the
declared outcome is asserted.
"""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _compare import same

import metricsync.verl_compat as vc

vmu = pytest.importorskip("verl.utils.metric.utils", reason="verl (test extra) is not installed")
py_functional = pytest.importorskip("verl.utils.py_functional")
torch_functional = pytest.importorskip("verl.utils.torch_functional")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
omegaconf = pytest.importorskip("omegaconf")

assert not vc.is_installed(), "another test left verl's modules switched"
VERL = SimpleNamespace(
    Metric=vmu.Metric,
    AggregationType=vmu.AggregationType,
    reduce_metrics=vmu.reduce_metrics,
    append_to_dict=py_functional.append_to_dict,
    allgather_dict_into_dict=torch_functional.allgather_dict_into_dict,
)
OURS = SimpleNamespace(
    Metric=vc.Metric,
    AggregationType=vc.AggregationType,
    reduce_metrics=vc.reduce_metrics,
    append_to_dict=vc.append_to_dict,
    allgather_dict_into_dict=vc.allgather_dict_into_dict,
)
AGGS = ("mean", "sum", "min", "max")
# verl's numpy warns on an empty mean; ours gives the same NaN quietly
pytestmark = [
    pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


@pytest.fixture(autouse=True)
def _never_left_installed() -> Iterator[None]:
    yield
    if vc.is_installed():
        vc.uninstall()
        pytest.fail("a test left verl's modules switched")


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """("value", fn(*args)) or ("raises", exception type), for comparing verl and ours."""
    try:
        return ("value", fn(*args))
    except Exception as exc:
        return ("raises", type(exc))


TOL = {"rel": 1e-12, "abs": 1e-12}  # what "the same number" allows


def assert_same(verl: tuple[str, Any], ours: tuple[str, Any]) -> None:
    assert verl[0] == ours[0], (verl, ours)
    if verl[0] == "raises":
        assert verl[1] is ours[1] or issubclass(ours[1], verl[1]), (verl, ours)
    else:
        assert isinstance(ours[1], np.floating), type(ours[1])  # a numpy scalar, as verl's
        assert same(verl[1], ours[1], **TOL), (verl, ours)


def appended(ns: SimpleNamespace, agg: str, values: list[Any]) -> Any:
    m = ns.Metric(agg)
    for v in values:
        m.append(v)
    return m


# ------------------------------------------------------------------ one Metric

SAME = {
    "floats": [1.0, 2.5, 4.0],
    "one": [3.0],
    "negative": [-1.0, -7.5, 2.0],
    "np_float64": [np.float64(1.5), np.float64(2.0)],
    "scalar_tensors": [torch.tensor(2.0), torch.tensor([3.0]), torch.tensor(-1.0)],
    "nan": [1.0, math.nan],
    "empty": [],
}


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("case", list(SAME))
def test_one_metric_matches_verl(agg: str, case: str) -> None:
    verl = outcome(lambda: appended(VERL, agg, SAME[case]).aggregate())
    ours = outcome(lambda: appended(OURS, agg, SAME[case]).aggregate())
    assert_same(verl, ours)
    want = [float(v) for v in appended(VERL, agg, SAME[case]).values]
    got = [float(v) for v in appended(OURS, agg, SAME[case]).values]
    assert len(got) == len(want) and all(same(a, b, **TOL) for a, b in zip(got, want))


@pytest.mark.parametrize("agg", AGGS)
def test_empty_and_aggregate_helper_match_verl(agg: str) -> None:
    for values in ([], [1.0, 4.0, 2.0]):
        verl = outcome(VERL.Metric._aggregate, values, VERL.AggregationType(agg))
        ours = outcome(OURS.Metric._aggregate, values, OURS.AggregationType(agg))
        assert_same(verl, ours)
    verl_made, our_made = (
        ns.Metric.from_dict({"a": 1.5, "b": 2}, aggregation=agg) for ns in (VERL, OURS)
    )
    for key in ("a", "b"):
        assert same(verl_made[key].aggregate(), our_made[key].aggregate(), **TOL)
        assert our_made[key].init_list().aggregation.value == agg


@pytest.mark.parametrize("agg", AGGS)
def test_declared_differences_of_one_metric(agg: str) -> None:
    # integers and booleans: verl returns numpy's int64/bool_; ours float64 of the same value
    for values in ([1, 2, 3], [True, False]):
        verl, ours = (
            appended(VERL, agg, values).aggregate(),
            appended(OURS, agg, values).aggregate(),
        )
        assert type(ours) is np.float64 and float(ours) == float(verl)
    # numbers verl refuses: float32 scalars, tensors of several elements, lists
    accepted = {
        "np_float32": ([np.float32(1.5), 2.0], [1.5, 2.0]),
        "vector_tensor": ([torch.tensor([2.0, 3.0])], [2.0, 3.0]),
        "list": ([[1.0, 2.0]], [1.0, 2.0]),
    }
    for values, flat in accepted.values():
        assert outcome(appended, VERL, agg, values) == ("raises", ValueError)
        want = {"mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max}[agg](flat)
        assert same(appended(OURS, agg, values).aggregate(), want, **TOL)
    # an array is one entry of verl's values, one entry per element of ours
    array = np.array([1.0, 2.0])
    assert len(appended(VERL, agg, [array]).values) == 1
    assert appended(OURS, agg, [array]).values == [1.0, 2.0]
    assert same(
        appended(VERL, agg, [array]).aggregate(), appended(OURS, agg, [array]).aggregate(), **TOL
    )


def test_errors_match_verl() -> None:
    cases: dict[str, Callable[[SimpleNamespace], Any]] = {
        "unknown aggregation": lambda ns: ns.Metric("median"),
        "aggregation of a wrong type": lambda ns: ns.Metric(3),
        "a string value": lambda ns: ns.Metric("mean").append("1.0"),
        "a None value": lambda ns: ns.Metric("mean").append(None),
        "a complex value": lambda ns: ns.Metric("mean").append(1j),
        "extend with a number": lambda ns: ns.Metric("mean").extend(1.0),
        "extend with a string": lambda ns: ns.Metric("mean").extend("12"),
        "extend, other aggregation": lambda ns: ns.Metric("sum").extend(ns.Metric("mean", 1.0)),
        "aggregate_dp of nothing": lambda ns: ns.Metric.aggregate_dp([]),
    }
    for name, case in cases.items():
        verl, ours = outcome(case, VERL), outcome(case, OURS)
        assert verl[0] == ours[0] == "raises", name
        assert verl[1] is ours[1], (name, verl, ours)


def test_pooling_metrics_matches_verl() -> None:
    for agg in AGGS:
        results = []
        for ns in (VERL, OURS):
            m = ns.Metric(agg, 1.0)
            m.append(ns.Metric(agg, 5.0))
            m.extend(ns.Metric(agg, -2.0))
            m.extend([3.0, 4.0])
            results.append((m.aggregate(), [float(v) for v in m.values]))
        assert same(results[0][0], results[1][0], **TOL) and results[0][1] == results[1][1]


# ------------------------------------------------------------------ data-parallel aggregation


def rank_metrics(ns: SimpleNamespace, agg: str, per_rank: list[list[float]]) -> list[Any]:
    return [appended(ns, agg, values) for values in per_rank]


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aggregate_dp_matches_verl_on_equal_counts(agg: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    per_rank = rng.normal(0.0, 2.0, (int(rng.integers(1, 5)), int(rng.integers(1, 6)))).tolist()
    verl = outcome(lambda: VERL.Metric.aggregate_dp(rank_metrics(VERL, agg, per_rank)))
    ours = outcome(lambda: OURS.Metric.aggregate_dp(rank_metrics(OURS, agg, per_rank)))
    assert_same(verl, ours)


@pytest.mark.parametrize("agg", AGGS)
def test_aggregate_dp_of_empty_ranks_matches_verl(agg: str) -> None:
    verl = outcome(lambda: VERL.Metric.aggregate_dp(rank_metrics(VERL, agg, [[], []])))
    ours = outcome(lambda: OURS.Metric.aggregate_dp(rank_metrics(OURS, agg, [[], []])))
    assert_same(verl, ours)


@pytest.mark.parametrize("agg", AGGS)
def test_unequal_counts_verl_crashes_ours_is_right_or_crashes_too(agg: str) -> None:
    per_rank = [[1.0, 2.0], [3.0, 4.0, 5.0], [], [-1.0]]
    assert (
        outcome(lambda: VERL.Metric.aggregate_dp(rank_metrics(VERL, agg, per_rank)))[0] == "raises"
    )
    flat = [v for values in per_rank for v in values]
    if agg == "mean":  # no weights: no right number, so ours raises as verl does, naming the counts
        with pytest.raises(ValueError, match=r"different numbers of values .*\[2, 3, 0, 1\]"):
            OURS.Metric.aggregate_dp(rank_metrics(OURS, agg, per_rank))
        return
    want = {
        "sum": np.mean([sum(values) for values in per_rank]),  # the empty rank's sum is 0.0
        "min": min(flat),
        "max": max(flat),
    }[agg]
    assert same(OURS.Metric.aggregate_dp(rank_metrics(OURS, agg, per_rank)), want, **TOL)


def test_mixed_aggregation_types_verl_uses_the_first_ours_raises() -> None:
    verl = VERL.Metric.aggregate_dp([VERL.Metric("sum", 1.0), VERL.Metric("mean", 3.0)])
    assert verl == 2.0  # the mean rank read as a sum
    with pytest.raises(ValueError, match="mismatch"):
        OURS.Metric.aggregate_dp([OURS.Metric("sum", 1.0), OURS.Metric("mean", 3.0)])


# ------------------------------------------------------------------ reduce_metrics

REDUCE_SAME: dict[str, dict[str, Any]] = {
    "key rule": {"loss": [1.0, 2.0, 3.0], "max_reward": [5.0, 8.0], "min_err": [0.1, 0.05]},
    "minibatch contains min": {"actor/minibatch_loss": [4.0, 1.0, 7.0]},
    "a scalar": {"x": 0.5},
    "an empty mean": {"x": []},
    "an empty max": {"max_x": []},
    "nested equal lists": {"x": [[1.0, 2.0], [3.0, 6.0]]},
    "numpy array": {"x": np.array([1.0, 4.0])},
}


def reduced(ns: SimpleNamespace, data: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        copy = {k: list(v) if isinstance(v, list) else v for k, v in data.items()}
        out = ns.reduce_metrics(copy)
        assert out is copy  # in place, both
        return out

    return run


@pytest.mark.parametrize("case", list(REDUCE_SAME))
def test_reduce_metrics_matches_verl(case: str) -> None:
    verl = outcome(reduced(VERL, REDUCE_SAME[case]))
    ours = outcome(reduced(OURS, REDUCE_SAME[case]))
    assert verl[0] == ours[0], (verl, ours)
    if verl[0] == "raises":
        assert verl[1] is ours[1]
        return
    assert verl[1].keys() == ours[1].keys()
    for key in verl[1]:
        assert_same(("value", verl[1][key]), ("value", ours[1][key]))


def test_reduce_metrics_of_metric_values_matches_verl() -> None:
    for agg in AGGS:
        results = [ns.reduce_metrics({"k": ns.Metric(agg, 2.0), "l": [1.0]}) for ns in (VERL, OURS)]
        assert all(same(results[0][k], results[1][k], **TOL) for k in ("k", "l"))


def test_reduce_metrics_declared_differences() -> None:
    ragged = {"x": [[1.0, 2.0], [3.0]]}
    assert outcome(reduced(VERL, ragged)) == ("raises", ValueError)
    assert outcome(reduced(OURS, ragged)) == ("value", {"x": 2.0})
    tensors = {"x": [torch.tensor(1.0), torch.tensor(4.0)]}
    verl, ours = reduced(VERL, tensors)()["x"], reduced(OURS, tensors)()["x"]
    assert verl == ours == 2.5 and type(ours) is np.float64
    metric_list = {"x": [OURS.Metric("mean", 1.0), OURS.Metric("mean", 2.0)]}
    assert OURS.reduce_metrics(dict(metric_list)) == {"x": 1.5}
    verl_list = {"x": [VERL.Metric("mean", 1.0), VERL.Metric("mean", 2.0)]}
    assert outcome(lambda: VERL.reduce_metrics(verl_list))[0] == "raises"


# ------------------------------------------------------------------ install()


def _write_module(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from verl.utils.metric import AggregationType, Metric, reduce_metrics
            from verl.utils.py_functional import append_to_dict
            from verl.utils.torch_functional import allgather_dict_into_dict as gather
            """
        )
    )


def test_install_switches_verl_modules_and_undoes_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import verl.utils.metric as metric_pkg

    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "_user_before")
    _write_module(tmp_path, "_user_after")
    import _user_before  # imported verl's objects before the switch

    names = ("Metric", "AggregationType", "reduce_metrics")
    try:
        with vc.install(keep_values=False) as installation:
            assert installation.owner and vc.is_installed()
            assert vc.install().owner is False  # twice: harmless
            for name in names:
                assert getattr(metric_pkg, name) is getattr(vc, name)
                assert getattr(vmu, name) is getattr(vc, name)
                assert getattr(_user_before, name) is getattr(vc, name)
            assert py_functional.Metric is vc.Metric  # what verl's own helpers test against
            assert py_functional.append_to_dict is vc.append_to_dict
            assert torch_functional.allgather_dict_into_dict is vc.allgather_dict_into_dict
            assert _user_before.gather is vc.allgather_dict_into_dict
            from verl.utils.metric import Metric

            assert Metric is vc.Metric and Metric.keep_values is False
            import _user_after  # imported while switched

            assert _user_after.Metric is vc.Metric
        assert not vc.is_installed() and vc.Metric.keep_values is True
        for name in names:
            assert getattr(metric_pkg, name) is getattr(VERL, name)
            assert getattr(vmu, name) is getattr(VERL, name)
            assert getattr(_user_before, name) is getattr(VERL, name)
        assert py_functional.Metric is VERL.Metric
        assert py_functional.append_to_dict is VERL.append_to_dict
        assert torch_functional.allgather_dict_into_dict is VERL.allgather_dict_into_dict
        assert _user_after.Metric is vc.Metric  # a non-verl module keeps what it imported
        vc.uninstall()  # a second uninstall does nothing
    finally:
        for name in ("_user_before", "_user_after"):
            sys.modules.pop(name, None)


def test_nested_install_leaves_the_outer_one_in_place() -> None:
    with vc.install():
        with vc.install() as inner:
            assert not inner.owner
        assert vc.is_installed() and vmu.Metric is vc.Metric
    assert vmu.Metric is VERL.Metric


# ------------------------------------------------------------------ mixing verl's Metric with ours


def test_verl_metrics_made_before_install_are_refused() -> None:
    stale = VERL.Metric("sum", 1.0)  # made by verl's class before the switch
    with vc.install():
        from verl.utils.metric import Metric, reduce_metrics

        with pytest.raises(vc.MixedMetricError, match=r"install\(\)"):
            Metric.aggregate_dp([Metric("sum", 2.0), stale])
        with pytest.raises(vc.MixedMetricError):
            reduce_metrics({"actor/pg_loss": stale})
        acc: dict[str, Any] = {"actor/pg_loss": stale}
        with pytest.raises(vc.MixedMetricError):
            py_functional.append_to_dict(acc, {"actor/pg_loss": Metric("sum", 2.0)})


def test_a_half_switch_raises_instead_of_a_wrong_number() -> None:
    # Without install(): the user's loss records the compat Metric, verl's own append_to_dict
    # does not know it and builds a plain list, one Metric per micro-batch.
    micro_batch_losses = [0.25, 0.5, 0.125, 0.25]
    acc: dict[str, Any] = {}
    for loss in micro_batch_losses:
        VERL.append_to_dict(acc, {"critic/vf_loss": OURS.Metric("sum", loss)})
    assert isinstance(acc["critic/vf_loss"], list)
    # Read as DP ranks this would be their mean, 0.28125, not the sum 1.125: it raises instead.
    with pytest.raises(ValueError, match=r"install\(\)"):
        OURS.reduce_metrics(acc)
    # Switched, the same code adds the micro-batches.
    with vc.install():
        acc = {}
        for loss in micro_batch_losses:
            py_functional.append_to_dict(acc, {"critic/vf_loss": vmu.Metric("sum", loss)})
        assert vmu.reduce_metrics(acc) == {"critic/vf_loss": 1.125}


# ------------------------------------------------------------------ token weights, verl's loss


def _micro_batch(
    gen: torch.Generator, bsz: int, length: int, scale: float
) -> dict[str, torch.Tensor]:
    lengths = torch.randint(length // 2, length + 1, (bsz,), generator=gen)
    old = -torch.rand(bsz, length, generator=gen, dtype=torch.float64) * 2
    return {
        "old": old,
        "new": old - torch.randn(bsz, length, generator=gen, dtype=torch.float64).abs() * scale,
        "adv": torch.randn(bsz, length, generator=gen, dtype=torch.float64),
        "entropy": torch.rand(bsz, length, generator=gen, dtype=torch.float64) * scale * 3,
        "mask": torch.arange(length)[None, :] < lengths[:, None],
    }


def _truth(
    batches: list[dict[str, torch.Tensor]], clip: float = 0.2, clip_c: float = 3.0
) -> dict[str, float]:
    """Every valid token of every micro-batch of every rank, pooled: the global token means."""

    def tokens(key: str) -> torch.Tensor:
        return torch.cat([b[key][b["mask"]] for b in batches])

    log_ratio = (tokens("new") - tokens("old")).clamp(-20.0, 20.0)
    ratio, adv = log_ratio.exp(), tokens("adv")
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)
    pessimistic = torch.maximum(unclipped, clipped)
    loss = torch.where(adv < 0, torch.minimum(-adv * clip_c, pessimistic), pessimistic)
    return {
        "actor/pg_loss": float(loss.mean()),
        "actor/ppo_kl": float((-log_ratio).mean()),
        "actor/pg_clipfrac": float((clipped > unclipped).double().mean()),
        "actor/entropy": float(tokens("entropy").mean()),
    }


def test_token_weighted_actor_metrics_with_verls_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    # 2 DP ranks x 2 micro-batches; short responses move more than long ones
    ranks = [
        [_micro_batch(gen, 4, 56, 0.2), _micro_batch(gen, 4, 8, 0.35)],
        [_micro_batch(gen, 4, 10, 0.35), _micro_batch(gen, 4, 50, 0.2)],
    ]
    truth = _truth([b for batches in ranks for b in batches])
    config = omegaconf.OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
        }
    )
    verl_ranks, our_ranks = [], []
    for batches in ranks:
        verl_acc: dict[str, Any] = {}
        our_acc: dict[str, Any] = {}
        for b in batches:
            # dp_size 1 and no global token count: verl's ppo_loss records token means as MEAN
            pg_loss, pg_metrics = core_algos.compute_policy_loss_vanilla(
                b["old"], b["new"], b["adv"], b["mask"], "token-mean", config
            )
            entropy = core_algos.agg_loss(b["entropy"], b["mask"], "token-mean")
            values = {**pg_metrics, "actor/pg_loss": pg_loss, "actor/entropy": entropy}
            VERL.append_to_dict(verl_acc, VERL.Metric.from_dict(values, aggregation="mean"))
            OURS.append_to_dict(our_acc, vc.token_mean_metrics(values, b["mask"]))
        verl_ranks.append(verl_acc)
        our_ranks.append(our_acc)
    for key, want in truth.items():
        verl = float(VERL.Metric.aggregate_dp([acc[key] for acc in verl_ranks]))
        ours = float(OURS.Metric.aggregate_dp([acc[key] for acc in our_ranks]))
        assert math.isclose(ours, want, rel_tol=1e-6), (key, ours, want)  # verl: float32 clipfrac
        assert abs(verl - want) / abs(want) > 0.08, (key, verl, want)  # verl's mean of means

    # With the global token count, verl scales the loss and records SUM: already exact.
    total = sum(int(b["mask"].sum()) for batches in ranks for b in batches)
    config.global_batch_info = {"dp_size": len(ranks), "batch_num_tokens": total}
    per_rank = []
    for batches in ranks:
        m = VERL.Metric("sum")
        for b in batches:
            m.append(
                core_algos.compute_policy_loss_vanilla(
                    b["old"], b["new"], b["adv"], b["mask"], "token-mean", config
                )[0]
            )
        per_rank.append(m)
    assert math.isclose(VERL.Metric.aggregate_dp(per_rank), truth["actor/pg_loss"], rel_tol=1e-9)
