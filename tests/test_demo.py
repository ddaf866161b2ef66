"""End to end: ``metricsync demo`` over 2 gloo ranks, then ``show`` and ``plot`` on its log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.distributed


def _cli(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metricsync", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_demo_then_show_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "run"
    demo = _cli("demo", "--world-size", "2", "--steps", "3", "--out", str(out))
    assert demo.returncode == 0, demo.stderr
    jsonl = out / "metrics.jsonl"
    assert str(jsonl) in demo.stdout
    assert demo.stdout.count("step ") >= 3

    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    values = steps[-1]["values"]
    # timings are recorded on even ranks only; the synced log still has them
    assert {"actor/lr", "actor/pg_loss", "response_length/p99", "timing/gen"} <= set(values)
    assert (
        values["response_length/min"]
        <= values["response_length/p50"]
        <= values["response_length/max"]
    )

    show = _cli("show", str(jsonl), "--keys", "actor/*", "--last", "2")
    assert show.returncode == 0, show.stderr
    assert "actor/lr" in show.stdout and "response_length" not in show.stdout
    assert len(show.stdout.strip().splitlines()) == 4  # header, rule, two steps

    png = tmp_path / "curves.png"
    plot = _cli("plot", str(jsonl), "--keys", "response_length/*", "-o", str(png))
    assert plot.returncode == 0, plot.stderr
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[:2] == (300, 400)  # the five statistics share one 400x300 panel

    missing = _cli("show", str(tmp_path / "nope.jsonl"))
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1


def test_a_second_demo_starts_a_fresh_log(tmp_path: Path) -> None:
    """Running the demo again (``make demo`` twice) replaces its log: before, the second
    run appended to it and its curves warned of a resumed run."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    for steps in ("3", "2"):
        demo = _cli("demo", "--world-size", "2", "--steps", steps, "--out", str(out))
        assert demo.returncode == 0, demo.stderr
    assert "resumed" not in demo.stderr, demo.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r] == [0, 1]
    assert (out / "notes.txt").read_text() == "kept"


def test_the_demo_leaves_a_log_it_did_not_write(tmp_path: Path) -> None:
    """A run directory holding another run's log: the demo refuses with one error line
    and deletes nothing (its own earlier logs only are replaced)."""
    out = tmp_path / "real_run"
    out.mkdir()
    log = out / "metrics.jsonl"
    log.write_text('{"metricsync": 1, "formats": {"my/loss": null}}\n{"step": 1}\n')
    (out / "events.out.tfevents.1.host").write_bytes(b"events")
    demo = _cli("demo", "--world-size", "2", "--steps", "1", "--out", str(out))
    assert demo.returncode == 1 and "another --out" in demo.stderr, demo.stderr
    assert len(demo.stderr.strip().splitlines()) == 1
    assert log.read_text().startswith('{"metricsync": 1, "formats": {"my/loss"')
    assert (out / "events.out.tfevents.1.host").read_bytes() == b"events"
