"""The ``console`` backend: aligned human lines per step on ``sys.stdout`` (or a logger).

Keys are grouped by prefix (``actor/``, ``critic/``, ``timing/``...). A step
prints on one line when it fits the width, else one line per group (a group
too long for one line wraps), continuation lines starting with ``|`` under
the first:

>>> backend = ConsoleBackend()
>>> backend.log({"loss": 0.6931, "lr": 3e-4}, 1, {"loss": ".3f"})
step 1 | loss    0.693  lr 3.00e-04
>>> narrow = ConsoleBackend(width=50)
>>> narrow.log({"actor/lr": 3e-4, "critic/score": 0.5, "actor/kl": 0.01}, 2, {})
step 2 | actor/lr 3.00e-04  actor/kl     0.01
       | critic/score      0.5

With ``logger="metricsync"`` (or any name or ``logging.Logger``) each line
goes to that logger at INFO instead of a stream, for users who filter or
prefix their logs. metricsync installs no logging handler unless asked
with :func:`add_log_handler`.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from .._state._formatting import format_value

__all__ = ["DEFAULT_WIDTH", "ConsoleBackend", "add_log_handler"]

_MIN_WIDTH = 8  # fits "1.00e-05" and "-0.1234", so most columns line up from step one
DEFAULT_WIDTH = 120
"""Line width when the output is not a terminal and ``$COLUMNS`` is unset."""


def _group(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def add_log_handler(
    logger: str | logging.Logger = "metricsync", stream: TextIO | None = None
) -> logging.Handler:
    """Attach a plain ``%(message)s`` stream handler to ``logger`` (and return it), on request.

    For scripts that route the console backend through ``logging`` without
    configuring logging themselves; remove it with ``logger.removeHandler``.

    >>> import io
    >>> buffer = io.StringIO()
    >>> handler = add_log_handler("metricsync.doc", buffer)
    >>> logging.getLogger("metricsync.doc").setLevel(logging.INFO)
    >>> ConsoleBackend(logger="metricsync.doc").log({"loss": 0.5}, 3, {})
    >>> buffer.getvalue()
    'step 3 | loss      0.5\\n'
    >>> logging.getLogger("metricsync.doc").removeHandler(handler)
    """
    target = logging.getLogger(logger) if isinstance(logger, str) else logger
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    target.addHandler(handler)
    return handler


class ConsoleBackend:
    """Print ``step N | key value  key value ...`` for every logged step.

    Values use their key's format (adaptive when None) and are right-aligned
    in columns that only ever widen, so successive lines line up. Keys are
    ordered by prefix group. ``keys`` is an optional glob (or list of globs,
    ``fnmatch`` syntax) selecting what is printed; a step where nothing
    matches prints nothing. ``stream`` defaults to the *current*
    ``sys.stdout`` at each step. ``width`` defaults to the terminal's width,
    else ``$COLUMNS``, else :data:`DEFAULT_WIDTH`. ``logger`` (a name or a
    ``logging.Logger``) sends each line to ``logger.info`` instead of a stream.

    >>> ConsoleBackend(keys=["timing/*"]).log({"loss": 1.0, "timing/step": 0.25}, 3, {})
    step 3 | timing/step     0.25
    """

    def __init__(
        self,
        keys: str | Sequence[str] | None = None,
        stream: TextIO | None = None,
        *,
        width: int | None = None,
        logger: str | logging.Logger | None = None,
    ) -> None:
        self._patterns = [keys] if isinstance(keys, str) else list(keys or ())
        self._stream = stream
        self._width = width
        self._logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self._widths: dict[str, int] = {}

    def _selected(self, key: str) -> bool:
        return not self._patterns or any(fnmatch.fnmatchcase(key, p) for p in self._patterns)

    def _line_width(self, stream: TextIO) -> int:
        if self._width is not None:
            return self._width
        isatty = getattr(stream, "isatty", None)
        if self._logger is None and callable(isatty) and isatty():
            return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
        columns = os.environ.get("COLUMNS", "").strip()
        return int(columns) if columns.isdigit() and int(columns) > 0 else DEFAULT_WIDTH

    def lines(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None], width: int
    ) -> list[str]:
        """The lines for ``step`` at ``width`` columns (empty when no key is selected)."""
        groups: dict[str, list[str]] = {}
        for key, value in values.items():
            if not self._selected(key):
                continue
            text = format_value(value, formats.get(key))
            column = self._widths[key] = max(self._widths.get(key, _MIN_WIDTH), len(text))
            groups.setdefault(_group(key), []).append(f"{key} {text:>{column}}")
        if not groups:
            return []
        head = f"step {step} | "
        single = head + "  ".join(part for parts in groups.values() for part in parts)
        if len(single) <= width:
            return [single]
        lines: list[str] = []
        indent = " " * (len(head) - 2) + "| "
        for parts in groups.values():
            line = head if not lines else indent  # both are len(head) long
            for part in parts:
                if len(line) > len(head) and len(line) + 2 + len(part) > width:
                    lines.append(line)
                    line = indent
                line += ("  " if len(line) > len(head) else "") + part
            lines.append(line)
        return lines

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """Print the line(s) of ``step``."""
        stream = self._stream if self._stream is not None else sys.stdout
        lines = self.lines(values, step, formats, self._line_width(stream))
        if not lines:
            return
        if self._logger is not None:
            for line in lines:
                self._logger.info(line)
            return
        stream.write("\n".join(lines) + "\n")
        stream.flush()

    def close(self) -> None:
        """Nothing to release; the stream belongs to the caller."""
