"""The tensorboard, wandb and mlflow backends, read back with each tool's own reader.

Nothing here reaches the network: wandb runs offline, mlflow uses local stores.
"""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import pytest

from metricsync._logfile import read_jsonl
from metricsync._tracker import Tracker

STEPS = [
    (1, {"loss": 0.5, "actor/lr": 3e-4, "grad_norm": math.nan}),
    (2, {"loss": 0.25, "actor/lr": 2e-4, "grad_norm": math.inf}),
    (3, {"loss": 0.125, "actor/lr": 1e-4, "grad_norm": 1.5}),
]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6)


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    with Tracker(("jsonl", "tensorboard"), run_dir=tmp_path) as tracker:
        for step, values in STEPS:
            tracker.log(values, step=step)
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert sorted(accumulator.Tags()["scalars"]) == ["actor/lr", "grad_norm", "loss"]
    for key in ("loss", "actor/lr", "grad_norm"):
        events = accumulator.Scalars(key)
        assert [e.step for e in events] == [1, 2, 3]
        assert all(_same(e.value, v[key]) for e, (_, v) in zip(events, STEPS, strict=True))
    assert len(read_jsonl(tmp_path)[1]) == 3  # the JSONL log sits next to the event files


def _wandb_history(run_file: Path) -> list[dict]:
    """History rows of an offline ``.wandb`` file (a LevelDB-style record log)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk of a record
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
    return rows


@pytest.mark.parametrize("use_wandb_dir", [True, False])
def test_wandb_offline_run_holds_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_wandb_dir: bool
) -> None:
    pytest.importorskip("wandb")
    run_dir, wandb_dir = tmp_path / "run", tmp_path / "wandb_dir"
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(name, value)
    if use_wandb_dir:
        monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    else:
        monkeypatch.delenv("WANDB_DIR", raising=False)
    with Tracker(("jsonl", "wandb"), run_dir=run_dir, project="metricsync-test", name="t") as t:
        for step, values in STEPS:
            t.log(values, step=step)
    root = wandb_dir if use_wandb_dir else run_dir
    [run_file] = root.glob("wandb/offline-run-*/run-*.wandb")
    rows = _wandb_history(run_file)
    deadline = time.monotonic() + 30.0
    while (
        len(rows) < len(STEPS) and time.monotonic() < deadline
    ):  # wandb's writer is another process
        time.sleep(0.2)
        rows = _wandb_history(run_file)
    assert [row["_step"] for row in rows] == [1, 2, 3]
    for row, (_, values) in zip(rows, STEPS, strict=True):
        assert all(_same(row[key], value) for key, value in values.items())
    assert len(read_jsonl(run_dir)[1]) == 3


def _mlflow_histories(uri: str) -> tuple[str, dict[str, list[tuple[int, float]]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("metricsync")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    histories = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }
    return run.info.status, histories


def test_mlflow_file_store_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    steps = [(s, {**v, "acc@1": s / 10}) for s, v in STEPS]
    with Tracker("mlflow", run_dir=tmp_path / "run", name="t") as tracker:
        for step, values in steps:
            tracker.log(values, step=step)
    status, histories = _mlflow_histories(uri)
    assert status == "FINISHED"
    assert sorted(histories) == ["acc_1", "actor/lr", "grad_norm", "loss"]  # "@" sanitised
    for key, name in [("loss", "loss"), ("acc@1", "acc_1"), ("grad_norm", "grad_norm")]:
        got = sorted(histories[name])
        assert [s for s, _ in got] == [1, 2, 3]
        assert all(_same(g, v[key]) for (_, g), (_, v) in zip(got, steps, strict=True))
    assert not (tmp_path / "run").exists()  # nothing but the tracking store was written


def test_mlflow_defaults_to_a_sqlite_store_in_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with Tracker("mlflow", run_dir=tmp_path, experiment="metricsync") as tracker:
        tracker.log({"loss": 0.5}, step=7)
    status, histories = _mlflow_histories(f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    assert status == "FINISHED"
    assert histories == {"loss": [(7, 0.5)]}
