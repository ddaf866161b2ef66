"""Streaming readers of the JSONL log: forward, from the end, and what a resuming writer needs.

Memory is bounded. The *timeline* shown merges a step logged twice (later values win) and
lets a lower step supersede every later one (a resumed run), so ``show --last N`` reads about
N records whatever the file's size.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "m.jsonl"
>>> _ = path.write_text(
...     '{"step": 1, "data": {"a": 1}}\\n{"step": 2, "data": {"a": 2}}\\n'
...     '{"step": 2, "data": {"b": 5}}\\n{"step": 3, "data": {"a": 3}}\\n'
...     '{"step": 2, "data": {"a": 9}}\\n'   # a resume from step 2: step 3 is superseded
... )
>>> [step for step, _ in read_timeline(path, scan(path))]
[1, 2]
"""

from __future__ import annotations

import os
import re
import warnings
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ._logfile import (
    MAX_LINE_BYTES,
    Formats,
    Record,
    Steps,
    TornLine,
    parse_record,
    resolve_log_path,
)

__all__ = [
    "STEP_PREFIX",
    "ReadStats",
    "Scan",
    "invalid_line",
    "line_number",
    "parse_line",
    "iter_records",
    "lines_backward",
    "lines_forward",
    "read_jsonl",
    "read_timeline",
    "scan",
]

_BLOCK = 64 * 1024
# A step record as the writer (and verl) lays it out starts with its step number.
STEP_PREFIX = re.compile(rb'\s*\{\s*"step"\s*:\s*(-?\d{1,30})\s*,')
_HEADER_PREFIX = re.compile(rb'\s*\{\s*"metricsync"\s*:')

Progress = Callable[[int], None]


@dataclass
class ReadStats:
    """What a reader cost: bytes read from the file and lines parsed as JSON."""

    bytes_read: int = 0
    lines_parsed: int = 0


def parse_line(line: bytes, stats: ReadStats | None, path: Path | None = None) -> Record:
    """:func:`~metricsync._log._logfile.parse_record`, counted; a key read under another name
    (see :mod:`metricsync._log._logkeys`) is warned about, naming ``path``."""
    if stats is not None:
        stats.lines_parsed += 1
    record = parse_record(line)
    if path is not None:
        for note in record.renamed:
            warnings.warn(f"{path}: {note}", UserWarning, stacklevel=3)
    return record


def invalid_line(path: Path, line_no: int | str, exc: Exception) -> ValueError:
    return ValueError(f"{path}: line {line_no} is not a valid record: {exc}")


def line_number(path: Path, offset: int) -> int:
    """1-based number of the line starting at ``offset`` (read only to name an error)."""
    count = 1
    with path.open("rb") as f:
        remaining = offset
        while remaining > 0:
            block = f.read(min(1 << 20, remaining))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count


def lines_forward(
    f: BinaryIO, stats: ReadStats | None = None, progress: Progress | None = None
) -> Iterator[tuple[int, bytes, bool]]:
    """``(offset, line, ended)`` from ``f``'s position on; ``ended`` is False for a last line without ``\\n``."""
    offset = f.tell()
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if stats is not None:
            stats.bytes_read += len(raw)
        if progress is not None:
            progress(len(raw))
        ended = raw.endswith(b"\n")
        if not ended and len(raw) > MAX_LINE_BYTES:
            raise ValueError(f"expected lines of at most {MAX_LINE_BYTES} bytes")
        yield offset, raw[:-1] if ended else raw, ended
        offset += len(raw)


def lines_backward(
    f: BinaryIO, end: int, stats: ReadStats | None = None
) -> Iterator[tuple[int, bytes, bool]]:
    """``(offset, line, ended)`` of the lines before byte ``end``, last line first.

    Reads blocks of 64 KiB from the end (doubling while one line is longer),
    so the cost is that of the lines consumed, not of the file.
    """
    pos, buf, hi, block = end, b"", 0, _BLOCK
    while True:
        # buf holds file[pos : pos + len(buf)]; the lines after buf[:hi] were yielded.
        cut = buf.rfind(b"\n", 0, hi - 1) if hi > 1 else -1
        if cut >= 0 or pos == 0:
            start = cut + 1
            if hi > start:
                line = buf[start:hi]
                ended = line.endswith(b"\n")
                yield pos + start, line[:-1] if ended else line, ended
            if cut < 0:
                return
            hi = start
            continue
        if hi > MAX_LINE_BYTES:
            raise ValueError(f"expected lines of at most {MAX_LINE_BYTES} bytes")
        if hi >= block:  # one line longer than a block: read more at a time
            block = min(block * 2, 1 << 24)
        size = min(block, pos)
        pos -= size
        f.seek(pos)
        chunk = f.read(size)
        if stats is not None:
            stats.bytes_read += len(chunk)
        buf, hi = chunk + buf[:hi], hi + len(chunk)


def iter_records(
    path: Path,
    on_torn: Callable[[str], None] | None = None,
    stats: ReadStats | None = None,
    progress: Progress | None = None,
) -> Iterator[Record]:
    """Every record of the file in order, parsed; a torn last line goes to ``on_torn``.

    An invalid line raises ``ValueError`` naming its number; so does a last
    line that is complete JSON but not a valid record.
    """
    with path.open("rb") as f:
        for line_no, (_, line, ended) in enumerate(lines_forward(f, stats, progress), 1):
            if not line.strip():
                continue
            try:
                yield parse_line(line, stats, path)
            except TornLine as exc:
                if ended:
                    raise invalid_line(path, line_no, exc) from None
                if on_torn is not None:
                    on_torn(f"line {line_no}: {exc}")
            except ValueError as exc:
                raise invalid_line(path, line_no, exc) from None


@dataclass
class Scan:
    """The timeline of a log as :func:`scan` found it, most step records located but not parsed.

    Timeline step ``i`` is ``steps[i]``, logged by the record on line
    ``lines[i]`` at byte ``offsets[i]``, and by the records in ``more[i]``
    (``(offset, line)`` pairs, in file order) when it was logged again.
    """

    formats: Formats = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # keys the headers name, in order
    steps: list[int] = field(default_factory=list)
    offsets: array[int] = field(default_factory=lambda: array("q"))
    lines: array[int] = field(default_factory=lambda: array("q"))
    more: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    superseded: int = 0  # records dropped because a later record went back in step
    repeated: int = 0  # records merged into an earlier record of the same step
    overwritten: int = 0  # of those, the ones that replaced a value (known once read)
    headers: int = 0
    torn: str | None = None
    end: int = 0  # bytes taken into account (the file's size, less a torn last line)

    def add(self, step: int, offset: int, line_no: int) -> None:
        steps = self.steps
        while steps and steps[-1] > step:
            index = len(steps) - 1
            steps.pop()
            self.offsets.pop()
            self.lines.pop()
            self.superseded += 1 + len(self.more.pop(index, ()))
        if steps and steps[-1] == step:
            self.more.setdefault(len(steps) - 1, []).append((offset, line_no))
            self.repeated += 1
        else:
            steps.append(step)
            self.offsets.append(offset)
            self.lines.append(line_no)


def scan(path: Path, stats: ReadStats | None = None, progress: Progress | None = None) -> Scan:
    """Find the timeline of ``path``: headers are parsed, step records mostly only located.

    A step record laid out as the writer lays it out (``{"step": N, ...}``)
    is located by its first bytes; it is parsed later, by
    :func:`read_timeline`, only if it is on the timeline. Memory: a few
    dozen bytes per step, whatever the number of metrics.
    """
    result = Scan()
    seen: set[str] = set()
    with path.open("rb") as f:
        result.end = os.fstat(f.fileno()).st_size
        for line_no, (offset, line, ended) in enumerate(lines_forward(f, stats, progress), 1):
            if not line.strip():
                continue
            # Until a header comes (verl's logs have none) keys come from parsed steps.
            match = STEP_PREFIX.match(line) if ended and result.headers else None
            if match is not None and line.rstrip().endswith(b"}"):
                result.add(int(match.group(1)), offset, line_no)
                continue
            try:
                record = parse_line(line, stats, path)
            except TornLine as exc:
                if ended:
                    raise invalid_line(path, line_no, exc) from None
                result.torn, result.end = f"line {line_no}: {exc}", offset
                break
            except ValueError as exc:
                raise invalid_line(path, line_no, exc) from None
            if record.step is not None:
                result.add(record.step, offset, line_no)
                if not result.headers:
                    result.keys.extend(k for k in record.values if k not in seen)
                    seen.update(record.values)
                continue
            result.headers += 1
            result.keys.extend(k for k in record.formats if k not in seen)
            seen.update(record.formats)
            result.formats.update(record.formats)
    return result


def read_timeline(
    path: Path,
    found: Scan,
    stats: ReadStats | None = None,
    progress: Progress | None = None,
) -> Iterator[tuple[int, dict[str, float]]]:
    """Parse the records :func:`scan` located: ``(step, values)`` in step order, repeats merged.

    One step's values are in memory at a time.
    """
    with path.open("rb") as f:
        position = 0
        for index, step in enumerate(found.steps):
            values: dict[str, float] = {}
            records = [(found.offsets[index], found.lines[index]), *found.more.get(index, ())]
            for offset, line_no in records:
                if offset != position:
                    f.seek(offset)
                raw = f.readline(MAX_LINE_BYTES + 1)
                position = offset + len(raw)
                if stats is not None:
                    stats.bytes_read += len(raw)
                if progress is not None:
                    progress(len(raw))
                try:
                    record = parse_line(raw.rstrip(b"\n"), stats, path)
                    if record.step != step:
                        raise ValueError(f"expected the record of step {step}")
                except ValueError as exc:
                    raise invalid_line(path, line_no, exc) from None
                if values and not values.keys().isdisjoint(record.values):
                    found.overwritten += 1
                values.update(record.values)
            yield step, values


def read_jsonl(path: str | os.PathLike[str]) -> tuple[Formats, Steps]:
    """Read every record of a JSONL log in file order: ``(formats, [(step, values), ...])``.

    ``formats`` merges every header (later headers win); steps come in file
    order, a step logged twice appearing twice (the ``show`` and ``plot``
    commands resolve repeats, see :mod:`metricsync._log._logread`), values as
    floats. A torn last line (a process killed mid-write) is skipped with a
    warning; an invalid line elsewhere raises ``ValueError`` naming the line;
    a missing file raises ``FileNotFoundError``. ``path`` may also be a run
    directory. The file is read line by line.

    >>> import tempfile
    >>> from metricsync._tracking._tracker import Tracker
    >>> run_dir = tempfile.mkdtemp()
    >>> with Tracker(run_dir=run_dir) as tracker:
    ...     tracker.log({"loss": float("nan")}, step=1)
    >>> read_jsonl(run_dir)
    ({'loss': None}, [(1, {'loss': nan})])
    """
    formats: Formats = {}
    steps: Steps = []
    file = resolve_log_path(path)
    for record in iter_records(file, on_torn=lambda why: _warn_torn(file, why)):
        if record.step is None:
            formats.update(record.formats)
        else:
            steps.append((record.step, record.values))
    return formats, steps


def _warn_torn(file: Path, why: str) -> None:
    warnings.warn(f"{file}: skipping a torn last line ({why})", RuntimeWarning, stacklevel=4)
