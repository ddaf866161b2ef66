"""Pending references of one device: records kept as tensors until a fold, then
gathered into one flat batch with a few batched ops whatever their number.

A record of an accelerator tensor launches nothing: it keeps the tensor (detached
from any autograd graph) and its version counter. A fold stacks the references,
grouped by dtype (0-d tensors) or by shape, dtypes and weight kind (others), one
``torch.stack`` per group, and hands the stacked values to the device fold.

Two guards keep a reference from giving a wrong number:

- a reference is kept only of a tensor whose storage is small beside it
  (:func:`keepable`); a view into a large tensor is copied at the record instead,
  so a large buffer the caller refills does not change it, and its memory is not
  held;
- a tensor changed in place before the fold (its version counter moved: a write
  through it, its base or any view of them) is left out, and its row flagged
  (:data:`BAD_CHANGED`), which the next ``compute()`` reports naming the metric.

Writes that bypass the version counter (through ``.data``, a DLPack or numpy
alias, a CUDA graph replay) cannot be seen: record a ``.clone()`` of such a tensor.

>>> import torch
>>> t = torch.ones(3)
>>> keepable(t), keepable(torch.zeros(100_000)[:3])
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ._device_fold import BAD_CHANGED

__all__ = [
    "BAD_CHANGED",
    "BOOL_MASK",
    "MASK",
    "PLAIN",
    "REF_ELEMENTS",
    "VIEW_SLACK",
    "REF_LIMIT",
    "WEIGHT",
    "Ref",
    "gather",
    "keepable",
]

_F64 = torch.float64
PLAIN, WEIGHT, MASK, BOOL_MASK = 0, 1, 2, 3  #: a record's weights, and what to check of them
REF_LIMIT = 1024  #: pending references per device: a fold when reached
REF_ELEMENTS = 1 << 21  #: elements of the tensors pending references hold: a fold past it
VIEW_SLACK = 1 << 15  #: bytes a referenced storage may hold beyond twice the tensor's own


def keepable(t: torch.Tensor) -> bool:
    """Whether a reference to ``t`` holds little memory beyond ``t``'s own: its storage
    is at most twice its bytes plus 32 KiB (not a view into a large tensor)."""
    return bool(t.untyped_storage().nbytes() <= 2 * t.numel() * t.element_size() + VIEW_SLACK)


class Ref(NamedTuple):
    """A pending record of a tensor that is not 0-d: ``w`` a float, a tensor or None;
    ``m`` a tensor or None; ``versions`` of the tensors among ``x, w, m``."""

    row: int
    x: torch.Tensor
    w: Any
    m: Any
    kind: int
    versions: tuple[int, ...]
    stamp: float


def _tensors(ref: Ref) -> tuple[torch.Tensor, ...]:
    return tuple(t for t in (ref.x, ref.w, ref.m) if isinstance(t, torch.Tensor))


def _weights(group: list[Ref], upload: Callable[[np.ndarray], torch.Tensor]) -> Any:
    """The combined weights of a group of records of one shape, ``(k, *shape)`` float64."""
    first = group[0]
    shape = (len(group), *first.x.shape)
    w: Any = None
    if isinstance(first.w, float):
        floats = upload(np.array([r.w for r in group], dtype=np.float64))
        w = floats.view(len(group), *([1] * first.x.dim())).expand(shape)
    elif first.w is not None:
        stacked = torch.stack([r.w for r in group]).to(_F64)
        lead = (len(group),) + (1,) * (first.x.dim() - first.w.dim())
        w = stacked.view(*lead, *first.w.shape).expand(shape)
    if first.m is None:
        return w
    mask = torch.stack([r.m for r in group])
    if w is None:
        return mask.to(_F64)
    if mask.dtype == torch.bool:
        return w * mask
    return w * torch.where((mask == 0) | (mask == 1), mask.to(_F64), float("nan"))


def gather(
    scalars: list[tuple[int, torch.Tensor, int, float]],
    refs: list[Ref],
    start: int,
    upload: Callable[[np.ndarray], torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor | None], list[np.ndarray], set[int]]:
    """The pending references as flat float64 pieces: ``(values, weights or None,
    records, rows of changed tensors)``; each piece's records an ``(r, 5)`` array of
    ``(row, start, n, kind, stamp)``, starts from ``start`` on.

    A 0-d record is ``(row, tensor, version, stamp)``. Changed tensors are left out.
    """
    xs: list[torch.Tensor] = []
    ws: list[torch.Tensor | None] = []
    records: list[np.ndarray] = []
    changed: set[int] = set()
    if scalars:
        if any(t._version != v for _, t, v, _ in scalars):
            changed = {row for row, t, v, _ in scalars if t._version != v}
            scalars = [rec for rec in scalars if rec[1]._version == rec[2]]
        by_dtype: dict[Any, list[tuple[int, torch.Tensor, int, float]]] = {}
        dtypes = {t.dtype for _, t, _, _ in scalars}
        if len(dtypes) == 1:
            by_dtype[dtypes.pop()] = scalars
        else:
            for rec in scalars:
                by_dtype.setdefault(rec[1].dtype, []).append(rec)
        for singles in by_dtype.values():
            k = len(singles)
            xs.append(torch.stack([t for _, t, _, _ in singles]).to(_F64))
            ws.append(None)
            table = np.zeros((k, 5))
            table[:, 0] = [row for row, _, _, _ in singles]
            table[:, 1] = np.arange(start, start + k)
            table[:, 2] = 1.0
            table[:, 4] = [at for _, _, _, at in singles]
            records.append(table)
            start += k
    by_shape: dict[tuple[Any, ...], list[Ref]] = {}
    for ref in refs:
        if tuple(t._version for t in _tensors(ref)) != ref.versions:
            changed.add(ref.row)
            continue
        w, m = ref.w, ref.m
        wkey = ("f",) if isinstance(w, float) else (None if w is None else (w.shape, w.dtype))
        key = (ref.x.shape, ref.x.dtype, ref.kind, wkey, None if m is None else m.dtype)
        by_shape.setdefault(key, []).append(ref)
    for group in by_shape.values():
        n = group[0].x.numel()
        xs.append(torch.stack([r.x for r in group]).reshape(-1).to(_F64))
        w = _weights(group, upload)
        ws.append(None if w is None else w.reshape(-1))
        table = np.array([(r.row, start + i * n, n, r.kind, r.stamp) for i, r in enumerate(group)])
        records.append(table.reshape(-1, 5))
        start += n * len(group)
    return xs, ws, records, changed
