"""The log readers: timeline semantics against a brute-force oracle, cost from the end, resume.

The oracle replays every record of the file in order (``read_jsonl``, which
keeps repeats) with the documented rule: an equal step merges (later values
win per key), a lower step drops every later one.
"""

from __future__ import annotations

import io
import json
import math
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

from metricsync._log._logfile import parse_record
from metricsync._log._logread import ReadStats, read_jsonl, read_timeline, scan
from metricsync._log._logtail import resume_point, tail
from metricsync.backends._jsonl import COMPLETE_EVERY, JsonlBackend


def oracle(path: Path) -> list[tuple[int, dict[str, float]]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, records = read_jsonl(path)
    timeline: list[tuple[int, dict[str, float]]] = []
    for step, values in records:
        while timeline and timeline[-1][0] > step:
            timeline.pop()
        if timeline and timeline[-1][0] == step:
            timeline[-1][1].update(values)
        else:
            timeline.append((step, dict(values)))
    return timeline


def _same(a: list[tuple[int, dict[str, float]]], b: list[tuple[int, dict[str, float]]]) -> bool:
    def norm(x: list[tuple[int, dict[str, float]]]) -> list[tuple[int, dict[str, str]]]:
        return [(s, {k: repr(v) for k, v in sorted(d.items())}) for s, d in x]

    return norm(a) == norm(b)


def _random_log(path: Path, rng: np.random.Generator, verl: bool) -> None:
    """Steps that go up, repeat, and jump back; keys and formats that come and change."""
    lines = []
    formats: dict[str, str | None] = {}
    step = int(rng.integers(0, 5))
    for _ in range(int(rng.integers(1, 40))):
        roll = rng.random()
        if roll < 0.15:
            step -= int(rng.integers(0, 6))  # a resume from an older checkpoint (or equal)
        elif roll < 0.3:
            pass  # the same step again (validation logged separately)
        else:
            step += int(rng.integers(1, 3))
        keys = [f"k{int(i)}" for i in rng.choice(6, size=int(rng.integers(1, 4)), replace=False)]
        values = {k: float(rng.normal()) if rng.random() > 0.1 else math.nan for k in keys}
        if verl:
            lines.append(json.dumps({"step": step, "data": {**values, "note": "x"}}))
            continue
        changed = {}
        for k in keys:
            fmt = rng.choice([None, ".3f", ".2e"]) if rng.random() < 0.3 else formats.get(k)
            if k not in formats or formats[k] != fmt:
                changed[k] = None if fmt is None else str(fmt)
        if changed or not lines:
            lines.append(json.dumps({"metricsync": 1, "formats": changed, "time": 0}))
            formats.update(changed)
        encoded = {k: "nan" if math.isnan(v) else v for k, v in values.items()}
        lines.append(json.dumps({"step": step, "time": 0, "values": encoded}))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("seed", range(40))
def test_tail_and_scan_equal_the_replayed_timeline(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path = tmp_path / "m.jsonl"
    _random_log(path, rng, verl=seed % 4 == 3)
    want = oracle(path)
    found = scan(path)
    assert _same(list(read_timeline(path, found)), want)
    assert all(a < b for a, b in zip(found.steps, found.steps[1:]))
    all_formats = read_jsonl(path)[0]
    for count in [1, 2, 3, len(want) - 1, len(want), len(want) + 5]:
        if count < 1:
            continue
        got = tail(path, count)
        assert _same(got.steps, want[-count:]), count
        shown = {k for _, values in got.steps for k in values}
        assert {k: got.formats[k] for k in shown if k in all_formats} == {
            k: all_formats[k] for k in shown if k in all_formats
        }


def test_tail_at_a_step_finds_it_only_on_the_timeline(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    records = [(1, {"a": 1}), (2, {"a": 2}), (3, {"a": 3}), (2, {"a": 20}), (2, {"b": 5})]
    path.write_text("".join(json.dumps({"step": s, "data": v}) + "\n" for s, v in records))
    assert tail(path, 1, at_step=2).steps == [(2, {"a": 20.0, "b": 5.0})]
    assert tail(path, 1, at_step=1).steps == [(1, {"a": 1.0})]
    assert tail(path, 1, at_step=3).steps == []  # superseded by the resume at step 2
    assert tail(path, 1, at_step=9).steps == []


def _write_run(run_dir: Path, steps: int, keys: int, late_key_at: int | None = None) -> Path:
    backend = JsonlBackend(run_dir)
    formats = {f"m{i}": (".3f" if i % 2 else None) for i in range(keys)}
    for step in range(steps):
        values = {f"m{i}": step * 0.5 + i for i in range(keys)}
        if late_key_at is not None and step >= late_key_at:
            values["late"] = 1.0
            formats["late"] = ".1%"
        backend.log(values, step, formats)
    backend.close()
    return run_dir / "metrics.jsonl"


def test_last_n_reads_the_same_for_a_ten_times_larger_file(tmp_path: Path) -> None:
    small = _write_run(tmp_path / "small", 1_000, 40, late_key_at=500)
    large = _write_run(tmp_path / "large", 10_000, 40, late_key_at=5_000)
    assert large.stat().st_size > 9 * small.stat().st_size > 9 * COMPLETE_EVERY // 2
    costs = []
    for path, steps in ((small, 1_000), (large, 10_000)):
        stats = ReadStats()
        got = tail(path, 5, stats)
        assert [s for s, _ in got.steps] == list(range(steps - 5, steps))
        assert got.formats["m1"] == ".3f" and got.formats["late"] == ".1%"
        assert got.formats["m0"] is None
        costs.append(stats)
    # the reading goes back to the nearest complete header at most: about COMPLETE_EVERY bytes
    for stats in costs:
        assert stats.bytes_read <= 2 * COMPLETE_EVERY + 256 * 1024
        assert stats.lines_parsed <= 20
    assert costs[1].bytes_read <= 3 * costs[0].bytes_read
    assert costs[1].lines_parsed <= 2 * costs[0].lines_parsed + 5


def test_scan_parses_headers_not_steps(tmp_path: Path) -> None:
    path = _write_run(tmp_path / "run", 2_000, 10)
    stats = ReadStats()
    found = scan(path, stats)
    assert len(found.steps) == 2_000
    assert stats.lines_parsed == found.headers < 20
    assert stats.bytes_read == path.stat().st_size


def test_last_n_of_an_old_log_without_complete_headers_still_finds_formats(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.jsonl"
    lines = [json.dumps({"metricsync": 1, "formats": {"lr": ".2e"}, "time": 0})]
    lines += [json.dumps({"step": s, "time": 0, "values": {"lr": 1e-4}}) for s in range(3000)]
    path.write_text("\n".join(lines) + "\n")
    got = tail(path, 2)
    assert got.formats == {"lr": ".2e"} and [s for s, _ in got.steps] == [2998, 2999]


BAD_LINES = {
    "huge integer": b'{"step": 1, "time": 0, "values": {"loss": 1' + b"0" * 399 + b"}}",
    "deep array": b'{"step": 1, "time": 0, "values": {"loss": '
    + b"[" * 100_000
    + b"]" * 100_000
    + b"}}",
    "huge width": b'{"metricsync": 1, "formats": {"loss": "300000000.3f"}, "time": 0}',
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_bad_records_raise_value_error_only(name: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_record(BAD_LINES[name])
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("name", sorted(BAD_LINES))
@pytest.mark.parametrize("where", ["middle", "last"])
def test_a_writer_resuming_a_bad_log_appends_and_never_raises(
    tmp_path: Path, name: str, where: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    good = b'{"metricsync": 1, "formats": {}, "time": 0}\n{"step": 1, "time": 0, "values": {}}\n'
    bad = BAD_LINES[name] + b"\n"
    path.write_bytes(good + bad if where == "last" else bad + good)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        backend = JsonlBackend(tmp_path)
    backend.log({"loss": 0.5}, 2, {})
    backend.close()
    data = path.read_bytes()
    assert data.startswith(good + bad if where == "last" else bad + good)  # nothing lost
    assert json.loads(data.splitlines()[-1])["step"] == 2
    point = resume_point(path)
    assert point.last_step == 2 and point.torn is None


def test_resume_cuts_a_torn_line_and_adds_a_missing_newline(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "data": {"a": 1}}\n{"step": 2, "da')
    point = resume_point(path)
    assert (point.last_step, point.torn is not None, point.valid_end) == (1, True, 30)
    path.write_bytes(b'{"step": 1, "data": {"a": 1}}')
    point = resume_point(path)
    assert (point.last_step, point.torn, point.needs_newline) == (1, None, True)


def test_an_equal_step_after_a_resume_is_warned_about_and_the_later_value_wins(
    tmp_path: Path,
) -> None:
    backend = JsonlBackend(tmp_path)
    backend.log({"a": 1.0, "b": 1.0}, 5, {})
    backend.log({"a": 2.0}, 5, {})  # a second call at one step in one run: no warning
    backend.close()
    with pytest.warns(UserWarning, match="step 5 was already logged"):
        backend = JsonlBackend(tmp_path)
        backend.log({"a": 3.0}, 5, {})
    backend.close()
    assert tail(tmp_path / "metrics.jsonl", 1).steps == [(5, {"a": 3.0, "b": 1.0})]
    assert tail(tmp_path / "metrics.jsonl", 1).overwritten == 2  # both earlier records


def test_complete_headers_repeat_and_formats_the_reader_would_reject_are_not_written(
    tmp_path: Path,
) -> None:
    backend = JsonlBackend(tmp_path)
    with pytest.warns(RuntimeWarning, match="adaptive format"):
        backend.log({"a": 1.0}, 0, {"a": "500.3f"})
    for step in range(1, 3000):
        backend.log({"a": float(step), "pad" * 200: 0.0}, step, {"a": ".3f"})
    backend.close()
    headers = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").open()) if "metricsync" in r]
    assert headers[0] == {**headers[0], "formats": {"a": None}, "complete": True}
    assert sum(bool(h.get("complete")) for h in headers) >= 2
    assert read_jsonl(tmp_path)[0]["a"] == ".3f"


class _Sink(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def test_showing_a_whole_log_streams_with_bounded_memory(tmp_path: Path) -> None:
    from metricsync._cli._show import show

    small = _write_run(tmp_path / "small", 1_000, 20)
    large = _write_run(tmp_path / "large", 10_000, 20)
    peaks = []
    for path in (small, large):
        tracemalloc.start()
        try:
            assert show(path, out=_Sink(), width=200) == 0
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    # ten times the steps and the bytes, not ten times the memory: a page of steps at a time
    assert peaks[1] < 2 * peaks[0], peaks
