"""The README's quickstart (``examples/quickstart.py``) runs as written, under torchrun on 2 gloo ranks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metricsync.testing import free_port

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "quickstart.py"


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_the_quickstart_runs_under_torchrun_on_two_ranks(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    command += ["--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    command += ["--master-port", str(free_port()), str(SCRIPT), "--steps", "3"]
    command += ["--out", str(tmp_path / "run")]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines if '"step"' in line]
    assert [s["step"] for s in steps] == [0, 1, 2]  # rank 0 alone writes, once a step
    assert [s["values"]["actor/lr"] for s in steps] == [0.1, 0.05, 0.025]
    for entry in steps:
        values = entry["values"]
        assert set(values) == {
            "actor/lr",
            "actor/pg_loss",
            "actor/entropy",
            "response_length/mean",
            "response_length/max",
            "response_length/p50",
            "response_length/p99",
            "timing/step",
        }
        assert 1 <= values["response_length/p50"] <= values["response_length/max"] <= 16
        assert 0 < values["actor/entropy"] <= math.log(32) + 1e-9
    assert done.stdout.count("step 2 |") == 1  # one console line per step, from rank 0


def test_the_readme_quickstart_is_the_script_s_own_code() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = "".join(SCRIPT.read_text().split())
    shown = [line.split("#")[0].strip() for line in code.splitlines()]
    # every line the README shows (its placeholders aside) stands in the script
    missing = [
        line
        for line in shown
        if line and line != "..." and "".join(line.split()).rstrip(",") not in script
    ]
    assert not missing
