"""Hostile and exotic input: amplification limits, and tensors metricsync cannot read.

Amplification: a spec asks for at most ``MAX_STATS`` (32) statistics and a
format width or precision of at most ``MAX_FMT_NUMBER`` (100), in ``Spec`` and
in the decoder alike, with errors that name the limit. A 0.9 MB blob declaring
70,000 quantiles (``compute()`` took 7.8 s, ``format()`` 10.2 s) and a format
width of 300,000,000 are ``CodecError``s. What ``compute()`` and ``format()``
of any decodable blob do is bounded by the blob's size: checked by counting
the quantiles queried and the characters written, never by a clock.

Exotic tensors: float8 and bfloat16 work on the host and through the
accelerator code path; sparse (COO, CSR, CSC, BSR), quantized, nested
(strided and jagged), complex and sub-byte dtypes, and tensor subclasses that
dispatch their own ops (a DTensor) raise ``TypeError`` naming the metric and what
to convert to, as values, weights and masks; ``update()`` with one of them records
nothing.

Numpy masked arrays: a masked element is no sample (numpy's statistics over
``compressed()``); a masked weight or mask element is refused, naming the metric.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import json
import math
import struct
import warnings
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms
import metricsync._record._convert
import metricsync._state._stats
from metricsync._state._spec import MAX_FMT_NUMBER, MAX_STATS

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")


def blob(header: dict[str, Any], body: bytes = b"") -> bytes:
    """A well-formed container (magic, version, lengths, CRC-32) around any header and body."""
    head = json.dumps(header, separators=(",", ":")).encode()
    data = struct.pack("<4sHHIQ", b"MSYN", 1, 0, len(head), len(body)) + head + body
    return data + struct.pack("<I", zlib.crc32(data))


def spec_json(stats: list[str], fmt: str | None = None, across: str = "exact") -> str:
    return json.dumps([stats, across, fmt, "propagate", 0.01])


# ------------------------------------------------------------ amplification

MANY = [f"p{i / 1000:g}" for i in range(1, 70_001)]


def test_a_blob_declaring_70000_quantiles_is_rejected_naming_the_limit() -> None:
    # as a rule of its own, and as the spec of a held metric (whose body is never read)
    as_rule = blob({"rules": [["x", spec_json(MANY)]], "slots": [], "sketch": [], "agg": []})
    as_slot = blob({"rules": [], "slots": [["x", spec_json(MANY)]], "sketch": [], "agg": []})
    assert len(as_rule) > 800_000
    for data in (as_rule, as_slot):
        with pytest.raises(ms.CodecError, match=f"at most {MAX_STATS}"):
            ms.Metrics.from_bytes(data)


@pytest.mark.parametrize("fmt", ["300000000.2f", ".300000000f", "101", ".101e", "0>1000"])
def test_a_blob_asking_for_a_huge_format_width_is_rejected_naming_the_limit(fmt: str) -> None:
    data = blob({"rules": [["x", spec_json(["mean"], fmt)]], "slots": [], "sketch": [], "agg": []})
    assert len(data) < 200
    with pytest.raises(ms.CodecError, match=f"limit of {MAX_FMT_NUMBER}"):
        ms.Metrics.from_bytes(data)
    with pytest.raises(ValueError, match=f"limit of {MAX_FMT_NUMBER}"):
        ms.Spec("mean", fmt=fmt)


def test_spec_limits_name_themselves() -> None:
    assert MAX_STATS == 32 and MAX_FMT_NUMBER == 100
    ms.Spec(tuple(MANY[:MAX_STATS]), fmt=f"{MAX_FMT_NUMBER}.{MAX_FMT_NUMBER}f")
    with pytest.raises(ValueError, match=f"at most {MAX_STATS}"):
        ms.Spec(tuple(MANY[: MAX_STATS + 1]))


@contextlib.contextmanager
def quantiles_queried() -> Iterator[list[int]]:
    """Count the (sketch, quantile) pairs compute() asks the sketch for."""
    asked = [0]
    original = metricsync._state._stats.query

    def counting(layout: Any, cells: Any, qs: Any, *args: Any, **kwargs: Any) -> Any:
        asked[0] += int(np.asarray(cells).reshape(-1, layout.n_cells).shape[0]) * len(qs)
        return original(layout, cells, qs, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metricsync._state._stats, "query", counting)
        yield asked


def _at_the_limits(n_names: int, accuracy: float) -> ms.Metrics:
    """Metrics whose every spec is as expensive as a spec can be."""
    stats = tuple(f"p{i + 1}" for i in range(MAX_STATS))
    widest = f"{MAX_FMT_NUMBER}.{MAX_FMT_NUMBER}f"
    m = ms.Metrics(
        {
            "q/*": ms.Spec(stats, fmt=widest, accuracy=accuracy),
            "a/*": ms.Spec(stats, fmt=widest, across="mean", accuracy=accuracy),
        }
    )
    for i in range(n_names):
        m.record(f"q/{i}", [1e308, -1e308, 1.0])
        part = ms.Metrics({"a/*": ms.Spec(stats, fmt=widest, across="mean", accuracy=accuracy)})
        part.record(f"a/{i}", [1e308, 2.0])
        m.merge(part)
    return m


@pytest.mark.parametrize("accuracy", [0.01, 0.05])
def test_compute_and_format_of_a_decoded_blob_are_bounded_by_its_size(accuracy: float) -> None:
    for n_names in (1, 8):
        data = _at_the_limits(n_names, accuracy).to_bytes()
        decoded = ms.Metrics.from_bytes(data)
        with quantiles_queried() as asked:
            values = decoded.compute()
        text = decoded.format()
        # work: at most MAX_STATS quantiles per held sketch, and a sketch costs its cells
        # in the blob (8 bytes each) as in the query
        sketches = n_names
        assert asked[0] <= MAX_STATS * sketches
        cells = len(np.zeros(0)) + sketches * _cells(accuracy)
        assert 8 * cells <= len(data)
        # output: MAX_STATS keys per name, each at most a few hundred characters
        assert len(values) == 2 * n_names * MAX_STATS
        assert len(text) <= 2 * n_names * MAX_STATS * (3 * MAX_FMT_NUMBER + 320)
        assert len(text) <= 64 * len(data)


def _cells(accuracy: float) -> int:
    from metricsync._state._sketch import sketch_layout

    return int(sketch_layout(accuracy).n_cells)


FMT_PIECES = st.tuples(
    st.sampled_from(["", "<", ">", "^", "=", "x<", "0=", "9>"]),
    st.sampled_from(["", "+", "-", " "]),
    st.sampled_from(["", "#", "0"]),
    st.one_of(
        st.just(""),
        st.integers(0, 10**12).map(str),
        st.sampled_from(["\u0661\u0660\u0660\u0660", "\uff11\uff10\uff11", "1" * 60]),
    ),
    st.sampled_from(["", ",", "_"]),
    st.one_of(st.just(""), st.integers(0, 10**6).map(lambda p: f".{p}")),
    st.sampled_from(["", "e", "E", "f", "F", "g", "G", "%", "n"]),
)


@given(FMT_PIECES)
@settings(max_examples=300, deadline=None)
def test_any_format_spec_spec_accepts_writes_a_bounded_number(pieces: tuple[str, ...]) -> None:
    fmt = "".join(pieces)
    try:
        spec = ms.Spec("max", fmt=fmt)
    except (ValueError, TypeError):
        return
    m = ms.Metrics({"x": spec})
    m.record("x", [-1e308, 1e308])
    for value in (1e308, -1e308, 5e-324, math.nan, -math.inf, 0.1):
        assert len(m.format({"x": value})) <= len("x: ") + 3 * MAX_FMT_NUMBER + 320, fmt


# ------------------------------------------------------------ exotic tensors


@contextlib.contextmanager
def device_path(on: bool) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        if on:
            mp.setattr(metricsync._record._convert, "HOST_DEVICE_TYPES", frozenset())
        yield


def _unreadable() -> dict[str, tuple[Callable[[], Any], str]]:
    """Tensors metricsync cannot read, and what the error must suggest."""
    import torch

    def sub_byte(dtype: str) -> Callable[[], Any]:
        return lambda: torch.zeros(4, dtype=torch.uint8).view(getattr(torch, dtype))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's beta and deprecation warnings
        cases = {
            "sparse_coo": (lambda: torch.eye(2).to_sparse(), "to_dense"),
            "sparse_csr": (lambda: torch.eye(2).to_sparse_csr(), "to_dense"),
            "sparse_csc": (lambda: torch.eye(2).to_sparse_csc(), "to_dense"),
            "sparse_bsr": (lambda: torch.eye(2).to_sparse_bsr((1, 1)), "to_dense"),
            "quantized": (
                lambda: torch.quantize_per_tensor(torch.ones(2, 2), 0.1, 0, torch.quint8),
                "dequantize",
            ),
            "nested": (
                lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
                "unbind",
            ),
            "jagged": (
                lambda: torch.nested.nested_tensor(
                    [torch.ones(2), torch.ones(3)], layout=torch.jagged
                ),
                "unbind",
            ),
            "complex": (lambda: torch.ones(2, 2, dtype=torch.complex64), "real"),
            "bits8": (sub_byte("bits8"), "float"),
        }
        if hasattr(torch, "float4_e2m1fn_x2"):
            cases["float4"] = (sub_byte("float4_e2m1fn_x2"), "float")
        if hasattr(torch, "uint3"):
            cases["uint3"] = (sub_byte("uint3"), "float")
    return cases


UNREADABLE = list(_unreadable()) if HAS_TORCH else []


@needs_torch
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("case", UNREADABLE)
def test_unreadable_tensors_raise_type_error_naming_the_metric(case: str, device: bool) -> None:
    import torch

    make, hint = _unreadable()[case]
    with warnings.catch_warnings(), device_path(device):
        warnings.simplefilter("ignore")
        bad = make()
        m = ms.Metrics({"lr": ms.Spec("last")})
        m.record("ok", 1.0)
        m.record("lr", 1.0)  # open names take the scalar fast path
        m.record("lr", torch.tensor(2.0))
        before = m.to_bytes()
        ones = torch.ones(2, 2)  # the exotic weight or mask fails before any shape check
        attempts = [
            ("value", lambda: m.record("bad", bad)),
            ("value", lambda: m.record("ok", bad)),
            ("value", lambda: m.update({"ok": 1.0, "lr": 3.0, "bad": bad})),
            ("weight", lambda: m.record("bad", ones, weight=bad)),
            ("mask", lambda: m.record("bad", ones, mask=bad)),
        ]
        for role, attempt in attempts:
            with pytest.raises(TypeError, match=r"'(bad|ok|lr)'") as err:
                attempt()
            assert hint in str(err.value), str(err.value)
            if case != "complex":  # the message says which argument it is about
                assert f" {role} tensor" in str(err.value), str(err.value)
        assert m.to_bytes() == before  # nothing recorded, and still computable
        assert m.compute() == {"ok": 1.0, "lr": 2.0}
        # a 0-d one on the scalar fast path: TypeError, or its value if it has one
        scalar = _scalar(case)
        if scalar is not None:
            try:
                m.record("lr", scalar)
            except TypeError as exc:
                assert "'lr'" in str(exc) and hint in str(exc), str(exc)
                assert m.to_bytes() == before
            else:
                assert m.compute()["lr"] == float(_dense(scalar)), case


def _scalar(case: str) -> Any:
    import torch

    one = torch.tensor(1.5)
    return {
        "sparse_coo": lambda: one.to_sparse(),
        "quantized": lambda: torch.quantize_per_tensor(one, 0.5, 0, torch.quint8),
        "complex": lambda: torch.tensor(1.5 + 0j),
        "bits8": lambda: torch.zeros(1, dtype=torch.uint8).view(torch.bits8)[0],
        "float4": lambda: torch.zeros(1, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)[0],
    }.get(case, lambda: None)()


def _dense(t: Any) -> Any:
    return t.dequantize() if t.is_quantized else t.to_dense() if t.is_sparse else t


@needs_torch
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize(
    "dtype",
    ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "uint16", "uint64"],
)
def test_narrow_and_unusual_dtypes_work(dtype: str, device: bool) -> None:
    import torch

    if not hasattr(torch, dtype):
        pytest.skip(f"torch has no {dtype}")
    dt = getattr(torch, dtype)
    x = torch.tensor([1.0, 2.0, 4.0, 8.0]).to(dt)  # exact in every one of these dtypes
    spec = ms.Spec(("mean", "min", "max", "last", "std", "p50", "count"))
    want = ms.Metrics({"x": spec})
    want.record("x", [1.0, 2.0, 4.0, 8.0])
    want.record("x", [1.0, 2.0], weight=[2.0, 1.0])
    want.record("x", [4.0, 8.0], mask=[True, False])
    with device_path(device):
        m = ms.Metrics({"x": spec})
        m.record("x", x)
        m.record("x", x[:2], weight=torch.tensor([2.0, 1.0]).to(dt))
        m.record("x", x[2:], mask=torch.tensor([1, 0]).to(dt))
        m.update({"y": x[3], "z": x})
        got = m.compute()
    assert {k: v for k, v in got.items() if k.startswith("x/")} == want.compute()
    assert got["y"] == 8.0 and got["z"] == 3.75


# ------------------------------------------------------- glob resolution

GLOB_TEXT = st.text(alphabet="ab/*?[]!x", min_size=1, max_size=6)


@given(st.lists(GLOB_TEXT, max_size=12, unique=True), st.lists(st.text("ab/x[]", max_size=6)))
@settings(max_examples=300, deadline=None)
def test_glob_resolution_is_the_longest_matching_pattern(
    patterns: list[str], names: list[str]
) -> None:
    from metricsync._state._rules import SpecTable

    globs = [p for p in patterns if SpecTable.is_glob(p)]
    specs = {p: ms.Spec("max", fmt=f".{i}f") for i, p in enumerate(globs)}
    table = SpecTable(specs)
    ordered = sorted(globs, key=lambda p: (-len(p), p))  # the documented order
    for name in [*names, *globs]:
        want = next((specs[p] for p in ordered if fnmatch.fnmatchcase(name, p)), None)
        if name in specs:  # a declared name such as "acc[top1]" is itself first
            want = specs[name]
        assert table.explicit(name) == want, (name, globs)
        # again (from the memo), and from another table of the same rules
        assert table.explicit(name) == want and SpecTable(specs).explicit(name) == want


def test_glob_resolution_past_the_memo_bound_stays_right(monkeypatch: pytest.MonkeyPatch) -> None:
    import metricsync._state._rules as rules

    monkeypatch.setattr(rules, "_MEMO_LIMIT", 3)
    index = rules._GlobIndex({"a/*": ms.Spec("max"), "a/b*": ms.Spec("sum")})
    table = rules.SpecTable({"a/*": ms.Spec("max"), "a/b*": ms.Spec("sum")})
    for _ in range(3):  # the memo fills and is cleared over and over
        for i in range(10):
            assert table.resolve(f"a/b{i}") == ms.Spec("sum")
            assert table.resolve(f"a/{i}") == ms.Spec("max")
            assert table.resolve(f"c{i}") == ms.Spec()
            assert index.match(f"a/b{i}") == ms.Spec("sum") and index.match(f"c{i}") is None
            assert len(index.memo) <= 3


def test_tables_of_the_same_globs_with_other_specs_resolve_apart() -> None:
    from metricsync._state._rules import SpecTable

    one = SpecTable({"t/*": ms.Spec("max"), "u/*": ms.Spec("sum")})
    two = SpecTable({"t/*": ms.Spec("sum"), "u/*": ms.Spec("max")})
    for _ in range(2):
        assert one.resolve("t/x") == two.resolve("u/x") == ms.Spec("max")
        assert one.resolve("u/x") == two.resolve("t/x") == ms.Spec("sum")


@pytest.mark.slow  # a large count of names: make test-slow (CI) runs it
def test_many_names_against_many_globs_is_not_quadratic() -> None:
    n = 2000
    rules = {f"g{i}/*": ms.Spec("max") for i in range(n)}
    m = ms.Metrics(rules)
    for i in range(n):
        m.record(f"g{i}/x", float(i))
    calls = [0]
    original = fnmatch.fnmatchcase

    def counting(name: str, pattern: str) -> bool:
        calls[0] += 1
        return original(name, pattern)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fnmatch, "fnmatchcase", counting)
        merged = ms.Metrics.from_bytes(m.to_bytes()).merge(m.copy())
    assert merged.compute()[f"g{n - 1}/x"] == n - 1
    assert calls[0] <= 10 * n  # a glob or two per name, not every glob per name (4,000,000)


@needs_torch
@pytest.mark.parametrize(
    "dtype",
    ["float64", "float32", "float16", "bfloat16", "int8", "int32", "int64", "uint8", "bool"],
)
def test_a_0d_tensor_reads_as_numpy_reads_it_first_and_later(dtype: str) -> None:
    """A name's first 0-d tensor takes the checked path, later ones the fast path; both
    read the number numpy reads (narrow floats through float32, as the array path)."""
    import torch

    dt = getattr(torch, dtype)
    raw = [0.1, -2.5, 3.0e4, 1.0, 0.0] if dt.is_floating_point else [-7, 100, 2**53 + 1, 1, 0]
    wide = torch.float64 if dt.is_floating_point else torch.int64
    values = [torch.tensor(v, dtype=wide).to(dt) for v in raw if dt != torch.bool or v in (0, 1)]
    for t in values:
        narrow = t.is_floating_point() and t.element_size() < 4
        want = float((t.float() if narrow else t).numpy())
        m = ms.Metrics({"x": ms.Spec(("sum", "last"))})
        m.record("x", t)
        first = m.compute()
        m.record("x", t.requires_grad_(True) if t.is_floating_point() else t)
        assert first == {"x/sum": want, "x/last": want}, (dtype, t)
        assert m.compute() == {"x/sum": 2 * want, "x/last": want}, (dtype, t)


_INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


@pytest.mark.parametrize("dtype", _INT_DTYPES)
@pytest.mark.parametrize("size", [8, 300, 5000])
@pytest.mark.parametrize("form", ["array", "masked", "weighted", "tensor"])
def test_integer_samples_at_their_extremes_keep_their_sign(
    dtype: str, size: int, form: str
) -> None:
    """The smallest and largest integers of every dtype, buffered (8 samples) or reduced
    when recorded (300; 5,000 under a mask), give numpy's statistics of their float64
    values: a minimum negated in the integers' own dtype wraps (-uint8(3) is 253)."""
    info = np.iinfo(dtype)
    low = info.min if info.min < 0 else 3  # -0 does not wrap
    x = np.resize(np.array([low, info.max, 3, low + 1], dtype=dtype), size)
    mask = np.ones(size, dtype=bool)
    mask[1::7] = False
    weight = np.resize(np.array([1.0, 2.0, 0.5]), size)
    m = ms.Metrics({"x": ms.Spec(("min", "max", "mean"))})
    if form == "tensor":
        torch = pytest.importorskip("torch")
        if not hasattr(torch, dtype):
            pytest.skip(f"torch has no {dtype}")
        m.record("x", torch.from_numpy(x))
    elif form == "masked":
        m.record("x", x, mask=mask)
    elif form == "weighted":
        m.record("x", x, weight=weight)
    else:
        m.record("x", x)
    kept = x[mask] if form == "masked" else x
    v = kept.astype(np.float64)
    w = weight if form == "weighted" else np.ones(len(v))
    got = m.compute()
    assert got["x/min"] == v.min() and got["x/max"] == v.max(), (form, size, dtype, got)
    assert got["x/mean"] == pytest.approx(np.dot(v, w) / w.sum(), rel=1e-12)


@pytest.mark.parametrize("form", ["array", "tensor"])
def test_boolean_samples_reduced_when_recorded_have_a_min_and_max(form: str) -> None:
    """Booleans count as 0 and 1; numpy has no negative of a boolean, so a minimum
    negated as a boolean raised a ``TypeError`` that named no metric."""
    x = np.arange(300) % 3 == 0
    value: Any = x
    if form == "tensor":
        torch = pytest.importorskip("torch")
        value = torch.from_numpy(x)
    m = ms.Metrics({"flags": ms.Spec(("min", "max", "mean"))})
    m.record("flags", value)
    assert m.compute() == {"flags/min": 0.0, "flags/max": 1.0, "flags/mean": 100 / 300}


# ------------------------------------------------------------ numpy masked arrays

MASKED_SPEC = ms.Spec(("sum", "count", "min", "max"))


@pytest.mark.parametrize("size", [3, 300])  # buffered, and reduced when recorded
@pytest.mark.parametrize("how", ["record", "update", "open", "weighted", "masked", "error"])
def test_a_masked_arrays_masked_elements_are_no_samples(size: int, how: str) -> None:
    """``np.asarray`` of a numpy masked array drops its mask: its masked elements (any
    value, here 1e6 and NaN) were recorded as samples, a wrong number with no error.
    The oracle: numpy's statistics over ``compressed()``, the unmasked elements."""
    rng = np.random.default_rng(size)
    data = rng.normal(size=size)
    hidden = np.arange(size) % 3 == 1
    data[hidden] = 1e6
    data[1] = np.nan
    value = np.ma.masked_array(data, mask=hidden)
    weight = rng.uniform(0.5, 2.0, size=size)
    keep = np.arange(size) % 5 != 0  # the mask= argument, beside the array's own
    spec = ms.Spec(MASKED_SPEC.reduce, nan="error") if how == "error" else MASKED_SPEC
    m = ms.Metrics({"x": spec})
    if how == "open":
        m.record("x", 0.0)  # the name's number buffer is open
    if how == "update":
        m.update({"x": value})
    elif how == "weighted":
        m.record("x", value, weight=weight)
    elif how == "masked":
        m.record("x", value, mask=keep)
    else:
        m.record("x", value)
    got = m.compute()
    kept = ~hidden & (keep if how == "masked" else True)
    v = data[kept]
    w = weight[kept] if how == "weighted" else np.ones(len(v))
    if how == "open":
        v, w = np.append(v, 0.0), np.append(w, 1.0)
    assert got["x/count"] == pytest.approx(w.sum(), rel=1e-12)
    assert got["x/sum"] == pytest.approx(np.dot(v, w), rel=1e-12)
    assert (got["x/min"], got["x/max"]) == (v.min(), v.max())


def test_the_masked_constant_records_no_sample() -> None:
    m = ms.Metrics()
    m.record("x", 1.0)
    m.record("x", np.ma.masked)
    assert m.compute() == {"x": 1.0}


@pytest.mark.parametrize("role", ["weight", "mask"])
def test_a_masked_weight_or_mask_is_refused_naming_the_metric(role: str) -> None:
    """What a masked weight or mask element means is unclear: refused, nothing recorded."""
    other = np.ma.masked_array([1.0, 1.0], mask=[False, True])
    m = ms.Metrics()
    with pytest.raises(TypeError, match=r"'x'.*masked"):
        m.record("x", np.array([1.0, 2.0]), **{role: other})
    assert len(m) == 0


def _dtensor_records(rank: int, world_size: int) -> list[str]:
    """On a one-rank group: what recording DTensors (0-d and sharded, as value, weight and
    mask, on the host path and the accelerator one) raises, and what compute() gives."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (1,))
    out = []
    for device in (False, True):
        with device_path(device):
            m = ms.Metrics({"gn": ms.Spec(("sum", "count"))})
            m.record("gn", torch.tensor(1.0))
            scalar = DTensor.from_local(torch.tensor(2.0), mesh, [Replicate()])
            vector = DTensor.from_local(torch.tensor([3.0, 4.0]), mesh, [Shard(0)])
            plain = torch.tensor([5.0, 6.0])
            attempts: list[tuple[Any, dict[str, Any]]] = [
                (scalar, {}),
                (vector, {}),
                (plain, {"weight": vector}),
                (plain, {"mask": vector > 0}),
            ]
            for value, kwargs in attempts:
                try:
                    m.record("gn", value, **kwargs)
                    out.append("recorded")
                except TypeError as exc:
                    out.append(str(exc))
            try:
                out.append(repr(m.compute()))
            except Exception as exc:  # reported to the test
                out.append(f"{type(exc).__name__}: {exc}")
    return out


@needs_torch
def test_a_dtensor_is_refused_naming_the_metric_and_nothing_breaks() -> None:
    # a DTensor dispatches its own ops: on the accelerator path it was kept as a reference
    # and every later compute() failed in the fold (no sharding strategy for the batched
    # copy, not naming the metric); on the host path a sharded one failed in numpy()
    from metricsync.testing import run_distributed

    (out,) = run_distributed(_dtensor_records, 1)
    for path in (out[:5], out[5:]):
        *errors, computed = path
        for message in errors:
            assert message.startswith("metric 'gn': a ") and "DTensor" in message, message
            assert "to_local()" in message, message
        assert computed == repr({"gn/sum": 1.0, "gn/count": 1.0}), computed
