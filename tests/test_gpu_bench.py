"""The GPU benchmark scripts run without a GPU: bench/gpu_step.py on the CPU with tiny
sizes (a smoke test of its loop and its agreement check), bench/gpu_check.py's op counts
on the meta device."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_step_runs_on_the_cpu_with_tiny_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_step = _load("gpu_step")
    argv = ["--steps", "1", "--warmup", "0", "--micro-batches", "2", "--layers", "1"]
    results = gpu_step.main([*argv, "--d-model", "16", "--heads", "2", "--seq", "16"])
    assert set(results) == {"GPU work queued", "tensors ready"}
    assert all(ratio > 0 for _, _, ratio in results.values())
    assert "gpu_step on" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the meta-only branch runs without CUDA")
def test_gpu_check_prints_the_meta_op_counts(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = _load("gpu_check")
    assert gpu_check.main() == 0
    out = capsys.readouterr().out
    assert "0-d tensor" in out and "aten ops per record" in out
    counts = gpu_check.op_counts(torch.device("meta"))
    assert counts["0-d tensor"] <= 0.1 and counts["masked (4, 256), (mean, max, min)"] <= 1
