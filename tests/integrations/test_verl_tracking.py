"""verl's ``Tracking`` interface on metricsync's backends, and verl's own for the rest.

Oracles: the JSONL file read with the json module, TensorBoard's own reader,
MLflow's own client, W&B's offline run files, and verl's own ``Tracking``
(its ``file`` backend's bytes) where verl is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path
from typing import ClassVar

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
        tracking.log({"val/table": [[1, 2]], "val/score": 0.5, "val/ok": True}, step=1)
        tracking.log({"val/table": [[3, 4]], "val/score": 0.75, "val/ok": np.bool_(False)}, step=2)
    assert [str(w.message) for w in caught] == [
        "metricsync: verl Tracking skips 'val/table' on metricsync's backends: expected one "
        "number, got list"
    ]
    synced = ms.Metrics({"len": ms.Spec(("mean", "max"), fmt=".0f")})
    synced.record("len", [100, 300])
    tracking.log(synced, step=3)
    assert collect.rows == [
        (1, {"val/score": 0.5, "val/ok": 1.0}, {"val/score": None, "val/ok": None}),
        (2, {"val/score": 0.75, "val/ok": 0.0}, {"val/score": None, "val/ok": None}),
        (3, {"len/mean": 200.0, "len/max": 300.0}, {"len/mean": ".0f", "len/max": ".0f"}),
    ]
    tracking.finish()
    assert collect.closed


def test_backend_names_and_errors(tmp_path: Path) -> None:
    assert Tracking.supported_backend == sorted(
        {*verl_tracking.BACKEND_NAMES, *verl_tracking.VERL_BACKENDS}
    )
    with pytest.raises(ValueError, match="bogus"):
        Tracking("p", "e", ["jsonl", "bogus"], run_dir=tmp_path)
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
    for name, value in _wandb_offline(tmp_path).items():
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


# ---------------------------------------------------------------- verl's own backends


class _RecordingLogger:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, object]]] = []

    def log(self, data: dict[str, object], step: int) -> None:
        self.logged.append((step, data))


class _FakeVerlTracking:
    """verl's Tracking as far as delegation uses it: one logger per name, finish(exit_code)."""

    made: ClassVar[list[_FakeVerlTracking]] = []

    def __init__(self, project: str, experiment: str, names: list[str], config: object) -> None:
        self.args = (project, experiment, list(names), config)
        self.logger = {name: _RecordingLogger() for name in names}
        self.finished: list[int] = []
        _FakeVerlTracking.made.append(self)

    def finish(self, exit_code: int = 0) -> None:
        self.finished.append(exit_code)


def test_verls_own_backends_get_the_dict_as_is_and_the_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("verl.utils.tracking")
    fake.Tracking = _FakeVerlTracking  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "verl.utils.tracking", fake)
    _FakeVerlTracking.made.clear()
    collect = Collect()
    config = {"trainer": {"logger": ["jsonl", "vemlp_wandb", "clearml"]}}
    tracking = Tracking("p", "e", ["jsonl", "vemlp_wandb", "clearml"], config, run_dir=tmp_path)
    tracking.logger["jsonl"] = ms.Tracker(collect, run_dir=tmp_path / "unused")
    assert list(tracking.logger) == ["jsonl", "vemlp_wandb", "clearml"]
    assert [made.args for made in _FakeVerlTracking.made] == [
        ("p", "e", ["vemlp_wandb"], config),
        ("p", "e", ["clearml"], config),
    ]
    step = {"loss": 0.5, "done": True, "note": "warm-up", "lens": [3, 4]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tracking.log(step, step=1)
        tracking.log({"loss": 0.25}, step=2, backend=["clearml"])
    assert tracking.logger["vemlp_wandb"].logged == [(1, step)]  # untouched, as verl gives it
    assert tracking.logger["clearml"].logged == [(1, step), (2, {"loss": 0.25})]
    assert collect.rows == [(1, {"loss": 0.5, "done": 1.0}, {"loss": None, "done": None})]
    tracking.finish(exit_code=1)
    tracking.finish(exit_code=0)  # once only
    assert [made.finished for made in _FakeVerlTracking.made] == [[1], [1]]
    assert collect.closed


def test_a_verl_backend_without_verl_names_verl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "verl.utils.tracking", None)  # import fails
    with pytest.raises(ModuleNotFoundError, match="'file' backend is verl's own") as caught:
        Tracking("p", "e", ["jsonl", "file"], run_dir=tmp_path)
    assert caught.value.name == "verl"


def _verl() -> types.ModuleType:
    return pytest.importorskip("verl.utils.tracking", reason="verl (test extra) is not installed")


def test_every_name_verls_tracking_accepts_is_accepted() -> None:
    verl_names = set(_verl().Tracking.supported_backend) | {"tracking"}
    assert verl_names <= set(Tracking.supported_backend)
    assert set(verl_tracking.VERL_BACKENDS) == verl_names - set(verl_tracking.BACKEND_NAMES)


@pytest.mark.parametrize(
    ("name", "package"), [("clearml", "clearml"), ("vemlp_wandb", "volcengine_ml_platform")]
)
def test_a_verl_backend_without_its_package_names_the_package(
    tmp_path: Path, name: str, package: str
) -> None:
    _verl()
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    with pytest.raises(ModuleNotFoundError, match=f"verl's '{name}' backend needs the") as caught:
        Tracking("p", "e", ["jsonl", name], run_dir=tmp_path)
    assert caught.value.name == package and package in str(caught.value)


VERL_STEPS = [
    {
        "actor/pg_loss": np.float64(0.0123),
        "actor/lr": 1e-6,
        "training/global_step": 1,
        "training/epoch": 0,
        "val/done": True,
        "val/note": "first",
        "val/lengths": [3, 4],
    },
    {"actor/pg_loss": 0.5, "val/done": False},
]


def test_a_trainer_with_console_and_file_writes_what_verls_file_logger_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """trainer.logger=[console,file] as verl's ray_trainer builds it, finished as main_ppo does."""
    verl_module = _verl()
    omegaconf = pytest.importorskip("omegaconf")
    monkeypatch.setenv("COLUMNS", "400")
    config = omegaconf.OmegaConf.create(
        {
            "trainer": {
                "project_name": "gsm8k",
                "experiment_name": "ppo",
                "logger": ["console", "file"],
            }
        }
    )

    def run(path: Path) -> None:
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
        tracking_class = verl_module.Tracking  # whatever verl's module holds now
        tracking = tracking_class(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=config.trainer.logger,
            config=omegaconf.OmegaConf.to_container(config, resolve=True),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step, data in enumerate(VERL_STEPS, start=1):
                tracking.log(data=data, step=step)
        tracking.finish(exit_code=0)

    run(tmp_path / "verl.jsonl")  # verl's own Tracking: the oracle
    capsys.readouterr()
    assert verl_tracking.install() is Tracking
    try:
        run(tmp_path / "ours.jsonl")
    finally:
        verl_tracking.uninstall()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert printed[0].startswith("step 1 | actor/pg_loss")
    assert "val/note" not in printed[0] and "val/done" in printed[0]
    ours = (tmp_path / "ours.jsonl").read_bytes()
    assert ours == (tmp_path / "verl.jsonl").read_bytes()
    assert json.loads(ours.splitlines()[0])["data"]["val/lengths"] == [3, 4]


def test_rl_insight_is_verls_own_and_idle_unless_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _verl()
    monkeypatch.delenv("VERL_RL_INSIGHT_ENABLE", raising=False)
    with Tracking("p", "e", ["jsonl", "rl_insight"], run_dir=tmp_path) as tracking:
        tracking.log({"x": 1.0}, step=1)
        assert type(tracking.logger["rl_insight"]).__name__ == "RLInsightLogger"
    _, rows = _jsonl(tmp_path / "metrics.jsonl")
    assert rows == [(1, {"x": 1.0})]


# ---------------------------------------------------------------- interpreter exit

EXIT_SCRIPT = """
import gc, sys
from metricsync.integrations.verl import Tracking

names = ["console", "jsonl"] + (["wandb"] if {wandb} else [])
left_open = Tracking("p", "e", names, run_dir={run!r})  # never finished
left_open.log({{"loss": 0.5}}, step=1)


class Holder:
    pass


cycle = Holder()
cycle.self, cycle.tracking = cycle, Tracking("p", "e2", ["jsonl"], run_dir={run2!r})
cycle.tracking.log({{"loss": 0.25}}, step=1)
try:
    Tracking("p", "e3", ["jsonl", "bogus"], run_dir={run3!r})
except ValueError:
    pass
sys.modules["metricsync"].keep = left_open  # outlives __main__'s globals at shutdown
"""


def test_no_exception_or_hang_at_interpreter_exit(tmp_path: Path) -> None:
    """Trackings left open are finished at exit, with W&B too; nothing is printed to stderr."""
    import importlib.util

    with_wandb = importlib.util.find_spec("wandb") is not None
    script = EXIT_SCRIPT.format(
        wandb=with_wandb,
        run=str(tmp_path / "a"),
        run2=str(tmp_path / "b"),
        run3=str(tmp_path / "c"),
    )
    env = {**os.environ, **_wandb_offline(tmp_path), "PYTHONWARNINGS": "default"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(ms.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,  # before the exit hook, W&B's client hung in the finalizer
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert _jsonl(tmp_path / "a" / "metrics.jsonl")[1] == [(1, {"loss": 0.5})]
    assert _jsonl(tmp_path / "b" / "metrics.jsonl")[1] == [(1, {"loss": 0.25})]


def _wandb_offline(tmp_path: Path) -> dict[str, str]:
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DIR": str(tmp_path / "wandb_dir"),
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
    }


def _tb_scalars(run: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a scalar metricsync's TensorBoard backend wrote (float32 scalar events)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run)
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]
