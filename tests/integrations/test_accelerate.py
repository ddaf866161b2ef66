"""The accelerate tracker through a real ``Accelerator(log_with=...)`` on CPU.

Oracles: the JSONL file read with the json module, and TensorBoard's own reader.
"""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from accelerate import Accelerator

import metricsync as ms
from metricsync.integrations.accelerate import MetricsyncTracker, register

from ._collect import Collect


def _jsonl(path: object) -> list[dict[str, object]]:
    with open(path) as f:  # type: ignore[call-overload]
        return [json.loads(line) for line in f if '"step"' in line]


def test_log_with_an_instance_writes_through_metricsync(tmp_path: pytest.TempPathFactory) -> None:
    tracker = MetricsyncTracker("proj", backends=("jsonl", "tensorboard"), run_dir=tmp_path / "run")
    accelerator = Accelerator(cpu=True, log_with=tracker)
    accelerator.init_trackers("proj", config={"lr": 3e-4, "batch_size": 8})
    assert tracker.config == {"lr": 3e-4, "batch_size": 8}
    metrics = ms.Metrics({"len": ms.Spec(("mean", "max"), fmt=".1f")})
    metrics.record("len", [10.0, 30.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.log({"loss": 0.5, "lr": 3e-4, "note": "warmup"}, step=1)
        accelerator.log({"loss": 0.25, "lr": 2e-4, "note": "again"}, step=2)
    assert [str(w.message) for w in caught if "skips" in str(w.message)] == [
        "metricsync: accelerate tracker skips 'note': expected one number, got str"
    ]
    accelerator.log(metrics.sync(), step=3)  # a Metrics: formats come with it
    accelerator.log({"loss": 0.125})  # no step: the next one
    accelerator.end_training()
    rows = _jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [(r["step"], r["values"]) for r in rows] == [
        (1, {"loss": 0.5, "lr": 3e-4}),
        (2, {"loss": 0.25, "lr": 2e-4}),
        (3, {"len/mean": 20.0, "len/max": 30.0}),
        (4, {"loss": 0.125}),
    ]
    assert _tb_scalars(str(tmp_path / "run"), "loss") == [(1, 0.5), (2, 0.25), (4, 0.125)]


def test_log_with_the_registered_name(tmp_path: pytest.TempPathFactory) -> None:
    register()
    register()  # again: nothing changes, no warning
    collect = Collect()
    accelerator = Accelerator(cpu=True, log_with="metricsync")
    accelerator.init_trackers(
        "proj",
        init_kwargs={"metricsync": {"tracker": ms.Tracker(collect, run_dir=tmp_path / "unused")}},
    )
    made = accelerator.get_tracker("metricsync")
    assert isinstance(made, MetricsyncTracker) and made.run_name == "proj"
    accelerator.log({"loss": 1.5}, step=7)
    accelerator.end_training()
    assert collect.rows == [(7, {"loss": 1.5}, {"loss": None})]
    assert not collect.closed  # a Tracker passed in belongs to the caller


def _tb_scalars(run: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a scalar metricsync's TensorBoard backend wrote (float32 scalar events)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]
