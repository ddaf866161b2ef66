"""What the command-line tests share: running ``python -m metricsync`` and following a log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """``metricsync ARGS`` in a fresh interpreter, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "metricsync", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )


def follow(target: Path) -> subprocess.Popen[str]:
    """``metricsync show TARGET -f`` polling every 0.05 s, its output piped; the caller ends
    it (with SIGINT, as Ctrl-C would)."""
    return subprocess.Popen(
        [sys.executable, "-m", "metricsync", "show", str(target), "-f", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=_interruptible,
    )


def _interruptible() -> None:
    """In the child, before it starts: SIGINT's default action. A test run started as a
    background job ignores SIGINT, and a child inherits that, so Python would not turn
    SIGINT into ``KeyboardInterrupt`` and the follow would never end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
