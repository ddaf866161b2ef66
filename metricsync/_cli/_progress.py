"""A progress bar on stderr, only when stderr is a terminal: tqdm when installed, else a
plain ``[#####.....] 50%`` line.

>>> import io
>>> with Progress(100, "reading", stream=io.StringIO()) as bar:
...     bar.update(50)
>>> bar.enabled
False
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    """Count ``total`` units of work (bytes when ``unit="B"``) under ``desc``.

    ``enabled`` is True only when ``stream`` (default stderr) is a terminal
    and ``total`` is at least ``minimum``. ``clear()`` erases the bar before
    other output goes to the same terminal; the next ``update`` redraws it.

    >>> import io
    >>> class Tty(io.StringIO):
    ...     def isatty(self): return True
    >>> stream = Tty()
    >>> with Progress(4, "steps", unit="step", stream=stream, use_tqdm=False) as bar:
    ...     bar.update(2)
    >>> "[" + "#" * 15 in stream.getvalue() and "2/4 steps" in stream.getvalue()
    True
    """

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        unit: str = "B",
        stream: TextIO | None = None,
        minimum: int = 0,
        use_tqdm: bool = True,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(callable(isatty) and isatty()) and total >= minimum
        self.total, self.desc, self.unit = max(0, total), desc, unit
        self.done = 0
        self._bar: Any = None
        self._drawn = 0.0
        self._cleared = False
        if self.enabled and use_tqdm:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                scale = unit == "B"
                self._bar = tqdm(
                    total=self.total,
                    desc=desc,
                    unit=unit,
                    unit_scale=scale,
                    unit_divisor=1024 if scale else 1000,
                    file=self.stream,
                    leave=False,
                    dynamic_ncols=True,
                )

    def update(self, amount: int) -> None:
        """Add ``amount`` units of done work and redraw (at most ten times a second)."""
        if not self.enabled:
            return
        self.done += amount
        if self._bar is not None:
            self._bar.update(amount)
            if self._cleared:
                self._bar.refresh()
                self._cleared = False
            return
        now = time.monotonic()
        if now - self._drawn < 0.1 and self.done < self.total:
            return
        self._drawn = now
        width = 30
        filled = int(width * min(self.done, self.total) / self.total) if self.total else width
        count = (
            f"{self.done / 2**20:.0f}/{self.total / 2**20:.0f} MiB"
            if self.unit == "B"
            else f"{self.done}/{self.total} {self.unit}s"
        )
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r\033[K{self.desc} [{bar}] {count}")
        self.stream.flush()

    def clear(self) -> None:
        """Erase the bar from the terminal (other output is about to follow)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.clear()
            self._cleared = True
        else:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = 0.0

    def close(self) -> None:
        """Remove the bar for good."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self.clear()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
