"""Fuzzing ``Metrics.from_bytes``: anything but a valid blob is a ``CodecError``, and nothing else.

``tests/test_codec.py`` covers hand-picked truncations, corruptions and
hostile headers. Here hypothesis draws them: random bytes, truncations and
byte edits of blobs of random ``Metrics`` (with the CRC-32 trailer left as it
is, and recomputed so the parser behind the checksum runs), hostile JSON
values planted anywhere in a header, and hostile floats planted anywhere in a
body, whose outcome an oracle predicts from where they land. It also pins
the resource bounds: a hostile blob allocates at most a few times its own
size and decodes in time linear in it. ``bench/fuzz_codec.py`` runs 100,000
such inputs.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import tracemalloc
import zlib
from typing import Any

import numpy as np
import pytest
from _compare import same
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import metricsync as ms
from metricsync._state import _algebra as state
from metricsync._state import _codec as codec
from metricsync._state._sketch import sketch_layout

HEAD = codec.HEAD
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SPECS = [
    ms.Spec("mean"),
    ms.Spec(("mean", "max", "count")),
    ms.Spec("last", fmt=".2e"),
    ms.Spec(("p50", "p99", "min"), accuracy=0.05),
    ms.Spec("sum", across="mean"),
    ms.Spec(("max", "var"), across="max"),
    ms.Spec(("mean", "std"), nan="ignore"),
]


@st.composite
def metrics(draw: st.DrawFn) -> ms.Metrics:
    """A Metrics with random rules, names, specs and samples (some merged in as other ranks)."""
    rules = draw(
        st.dictionaries(st.sampled_from(["a", "b", "t/*", "q*", "c"]), st.sampled_from(SPECS))
    )
    m = ms.Metrics(rules)
    for name in draw(st.lists(st.sampled_from(["a", "b", "t/x", "q1", "c", "d"]), max_size=5)):
        values = draw(st.lists(st.floats(-1e6, 1e6) | st.just(math.nan), max_size=6))
        m.record(name, np.array(values, dtype=np.float64))
    if draw(st.booleans()):
        other = ms.Metrics(rules)
        other.record("b", draw(st.floats(-10, 10)))
        m.merge(other)
    return m


def split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    head, body = codec.unframe(blob)
    return json.loads(head), body


def join(header: Any, body: bytes, head: bytes | None = None) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode() if head is None else head
    return codec.frame(head, body)


def decode_or_codec_error(data: bytes) -> ms.Metrics | None:
    """Decode; a decoded object must compute, format and re-encode to the same values."""
    try:
        m = ms.Metrics.from_bytes(data)
    except ms.CodecError:
        return None
    values = m.compute()
    assert all(type(v) is float for v in values.values())
    m.format()
    assert same(ms.Metrics.from_bytes(m.to_bytes()).compute(), values)
    return m


EDITS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "insert", "delete"]),
        st.integers(0, 10**6),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=6,
)


def apply_edits(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for op, pos, byte in edits:
        pos %= len(out) + 1
        if op == "flip" and pos < len(out):
            out[pos] ^= 1 << (byte % 8)
        elif op == "set" and pos < len(out):
            out[pos] = byte
        elif op == "insert":
            out[pos:pos] = bytes([byte])
        else:
            del out[pos : pos + 1 + byte % 8]
    return bytes(out)


# ---------------------------------------------------------------- bytes


@SETTINGS
@given(st.binary(max_size=400), st.booleans())
def test_random_bytes(data: bytes, with_magic: bool) -> None:
    if with_magic:
        data = HEAD.pack(b"MSYN", 1, 0, len(data) // 2, len(data) - len(data) // 2) + data
    with pytest.raises(ms.CodecError):
        ms.Metrics.from_bytes(data)


@SETTINGS
@given(metrics(), st.data())
def test_every_truncation_is_a_codec_error(m: ms.Metrics, data: st.DataObject) -> None:
    blob = m.to_bytes()
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(ms.CodecError):
        ms.Metrics.from_bytes(blob[:cut])


@SETTINGS
@given(metrics(), EDITS)
def test_byte_edits_fail_the_checksum(m: ms.Metrics, edits: list[tuple[str, int, int]]) -> None:
    blob = m.to_bytes()
    bad = apply_edits(blob, edits)
    assume(bad != blob)
    with pytest.raises(ms.CodecError):  # CRC-32 catches every edit of up to 32 bits in a row
        ms.Metrics.from_bytes(bad)


@SETTINGS
@given(metrics(), EDITS, st.booleans())
def test_byte_edits_behind_a_recomputed_checksum(
    m: ms.Metrics, edits: list[tuple[str, int, int]], in_header: bool
) -> None:
    blob = m.to_bytes()
    head, body = codec.unframe(blob)
    if in_header:
        head = apply_edits(head, edits)
    else:
        body = apply_edits(body, edits)
    decode_or_codec_error(join(None, body, head))


# --------------------------------------------------------------- header

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from([s.to_json() for s in SPECS]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


def _paths(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += _paths(value, (*path, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out += _paths(value, (*path, i))
    return out


@SETTINGS
@given(metrics(), st.data())
def test_hostile_json_anywhere_in_the_header(m: ms.Metrics, data: st.DataObject) -> None:
    header, body = split(m.to_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(header) if p]
        path = data.draw(st.sampled_from(paths))
        parent = header
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "duplicate"]))
        if action == "delete" and isinstance(parent, list):
            del parent[path[-1]]
        elif action == "duplicate" and isinstance(parent, list):
            parent.insert(path[-1], parent[path[-1]])
        else:
            parent[path[-1]] = data.draw(JSON)
    decode_or_codec_error(join(header, body))


def _hostile_spec(field: int, value: Any) -> str:
    spec = json.loads(ms.Spec(("mean", "p50")).to_json())
    spec[field] = value
    return json.dumps(spec)


@pytest.mark.parametrize(
    "label, change",
    [
        (
            "duplicate rule, other spec",
            {"rules": [["x", SPECS[0].to_json()], ["x", SPECS[1].to_json()]]},
        ),
        (
            "duplicate glob rule",
            {"rules": [["t/*", SPECS[0].to_json()], ["t/*", SPECS[0].to_json()]]},
        ),
        ("empty rule key", {"rules": [["", SPECS[0].to_json()]]}),
        ("accuracy beyond float", {"rules": [["x", _hostile_spec(4, 10**400)]]}),
        ("accuracy NaN", {"rules": [["x", _hostile_spec(4, math.nan)]]}),
        ("accuracy too fine", {"rules": [["x", _hostile_spec(4, 1e-9)]]}),
        ("format width 10**9", {"rules": [["x", _hostile_spec(2, "1000000000")]]}),
        ("format precision 10**8", {"rules": [["x", _hostile_spec(2, ".100000000f")]]}),
        ("format of 5000 digits", {"rules": [["x", _hostile_spec(2, "9" * 5000)]]}),
        ("format with braces", {"rules": [["x", _hostile_spec(2, "{:.3f}")]]}),
        ("statistics a dict", {"rules": [["x", _hostile_spec(0, {"mean": 1})]]}),
        ("statistic nested", {"rules": [["x", _hostile_spec(0, [["mean"]])]]}),
        ("statistic repeated", {"rules": [["x", _hostile_spec(0, ["mean", "mean"])]]}),
        ("across a list", {"rules": [["x", _hostile_spec(1, ["exact"])]]}),
        ("spec nested 100000 deep", {"rules": [["x", "[" * 100_000 + "]" * 100_000]]}),
        ("slots a string", {"slots": "abc"}),
        ("sketch slot a float", {"sketch": [[0.0, 8067]]}),
        ("agg rows 2**64", {"agg": [[0, 2**64]]}),
    ],
)
def test_hostile_headers_with_valid_checksums(label: str, change: dict[str, Any]) -> None:
    header = {"rules": [], "slots": [], "sketch": [], "agg": [], **change}
    blob = join(header, b"")
    peak, calls = _decode_costs(blob)
    # a few hundred calls whatever the sizes the header declares: no work per declared item
    assert calls < 500, (label, calls)
    assert peak < 3 * len(blob) + 2**20, (label, peak)


# ----------------------------------------------------------------- body

QUANTILE = ms.Spec(("mean", "p50"), accuracy=0.05)
ACROSS = ms.Spec(("sum", "max"), across="mean")


def _odd_state_blob() -> bytes:
    m = ms.Metrics({"q": QUANTILE, "a": ACROSS, "n": ms.Spec(("mean", "last"), nan="ignore")})
    m.record("q", [1.0, 2.0, 4.0])
    m.record("a", [3.0, 5.0])
    other = ms.Metrics({"a": ACROSS})
    other.record("a", 7.0)
    m.merge(other)
    m.record("n", [1.0, math.nan])
    return m.to_bytes()


def _expected_to_decode(header: dict[str, Any], body: bytes, offset: int, value: float) -> bool:
    """The documented policy: weight sums and sample counts >= 0 (a version-2 blob's
    counts are its weights), dropped and agg rank counts whole numbers from 0 to 2**53, stamps not NaN, a sketch's window whole numbers within its
    cells (its count the cells sent)."""
    n = len(header["slots"])
    if offset < n * state.NCOL:
        column = offset % state.NCOL
        if column in (state.W, state.N, state.W2):  # weight sums, sample counts
            return value >= 0
        if column == state.DROP:  # dropped samples
            return 0 <= value <= 2**53 and value == math.floor(value)
        if column == state.T:
            return not math.isnan(value)
        return True
    offset -= n * state.NCOL
    sizes = [cells for _, cells in header["sketch"]]
    windows = np.frombuffer(body, "<f8")[n * state.NCOL :][: 2 * len(sizes)].reshape(-1, 2)
    if offset < windows.size:
        count = windows[offset // 2][1]
        if offset % 2:  # the count: the body holds that many cells
            return value == count
        whole = math.isfinite(value) and value == math.floor(value)
        return whole and value >= 0 and value + count <= sizes[offset // 2]
    offset -= windows.size
    for _, count in windows.tolist():
        if offset < count:
            return value >= 0
        offset -= int(count)
    column = offset % 4  # across aggregates: sum of rank values, ranks, max, -min
    return column != 1 or (0 <= value <= 2**53 and value == math.floor(value))


@SETTINGS
@given(
    st.data(),
    st.floats() | st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -0.0, 1e308, 5e-324, 0.5]),
)
def test_hostile_body_values_follow_the_documented_policy(
    data: st.DataObject, value: float
) -> None:
    blob = _odd_state_blob()
    header, body = split(blob)
    cells = len(body) // 8
    n_rows = len(header["slots"]) * state.NCOL
    # most draws land in the rows, the window and the aggregates, not in the sketch
    offset = data.draw(
        st.integers(0, n_rows - 1)
        | st.integers(n_rows, n_rows + 1)  # the sketch's window
        | st.integers(cells - 12, cells - 1)
        | st.integers(0, cells - 1)
    )
    raw = bytearray(body)
    raw[8 * offset : 8 * offset + 8] = struct.pack("<d", value)
    odd = join(header, bytes(raw))
    decoded = decode_or_codec_error(odd)
    assert (decoded is not None) == _expected_to_decode(header, body, offset, value), (
        offset,
        value,
    )
    if decoded is not None:  # decoded as it is: nothing silently repaired (a sketch may
        # send a narrower window again, where an edge cell became 0)
        again = decoded.to_bytes()
        assert again == odd or ms.Metrics.from_bytes(again).to_bytes() == again
        assert same(ms.Metrics.from_bytes(again).compute(), decoded.compute())


def test_decoded_odd_values_compute_as_nan_and_inf() -> None:
    m = ms.Metrics({"x": ms.Spec(("mean", "max", "min", "count"))})
    m.record("x", [1.0, 2.0])
    header, body = split(m.to_bytes())
    rows = np.frombuffer(body, dtype="<f8").copy().reshape(-1, state.NCOL)
    rows[0, state.S] = math.nan
    rows[0, state.MAX] = math.inf
    got = ms.Metrics.from_bytes(join(header, rows.tobytes())).compute()
    assert math.isnan(got["x/mean"]) and got["x/max"] == math.inf
    assert got["x/min"] == 1.0 and got["x/count"] == 2.0
    rows[0, state.W] = -2.0
    with pytest.raises(ms.CodecError, match="'x'"):
        ms.Metrics.from_bytes(join(header, rows.tobytes()))


def test_a_rule_that_disagrees_with_a_held_spec_decodes_and_merge_names_it() -> None:
    m = ms.Metrics({"x": ms.Spec("max")})
    m.record("x", [1.0, 5.0])
    header, body = split(m.to_bytes())
    header["rules"] = [["x", ms.Spec("min").to_json()]]
    odd = ms.Metrics.from_bytes(join(header, body))
    assert odd.compute() == {"x": 5.0}  # the held state keeps its own spec
    with pytest.raises(ms.SpecMismatchError, match="'x'"):
        odd.merge(ms.Metrics.from_bytes(join(header, body)))


# ------------------------------------------------------ resource bounds


def _decode_costs(blob: bytes) -> tuple[int, int]:
    """The peak traced allocation and the calls (Python functions and builtins) of
    decoding ``blob``, which must raise ``CodecError``: counts, not timings."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    tracemalloc.start()
    sys.setprofile(count)
    try:
        with pytest.raises(ms.CodecError):
            ms.Metrics.from_bytes(blob)
    finally:
        sys.setprofile(None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, calls


def test_declared_lengths_beyond_the_input_fail_fast_without_allocating() -> None:
    head = json.dumps({"rules": [], "slots": [], "sketch": [], "agg": []}).encode()
    for head_len, body_len in [(2**32 - 1, 0), (len(head), 2**40), (2**32 - 1, 2**64 - 1)]:
        blob = HEAD.pack(b"MSYN", 1, 0, head_len, body_len) + head
        blob += struct.pack("<I", zlib.crc32(blob))
        peak, calls = _decode_costs(blob)
        assert peak < 64 * 1024 and calls < 50, (peak, calls)  # refused by the length check


def test_quantile_slots_need_their_sketch_bytes_before_anything_is_allocated() -> None:
    # 2000 quantile metrics would need 2000 sketches of 8067 cells (126 MB); the body
    # holds only their state rows, so the decoder must refuse before allocating them.
    spec = ms.Spec("p50").to_json()
    slots = [[f"s{i}", spec] for i in range(2000)]
    blob = join({"rules": [], "slots": slots, "sketch": [], "agg": []}, bytes(2000 * 64))
    peak, _ = _decode_costs(blob)
    assert sketch_layout(0.01).n_cells * 8 * 2000 > 100 * 2**20
    assert peak < 3 * len(blob) + 2**20


def test_many_glob_rules_decode_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Globs are sorted once per decode, not once per rule (which was quadratic)."""
    from metricsync._state._rules import SpecTable

    sorts: list[int] = []
    original = SpecTable._sort_globs

    def counted(table: SpecTable) -> None:
        sorts.append(1)
        original(table)

    monkeypatch.setattr(SpecTable, "_sort_globs", counted)
    spec = ms.Spec("max").to_json()
    for count in (2_000, 16_000):
        blob = join(
            {
                "rules": [[f"g{i}/*", spec] for i in range(count)],
                "slots": [],
                "sketch": [],
                "agg": [],
            },
            b"",
        )
        sorts.clear()
        m = ms.Metrics.from_bytes(blob)
        assert len(sorts) == 1, (count, len(sorts))
        assert m.spec(f"g{count - 1}/x") == ms.Spec("max") and m.spec("other") == ms.Spec()
