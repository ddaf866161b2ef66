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
from metricsync.testing import run_distributed

from ._collect import Collect
from ._launch import as_launched


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


def _record(metrics: ms.Metrics, rank: int) -> None:
    for name in ("zeta", "alpha", "len"):  # recorded out of name order
        metrics.record(name, [1.0 + rank, 2.0])


# The order a sync over several processes computes: metrics by name, each one's keys in its spec's.
NAME_ORDER = ["alpha", "len/mean", "len/max", "zeta"]


def _logged_orders(rank: int, world: int, tmp: str, log_dict: bool) -> list[list[str]]:
    """The key order of each row a real Accelerator logs, on ``world`` processes."""

    if world > 1:  # the process group run_distributed made: accelerate takes it as it is
        as_launched(rank, world, LOCAL_WORLD_SIZE=str(world))
    collect = Collect()
    tracker = MetricsyncTracker(tracker=ms.Tracker(collect, run_dir=f"{tmp}/rank{rank}"))
    accelerator = Accelerator(cpu=True, log_with=tracker)
    assert accelerator.num_processes == world
    accelerator.init_trackers("proj")
    metrics = ms.Metrics({"len": ms.Spec(("mean", "max"))})
    for step in (1, 2):
        _record(metrics, rank)
        synced = metrics.sync()
        metrics.reset()
        accelerator.log(synced.compute() if log_dict else synced, step=step)
    accelerator.end_training()
    return [list(values) for _, values, _ in collect.rows]


def test_a_metrics_is_logged_in_the_same_key_order_on_one_process_and_on_two(
    tmp_path: pytest.TempPathFactory,
) -> None:
    # before: the order recorded in (zeta, alpha, len) on one process, name order on two
    assert _logged_orders(0, 1, str(tmp_path), False) == [NAME_ORDER, NAME_ORDER]
    on_two = run_distributed(_logged_orders, 2, args=(str(tmp_path), False), timeout=120)
    assert on_two == [[NAME_ORDER, NAME_ORDER], []]  # accelerate logs on the main process only


def test_a_synced_dict_is_logged_in_the_same_key_order_on_one_process_and_on_two(
    tmp_path: pytest.TempPathFactory,
) -> None:
    # accelerator.log(metrics.sync().compute()): the tracker logs a dict in its own order, so
    # this depends on the order Metrics.sync() computes: name order on one process and on two.
    on_two = run_distributed(_logged_orders, 2, args=(str(tmp_path), True), timeout=120)
    assert on_two == [[NAME_ORDER, NAME_ORDER], []]
    assert _logged_orders(0, 1, str(tmp_path), True) == [NAME_ORDER, NAME_ORDER]


def test_one_console_line_per_log_and_names_unprefixed_beside_accelerates_tensorboard(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    tracker = MetricsyncTracker(backends="console", run_dir=tmp_path / "run")
    accelerator = Accelerator(cpu=True, log_with=[tracker, "tensorboard"], project_dir=tmp_path)
    accelerator.init_trackers("proj", config={"lr": 3e-4})
    for step in (1, 2, 3):
        accelerator.log({"train/loss": 1.0 / step, "val/loss": 2.0 / step, "lr": 3e-4}, step=step)
    accelerator.end_training()
    out = capsys.readouterr().out
    heads = [line.split("|")[0].strip() for line in out.splitlines() if line.startswith("step ")]
    assert heads == ["step 1", "step 2", "step 3"]
    printed = {word for line in out.splitlines() for word in line.split("|")[-1].split()}
    assert {"train/loss", "val/loss", "lr"} <= printed
    assert not any(word.count("/") > 1 for word in printed)
    tb_dir = next(p.parent for p in (tmp_path / "proj").rglob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "val/loss", "lr"}
