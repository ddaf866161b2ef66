"""What a switched worker returns, read by a driver that did not switch: ``MixedMetricError``.

A worker's metrics cross Ray as a pickle; here the pickle is made under ``install()`` and read
after ``uninstall()``, as a driver without ``install()`` reads it. Every path where verl's own
functions (its ``reduce_metrics``, ``Metric.aggregate_dp``, ``Metric.extend``) or numpy meet the
compat ``Metric`` raises ``MixedMetricError`` with the advice, not a numpy ``TypeError``.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import metricsync.verl_compat as vc

vmu = pytest.importorskip("verl.utils.metric.utils", reason="verl (test extra) is not installed")


@pytest.fixture(autouse=True)
def _never_left_installed() -> Iterator[None]:
    yield
    vc.uninstall()


def worker_output() -> Any:
    """What verl's engine worker returns after install(): per mini-batch, gathered metrics."""
    with vc.install(token_mean=False):
        metrics: dict[str, Any] = {}
        for mini in range(2):
            gathered = vc.allgather_dict_into_dict(
                {"kl_coef": [0.001, 0.001], "actor/ppo_kl": vc.Metric("mean", [0.1 * mini, 0.3])}
            )
            out = {
                "kl_coef": list(gathered["kl_coef"][0:1][0]),  # verl's chain over the ranks
                "actor/ppo_kl": vc.Metric.aggregate_dp(gathered["actor/ppo_kl"]),
            }
            vc.append_to_dict(metrics, out)
        return pickle.dumps(metrics)  # across Ray to the driver


def test_a_driver_without_install_gets_mixed_metric_error_from_verls_reduce() -> None:
    data = pickle.loads(worker_output())  # the driver never called install()
    assert not vc.is_installed()
    with pytest.raises(vc.MixedMetricError, match=r"install\(\) in every process"):
        vmu.reduce_metrics(dict(data))  # before: TypeError inside numpy
    with pytest.raises(vc.MixedMetricError):
        np.mean(data["kl_coef"])
    with pytest.raises(vc.MixedMetricError):
        float(data["kl_coef"][0])


def test_every_verl_function_meeting_a_compat_metric_raises_mixed_metric_error() -> None:
    gathered = pickle.loads(worker_output())["kl_coef"][0]
    with pytest.raises(vc.MixedMetricError):
        vmu.Metric.aggregate_dp([gathered, gathered])  # reads .values (before: AttributeError)
    with pytest.raises(vc.MixedMetricError):
        vmu.Metric("mean").extend(gathered)  # iterates it (before: TypeError)
    with pytest.raises(vc.MixedMetricError):
        np.max([gathered])
    # verl's Metric.append checks isinstance against its number types: verl's own ValueError
    with pytest.raises(ValueError, match="Unsupported value type"):
        vmu.Metric("mean").extend([gathered])


def test_the_same_output_on_a_switched_driver_gives_the_numbers() -> None:
    raw = worker_output()
    with vc.install(token_mean=False):
        got = vmu.reduce_metrics(pickle.loads(raw))
    assert got == {"kl_coef": pytest.approx(0.001), "actor/ppo_kl": pytest.approx(0.175)}


def test_the_compat_names_in_own_code_without_install_still_work() -> None:
    m = pickle.loads(pickle.dumps(vc.Metric("mean", [1.0, 3.0])))  # made unswitched
    assert m.values == [1.0, 3.0] and float(vc.reduce_metrics({"x": [m]})["x"]) == 2.0
    assert sum([m]) == 2.0
    with pytest.raises(vc.MixedMetricError):  # numpy on it: verl's reduce_metrics would
        np.mean([m])
    with vc.install(token_mean=False), pytest.raises(TypeError, match="not a number"):
        np.mean([m])  # switched: not a half switch, but still not a number


@pytest.mark.parametrize("form", ["float", "list"])
def test_mtp_losses_in_every_form_verl_produces(form: str) -> None:
    # verl's engine worker reads each MTP loss entry as a per-rank list (sublist[0])
    value: Any = 0.75 if form == "float" else [0.75]
    with vc.install(token_mean=False):
        v = vc.allgather_dict_into_dict({"mtp_losses/mtp_1_loss": value})["mtp_losses/mtp_1_loss"]
        flatten_v = [sublist[0] for sublist in v]  # verl's lines, verbatim
        got = sum(flatten_v) / len(flatten_v)  # before (float): 'Metric' is not subscriptable
    assert got == 0.75
