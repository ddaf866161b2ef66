"""The public API's types, as a type checker sees them: mypy over a user's snippet.

Wrong arguments a type checker can know about (an unknown ``across`` or ``nan``
mode, a string or ``None`` recorded) are errors; the usual calls are not, and
``sync()`` is a ``Metrics`` (a ``SyncHandle`` with ``async_op=True``). Skipped
where mypy is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]

SNIPPET = """\
import numpy as np
import torch

import metricsync as ms

m = ms.Metrics({"a": ms.Spec(("mean", "p99"), across="mean", nan="ignore")})
m.record("a", 1.0)
m.record("a", 1)
m.record("a", True)
m.record("a", np.float32(1))
m.record("a", np.ones(3))
m.record("a", [1.0, 2.0])
m.record("a", torch.ones(3), mask=torch.ones(3, dtype=torch.bool))
m.record("a", torch.tensor(1.0), weight=torch.tensor(2.0))
m.record("a", 2.0, weight=3)
m.update({"a": 1.0, "b": np.ones(2)})
ms.Spec("p50", quantile_method="inverted_cdf", across="first", nan="error")
synced: ms.Metrics = m.sync()
print(synced.compute()["a"] + 1.0)
reveal_type(m.sync())
reveal_type(m.sync(async_op=True))
ms.Spec(across="avg")  # E: 20
ms.Spec(nan="drop")  # E: 21
ms.Spec(quantile_method="nearest")  # E: 22
m.record("loss", "str")  # E: 23
m.record("loss", None)  # E: 24
m.record("loss", 1j)  # E: 25
m.update({"loss": "str"})  # E: 26
"""


def test_mypy_reports_wrong_arguments_and_types_sync(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--hide-error-context",
            "--no-error-summary",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},  # this checkout's metricsync
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    errors = sorted({int(n) for n in re.findall(r"snippet\.py:(\d+): error", out)})
    lines = SNIPPET.splitlines()
    wanted = [i + 1 for i, line in enumerate(lines) if "# E:" in line]
    assert errors == wanted, out
    revealed = re.findall(r'Revealed type is "([^"]+)"', out)
    assert revealed == [
        "metricsync._facade._metrics.Metrics",
        "metricsync._sync._async.SyncHandle",
    ], out
