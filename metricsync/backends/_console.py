"""The ``console`` backend: one aligned human line per step on ``sys.stdout``.

>>> backend = ConsoleBackend()
>>> backend.log({"loss": 0.6931, "lr": 3e-4}, 1, {"loss": ".3f"})
step 1 | loss    0.693  lr 3.00e-04
>>> backend.log({"loss": 0.25, "lr": 1e-4}, 10, {"loss": ".3f"})
step 10 | loss    0.250  lr 1.00e-04
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from .._formatting import format_value

__all__ = ["ConsoleBackend"]

_MIN_WIDTH = 8  # fits "1.00e-05" and "-0.1234", so most columns line up from step one


class ConsoleBackend:
    """Print ``step N | key value  key value ...`` for every logged step.

    Values use their key's format (adaptive when None) and are right-aligned
    in columns that only ever widen, so successive lines line up. ``keys`` is
    an optional glob (or list of globs, ``fnmatch`` syntax) selecting what is
    printed; a step where nothing matches prints nothing. ``stream`` defaults
    to the *current* ``sys.stdout`` at each step.

    >>> ConsoleBackend(keys=["timing/*"]).log({"loss": 1.0, "timing/step": 0.25}, 3, {})
    step 3 | timing/step     0.25
    """

    def __init__(
        self, keys: str | Sequence[str] | None = None, stream: TextIO | None = None
    ) -> None:
        self._patterns = [keys] if isinstance(keys, str) else list(keys or ())
        self._stream = stream
        self._widths: dict[str, int] = {}

    def _selected(self, key: str) -> bool:
        return not self._patterns or any(fnmatch.fnmatchcase(key, p) for p in self._patterns)

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """Print one line for ``step``."""
        parts = []
        for key, value in values.items():
            if not self._selected(key):
                continue
            text = format_value(value, formats.get(key))
            width = self._widths[key] = max(self._widths.get(key, _MIN_WIDTH), len(text))
            parts.append(f"{key} {text:>{width}}")
        if not parts:
            return
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write(f"step {step} | " + "  ".join(parts) + "\n")
        stream.flush()

    def close(self) -> None:
        """Nothing to release; the stream belongs to the caller."""
