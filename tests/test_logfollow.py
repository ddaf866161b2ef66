"""``show --follow`` follows a log by name, as ``tail -F`` does: rotations, new runs, truncation.

The follower is driven poll by poll (no timing), and the command once in a
subprocess across a rotation.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from _cli import follow

from metricsync._log._logfollow import LogFollower
from metricsync._log._logtail import tail
from metricsync._tracking._tracker import Tracker

ROOT = Path(__file__).resolve().parents[1]


def _log(run_dir: Path, steps: dict[int, float]) -> Path:
    with Tracker(run_dir=run_dir) as tracker:
        for step, loss in steps.items():
            tracker.log({"loss": loss}, step)
    return run_dir / "metrics.jsonl"


def _steps(records: list) -> list[tuple[int, dict[str, float]]]:
    return [(r.step, r.values) for r in records if r.step is not None]


def _follower(path: Path) -> LogFollower:
    found = tail(path, 10)
    return LogFollower(path, found.end, found.identity)


def test_a_rotation_reads_the_rest_of_the_old_file_then_the_new_one(tmp_path: Path) -> None:
    path = _log(tmp_path, {1: 1.0})
    follower = _follower(path)
    assert follower.poll() == ([], [])
    _log(tmp_path, {2: 0.5})  # written after the last poll, before the rotation
    path.rename(tmp_path / "metrics.jsonl.1")
    _log(tmp_path, {1: 0.9, 2: 0.4})  # a new run at the same path
    records, notes = follower.poll()
    assert _steps(records) == [(2, {"loss": 0.5}), (1, {"loss": 0.9}), (2, {"loss": 0.4})]
    assert notes == [f"{path}: a new file; following it from its start"]
    _log(tmp_path, {3: 0.3})
    assert _steps(follower.poll()[0]) == [(3, {"loss": 0.3})]
    follower.close()


def test_a_deleted_log_is_waited_for_and_read_when_it_comes_back(tmp_path: Path) -> None:
    path = _log(tmp_path, {1: 1.0, 2: 0.5})
    follower = _follower(path)
    path.unlink()
    records, notes = follower.poll()
    assert records == [] and notes == [f"{path}: no such file any more; waiting for a new one"]
    for _ in range(3):
        assert follower.poll() == ([], [])  # said once
    _log(tmp_path, {1: 0.7})
    records, notes = follower.poll()
    assert _steps(records) == [(1, {"loss": 0.7})] and "a new file" in notes[0]
    follower.close()


def test_a_log_truncated_in_place_is_read_from_its_start(tmp_path: Path) -> None:
    path = _log(tmp_path, {1: 1.0, 2: 0.5, 3: 0.25})
    follower = _follower(path)
    inode = path.stat().st_ino
    path.write_text('{"step": 1, "data": {"loss": 0.125}}\n')  # same file, shorter
    assert path.stat().st_ino == inode
    records, notes = follower.poll()
    assert _steps(records) == [(1, {"loss": 0.125})]
    assert notes == [f"{path}: truncated; following it from its start"]
    follower.close()


def test_a_line_being_written_waits_for_its_end(tmp_path: Path) -> None:
    path = _log(tmp_path, {1: 1.0})
    follower = _follower(path)
    with path.open("ab") as f:
        f.write(b'{"step": 2, "data": {"loss": 0.')
        f.flush()
        assert follower.poll() == ([], [])
        f.write(b"5}}\n")
    assert _steps(follower.poll()[0]) == [(2, {"loss": 0.5})]
    follower.close()


def test_a_log_replaced_before_following_starts_is_read_whole(tmp_path: Path) -> None:
    path = _log(tmp_path, {1: 1.0, 2: 0.5, 3: 0.25})
    found = tail(path, 1)
    path.unlink()
    _log(tmp_path, {7: 0.7})  # a new file, shorter or longer than the old end
    follower = LogFollower(path, found.end, found.identity)
    assert _steps(follower.poll()[0]) == [(7, {"loss": 0.7})]
    follower.close()


def test_show_follow_shows_the_new_run_after_a_rotation(tmp_path: Path) -> None:
    path = _log(tmp_path, {1: 1.0})
    child = follow(tmp_path)
    try:
        assert child.stdout is not None
        first = [child.stdout.readline() for _ in range(3)]
        assert first[2].split() == ["1", "1"]
        path.rename(tmp_path / "metrics.jsonl.1")
        time.sleep(0.5)  # several polls without a file (before: exit 1)
        _log(tmp_path, {1: 0.75, 2: 0.5})
        # before: nothing more (the new file read from the old one's end, or an error)
        assert child.stdout.readline().split() == ["1", "0.75"]
        assert child.stdout.readline().split() == ["2", "0.5"]
    finally:
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)
    assert child.returncode == 0, stderr
    assert "Traceback" not in stderr
    new_file = f"metricsync: warning: {path}: a new file; following it from its start"
    gone = f"metricsync: warning: {path}: no such file any more; waiting for a new one"
    assert new_file in stderr.splitlines() and set(stderr.splitlines()) <= {gone, new_file}


def test_a_log_truncated_and_grown_again_between_polls_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    # copytruncate, or a writer reopening with "w": shorter, then longer than the followed
    # offset again before the next poll
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1}}\n{"step": 2, "data": {"a": 2}}\n')
    follower = LogFollower(path, path.stat().st_size)
    assert follower.poll() == ([], [])
    path.write_text("".join(f'{{"step": {s}, "data": {{"loss": {s}0}}}}\n' for s in (1, 2, 3)))
    records, notes = follower.poll()
    # before: ValueError "the line at byte 60 is not a valid record", show --follow exit 1
    assert _steps(records) == [(1, {"loss": 10.0}), (2, {"loss": 20.0}), (3, {"loss": 30.0})]
    assert len(notes) == 1 and "rewritten" in notes[0]
    follower.close()


def test_a_log_rewritten_with_the_same_size_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1}}\n')
    follower = LogFollower(path, path.stat().st_size)
    path.write_text('{"step": 7, "data": {"b": 1}}\n{"step": 8, "data": {"b": 2}}\n')
    records, _ = follower.poll()
    # before: step 8 alone, step 7 of the new content never shown
    assert _steps(records) == [(7, {"b": 1.0}), (8, {"b": 2.0})]
    follower.close()


def test_a_line_that_is_no_record_is_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1}}\n')
    follower = LogFollower(path, path.stat().st_size)
    with path.open("a") as f:
        f.write('{"a": 1}\n{"step": 2, "data": {"a": 2}}\n')
    records, notes = follower.poll()
    # before: ValueError, following stopped
    assert _steps(records) == [(2, {"a": 2.0})]
    assert len(notes) == 1 and "byte 30" in notes[0] and "not a valid record" in notes[0]
    follower.close()


def test_what_the_old_file_gains_just_before_a_rotation_is_read(tmp_path: Path) -> None:
    # The writer appends a step to the old file and rotates between the follower's read
    # of the open file and its look at the path.
    path = tmp_path / "n.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1}}\n')
    follower = LogFollower(path, path.stat().st_size)
    original = follower._read

    def racy(notes: list[str]) -> list:
        follower._read = original  # type: ignore[method-assign]
        got = original(notes)
        with path.open("a") as f:
            f.write('{"step": 2, "data": {"a": 2}}\n')
        path.rename(tmp_path / "n.old")
        path.write_text('{"step": 3, "data": {"a": 3}}\n')
        return got

    follower._read = racy  # type: ignore[method-assign]
    records, notes = follower.poll()
    # before: [3], step 2 lost and "skipping the torn last line of the old one"
    assert [r.step for r in records] == [2, 3]
    assert not any("torn" in note for note in notes)
    follower.close()
