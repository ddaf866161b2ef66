"""Checkpoints: ``state_dict()`` mid-window, ``torch.save``, a fresh process, then keep recording.

A seeded script of operations (Python numbers on the fast path, numpy arrays
with weights, CPU tensors with masks, ``update``, merges of other workers'
metrics for ``across`` specs, NaNs under both policies, new names matching
globs) runs once without interruption in this process. For each split point,
this process runs the script up to the split, saves ``state_dict()`` with
``torch.save``, and a fresh Python process (``python tests/test_checkpoint.py
--resume``) loads it with ``torch.load`` (``weights_only=True``: the state is
a dict of an int and bytes) into an empty ``Metrics``, runs the rest of the
script and reports ``compute()``. Every statistic (quantiles, ``across``
modes, ``last``, ``nan_dropped``) must equal the uninterrupted run's, up to
float64 rounding of sums regrouped at the split. The fresh process also
checkpoints its final state, which this process loads back and checks.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import metricsync as ms

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

SPECS = {
    "loss": ms.Spec(("mean", "std", "var", "count")),
    "len": ms.Spec(("min", "max", "mean", "p0", "p50", "p90", "p100")),
    "lr": ms.Spec("last", fmt=".2e"),
    "tokens": ms.Spec("sum", fmt=",.0f"),
    "pg": ms.Spec(("sum", "max"), across="mean"),
    "kl": ms.Spec("mean", across="max"),
    "clip": ms.Spec(("max", "p50"), across="min"),
    "ent": ms.Spec(("mean", "last"), nan="ignore"),
    "gn": ms.Spec(("mean", "max")),
    "timing/*": ms.Spec("max", fmt=".3f"),
}
NAMES = [name for name in SPECS if name != "timing/*"] + ["timing/fwd", "timing/bwd", "plain"]
N_OPS = 160
SPLITS = (0, 37, 80, 159, 160)
ROOT = Path(__file__).resolve().parents[1]


def ops(seed: int) -> list[tuple[Any, ...]]:
    """The operation script (plain data, so both processes rebuild it from the seed)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[Any, ...]] = []
    for i in range(N_OPS):
        name = str(rng.choice(NAMES))
        n = int(rng.integers(0, 6))
        values = np.round(rng.normal(2.0, 3.0, n), 3)
        if name == "ent" and n and rng.random() < 0.3:
            values[int(rng.integers(n))] = math.nan
        if name == "gn" and rng.random() < 0.02:
            values = np.append(values, math.nan)
        kind = str(rng.choice(["float", "array", "tensor", "worker", "update"]))
        if name == "lr":
            out.append(("float", name, 1e-4 * (1 + i // 10)))
        elif kind == "float":
            out.append(("float", name, float(values[0]) if n else 1.0))
        elif kind == "array":
            weights = rng.integers(0, 4, len(values)).astype(float)  # whole: sketches stay exact
            out.append(("array", name, values.tolist(), weights.tolist()))
        elif kind == "tensor":
            out.append(("tensor", name, values.tolist(), (rng.random(len(values)) < 0.7).tolist()))
        elif kind == "worker":
            out.append(("worker", name, values.tolist()))
        else:
            out.append(("update", {name: float(values[0]) if n else 0.0, "tokens": float(i)}))
    return out


def apply(m: ms.Metrics, script: list[tuple[Any, ...]]) -> None:
    for op in script:
        kind = op[0]
        if kind == "float":
            m.record(op[1], op[2])
        elif kind == "array":
            m.record(op[1], np.array(op[2]), weight=np.array(op[3]))
        elif kind == "tensor":
            values = torch.tensor(op[2], dtype=torch.float64)
            m.record(op[1], values, mask=torch.tensor(op[3], dtype=torch.bool))
        elif kind == "worker":  # another worker's metrics, counted as one more rank
            other = ms.Metrics(SPECS)
            other.record(op[1], op[2])
            m.merge(other)
        else:
            m.update(op[1])


def encode(values: dict[str, float]) -> dict[str, Any]:
    return {k: v if math.isfinite(v) else repr(v) for k, v in values.items()}


def decode(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()}


def assert_same(got: dict[str, float], want: dict[str, float], label: str) -> None:
    assert got.keys() == want.keys(), (label, sorted(got.keys() ^ want.keys()))
    for key, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[key]), (label, key, got[key])
        else:
            assert math.isclose(got[key], value, rel_tol=1e-12, abs_tol=1e-12), (
                label,
                key,
                got[key],
                value,
            )


def resume(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In the fresh process: load each checkpoint, finish its script, report and re-checkpoint."""
    results = []
    for job in jobs:
        state = torch.load(job["checkpoint"])  # weights_only=True by default: no code runs
        m = ms.Metrics()  # no specs: they come from the checkpoint
        m.load_state_dict(state)
        assert m.to_bytes() == state["data"]
        apply(m, ops(job["seed"])[job["split"] :])
        values = m.compute()
        torch.save(m.state_dict(), job["final"])
        results.append({"values": encode(values), "format": m.format()})
    return results


def test_checkpoint_in_a_fresh_process_continues_exactly(tmp_path: Path) -> None:
    jobs, expected, formats = [], {}, {}
    for seed in (1, 2):
        script = ops(seed)
        whole = ms.Metrics(SPECS)
        apply(whole, script)
        expected[seed] = whole.compute()
        formats[seed] = whole.format()
        assert {"ent/nan_dropped", "pg/sum", "clip/p50", "len/p90", "lr"} <= expected[seed].keys()
        for split in SPLITS:
            m = ms.Metrics(SPECS)
            apply(m, script[:split])
            path = tmp_path / f"ckpt-{seed}-{split}.pt"
            torch.save(m.state_dict(), path)
            jobs.append(
                {
                    "seed": seed,
                    "split": split,
                    "checkpoint": str(path),
                    "final": str(tmp_path / f"final-{seed}-{split}.pt"),
                }
            )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, __file__, "--resume", json.dumps(jobs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert len(results) == len(jobs) == 10
    for job, result in zip(jobs, results):
        label = f"seed {job['seed']} split {job['split']}"
        assert_same(decode(result["values"]), expected[job["seed"]], label)
        assert result["format"] == formats[job["seed"]], label
        back = ms.Metrics()
        back.load_state_dict(torch.load(job["final"], weights_only=True))
        assert_same(back.compute(), expected[job["seed"]], label + " (final checkpoint)")


def test_state_dict_mid_window_does_not_disturb_the_window() -> None:
    script = ops(3)
    a, b = ms.Metrics(SPECS), ms.Metrics(SPECS)
    for i, op in enumerate(script):
        apply(a, [op])
        apply(b, [op])
        if i % 17 == 0:
            state = b.state_dict()
            b = ms.Metrics({"unrelated": ms.Spec("min")})
            b.record("unrelated", 1.0)
            b.load_state_dict(state)  # replaces specs and state entirely
    assert_same(b.compute(), a.compute(), "reloaded every 17 operations")
    assert b.spec("timing/new") == ms.Spec("max", fmt=".3f") and "unrelated" not in b


if __name__ == "__main__" and sys.argv[1:2] == ["--resume"]:
    print(json.dumps(resume(json.loads(sys.argv[2]))))
