"""Reading (and encoding for) the JSONL metric log that the ``jsonl`` backend writes.

Layout of ``run_dir/metrics.jsonl``: one strict JSON object per line (UTF-8,
``\\n``-terminated, no ``NaN``/``Infinity`` literals):

- a **header** record ``{"metricsync": 1, "formats": {"loss": ".3f", "lr": null},
  "time": 1700000000.0}`` before the first step, and again whenever a key
  appears or changes format (it then holds only the new or changed keys);
  readers merge the formats of all headers, later ones winning;
- one **step** record per logged step,
  ``{"step": 3, "time": 1700000000.5, "values": {"loss": 0.25, "lr": "nan"}}``;
  ``time`` is ``time.time()`` at logging; NaN and infinities are stored as the
  strings ``"nan"``, ``"inf"`` and ``"-inf"``.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
>>> _ = path.write_text(
...     '{"metricsync": 1, "formats": {"loss": ".3f"}, "time": 0}\\n'
...     '{"step": 1, "time": 0, "values": {"loss": 0.5, "gn": "inf"}}\\n'
... )
>>> read_jsonl(path)
({'loss': '.3f'}, [(1, {'loss': 0.5, 'gn': inf})])
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

__all__ = [
    "FORMAT_VERSION",
    "decode_value",
    "encode_value",
    "read_jsonl",
    "resolve_log_path",
    "select_keys",
]

FORMAT_VERSION = 1
"""Version number written in every header record's ``"metricsync"`` field."""

LOG_NAME = "metrics.jsonl"

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

Formats: TypeAlias = "dict[str, str | None]"
Steps: TypeAlias = "list[tuple[int, dict[str, float]]]"


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

    >>> decode_value(2), decode_value("inf")
    (2.0, inf)
    """
    if isinstance(raw, bool):
        raise ValueError(f"expected a number or 'nan'/'inf'/'-inf', got {raw!r}")
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str) and raw in _NONFINITE:
        return _NONFINITE[raw]
    raise ValueError(f"expected a number or 'nan'/'inf'/'-inf', got {raw!r}")


def resolve_log_path(path: str | os.PathLike[str]) -> Path:
    """The JSONL file for ``path``: the path itself, or ``path/metrics.jsonl`` for a run dir.

    >>> resolve_log_path("runs/x/metrics.jsonl").name
    'metrics.jsonl'
    """
    p = Path(path)
    return p / LOG_NAME if p.is_dir() else p


def _raise_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


@dataclass
class ScanResult:
    """Everything :func:`scan_jsonl` learned about a log file."""

    formats: Formats = field(default_factory=dict)
    steps: Steps = field(default_factory=list)
    headers: int = 0  # number of header records
    valid_end: int = 0  # byte offset just past the last valid line
    torn: str | None = None  # why the last line was dropped, if it was
    needs_newline: bool = False  # the last valid line lacks its "\n"


def _parse_record(line: bytes, result: ScanResult) -> None:
    record = json.loads(line.decode("utf-8"), parse_constant=_raise_constant)
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "metricsync" in record:
        version = record["metricsync"]
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ValueError(f"expected header version <= {FORMAT_VERSION}, got {version!r}")
        formats = record.get("formats", {})
        if not isinstance(formats, dict) or not all(
            isinstance(f, str) or f is None for f in formats.values()
        ):
            raise ValueError(f"expected 'formats' to map keys to strings or null, got {formats!r}")
        result.formats.update(formats)
        result.headers += 1
    elif "step" in record:
        step, values = record["step"], record.get("values")
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"expected an integer 'step', got {step!r}")
        if not isinstance(values, dict):
            raise ValueError(f"expected 'values' to be an object, got {values!r}")
        result.steps.append((step, {str(k): decode_value(v) for k, v in values.items()}))
    else:
        raise ValueError("expected a header ('metricsync') or step ('step') record")


def scan_jsonl(path: str | os.PathLike[str]) -> ScanResult:
    """Parse a log file, noting where its valid part ends (used to resume writing).

    An invalid last line is recorded in ``torn`` instead of raising; an
    invalid line followed by valid ones raises ``ValueError`` with its number.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "m.jsonl"
    >>> _ = path.write_bytes(b'{"step": 1, "values": {}}\\n{"step": 2, "val')
    >>> r = scan_jsonl(path)
    >>> r.steps, r.valid_end, r.torn is not None
    ([(1, {})], 26, True)
    """
    data = Path(path).read_bytes()
    result = ScanResult()
    lines = data.split(b"\n")
    # The last element is whatever follows the final "\n": empty for a clean file.
    last_index = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    offset = 0
    for index, raw in enumerate(lines):
        end = offset + len(raw) + (1 if index < len(lines) - 1 else 0)
        if raw.strip():
            try:
                _parse_record(raw, result)
            except (ValueError, UnicodeDecodeError) as exc:
                if index == last_index:
                    result.torn = f"line {index + 1}: {exc}"
                    return result
                raise ValueError(f"{path}: line {index + 1} is not a valid record: {exc}") from None
            result.needs_newline = index == len(lines) - 1
        result.valid_end = end
        offset = end
    return result


def read_jsonl(path: str | os.PathLike[str]) -> tuple[Formats, Steps]:
    """Read a metricsync JSONL log: ``(formats, [(step, values), ...])``.

    ``formats`` merges every header (later headers win); steps come in file
    order, values as floats (NaN and infinities restored). A torn or invalid
    last line (a process killed mid-write) is skipped with a warning; an
    invalid line elsewhere raises ``ValueError`` naming the line; a missing
    file raises ``FileNotFoundError``. ``path`` may also be a run directory.

    >>> import tempfile
    >>> from metricsync._tracker import Tracker
    >>> run_dir = tempfile.mkdtemp()
    >>> with Tracker(run_dir=run_dir) as tracker:
    ...     tracker.log({"loss": float("nan")}, step=1)
    >>> read_jsonl(run_dir)
    ({'loss': None}, [(1, {'loss': nan})])
    """
    file = resolve_log_path(path)
    result = scan_jsonl(file)
    if result.torn is not None:
        warnings.warn(
            f"{file}: skipping a torn last line ({result.torn})", RuntimeWarning, stacklevel=2
        )
    return result.formats, result.steps


def header_record(formats: Mapping[str, str | None], now: float) -> dict[str, Any]:
    """The header record holding ``formats``.

    >>> header_record({"loss": ".3f"}, 0.0)
    {'metricsync': 1, 'formats': {'loss': '.3f'}, 'time': 0.0}
    """
    return {"metricsync": FORMAT_VERSION, "formats": dict(formats), "time": now}


def step_record(step: int, values: Mapping[str, float], now: float) -> dict[str, Any]:
    """The step record for ``values`` at ``step``, NaN and infinities encoded.

    >>> step_record(3, {"gn": float("inf")}, 0.0)
    {'step': 3, 'time': 0.0, 'values': {'gn': 'inf'}}
    """
    return {"step": step, "time": now, "values": {k: encode_value(v) for k, v in values.items()}}


def select_keys(steps: Iterable[tuple[int, Mapping[str, float]]], keys: str | None) -> list[str]:
    """Metric keys of ``steps`` (in order of first appearance) matching ``keys``.

    ``keys`` is a glob (``fnmatch``, case-sensitive) or several separated by
    commas; None selects everything. No match raises ``ValueError`` listing
    what is available.

    >>> steps = [(1, {"loss": 1.0, "timing/fwd": 2.0}), (2, {"timing/bwd": 3.0})]
    >>> select_keys(steps, "timing/*"), select_keys(steps, "loss,*bwd")
    (['timing/fwd', 'timing/bwd'], ['loss', 'timing/bwd'])
    """
    available = list(dict.fromkeys(key for _, values in steps for key in values))
    if keys is None:
        return available
    patterns = [p.strip() for p in keys.split(",") if p.strip()]
    chosen = [k for k in available if any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    if not chosen:
        shown = ", ".join(available[:20]) + (", ..." if len(available) > 20 else "")
        raise ValueError(f"no metric matches {keys!r}; available: {shown or 'none'}")
    return chosen
