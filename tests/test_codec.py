"""The binary format: round trips, and malformed, truncated or hostile input."""

from __future__ import annotations

import json
import pickle
import struct
import zlib
from typing import Any

import numpy as np
import pytest

import metricsync as ms
from metricsync._state import _algebra as al
from metricsync._state import _codec as codec
from metricsync.testing import format_example

HEAD = codec.HEAD


def _rich() -> ms.Metrics:
    pytest.importorskip("torch")  # format_example() records a torch tensor
    result: ms.Metrics = format_example()
    return result


def _split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    head, body = codec.unframe(blob)
    return json.loads(head), body


def _join(
    header: dict[str, Any], body: bytes, version: int = codec.FORMAT_VERSION, flags: int = 0
) -> bytes:
    return codec.frame(json.dumps(header).encode(), body, version, flags)


def test_round_trip_keeps_values_specs_and_rules() -> None:
    m = _rich()
    blob = m.to_bytes()
    back = ms.Metrics.from_bytes(blob)
    assert back.compute() == m.compute()
    assert back.to_bytes() == blob
    assert back.spec("timing/new") == ms.Spec("max", fmt=".3f")
    assert back.spec("declared/only") == ms.Spec("min")
    assert back.format() == m.format()
    assert ms.Metrics.from_bytes(bytearray(blob)).compute() == m.compute()
    assert ms.Metrics.from_bytes(memoryview(blob)).compute() == m.compute()


def test_round_trip_then_continue_recording() -> None:
    m = _rich()
    back = ms.Metrics.from_bytes(m.to_bytes())
    for x in (m, back):
        x.record("len", 1000.0)
        x.record("pg", 6.0)
        x.record("timing/gen", 0.5)
    assert back.compute() == m.compute()


def test_pickle_uses_the_codec_and_no_pickle_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _rich()
    data = pickle.dumps(m)
    assert m.to_bytes() in data
    calls = []
    original = codec.decode
    monkeypatch.setattr(codec, "decode", lambda blob: calls.append(1) or original(blob))
    back = pickle.loads(data)
    assert calls == [1]
    assert back.compute() == m.compute()


def test_no_pickle_in_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = _rich().to_bytes()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the decoder must not unpickle")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    assert ms.Metrics.from_bytes(blob).compute() == _rich().compute()


def _with_body(blob: bytes, body: bytes) -> bytes:
    """``blob`` with another body behind the very same header bytes."""
    return codec.frame(codec.unframe(blob)[0], body)


def test_a_header_decoded_again_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single controller decodes its workers' results every step: the second decode of
    a header parses no spec, and its tables are independent of the first's."""
    m = _rich()
    blob = m.to_bytes()
    first = ms.Metrics.from_bytes(blob)
    parsed = []
    original = ms.Spec.from_json.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        ms.Spec,
        "from_json",
        classmethod(lambda cls, text: parsed.append(text) or original(cls, text)),
    )
    second = ms.Metrics.from_bytes(blob)
    assert parsed == []  # before: every distinct spec of the header
    assert second.compute() == first.compute() == m.compute()
    first.record("only/first", 1.0)
    first.define("fresh/*", ms.Spec("sum"))
    first.record("len", 1e6)
    assert "only/first" not in second.compute() and second.compute() == m.compute()
    assert second.spec("fresh/x") == ms.Spec()
    assert ms.Metrics.from_bytes(blob).compute() == m.compute()


def test_a_known_header_still_checks_its_body() -> None:
    """The kept shape of a header covers the header alone: a body that no record makes,
    or of another length, behind a header decoded before still raises."""
    m = ms.Metrics({"x": ms.Spec(("mean", "p50"))})
    m.record("x", [1.0, 2.0, 4.0])
    blob = m.to_bytes()
    assert ms.Metrics.from_bytes(blob).compute() == m.compute()
    _, body = _split(blob)
    rows = np.frombuffer(body, dtype="<f8").copy()
    rows[0] = -1.0  # the first state row is the weight sum: negative
    with pytest.raises(ms.CodecError, match="negative"):
        ms.Metrics.from_bytes(_with_body(blob, rows.tobytes()))
    with pytest.raises(ms.CodecError, match="body holds"):
        ms.Metrics.from_bytes(_with_body(blob, body[:-8]))
    assert ms.Metrics.from_bytes(_with_body(blob, body)).compute() == m.compute()


def test_a_header_encoded_again_follows_new_rules_and_names() -> None:
    m = ms.Metrics({"x": ms.Spec("max")})
    m.record("x", 2.0)
    assert ms.Metrics.from_bytes(m.to_bytes()).compute() == {"x": 2.0}
    m.define("t/*", ms.Spec("sum"))
    back = ms.Metrics.from_bytes(m.to_bytes())
    assert back.spec("t/a") == ms.Spec("sum")
    m.record("t/a", 3.0)
    m.record("t/a", 4.0)
    assert ms.Metrics.from_bytes(m.to_bytes()).compute() == {"x": 2.0, "t/a": 7.0}


def test_empty_round_trip() -> None:
    blob = ms.Metrics().to_bytes()
    assert ms.Metrics.from_bytes(blob).compute() == {}
    assert len(blob) < 128


def test_every_truncation_raises_codec_error() -> None:
    blob = _rich().to_bytes()
    cuts = sorted(set(range(0, 64)) | set(range(0, len(blob), 97)) | {len(blob) - 1})
    for cut in cuts:
        with pytest.raises(ms.CodecError):
            ms.Metrics.from_bytes(blob[:cut])


def test_every_single_byte_corruption_raises_codec_error() -> None:
    blob = ms.Metrics({"x": ms.Spec(("mean", "max"))})
    blob.record("x", [1.0, 2.0])
    data = blob.to_bytes()
    for i in range(len(data)):
        for flip in (0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= flip
            with pytest.raises(ms.CodecError):
                ms.Metrics.from_bytes(bytes(bad))


def test_codec_error_is_a_value_error_and_metricsync_error() -> None:
    with pytest.raises(ValueError):
        ms.Metrics.from_bytes(b"")
    with pytest.raises(ms.MetricsyncError):
        ms.Metrics.from_bytes(b"garbage" * 10)


@pytest.mark.parametrize("data", [None, "MSYN", 12, [1, 2], np.zeros(4)])
def test_not_bytes(data: Any) -> None:
    with pytest.raises(ms.CodecError):
        ms.Metrics.from_bytes(data)


def test_trailing_bytes_raise() -> None:
    blob = _rich().to_bytes()
    with pytest.raises(ms.CodecError):
        ms.Metrics.from_bytes(blob + b"\0")


def test_other_version_and_flags_raise() -> None:
    header, body = _split(_rich().to_bytes())
    assert ms.Metrics.from_bytes(_join(header, body)).compute() == _rich().compute()
    for version in (0, codec.FORMAT_VERSION + 1):
        with pytest.raises(ms.CodecError, match="version"):
            ms.Metrics.from_bytes(_join(header, body, version=version))
    with pytest.raises(ms.CodecError):
        ms.Metrics.from_bytes(_join(header, body, flags=1))


#: ``to_bytes()`` of format version 1 (every sketch cell sent), as 0.1's build wrote it
#: (zlib, base64): a quantile metric at accuracy 0.25, an ``across`` metric, an argrank
#: metric, a ``last`` metric and a default one
_VERSION_1 = (
    "eNrzDY70Y2RgYChnYmDo4GYAg2qlotKc1GIlq+hopZzUPCUdpejoGKXc1MS8GCWdGKUCUwMIbQmkY4GM1IrE5BKg"
    "UF5pTg5IvCi/IDE9sSQVKGSgZ2QaC1QUrZQOMyaxAqILah5WTQaGEE0l6JrwWmVgqFMdo5RYlF6UmJcdo2RVUlSa"
    "WgsxKKcIalJOYnEJUUYB9cXqKBXn5JeMBgRQXwWK54kPv+zUkuQMUAAa6BgbGYOEEtPTQXxDHUMQD+RCUAAbxdZC"
    "Ep+AA5jy3QihGTZAaYMDEPrDfwb8wAGVy+GAqo+Q/g/2qHwWqH6WA+TpR9i74vr6g4Idks66zjKvH5lJ2RPQfwC7"
    "uwn6fxSMglEwCkbBKBgF9AMOpCn/YE9ddaNgFJCU/tDakz/qYfReQ7O5APLH84k="
)


def test_format_version_1_is_still_read() -> None:
    import base64

    blob = zlib.decompress(base64.b64decode(_VERSION_1))
    assert HEAD.unpack_from(blob)[1] == 1
    m = ms.Metrics.from_bytes(blob)
    want = {"len/mean": 1107.25, "g": 3.0, "t": 2.5, "lr": 1e-4, "x": -2.0}
    got = m.compute()
    assert {k: got[k] for k in want} == want
    fresh = ms.Metrics(
        {"len": ms.Spec(("mean", "p50", "p90"), accuracy=0.25), "t": ms.Spec("max", argrank=True)}
    )
    fresh.record("len", [16.0, 17.0, 300.0, 4096.0])
    assert got["len/p50"] == fresh.compute()["len/p50"]
    assert got["len/p90"] == fresh.compute()["len/p90"]
    again = ms.Metrics.from_bytes(m.to_bytes())  # written as the current version
    assert again.compute() == got and HEAD.unpack_from(m.to_bytes())[1] == codec.FORMAT_VERSION


def _sketch_metrics(lo: float, hi: float, n: int = 2000) -> ms.Metrics:
    m = ms.Metrics({"len": ms.Spec(("mean", "p50", "p99"))})
    m.record("len", np.geomspace(lo, hi, n))
    return m


def test_a_sketch_sends_the_cells_between_its_extremes() -> None:
    """Lengths 16-4,096 at 1%: ~280 cells of the sketch's 8,067 travel, and the decoded
    quantiles equal the sender's; an empty sketch sends no cell."""
    m = _sketch_metrics(16.0, 4096.0)
    blob = m.to_bytes()
    empty = ms.Metrics({"len": ms.Spec(("mean", "p50", "p99"))}).to_bytes()
    cells = (len(blob) - len(empty)) // 8
    assert 250 < cells < 310  # (with 10 state rows) before: the blob held all 8,067 cells
    assert len(blob) < 4096
    back = ms.Metrics.from_bytes(blob)
    assert back.compute() == m.compute()
    back.merge(_sketch_metrics(1.0, 10.0))
    both = _sketch_metrics(16.0, 4096.0).merge(_sketch_metrics(1.0, 10.0))
    assert back.compute() == both.compute()
    assert ms.Metrics.from_bytes(empty).compute() == {}


def test_windows_outside_their_sketch_raise() -> None:
    blob = _sketch_metrics(16.0, 4096.0).to_bytes()
    header, body = _split(blob)
    rows = np.frombuffer(body, dtype="<f8").copy()
    at = len(header["slots"]) * al.NCOL  # the window follows the state rows
    start, count = rows[at : at + 2]
    for bad in [
        (-1.0, count),
        (8067.0 - count + 1, count),
        (start + 0.5, count),
        (np.nan, count),
        (start, -1.0),
        (start, count + 0.5),
        (start, np.inf),
        (start, np.nan),
        (1e308, 1e308),
    ]:
        rows[at : at + 2] = bad
        with pytest.raises(ms.CodecError, match="window"):
            ms.Metrics.from_bytes(_join(header, rows.tobytes()))
    rows[at : at + 2] = start, count + 1  # a window longer than the cells sent
    with pytest.raises(ms.CodecError, match="body holds"):
        ms.Metrics.from_bytes(_join(header, rows.tobytes()))


def test_a_count_or_time_no_record_makes_raises_naming_its_metric() -> None:
    """Weights, drop counts and times are checked in every slot, whichever slot holds
    the bad value (the check answers the usual case in a few reductions first)."""
    m = ms.Metrics({"a": ms.Spec("mean"), "b": ms.Spec("max", nan="ignore"), "c": ms.Spec("last")})
    for name in ("a", "b", "c"):
        m.record(name, [1.0, 2.0])
    header, body = _split(m.to_bytes())
    rows = np.frombuffer(body, dtype="<f8").copy()
    names = [name for name, _ in header["slots"]]
    for column, bad in [
        (al.W, -1.0),
        (al.W, np.nan),
        (al.DROP, -1.0),
        (al.DROP, np.nan),
        (al.DROP, np.inf),
        (al.T, np.nan),
    ]:
        for slot, name in enumerate(names):
            state = rows.copy()
            state[slot * al.NCOL + column] = bad
            with pytest.raises(ms.CodecError, match=f"'{name}' holds a negative, NaN"):
                ms.Metrics.from_bytes(_join(header, state.tobytes()))
    assert ms.Metrics.from_bytes(_join(header, rows.tobytes())).compute() == m.compute()


def test_a_decoded_column_its_metric_does_not_carry_holds_its_identity() -> None:
    """A table of means carries weights and sums only: whatever a body says of extremes,
    times or second moments is put back to their identity, as folds and syncs leave
    them, so a merge that runs only the carried columns' rules still writes a blob that
    decodes."""
    m = ms.Metrics({"x": ms.Spec("mean")})
    m.record("x", [1.0, 2.0])
    header, body = _split(m.to_bytes())
    rows = np.frombuffer(body, dtype="<f8").copy()
    rows[[al.MAX, al.T, al.M2]] = 7.0, np.inf, 5.0  # slot 0's columns a mean does not carry
    decoded = ms.Metrics.from_bytes(_join(header, rows.tobytes()))
    decoded.record("x", 3.0)
    again = ms.Metrics.from_bytes(decoded.to_bytes())
    assert again.compute() == decoded.compute() == {"x": 2.0}
    state = np.frombuffer(_split(again.to_bytes())[1], dtype="<f8")[: al.NCOL]
    assert state[[al.MAX, al.T, al.M2]].tolist() == [-np.inf, -np.inf, 0.0]


def test_a_negative_or_nan_cell_in_a_window_raises() -> None:
    """The decoder checks the cells a window sent (the rest are zeros it wrote)."""
    blob = _sketch_metrics(16.0, 4096.0).to_bytes()
    header, body = _split(blob)
    rows = np.frombuffer(body, dtype="<f8").copy()
    first = len(header["slots"]) * al.NCOL + 2  # the state rows, the window, then its cells
    count = int(rows[first - 1])
    for at in (first, first + count // 2, first + count - 1):
        for bad in (-1.0, np.nan):
            cells = rows.copy()
            cells[at] = bad
            with pytest.raises(ms.CodecError, match="'len' holds a negative, NaN"):
                ms.Metrics.from_bytes(_join(header, cells.tobytes()))
    assert ms.Metrics.from_bytes(_join(header, rows.tobytes())).compute() == (
        ms.Metrics.from_bytes(blob).compute()
    )


def test_many_empty_sketches_cannot_make_the_decoder_allocate_much() -> None:
    """Windows let a small blob declare whole sketches; past 4 MiB plus 32 bytes per byte
    of the blob it is refused, and the encoder then sends as few sketches whole as keep
    its blob within that (before: every sketch whole past the bound, 38.7 MB here)."""
    n = 600  # 600 sketches of 64.5 KB: 38.7 MB declared by a blob of ~60 KB if windowed
    m = ms.Metrics({"q/*": ms.Spec("p50")})
    for i in range(n):
        m.record(f"q/{i:03d}", 5.0)
    blob = m.to_bytes()
    dense = n * 8067 * 8
    assert dense <= (4 << 20) + 32 * len(blob)  # within the bound
    assert len(blob) < dense / 20  # 1.1 MB: 17 sketches whole, the rest windows
    assert ms.Metrics.from_bytes(blob).compute() == m.compute()
    header, body = _split(blob)
    state = body[: n * al.NCOL * 8]
    windows = np.zeros(2 * n).astype("<f8").tobytes()
    with pytest.raises(ms.CodecError, match="declare sketches"):
        ms.Metrics.from_bytes(_join(header, state + windows))
    few = ms.Metrics({"q/*": ms.Spec("p50")})
    for i in range(20):
        few.record(f"q/{i:03d}", 5.0)
    assert len(few.to_bytes()) < 20 * 8067 * 8 / 10  # under the bound: windows only


def test_infinite_and_huge_windows_raise_codec_error_and_no_warning() -> None:
    import warnings

    blob = _sketch_metrics(16.0, 4096.0).to_bytes()
    header, body = _split(blob)
    rows = np.frombuffer(body, dtype="<f8").copy()
    at = len(header["slots"]) * al.NCOL
    for bad in [(np.inf, -np.inf), (-np.inf, np.inf), (np.inf, np.inf), (1e308, 1e308)]:
        rows[at : at + 2] = bad
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # before: RuntimeWarning from inf - inf
            with pytest.raises(ms.CodecError, match="window"):
                ms.Metrics.from_bytes(_join(header, rows.tobytes()))


def test_only_headers_of_decoded_blobs_are_kept() -> None:
    """A header is kept for later decodes once a blob of it decoded: rejected blobs (a
    hostile body behind a well-formed header) leave nothing behind."""
    m = ms.Metrics({"kept/x": ms.Spec("max")})
    m.record("kept/x", 1.0)
    header, body = _split(m.to_bytes())
    text = json.dumps(header).encode()
    with pytest.raises(ms.CodecError):
        ms.Metrics.from_bytes(_join(header, body[:-8]))
    assert codec._HEADERS.get(text) is None
    assert ms.Metrics.from_bytes(_join(header, body)).compute() == {"kept/x": 1.0}
    assert codec._HEADERS.get(text) is not None


def _mutations(header: dict[str, Any], body: bytes) -> list[tuple[str, dict[str, Any], bytes]]:
    out = []

    def variant(label: str, **changes: Any) -> None:
        h = json.loads(json.dumps(header))
        h.update(changes)
        out.append((label, h, body))

    variant("slots not a list", slots={"a": 1})
    variant("slot entry malformed", slots=[["x"]])
    variant("slot name not a string", slots=[[1, ms.Spec().to_json()]])
    variant("empty name", slots=[["", ms.Spec().to_json()], *header["slots"][1:]])
    variant("repeated name", slots=[header["slots"][0], header["slots"][0], *header["slots"][2:]])
    variant("bad spec json", slots=[[header["slots"][0][0], "not json"], *header["slots"][1:]])
    variant(
        "unknown statistic",
        slots=[
            [header["slots"][0][0], '[["median"],"exact",null,"propagate",0.01]'],
            *header["slots"][1:],
        ],
    )
    variant("spec wrong arity", slots=[[header["slots"][0][0], "[1,2]"], *header["slots"][1:]])
    variant("more slots than rows", slots=[*header["slots"], ["extra", ms.Spec().to_json()]])
    variant("fewer slots than rows", slots=header["slots"][:-1])
    variant("sketch cells huge", sketch=[[s, 10**12] for s, _ in header["sketch"]])
    variant("sketch cells negative", sketch=[[s, -5] for s, _ in header["sketch"]])
    variant("sketch missing", sketch=[])
    variant("sketch on a plain metric", sketch=[[0, 8067], *header["sketch"]])
    variant("agg rows huge", agg=[[s, 10**15] for s, _ in header["agg"]])
    variant("agg missing", agg=[])
    variant("bool instead of int", agg=[[True, 1]])
    variant("rules malformed", rules=[["x"]])
    variant("rules bad spec", rules=[["x", '["mean"]']])
    variant("header not an object", **{})
    out[-1] = ("header is a list", [], body)  # type: ignore[assignment]
    out.append(("body too short", header, body[:-8]))
    out.append(("body too long", header, body + b"\0" * 8))
    return out


def test_hostile_headers_with_valid_checksums_raise_codec_error() -> None:
    header, body = _split(_rich().to_bytes())
    for label, h, b in _mutations(header, body):
        with pytest.raises(ms.CodecError):
            ms.Metrics.from_bytes(_join(h, b))
        assert label


def test_hostile_lengths_do_not_allocate() -> None:
    header, body = _split(_rich().to_bytes())
    head = json.dumps(header).encode()
    for head_len, body_len in [(2**32 - 1, 0), (len(head), 2**63), (0, len(body))]:
        blob = HEAD.pack(b"MSYN", 1, 0, head_len, body_len) + head + body
        blob += struct.pack("<I", zlib.crc32(blob))
        with pytest.raises(ms.CodecError):
            ms.Metrics.from_bytes(blob)


def test_invalid_utf8_and_deep_json_raise_codec_error() -> None:
    for head in [b"\xff\xfe\xfd", b"[" * 100_000 + b"]" * 100_000, b"{}", b"null"]:
        blob = codec.frame(head, b"", version=1)
        with pytest.raises(ms.CodecError):
            ms.Metrics.from_bytes(blob)


def test_decoded_object_is_independent() -> None:
    m = _rich()
    blob = m.to_bytes()
    back = ms.Metrics.from_bytes(blob)
    back.record("len", 1e6)
    back.reset()
    assert m.to_bytes() == blob


def test_a_huge_or_fractional_drop_or_rank_count_raises_and_merges_never_overflow() -> None:
    """Dropped-sample and rank counts are whole numbers up to 2**53: a blob claiming
    1e308 dropped samples on an ``across`` metric is refused (merging two decodes of it
    overflowed to inf with a RuntimeWarning, into a state no blob may hold); at the bound,
    merges stay finite and warn about nothing."""
    import warnings

    m = ms.Metrics({"a": ms.Spec(("mean", "max"), across="mean", nan="ignore")})
    m.record("a", [1.0, np.nan])
    header, body = _split(m.to_bytes())
    rows = np.frombuffer(body, dtype="<f8").copy()
    for bad in (1e308, 2.0**53 + 2, 1.5, np.inf):
        state = rows.copy()
        state[al.DROP] = bad
        with pytest.raises(ms.CodecError, match="'a' holds"):
            ms.Metrics.from_bytes(_join(header, state.tobytes()))
    state = rows.copy()
    state[al.DROP] = 2.0**53
    blob = _join(header, state.tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        merged = ms.merge([ms.Metrics.from_bytes(blob), ms.Metrics.from_bytes(blob)])
        assert merged.compute()["a/nan_dropped"] == 2.0**54
        assert ms.Metrics.from_bytes(blob).compute()["a/nan_dropped"] == 2.0**53
    other = ms.Metrics({"a": m.spec("a")})
    other.record("a", 2.0)
    m.merge(other)  # one finished rank in the aggregate
    header, body = _split(m.to_bytes())
    rows = np.frombuffer(body, dtype="<f8").copy()
    counts = al.NCOL + np.array([1, 5])  # each aggregate row: value, ranks, ...
    assert rows[counts].tolist() == [1.0, 1.0]
    for bad in (1e308, 0.5):
        state = rows.copy()
        state[counts] = bad
        with pytest.raises(ms.CodecError, match="'a' holds"):
            ms.Metrics.from_bytes(_join(header, state.tobytes()))
    state = rows.copy()
    state[counts] = 2.0**53
    blob = _join(header, state.tobytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ms.merge([ms.Metrics.from_bytes(blob), ms.Metrics.from_bytes(blob)]).compute()


# Written by metricsync at 3ca339d (format version 2): Metrics(); record("loss", 2.0, weight=0.5)
V2_WEIGHTED_MEAN = bytes.fromhex(
    "4d53594e020000006500000040000000000000007b2272756c6573223a5b5d2c22736c6f7473223a5b5b22"
    "6c6f7373222c225b5b5c226d65616e5c225d2c5c2265786163745c222c6e756c6c2c5c2270726f706167"
    "6174655c222c302e30315d225d5d2c22736b65746368223a5b5d2c22616767223a5b5d7d000000000000"
    "e03f000000000000f03f000000000000f0ff000000000000f0ff000000000000f0ff0000000000000000"
    "00000000000000000000000000000000850e11f1"
)


def test_a_version_2_blob_of_a_fractional_weight_total_decodes() -> None:
    """A version-2 blob (read "as unit weights", N = W) whose weight total is fractional
    is refused as a 'fractional count': an old checkpoint / Ray payload of a plain
    weighted mean no longer loads. 3ca339d decoded it to {'loss': 2.0}."""
    assert ms.Metrics.from_bytes(V2_WEIGHTED_MEAN).compute() == {"loss": 2.0}


def test_a_version_2_blob_loads_through_state_dict_and_pickle() -> None:
    m = ms.Metrics()
    m.load_state_dict({"metricsync": 1, "data": V2_WEIGHTED_MEAN})
    assert m.compute() == {"loss": 2.0}
    assert pickle.loads(pickle.dumps(ms.Metrics.from_bytes(V2_WEIGHTED_MEAN))).compute() == {
        "loss": 2.0
    }
