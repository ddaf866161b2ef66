"""Text output of the log tools: tables that fit a width (wrapped into blocks that repeat the
first column), CSV and JSON.

>>> print(render_table([(1, {"a": 0.5, "b": 2.0})], ["a", "b"], {}, width=10))
step    a
----  ---
   1  0.5
<BLANKLINE>
step  b
----  -
   1  2
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

from .._log._logfile import encode_value
from .._state._formatting import format_value

__all__ = [
    "GrowingTable",
    "csv_header",
    "csv_rows",
    "json_item",
    "layout_blocks",
    "render_table",
    "render_transposed",
    "terminal_width",
]

_GAP = "  "


def terminal_width(stream: TextIO | None = None) -> int | None:
    """Columns of the terminal ``stream`` (default stdout) writes to; None when unlimited.

    A terminal reports its width; otherwise ``$COLUMNS`` is used when set;
    output to a file or a pipe is not wrapped.

    >>> import io
    >>> terminal_width(io.StringIO()) is None or "COLUMNS" in os.environ
    True
    """
    stream = stream if stream is not None else sys.stdout
    columns = os.environ.get("COLUMNS", "").strip()
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return max(20, shutil.get_terminal_size().columns)
    if columns.isdigit():
        return max(20, int(columns))
    return None


def layout_blocks(widths: Sequence[int], width: int | None, sticky: int = 1) -> list[list[int]]:
    """Split columns ``sticky..`` into blocks whose lines fit ``width`` (each block repeats the first ``sticky``).

    A column wider than ``width`` on its own still gets a block.

    >>> layout_blocks([4, 5, 5, 5], 18)
    [[0, 1, 2], [0, 3]]
    >>> layout_blocks([4, 5, 5, 5], None)
    [[0, 1, 2, 3]]
    """
    first = list(range(sticky))
    base = sum(widths[:sticky]) + len(_GAP) * max(0, sticky - 1)
    blocks: list[list[int]] = []
    current: list[int] = []
    used = base
    for index in range(sticky, len(widths)):
        need = len(_GAP) + widths[index]
        if current and width is not None and used + need > width:
            blocks.append(first + current)
            current, used = [], base
        current.append(index)
        used += need
    if current or not blocks:
        blocks.append(first + current)
    return blocks


def _grid(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int | None, left: bool = False
) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    out: list[str] = []
    for block in layout_blocks(widths, width):
        if out:
            out.append("")
        block_widths = [widths[i] for i in block]
        out.append(_join([header[i] for i in block], block_widths, left))
        out.append(_join(["-" * w for w in block_widths], block_widths, left))
        out.extend(_join([row[i] for i in block], block_widths, left) for row in rows)
    return "\n".join(out)


def _join(cells: Sequence[str], widths: Sequence[int], left: bool) -> str:
    return _GAP.join(
        cell.ljust(w) if left and i == 0 else cell.rjust(w)
        for i, (cell, w) in enumerate(zip(cells, widths))
    )


def _cell(values: Mapping[str, float], key: str, formats: Mapping[str, str | None]) -> str:
    return format_value(values[key], formats.get(key)) if key in values else "-"


def render_table(
    steps: Sequence[tuple[int, Mapping[str, float]]],
    keys: Sequence[str],
    formats: Mapping[str, str | None],
    width: int | None = None,
) -> str:
    """Steps as rows, metrics as right-aligned columns, wrapped into blocks that fit ``width``.

    Values use their stored format (adaptive when None); a metric missing at
    a step shows ``-``.

    >>> print(render_table([(1, {"a": 0.5}), (20, {"b": 1e-5})], ["a", "b"], {"a": ".1%"}))
    step      a         b
    ----  -----  --------
       1  50.0%         -
      20      -  1.00e-05
    """
    header = ["step", *keys]
    rows = [[str(step)] + [_cell(values, k, formats) for k in keys] for step, values in steps]
    return _grid(header, rows, width)


def render_transposed(
    steps: Sequence[tuple[int, Mapping[str, float]]],
    keys: Sequence[str],
    formats: Mapping[str, str | None],
    width: int | None = None,
) -> str:
    """Metrics as rows, one column per step: the view for one step's many keys.

    >>> print(render_transposed([(7, {"loss": 0.25, "lr": 3e-4})], ["loss", "lr"], {}))
    key          7
    ----  --------
    loss      0.25
    lr    3.00e-04
    """
    header = ["key", *(str(step) for step, _ in steps)]
    rows = [[key] + [_cell(values, key, formats) for _, values in steps] for key in keys]
    return _grid(header, rows, width, left=True)


def render_rows(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None
) -> str:
    """A table of ready-made cells, the first column left-aligned (used by ``compare``).

    >>> print(render_rows(["key", "A"], [["loss", "0.5"]]))
    key     A
    ----  ---
    loss  0.5
    """
    return _grid(header, rows, width, left=True)


class GrowingTable:
    """A table printed a few rows at a time (``show --follow``): the header again only when needed.

    Columns keep their widths (they only widen); the header and rule are
    printed again when the keys change or a column widens. A table wider
    than ``width`` prints each batch as wrapped blocks.

    >>> import io
    >>> out = io.StringIO()
    >>> table = GrowingTable({}, None, out)
    >>> table.add([(1, {"loss": 0.5})], ["loss"])
    >>> table.add([(2, {"loss": 0.25})], ["loss"])
    >>> print(out.getvalue(), end="")
    step  loss
    ----  ----
       1   0.5
       2  0.25
    """

    def __init__(self, formats: Mapping[str, str | None], width: int | None, out: TextIO) -> None:
        self.formats, self.width, self.out = formats, width, out
        self.keys: list[str] = []
        self.widths: list[int] = []

    def add(self, steps: Sequence[tuple[int, Mapping[str, float]]], keys: Sequence[str]) -> None:
        """Print ``steps`` under ``keys``."""
        if not steps:
            return
        header = ["step", *keys]
        rows = [[str(s)] + [_cell(v, k, self.formats) for k in keys] for s, v in steps]
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
        same = list(keys) == self.keys
        if same:
            widths = [max(a, b) for a, b in zip(widths, self.widths)]
        lines: list[str] = []
        if len(layout_blocks(widths, self.width)) > 1:
            lines = ([""] if self.keys else []) + _grid(header, rows, self.width).split("\n")
            self.keys, self.widths = [], []  # the next batch prints its header again
        else:
            if not same or widths != self.widths:
                lines += [""] if self.keys else []
                lines += [
                    _join(header, widths, False),
                    _join(["-" * w for w in widths], widths, False),
                ]
            lines += [_join(row, widths, False) for row in rows]
            self.keys, self.widths = list(keys), widths
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()


def csv_header(keys: Sequence[str]) -> str:
    """The CSV header line (``step`` then the keys).

    >>> csv_header(["loss", "a,b"])
    'step,loss,"a,b"'
    """
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(["step", *keys])
    return buffer.getvalue()


def csv_rows(steps: Iterable[tuple[int, Mapping[str, float]]], keys: Sequence[str]) -> str:
    """CSV lines of ``steps``: full-precision values (``repr``), empty where a key is missing.

    >>> print(csv_rows([(1, {"loss": 0.1}), (2, {"loss": float("nan")})], ["loss"]))
    1,0.1
    2,nan
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for step, values in steps:
        writer.writerow([step, *(repr(values[k]) if k in values else "" for k in keys)])
    return buffer.getvalue().rstrip("\n")


def json_item(step: int, values: Mapping[str, float], keys: Sequence[str]) -> str:
    """One step as the JSON object ``{"step": N, "values": {...}}`` (NaN and infinities as strings).

    >>> json_item(3, {"loss": 0.5, "gn": float("inf"), "x": 1.0}, ["loss", "gn"])
    '{"step": 3, "values": {"loss": 0.5, "gn": "inf"}}'
    """
    chosen = {k: encode_value(values[k]) for k in keys if k in values}
    return json.dumps({"step": step, "values": chosen}, allow_nan=False)
