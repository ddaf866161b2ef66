"""Fuzz ``Metrics.from_bytes`` with mutated, truncated and random inputs; count the outcomes.

Run: ``.venv/bin/python bench/fuzz_codec.py [--n 100000] [--seed 0] [--workers 2]``

Every input is decoded; a decoded object is then exercised (``compute()``,
``format()``, ``to_bytes()`` and a second decode that must compute the same,
and a merge with a copy of itself). Outcomes: ``ok`` (decoded and exercised),
``CodecError``, or ``other`` (any other exception, in decoding or in using
what was decoded). The script exits 1 when ``other`` is not 0.

Input families, in equal shares (seeded, so a run is reproducible):

- ``random``: random bytes, half of them behind a valid magic and version;
- ``truncated``: a valid blob cut at a random length;
- ``mutated``: 1-8 byte edits (flips, overwrites, inserts, deletes, copies) of a
  valid blob, the CRC-32 trailer left as it is (almost all fail the checksum);
- ``mutated+crc``: the same edits inside the JSON header or the body, then the
  lengths and the CRC-32 recomputed, so the parser behind the checksum runs;
- ``structured+crc``: the header parsed and 1-3 of its JSON nodes replaced
  with hostile values (huge, negative, fractional or wrong-typed numbers,
  deep nesting, long strings, odd specs and formats, duplicated or dropped
  entries), and/or body floats replaced with NaN, infinities, negatives and
  extremes, or the body resized; lengths and CRC-32 recomputed.

It prints the count by family and outcome, the slowest single input, and the
peak memory of the worker processes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import re
import resource
import struct
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import metricsync as ms
from metricsync._state._codec import FORMAT_VERSION, HEAD, frame, unframe
from metricsync.testing import format_example

FAMILIES = ("random", "truncated", "mutated", "mutated+crc", "structured+crc")
HOSTILE_FLOATS = [
    math.nan,
    math.inf,
    -math.inf,
    -1.0,
    -0.0,
    0.0,
    0.5,
    1e308,
    -1e308,
    5e-324,
    2.0**53 + 1,
    1e19,
]


def seed_blobs() -> list[bytes]:
    """Valid blobs covering every part of the format (rules, quantiles, across, NaN drops)."""
    rich = format_example()

    small = ms.Metrics({"x": ms.Spec(("mean", "max", "count"))})
    small.record("x", [1.0, 2.0], weight=[1.0, 3.0])

    across = ms.Metrics(
        {"a": ms.Spec(("sum", "max"), across="max"), "b": ms.Spec("min", across="sum")}
    )
    across.record("a", [1.0, -2.0])
    across.record("b", 5.0)

    quantile = ms.Metrics({"q": ms.Spec(("p0", "p90", "p100"), accuracy=0.05)})
    quantile.record("q", np.linspace(-3.0, 7.0, 50))

    globs = ms.Metrics({f"g{i}/*": ms.Spec("max") for i in range(5)})
    globs.define("exact", ms.Spec("var"))
    globs.record("g1/a", 2.0)
    return [b.to_bytes() for b in (rich, small, across, quantile, globs, ms.Metrics())]


def byte_edits(rng: np.random.Generator, data: bytes, count: int) -> bytes:
    out = bytearray(data)
    for _ in range(count):
        op = int(rng.integers(5))
        pos = int(rng.integers(len(out) + 1))
        if op == 0 and pos < len(out):
            out[pos] ^= 1 << int(rng.integers(8))
        elif op == 1 and pos < len(out):
            out[pos] = int(rng.integers(256))
        elif op == 2:
            out[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
        elif op == 3:
            del out[pos : pos + int(rng.integers(1, 9))]
        else:
            start = int(rng.integers(len(out) + 1))
            out[pos:pos] = out[start : start + int(rng.integers(1, 17))]
    return bytes(out)


def hostile_value(rng: np.random.Generator, texts: list[str]) -> Any:
    choice = int(rng.integers(16))
    if choice == 0:
        return int(rng.choice([2**64, 2**40, -1, -(2**63), 10**30, 0]))
    if choice == 1:
        return float(rng.choice(HOSTILE_FLOATS))
    if choice == 2:
        return bool(rng.integers(2))
    if choice == 3:
        return None
    if choice == 4:
        return "x" * int(rng.integers(0, 2000))
    if choice == 5:
        return f"@@DEEP{int(rng.integers(1, 3000))}@@"  # spliced in as raw nested JSON
    if choice == 6:
        return {}
    if choice == 7:
        return []
    if choice == 8:  # another valid spec text
        return str(rng.choice(texts))
    if choice == 9:  # a spec text with an odd field
        spec = json.loads(str(rng.choice(texts)))
        field = int(rng.integers(5))
        spec[field] = hostile_value(rng, texts) if rng.random() < 0.5 else spec[field]
        if rng.random() < 0.5:
            spec[2] = str(
                rng.choice(["9" * int(rng.integers(1, 12)), ".999999f", ",.0f", "{}", ""])
            )
        return json.dumps(spec)
    if choice == 10:
        return ["x", str(rng.choice(texts))]
    if choice == 11:
        return [int(rng.integers(-2, 20)), int(rng.choice([4, 8067, 2019, 10**12, -5]))]
    if choice == 12:
        return "p" + str(float(rng.random() * 200))
    if choice == 13:
        return "\ud800" if rng.random() < 0.5 else "é/时间"
    if choice == 14:
        return float(rng.normal() * 10.0 ** int(rng.integers(-300, 300)))
    return int(rng.integers(-5, 10))


def nodes(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += nodes(value, (*path, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out += nodes(value, (*path, i))
    return out


def structured(rng: np.random.Generator, blob: bytes, texts: list[str]) -> bytes:
    head, body = unframe(blob)
    tree = json.loads(head)
    if rng.random() < 0.7:
        for _ in range(int(rng.integers(1, 4))):
            paths = [p for p in nodes(tree) if p]
            if not paths:
                break
            path = paths[int(rng.integers(len(paths)))]
            parent = tree
            for key in path[:-1]:
                parent = parent[key]
            action = rng.random()
            if isinstance(parent, list) and action < 0.2:
                del parent[path[-1]]
            elif isinstance(parent, list) and action < 0.4:
                parent.insert(path[-1], parent[path[-1]])
            else:
                parent[path[-1]] = hostile_value(rng, texts)
    raw = bytearray(body)
    if rng.random() < 0.6 and len(raw) >= 8:
        for _ in range(int(rng.integers(1, 6))):
            pos = 8 * int(rng.integers(len(raw) // 8))
            raw[pos : pos + 8] = struct.pack("<d", float(rng.choice(HOSTILE_FLOATS)))
    if rng.random() < 0.15:
        cut = 8 * int(rng.integers(-3, 4))
        raw = raw[:cut] if cut < 0 else raw + bytes(cut)
    text = re.sub(r'"@@DEEP(\d+)@@"', lambda m: "[" * int(m[1]) + "]" * int(m[1]), json.dumps(tree))
    return frame(text.encode(), bytes(raw))


def make_input(
    rng: np.random.Generator, family: str, seeds: list[bytes], texts: list[str]
) -> bytes:
    blob = seeds[int(rng.integers(len(seeds)))]
    if family == "random":
        data = rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes()
        if rng.random() < 0.5:
            data = HEAD.pack(b"MSYN", FORMAT_VERSION, 0, 0, 0)[:8] + data
        return data
    if family == "truncated":
        return blob[: int(rng.integers(len(blob)))]
    if family == "mutated":
        return byte_edits(rng, blob, int(rng.integers(1, 9)))
    if family == "mutated+crc":
        head, body = unframe(blob)
        if rng.random() < 0.6 or not body:
            head = byte_edits(rng, head, int(rng.integers(1, 5)))
        else:
            body = byte_edits(rng, body, int(rng.integers(1, 5)))
        return frame(head, body)
    return structured(rng, blob, texts)


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a
    )


def exercise(data: bytes) -> str:
    try:
        m = ms.Metrics.from_bytes(data)
    except ms.CodecError:
        return "CodecError"
    values = m.compute()
    if not all(type(v) is float for v in values.values()):
        raise AssertionError("compute() returned a non-float")
    m.format()
    again = ms.Metrics.from_bytes(m.to_bytes())
    if not same(again.compute(), values):
        raise AssertionError("a re-encoded blob computes differently")
    try:
        m.merge(again.copy())
    except ms.SpecMismatchError:
        # A rule that disagrees with a held metric's spec decodes (checking every glob
        # against every name would not be linear in the input); merge names it.
        return "ok, merge refused"
    m.compute()
    return "ok"


def run_chunk(job: tuple[int, int, int]) -> tuple[Counter[tuple[str, str]], list[str], float]:
    import warnings

    warnings.simplefilter("ignore")  # NaN/inf arithmetic on decoded odd-but-valid states
    seed, chunk, count = job
    rng = np.random.default_rng([seed, chunk])
    seeds = seed_blobs()
    texts = sorted({t for b in seeds for _, t in json.loads(unframe(b)[0])["slots"]})
    counts: Counter[tuple[str, str]] = Counter()
    failures: list[str] = []
    slowest = 0.0
    for i in range(count):
        family = FAMILIES[i % len(FAMILIES)]
        data = make_input(rng, family, seeds, texts)
        start = time.perf_counter()
        try:
            outcome = exercise(data)
        except Exception as exc:
            outcome = "other"
            if len(failures) < 20:
                failures.append(
                    f"{family}: {type(exc).__name__}: {exc!s:.200} input={data[:200]!r}"
                )
        slowest = max(slowest, time.perf_counter() - start)
        refused = outcome == "ok, merge refused"
        counts[family, "ok" if refused else outcome] += 1
        counts["refused", "ok"] += refused
    return counts, failures, slowest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="inputs in all (default 100000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    chunks = max(args.workers * 8, 1)
    sizes = [args.n // chunks + (1 if i < args.n % chunks else 0) for i in range(chunks)]
    jobs = [(args.seed, i, size) for i, size in enumerate(sizes)]
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(run_chunk, jobs)
    elapsed = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    counts: Counter[tuple[str, str]] = Counter()
    failures: list[str] = []
    slowest = 0.0
    for c, f, s in results:
        counts.update(c)
        failures += f
        slowest = max(slowest, s)
    outcomes = ("ok", "CodecError", "other")
    print(f"fuzzed Metrics.from_bytes with {args.n} inputs (seed {args.seed}) in {elapsed:.1f} s")
    print(f"{'family':<16}" + "".join(f"{o:>12}" for o in outcomes) + f"{'total':>10}")
    for family in FAMILIES:
        row = [counts[family, o] for o in outcomes]
        print(f"{family:<16}" + "".join(f"{v:>12}" for v in row) + f"{sum(row):>10}")
    totals = [sum(counts[f, o] for f in FAMILIES) for o in outcomes]
    print(f"{'all':<16}" + "".join(f"{v:>12}" for v in totals) + f"{sum(totals):>10}")
    print(
        f"(of the ok: {counts['refused', 'ok']} hold a rule that disagrees with a held "
        "metric's spec; merging them raises SpecMismatchError, as documented)"
    )
    print(f"slowest single input: {slowest * 1000:.1f} ms; peak worker memory: {peak_mib:.0f} MiB")
    for line in failures:
        print("FAILURE", line)
    return 1 if totals[2] else 0


if __name__ == "__main__":
    sys.exit(main())
