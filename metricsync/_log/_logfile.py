"""The JSONL metric log that the ``jsonl`` backend writes: its records, encoded and parsed.

``metrics.jsonl`` holds header records (key formats; a *complete* one every few MiB) and one
step record per logged step, strict JSON with non-finite values as strings; verl's file-logger
log reads as one without headers. Parsing is bounded.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
>>> _ = path.write_text(
...     '{"metricsync": 1, "formats": {"loss": ".3f"}, "time": 0}\\n'
...     '{"step": 1, "time": 0, "values": {"loss": 0.5, "gn": "inf"}}\\n'
... )
>>> [parse_record(line).values for line in path.read_bytes().splitlines()]
[{}, {'loss': 0.5, 'gn': inf}]
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

from .._state._formatting import check_fmt
from ._logkeys import MAX_KEY_CHARS, clean_key, describe_change, needs_cleaning, read_key

__all__ = [
    "FORMAT_VERSION",
    "LOG_NAME",
    "MAX_LINE_BYTES",
    "Record",
    "TornLine",
    "decode_value",
    "encode_value",
    "header_record",
    "parse_record",
    "resolve_log_path",
    "select_keys",
    "step_record",
]

FORMAT_VERSION = 1
"""Version number written in every header record's ``"metricsync"`` field."""

LOG_NAME = "metrics.jsonl"
"""File name of the log inside a run directory."""

MAX_LINE_BYTES = 64 * 1024 * 1024
"""Longest line a reader accepts (a step of 100,000 metrics takes about 4 MiB)."""

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_JSON_CONSTANTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

Formats: TypeAlias = "dict[str, str | None]"
Steps: TypeAlias = "list[tuple[int, dict[str, float]]]"


class TornLine(ValueError):
    """A line that is not complete JSON: what a process killed mid-write leaves as the last line."""


class Record:
    """One parsed line: a header (``formats``, ``complete``) or a step (``step``, ``values``).

    ``renamed`` says, one line per key, which keys were read under another
    name (see :mod:`metricsync._log._logkeys`).

    >>> parse_record(b'{"step": 2, "values": {"a": 1}}')
    Record(step=2, values={'a': 1.0})
    """

    __slots__ = ("complete", "formats", "renamed", "step", "values")

    def __init__(
        self,
        *,
        step: int | None = None,
        values: dict[str, float] | None = None,
        formats: Formats | None = None,
        complete: bool = False,
    ) -> None:
        self.step = step
        self.values = values if values is not None else {}
        self.formats = formats if formats is not None else {}
        self.complete = complete
        self.renamed: tuple[str, ...] = ()

    @property
    def is_header(self) -> bool:
        """True for a header record, False for a step record."""
        return self.step is None

    def __repr__(self) -> str:
        if self.step is None:
            return f"Record(formats={self.formats!r}, complete={self.complete})"
        return f"Record(step={self.step}, values={self.values!r})"


def encode_value(value: float) -> float | str:
    """A float as strict JSON allows it: NaN and infinities become strings.

    >>> encode_value(0.5), encode_value(float("nan")), encode_value(float("-inf"))
    (0.5, 'nan', '-inf')
    """
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def decode_value(raw: object) -> float:
    """Inverse of :func:`encode_value`; raises ``ValueError`` on anything else.

    An integer too large for a float64 is a ``ValueError`` too (not an
    ``OverflowError``).

    >>> decode_value(2), decode_value("inf")
    (2.0, inf)
    >>> decode_value(10**400)
    Traceback (most recent call last):
    ...
    ValueError: expected a number that fits a float64, got an integer of 401 digits
    """
    if isinstance(raw, bool):
        raise ValueError(f"expected a number or 'nan'/'inf'/'-inf', got {raw!r}")
    if isinstance(raw, float):
        return raw
    if isinstance(raw, int):
        try:
            return float(raw)
        except OverflowError:
            digits = len(str(abs(raw)))
            raise ValueError(
                f"expected a number that fits a float64, got an integer of {digits} digits"
            ) from None
    if isinstance(raw, str) and raw in _NONFINITE:
        return _NONFINITE[raw]
    shown = repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:40] + "..."
    raise ValueError(f"expected a number or 'nan'/'inf'/'-inf', got {shown}")


def resolve_log_path(path: str | os.PathLike[str]) -> Path:
    """The JSONL file for ``path``: the path itself, or ``path/metrics.jsonl`` for a run dir.

    >>> resolve_log_path("runs/x/metrics.jsonl").name
    'metrics.jsonl'
    """
    p = Path(path)
    return p / LOG_NAME if p.is_dir() else p


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def parse_record(line: bytes) -> Record:
    """Parse one line (without its ``\\n``) into a :class:`Record`.

    Raises :class:`TornLine` when the line is not complete JSON, and
    ``ValueError`` for any other problem (nesting too deep, a number beyond a
    float64, a bad format spec, an unknown layout), never another exception.
    Keys are read as :func:`~metricsync._log._logkeys.read_key` makes them (a lone
    surrogate escaped, a key over 1024 characters shortened; a name another
    key of the record holds cleaned again, so no value is dropped), each
    change noted in the record's ``renamed``.

    >>> parse_record(b'{"metricsync": 1, "formats": {"lr": ".2e"}, "complete": true}')
    Record(formats={'lr': '.2e'}, complete=True)
    >>> parse_record(b'{"step": 7, "data": {"loss": NaN, "note": "text"}}')   # verl
    Record(step=7, values={'loss': nan})
    >>> parse_record(b'{"metricsync": 1, "formats": {"a": "999999.3f"}}')
    Traceback (most recent call last):
    ...
    ValueError: format of 'a': expected a format spec with widths and precisions of at most 100, got '999999.3f'
    """
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"expected a line of at most {MAX_LINE_BYTES} bytes, got {len(line)}")
    constants: list[str] = []

    def constant(name: str) -> float:
        constants.append(name)
        return _JSON_CONSTANTS[name]

    try:
        record = json.loads(line.decode("utf-8"), parse_constant=constant)
    except RecursionError:
        raise ValueError("expected a flat JSON object, got nesting too deep to parse") from None
    except UnicodeDecodeError as exc:
        raise TornLine(f"not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise TornLine(f"not complete JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    # A lone surrogate only comes from a \\u escape; a long key only in a long line.
    suspect = len(line) > MAX_KEY_CHARS or b"\\u" in line
    if "metricsync" in record:
        if constants:
            raise ValueError(f"expected strict JSON, got the constant {constants[0]}")
        return _cleaned(_header(record), suspect)
    if "step" in record:
        step = record["step"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"expected an integer 'step', got {_short(repr(step))}")
        if "values" in record:
            if constants:
                raise ValueError(f"expected strict JSON, got the constant {constants[0]}")
            values = _values(record["values"], "values", strict=True)
        elif "data" in record:
            values = _values(record["data"], "data", strict=False)
        else:
            raise ValueError("expected a step record to hold 'values' (or verl's 'data')")
        return _cleaned(Record(step=step, values=values), suspect)
    raise ValueError("expected a header ('metricsync') or step ('step') record")


def _cleaned(record: Record, suspect: bool) -> Record:
    """``record`` with its keys read by :func:`~metricsync._log._logkeys.read_key`, changes noted.

    A cleaned name that another key of the record holds already (a lone
    surrogate key beside its escaped text) is cleaned again until it is free,
    so both values are kept, and the note says so.
    """
    if not suspect:
        return record
    keys = record.formats if record.step is None else record.values
    if not needs_cleaning(keys):
        return record
    names = {key: read_key(key) for key in keys}
    if all(name == key for key, name in names.items()):
        return record
    taken = {key for key, name in names.items() if name == key}
    notes = []
    for key, name in names.items():
        if name == key:
            continue
        clash = name if name in taken else None
        for _ in range(len(keys) + 1):
            if name not in taken:
                break
            name = clean_key(name)
        else:
            raise ValueError(f"keys {key!r:.80} and {clash!r:.80} clean to one name")
        taken.add(name)
        names[key] = name
        note = describe_change(key, name)
        if clash is not None:
            note += f", as the log holds both this key and {clash!r:.80}"
        notes.append(note)
    cleaned: dict[str, Any] = {names[key]: item for key, item in keys.items()}
    if record.step is None:
        record.formats = cleaned
    else:
        record.values = cleaned
    record.renamed = tuple(notes)
    return record


def _header(record: dict[str, Any]) -> Record:
    version = record["metricsync"]
    if isinstance(version, bool) or not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"expected header version <= {FORMAT_VERSION}, got {_short(repr(version))}"
        )
    formats = record.get("formats", {})
    if not isinstance(formats, dict):
        raise ValueError(f"expected 'formats' to be an object, got {type(formats).__name__}")
    for key, fmt in formats.items():
        if fmt is not None and not isinstance(fmt, str):
            raise ValueError(f"format of {_short(key)!r}: expected a string or null, got {fmt!r}")
        try:
            check_fmt(fmt)
        except ValueError as exc:
            raise ValueError(f"format of {_short(key)!r}: {exc}") from None
    return Record(formats=formats, complete=record.get("complete") is True)


def _values(raw: object, field: str, *, strict: bool) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ValueError(f"expected {field!r} to be an object, got {type(raw).__name__}")
    values: dict[str, float] = {}
    for key, value in raw.items():
        if type(value) is float:  # nearly every value: decode_value would return it as is
            values[key] = value
            continue
        if not strict and (
            isinstance(value, bool)
            or (
                not isinstance(value, (int, float))
                and not (isinstance(value, str) and value in _NONFINITE)
            )
        ):
            continue  # verl logs strings and lists next to its numbers
        try:
            values[key] = decode_value(value)
        except ValueError as exc:
            raise ValueError(f"value of {_short(key)!r}: {exc}") from None
    return values


def header_record(
    formats: Mapping[str, str | None], now: float, *, complete: bool = False
) -> dict[str, Any]:
    """The header record holding ``formats`` (marked complete when it holds every key).

    >>> header_record({"loss": ".3f"}, 0.0)
    {'metricsync': 1, 'formats': {'loss': '.3f'}, 'time': 0.0}
    >>> header_record({"loss": ".3f"}, 0.0, complete=True)["complete"]
    True
    """
    record: dict[str, Any] = {"metricsync": FORMAT_VERSION, "formats": dict(formats), "time": now}
    if complete:
        record["complete"] = True
    return record


def step_record(step: int, values: Mapping[str, float], now: float) -> dict[str, Any]:
    """The step record for ``values`` at ``step``, NaN and infinities encoded.

    >>> step_record(3, {"gn": float("inf")}, 0.0)
    {'step': 3, 'time': 0.0, 'values': {'gn': 'inf'}}
    """
    return {"step": step, "time": now, "values": {k: encode_value(v) for k, v in values.items()}}


def match_keys(available: Iterable[str], keys: str | None) -> list[str]:
    """The keys of ``available`` (kept in order) that ``keys`` selects.

    ``keys`` is a glob (``fnmatch``, case-sensitive) or several separated by
    commas; the whole of ``keys`` is a glob too, so a key holding a comma can be
    named. None selects everything. No match raises ``ValueError`` listing what
    is available.

    >>> match_keys(["loss", "timing/fwd", "timing/bwd"], "timing/*")
    ['timing/fwd', 'timing/bwd']
    >>> match_keys(["acc,top1", "acc,top5", "loss"], "acc,top1"), match_keys(["a,b", "c"], "c,d")
    (['acc,top1'], ['c'])
    """
    available = list(dict.fromkeys(available))
    if keys is None:
        return available
    patterns = [p.strip() for p in keys.split(",") if p.strip()] + [keys.strip()]
    chosen = [k for k in available if any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    if not chosen:
        shown = ", ".join(map(_short, available[:20])) + (", ..." if len(available) > 20 else "")
        raise ValueError(f"no metric matches {keys!r}; available: {shown or 'none'}")
    return chosen


def select_keys(steps: Iterable[tuple[int, Mapping[str, float]]], keys: str | None) -> list[str]:
    """Metric keys of ``steps`` (in order of first appearance) matching ``keys`` (see :func:`match_keys`).

    >>> steps = [(1, {"loss": 1.0, "timing/fwd": 2.0}), (2, {"timing/bwd": 3.0})]
    >>> select_keys(steps, "timing/*"), select_keys(steps, "loss,*bwd")
    (['timing/fwd', 'timing/bwd'], ['loss', 'timing/bwd'])
    """
    return match_keys((key for _, values in steps for key in values), keys)
