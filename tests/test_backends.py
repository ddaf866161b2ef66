"""The tensorboard, wandb and mlflow backends, read back with each tool's own reader.

Nothing here reaches the network: wandb runs offline, mlflow uses local stores.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _compare import same

import metricsync as ms
from metricsync._log._logread import read_jsonl
from metricsync._tracking._tracker import Tracker

STEPS = [
    (1, {"loss": 0.5, "actor/lr": 3e-4, "grad_norm": math.nan}),
    (2, {"loss": 0.25, "actor/lr": 2e-4, "grad_norm": math.inf}),
    (3, {"loss": 0.125, "actor/lr": 1e-4, "grad_norm": 1.5}),
]


def _quantile_metrics() -> tuple[ms.Metrics, np.ndarray]:
    """Two ranks' metrics merged, and the samples of both: a distribution over several decades."""
    rng = np.random.default_rng(7)
    ranks = [rng.lognormal(2.0, 3.0, size=n) for n in (600, 900)]
    parts = []
    for samples in ranks:
        part = ms.Metrics({"len": ms.Spec(("mean", "p50")), "lr": ms.Spec("last")})
        part.record("len", samples)
        part.record("lr", 1e-6)
        parts.append(part)
    return ms.merge(parts), np.concatenate(ranks)


def _assert_histogram_of(edges: np.ndarray, counts: np.ndarray, samples: np.ndarray) -> None:
    """``(edges, counts)`` is a histogram of ``samples``, checked against numpy on the raw samples."""
    samples = np.sort(samples)
    assert len(edges) == len(counts) + 1
    assert counts.sum() == len(samples)
    assert edges[0] == samples[0] and edges[-1] == samples[-1]  # the exact min and max
    assert np.all(np.diff(edges) > 0)
    below = np.searchsorted(samples, edges[1:], side="right")  # samples at or under each limit
    assert np.max(np.abs(np.cumsum(counts) - below)) <= 1  # (a sample on an edge may go either way)


def test_tensorboard_scalars_are_what_event_accumulator_scalars_reads(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    steps = [(s, {**v, "tiny": 1e-6 * s, "huge": 1e300}) for s, v in STEPS]
    with Tracker(("jsonl", "tensorboard"), run_dir=tmp_path) as tracker:
        for step, values in steps:
            tracker.log(values, step=step)
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))  # default size guidance
    accumulator.Reload()
    keys = ["actor/lr", "grad_norm", "huge", "loss", "tiny"]
    # before: Scalars() saw nothing (every value was a float64 tensor event)
    assert sorted(accumulator.Tags()["scalars"]) == keys
    for key in keys:
        events = accumulator.Scalars(key)
        assert [e.step for e in events] == [1, 2, 3]
        for event, (_, logged) in zip(events, steps, strict=True):
            with np.errstate(over="ignore"):  # float32, as SummaryWriter.add_scalar stores
                want = float(np.float32(logged[key]))
            assert (math.isnan(want) and math.isnan(event.value)) or event.value == want
    assert accumulator.Scalars("huge")[0].value == math.inf  # beyond float32: an infinity


def test_tensorboard_scalars_read_back_in_double_precision(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    from tensorboard.util import tensor_util

    steps = [(s, {**v, "tiny": 1e-6 * s, "big": 123456789.123456789}) for s, v in STEPS]
    with Tracker(("jsonl", "tensorboard"), run_dir=tmp_path, double_precision=True) as tracker:
        for step, values in steps:
            tracker.log(values, step=step)
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert sorted(accumulator.Tags()["tensors"]) == ["actor/lr", "big", "grad_norm", "loss", "tiny"]
    for key in ("loss", "actor/lr", "grad_norm", "tiny", "big"):
        events = accumulator.Tensors(key)
        assert [e.step for e in events] == [1, 2, 3]
        got = [tensor_util.make_ndarray(e.tensor_proto) for e in events]
        assert all(g.dtype == np.float64 and g.shape == () for g in got)
        for value, (_, logged) in zip(got, steps, strict=True):
            want = logged[key]
            assert (math.isnan(want) and math.isnan(value)) or float(value) == want  # bit-exact
    assert float(tensor_util.make_ndarray(accumulator.Tensors("tiny")[0].tensor_proto)) == 1e-6
    content = accumulator.PluginTagToContent("scalars")
    assert sorted(content) == ["actor/lr", "big", "grad_norm", "loss", "tiny"]  # drawn as scalars
    assert len(read_jsonl(tmp_path)[1]) == 3  # the JSONL log sits next to the event files


def test_tensorboard_config_becomes_hparams(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    from tensorboard.plugins.hparams import metadata

    config = {"optim": {"lr": 3e-4, "betas": (0.9, 0.95)}, "seed": 7, "amp": True, "name": "x"}
    with Tracker("tensorboard", run_dir=tmp_path, config=config) as tracker:
        tracker.log({"loss": 0.5}, step=1)
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    info = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    got = {key: getattr(value, value.WhichOneof("kind")) for key, value in info.hparams.items()}
    assert got == {
        "optim/lr": 3e-4,
        "optim/betas": "(0.9, 0.95)",
        "seed": 7.0,
        "amp": True,
        "name": "x",
    }


def test_tensorboard_histograms_of_every_rank_read_back(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    merged, samples = _quantile_metrics()
    with Tracker("tensorboard", run_dir=tmp_path, histograms="le*") as tracker:
        tracker.log(merged, step=5)
        tracker.log({"loss": 1.0}, step=6)  # a dict has no histograms: nothing more is drawn
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert accumulator.Tags()["histograms"] == ["len/histogram"]
    [event] = accumulator.Histograms("len/histogram")
    hist = event.histogram_value
    assert event.step == 5 and hist.num == len(samples)
    assert (hist.min, hist.max) == (samples.min(), samples.max())
    edges = np.array([hist.min, *hist.bucket_limit])
    assert len(hist.bucket) <= 512 < len(merged.histograms()["len"].counts)  # merged to fit
    _assert_histogram_of(edges, np.array(hist.bucket), samples)
    assert hist.sum == pytest.approx(samples.sum(), rel=0.01)  # from bucket midpoints
    assert hist.sum_squares == pytest.approx((samples**2).sum(), rel=0.02)


def test_histograms_are_opt_in(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    merged, _ = _quantile_metrics()
    for run, option in (("off", False), ("other", ["loss*", "x"])):
        with Tracker("tensorboard", run_dir=tmp_path / run, histograms=option) as tracker:
            tracker.log(merged, step=1)
        accumulator = event_accumulator.EventAccumulator(str(tmp_path / run))
        accumulator.Reload()
        assert accumulator.Tags()["histograms"] == []
        assert "len/mean" in accumulator.Tags()["scalars"]


def test_custom_backends_get_histograms_through_the_optional_method(tmp_path: Path) -> None:
    merged, samples = _quantile_metrics()
    got: list[tuple[int, dict[str, ms.Histogram]]] = []

    class Buckets:
        def log(self, values: Mapping[str, float], step: int, formats: Mapping[str, Any]) -> None:
            pass

        def log_histograms(self, histograms: Mapping[str, ms.Histogram], step: int) -> None:
            got.append((step, dict(histograms)))

        def close(self) -> None:
            pass

    class Plain(Buckets):
        log_histograms = None  # type: ignore[assignment]  (no method: skipped)

    with Tracker((Buckets(), Plain()), run_dir=tmp_path, histograms=True) as tracker:
        tracker.log(merged, step=2)
    [(step, histograms)] = got
    assert step == 2 and list(histograms) == ["len"]
    assert len(histograms["len"].counts) > 512  # the sketch's own buckets, none merged
    _assert_histogram_of(histograms["len"].edges, histograms["len"].counts, samples)


def _wandb_records(run_file: Path) -> tuple[list[dict], dict[str, Any]]:
    """History rows and config of an offline ``.wandb`` file (a LevelDB-style record log).

    Only complete records count: wandb writes the file from another process, so the
    tail may still be half written when the run has finished; callers poll.
    """
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, rows = 32768, 7, b"", []
    config: dict[str, Any] = {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a tail the writer process has not finished
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk of a record
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            pending = b""
            kind_of_record = record.WhichOneof("record_type")
            if kind_of_record == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
            elif kind_of_record == "run":
                for item in record.run.config.update:
                    config[item.key] = json.loads(item.value_json)
    return rows, config


def _wandb_history(run_file: Path) -> list[dict]:
    return _wandb_records(run_file)[0]


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
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


@pytest.mark.usefixtures("wandb_offline")
@pytest.mark.parametrize("use_wandb_dir", [True, False])
def test_wandb_offline_run_holds_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_wandb_dir: bool
) -> None:
    run_dir, wandb_dir = tmp_path / "run", tmp_path / "wandb_dir"
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
        assert all(same(row[key], value, rel=1e-6, abs=1e-12) for key, value in values.items())
    assert len(read_jsonl(run_dir)[1]) == 3


@pytest.mark.usefixtures("wandb_offline")
def test_wandb_config_and_histograms_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_DIR", raising=False)
    merged, samples = _quantile_metrics()
    config = {"optim": {"lr": 3e-4}, "seed": 7}
    with Tracker("wandb", run_dir=tmp_path, config=config, histograms=True) as tracker:
        tracker.log(merged, step=4)
    [run_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows, got_config = _wandb_records(run_file)
    deadline = time.monotonic() + 30.0
    while not rows and time.monotonic() < deadline:  # wandb's writer is another process
        time.sleep(0.2)
        rows, got_config = _wandb_records(run_file)
    assert {k: v for k, v in got_config.items() if not k.startswith("_")} == config
    [row] = rows  # scalars and histogram of one step share one history row
    assert row["_step"] == 4
    assert row["len/mean"] == pytest.approx(samples.mean(), rel=1e-12)
    assert row["lr"] == 1e-6
    assert row["len/histogram/_type"] == "histogram"
    counts, edges = np.array(row["len/histogram/values"]), np.array(row["len/histogram/bins"])
    assert len(counts) <= 512
    _assert_histogram_of(edges, counts, samples)


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
        assert all(
            same(g, v[key], rel=1e-6, abs=1e-12) for (_, g), (_, v) in zip(got, steps, strict=True)
        )
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


def test_mlflow_keeps_long_keys_and_keys_that_sanitise_alike_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from metricsync.backends._mlflow import mlflow_key

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    long_key = "eval/" + "x" * 260
    steps = [(s, {"loss": 1.0 / s, long_key: 2.0 * s, "acc@1": 0.1, "acc#1": 0.9}) for s in (1, 2)]
    with (
        pytest.warns(UserWarning, match="'acc#1' is logged as"),
        Tracker("mlflow", run_dir=tmp_path, experiment="metricsync") as tracker,
    ):
        for step, values in steps:
            tracker.log(values, step=step)
    status, histories = _mlflow_histories(f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    assert status == "FINISHED"
    long_name = mlflow_key(long_key)
    assert len(long_name) == 250 and long_name.startswith("eval/xxx")
    # before: the long name failed the whole step's batch (every key lost), and acc#1 was
    # logged into acc@1's metric
    assert histories["loss"] == [(1, 1.0), (2, 0.5)]
    assert histories[long_name] == [(1, 2.0), (2, 4.0)]
    assert histories["acc_1"] == [(1, 0.1), (2, 0.1)]
    [other] = [name for name in histories if name.startswith("acc_1_")]
    assert histories[other] == [(1, 0.9), (2, 0.9)]


def test_mlflow_config_becomes_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = {f"layer{i}": {"width": 64 * i, "act": "gelu"} for i in range(60)}  # 120: 2 batches
    config["long"] = "x" * 7000
    config["optim"] = {"lr": 3e-4, "betas": (0.9, 0.95)}
    with Tracker("mlflow", run_dir=tmp_path, config=config) as tracker:
        tracker.log({"loss": 0.5}, step=1)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("metricsync").experiment_id])
    params = run.data.params
    assert len(params) == 123
    assert params["layer59/width"] == str(64 * 59) and params["layer0/act"] == "gelu"
    assert params["optim/lr"] == "0.0003" and params["optim/betas"] == "(0.9, 0.95)"
    assert params["long"] == "x" * 6000  # cut at MLflow's limit


def _run_python(script: str, cwd: Path, **env: str) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter (these packages keep one run per process and
    read their directories at import) and return the JSON object it prints after ``RESULT``."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]), **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


TESTS = Path(__file__).resolve().parent

SWANLAB_SCRIPT = """
    import json
    import swanlab
    from test_backends import STEPS
    from metricsync._tracking._tracker import Tracker

    config = {"optim": {"lr": 3e-4}, "seed": 7}
    with Tracker(("jsonl", "swanlab"), run_dir="run", project="p", name="e", config=config) as t:
        for step, values in STEPS:
            t.log(values, step=step)
    owned_closed = not swanlab.has_run()

    swanlab.init(mode="offline", project="p", name="mine", log_dir="user_logs")
    with Tracker("swanlab", run_dir="run2", config={"extra": 1}) as t:
        t.log({"loss": 2.0}, step=9)
    user_open = swanlab.has_run()
    swanlab.finish()
    print("RESULT", json.dumps({"owned_closed": owned_closed, "user_open": user_open}))
"""


def _swanlab_run(folder: Path) -> tuple[dict[str, list[tuple[int, float]]], Path]:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    [run_file] = folder.glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(run_file)
    series: dict[str, list[tuple[int, float]]] = {}
    states = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "scalar":
            series.setdefault(record.scalar.key, []).append(
                (record.scalar.step, record.scalar.value.number)
            )
        elif kind == "finish":
            states.append(record.finish.state)
    reader.close()
    assert len(states) == 1  # the run was finished
    return series, run_file.parent


def test_swanlab_offline_run_read_back(tmp_path: Path) -> None:
    pytest.importorskip("swanlab")
    yaml = pytest.importorskip("yaml")
    flags = _run_python(
        SWANLAB_SCRIPT,
        tmp_path,
        SWANLAB_MODE="offline",
        SWANLAB_ROOT=str(tmp_path / "swanlab_root"),
    )
    assert flags == {"owned_closed": True, "user_open": True}
    series, run_dir = _swanlab_run(tmp_path / "run" / "swanlog")
    assert sorted(series) == ["actor/lr", "grad_norm", "loss"]
    for key in series:
        assert [s for s, _ in series[key]] == [1, 2, 3]
        assert all(
            same(got, values[key], rel=1e-6, abs=1e-12)
            for (_, got), (_, values) in zip(series[key], STEPS, strict=True)
        )
    saved = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert {key: entry["value"] for key, entry in saved.items()} == {
        "optim": {"lr": 3e-4},
        "seed": 7,
    }
    assert len(read_jsonl(tmp_path / "run")[1]) == 3
    # a run the user started is logged into, given the config, and left to the user to finish
    assert not (tmp_path / "run2").exists()
    series, run_dir = _swanlab_run(tmp_path / "user_logs")
    assert series == {"loss": [(9, 2.0)]}
    saved = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert saved["extra"]["value"] == 1


TRACKIO_SCRIPT = """
    import json, math
    from test_backends import STEPS, _quantile_metrics
    from trackio.sqlite_storage import SQLiteStorage
    from metricsync._tracking._tracker import Tracker

    merged, _ = _quantile_metrics()
    config = {"optim": {"lr": 3e-4}, "seed": 7}
    with Tracker("trackio", run_dir="unused", project="ms", name="r", config=config,
                 histograms=True) as tracker:
        for step, values in STEPS:
            tracker.log(values, step=step)
        tracker.log(merged, step=4)
    print("RESULT", json.dumps({"logs": SQLiteStorage.get_logs("ms", "r"),
                      "config": SQLiteStorage.get_run_config("ms", "r")}, default=str))
"""


def test_trackio_local_run_read_back(tmp_path: Path) -> None:
    pytest.importorskip("trackio")
    got = _run_python(TRACKIO_SCRIPT, tmp_path, TRACKIO_DIR=str(tmp_path / "trackio"))
    merged, samples = _quantile_metrics()
    rows = got["logs"]
    scalars = [r for r in rows if "loss" in r]
    assert [r["step"] for r in scalars] == [1, 2, 3]
    for row, (_, values) in zip(scalars, STEPS, strict=True):
        assert all(same(row[key], value, rel=1e-6, abs=1e-12) for key, value in values.items())
    [at_4] = [r for r in rows if r["step"] == 4 and "len/mean" in r]
    assert at_4["len/mean"] == merged.compute()["len/mean"] and at_4["lr"] == 1e-6
    [hist] = [r["len/histogram"] for r in rows if "len/histogram" in r]
    assert hist["_type"] == "trackio.histogram"
    counts, edges = np.array(hist["values"]), np.array(hist["bins"])
    assert len(counts) <= 512
    _assert_histogram_of(edges, counts, samples)
    assert {k: v for k, v in got["config"].items() if not k.startswith("_")} == {
        "optim": {"lr": 3e-4},
        "seed": 7,
    }
    assert not (tmp_path / "unused").exists()  # the data live in Trackio's own directory


def test_tensorboard_float32_default_reads_back_as_documented(tmp_path: Path) -> None:
    # docs/backends.md and the backend's docstring: float32 by default, exact with
    # double_precision=True; this pins the numbers they quote.
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    from tensorboard.util import tensor_util

    logged = {"tiny": 1e-50, "big": 123456789.0, "small": 1e-6, "huge": -1e39, "edge": 7e-46}
    with Tracker(("tensorboard",), run_dir=tmp_path / "f32") as tracker:
        tracker.log(logged, 1)
    with Tracker(("tensorboard",), run_dir=tmp_path / "f64", double_precision=True) as tracker:
        tracker.log(logged, 1)
    f32 = event_accumulator.EventAccumulator(str(tmp_path / "f32"))
    f32.Reload()
    got = {key: f32.Scalars(key)[0].value for key in logged}
    with np.errstate(over="ignore"):
        assert got == {key: float(np.float32(v)) for key, v in logged.items()}  # the oracle
    assert got["tiny"] == 0.0 and got["big"] == 123456792.0 and got["huge"] == -math.inf
    assert got["small"] == float(np.float32(9.99999997e-07)) and got["edge"] == 0.0
    f64 = event_accumulator.EventAccumulator(str(tmp_path / "f64"))
    f64.Reload()
    exact = {
        key: float(tensor_util.make_ndarray(f64.Tensors(key)[0].tensor_proto)) for key in logged
    }
    assert exact == logged


def test_tensorboard_run_resumed_from_float64_tensors_is_split_for_event_accumulator(
    tmp_path: Path,
) -> None:
    # docs/backends.md, "Resuming a run across the two": one curve in TensorBoard's
    # dashboard, Tensors + Scalars for EventAccumulator
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    with Tracker(("tensorboard",), run_dir=tmp_path, double_precision=True) as tracker:
        tracker.log({"loss": 123456789.0}, 1)
        tracker.log({"loss": 0.5}, 2)
    with Tracker(("tensorboard",), run_dir=tmp_path) as tracker:  # resumed, default float32
        tracker.log({"loss": 123456789.0}, 3)
        tracker.log({"loss": 0.25}, 4)
    scripts = event_accumulator.EventAccumulator(str(tmp_path))
    scripts.Reload()
    tensors = [
        (e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in scripts.Tensors("loss")
    ]
    assert tensors == [(1, 123456789.0), (2, 0.5)]
    assert [(e.step, e.value) for e in scripts.Scalars("loss")] == [(3, 123456792.0), (4, 0.25)]
    dashboard = plugin_event_accumulator.EventAccumulator(str(tmp_path))
    dashboard.Reload()
    curve = [
        (e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in dashboard.Tensors("loss")
    ]
    # the two files are read in name order, which a second-resolution time stamp may flip
    assert sorted(curve) == [(1, 123456789.0), (2, 0.5), (3, 123456792.0), (4, 0.25)]
