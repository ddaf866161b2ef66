"""Crash-safe JSONL logs: a killed run loses no step it wrote, and a restart appends.

``tests/test_tracker.py`` kills a process logging a dict once and reads the
file back in-process. Here:

- three SIGKILLed runs in a row share one ``run_dir``, each logging a
  ``Metrics`` (formats from its specs) of a few hundred keys per step through
  ``Tracker``: the second continues where the file ends, the third restarts
  from an older step (a resumed checkpoint). After every kill, every step
  the child reported as logged is readable by ``read_jsonl``, by a plain
  ``json.loads`` per line that skips a torn last line, and by the
  ``metricsync show`` program in a subprocess; ``metricsync plot`` draws
  the final file. The restart from an older step warns on stderr; both
  copies of the repeated steps stay in the file, and ``show`` lists the
  timeline: the later copies, the superseded ones left out.
- a kill at any byte: every prefix of a real log (non-ASCII keys, NaN values,
  format headers mid-run) reads as exactly its complete lines, and a writer
  reopening that prefix cuts the torn line and appends a readable step.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from _cli import ENV, run

import metricsync as ms
from metricsync._log._logread import read_jsonl
from metricsync.backends._jsonl import JsonlBackend

CHILD = textwrap.dedent(
    """
    import sys
    import metricsync as ms

    run_dir, start = sys.argv[1], int(sys.argv[2])
    specs = {"loss": ms.Spec(("mean", "max")), "lr": ms.Spec("last", fmt=".2e"),
             "wide/*": ms.Spec("sum", fmt=".4f")}
    with ms.Tracker(backends=("jsonl",), run_dir=run_dir) as tracker:
        m = ms.Metrics(specs)
        step = start
        while True:
            m.record("loss", [1.0 / (step + 1), 2.0 / (step + 1)])
            m.record("lr", 3e-4)
            for i in range(300):  # long lines: a kill can land inside a write
                m.record(f"wide/k{i}", float(step * i))
            tracker.log(m, step=step)
            m.reset()
            print(step, flush=True)
            step += 1
    """
)


def _run_and_kill(run_dir: Path, start: int, lines: int) -> tuple[list[int], str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run_dir), str(start)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        text=True,
    )
    try:
        assert child.stdout is not None
        printed = [int(child.stdout.readline()) for _ in range(lines)]
    finally:
        child.send_signal(signal.SIGKILL)
        _, stderr = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return printed, stderr


def _plain_json_steps(path: Path) -> list[int]:
    """What any JSON-lines reader sees: one object per line, a torn last line skipped."""
    lines = path.read_bytes().split(b"\n")
    steps = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            assert i == len(lines) - 1, f"invalid line {i + 1} is not the last"
            continue
        if "step" in record:
            steps.append(record["step"])
    return steps


def _timeline(steps: list[int]) -> list[int]:
    """What ``show`` lists: a step supersedes every later one it does not exceed."""
    out: list[int] = []
    for step in steps:
        while out and out[-1] >= step:
            out.pop()
        out.append(step)
    return out


def _check_readable(run_dir: Path, written: list[int]) -> list[int]:
    """Every step the children reported is readable by all three readers; returns the steps."""
    path = run_dir / "metrics.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line is allowed, and reported
        formats, steps = read_jsonl(run_dir)
    logged = [s for s, _ in steps]
    it = iter(logged)
    assert all(step in it for step in written), "a reported step is missing or out of order"
    assert _plain_json_steps(path) == logged
    assert formats["lr"] == ".2e" and formats["wide/k7"] == ".4f"
    last = steps[-1]
    assert last[1]["wide/k7"] == 7.0 * last[0] and last[1]["lr"] == 3e-4
    shown = run("show", str(run_dir), "--keys", "loss/max,lr", "--last", str(len(logged)))
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == _timeline(logged)
    assert all(r[2] == "3.00e-04" for r in rows)
    assert math.isclose(float(rows[-1][1]), 2.0 / (logged[-1] + 1), rel_tol=1e-3)  # 4 digits
    return logged


def test_sigkilled_runs_keep_every_written_step_and_restarts_append(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # it ends by plotting the log
    rng = np.random.default_rng(7)
    run_dir = tmp_path / "run"
    written, _ = _run_and_kill(run_dir, 0, int(rng.integers(20, 60)))
    logged = _check_readable(run_dir, written)
    assert logged == list(range(len(logged)))

    # restart where the file ends: the log continues, no warning
    more, stderr = _run_and_kill(run_dir, logged[-1] + 1, int(rng.integers(20, 60)))
    assert "backwards" not in stderr
    logged = _check_readable(run_dir, written + more)
    assert logged == list(range(len(logged)))

    # restart from an older checkpoint: warned about, and nothing dropped
    old = logged[-1] - 10
    again, stderr = _run_and_kill(run_dir, old, 15)
    assert f"step {old} goes backwards" in stderr
    final = _check_readable(run_dir, written + more + again)
    assert final[: len(logged)] == logged
    assert final[len(logged) :] == list(range(old, old + len(final) - len(logged)))

    png = tmp_path / "curves.png"
    plotted = run("plot", str(run_dir), "--keys", "loss/*,lr", "-o", str(png))
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _reference_log(run_dir: Path) -> bytes:
    m = ms.Metrics({"loss": ms.Spec("mean", fmt=".3f"), "時間/*": ms.Spec("max")})
    with ms.Tracker(backends=("jsonl",), run_dir=run_dir) as tracker:
        for step in range(6):
            m.record("loss", 1.0 / (step + 1))
            m.record("時間/fwd", float(step))
            if step >= 2:
                m.record("perte/é", math.nan if step == 3 else float(step))  # a new key mid-run
            tracker.log(m, step=step)
            m.reset()
        tracker.log({"loss": 0.125}, step=6)  # a plain dict: the format changes to adaptive
    return (run_dir / "metrics.jsonl").read_bytes()


def test_every_prefix_of_a_log_reads_as_its_complete_lines(tmp_path: Path) -> None:
    data = _reference_log(tmp_path / "ref")
    # the oracle: each line's end offset and what it holds, parsed independently
    records, offset = [], 0
    for line in data.split(b"\n")[:-1]:
        offset += len(line)
        records.append((offset, json.loads(line)))
        offset += 1
    assert offset == len(data) and sum("step" in r for _, r in records) == 7

    path = tmp_path / "cut" / "metrics.jsonl"
    path.parent.mkdir()
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        complete = [r for end, r in records if end <= cut]
        want_steps = [r["step"] for r in complete if "step" in r]
        want_formats: dict[str, str | None] = {}
        for r in complete:
            want_formats.update(r.get("formats", {}))
        torn = cut > 0 and data[cut - 1 : cut] != b"\n" and all(end != cut for end, _ in records)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            formats, steps = read_jsonl(path)
        assert [s for s, _ in steps] == want_steps, cut
        assert formats == want_formats, cut
        assert len(caught) == int(torn), (cut, [str(w.message) for w in caught])
        if cut % 5 == 0 or (torn and cut % 3 == 0):  # a writer resuming this prefix
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                backend = JsonlBackend(path.parent)
            backend.log({"loss": 9.0}, 100, {"loss": ".3f"})
            backend.close()
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no torn line is left anywhere
                _, steps = read_jsonl(path)
            assert [s for s, _ in steps] == [*want_steps, 100], cut
            assert steps[-1][1] == {"loss": 9.0}
