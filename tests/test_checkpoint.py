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
from _compare import assert_same

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
        assert_same(
            decode(result["values"]), expected[job["seed"]], label=label, rel=1e-12, abs=1e-12
        )
        assert result["format"] == formats[job["seed"]], label
        back = ms.Metrics()
        back.load_state_dict(torch.load(job["final"], weights_only=True))
        assert_same(
            back.compute(),
            expected[job["seed"]],
            label=label + " (final checkpoint)",
            rel=1e-12,
            abs=1e-12,
        )


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
    assert_same(
        b.compute(), a.compute(), label="reloaded every 17 operations", rel=1e-12, abs=1e-12
    )
    assert b.spec("timing/new") == ms.Spec("max", fmt=".3f") and "unrelated" not in b


if __name__ == "__main__" and sys.argv[1:2] == ["--resume"]:
    print(json.dumps(resume(json.loads(sys.argv[2]))))


def _pending_rich() -> ms.Metrics:
    """Samples in every kind of pending buffer: numbers, weighted pairs, listed arrays,
    the array chunk, rows reduced on arrival with sketch cells."""
    m = ms.Metrics(SPECS)
    m.record("loss", 1.5)
    m.record("kl", 0.25, weight=3.0)
    m.record("gn", np.arange(100.0))  # a listed array
    m.record("len", np.arange(300.0))  # reduced on arrival, with its sketch cells
    m.record("lr", 3e-4)  # a number buffer that keeps its time
    m.record("loss", np.array([1.0, 2.0]), weight=np.array([0.5, 2.0]))  # the chunk
    return m


@pytest.mark.parametrize(
    "state",
    [
        lambda blob: {"metricsync": torch.tensor([1, 1]), "data": blob},
        lambda blob: {"metricsync": np.array([1, 1]), "data": blob},
        lambda blob: {"metricsync": torch.tensor(1), "data": blob},
        lambda blob: {"metricsync": 1.0, "data": blob},
        lambda blob: {"metricsync": True, "data": blob},
        lambda blob: {
            "metricsync": 1,
            "data": torch.frombuffer(bytearray(blob), dtype=torch.uint8),
        },
        lambda blob: {"metricsync": 1, "data": np.frombuffer(blob, np.uint8)},
        lambda blob: {"metricsync": 1, "data": blob, "resume": torch.zeros(3)},
        lambda blob: {"metricsync": 1, "data": blob, "resume": b"MSYR"},
        lambda blob: {"metricsync": 1, "data": blob, "resume": blob},
        lambda blob: torch.zeros(2),
    ],
)
def test_load_state_dict_given_tensors_or_arrays_raises_codec_error(state: Any) -> None:
    """A tensor or array where an int or bytes belong is a CodecError that says what was
    expected (it was a RuntimeError or ValueError of their truth value), and nothing changes."""
    m = _pending_rich()
    before = m.compute()
    with pytest.raises(ms.CodecError, match=r"expected|must be|not a metricsync|truncated"):
        m.load_state_dict(state(m.to_bytes()))
    assert m.compute() == before


def test_every_truncation_and_byte_flip_of_a_resume_raises_codec_error() -> None:
    state = _pending_rich().state_dict()
    resume = state["resume"]
    for cut in range(0, len(resume), 7):
        with pytest.raises(ms.CodecError):
            ms.Metrics().load_state_dict({**state, "resume": resume[:cut]})
    for at in range(0, len(resume), 5):
        flipped = bytearray(resume)
        flipped[at] ^= 0x5A
        with pytest.raises(ms.CodecError):
            ms.Metrics().load_state_dict({**state, "resume": bytes(flipped)})


def test_a_resume_holding_what_no_record_holds_raises_codec_error() -> None:
    """Checksummed but hostile: a buffer its spec does not take, a negative weight, a
    sketch cell outside the sketch, a slot beyond the table, a short or long body."""
    import json
    import struct
    import zlib

    from metricsync._record import _resume
    from metricsync._record._pending import Held
    from metricsync._state import _codec

    m = _pending_rich()
    resume = m.state_dict()["resume"]
    head = struct.Struct("<4sHHQIQ")
    _, _, _, table_len, head_len, _ = head.unpack_from(resume)
    table = resume[head.size : head.size + table_len]
    header = json.loads(resume[head.size + table_len : head.size + table_len + head_len])
    body = np.frombuffer(resume[head.size + table_len + head_len : -4], dtype="<f8")
    rules, decoded, held = _resume.decode(resume)
    assert held.numbers and held.pairs and held.arrays and held.chunk and held.rows
    assert held.cells

    def framed(header: Any, body: np.ndarray) -> bytes:
        text, raw = json.dumps(header).encode(), body.astype("<f8").tobytes()
        out = head.pack(b"MSYR", 1, 0, len(table), len(text), len(raw)) + table + text + raw
        return out + struct.pack("<I", zlib.crc32(out))

    assert _resume.decode(framed(header, body))[2].cells  # framed as the encoder does
    lr = decoded.names.index("lr")
    cases = [
        framed({**header, "pairs": [[lr, 0]]}, body),  # a 'last' metric has no pair
        framed({**header, "numbers": header["numbers"] + [[len(decoded.names), 0, 0]]}, body),
        framed({**header, "rows": header["rows"] + header["rows"]}, body),  # body too short
        framed(header, np.r_[body, 0.0]),  # too long
        framed({**header, "chunk": [[0, -1, 0]]}, body),
        framed({**header, "cells": "x"}, body),
        framed([1, 2], body),
    ]
    one = np.ones(1)
    for bad in [
        Held(pairs=[("kl", one, -one)]),  # a negative weight
        Held(pairs=[("kl", one, one * np.inf)]),
        Held(numbers=[("lr", one, None)]),  # a 'last' buffer without its time
        Held(numbers=[("loss", one, 5.0)]),  # a time where none is kept
        Held(numbers=[("loss", one, None), ("loss", one, None)]),  # the same buffer twice
        Held(chunk=[(0, one, None, np.nan)]),
        Held(rows=[(0, np.r_[-1.0, np.zeros(9)], 1.0)]),  # a negative weight sum
        Held(cells=[(decoded.names.index("len"), np.array([10**6]), one)]),  # outside
        Held(cells=[(decoded.names.index("loss"), np.array([1]), one)]),  # no sketch
        Held(chunk=[(0, np.zeros(1 << 17), None, 1.0)]),  # more than a chunk holds
    ]:
        cases.append(_resume.encode(rules, decoded, bad))
    for case in cases:
        with pytest.raises(ms.CodecError):
            ms.Metrics().load_state_dict(
                {"metricsync": 1, "data": _codec.encode(rules, decoded), "resume": case}
            )
