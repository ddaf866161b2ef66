"""Metric keys no log can hold (lone surrogates, megabytes of text): written and read as one name.

The Tracker logs such a key under its cleaned name with a warning and the
other keys of the step as given; ``show``, ``plot`` and ``compare`` read any
log (the Tracker's, or one written by something else) with the same names,
warning once and naming the file.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from _cli import run
from hypothesis import example, given
from hypothesis import strategies as st

from metricsync._log._logfile import parse_record
from metricsync._log._logkeys import MAX_KEY_CHARS, clean_key, read_key
from metricsync._log._logread import read_jsonl
from metricsync._log._logtail import tail
from metricsync._tracking._tracker import Tracker

ROOT = Path(__file__).resolve().parents[1]
SURROGATE = "acc\ud800/top1"
ESCAPED = "acc\\ud800/top1"  # the six characters backslash, u, d, 8, 0, 0


def _foreign_log(path: Path, key_json: str, steps: int = 3) -> Path:
    """A log as another writer would leave it: ``key_json`` is the key as JSON text."""
    lines = [f'{{"metricsync": 1, "formats": {{{key_json}: null, "loss": ".3f"}}, "time": 0}}']
    lines += [
        f'{{"step": {s}, "time": 0, "values": {{{key_json}: {s}.5, "loss": {1 / s}}}}}'
        for s in range(1, steps + 1)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    return path


@given(st.text(alphabet=st.characters(codec=None), max_size=40), st.integers(0, 3000))
def test_cleaned_keys_are_utf8_bounded_and_stable(text: str, extra: int) -> None:
    key = text + "x" * extra
    cleaned = clean_key(key)
    cleaned.encode("utf-8")  # no lone surrogate left
    assert len(cleaned) <= MAX_KEY_CHARS
    assert read_key(cleaned) == cleaned  # readers keep what the writer cleaned: no change
    if len(key) <= MAX_KEY_CHARS and "\\" not in key:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            assert cleaned != key
        else:
            assert cleaned == key  # a key any log holds is kept as it is


# Keys built from the characters that make an escaped surrogate, and surrogates themselves.
_ESCAPY = st.text(alphabet=st.sampled_from(["\\", "u", "d", "8", "0", "a", "\ud800"]), max_size=12)


@given(_ESCAPY, _ESCAPY)
@example("a\ud800", "a\\ud800")
@example("\\\ud800", "\\\\ud800")
def test_distinct_keys_are_written_under_distinct_names(a: str, b: str) -> None:
    # before: "a\ud800" (a surrogate) and "a\\ud800" (its escaped text) both became the latter
    if a != b:
        assert clean_key(a) != clean_key(b)


def test_a_surrogate_key_and_its_escaped_text_logged_in_two_steps_stay_two_series(
    tmp_path: Path,
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Tracker(("jsonl",), run_dir=tmp_path) as tracker:
            tracker.log({SURROGATE: 1.0}, 1)
            tracker.log({ESCAPED: 2.0}, 2)
    _, steps = read_jsonl(tmp_path)
    # before: [(1, {ESCAPED: 1.0}), (2, {ESCAPED: 2.0})], one series, no warning for step 2
    assert steps == [(1, {ESCAPED: 1.0}), (2, {"acc\\\\ud800/top1": 2.0})]
    assert len({str(w.message) for w in caught}) == 2


def test_a_log_holding_a_surrogate_key_and_its_escaped_text_keeps_both_values() -> None:
    record = parse_record(b'{"step": 1, "data": {"a\\ud800": 1.0, "a\\\\ud800": 2.0}}')
    # before: {"a\\ud800": 2.0}, the 1.0 dropped with only a "renamed" note
    assert sorted(record.values.values()) == [1.0, 2.0]
    assert record.values["a\\ud800"] == 2.0  # the key the log holds as text keeps its name
    assert len(record.renamed) == 1 and "both" in record.renamed[0]


def test_show_prints_both_values_of_keys_that_clean_to_one_name(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"step": 1, "data": {"a\\ud800": 1.0, "a\\\\ud800": 2.0}}\n')
    result = run("show", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert sorted(row["values"].values()) == [1.0, 2.0]


def test_two_long_keys_sharing_their_start_stay_apart() -> None:
    a, b = "k" * 5000 + "a", "k" * 5000 + "b"
    assert clean_key(a) != clean_key(b)
    assert clean_key(a)[:100] == "k" * 100


def test_a_lone_surrogate_key_is_logged_escaped_with_the_other_keys(tmp_path: Path) -> None:
    with (
        pytest.warns(UserWarning, match=r"lone surrogate.*logged as"),
        Tracker(("jsonl",), run_dir=tmp_path) as tracker,
    ):
        tracker.log({SURROGATE: 0.25, "loss": 0.5}, 1)
        tracker.log({SURROGATE: 0.75, "loss": 0.25}, 2)
    raw = (tmp_path / "metrics.jsonl").read_bytes()
    raw.decode("utf-8")
    assert b"\\ud800" not in raw.replace(b"\\\\ud800", b"")  # no JSON escape of a surrogate
    _, steps = read_jsonl(tmp_path)
    assert steps == [(1, {ESCAPED: 0.25, "loss": 0.5}), (2, {ESCAPED: 0.75, "loss": 0.25})]


def test_show_and_plot_read_a_tracker_log_with_a_surrogate_key(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Tracker(run_dir=tmp_path) as tracker:
            for step in (1, 2):
                tracker.log({SURROGATE: step / 4, "loss": 1 / step}, step)
    shown = run("show", str(tmp_path), "--format", "csv")
    # before: exit 1, "'utf-8' codec can't encode character '\ud800'", naming nothing
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [f"step,{ESCAPED},loss", "1,0.25,1.0", "2,0.5,0.5"]
    plotted = run("plot", str(tmp_path), "-o", str(tmp_path / "x.png"))
    # before: a matplotlib traceback
    assert plotted.returncode == 0, plotted.stderr
    assert "Traceback" not in plotted.stderr and (tmp_path / "x.png").stat().st_size > 0


@pytest.mark.parametrize("command", ["show", "show-last", "plot", "compare"])
def test_a_foreign_log_with_a_surrogate_key_reads_with_one_warning(
    tmp_path: Path, command: str
) -> None:
    if command == "plot":
        pytest.importorskip("matplotlib")
    path = _foreign_log(tmp_path / "m.jsonl", '"acc\\ud800/top1"')
    args = {
        "show": ["show", str(path), "--format", "csv"],
        "show-last": ["show", str(path), "--last", "1", "--format", "csv"],
        "plot": ["plot", str(path), "-o", str(tmp_path / "x.png")],
        "compare": ["compare", str(path), str(path)],
    }[command]
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    warned = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warned) == 1 and str(path) in warned[0] and "lone surrogate" in warned[0]
    if command == "show":
        assert result.stdout.splitlines()[0] == f"step,{ESCAPED},loss"
        assert result.stdout.splitlines()[3] == "3,3.5,0.3333333333333333"
    if command == "compare":
        assert ESCAPED in result.stdout


def test_a_5_mb_key_reads_shortened_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from metricsync._cli._plot_data import load_runs
    from metricsync._cli._plot_draw import TITLE_CHARS, build_figure

    huge = "k" * 5_000_000
    path = _foreign_log(tmp_path / "m.jsonl", json.dumps(huge), steps=4)
    short = clean_key(huge)
    with pytest.warns(UserWarning, match=r"m\.jsonl: a key of 5,000,000 characters"):
        runs, keys = load_runs([path], None)
    assert keys == [short, "loss"] and len(short) == MAX_KEY_CHARS
    steps, values = runs[0].series[short]
    assert steps.tolist() == [1, 2, 3, 4] and values.tolist() == [1.5, 2.5, 3.5, 4.5]
    figure = build_figure(runs, keys)
    titles = [ax.get_title() for ax in figure.get_axes()]
    assert max(len(t) for t in titles) <= TITLE_CHARS and "loss" in titles
    # the command line: the picture, one warning naming the file (before: killed at 300 s, 1 GB)
    result = run("plot", str(path), "-o", str(tmp_path / "x.png"))
    assert result.returncode == 0, result.stderr
    [warning] = [line for line in result.stderr.splitlines() if "warning" in line]
    assert str(path) in warning and short[-9:] in warning and len(warning) < 300
    missing = run("show", str(path), "--keys", "nope")  # the keys it lists are cut too
    [error] = [line for line in missing.stderr.splitlines() if "error" in line]
    assert missing.returncode == 1 and "available: kkk" in error and len(error) < 400
    with pytest.warns(UserWarning, match="5,000,000"):
        found = tail(path, 2)
    assert [values for _, values in found.steps] == [
        {short: 3.5, "loss": 1 / 3},
        {short: 4.5, "loss": 0.25},
    ]


def test_the_tracker_shortens_an_overlong_key_and_logs_the_others(tmp_path: Path) -> None:
    long = "actor/" + "x" * 100_000
    with (
        pytest.warns(UserWarning, match="a key of 100,006 characters"),
        Tracker(("jsonl",), run_dir=tmp_path) as tracker,
    ):
        tracker.log({long: 1.0, "loss": 0.5}, 1)
    _, steps = read_jsonl(tmp_path)
    assert steps == [(1, {clean_key(long): 1.0, "loss": 0.5})]
    assert os.path.getsize(tmp_path / "metrics.jsonl") < 4 * MAX_KEY_CHARS


def test_a_surrogate_key_and_its_escaped_text_in_one_step_are_both_logged(
    tmp_path: Path,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Tracker(("jsonl",), run_dir=tmp_path) as tracker:
            tracker.log({ESCAPED: 1.0, SURROGATE: 2.0}, 1)
    # before: ValueError "would both be logged as", the step refused
    assert read_jsonl(tmp_path)[1] == [(1, {"acc\\\\ud800/top1": 1.0, ESCAPED: 2.0})]
