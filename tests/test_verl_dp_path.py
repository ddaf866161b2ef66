"""verl 0.9.1's worker metric flow (micro-batches, DP gather, mini-batches, reduce) switched to metricsync.

verl's engine worker collects each micro-batch's metrics with ``append_to_dict``,
gathers the dict over the DP group with ``allgather_dict_into_dict`` (a pickled
``all_gather_object``), flattens it with ``Metric.aggregate_dp``, collects the
mini-batches with ``append_to_dict``, and the driver calls ``reduce_metrics``.
The same sequence runs here with verl's own functions, then after
``install()`` with the names verl's modules then hold, on 2 gloo ranks, and
is checked against brute force over every raw micro-batch value. This module
imports only verl's small utility modules, so its rank processes start fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import chain
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import metricsync as ms
import metricsync.verl_compat as vc

vmu = pytest.importorskip("verl.utils.metric.utils", reason="verl (test extra) is not installed")
py_functional = pytest.importorskip("verl.utils.py_functional")
torch_functional = pytest.importorskip("verl.utils.torch_functional")


N_MICRO = {"equal": [[3, 2], [3, 2]], "unequal": [[3, 1], [2, 4]]}  # [rank][mini-batch]


def micro_batch_metrics(rank: int, mini: int, micro: int) -> dict[str, float]:
    """What one micro-batch's loss function reports (raw numbers; the oracle reads these too)."""
    rng = np.random.default_rng([rank, mini, micro])
    return {
        "pg_loss": float(rng.normal(0.5, 0.2)),  # SUM Metric (globally scaled loss)
        "ppo_kl": float(rng.uniform(0.0, 0.1)),  # MEAN Metric
        "kl_coef": 0.001 * (1 + rank),  # a plain float: verl's key rule (mean)
        "ratio_max": float(rng.uniform(1.0, 2.0)),  # a plain float: key rule max
        "tokens": float(rng.integers(0, 40)),  # the micro-batch's valid tokens (token_mean)
    }


def run_actor_update(
    ns: SimpleNamespace,
    gather: Callable[..., Any],
    rank: int,
    counts: list[int],
    weighted: bool = False,
) -> dict[str, float]:
    """verl 0.9.1's worker flow: per micro-batch append_to_dict, per mini-batch a DP gather and
    aggregate_dp, append_to_dict over mini-batches, then reduce_metrics on the driver."""
    metrics: dict[str, Any] = {}
    for mini, n_micro in enumerate(counts):
        aggregated: dict[str, Any] = {}
        for micro in range(n_micro):
            raw = micro_batch_metrics(rank, mini, micro)
            out: dict[str, Any] = {
                "actor/pg_loss": ns.Metric(ns.AggregationType.SUM, raw["pg_loss"]),
                # with token_mean, verl's policy loss hands a Metric weighted by its mask's sum
                **ns.Metric.from_dict(
                    {
                        "actor/ppo_kl": ns.Metric("mean", raw["ppo_kl"], weight=raw["tokens"])
                        if weighted
                        else raw["ppo_kl"]
                    },
                    aggregation="mean",
                ),
                "kl_coef": raw["kl_coef"],
                "actor/ratio_max": raw["ratio_max"],
            }
            ns.append_to_dict(aggregated, out)
        gathered = gather(aggregated, group=None)
        for key, val in gathered.items():  # as verl's engine worker flattens DP and micro-batches
            gathered[key] = (
                ns.Metric.aggregate_dp(val)
                if isinstance(val[0], ns.Metric)
                else list(chain.from_iterable(val))
            )
        ns.append_to_dict(metrics, gathered)
    return {k: float(v) for k, v in ns.reduce_metrics(metrics).items()}


def brute_force(n_micro: list[list[int]], weighted: bool = False) -> dict[str, float]:
    world, minis = len(n_micro), len(n_micro[0])
    raw = [
        [[micro_batch_metrics(r, m, i) for i in range(n_micro[r][m])] for m in range(minis)]
        for r in range(world)
    ]
    pg, kl = [], []
    for m in range(minis):
        pg.append(np.mean([sum(x["pg_loss"] for x in raw[r][m]) for r in range(world)]))
        kl.append(np.mean([x["ppo_kl"] for r in range(world) for x in raw[r][m]]))
    every = [x for r in range(world) for m in range(minis) for x in raw[r][m]]
    tokens = sum(x["tokens"] for x in every)
    token_mean = sum(x["ppo_kl"] * x["tokens"] for x in every) / tokens
    return {
        "actor/pg_loss": float(np.mean(pg)),
        "actor/ppo_kl": token_mean if weighted else float(np.mean(kl)),
        "kl_coef": float(np.mean([x["kl_coef"] for x in every])),
        "actor/ratio_max": float(max(x["ratio_max"] for x in every)),
    }


def _dp_rank(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    pf, tf = py_functional, torch_functional
    out: dict[str, Any] = {}
    # verl's own path (its pickled gather), where it works: equal micro-batch counts

    verl = SimpleNamespace(
        Metric=vmu.Metric,
        AggregationType=vmu.AggregationType,
        reduce_metrics=vmu.reduce_metrics,
        append_to_dict=pf.append_to_dict,
    )
    out["verl equal"] = run_actor_update(
        verl, tf.allgather_dict_into_dict, rank, N_MICRO["equal"][rank]
    )
    try:
        run_actor_update(verl, tf.allgather_dict_into_dict, rank, N_MICRO["unequal"][rank])
        out["verl unequal"] = "ran"
    except ValueError:  # verl's aggregate_dp: "must have the same number of values"
        out["verl unequal"] = "raises"

    syncs = []
    real_sync = ms.Metrics.sync

    def counting_sync(self: ms.Metrics, *args: Any, **kwargs: Any) -> ms.Metrics:
        syncs.append(1)
        return real_sync(self, *args, **kwargs)

    def no_pickle(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a pickled all_gather_object ran")

    ms.Metrics.sync = counting_sync  # type: ignore[method-assign]
    dist.all_gather_object = no_pickle
    # verl's own names now resolve to metricsync (the loss functions are not used here)
    with vc.install(token_mean=False):
        switched = SimpleNamespace(
            Metric=vmu.Metric,
            AggregationType=vmu.AggregationType,
            reduce_metrics=vmu.reduce_metrics,
            append_to_dict=pf.append_to_dict,
        )
        assert switched.Metric is vc.Metric
        out["ours equal"] = run_actor_update(
            switched, tf.allgather_dict_into_dict, rank, N_MICRO["equal"][rank]
        )
        try:  # an unweighted MEAN on uneven micro-batch counts: raises as verl does
            run_actor_update(switched, tf.allgather_dict_into_dict, rank, N_MICRO["unequal"][rank])
            out["ours unequal"] = "ran"
        except ValueError as exc:
            out["ours unequal"] = str(exc)
        for case, counts in N_MICRO.items():  # token-weighted: the token mean on any split
            out[f"weighted {case}"] = run_actor_update(
                switched, tf.allgather_dict_into_dict, rank, counts[rank], weighted=True
            )
        out["syncs"] = len(syncs)
        # a key only one rank holds comes back on every rank
        mine = {"actor/only_rank1": switched.Metric("sum", [2.0, 3.0])} if rank == 1 else {}
        gathered = tf.allgather_dict_into_dict(mine)
        out["only_rank1"] = float(switched.Metric.aggregate_dp(gathered["actor/only_rank1"]))
        # ranks that disagree on a key's aggregation: an error on every rank, not a number
        disagree = {"actor/kl": switched.Metric("sum" if rank == 0 else "mean", 1.0)}
        try:
            tf.allgather_dict_into_dict(disagree, timeout=30.0)
            out["disagree"] = "ran"
        except ms.SpecMismatchError:
            out["disagree"] = "SpecMismatchError"
        # keys that are another key's output keys, or hold glob characters, stay apart
        odd = {
            "score": switched.Metric("mean", [1.0 + rank, 2.0]),
            "score/mean": switched.Metric("max", 10.0 + rank),
            "len": [1.0 + rank, 4.0],
            "len/count": switched.Metric("sum", 50.0 + rank),
            "eval/*": [1.0],
            "": [2.0 * rank],
        }
        if rank == 1:
            odd["eval/acc"] = [3.0]  # rank 0 lacks it: before, "eval/*" declared its spec
        gathered = tf.allgather_dict_into_dict(odd)
        out["odd keys"] = {
            key: float(switched.Metric.aggregate_dp(v[0] if isinstance(v[0], list) else v))
            for key, v in gathered.items()
        }
        # verl's engine worker reads MTP losses entry by entry (one entry per rank in verl)
        v = tf.allgather_dict_into_dict({"mtp_losses/mtp_1_loss": [0.5 + rank]})
        flatten_v = [sublist[0] for sublist in v["mtp_losses/mtp_1_loss"]]  # verl's lines
        out["mtp"] = float(sum(flatten_v) / len(flatten_v))
    return out


@pytest.mark.distributed
def test_verl_dp_path_runs_as_one_sync_per_gather() -> None:
    testing = pytest.importorskip("metricsync.testing")
    results = testing.run_distributed(_dp_rank, world_size=2, timeout=120.0)
    for got in results:  # identical on both ranks
        assert got["verl unequal"] == "raises"
        # one per mini-batch gather: equal, unequal (raises after its first), weighted both
        assert got["syncs"] == 2 + 1 + 2 * len(N_MICRO)
        assert got["only_rank1"] == 5.0  # the SUM of the one rank holding it
        assert got["disagree"] == "SpecMismatchError"
        # before: score 11.0 (score/mean's max read as its mean), len/count's sum as
        # len's weight, SpecMismatchError for "eval/*", TypeError for ""
        assert got["odd keys"] == {
            "score": 1.75,
            "score/mean": 11.0,
            "len": 2.75,
            "len/count": 50.5,
            "eval/*": 1.0,
            "": 1.0,
            "eval/acc": 3.0,
        }
        assert got["mtp"] == 1.0  # the mean of 0.5 and 1.5 (before: TypeError)
        # before: a mean of micro-batch means, with no error
        assert "'actor/ppo_kl'" in got["ours unequal"] and "[2 to 3]" in got["ours unequal"]
        want = brute_force(N_MICRO["equal"])
        assert got["ours equal"].keys() == want.keys()
        for key, value in want.items():
            assert math.isclose(got["ours equal"][key], value, rel_tol=1e-9), key
        for case in N_MICRO:
            want = brute_force(N_MICRO[case], weighted=True)
            assert got[f"weighted {case}"].keys() == want.keys()
            for key, value in want.items():
                assert math.isclose(got[f"weighted {case}"][key], value, rel_tol=1e-9), (case, key)
        for key, value in got["verl equal"].items():  # where verl runs, the same numbers
            assert math.isclose(got["ours equal"][key], value, rel_tol=1e-9), key


def test_a_verl_metric_made_before_install_aggregates_as_before() -> None:
    made = vmu.Metric("sum", 1.0)
    made.append(2.0)
    pair = vmu.Metric.aggregate_dp([made, made])
    with vc.install():
        # verl's own code now compares against metricsync's AggregationType (before: None)
        assert made.aggregate() == 3.0 and vmu.AggregationType is vc.AggregationType
        assert type(made).aggregate_dp([made, made]) == pair == 3.0
    assert vc.AggregationType.SUM == type(made.aggregation).SUM  # equal across the two enums
    assert vc.AggregationType.SUM != type(made.aggregation).MEAN


def test_verl_dp_path_in_one_process_matches_brute_force() -> None:
    assert not vc.is_installed()
    with vc.install(token_mean=False):
        switched = SimpleNamespace(
            Metric=vmu.Metric,
            AggregationType=vmu.AggregationType,
            reduce_metrics=vmu.reduce_metrics,
            append_to_dict=py_functional.append_to_dict,
        )
        got = run_actor_update(switched, torch_functional.allgather_dict_into_dict, 0, [3, 1])
    want = brute_force([[3, 1]])
    assert all(math.isclose(got[k], v, rel_tol=1e-9) for k, v in want.items()), (got, want)
