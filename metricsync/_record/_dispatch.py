"""Where a record goes: a table of routes keyed by the value's class, then the checked path.

``Metrics.record`` takes the two hottest kinds itself (no call): a Python number into
its name's open buffer, and a plain torch tensor (no weight, no mask): a 0-d CPU one
by ``float()``, a larger CPU one as a numpy view joining its name's buffer, one on an
accelerator into its name's lane. Every other record goes to the route of its value's
class in :data:`ROUTES`, or to :func:`general` for a class without one. A route takes
the record where it can, without a lock or a check of its own: a small numpy array or
a list of Python numbers joins its name's open number buffer, a masked CPU tensor
keeps its kept samples, a masked or weighted accelerator tensor goes into its name's
lane. A route (or ``Metrics.record``) that does not take a record records nothing and
hands it to :func:`general`: a name's first number opens it (``Store.add_number``),
else the checked path (``Store.prepare``) checks the record, raises naming the
metric, and applies it. ``update`` checks every entry before it applies any:
:func:`prepare` gives each entry's application, an open name's Python float its
buffer's append, every other value the checked path's (which ends where a record
would have put it).

>>> from metricsync._record._store import Store
>>> store = Store()
>>> def record(name, value):
...     ROUTES.get(value.__class__, general)(store, name, value, None, None)
>>> record("x", [1.0, 2.0])  # its first record: the list route hands it on, checked
>>> record("x", [6.0])  # the list route: joins the open buffer
>>> prepare(store, "x", 3.0)()  # update's form
>>> store.snapshot().compute()
{'x': 3.0}
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from . import _convert
from ._pending import FAST_LIMIT
from ._store import Store

__all__ = ["HOST_CPU", "ROUTES", "TENSOR", "Route", "general", "prepare"]

_FLOAT64 = np.float64
_NUMBER = frozenset((float, int))
HOST_CPU = _convert.HOST_DEVICE_TYPES  # CPU tensors are host data (tests may swap the set)
TENSOR: list[type | None] = [None]  # torch.Tensor, once a tensor was recorded

Route = Callable[[Store, Any, Any, Any, Any], None]


def general(store: Store, name: Any, value: Any, weight: Any, mask: Any) -> None:
    """A record no route took: a name's first number opens it, anything else is checked."""
    if weight is None and mask is None and name.__class__ is str and name not in store.table.index:
        number = _convert.opening_number(name, value, TENSOR[0]) if name else None
        if number is not None and store.add_number(name, number):
            return
    store.prepare(name, value, weight, mask)()
    if TENSOR[0] is None and value.__class__.__name__ in ("Tensor", "Parameter"):
        import torch

        TENSOR[0] = torch.Tensor
        ROUTES[torch.Tensor] = _tensor  # a Parameter (a subclass) takes the checked path


def prepare(store: Store, name: Any, value: Any) -> Callable[[], object]:
    """``value``'s record under ``name`` (no weight, no mask), checked: the function returned
    applies it and cannot fail. ``update`` takes it for each entry before it applies any."""
    cls = value.__class__
    if cls is float or cls is _FLOAT64:  # an int may not fit a float: it takes the checked path
        buf = store.pending.fast.get(name) if name.__class__ is str else None
        if buf is not None:
            return partial(buf.append, value)  # cannot fail
    return store.prepare(name, value, None, None)


def _tensor(store: Store, name: Any, value: Any, weight: Any, mask: Any) -> None:
    """A masked or weighted torch tensor (``Metrics.record`` takes a plain one itself): a
    CPU one under a CPU mask keeps its kept samples, one on an accelerator goes into its
    name's lane."""
    # add_on_device is not retried on the general path: a fold it sets off may fail (out of
    # memory) with the record pended; its checks raise as the general path's would
    on_host = value.is_cpu and _convert.HOST_DEVICE_TYPES is HOST_CPU
    if weight is None and on_host:
        try:
            if mask.__class__ is value.__class__ and name in store.pending.fast:
                if value.requires_grad:
                    value = value.detach()
                if store.add_masked(name, value, mask):
                    return
        except (KeyError, TypeError, RuntimeError, ValueError):
            pass
    elif (
        not on_host
        and name.__class__ is str
        and name in store.devices.lanes
        and store.add_on_device(name, value, weight, mask)
    ):
        return
    general(store, name, value, weight, mask)


def _ndarray(store: Store, name: Any, value: Any, weight: Any, mask: Any) -> None:
    """A small real numpy array joins its name's open number buffer."""
    fast = store.pending.fast
    if weight is None and mask is None and name in fast and store.add_small(name, value):
        return
    general(store, name, value, weight, mask)


def _list(store: Store, name: Any, value: Any, weight: Any, mask: Any) -> None:
    """A list of Python numbers extends its name's plain number buffer."""
    if weight is None and mask is None:
        try:
            buf = store.pending.fast[name]
            if buf.__class__ is array and _NUMBER.issuperset(map(type, value)):
                buf.extend(array("d", value))  # converted first: all or nothing
                if len(buf) >= FAST_LIMIT:
                    store.flush()
                return
        except (KeyError, TypeError, OverflowError):
            pass
    general(store, name, value, weight, mask)


#: the route of each value class that has one (torch.Tensor joins once a tensor is seen)
ROUTES: dict[type, Route] = {np.ndarray: _ndarray, list: _list}
