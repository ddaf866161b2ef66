"""The ``metricsync`` program, run as ``python -m metricsync`` in subprocesses."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metricsync._tracker import Tracker

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    return subprocess.run(
        [sys.executable, "-m", "metricsync", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


class Specs:
    """A duck-typed Metrics with formats, as the core's Metrics would log."""

    def __init__(self, step: int) -> None:
        self.step = step

    def compute(self) -> dict[str, float]:
        return {
            "actor/lr": 3e-4 / self.step,
            "actor/pg_loss": 1.0 / self.step,
            "perf/tokens": 123456.0 * self.step,
            "timing/step": 0.5 if self.step != 2 else math.nan,
        }

    def key_formats(self) -> dict[str, str | None]:
        return {"actor/lr": ".2e", "actor/pg_loss": None, "perf/tokens": ",.0f"}


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    with Tracker(run_dir=tmp_path / "run") as tracker:
        for step in range(1, 5):
            tracker.log(Specs(step), step=step)
    return tmp_path / "run" / "metrics.jsonl"


def test_show_prints_an_aligned_table_in_the_stored_formats(log_file: Path) -> None:
    result = run("show", str(log_file))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["step", "actor/lr", "actor/pg_loss", "perf/tokens", "timing/step"]
    assert set(lines[1]) == {"-", " "}
    assert lines[2].split() == ["1", "3.00e-04", "1", "123,456", "0.5"]
    assert lines[3].split() == ["2", "1.50e-04", "0.5", "246,912", "nan"]
    assert len(lines) == 6
    assert len({len(line) for line in lines}) == 1  # right-aligned columns


def test_show_filters_keys_and_keeps_the_last_steps(log_file: Path) -> None:
    result = run("show", str(log_file.parent), "--keys", "actor/*", "--last", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["step", "actor/lr", "actor/pg_loss"]
    assert [line.split()[0] for line in lines[2:]] == ["3", "4"]


def test_show_skips_a_torn_last_line_with_one_warning_line(log_file: Path) -> None:
    with log_file.open("a") as f:
        f.write('{"step": 5, "values": {"actor/lr"')
    result = run("show", str(log_file), "--last", "1")
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1].split()[0] == "4"
    [warning] = result.stderr.splitlines()
    assert warning.startswith("metricsync: warning: ") and "torn last line" in warning


def test_plot_writes_a_png_of_the_expected_size(log_file: Path, tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    out = tmp_path / "plots" / "curves.png"
    result = run("plot", str(log_file), "-o", str(out))
    assert result.returncode == 0, result.stderr
    pixels = image.imread(out)
    assert pixels.shape[:2] == (600, 1200)  # 4 panels: 2 rows x 3 columns of 400 x 300

    result = run("plot", str(log_file), "--keys", "actor/*", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert image.imread(out).shape[:2] == (300, 800)
    assert pixels.std() > 0  # something was drawn


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["show", "{missing}"], "no such file"),
        (["plot", "{missing}", "-o", "{png}"], "no such file"),
        (["show", "{log}", "--keys", "critic/*"], "no metric matches 'critic/*'"),
        (["plot", "{log}", "--keys", "critic/*", "-o", "{png}"], "no metric matches"),
        (["show", "{bad}"], "line 1"),
    ],
)
def test_errors_print_one_line_and_exit_non_zero(
    log_file: Path, tmp_path: Path, args: list[str], needle: str
) -> None:
    if args[0] == "plot":
        pytest.importorskip("matplotlib")  # plot reports a missing matplotlib first
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": NaN}\n{"step": 1, "values": {}}\n')
    paths = {
        "missing": str(tmp_path / "missing.jsonl"),
        "png": str(tmp_path / "x.png"),
        "log": str(log_file),
        "bad": str(bad),
    }
    result = run(*[a.format(**paths) for a in args])
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("metricsync: error: ") and needle in line
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command", ["demo", "show", "plot", "bench"])
def test_help_of_every_subcommand_exits_zero(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: metricsync {command}")


def test_usage_errors_exit_two(log_file: Path) -> None:
    assert run().returncode == 2
    assert run("show", str(log_file), "--last", "-1").returncode == 2
    assert run("plot", str(log_file)).returncode == 2  # -o is required
