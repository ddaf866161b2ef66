"""Accumulating torch tensors on their own device, without reading them.

A :class:`DeviceAccumulator` holds one metric's state row (and sketch) as a
float64 tensor on the device its samples came from. Recording launches a few
reductions and elementwise kernels; it never calls ``.item()``, ``.cpu()``,
``.tolist()`` or boolean indexing, so it never waits for the device. Value
checks (negative weights, non-finite samples under ``nan="error"``) are
recorded as device flags: a failing record is discarded on the device and the
error is raised, naming the metric, by the next ``compute()``/``sync()``.

>>> import torch
>>> from metricsync._spec import Spec
>>> acc = DeviceAccumulator(torch.device("meta"), n_sketch=0)
>>> acc.add(Spec(), torch.ones(4, device="meta"), None, None, now=1.0)
>>> acc.row.device.type
'meta'
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._convert import host_mask, host_weights
from ._spec import Spec
from ._state import DROP, IDENTITY, LAST, M2, MAX, NCOL, NEGMIN, T, merge_rows

__all__ = [
    "BAD_NAN",
    "BAD_WEIGHT",
    "HOST_DEVICE_TYPES",
    "DeviceAccumulator",
    "check_on_host",
    "torch_weights",
]

BAD_WEIGHT = 1.0
BAD_NAN = 2.0
_F64 = torch.float64
_PLAIN_NEEDS_MINMAX = {"min", "max"}
#: Device types whose tensors live in host memory. Their values are checked when
#: recorded, like numpy data; tensors on other devices are checked on the device
#: and reported by the next ``compute()``/``sync()``.
HOST_DEVICE_TYPES = frozenset({"cpu"})


def check_on_host(name: str, spec: Spec, value: Any, weight: Any) -> None:
    """Raise ``ValueError`` naming the metric for bad values of a host (CPU) tensor.

    Negative or non-finite weights, and non-finite samples with weight > 0 under
    ``nan="error"``. A no-op for tensors outside :data:`HOST_DEVICE_TYPES`.

    >>> check_on_host("kl", Spec(), torch.ones(2), torch.tensor([1.0, -1.0], dtype=_F64))
    Traceback (most recent call last):
    ...
    ValueError: metric 'kl': weights must be finite and >= 0, got a negative or non-finite weight
    """
    if value.device.type not in HOST_DEVICE_TYPES:
        return
    if weight is not None and bool(((weight < 0) | ~torch.isfinite(weight)).any()):
        raise ValueError(
            f"metric {name!r}: weights must be finite and >= 0, got a negative or non-finite weight"
        )
    if spec.nan == "error" and value.is_floating_point():
        bad = ~torch.isfinite(value.reshape(-1))
        if weight is not None:
            bad &= weight > 0
        if bool(bad.any()):
            raise ValueError(f"metric {name!r}: non-finite sample under nan='error'")


def torch_weights(name: str, value: Any, weight: Any, mask: Any) -> Any:
    """Combine ``weight`` and ``mask`` into one flat tensor on value's device (or None).

    float64 when there is a weight; a mask alone stays a bool tensor (cheaper to
    apply). Shapes and dtypes are checked here (host-known); device values are
    not read. Host weights and masks are checked on the host right away.
    """
    shape = tuple(value.shape)
    w = None
    if weight is not None:
        if isinstance(weight, torch.Tensor):
            if weight.is_complex():
                raise TypeError(f"metric {name!r}: weight must be real, got dtype {weight.dtype}")
            try:
                expanded = weight.to(device=value.device, dtype=_F64).expand(shape)
            except RuntimeError:
                raise ValueError(
                    f"metric {name!r}: weight of shape {tuple(weight.shape)} does not broadcast "
                    f"to the value's shape {shape}"
                ) from None
            w = expanded.reshape(-1)
        elif np.ndim(weight) == 0:  # a number: checked here, then a fill on the device
            scalar = float(host_weights(name, weight, ())[0])
            w = torch.full((), scalar, dtype=_F64, device=value.device).expand(value.numel())
        else:
            w = torch.tensor(host_weights(name, weight, shape), device=value.device)
    if mask is not None:
        if isinstance(mask, torch.Tensor):
            if tuple(mask.shape) != shape:
                raise ValueError(
                    f"metric {name!r}: mask has shape {tuple(mask.shape)}, the value has shape {shape}"
                )
            if mask.is_complex():
                raise TypeError(f"metric {name!r}: mask must be boolean, got dtype {mask.dtype}")
            m = mask.to(value.device).reshape(-1)
            if m.dtype != torch.bool:
                m = m != 0
        else:
            m = torch.from_numpy(host_mask(name, mask, shape) != 0).to(value.device)
        w = m if w is None else w * m
    return w


class DeviceAccumulator:
    """One metric's state on one device: a float64 row, an optional sketch, an error flag."""

    __slots__ = ("bad", "device", "row", "sketch")

    def __init__(self, device: torch.device, n_sketch: int) -> None:
        self.device = device
        self.row = torch.empty(NCOL, dtype=_F64, device=device)
        for i, v in enumerate(IDENTITY.tolist()):
            self.row[i] = v  # fills on the device, not a host-to-device copy
        self.sketch = torch.zeros(n_sketch, dtype=_F64, device=device) if n_sketch else None
        self.bad = torch.zeros((), dtype=_F64, device=device)

    def add(self, spec: Spec, value: Any, weight: Any, layout: Any, now: float) -> None:
        """Fold one recorded tensor (flattened) with its combined weight into this state."""
        x = value.detach().reshape(-1)  # never keep the autograd graph alive
        if x.dtype == torch.bool or not x.is_floating_point():
            x = x.to(_F64)
        n = x.numel()
        if n == 0:
            return
        ok = None
        w = None if weight is None else weight.detach()
        if w is not None and w.dtype != torch.bool:  # a bare mask cannot be negative
            bad = (w < 0).any() | ~torch.isfinite(w).all()
            self.bad = torch.where(bad & (self.bad == 0), BAD_WEIGHT, self.bad)
            ok = ~bad
        drop = None
        if spec.nan != "propagate":
            nonfinite = ~torch.isfinite(x)
            sample = nonfinite if w is None else nonfinite & (w > 0)
            if spec.nan == "error":
                bad_nan = sample.any()
                self.bad = torch.where(bad_nan & (self.bad == 0), BAD_NAN, self.bad)
                ok = ~bad_nan if ok is None else ok & ~bad_nan
            else:
                drop = sample.sum(dtype=_F64)
                keep_finite = (~nonfinite).to(_F64)
                w = keep_finite if w is None else w * keep_finite
        # Scalars enter as kernel arguments or torch.full fills: a torch.tensor(...,
        # device=...) would be a host-to-device copy, which waits for the device.
        keep = None if w is None else w if w.dtype == torch.bool else w > 0
        xz = x if keep is None else torch.where(keep, x, 0.0)
        if w is None:
            wsum = torch.full((), float(n), dtype=_F64, device=x.device)
            ssum = xz.sum(dtype=_F64)
        elif w.dtype == torch.bool:
            wsum = w.sum(dtype=_F64)
            ssum = xz.sum(dtype=_F64)
        else:
            wsum = w.sum()
            ssum = (xz.to(_F64) * w).sum()
        cols: list[Any] = [wsum, ssum] + [None] * (NCOL - 2)
        stats = set(spec.reduce)
        if stats & _PLAIN_NEEDS_MINMAX or spec.quantiles:
            if keep is None:
                cols[MAX] = x.max().to(_F64)
                cols[NEGMIN] = -x.min().to(_F64)
            else:
                cols[MAX] = torch.where(keep, x, float("-inf")).max().to(_F64)
                cols[NEGMIN] = -torch.where(keep, x, float("inf")).min().to(_F64)
        if "last" in stats:
            if keep is None:
                cols[LAST] = x[-1].to(_F64)
                cols[T] = torch.full((), now, dtype=_F64, device=x.device)
            else:
                pos = torch.where(keep, torch.arange(n, device=x.device), -1).max()
                cols[LAST] = x.gather(0, pos.clamp(min=0).reshape(1))[0].to(_F64)
                stamp = torch.full((), now, dtype=_F64, device=x.device)  # float32 would round it
                cols[T] = torch.where(pos >= 0, stamp, float("-inf"))
        if "var" in stats or "std" in stats:
            mean = ssum / torch.where(wsum > 0, wsum, 1.0)
            dev = xz.to(_F64) - mean
            sq = dev * dev if w is None or keep is None else torch.where(keep, w * dev * dev, 0.0)
            cols[M2] = sq.sum()
        if drop is not None:
            cols[DROP] = drop
        batch = torch.stack(
            [
                c.reshape(()) if c is not None else torch.full((), v, dtype=_F64, device=x.device)
                for c, v in zip(cols, IDENTITY.tolist())
            ]
        )
        merged = merge_rows(self.row, batch, torch)
        self.row = merged if ok is None else torch.where(ok, merged, self.row)
        if self.sketch is not None and layout is not None:
            from ._sketch import ingest_torch

            cells = ingest_torch(layout, xz.to(_F64), w)
            self.sketch = self.sketch + (cells if ok is None else torch.where(ok, cells, 0.0))
