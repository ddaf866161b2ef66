"""verl's own PPO update on its real single controller, switched to metricsync, against brute force.

What runs is ``examples/verl_single_controller.py``'s: verl's ``RayWorkerGroup``
of CPU workers (two DP ranks through ``Dispatch.DP_COMPUTE_PROTO``, and a 2 x 2
DP x TP mesh of four through ``make_nd_compute_dataproto_dispatch_fn(mesh_name=
"train")``), each running verl's own ``ppo_loss`` on random log-probs and
masks with uneven micro-batch counts (2 on DP rank 0, 3 on DP rank 1), verl's
``append_to_dict``, ``allgather_dict_into_dict`` and ``Metric.aggregate_dp``
as its engine worker calls them; the driver reduces with verl's
``reduce_metrics`` and logs through ``metricsync.integrations.verl.Tracking``
with ``["console", "file"]``. ``install(token_mean=True)`` runs in the driver
and in every worker. Every key verl's file logger wrote is compared with numpy
over all the samples at once. One Ray session on 127.0.0.1 serves the module.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _ray import local_ray

import metricsync.verl_compat as vc
from metricsync.integrations.verl import Tracking

ray = pytest.importorskip("ray", reason="ray (test extra) is not installed")
pytest.importorskip("verl.single_controller.ray", reason="verl (test extra) is not installed")
pytest.importorskip("verl.workers.utils.losses", reason="verl (test extra) is not installed")

pytestmark = pytest.mark.ray
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "verl_single_controller.py"
DP = 2
TOKEN_MEANS = ("actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower")


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("verl_single_controller", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


example = _load_example()


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    with local_ray(6, by_value=example):  # workers cannot import it by name
        yield


@pytest.fixture(autouse=True)
def _never_left_installed() -> Iterator[None]:
    yield
    vc.uninstall()


def brute_force(batch: Any) -> dict[str, float]:
    """Every key verl logs, with numpy over all the step's samples (no verl, no metricsync)."""
    t = {key: value.numpy() for key, value in batch.batch.items()}
    mask = t["response_mask"].astype(bool)
    log_ratio = np.clip(t["log_probs"] - t["old_log_probs"], -20.0, 20.0)
    ratio, adv = np.exp(log_ratio), t["advantages"]
    cfg = example.LOSS_CONFIG
    unclipped = -adv * ratio
    clipped = -adv * np.clip(ratio, 1 - cfg["clip_ratio_low"], 1 + cfg["clip_ratio_high"])
    pessimistic = np.maximum(unclipped, clipped)
    dual = -adv * cfg["clip_ratio_c"]
    pg = np.where(adv < 0, np.minimum(dual, pessimistic), pessimistic)
    kl = t["log_probs"] - t["ref_log_prob"]  # verl's "k1"
    want = {  # token means over every valid token of the step
        "actor/ppo_kl": -log_ratio[mask].mean(),
        "actor/pg_clipfrac": (clipped > unclipped)[mask].mean(),
        "actor/pg_clipfrac_lower": ((pessimistic > dual) & (adv < 0))[mask].mean(),
    }
    # verl's loss-scaled keys: the token mean of each mini-batch (over both DP ranks), then
    # the mean over mini-batches
    ranks = np.array_split(np.arange(mask.shape[0]), DP)
    minis = [
        np.concatenate([np.array_split(rows, example.MINI_BATCHES)[j] for rows in ranks])
        for j in range(example.MINI_BATCHES)
    ]
    for key, per_token in {
        "actor/pg_loss": pg,
        "actor/entropy_loss": t["entropy"],
        "actor/kl_loss": kl,
        "actor/loss": pg + cfg["kl_loss_coef"] * kl,
    }.items():
        want[key] = np.mean([per_token[rows][mask[rows]].mean() for rows in minis])
    want["actor/kl_coef"] = cfg["kl_loss_coef"]
    return {key: float(value) for key, value in want.items()}


@pytest.mark.parametrize(
    "tp", [1, pytest.param(2, marks=pytest.mark.slow)], ids=["dp2", "dp2xtp2"]
)  # the 2 x 2 mesh starts 4 more workers: make test-slow (CI) runs it
def test_every_logged_key_is_the_brute_force_number(
    cluster: None,
    tp: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    monkeypatch.setenv("COLUMNS", "400")
    batches = [example.make_batch(step, dp_size=DP) for step in (1, 2)]
    with vc.install(token_mean=True):
        group = example.start_workers(tp, token_mean=True)
        try:
            tracking = Tracking("metricsync-tests", f"e2e-tp{tp}", ["console", "file"])
            for step, batch in enumerate(batches, start=1):
                tracking.log(data=example.driver_step(group, batch, tp), step=step)
            tracking.finish(exit_code=0)
        finally:
            for worker in group.workers:
                ray.kill(worker)
    with open(tmp_path / "verl.jsonl") as f:
        logged = [json.loads(line) for line in f]
    assert [row["step"] for row in logged] == [1, 2]
    for row, batch in zip(logged, batches, strict=True):
        want = brute_force(batch)
        assert set(row["data"]) == set(want)
        for key, value in want.items():
            assert math.isclose(row["data"][key], value, rel_tol=1e-6, abs_tol=1e-12), (
                key,
                row["data"][key],
                value,
            )
        # the example's own check agrees with this one
        for key, value in example.brute_force([batch], dp_size=DP).items():
            assert math.isclose(value, want[key], rel_tol=1e-9, abs_tol=1e-12), key
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert len(printed) == 2 and all(key in printed[0] for key in TOKEN_MEANS)
