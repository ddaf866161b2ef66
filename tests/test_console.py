"""The console backend (grouping, wrapping, logging) and the progress bar."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from metricsync._cli._progress import Progress
from metricsync.backends._console import DEFAULT_WIDTH, ConsoleBackend, add_log_handler

VALUES = {
    "actor/pg_loss": 0.25,
    "critic/score": 1.5,
    "actor/lr": 3e-4,
    "timing/gen": 0.0213,
    "loss": 0.5,
    "critic/vf_loss": 0.125,
}


def test_keys_are_grouped_by_prefix_on_one_line_when_it_fits() -> None:
    out = io.StringIO()
    ConsoleBackend(stream=out, width=500).log(VALUES, 3, {"timing/gen": ".3f"})
    [line] = out.getvalue().splitlines()
    keys = [part for part in line.split() if "/" in part or part == "loss"]
    assert keys == [
        "actor/pg_loss",
        "actor/lr",
        "critic/score",
        "critic/vf_loss",
        "timing/gen",
        "loss",
    ]
    assert "timing/gen    0.021" in line


@pytest.mark.parametrize("width", [40, 60, 80])
def test_a_long_step_prints_one_line_per_group_within_the_width(width: int) -> None:
    out = io.StringIO()
    backend = ConsoleBackend(stream=out, width=width)
    backend.log(VALUES, 12, {})
    backend.log({**VALUES, "actor/pg_loss": 123456.0}, 13, {})
    lines = out.getvalue().splitlines()
    assert all(len(line) <= width for line in lines)
    first = [line for line in lines if line.startswith("step 12 |")]
    assert len(first) == 1
    step12 = lines[: lines.index(next(line for line in lines if line.startswith("step 13")))]
    assert all(line.startswith("        | ") for line in step12[1:])
    # every key once, and each line holds a single group
    body = [line.split("| ", 1)[1] for line in step12]
    keys = [token for part in body for token in part.split() if not token[0].isdigit()]
    assert sorted(keys) == sorted(VALUES)
    for part in body:
        groups = {t.split("/")[0] if "/" in t else "" for t in part.split() if not t[0].isdigit()}
        assert len(groups) == 1


def test_a_group_longer_than_the_width_wraps_at_entries() -> None:
    out = io.StringIO()
    values = {f"actor/metric_{i}": float(i) for i in range(12)}
    ConsoleBackend(stream=out, width=60).log(values, 1, {})
    lines = out.getvalue().splitlines()
    assert len(lines) > 2 and all(len(line) <= 60 for line in lines)
    assert sum(line.count("actor/metric_") for line in lines) == 12


def test_width_comes_from_the_terminal_or_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    backend = ConsoleBackend()
    assert backend._line_width(io.StringIO()) == DEFAULT_WIDTH
    monkeypatch.setenv("COLUMNS", "72")
    assert backend._line_width(io.StringIO()) == 72


def test_lines_can_go_through_a_logger_and_no_handler_is_installed(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = logging.getLogger("metricsync")
    before = list(logger.handlers)
    with caplog.at_level(logging.INFO, logger="metricsync"):
        ConsoleBackend(logger="metricsync", width=40).log(VALUES, 5, {})
    assert capsys.readouterr().out == ""
    messages = [r.getMessage() for r in caplog.records if r.name == "metricsync"]
    assert messages[0].startswith("step 5 | actor/") and len(messages) > 1
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert logger.handlers == before  # the library added no handler

    buffer = io.StringIO()
    handler = add_log_handler("metricsync.test", buffer)
    try:
        logging.getLogger("metricsync.test").setLevel(logging.INFO)
        ConsoleBackend(logger=logging.getLogger("metricsync.test")).log({"a": 1.0}, 1, {})
    finally:
        logging.getLogger("metricsync.test").removeHandler(handler)
    assert buffer.getvalue() == "step 1 | a        1\n"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_only_on_a_terminal_with_tqdm() -> None:
    pytest.importorskip("tqdm")
    silent = io.StringIO()
    with Progress(1000, "reading", stream=silent) as bar:
        bar.update(500)
    assert silent.getvalue() == "" and not bar.enabled
    tty = _Tty()
    with Progress(1000, "reading", stream=tty) as bar:
        assert bar.enabled
        bar.update(500)
    assert "reading:" in tty.getvalue() and "%|" in tty.getvalue()  # tqdm drew its bar
    small = _Tty()
    with Progress(10, "reading", stream=small, minimum=100) as bar:
        bar.update(5)
    assert small.getvalue() == ""


def test_progress_falls_back_to_a_plain_bar_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    tty = _Tty()
    with Progress(4, "demo", unit="step", stream=tty) as bar:
        bar.update(1)
        bar.clear()
        bar.update(3)
    text = tty.getvalue()
    assert "demo [" in text and "4/4 steps" in text and "#" * 30 in text
