"""The ``jsonl`` backend: ``run_dir/metrics.jsonl``, one strict JSON object per line.

The record layout is described in :mod:`metricsync._logfile`. Every step is
written with one unbuffered ``os.write`` of complete lines (header and step
record together), so a process killed at any moment leaves every earlier
step intact; ``fsync=True`` also survives a power loss. A failed write is cut
back so the file never holds a torn line in its middle.

Opening an existing log appends to it: its formats and last step are read
back first, and a torn last line (left by a killed process) is cut off with
a warning.

>>> import tempfile, pathlib
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> backend = JsonlBackend(run_dir)
>>> backend.log({"loss": 0.5, "gn": float("inf")}, 1, {"loss": ".3f"})
>>> backend.close()
>>> import json
>>> for line in (run_dir / "metrics.jsonl").read_text().splitlines():
...     print({**json.loads(line), "time": "T"})
{'metricsync': 1, 'formats': {'loss': '.3f', 'gn': None}, 'time': 'T'}
{'step': 1, 'time': 'T', 'values': {'loss': 0.5, 'gn': 'inf'}}
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

from .._logfile import LOG_NAME, header_record, scan_jsonl, step_record

__all__ = ["JsonlBackend"]


class JsonlBackend:
    """Append steps to ``run_dir/metrics.jsonl`` (created with its directory if needed).

    ``last_step`` is the step of the last record in the file (None when there
    is none yet); the tracker uses it to warn about steps going backwards.

    >>> import tempfile
    >>> from metricsync._logfile import read_jsonl
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
        self._formats: dict[str, str | None] = {}
        self._has_header = False
        self.last_step: int | None = None
        prefix = b""
        if self.path.exists():
            scan = scan_jsonl(self.path)  # a corrupt line in the middle raises ValueError
            self._formats = dict(scan.formats)
            self._has_header = scan.headers > 0
            self.last_step = scan.steps[-1][0] if scan.steps else None
            if scan.torn is not None:
                warnings.warn(
                    f"{self.path}: cutting off a torn last line before appending ({scan.torn})",
                    RuntimeWarning,
                    stacklevel=3,
                )
                os.truncate(self.path, scan.valid_end)
            if scan.needs_newline:
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

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """Append the step record, preceded by a header when a key is new or changed format."""
        now = time.time()
        changed = {
            key: formats.get(key)
            for key in values
            if key not in self._formats or self._formats[key] != formats.get(key)
        }
        lines = []
        if changed or not self._has_header:
            lines.append(json.dumps(header_record(changed, now), allow_nan=False))
        lines.append(json.dumps(step_record(step, values, now), allow_nan=False))
        self._write(("\n".join(lines) + "\n").encode("utf-8"))
        self._formats.update(changed)
        self._has_header = True
        self.last_step = step

    def close(self) -> None:
        """Close the file; calling it again does nothing."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
