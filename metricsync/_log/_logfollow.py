"""Following a log by its name as it grows, as ``tail -F`` does: what ``show --follow`` reads.

:meth:`LogFollower.poll` returns the records completed since the last poll and handles
rotation, truncation, rewrites, torn lines and a missing file, each reported once as a note.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "m.jsonl"
>>> _ = path.write_text('{"step": 1, "data": {"a": 1}}\\n')
>>> follower = LogFollower(path, path.stat().st_size)
>>> with path.open("a") as f:
...     _ = f.write('{"step": 2, "data": {"a": 2}}\\n{"step": 3, "da')
>>> follower.poll()
([Record(step=2, values={'a': 2.0})], [])
>>> _ = path.rename(path.with_suffix(".old"))
>>> _ = path.write_text('{"step": 1, "data": {"b": 5}}\\n')
>>> records, notes = follower.poll()
>>> records, [note.split(": ", 1)[1] for note in notes]
([Record(step=1, values={'b': 5.0})], ['a new file; skipping the torn last line of the old one and following the new one from its start'])
>>> follower.close()
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from ._logfile import Record, parse_record
from ._logread import ReadStats, lines_forward

__all__ = ["LogFollower"]

Identity = tuple[int, int]  # (st_dev, st_ino): which file a path names

_HEAD_BYTES = 256


def _identity(stat: os.stat_result) -> Identity:
    return stat.st_dev, stat.st_ino


class LogFollower:
    """Reads what is appended to the log at ``path`` from byte ``start`` on, by name.

    ``identity`` is the ``(st_dev, st_ino)`` of the file ``start`` refers to
    (from :class:`~metricsync._log._logtail.Tail`); when the path names another
    file by the time the follower opens it, that file is read from its start.
    The open file is kept until the path names another, so what is written
    to it before a rotation is read too. Call :meth:`close` when done.
    """

    def __init__(
        self,
        path: Path,
        start: int,
        identity: Identity | None = None,
        stats: ReadStats | None = None,
    ) -> None:
        self.path = path
        self._stats = stats
        self._file: BinaryIO | None = None
        self._end = start
        self._gone = False
        self._noted: set[str] = set()
        self._head = b""  # the first bytes of the file up to ``_end``, to tell a rewrite
        self._before = b""  # the byte before ``_end``
        try:
            self._file = path.open("rb")
        except FileNotFoundError:
            self._gone = True
            return
        if identity is not None and _identity(os.fstat(self._file.fileno())) != identity:
            self._end = 0  # replaced since ``start`` was read
        self._remember()

    def _remember(self) -> None:
        """Note the bytes that must stay put while the file only grows."""
        assert self._file is not None
        fd = self._file.fileno()
        self._head = os.pread(fd, min(self._end, _HEAD_BYTES), 0)
        self._before = os.pread(fd, 1, self._end - 1) if self._end else b""

    def _rewritten(self) -> bool:
        """Whether the bytes before ``_end`` changed: the file was rewritten in place."""
        assert self._file is not None
        if not self._end:
            return False
        fd = self._file.fileno()
        return (
            os.pread(fd, len(self._head), 0) != self._head
            or os.pread(fd, 1, self._end - 1) != self._before
        )

    def close(self) -> None:
        """Close the file being followed."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def poll(self) -> tuple[list[Record], list[str]]:
        """``(records, notes)``: the records completed since the last poll, and what happened."""
        records: list[Record] = []
        notes: list[str] = []
        if self._file is not None:
            if os.fstat(self._file.fileno()).st_size < self._end:
                notes.append(f"{self.path}: truncated; following it from its start")
                self._end = 0
            elif self._rewritten():
                notes.append(f"{self.path}: rewritten in place; following it from its start")
                self._end = 0
            records += self._read(notes)
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            if not self._gone:
                self._gone = True
                notes.append(f"{self.path}: no such file any more; waiting for a new one")
            return records, notes
        self._gone = False
        if self._file is None or _identity(named) != _identity(os.fstat(self._file.fileno())):
            if self._file is not None:  # what the old file gained since the read above
                records += self._read(notes)
            try:
                notes.append(f"{self.path}: {self._switch()}")
            except FileNotFoundError:  # gone again between the two calls
                return records, notes
            records += self._read(notes)
        elif named.st_size < self._end:
            notes.append(f"{self.path}: truncated; following it from its start")
            self._end = 0
            records += self._read(notes)
        return records, notes

    def _switch(self) -> str:
        """Open the file the path names now; say what became of the old one."""
        what = "a new file; following it from its start"
        if self._file is not None and os.fstat(self._file.fileno()).st_size > self._end:
            what = (
                "a new file; skipping the torn last line of the old one and following the "
                "new one from its start"
            )
        new = self.path.open("rb")
        if self._file is not None:
            self._file.close()
        self._file, self._end = new, 0
        self._head = self._before = b""
        return what

    def _read(self, notes: list[str]) -> list[Record]:
        """The complete records past ``_end`` of the open file."""
        assert self._file is not None
        records = []
        self._file.seek(self._end)
        for offset, line, ended in lines_forward(self._file, self._stats):
            if not ended:
                break  # a line being written: read it complete next time
            self._end = offset + len(line) + 1
            if not line.strip():
                continue
            try:
                record = parse_record(line)
            except ValueError as exc:
                notes.append(
                    f"{self.path}: skipping the line at byte {offset}, not a valid record: {exc}"
                )
                continue
            for note in record.renamed:
                if note not in self._noted:
                    self._noted.add(note)
                    notes.append(f"{self.path}: {note}")
            records.append(record)
        self._remember()
        return records
