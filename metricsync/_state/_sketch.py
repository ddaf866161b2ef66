"""A fixed-size, mergeable quantile sketch (the DDSketch idea) as pure functions.

A sketch is a float64 vector of cells that merges by addition (one SUM all-reduce for many
metrics); a sample adds its weight to its log bucket (relative accuracy ``a``), zeros,
infinities and NaN to their own cells, out-of-range magnitudes to the extreme bucket and a
clamped counter.

>>> import numpy as np
>>> layout = sketch_layout(0.01)
>>> a = ingest_numpy(layout, np.array([1.0, 2.0, 3.0]))
>>> b = ingest_numpy(layout, np.array([4.0, 5.0]))
>>> float((a + b).sum()), int(np.count_nonzero(a + b))
(5.0, 5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ._lru import lru

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_BYTES",
    "MAX_MAGNITUDE",
    "MIN_MAGNITUDE",
    "SketchLayout",
    "cells_numpy",
    "cells_torch",
    "clamped_count",
    "held_span",
    "ingest_numpy",
    "ingest_torch",
    "sketch_layout",
]

MIN_MAGNITUDE = 1e-16  #: smallest magnitude every layout resolves to accuracy ``a``
MAX_MAGNITUDE = 1e19  #: largest magnitude every layout resolves to accuracy ``a``
MAX_BYTES = 65536  #: the state of one sketch stays within 64 KiB


@dataclass(frozen=True)
class SketchLayout:
    """Where each bucket of a sketch with relative accuracy ``accuracy`` lives.

    ``min_index``/``max_index`` are the bucket indices ``ceil(log_gamma |x|)``
    of the smallest and largest covered magnitude; both signs share them.

    >>> layout = sketch_layout(0.01)
    >>> layout.n_buckets, layout.n_cells, layout.zero_cell
    (4031, 8067, 4032)
    """

    accuracy: float
    gamma: float
    ln_gamma: float
    min_index: int
    max_index: int

    @property
    def n_buckets(self) -> int:
        """Number of log buckets per sign."""
        return self.max_index - self.min_index + 1

    @property
    def n_cells(self) -> int:
        """Total float64 cells: both stores plus -inf, zero, +inf, NaN and clamped."""
        return 2 * self.n_buckets + 5

    @property
    def neg_inf_cell(self) -> int:
        """Cell counting ``-inf`` samples."""
        return 0

    @property
    def zero_cell(self) -> int:
        """Cell counting exact zeros; bucket ``i`` of sign ``s`` sits at ``zero_cell + s*(i - min_index + 1)``."""
        return self.n_buckets + 1

    @property
    def pos_inf_cell(self) -> int:
        """Cell counting ``+inf`` samples."""
        return 2 * self.n_buckets + 2

    @property
    def nan_cell(self) -> int:
        """Cell counting NaN samples; any weight here makes every quantile NaN."""
        return 2 * self.n_buckets + 3

    @property
    def clamped_cell(self) -> int:
        """Side counter: weight of samples clamped into an extreme bucket."""
        return 2 * self.n_buckets + 4

    @cached_property
    def representatives(self) -> np.ndarray:
        """Answer of each value-ordered cell ``[0, nan_cell)``: -inf, buckets, 0, buckets,
        +inf (read-only; made once per layout, which :func:`sketch_layout` keeps)."""
        idx = np.arange(self.min_index, self.max_index + 1, dtype=np.float64)
        pos = 2.0 * np.exp(idx * self.ln_gamma) / (self.gamma + 1.0)
        reps = np.concatenate([[-np.inf], -pos[::-1], [0.0], pos, [np.inf]])
        reps.flags.writeable = False
        return reps

    @property
    def edge(self) -> float:
        """The answer of the largest bucket, which also holds every clamped larger magnitude."""
        return float(self.representatives[self.pos_inf_cell - 1])


def sketch_layout(accuracy: float = 0.01) -> SketchLayout:
    """Return the (cached) layout for relative accuracy ``accuracy`` in (0, 1).

    Raises ``ValueError`` when ``accuracy`` is outside (0, 1) or when covering
    ``[MIN_MAGNITUDE, MAX_MAGNITUDE]`` at that accuracy needs more than 64 KiB.

    >>> sketch_layout(0.02).n_cells
    4035
    >>> sketch_layout(0.005)
    Traceback (most recent call last):
    ...
    ValueError: a sketch with relative accuracy 0.005 needs 16125 cells (126 KiB) to cover magnitudes 1e-16..1e+19; at most 8192 cells (64 KiB) fit; use an accuracy >= 0.00985
    """
    a = float(accuracy)
    if not (0.0 < a < 1.0):
        raise ValueError(f"sketch accuracy must lie in (0, 1), got {accuracy!r}")
    return _layout(a)


@lru(32)  # a bound: the layouts of the latest accuracies
def _layout(a: float) -> SketchLayout:
    ln_gamma = math.log1p(a) - math.log1p(-a)
    layout = SketchLayout(
        accuracy=a,
        gamma=(1.0 + a) / (1.0 - a),
        ln_gamma=ln_gamma,
        min_index=math.ceil(math.log(MIN_MAGNITUDE) / ln_gamma),
        max_index=math.ceil(math.log(MAX_MAGNITUDE) / ln_gamma),
    )
    if layout.n_cells * 8 > MAX_BYTES:
        max_cells = MAX_BYTES // 8
        span = math.log(MAX_MAGNITUDE) - math.log(MIN_MAGNITUDE)
        finest = math.tanh(span / ((max_cells - 5) // 2 - 2) / 2)  # a = (g - 1) / (g + 1)
        raise ValueError(
            f"a sketch with relative accuracy {a:g} needs {layout.n_cells} cells "
            f"({math.ceil(layout.n_cells * 8 / 1024)} KiB) to cover magnitudes "
            f"{MIN_MAGNITUDE:g}..{MAX_MAGNITUDE:g}; at most {max_cells} cells (64 KiB) fit; "
            f"use an accuracy >= {math.ceil(finest * 1e5) / 1e5:g}"
        )
    return layout


def ingest_numpy(
    layout: SketchLayout, values: npt.ArrayLike, weights: npt.ArrayLike | None = None
) -> np.ndarray:
    """Sketch ``values`` (any shape; every element a sample) into ``(n_cells,)`` float64 cells.

    ``weights`` (finite, >= 0, broadcastable to ``values``) are summed per cell;
    ``None`` means weight 1 each. Vectorized over chunks of 64Ki samples (one
    ``log`` and one ``bincount`` each); NaN, infinities and out-of-range
    magnitudes, if any, take a second look on their own.

    >>> layout = sketch_layout()
    >>> cells = ingest_numpy(layout, np.array([0.0, 1.0, 1.0, np.inf]), np.array([1.0, 2.0, 0.5, 1.0]))
    >>> cells[layout.zero_cell], cells[layout.zero_cell + 1 - layout.min_index], cells[layout.pos_inf_cell]
    (np.float64(1.0), np.float64(2.5), np.float64(1.0))
    """
    x = np.asarray(values).ravel()
    w = None
    if weights is not None:
        w = np.broadcast_to(np.asarray(weights, dtype=np.float64), np.shape(values)).ravel()
    counts = np.zeros(layout.n_cells)
    for start in range(0, x.size, _CHUNK):  # chunks keep the temporaries in cache
        stop = start + _CHUNK
        part = None if w is None else w[start:stop]
        cell, clamped = cells_numpy(layout, x[start:stop])
        counts += np.bincount(cell, part, minlength=layout.n_cells)
        if clamped is not None:
            counts[layout.clamped_cell] += (
                np.count_nonzero(clamped) if part is None else part[clamped].sum()
            )
    return counts


_CHUNK = 1 << 16


def cells_numpy(layout: SketchLayout, values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The cell of every sample of a 1-D array, and the mask of clamped samples (None if none).

    >>> layout = sketch_layout()
    >>> cell, clamped = cells_numpy(layout, np.array([-1.0, 0.0, 1e40]))
    >>> cell.tolist() == [layout.zero_cell - 1 + layout.min_index, layout.zero_cell, 2 * layout.n_buckets + 1], clamped.tolist()
    (True, [False, False, True])
    """
    x = values
    if x.dtype.kind not in "fiub":
        raise TypeError(f"sketch values must be real numbers, got dtype {x.dtype}")
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    lo, hi, zero = layout.min_index, layout.max_index, layout.zero_cell
    # Clip |x| to half a bucket beyond the covered range (NaN and 0 -> low end,
    # inf -> high end) so that k = ceil(log_gamma |x|) is finite and in-range
    # values keep exactly the k of the unclipped formula that cells_torch uses.
    smallest = x.min() if x.size else 0.0  # NaN if any sample is NaN
    tiny, huge = math.exp((lo - 1.5) * layout.ln_gamma), math.exp((hi + 0.5) * layout.ln_gamma)
    a = np.abs(x)
    if smallest >= 0 or smallest < 0:
        np.minimum(np.maximum(a, tiny, out=a), huge, out=a)
    else:  # fmax/fmin send NaN to the low end; maximum would keep it
        np.fmin(np.fmax(a, tiny, out=a), huge, out=a)
    k = np.log(a, dtype=np.float64)
    k *= 1.0 / layout.ln_gamma
    np.ceil(k, out=k)
    in_range = lo <= k.min() and k.max() <= hi  # no zero, no sentinel: no fix-up
    # cell = zero + sign(x) * (k - lo + 1): zeros, NaN and tiny values land on the
    # zero cell, +-inf and huge values on the +-inf cells; the fix-up sorts them out.
    if smallest >= 0:
        k -= lo - 1 - zero
    else:
        k -= lo - 1
        np.copysign(k, x, out=k)
        k += zero
    cell = k.astype(np.intp)
    if in_range:
        return cell, None
    special = (cell == zero) & (x != 0)
    special |= cell == layout.neg_inf_cell
    special |= cell == layout.pos_inf_cell
    idx = np.flatnonzero(special)
    if idx.size == 0:
        return cell, None
    # Some sample hit a sentinel. Exact zeros are where they belong; NaN, infinities
    # and out-of-range magnitudes get their exact cells (a pass over those only).
    cell[idx], clamped_at = _exact_cells(layout, x[idx].astype(np.float64))
    if not clamped_at.any():
        return cell, None
    clamped = np.zeros(len(x), dtype=bool)
    clamped[idx[clamped_at]] = True
    return cell, clamped


def _exact_cells(layout: SketchLayout, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cells of float64 samples ``x`` without sentinels, and the mask of clamped ones."""
    with np.errstate(divide="ignore", invalid="ignore"):
        raw = np.ceil(np.log(np.abs(x)) * (1.0 / layout.ln_gamma))
        k = np.clip(raw, layout.min_index, layout.max_index)
        cell = np.copysign(k - (layout.min_index - 1), x) + layout.zero_cell
    cell = np.where(x == 0, layout.zero_cell, cell)
    cell = np.where(x == np.inf, layout.pos_inf_cell, cell)
    cell = np.where(x == -np.inf, layout.neg_inf_cell, cell)
    cell = np.where(np.isnan(x), layout.nan_cell, cell)
    return cell.astype(np.intp), np.isfinite(raw) & (raw != k)


def ingest_torch(
    layout: SketchLayout, values: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Sketch a tensor into ``(n_cells,)`` float64 cells on ``values.device``.

    Same cells as :func:`ingest_numpy` for the same data, computed in float64
    with torch ops and ``index_add_``; it never reads the device from the
    host (no ``.item()``, masks or data-dependent branches), so it runs on
    CUDA without a sync and on the ``meta`` device.

    >>> import torch
    >>> layout = sketch_layout()
    >>> cells = ingest_torch(layout, torch.tensor([-1.0, 0.0, 1e40], dtype=torch.float64))
    >>> cells.shape, float(cells.sum()), float(cells[layout.clamped_cell])
    (torch.Size([8067]), 4.0, 1.0)
    >>> ingest_torch(layout, torch.randn(100, device="meta")).device
    device(type='meta')
    """
    import torch

    x = values.detach().reshape(-1)
    cell, clamped = cells_torch(layout, x)
    if weights is None:
        w = torch.ones(1, dtype=torch.float64, device=x.device).expand_as(cell)
    else:
        w = torch.broadcast_to(weights.detach().to(x.device), values.shape).reshape(-1)
        w = w.to(torch.float64)
    out = torch.zeros(layout.n_cells, dtype=torch.float64, device=x.device)
    out.index_add_(0, cell, w)
    out[layout.clamped_cell] += torch.where(clamped, w, 0.0).sum()
    return out


def cells_torch(layout: SketchLayout, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cell (int64) of every sample of a 1-D tensor and the mask of clamped ones, on its device."""
    import torch

    lo, hi = layout.min_index, layout.max_index
    raw = values.to(torch.float64, copy=True).abs_().log_().mul_(1.0 / layout.ln_gamma).ceil_()
    finite = torch.isfinite(raw)  # raw = ceil(log_gamma |x|) is finite for finite nonzero x
    under, over = finite & (raw < lo), finite & (raw > hi)
    # Zeros (raw = -inf) sit one step below the smallest bucket: the zero cell;
    # infinities one step above the largest: the +-inf cells. NaN stays NaN.
    cell = raw.clamp_(lo - 1, hi + 1).masked_fill_(under, lo).masked_fill_(over, hi)
    cell = cell.sub_(lo - 1).copysign_(values.to(torch.float64)).add_(layout.zero_cell)
    cell = cell.nan_to_num_(nan=layout.nan_cell).to(torch.int64)
    return cell, under.logical_or_(over)


def clamped_count(layout: SketchLayout, cells: np.ndarray) -> np.ndarray:
    """Weight of samples clamped into an extreme bucket, per row of ``cells`` (m, n_cells) -> (m,).

    >>> layout = sketch_layout()
    >>> clamped_count(layout, ingest_numpy(layout, np.array([1e40, -1e-40, 1.0, 0.0]))[None])
    array([2.])
    """
    c = np.asarray(cells, dtype=np.float64)
    if c.shape[-1:] != (layout.n_cells,):
        raise ValueError(f"sketch cells must have shape (m, {layout.n_cells}), got {c.shape}")
    return c[..., layout.clamped_cell].copy()


def held_span(cells: np.ndarray) -> tuple[int, int]:
    """``(start, count)`` of the cells from the first nonzero one to the last nonzero one;
    ``(0, 0)`` when every cell is zero. Two scans that stop at the first hit from either end
    (``flatnonzero`` would list every held cell: about 4x slower on a sketch of 8,067).

    >>> held_span(np.array([0.0, 0.0, 2.0, 0.0, 1.0, 0.0])), held_span(np.zeros(3))
    ((2, 3), (0, 0))
    """
    held = cells != 0  # NaN is held, as for flatnonzero
    first = int(held.argmax())
    if not held[first]:
        return 0, 0
    return first, len(cells) - int(held[::-1].argmax()) - first
