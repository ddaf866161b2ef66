"""Tests of metricsync._tracking._tracker, the console and JSONL backends, and metricsync._log._logfile."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from metricsync._log._logread import read_jsonl
from metricsync._tracking._tracker import Tracker, detect_rank

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch


def _strict_lines(path: Path) -> list[dict]:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} in {path}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


class Recorder:
    """A custom backend keeping what it receives."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float], dict[str, str | None]]] = []
        self.closed = False

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        self.rows.append((step, dict(values), dict(formats)))

    def close(self) -> None:
        self.closed = True


class Exploding(Recorder):
    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        raise OSError(f"disk full at {step}")

    def close(self) -> None:
        raise OSError("cannot close")


class FakeMetrics:
    """Duck-typed stand-in for metricsync.Metrics."""

    def compute(self) -> dict[str, float]:
        return {"actor/lr": 3e-4, "loss": 0.25, "tokens": 123456789.0}

    def key_formats(self) -> dict[str, str | None]:
        return {"actor/lr": ".2e", "loss": ".3f", "tokens": ",.0f", "unused": ".1f"}


def test_jsonl_is_strict_json_with_header_then_steps(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        for step in range(3):
            tracker.log({"loss": [math.nan, math.inf, -math.inf][step], "ok": 1.0}, step=step)
    records = _strict_lines(tmp_path / "metrics.jsonl")
    assert records[0]["metricsync"] == 1
    assert records[0]["formats"] == {"loss": None, "ok": None}
    assert [r["step"] for r in records[1:]] == [0, 1, 2]
    assert [r["values"]["loss"] for r in records[1:]] == ["nan", "inf", "-inf"]
    assert all(isinstance(r["time"], float) for r in records)


def test_nan_and_inf_round_trip_through_read_jsonl(tmp_path: Path) -> None:
    logged = {"a": math.nan, "b": math.inf, "c": -math.inf, "d": -0.5, "e": 1e-300}
    with Tracker(run_dir=tmp_path) as tracker:
        tracker.log(logged, step=5)
    formats, steps = read_jsonl(tmp_path / "metrics.jsonl")
    assert formats == dict.fromkeys(logged)
    [(step, values)] = steps
    assert step == 5
    assert math.isnan(values.pop("a"))
    assert values == {"b": math.inf, "c": -math.inf, "d": -0.5, "e": 1e-300}


def test_duck_typed_metrics_bring_their_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Tracker(("console", "jsonl"), run_dir=tmp_path) as tracker:
        tracker.log(FakeMetrics(), step=1)
    assert capsys.readouterr().out == (
        "step 1 | actor/lr 3.00e-04  loss    0.250  tokens 123,456,789\n"
    )
    formats, steps = read_jsonl(tmp_path)
    assert formats == {"actor/lr": ".2e", "loss": ".3f", "tokens": ",.0f"}
    assert steps == [(1, {"actor/lr": 3e-4, "loss": 0.25, "tokens": 123456789.0})]


def test_console_lines_are_aligned_and_filtered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Tracker("console", run_dir=tmp_path, console_keys=["loss", "timing/*"]) as tracker:
        tracker.log({"loss": 0.6931, "lr": 1e-6, "timing/step": 0.25}, step=1)
        tracker.log({"loss": 12.5, "lr": 1e-6, "timing/step": 123456.0}, step=2)
        tracker.log({"lr": 1e-6}, step=3)  # nothing selected: no line
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "step 1 | loss   0.6931  timing/step     0.25",
        "step 2 | loss     12.5  timing/step  123,456",
    ]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_dict_values_from_numpy_and_torch_become_floats(tmp_path: Path) -> None:
    recorder = Recorder()
    values = {
        "np64": np.float64(0.5),
        "np32": np.float32(0.25),
        "npint": np.int64(7),
        "npbool": np.bool_(True),
        "np0d": np.array(2.0),
        "t0d": torch.tensor(1.5),
        "tint": torch.tensor(3),
        "bool": False,
        "int": 42,
    }
    with Tracker(recorder, run_dir=tmp_path) as tracker:
        tracker.log(values, step=1)
    [(_, got, formats)] = recorder.rows
    assert got == {
        "np64": 0.5,
        "np32": 0.25,
        "npint": 7.0,
        "npbool": 1.0,
        "np0d": 2.0,
        "t0d": 1.5,
        "tint": 3.0,
        "bool": 0.0,
        "int": 42.0,
    }
    assert all(type(v) is float for v in got.values())
    assert formats == dict.fromkeys(values)
    assert recorder.closed


@pytest.mark.parametrize(
    "bad", ["0.5", None, 1 + 2j, np.complex64(1), [1.0], np.ones(2), torch.ones(3), object()]
)
def test_non_numeric_values_raise_type_error_naming_the_key(tmp_path: Path, bad: object) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        with pytest.raises(TypeError, match="'actor/bad'"):
            tracker.log({"fine": 1.0, "actor/bad": bad}, step=1)
        tracker.log({"fine": 2.0}, step=2)
    assert read_jsonl(tmp_path)[1] == [(2, {"fine": 2.0})]


def test_logging_anything_else_raises(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        with pytest.raises(TypeError, match="Metrics"):
            tracker.log([("a", 1.0)], step=1)
        with pytest.raises(TypeError, match="str"):
            tracker.log({1: 1.0}, step=1)
        with pytest.raises(TypeError):
            tracker.log({"a": 1.0}, step=1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            tracker.log({"a": 1.0}, step=True)
    with pytest.raises(RuntimeError, match="close"):
        tracker.log({"a": 1.0}, step=1)


def test_reopening_a_run_dir_appends_and_continues(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        for step in (1, 2):
            tracker.log({"loss": 1.0 / step}, step=step)
    with Tracker(run_dir=tmp_path) as tracker:
        for step in (3, 4):
            tracker.log(FakeMetrics(), step=step)
    formats, steps = read_jsonl(tmp_path)
    assert [s for s, _ in steps] == [1, 2, 3, 4]
    assert formats == {"loss": ".3f", "actor/lr": ".2e", "tokens": ",.0f"}  # latest header wins
    records = _strict_lines(tmp_path / "metrics.jsonl")
    headers = [r for r in records if "metricsync" in r]
    assert len(headers) == 2  # the second one for the new or changed keys
    assert headers[1]["formats"] == {"actor/lr": ".2e", "loss": ".3f", "tokens": ",.0f"}


def test_later_headers_win_for_changed_formats(tmp_path: Path) -> None:
    class WithFormats:
        def compute(self) -> dict[str, float]:
            return {"loss": 0.5}

        def key_formats(self) -> dict[str, str | None]:
            return {"loss": ".3f"}

    with Tracker(run_dir=tmp_path) as tracker:
        tracker.log({"loss": 0.5}, step=1)
        tracker.log(WithFormats(), step=2)
        tracker.log(WithFormats(), step=3)  # unchanged: no new header
    records = _strict_lines(tmp_path / "metrics.jsonl")
    assert [("h" if "metricsync" in r else r["step"]) for r in records] == ["h", 1, "h", 2, 3]
    assert read_jsonl(tmp_path)[0] == {"loss": ".3f"}


def test_steps_going_backwards_warn_and_are_still_written(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        tracker.log({"a": 1.0}, step=10)
        tracker.log({"a": 1.0}, step=10)  # equal is fine
    with Tracker(run_dir=tmp_path) as tracker:  # the last step is read back from the file
        with pytest.warns(UserWarning, match="step 3 goes backwards.*10"):
            tracker.log({"a": 2.0}, step=3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tracker.log({"a": 3.0}, step=4)
    assert [s for s, _ in read_jsonl(tmp_path)[1]] == [10, 10, 3, 4]


def test_rank_other_than_zero_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    recorder = Recorder()
    with Tracker(("console", "jsonl", recorder), run_dir=run_dir, rank=1) as tracker:
        tracker.log({"a": 1.0}, step=1)
        assert tracker.backends == ()
    assert not run_dir.exists()
    assert recorder.rows == []
    assert capsys.readouterr().out == ""

    monkeypatch.setenv("RANK", "3")
    assert detect_rank() == 3
    with Tracker(run_dir=run_dir) as tracker:
        tracker.log({"a": 1.0}, step=1)
    assert not run_dir.exists()
    assert detect_rank(0) == 0  # explicit wins
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        detect_rank()


def test_an_initialized_process_group_wins_over_the_rank_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed without an active process group")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # keep gloo on loopback
    assert detect_rank() == 5
    init = (tmp_path / "store").as_uri()
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        assert detect_rank() == 0
        assert detect_rank(rank=4) == 4
        with Tracker(run_dir=tmp_path / "run") as tracker:
            tracker.log({"a": 1.0}, step=1)
        assert (tmp_path / "run" / "metrics.jsonl").exists()
    finally:
        dist.destroy_process_group()


def test_rank_zero_only_false_gives_each_rank_its_own_directory(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path, rank=2, rank_zero_only=False) as tracker:
        tracker.log({"a": 1.0}, step=1)
    assert read_jsonl(tmp_path / "rank2")[1] == [(1, {"a": 1.0})]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_failing_backend_warns_once_and_others_go_on(tmp_path: Path) -> None:
    recorder = Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Tracker(("jsonl", Exploding(), recorder), run_dir=tmp_path) as tracker:
            for step in range(5):
                tracker.log({"loss": float(step)}, step=step)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 2, messages  # one for logging, one for closing
    assert "'Exploding' failed at step 0" in messages[0] and "disk full at 0" in messages[0]
    assert "failed to close" in messages[1]
    assert [s for s, _ in read_jsonl(tmp_path)[1]] == [0, 1, 2, 3, 4]
    assert [s for s, _, _ in recorder.rows] == [0, 1, 2, 3, 4]
    assert recorder.closed


@pytest.mark.parametrize(
    ("backend", "modules", "extra"),
    [
        ("wandb", ["wandb"], "metricsync[wandb]"),
        ("mlflow", ["mlflow", "mlflow.entities", "mlflow.tracking"], "metricsync[mlflow]"),
        ("tensorboard", ["tensorboard"], "metricsync[tensorboard]"),
        ("swanlab", ["swanlab"], "metricsync[swanlab]"),
        ("trackio", ["trackio"], "metricsync[trackio]"),
    ],
)
def test_missing_optional_package_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, modules: list[str], extra: str
) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    recorder = Recorder()
    with pytest.raises(ImportError, match=f'pip install "{extra}"'.replace("[", r"\[")):
        Tracker(("jsonl", recorder, backend), run_dir=tmp_path)
    assert recorder.closed  # what was already set up is closed again


def test_bad_backend_names_and_options(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="console, jsonl, mlflow, swanlab, tensorboard, trackio, wandb"
    ):
        Tracker(("jsonl", "jsnol"), run_dir=tmp_path)
    with pytest.raises(ValueError, match="once"):
        Tracker(("jsonl", "jsonl"), run_dir=tmp_path)
    with pytest.raises(TypeError, match="projcet"):
        Tracker(run_dir=tmp_path, projcet="x")
    with pytest.raises(TypeError, match="log"):
        Tracker((object(),), run_dir=tmp_path)  # type: ignore[arg-type]
    assert not (tmp_path / "metrics.jsonl").exists()
    # an option of a backend that is not chosen is ignored
    Tracker("jsonl", run_dir=tmp_path, project="ignored").close()


def test_torn_last_line_is_skipped_with_a_warning_and_cut_on_resume(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        tracker.log({"a": 1.0}, step=1)
        tracker.log({"a": 2.0}, step=2)
    path = tmp_path / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"step": 3, "time": 1.0, "values": {"a": 3.')
    with pytest.warns(RuntimeWarning, match="torn last line"):
        _, steps = read_jsonl(path)
    assert steps == [(1, {"a": 1.0}), (2, {"a": 2.0})]

    with pytest.warns(RuntimeWarning, match="torn last line"):
        tracker = Tracker(run_dir=tmp_path)
    tracker.log({"a": 3.0}, step=3)
    tracker.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [s for s, _ in read_jsonl(path)[1]] == [1, 2, 3]


def test_invalid_line_in_the_middle_raises_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"metricsync": 1, "formats": {}, "time": 0}\n'
        '{"step": 1, "time": 0, "values": {"a": NaN}}\n'
        '{"step": 2, "time": 0, "values": {"a": 1}}\n'
    )
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)
    # a writer resuming the log reads only its end: training goes on, the reader still objects
    with Tracker(run_dir=tmp_path) as tracker:
        tracker.log({"a": 3.0}, step=3)
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)


def test_missing_log_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "nope.jsonl")


def test_a_sigkill_leaves_every_earlier_step_readable(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from metricsync._tracking._tracker import Tracker
        tracker = Tracker(run_dir={str(tmp_path)!r})
        step = 0
        while True:
            tracker.log({{"loss": 1.0 / (step + 1), "lr": 3e-4}}, step=step)
            print(step, flush=True)
            step += 1
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None
        printed = [int(child.stdout.readline()) for _ in range(200)]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line is allowed
        _, steps = read_jsonl(tmp_path)
    assert [s for s, _ in steps[: len(printed)]] == printed
    assert [s for s, _ in steps] == list(range(len(steps)))
