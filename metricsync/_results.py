"""From state rows to numbers: each metric's statistics, and the ``compute()`` dict.

Pure functions over the columnar state (rows, sketches, across aggregates), so
``Metrics.compute``, ``merge`` (an ``across`` operand's own values) and
``sync`` (this rank's own values) share one implementation.

>>> import numpy as np
>>> from metricsync import _state as st
>>> from metricsync._spec import Spec
>>> rows = st.rows_from_samples(np.array([1.0, 3.0]), None, np.array([0, 2]), now=1.0)
>>> local_values([Spec(("mean", "max"))], rows, [None]).tolist()
[[2.0, 3.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from . import _state as st
from ._across import combine
from ._spec import Spec, quantile_of

__all__ = ["assemble", "local_values"]


def local_values(
    specs: Sequence[Spec], rows: np.ndarray, sketches: Sequence[np.ndarray | None]
) -> np.ndarray:
    """``(n, widest reduce)``: each metric's own statistics, in its spec's order.

    NaN where a metric holds no samples (and past the end of shorter reduces).
    ``sketches[i]`` is metric i's sketch cells, or None when it has none.
    """
    n = len(specs)
    width = max((len(spec.reduce) for spec in specs), default=0)
    out = np.full((n, width), np.nan)
    if n == 0:
        return out
    with np.errstate(invalid="ignore", divide="ignore"):
        plain = st.compute_plain(rows, np)
    for i, spec in enumerate(specs):
        for j, stat in enumerate(spec.reduce):
            column = plain.get(stat)
            if column is not None:
                out[i, j] = column[i]
        if spec.quantiles and rows[i, st.W] > 0:
            for j, stat in enumerate(spec.reduce):
                q = quantile_of(stat)
                if q is not None:
                    out[i, j] = _quantile(spec, rows[i], sketches[i], q)
    return out


def _quantile(spec: Spec, row: np.ndarray, cells: np.ndarray | None, q: float) -> float:
    vmin, vmax = -row[st.NEGMIN], row[st.MAX]
    if cells is None or q in (0.0, 1.0):  # p0 and p100 are the exact min and max
        return float(vmin if q == 0.0 else vmax)
    from ._sketch import query, sketch_layout

    value = query(
        sketch_layout(spec.accuracy), cells[None, :], [q], np.array([vmin]), np.array([vmax])
    )
    return float(value[0, 0])


def assemble(
    names: Sequence[str],
    specs: Sequence[Spec],
    rows: np.ndarray,
    local: np.ndarray,
    aggregates: Mapping[int, np.ndarray],
) -> dict[str, float]:
    """The ``compute()`` dict: output keys of metrics holding samples, ``name/nan_dropped``.

    ``local`` is :func:`local_values` of every metric; ``aggregates`` maps the
    slots of ``across`` metrics to their finished ranks.
    """
    has = rows[:, st.W] > 0
    out: dict[str, float] = {}
    for slot, (name, spec) in enumerate(zip(names, specs)):
        keys = spec.output_keys(name)
        agg = aggregates.get(slot)
        if agg is None:
            if has[slot]:
                out.update(zip(keys, local[slot, : len(keys)].tolist()))
        else:
            combined = combine(spec.across, agg, local[slot, : len(keys)], bool(has[slot]))
            if combined is not None:
                out.update(zip(keys, combined.tolist()))
        if spec.nan == "ignore":
            dropped = rows[slot, st.DROP]
            if dropped > 0 or keys[0] in out:
                out[f"{name}/nan_dropped"] = float(dropped)
    return out
