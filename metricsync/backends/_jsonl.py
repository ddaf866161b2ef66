"""The ``jsonl`` backend: ``run_dir/metrics.jsonl``, one strict JSON object per line.

The record layout is described in :mod:`metricsync._log._logfile`. Every step is
written with one unbuffered ``os.write`` of complete lines (header and step
record together), so a process killed at any moment leaves every earlier
step intact; ``fsync=True`` also survives a power loss. A failed write is cut
back so the file never holds a torn line in its middle.

Opening an existing log appends to it after reading only its end: the last
step logged (the tracker warns about steps that go backwards; this backend
warns when the first step after a resume repeats the last one, whose later
values then win), a torn last line (left by a killed process, cut off with a
warning) and whether the file ends with ``\n``. An invalid line near the end
is warned about and kept, never a reason to stop training. The first header
after opening, and one every :data:`COMPLETE_EVERY` bytes or so, is
*complete* (every format in use), so readers of the end of the file find
the formats nearby.

>>> import tempfile, pathlib
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> backend = JsonlBackend(run_dir)
>>> backend.log({"loss": 0.5, "gn": float("inf")}, 1, {"loss": ".3f"})
>>> backend.close()
>>> import json
>>> for line in (run_dir / "metrics.jsonl").read_text().splitlines():
...     print({**json.loads(line), "time": "T"})
{'metricsync': 1, 'formats': {'loss': '.3f', 'gn': None}, 'time': 'T', 'complete': True}
{'step': 1, 'time': 'T', 'values': {'loss': 0.5, 'gn': 'inf'}}
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

from .._log._logfile import LOG_NAME, header_record, step_record
from .._log._logtail import resume_point
from .._state._formatting import check_fmt

__all__ = ["COMPLETE_EVERY", "JsonlBackend"]

COMPLETE_EVERY = 1 << 20
"""Bytes between complete headers (at least 32 times the header's own size)."""


class JsonlBackend:
    """Append steps to ``run_dir/metrics.jsonl`` (created with its directory if needed).

    ``last_step`` is the step of the last record in the file (None when there
    is none yet); the tracker uses it to warn about steps going backwards.
    A format that readers would reject (see
    :func:`~metricsync._state._formatting.check_fmt`) is written as adaptive (null),
    with a warning.

    >>> import tempfile
    >>> from metricsync._log._logread import read_jsonl
    >>> run_dir = tempfile.mkdtemp()
    >>> for step in (1, 2):
    ...     backend = JsonlBackend(run_dir)   # the second one resumes the file
    ...     backend.log({"loss": 1.0 / step}, step, {})
    ...     backend.close()
    >>> read_jsonl(run_dir)
    ({'loss': None}, [(1, {'loss': 1.0}), (2, {'loss': 0.5})])
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(run_dir) / LOG_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._formats: dict[str, str | None] = {}  # every format written since opening
        self._since_complete = 0  # bytes written since the last complete header
        self._complete_size = 64  # about the size of a complete header
        self._rejected: set[str] = set()
        self._wrote_header = False
        self.last_step: int | None = None
        self._resumed_at: int | None = None
        prefix = b""
        if self.path.exists():
            point = resume_point(self.path)
            self.last_step = self._resumed_at = point.last_step
            if point.torn is not None:
                warnings.warn(
                    f"{self.path}: cutting off a torn last line before appending ({point.torn})",
                    RuntimeWarning,
                    stacklevel=3,
                )
                os.truncate(self.path, point.valid_end)
            if point.problems:
                warnings.warn(
                    f"{self.path}: {len(point.problems)} invalid line(s) near the end are kept "
                    f"and new steps appended after them (readers will reject the file until "
                    f"they are removed): {point.problems[0]}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            if point.needs_newline:
                prefix = b"\n"
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if prefix:
            self._write(prefix)

    def _write(self, data: bytes) -> None:
        assert self._fd is not None, "JsonlBackend used after close()"
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self._fsync:
                os.fsync(self._fd)
        except BaseException:
            os.ftruncate(self._fd, start)  # never leave half a line behind
            raise

    def _checked(self, key: str, fmt: str | None) -> str | None:
        try:
            return check_fmt(fmt)
        except ValueError as exc:
            if key not in self._rejected:
                self._rejected.add(key)
                warnings.warn(
                    f"metricsync: {self.path}: writing {key!r} with the adaptive format: {exc}",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return None

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """Append the step record, preceded by a header when a key is new or changed format."""
        repeated = self._resumed_at is not None and step == self._resumed_at
        now = time.time()
        wanted = {key: self._checked(key, formats.get(key)) for key in values}
        changed = {
            key: fmt
            for key, fmt in wanted.items()
            if key not in self._formats or self._formats[key] != fmt
        }
        complete = not self._wrote_header or self._since_complete >= max(
            COMPLETE_EVERY, 32 * self._complete_size
        )
        lines = []
        if complete:
            lines.append(
                json.dumps(header_record({**self._formats, **changed}, now, complete=True))
            )
        elif changed:
            lines.append(json.dumps(header_record(changed, now)))
        lines.append(json.dumps(step_record(step, values, now), allow_nan=False))
        data = ("\n".join(lines) + "\n").encode("utf-8")
        self._write(data)
        self._formats.update(changed)
        self._wrote_header = True
        self._resumed_at = None
        if complete:
            self._since_complete = 0
            self._complete_size = len(lines[0])
        else:
            self._since_complete += len(data)
        self.last_step = step
        if repeated:  # after writing, so that even -W error loses no step
            warnings.warn(
                f"metricsync: step {step} was already logged in {self.path} before this run "
                "resumed; readers keep the values logged now",
                UserWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        """Close the file; calling it again does nothing."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
