"""Sketch additions of folded samples: only the cells they touch, never a whole sketch.

A fold places quantile samples in their cells and counts them per cell over the touched span;
a sync or a table adds the counts to the metric's sketch.

>>> import numpy as np
>>> from metricsync._state._spec import Spec
>>> slot, cells, counts = sketch_cells(Spec(("mean", "p50")), 3, np.array([1.0, 1.0, 2.0]), None)
>>> slot, len(cells), counts.tolist()
(3, 2, [2.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._state._sketch import SketchLayout, cells_numpy, sketch_layout
from .._state._spec import Spec

__all__ = ["Cells", "count_cells", "run_cells", "sketch_cells"]

#: ``(slot, cells, counts)``: additions to the distinct ``cells`` of a slot's sketch
Cells = tuple[int, np.ndarray, np.ndarray]


def sketch_cells(spec: Spec, slot: int, x: np.ndarray, w: np.ndarray | None) -> Cells:
    """A metric's sketch additions from its samples: only the cells they touch."""
    layout = sketch_layout(spec.accuracy)
    cell, clamped = cells_numpy(layout, x)
    return count_cells(layout, slot, cell, clamped, w)


def count_cells(
    layout: SketchLayout,
    slot: int,
    cell: np.ndarray,
    clamped: np.ndarray | None,
    w: np.ndarray | None,
) -> Cells:
    """Sketch additions of samples in cells ``cell`` (``clamped``: of them, the samples
    out of range, from :func:`~metricsync._state._sketch.cells_numpy`), weighted by ``w``."""
    lo = int(cell.min()) if len(cell) else 0
    at = cell - lo  # samples span few cells: count them over that span, then keep the touched
    if w is None:
        number = np.bincount(at)
        touched = np.flatnonzero(number)
        counts: np.ndarray = number[touched].astype(np.float64)
        extra = 0 if clamped is None else np.count_nonzero(clamped)
    else:
        with np.errstate(over="ignore"):  # weight sums beyond float64 are inf, as in W
            touched = np.flatnonzero(np.bincount(at))
            counts = np.bincount(at, w)[touched]
            extra = 0 if clamped is None else w[clamped].sum()
    touched += lo
    if clamped is not None:
        touched = np.r_[touched, layout.clamped_cell]
        counts = np.r_[counts, extra]
    return slot, touched, counts


def run_cells(
    specs: Sequence[Spec],
    sketched: np.ndarray,
    run_slot: np.ndarray,
    x: np.ndarray,
    w: np.ndarray | None,
    start: np.ndarray,
    length: np.ndarray,
) -> list[Cells]:
    """Sketch additions of the runs of metrics with a sketch (``sketched``, per run), per
    metric: the cells of every such sample of one accuracy placed in one call."""
    if not sketched.any():
        return []
    runs = np.flatnonzero(sketched)
    length = length[runs]
    ends = np.cumsum(length)
    at = np.repeat(start[runs] - ends + length, length) + np.arange(int(ends[-1]))
    x, w = x[at], None if w is None else w[at]
    slots = run_slot[runs].tolist()
    if len(set(slots)) == len(slots) and len({specs[s].accuracy for s in slots}) == 1:
        # one run per metric (as a fold of listed arrays gives), one accuracy: one call
        # places every cell, and each metric's cells are a slice of them
        layout = sketch_layout(specs[slots[0]].accuracy)
        cell, clamped = cells_numpy(layout, x)
        bounds = [0, *ends.tolist()]
        out = []
        for slot, lo, hi in zip(slots, bounds, bounds[1:]):
            out_of_range = None if clamped is None or not clamped[lo:hi].any() else clamped[lo:hi]
            ws = None if w is None else w[lo:hi]
            out.append(count_cells(layout, slot, cell[lo:hi], out_of_range, ws))
        return out
    of = np.repeat(run_slot[runs], length)  # each sketched sample's slot
    by_accuracy: dict[float, list[int]] = {}
    for slot in sorted(set(slots)):
        by_accuracy.setdefault(specs[slot].accuracy, []).append(slot)
    out = []
    for accuracy, group in by_accuracy.items():
        mine = np.isin(of, group) if len(by_accuracy) > 1 else slice(None)
        layout = sketch_layout(accuracy)
        cell, clamped = cells_numpy(layout, x[mine])
        ws, of_mine = None if w is None else w[mine], of[mine]
        for slot in group:
            sel = of_mine == slot if len(group) > 1 else slice(None)
            out_of_range = None if clamped is None or not clamped[sel].any() else clamped[sel]
            out.append(
                count_cells(layout, slot, cell[sel], out_of_range, None if ws is None else ws[sel])
            )
    return out
