"""The ``metricsync`` program, run as ``python -m metricsync`` in subprocesses."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import follow, run

from metricsync._tracking._tracker import Tracker

ROOT = Path(__file__).resolve().parents[1]


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


def test_keys_can_name_a_key_holding_commas(tmp_path: Path) -> None:
    """``--keys`` splits on commas; a key holding one (``f1,macro``) is named by the
    whole argument. Before, no key matched and the command failed."""
    with Tracker(run_dir=tmp_path / "run") as tracker:
        tracker.log({"f1,macro": 0.75, "f1": 0.5, "loss": 2.0}, step=1)
    one = run("show", str(tmp_path / "run"), "--keys", "f1,macro", "--format", "csv")
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == ['step,"f1,macro",f1', "1,0.75,0.5"]
    spaced = run("show", str(tmp_path / "run"), "--keys", " f1,macro ", "--format", "csv")
    assert spaced.stdout == one.stdout, spaced.stderr
    glob = run("show", str(tmp_path / "run"), "--keys", "f1[,]*", "--format", "csv")
    assert glob.returncode == 0, glob.stderr
    assert glob.stdout.splitlines() == ['step,"f1,macro"', "1,0.75"]


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
    # 4 panels from 3 prefix groups, none filling a row: one section, 2 rows x 3 columns
    assert pixels.shape[:2] == (600, 1200)

    result = run("plot", str(log_file), "--keys", "actor/*", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert image.imread(out).shape[:2] == (335, 800)  # the actor/ heading, 2 panels
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


@pytest.mark.parametrize("command", ["demo", "show", "plot", "compare", "bench"])
def test_help_of_every_subcommand_exits_zero(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: metricsync {command}")


def test_usage_errors_exit_two(log_file: Path) -> None:
    assert run().returncode == 2
    assert run("show", str(log_file), "--last", "-1").returncode == 2
    assert run("plot", str(log_file)).returncode == 2  # -o is required


def test_version_prints_the_package_version() -> None:
    import metricsync

    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"metricsync {metricsync.__version__}"


def test_show_last_n_above_the_number_of_steps_shows_every_step(log_file: Path) -> None:
    for last in ("4", "5", "1000"):
        result = run("show", str(log_file), "--last", last)
        assert result.returncode == 0, result.stderr
        assert [line.split()[0] for line in result.stdout.splitlines()[2:]] == ["1", "2", "3", "4"]
    result = run("show", str(log_file), "--last", "0")
    assert (result.returncode, result.stdout) == (0, "")


def test_show_csv_and_json_hold_every_value_at_full_precision(log_file: Path) -> None:
    import csv
    import io
    import json

    from metricsync._log._logread import read_jsonl

    _, steps = read_jsonl(log_file)
    keys = ["actor/lr", "actor/pg_loss", "perf/tokens", "timing/step"]
    result = run("show", str(log_file), "--format", "csv")
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["step", *keys]
    for row, (step, values) in zip(rows[1:], steps, strict=True):
        assert int(row[0]) == step
        got = [float(cell) for cell in row[1:]]
        assert [repr(v) for v in got] == [repr(values[k]) for k in keys]

    for extra in ([], ["--last", "2"]):
        result = run("show", str(log_file), "--format", "json", *extra)
        assert result.returncode == 0, result.stderr
        items = json.loads(result.stdout)
        want = steps[-2:] if extra else steps
        assert [item["step"] for item in items] == [s for s, _ in want]
        assert items[1]["values"]["timing/step"] == ("nan" if not extra else 0.5)
        assert items[0]["values"]["perf/tokens"] == want[0][1]["perf/tokens"]


def test_the_table_wraps_into_blocks_that_fit_the_width(log_file: Path) -> None:
    for width in ("30", "45"):
        result = run("show", str(log_file), "--width", width)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= int(width)
        blocks = result.stdout.split("\n\n")
        assert len(blocks) >= 2
        headers = [block.splitlines()[0].split() for block in blocks]
        assert all(h[0] == "step" for h in headers)  # each block repeats the step column
        shown = [key for h in headers for key in h[1:]]
        assert shown == ["actor/lr", "actor/pg_loss", "perf/tokens", "timing/step"]
        assert all(len(block.splitlines()) == 6 for block in blocks)
    env_result = subprocess.run(
        [sys.executable, "-m", "metricsync", "show", str(log_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "40"},
    )
    assert max(len(line) for line in env_result.stdout.splitlines()) <= 40


def test_transpose_lists_keys_as_rows(log_file: Path) -> None:
    result = run("show", str(log_file), "--last", "2", "--transpose")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["key", "3", "4"]
    assert [line.split()[0] for line in lines[2:]] == [
        "actor/lr",
        "actor/pg_loss",
        "perf/tokens",
        "timing/step",
    ]
    assert lines[2].split()[1:] == ["1.00e-04", "7.50e-05"]


def test_show_ranks_lists_the_straggler_keys_with_their_values(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        for step in (1, 2):
            tracker.log(
                {
                    "loss": 0.5,
                    "timing/gen/max": 2.5 * step,
                    "timing/gen/max_rank": 3.0,
                    "timing/gen/min": 1.0,
                    "timing/gen/min_rank": 0.0,
                    "loss_max/max_rank": 1.0,
                },
                step,
            )
    result = run("show", str(tmp_path), "--ranks")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "step",
        "timing/gen/max",
        "timing/gen/max_rank",
        "timing/gen/min",
        "timing/gen/min_rank",
        "loss_max/max_rank",
    ]
    assert lines[3].split() == ["2", "5", "3", "1", "0", "1"]
    result = run("show", str(tmp_path), "--ranks", "--keys", "timing/*", "--last", "1")
    assert result.stdout.splitlines()[0].split()[-1] == "timing/gen/min_rank"
    plain = tmp_path / "plain"
    with Tracker(run_dir=plain) as tracker:
        tracker.log({"loss": 0.5}, 1)
    result = run("show", str(plain), "--ranks")
    assert result.returncode == 1 and "max_rank" in result.stderr


def test_compare_shows_the_last_or_a_given_step_side_by_side(tmp_path: Path) -> None:
    for name, scale in (("a", 1.0), ("b", 2.0)):
        with Tracker(run_dir=tmp_path / name) as tracker:
            for step in (1, 2, 3):
                values = {"loss": scale * step, "lr": 1e-4}
                if name == "b":
                    values["extra"] = 7.0
                tracker.log(values, step)
    result = run("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("at step 3") and lines[1].endswith("at step 3")
    assert lines[2].split() == ["key", "A", "B", "B", "-", "A", "change"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[4:]}
    assert rows["loss"] == ["3", "6", "+3", "+100.0%"]
    assert rows["lr"][2:] == ["0", "+0.0%"]
    assert rows["extra"] == ["-", "7", "-", "-"]
    result = run("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--step", "2")
    assert result.returncode == 0, result.stderr
    assert "+2" in result.stdout and "at step 2" in result.stdout
    result = run("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--step", "9")
    assert result.returncode == 1 and "no step 9" in result.stderr


def test_verl_file_logger_logs_show_and_plot(tmp_path: Path) -> None:
    path = tmp_path / "verl.jsonl"
    lines = [
        '{"step": 1, "data": {"actor/pg_loss": 0.5, "val/acc": NaN, "note": "text"}}',
        '{"step": 2, "data": {"actor/pg_loss": 0.25, "response_length/mean": 100}}',
        '{"step": 2, "data": {"val/acc": 0.75}}',
    ]
    path.write_text("\n".join(lines) + "\n")
    result = run("show", str(path))
    assert result.returncode == 0, result.stderr
    table = result.stdout.splitlines()
    assert table[0].split() == ["step", "actor/pg_loss", "val/acc", "response_length/mean"]
    assert table[2].split() == ["1", "0.5", "nan", "-"]
    assert table[3].split() == ["2", "0.25", "0.75", "100"]
    result = run("show", str(path), "--last", "1")
    assert result.stdout.splitlines()[2].split() == ["2", "0.25", "100", "0.75"]
    if pytest.importorskip("matplotlib"):
        out = tmp_path / "verl.png"
        assert run("plot", str(path), "-o", str(out)).returncode == 0
        assert out.exists()


def test_a_step_logged_again_after_a_resume_shows_its_later_value(tmp_path: Path) -> None:
    with Tracker(run_dir=tmp_path) as tracker:
        for step in range(1, 6):
            tracker.log({"loss": float(step)}, step)
    with Tracker(run_dir=tmp_path) as tracker:  # resumed from the checkpoint of step 3
        with pytest.warns(UserWarning, match="goes backwards"):
            tracker.log({"loss": 30.0}, 3)
        tracker.log({"loss": 40.0}, 4)
    for extra in ([], ["--last", "3"]):
        result = run("show", str(tmp_path), *extra)
        assert result.returncode == 0, result.stderr
        rows = [line.split() for line in result.stdout.splitlines()[2:]]
        want = [["1", "1"], ["2", "2"], ["3", "30"], ["4", "40"]]
        assert rows == (want[-3:] if extra else want)
        [warning] = result.stderr.splitlines()
        assert warning.startswith("metricsync: warning: ") and "logged again" in warning


def test_follow_prints_new_steps_until_interrupted(tmp_path: Path) -> None:
    import signal
    import time

    with Tracker(run_dir=tmp_path) as tracker:
        tracker.log({"loss": 1.0}, 1)
    child = follow(tmp_path)
    try:
        assert child.stdout is not None
        first = [child.stdout.readline() for _ in range(3)]
        assert first[2].split() == ["1", "1"]
        with Tracker(run_dir=tmp_path) as tracker:
            tracker.log({"loss": 0.5}, 2)
            time.sleep(0.3)
            tracker.log({"loss": 0.25}, 3)
        assert child.stdout.readline().split() == ["2", "0.5"]
        assert child.stdout.readline().split() == ["3", "0.25"]
    finally:
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)
    assert child.returncode == 0
    assert "Traceback" not in stderr


BAD_LOGS = {
    "huge integer": b'{"metricsync": 1, "formats": {}, "time": 0}\n'
    b'{"step": 1, "time": 0, "values": {"loss": 1' + b"0" * 399 + b"}}\n",
    "deep array": b'{"metricsync": 1, "formats": {}, "time": 0}\n'
    b'{"step": 1, "time": 0, "values": {"loss": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n",
    "huge width": b'{"metricsync": 1, "formats": {"loss": "300000000.3f"}, "time": 0}\n'
    b'{"step": 1, "time": 0, "values": {"loss": 1}}\n',
}


@pytest.mark.parametrize("name", sorted(BAD_LOGS))
@pytest.mark.parametrize("command", ["show", "show-last", "plot", "compare"])
def test_bad_logs_give_one_error_line_and_no_traceback(
    tmp_path: Path, name: str, command: str
) -> None:
    if command == "plot":
        pytest.importorskip("matplotlib")
    path = tmp_path / "bad.jsonl"
    path.write_bytes(BAD_LOGS[name])
    args = {
        "show": ["show", str(path)],
        "show-last": ["show", str(path), "--last", "5"],
        "plot": ["plot", str(path), "-o", str(tmp_path / "x.png")],
        "compare": ["compare", str(path), str(path)],
    }[command]
    result = run(*args)
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("metricsync: error: ")
    assert ("line 1 " if name == "huge width" else "line 2 ") in line
    assert len(line) < 400
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("name", sorted(BAD_LOGS))
def test_a_tracker_resuming_a_bad_log_keeps_training(tmp_path: Path, name: str) -> None:
    (tmp_path / "metrics.jsonl").write_bytes(BAD_LOGS[name])
    import warnings

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with Tracker(run_dir=tmp_path) as tracker:
            tracker.log({"loss": 0.5}, 2)
    assert (tmp_path / "metrics.jsonl").read_bytes().startswith(BAD_LOGS[name])


def test_keys_logged_again_at_one_step_are_not_called_a_resume(tmp_path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Tracker's own note on a step logged again
        with Tracker(run_dir=tmp_path) as tracker:  # a trainer's train then eval row
            tracker.log({"loss": 0.5, "epoch": 1.0}, 4)
            tracker.log({"eval_loss": 0.7, "epoch": 1.0}, 4)
    result = run("show", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [warning] = result.stderr.splitlines()
    # before: "... logged again for an earlier or equal step (a resumed run?) ..."
    assert "logged again at a step that had those keys" in warning and "resumed" not in warning


def test_follow_prints_a_warning_while_it_runs(tmp_path: Path) -> None:
    import select
    import signal

    path = tmp_path / "m.jsonl"
    lines = [f'{{"step": {s}, "data": {{"acc\\ud800": {s}.5}}}}' for s in (1, 2)]
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    child = follow(path)
    try:
        assert child.stderr is not None
        ready, _, _ = select.select([child.stderr], [], [], 60)
        # before: nothing on stderr until the command ended (the warning held back)
        assert ready and child.poll() is None
        line = child.stderr.readline()
        assert line.startswith("metricsync: warning: ") and "lone surrogate" in line
        assert child.stdout is not None
        assert [child.stdout.readline().split()[0] for _ in range(4)][2:] == ["1", "2"]
    finally:
        child.send_signal(signal.SIGINT)
        _, rest = child.communicate(timeout=30)
    assert child.returncode == 0
    assert "lone surrogate" not in rest  # each distinct warning once
