"""Reading the JSONL log from its end: the last steps, and where a resuming writer goes on
(timeline rules: :mod:`metricsync._log._logread`).

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "m.jsonl"
>>> _ = path.write_text(
...     '{"step": 1, "data": {"a": 1}}\\n{"step": 2, "data": {"a": 2}}\\n'
...     '{"step": 2, "data": {"b": 5}}\\n{"step": 3, "data": {"a": 3}}\\n'
...     '{"step": 2, "data": {"a": 9}}\\n'   # a resume from step 2: step 3 is superseded
... )
>>> tail(path, 10).steps
[(1, {'a': 1.0}), (2, {'a': 9.0, 'b': 5.0})]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ._logfile import Formats, Steps, TornLine, parse_record
from ._logread import (
    STEP_PREFIX,
    ReadStats,
    invalid_line,
    line_number,
    lines_backward,
    lines_forward,
    parse_line,
)

__all__ = ["ResumePoint", "Tail", "resume_point", "tail"]


@dataclass
class Tail:
    """The last steps of a log's timeline, read from its end by :func:`tail`."""

    formats: Formats
    steps: Steps
    overwritten: int = 0  # records with a value that a later record of the same step replaced
    superseded: int = 0  # records skipped because a later one went back in step
    torn: str | None = None
    end: int = 0  # bytes taken into account (the file's size, less a torn last line)
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read


def _is_headerless(f: BinaryIO, stats: ReadStats | None) -> bool:
    """Whether the file starts with a step record: verl's layout, where no header will come."""
    f.seek(0)
    for _, line, ended in lines_forward(f, stats):
        if not line.strip():
            continue
        if not ended:
            return False
        try:
            return not parse_line(line, stats).is_header
        except ValueError:
            return False
    return False


def tail(
    path: Path, count: int, stats: ReadStats | None = None, *, at_step: int | None = None
) -> Tail:
    """The last ``count`` steps of the timeline of ``path``, with the formats of their keys.

    With ``at_step``, only that step, if it is on the timeline (then the
    reading goes back as far as that step).

    Reads backward until it has ``count`` steps and knows the format of each
    of their keys: from the latest header naming it, or from a complete
    header; a log without headers (verl's) has no formats to look for.
    """
    with path.open("rb") as f:
        info = os.fstat(f.fileno())
        end = info.st_size
        headerless = _is_headerless(f, stats)
        formats: Formats = {}
        result = Tail(formats, [], end=end, identity=(info.st_dev, info.st_ino))
        kept: list[tuple[int, dict[str, float]]] = []  # newest first
        floor: int | None = None
        needed: set[str] | None = None  # keys still lacking a format, once steps are done
        for offset, line, ended in lines_backward(f, end, stats):
            if not line.strip():
                continue
            if needed is not None and STEP_PREFIX.match(line):
                continue  # an older step: only headers matter now
            try:
                record = parse_line(line, stats, path)
            except TornLine as exc:
                if not ended and offset + len(line) == end:
                    result.torn, result.end = f"the line at byte {offset}: {exc}", offset
                    continue
                raise invalid_line(path, line_number(path, offset), exc) from None
            except ValueError as exc:
                raise invalid_line(path, line_number(path, offset), exc) from None
            if record.step is None:
                for key, fmt in record.formats.items():
                    formats.setdefault(key, fmt)  # a later header has won already
                    if needed is not None:
                        needed.discard(key)
                if needed is not None and (record.complete or not needed):
                    break
                continue
            if needed is not None:
                continue
            step = record.step
            if floor is None or step < floor:
                done = len(kept) == count if at_step is None else step < at_step
                if done:  # this step and every record before it are older
                    needed = set() if headerless else {k for _, v in kept for k in v} - set(formats)
                    if not needed:
                        break
                    continue
                floor = step
                if at_step is None or step == at_step:
                    kept.append((step, dict(record.values)))
            elif step == floor and kept and kept[-1][0] == step:
                newer = kept[-1][1]
                result.overwritten += not newer.keys().isdisjoint(record.values)
                kept[-1] = (step, {**record.values, **newer})  # keys in file order
            elif step > floor:
                result.superseded += 1
        result.steps = list(reversed(kept))
        return result


@dataclass
class ResumePoint:
    """What a writer reopening a log needs, read from the end of the file only."""

    last_step: int | None = None
    valid_end: int = 0  # where to append: the end, or the start of a torn last line
    torn: str | None = None  # why the last line was cut, if it was
    needs_newline: bool = False  # the file does not end with "\n" (once a torn line is cut)
    problems: list[str] = field(default_factory=list)  # invalid complete lines met


def resume_point(path: Path, max_lines: int = 1000) -> ResumePoint:
    """Where a writer reopening ``path`` appends, and the last step logged.

    Never raises for the file's content: a torn last line is reported in
    ``torn`` (the writer cuts it off), an invalid complete line in
    ``problems`` (the writer appends after it). At most ``max_lines`` lines
    are parsed looking for the last step record, so reopening costs the same
    for a file of any size.
    """
    point = ResumePoint()
    with path.open("rb") as f:
        end = os.fstat(f.fileno()).st_size
        point.valid_end = end
        if end:
            f.seek(end - 1)
            point.needs_newline = f.read(1) != b"\n"
        try:
            for index, (offset, line, ended) in enumerate(lines_backward(f, end)):
                if index >= max_lines:
                    break
                if not line.strip():
                    continue
                try:
                    record = parse_record(line)
                except TornLine as exc:
                    if not ended and offset + len(line) == end:
                        point.torn, point.valid_end = f"the line at byte {offset}: {exc}", offset
                        point.needs_newline = False
                    else:
                        point.problems.append(f"the line at byte {offset}: {exc}")
                    continue
                except ValueError as exc:
                    point.problems.append(f"the line at byte {offset}: {exc}")
                    continue
                if record.step is not None:
                    point.last_step = record.step
                    break
        except ValueError as exc:  # a line longer than any record
            point.problems.append(str(exc))
    return point
