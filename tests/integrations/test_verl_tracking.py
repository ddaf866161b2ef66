"""verl's ``Tracking`` interface on metricsync's backends (verl itself is not needed).

Oracles: the JSONL file read with the json module, TensorBoard's own reader,
MLflow's own client, and W&B's offline run files.
"""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

import metricsync as ms
from metricsync.integrations import verl as verl_tracking
from metricsync.integrations.verl import Tracking

from ._collect import Collect

STEP1 = {
    "actor/pg_loss": np.float32(0.0123),
    "actor/lr": 1e-6,
    "timing_s/gen": 12.5,
    "response_length/mean": np.float64(211.25),
    "perf/total_num_tokens": 123456789,
}


def _jsonl(path: Path) -> tuple[dict[str, object], list[tuple[int, dict[str, float]]]]:
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    header = next(line for line in lines if "formats" in line)
    return header, [(line["step"], line["values"]) for line in lines if "step" in line]


def test_console_jsonl_and_tensorboard_with_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("COLUMNS", "400")  # one console line: this test is about formats
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    specs = {"timing_s/*": ms.Spec(fmt=".3f"), "perf/total_num_tokens": ms.Spec(fmt=",.0f")}
    tracking = Tracking(
        "gsm8k",
        "ppo",
        default_backend=["console", "jsonl", "tensorboard"],
        config={"trainer": {"total_epochs": 1}},
        run_dir=tmp_path / "run",
        specs=specs,
    )
    tracking.log(data=STEP1, step=1)
    tracking.log(data={"actor/pg_loss": 0.5}, step=2, backend=["jsonl"])
    tracking.finish()
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "step 1 | actor/pg_loss   0.0123  actor/lr 1.00e-06  timing_s/gen   12.500  "
        "response_length/mean    211.2  perf/total_num_tokens 123,456,789"
    ]
    header, rows = _jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows == [(1, {k: float(v) for k, v in STEP1.items()}), (2, {"actor/pg_loss": 0.5})]
    assert header["formats"]["timing_s/gen"] == ".3f"  # type: ignore[index]
    assert _tb_scalars(str(tmp_path / "tb"), "timing_s/gen") == [(1, 12.5)]
    assert all(_tb_scalars(str(tmp_path / "tb"), key) for key in STEP1)


def test_tensorboard_defaults_to_verls_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard")
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with Tracking("proj", "exp", "tensorboard") as tracking:
        tracking.log({"x": 1.0}, step=1)
    assert list((tmp_path / "tensorboard_log" / "proj" / "exp").glob("events.out.tfevents.*"))


def test_non_numbers_are_skipped_once_and_a_metrics_is_logged_whole(tmp_path: Path) -> None:
    collect = Collect()
    tracking = Tracking("p", "e", "jsonl", run_dir=tmp_path)
    tracking.logger["jsonl"] = ms.Tracker(collect, run_dir=tmp_path / "unused")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracking.log({"val/table": [[1, 2]], "val/score": 0.5}, step=1)
        tracking.log({"val/table": [[3, 4]], "val/score": 0.75}, step=2)
    assert [str(w.message) for w in caught] == [
        "metricsync: verl Tracking skips 'val/table': expected one number, got list"
    ]
    synced = ms.Metrics({"len": ms.Spec(("mean", "max"), fmt=".0f")})
    synced.record("len", [100, 300])
    tracking.log(synced, step=3)
    assert collect.rows == [
        (1, {"val/score": 0.5}, {"val/score": None}),
        (2, {"val/score": 0.75}, {"val/score": None}),
        (3, {"len/mean": 200.0, "len/max": 300.0}, {"len/mean": ".0f", "len/max": ".0f"}),
    ]


def test_backend_names_and_errors(tmp_path: Path) -> None:
    assert Tracking.supported_backend == sorted(verl_tracking.BACKEND_NAMES)
    with pytest.raises(ValueError, match="clearml"):
        Tracking("p", "e", ["jsonl", "clearml"], run_dir=tmp_path)
    with pytest.raises(TypeError, match="backend names"):
        Tracking("p", "e", ["jsonl", 3], run_dir=tmp_path)  # type: ignore[list-item]


def test_mlflow_experiment_is_the_project_and_run_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with Tracking("gsm8k", "ppo-run", "mlflow", run_dir=tmp_path / "run") as tracking:
        tracking.log({"critic/score/mean": 0.5}, step=1)
        tracking.log({"critic/score/mean": 0.75}, step=2)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("gsm8k")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "ppo-run"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.75)]


def test_wandb_gets_project_name_and_config_and_tracking_is_its_alias(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DIR": str(tmp_path / "wandb_dir"),
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(name, value)
    config = {"trainer": {"total_epochs": 3}, "actor": {"lr": 1e-6}}
    with pytest.warns(DeprecationWarning, match="wandb"):
        tracking = Tracking("gsm8k", "ppo-run", ["tracking", "wandb"], config=config)
    assert list(tracking.logger) == ["tracking"]  # one W&B run for the alias and the name
    import wandb

    run = wandb.run  # W&B's own view of the run the backend started
    assert run is not None
    assert (run.project, run.name) == ("gsm8k", "ppo-run")
    assert run.config["trainer"] == {"total_epochs": 3} and run.config["actor"] == {"lr": 1e-6}
    tracking.log({"critic/score/mean": 0.5}, step=1)
    tracking.finish()
    assert wandb.run is None  # finished with the Tracking


def test_install_replaces_verls_class_everywhere_and_uninstall_restores() -> None:
    original = type("Tracking", (), {})
    tracking_module = types.ModuleType("verl.utils.tracking")
    tracking_module.Tracking = original  # type: ignore[attr-defined]
    trainer_module = types.ModuleType("verl.trainer.fsdp_sft_trainer")
    trainer_module.Tracking = original  # type: ignore[attr-defined]  # a module-level import
    saved = {
        name: sys.modules.get(name) for name in (tracking_module.__name__, trainer_module.__name__)
    }
    sys.modules[tracking_module.__name__] = tracking_module
    sys.modules[trainer_module.__name__] = trainer_module
    try:
        assert verl_tracking.install() is Tracking
        assert verl_tracking.install() is Tracking  # twice: still one original to restore
        assert tracking_module.Tracking is Tracking and trainer_module.Tracking is Tracking  # type: ignore[attr-defined]
        verl_tracking.uninstall()
        assert tracking_module.Tracking is original and trainer_module.Tracking is original  # type: ignore[attr-defined]
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _tb_scalars(run: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a scalar metricsync's TensorBoard backend wrote (float32 scalar events)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]
