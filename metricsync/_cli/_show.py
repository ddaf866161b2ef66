"""``metricsync show`` and ``metricsync compare``: logged steps as tables, CSV or JSON.

``show --last N`` reads from the end (its cost depends on N, not the file), a whole log streams
page by page, ``--follow`` tails the log by name.

>>> import tempfile, pathlib
>>> from metricsync._tracking._tracker import Tracker
>>> run_dir = pathlib.Path(tempfile.mkdtemp())
>>> with Tracker(run_dir=run_dir) as tracker:
...     for step in (1, 2, 3):
...         tracker.log({"loss": 1.0 / step, "lr": 3e-4}, step)
>>> show(run_dir, last=2, fmt="csv")
step,loss,lr
2,0.5,0.0003
3,0.3333333333333333,0.0003
0
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from .._log._logfile import Formats, match_keys, resolve_log_path
from .._log._logfollow import LogFollower
from .._log._logread import ReadStats, read_timeline, scan
from .._log._logtail import tail
from .._state._formatting import format_value
from ._progress import Progress
from ._render import (
    GrowingTable,
    csv_header,
    csv_rows,
    json_item,
    render_rows,
    render_table,
    render_transposed,
    terminal_width,
)

__all__ = ["FORMATS", "compare", "rank_keys", "show"]

FORMATS = ("table", "csv", "json")
PAGE_STEPS = 500  # steps per page when a whole log streams as a table
PROGRESS_BYTES = 16 << 20  # a progress bar for files from this size on (on a terminal)
_RANK_SUFFIXES = ("/max_rank", "/min_rank")


def log_file(run: str | os.PathLike[str]) -> Path:
    """The log of ``run`` (a run directory or a .jsonl file), which must exist."""
    path = resolve_log_path(run)
    if not path.is_file():
        if Path(run).is_dir():
            raise FileNotFoundError(2, "no metrics.jsonl in this run directory", str(run))
        raise FileNotFoundError(2, "no such file", str(path))
    return path


def rank_keys(available: Sequence[str], keys: str | None = None) -> list[str]:
    """The straggler view's keys: each ``NAME/max_rank``/``NAME/min_rank`` after its value.

    ``NAME/max`` (``NAME/min``) is shown before the rank that held it when
    the log has it; a single-statistic metric logs its value as ``NAME``, shown
    before its ranks. ``keys`` (globs) narrows the names.

    >>> rank_keys(["t/max", "t/max_rank", "loss", "t/min_rank", "u/max_rank"])
    ['t/max', 't/max_rank', 't/min_rank', 'u/max_rank']
    >>> rank_keys(["step", "step/max_rank", "step/min_rank"])
    ['step', 'step/max_rank', 'step/min_rank']
    """
    present = set(available)
    ranked = [k for k in available if k.endswith(_RANK_SUFFIXES)]
    if not ranked:
        raise ValueError(
            "no straggler keys in this log: expected keys NAME/max_rank or NAME/min_rank, "
            "which a spec that asks for the rank holding the extreme adds"
        )
    chosen: list[str] = []
    for key in ranked:
        name = key.rsplit("/", 1)[0]
        stats = {f"{name}/max", f"{name}/min"} & present
        value = key[: -len("_rank")] if stats else name  # no NAME/max, NAME/min: NAME itself
        chosen.extend(k for k in (value, key) if k in present and k not in chosen)
    if keys is not None:
        names = {k.rsplit("/", 1)[0] for k in chosen}
        wanted = set(match_keys([*chosen, *names], keys))
        chosen = [k for k in chosen if k in wanted or k.rsplit("/", 1)[0] in wanted]
        if not chosen:
            raise ValueError(f"no straggler key matches {keys!r}")
    return chosen


def _choose(available: Sequence[str], keys: str | None, ranks: bool) -> list[str]:
    return rank_keys(available, keys) if ranks else match_keys(available, keys)


def _warn_repeats(path: Path, superseded: int, overwritten: int) -> None:
    """Warn of records logged again for an earlier step (a resumed run?), or of keys logged
    again at their step (a trainer's train and eval rows share a step and keys)."""
    if superseded:
        warnings.warn(
            f"{path}: {superseded + overwritten} record(s) logged again for an earlier or equal "
            "step (a resumed run?); showing the values logged last",
            UserWarning,
            stacklevel=3,
        )
    elif overwritten:
        warnings.warn(
            f"{path}: {overwritten} record(s) logged again at a step that had those keys; "
            "showing the values logged last",
            UserWarning,
            stacklevel=3,
        )


def _warn_torn(path: Path, torn: str | None) -> None:
    if torn is not None:
        warnings.warn(f"{path}: skipping a torn last line ({torn})", RuntimeWarning, stacklevel=3)


class _Emitter:
    """Writes pages of steps in one output format."""

    def __init__(
        self,
        fmt: str,
        keys: Sequence[str],
        formats: Formats,
        *,
        transpose: bool,
        width: int | None,
        out: TextIO,
        jsonl: bool = False,
    ) -> None:
        self.fmt, self.keys, self.formats = fmt, list(keys), formats
        self.transpose, self.width, self.out, self.jsonl = transpose, width, out, jsonl
        self.pages = 0

    def page(self, steps: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        if not steps:
            return
        out = self.out
        if self.fmt == "csv":
            if self.pages == 0:
                out.write(csv_header(self.keys) + "\n")
            out.write(csv_rows(steps, self.keys) + "\n")
        elif self.fmt == "json":
            items = [json_item(step, values, self.keys) for step, values in steps]
            if self.jsonl:
                out.write("".join(item + "\n" for item in items))
            else:
                out.write(("[\n" if self.pages == 0 else ",\n") + ",\n".join(items))
        else:
            render = render_transposed if self.transpose else render_table
            out.write(
                ("\n" if self.pages else "") + render(steps, self.keys, self.formats, self.width)
            )
            out.write("\n")
        self.pages += 1
        out.flush()

    def close(self) -> None:
        if self.fmt == "json" and not self.jsonl:
            self.out.write("[]\n" if self.pages == 0 else "\n]\n")
            self.out.flush()


def _pages(
    steps: Iterable[tuple[int, dict[str, float]]], size: int
) -> Iterator[list[tuple[int, dict[str, float]]]]:
    page: list[tuple[int, dict[str, float]]] = []
    for item in steps:
        page.append(item)
        if len(page) == size:
            yield page
            page = []
    if page:
        yield page


def show(
    run: str | os.PathLike[str],
    *,
    keys: str | None = None,
    last: int | None = None,
    fmt: str = "table",
    transpose: bool = False,
    ranks: bool = False,
    follow: bool = False,
    interval: float = 1.0,
    width: int | None = None,
    out: TextIO | None = None,
    stats: ReadStats | None = None,
) -> int:
    """Print the steps of ``run`` (all, or the ``last`` N) as a table, CSV or JSON; return 0.

    ``width`` defaults to the terminal's (see
    :func:`~metricsync._cli._render.terminal_width`); ``stats`` counts what was
    read. With ``follow`` it then prints new steps as they are logged, until
    interrupted.
    """
    if fmt not in FORMATS:
        raise ValueError(f"expected a format among {', '.join(FORMATS)}, got {fmt!r}")
    out = out if out is not None else sys.stdout
    width = width if width is not None else terminal_width(out)
    path = log_file(run)
    if last == 0 and not follow:
        return 0
    if follow:
        return _follow(path, keys, last, fmt, transpose, ranks, interval, width, out, stats)
    if last is not None:
        found = tail(path, last, stats)
        _warn_torn(path, found.torn)
        if not found.steps:
            print(f"metricsync: {path} holds no steps yet", file=sys.stderr)
            return 0
        available = list(dict.fromkeys(k for _, values in found.steps for k in values))
        emitter = _Emitter(
            fmt,
            _choose(available, keys, ranks),
            found.formats,
            transpose=transpose,
            width=width,
            out=out,
        )
        emitter.page(found.steps)
        emitter.close()
        _warn_repeats(path, found.superseded, found.overwritten)
        return 0
    size = path.stat().st_size
    with Progress(size, "scanning", minimum=PROGRESS_BYTES) as bar:
        timeline = scan(path, stats, bar.update)
    _warn_torn(path, timeline.torn)
    if not timeline.steps:
        print(f"metricsync: {path} holds no steps yet", file=sys.stderr)
        return 0
    chosen = _choose(timeline.keys, keys, ranks)
    emitter = _Emitter(fmt, chosen, timeline.formats, transpose=transpose, width=width, out=out)
    reading = Progress(size, "reading", minimum=PROGRESS_BYTES)
    if out.isatty():
        reading.enabled = False  # the table goes to the same terminal
    with reading:
        for page in _pages(read_timeline(path, timeline, stats, reading.update), PAGE_STEPS):
            reading.clear()
            emitter.page(page)
    emitter.close()
    _warn_repeats(path, timeline.superseded, timeline.overwritten)
    return 0


def _follow(
    path: Path,
    keys: str | None,
    last: int | None,
    fmt: str,
    transpose: bool,
    ranks: bool,
    interval: float,
    width: int | None,
    out: TextIO,
    stats: ReadStats | None,
) -> int:
    """Print the last steps, then each new step as it is appended, until interrupted.

    Tables grow row by row; CSV keeps the columns it started with; JSON
    prints one object per line (JSON Lines), as the output never ends. The
    log is followed by name (:class:`~metricsync._log._logfollow.LogFollower`):
    after a rotation or a new run at the same path, the new file's steps
    follow, with a warning line.
    """
    found = tail(path, 10 if last is None else last, stats)
    formats = dict(found.formats)
    shown: list[str] = []
    table = GrowingTable(formats, width, out)
    emitter: _Emitter | None = None
    pending = list(found.steps)
    follower = LogFollower(path, found.end, found.identity, stats)
    try:
        while True:
            if pending:
                available = list(dict.fromkeys(k for _, values in pending for k in values))
                try:
                    chosen = _choose(available, keys, ranks)
                except ValueError:
                    chosen = []
                if fmt == "table" or emitter is None:  # CSV columns stay those of the start
                    shown.extend(k for k in chosen if k not in shown)
                if fmt == "table":
                    table.add(pending, shown)
                elif shown:
                    if emitter is None:
                        emitter = _Emitter(
                            fmt, shown, formats, transpose=False, width=width, out=out, jsonl=True
                        )
                    emitter.page(pending)
                pending = []
            time.sleep(interval)
            records, notes = follower.poll()
            for note in notes:
                print(f"metricsync: warning: {note}", file=sys.stderr, flush=True)
            for record in records:
                if record.step is None:
                    formats.update(record.formats)
                else:
                    pending.append((record.step, record.values))
    except KeyboardInterrupt:
        return 0
    finally:
        follower.close()


def _signed(value: float, fmt: str | None) -> str:
    """``value`` in ``fmt`` with one sign, next to its digits (a format may write its own
    ``+``, a space for it, or padding).

    >>> _signed(0.25, ".3f"), _signed(0.25, "+.3f"), _signed(-0.25, ".3f")
    ('+0.250', '+0.250', '-0.250')
    >>> _signed(0.25, "+8.3f"), _signed(0.25, "8.3f"), _signed(0.25, " .3f")
    ('  +0.250', '  +0.250', '+0.250')
    """
    text = format_value(value, fmt)
    if not (value > 0 and math.isfinite(value)) or "+" in text:
        return text
    digits = text.lstrip()
    pad = text[: max(len(text) - len(digits) - 1, 0)]  # the sign takes one padding place
    return pad + "+" + digits


def compare(
    run_a: str | os.PathLike[str],
    run_b: str | os.PathLike[str],
    *,
    step: int | None = None,
    keys: str | None = None,
    width: int | None = None,
    out: TextIO | None = None,
) -> int:
    """Print the last step (or ``step``) of two runs side by side with their differences; return 0.

    >>> import tempfile, pathlib
    >>> from metricsync._tracking._tracker import Tracker
    >>> a, b = pathlib.Path(tempfile.mkdtemp()), pathlib.Path(tempfile.mkdtemp())
    >>> with Tracker(run_dir=a) as ta, Tracker(run_dir=b) as tb:
    ...     ta.log({"loss": 0.5, "lr": 1e-4}, step=10)
    ...     tb.log({"loss": 0.4, "lr": 1e-4}, step=10)
    >>> compare(a, b, width=80)  # doctest: +ELLIPSIS
    A: .../metrics.jsonl at step 10
    B: .../metrics.jsonl at step 10
    key          A         B  B - A  change
    ----  --------  --------  -----  ------
    loss       0.5       0.4   -0.1  -20.0%
    lr    1.00e-04  1.00e-04      0   +0.0%
    0
    """
    out = out if out is not None else sys.stdout
    width = width if width is not None else terminal_width(out)
    sides = []
    for label, run in (("A", run_a), ("B", run_b)):
        path = log_file(run)
        found = tail(path, 1, at_step=step)
        _warn_torn(path, found.torn)
        if not found.steps:
            where = "no steps yet" if step is None else f"no step {step}"
            raise ValueError(f"{path} holds {where}")
        sides.append((label, path, found.steps[-1], found.formats))
    (_, path_a, (step_a, va), fa), (_, path_b, (step_b, vb), fb) = sides
    chosen = match_keys([*va, *vb], keys)
    rows = []
    for key in chosen:
        fmt = fa.get(key, fb.get(key))
        a, b = va.get(key), vb.get(key)
        cells = [key, "-" if a is None else format_value(a, fmt)]
        cells.append("-" if b is None else format_value(b, fmt))
        if a is None or b is None:
            cells += ["-", "-"]
        else:
            diff = b - a if math.isfinite(a) and math.isfinite(b) else math.nan
            cells.append(_signed(diff, fmt) if not math.isnan(diff) else "-")
            change = diff / abs(a) if a != 0 and not math.isnan(diff) else math.nan
            cells.append("-" if math.isnan(change) else f"{change:+.1%}")
        rows.append(cells)
    out.write(f"A: {path_a} at step {step_a}\nB: {path_b} at step {step_b}\n")
    out.write(render_rows(["key", "A", "B", "B - A", "change"], rows, width) + "\n")
    out.flush()
    return 0
