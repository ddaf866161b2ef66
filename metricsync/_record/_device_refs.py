"""Pending references of one device: records kept as tensors until a fold, then
stacked per dtype or shape into one flat batch with a few batched ops.

Only tensors small beside their storage are kept (views into large ones are copied), and a
tensor changed in place before it was read (its version counter moved) is left out and
flagged; writes that bypass the counter cannot be seen.

>>> import torch
>>> t = torch.ones(3)
>>> keepable(t), keepable(torch.zeros(100_000)[:3])
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np
import torch

from .._state import _algebra as al
from ._convert import META_STANDINS, readable_dtypes
from ._device_fold import BAD_CHANGED
from ._streams import Streams

__all__ = [
    "BAD_CHANGED",
    "BOOL_MASK",
    "MASK",
    "PLAIN",
    "REF_ELEMENTS",
    "VIEW_SLACK",
    "REF_LIMIT",
    "WEIGHT",
    "Gathered",
    "Lane",
    "Ref",
    "Scalar",
    "gather",
    "keepable",
]

_F64 = torch.float64
_VERSION = attrgetter("_version")
PLAIN, WEIGHT, MASK, BOOL_MASK = 0, 1, 2, 3  #: a record's weights, and what to check of them
#: pending references per device, of the lanes' inbox or of the checked path: a fold when
#: either holds this many
REF_LIMIT = 1024
REF_ELEMENTS = 1 << 21  #: elements of the tensors pending references hold: a fold past it
VIEW_SLACK = 1 << 15  #: bytes a referenced storage may hold beyond twice the tensor's own


def of_parameter(t: torch.Tensor) -> bool:
    """Whether ``t``, which requires grad, is a parameter or a view into one (``p[0]``):
    its optimizer changes it in place, and FSDP frees its storage."""
    base = t._base
    return t.is_leaf or (base is not None and base.is_leaf)


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


def _weights(
    group: list[Ref], sw: Any, sm: Any, upload: Callable[[np.ndarray], torch.Tensor]
) -> Any:
    """The combined weights of a group of records of one shape, ``(k, *shape)`` float64
    (``sw``, ``sm``: the group's tensor weights and masks, stacked, or None)."""
    first = group[0]
    shape = (len(group), *first.x.shape)
    w: Any = None
    if isinstance(first.w, float):
        floats = upload(np.array([r.w for r in group], dtype=np.float64))
        w = floats.view(len(group), *([1] * first.x.dim())).expand(shape)
    elif sw is not None:
        lead = (len(group),) + (1,) * (first.x.dim() - first.w.dim())
        w = sw.to(_F64).view(*lead, *first.w.shape).expand(shape)
    if sm is None:
        return w
    if w is None:
        return sm.to(_F64)
    if sm.dtype == torch.bool:
        return w * sm
    return w * torch.where((sm == 0) | (sm == 1), sm.to(_F64), float("nan"))


#: a pending 0-d record: row, tensor, version, dtype, stamp
Scalar = tuple[int, torch.Tensor, int, torch.dtype, float]


class Lane:
    """Where a name's records on one device go: the device's state and the name's row.

    :meth:`take` pends a plain 0-d tensor without the store's lock, the hot path of
    ``Metrics.record``: an append to the state's ``inbox``, as a Python number's to its
    name's number buffer. The holder of the store's lock moves the inbox into the
    pending records (``DeviceState.drain``), and folds when it holds ``limit`` of them.
    """

    __slots__ = ("device", "inbox", "limit", "meta", "readable", "row", "side", "stamped", "state")

    def __init__(self, state: Any, row: int) -> None:
        self.state = state  #: the ``DeviceState``
        self.device, self.row, self.meta = state.device, row, state.meta
        self.inbox: list[Scalar] = state.inbox
        self.limit: int = state.ref_limit
        self.stamped = state.stamped(row)  # its spec reads the time of a record
        streams = state.streams  # one stream (not CUDA): no side stream to test for
        self.side = None if type(streams).on_side is Streams.on_side else streams.on_side
        self.readable = readable_dtypes()

    def take(self, x: torch.Tensor) -> bool:
        """Pend ``x`` as a reference if it is a dense 0-d tensor of a readable dtype on this
        lane's device, with a small storage and a version counter, not a parameter nor a view
        into one, recorded on the default stream (and, on ``meta``, inside
        ``meta_records()``); else False, nothing pended."""
        if x.ndim or x.device != self.device or x.layout is not torch.strided:
            return False
        dtype = x.dtype
        if dtype not in self.readable or x.untyped_storage().nbytes() > VIEW_SLACK:
            return False
        if (self.side is not None and self.side()) or (self.meta and not META_STANDINS[0]):
            return False
        try:
            version = x._version
        except RuntimeError:  # an inference tensor: the checked path copies it
            return False
        if x.requires_grad:
            if of_parameter(x):  # changed in place by its optimizer (the checked path
                return False  # copies it)
            x = x.detach()  # the graph is not kept; the version counter is shared
        self.inbox.append((self.row, x, version, dtype, al.now_us() if self.stamped else 0.0))
        return True


class Gathered(NamedTuple):
    """The pending references as flat float64 pieces (see :func:`gather`)."""

    xs: list[torch.Tensor]
    ws: list[torch.Tensor | None]
    records: list[np.ndarray]
    changed: set[int]
    scalars: list[Scalar]  #: with ``pin``: the unchanged 0-d records, on private copies
    refs: list[Ref]  #: with ``pin``: the unchanged other records, on private copies


def gather(
    scalars: list[Scalar],
    refs: list[Ref],
    start: int,
    upload: Callable[[np.ndarray], torch.Tensor],
    pin: bool = False,
    scratch: tuple[torch.Tensor, Sequence[torch.Tensor]] | None = None,
) -> Gathered:
    """The pending references as flat float64 pieces: values, weights or None, records
    and rows of changed tensors; each piece's records an ``(r, 5)`` array of
    ``(row, start, n, kind, stamp)``, starts from ``start`` on. Changed tensors are
    left out.

    The 0-d records are copied (cast to float64) into one flat buffer with one batched
    ``_foreach_copy_`` per dtype: into ``scratch`` (a float64 buffer of at least as many
    elements and its 0-d views, reused from fold to fold) when given, else into a new one.

    With ``pin``, also the unchanged references on views of the copies the pieces come
    from (0-d records: float64 views; others: same dtypes and shapes; same order, no
    extra copy), to stand for them from then on: a later in-place change of a caller's
    tensor cannot reach them. A changed 0-d record stays as it is among the pinned ones
    (one for each of ``scalars``, in order: the pending count, and so the fold points,
    stay those of the records), to be left out again by the fold.
    """
    xs: list[torch.Tensor] = []
    ws: list[torch.Tensor | None] = []
    records: list[np.ndarray] = []
    changed: set[int] = set()
    pinned: list[Scalar] = []
    pinned_refs: list[Ref] = []
    given, fresh = scalars, None
    if scalars:
        rows, tensors, versions, dtypes, stamps = map(list, zip(*scalars))  # columns, C loops
        now = list(map(_VERSION, tensors))
        if now != versions:
            fresh = [v == was for v, was in zip(now, versions)]
            changed = {row for row, ok in zip(rows, fresh) if not ok}
            scalars = [rec for rec, ok in zip(scalars, fresh) if ok]
            rows, tensors, versions, dtypes, stamps = (
                map(list, zip(*scalars)) if scalars else [[]] * 5
            )
    if scalars:
        k = len(scalars)
        if scratch is None or pin:  # pinned values must not share a reused buffer
            flat = torch.empty(k, dtype=_F64, device=tensors[0].device)
            dst: Sequence[torch.Tensor] = flat.unbind(0)
        else:
            flat, dst = scratch[0][:k], scratch[1][:k]
        _copy_scalars(dst, tensors, dtypes)
        xs.append(flat)
        ws.append(None)
        table = np.zeros((k, 5))
        table[:, 0] = rows
        table[:, 1] = np.arange(start, start + k)
        table[:, 2] = 1.0
        table[:, 4] = stamps
        records.append(table)
        start += k
        if pin:
            pinned = list(zip(rows, dst, map(_VERSION, dst), [_F64] * k, stamps))
    if pin and fresh is not None:  # the changed ones where they were
        copies = iter(pinned)
        pinned = [next(copies) if ok else rec for rec, ok in zip(given, fresh)]
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
        sx = torch.stack([r.x for r in group])
        sw = torch.stack([r.w for r in group]) if isinstance(group[0].w, torch.Tensor) else None
        sm = None if group[0].m is None else torch.stack([r.m for r in group])
        xs.append(sx.reshape(-1).to(_F64))
        w = _weights(group, sw, sm, upload)
        ws.append(None if w is None else w.reshape(-1))
        table = np.array([(r.row, start + i * n, n, r.kind, r.stamp) for i, r in enumerate(group)])
        records.append(table.reshape(-1, 5))
        start += n * len(group)
        if pin:
            pinned_refs += _pinned(group, sx, sw, sm)
    return Gathered(xs, ws, records, changed, pinned, pinned_refs)


def _copy_scalars(
    dst: Sequence[torch.Tensor], tensors: list[torch.Tensor], dtypes: list[torch.dtype]
) -> None:
    """Copy each 0-d tensor (of ``dtypes``) into its 0-d float64 view: one batched copy per
    source dtype (a batched copy casts, but on CUDA only from one source dtype at a time)."""
    if dtypes.count(dtypes[0]) == len(dtypes):
        torch._foreach_copy_(list(dst), tensors)
        return
    by_dtype: dict[Any, list[int]] = {}
    for i, dtype in enumerate(dtypes):
        by_dtype.setdefault(dtype, []).append(i)
    for at in by_dtype.values():
        torch._foreach_copy_([dst[i] for i in at], [tensors[i] for i in at])


def _pinned(group: list[Ref], sx: torch.Tensor, sw: Any, sm: Any) -> list[Ref]:
    """``group``'s records on views of their stacked tensors (one ``unbind`` each)."""
    cols: list[Any] = [
        sx.unbind(0),
        [r.w for r in group] if sw is None else sw.unbind(0),
        [None] * len(group) if sm is None else sm.unbind(0),
    ]
    out = []
    for r, x, w, m in zip(group, *cols):
        versions = tuple(t._version for t in (x, w, m) if isinstance(t, torch.Tensor))
        out.append(r._replace(x=x, w=w, m=m, versions=versions))
    return out
