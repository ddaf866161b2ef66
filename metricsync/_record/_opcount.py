"""What code asks of a device, counted without one: ops dispatched and blocking uploads.

:func:`count_device_ops` counts aten ops on one device's tensors; :func:`count_blocking_uploads`
counts synchronous host-to-device copies. Re-exported by :mod:`metricsync.testing`.

>>> import torch
>>> x = torch.zeros(10, 5, device="meta")
>>> with count_blocking_uploads() as uploads:
...     _ = x[2:5]  # a slice: a view, no data moves
...     _ = x[[2, 3, 4]]  # a list index: copied to the device first
...     x[2] = torch.ones(5)  # a host tensor written into the device tensor
>>> dict(uploads)
{'Tensor.__getitem__': 1, 'Tensor.__setitem__': 1}
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

from ._convert import meta_records

__all__ = ["count_blocking_uploads", "count_device_ops"]


def _same(got: Any, want: Any) -> bool:
    """Whether device ``got`` is ``want`` (a ``want`` without an index matches any)."""
    return bool(got.type == want.type and (want.index is None or got.index == want.index))


def _matcher(device: Any) -> Any:
    import torch

    want = torch.device(device)

    def on_device(obj: object) -> bool:
        return isinstance(obj, torch.Tensor) and _same(obj.device, want)

    return on_device


@contextlib.contextmanager
def count_device_ops(device: Any = "meta") -> Iterator[collections.Counter[str]]:
    """Count the aten ops dispatched inside the block on tensors of ``device``, by op name.

    Yields a ``collections.Counter`` that fills as the block runs:
    ``"aten.add"`` -> number of dispatches (``ops.total()`` is the sum). An op
    counts when one of its tensor inputs or outputs lives on ``device``
    (``"cuda"`` matches every CUDA device, ``"cuda:1"`` only that one), so
    factory ops such as ``aten.full(..., device=device)`` count and host-side
    work on CPU tensors does not (unless ``device="cpu"``). It is built on
    ``torch.utils._python_dispatch.TorchDispatchMode``, so it sees the ops
    below autograd: a ``detach`` is one op, a Python-level ``torch.stack`` of
    views is each view plus the stack.

    On a GPU each counted op is (at least) one kernel launch, which costs
    several microseconds of CPU time however small the tensor. On the
    ``meta`` device ops only compute shapes, so counting there measures what
    code would launch without needing a GPU. The ``meta`` device holds no
    data: any read of it (``.item()``, ``.tolist()``, ``.cpu()``,
    ``.numpy()``, ``float(t)``, a ``bool`` of a comparison) raises, so code
    that completes on ``meta`` tensors provably never read the device.

    >>> import torch
    >>> x = torch.ones(4, 256, device="meta")
    >>> with count_device_ops() as ops:
    ...     y = (x * 2.0).sum()
    >>> dict(ops), ops.total()
    ({'aten.mul': 1, 'aten.sum': 1}, 2)
    >>> with count_device_ops():
    ...     y.item()
    Traceback (most recent call last):
    ...
    RuntimeError: Tensor.item() cannot be called on meta tensors
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    on_device = _matcher(device)
    counts: collections.Counter[str] = collections.Counter()

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if any(on_device(leaf) for leaf in tree_leaves((args, kwargs, out))):
                counts[str(func.overloadpacket)] += 1
            return out

    with _Counter(), _stand_in(device):
        yield counts


def _stand_in(device: Any) -> contextlib.AbstractContextManager[None]:
    """On the meta device, :func:`~metricsync._record._convert.meta_records`: records of meta
    tensors are accepted inside the block, as an accelerator's."""
    import torch

    return meta_records() if torch.device(device).type == "meta" else contextlib.nullcontext()


def _host_data(obj: object) -> bool:
    """Whether ``obj``, used as an index or a value to write, is data on the host: a list,
    a numpy array, or a CPU tensor that is not 0-d (a 0-d one is passed as a scalar)."""
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.device.type == "cpu" and obj.dim() > 0
    return isinstance(obj, (list, np.ndarray))


@contextlib.contextmanager
def count_blocking_uploads(device: Any = "meta") -> Iterator[collections.Counter[str]]:
    """Count the calls inside the block that upload host data to ``device`` and wait for it.

    Yields a ``collections.Counter`` of call names (``"Tensor.__getitem__"``,
    ``"torch.tensor"``, ``"Tensor.to"``). Counted, for a tensor on ``device``:

    - indexing it, or writing into it, with a list, a numpy array or a CPU
      tensor that is not 0-d (the index is copied to the device first);
    - writing such host data into it (``t[i] = host``, ``t.copy_(host)``);
    - ``torch.tensor``/``torch.as_tensor`` of host data onto ``device``;
    - ``.to(device)`` of a CPU tensor that is not 0-d without ``non_blocking=True``.

    A ``non_blocking`` copy (from pinned memory, on CUDA) and 0-d CPU tensors
    (passed as scalars) are not counted. Built on ``torch.overrides.TorchFunctionMode``,
    so it sees Python-level calls, before torch turns an index list into a tensor.

    >>> import torch
    >>> x = torch.zeros(8, device="meta")
    >>> with count_blocking_uploads() as uploads:
    ...     y = torch.tensor([1.0, 2.0], device="meta")
    ...     z = torch.ones(8).to("meta", non_blocking=True)
    ...     _ = x.copy_(torch.ones(8))
    >>> dict(uploads)
    {'torch.tensor': 1, 'Tensor.copy_': 1}
    """
    import torch
    from torch.overrides import TorchFunctionMode

    on_device = _matcher(device)
    counts: collections.Counter[str] = collections.Counter()
    target = torch.device(device)

    def targets(where: Any) -> bool:
        return where is not None and _same(torch.device(where), target)

    def blocking(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        this = args[0] if args else None
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put"):
            index = args[1] if len(args) > 1 else kwargs.get("indices")
            parts = index if isinstance(index, tuple) else (index,)
            value = args[2:3] if name == "__setitem__" else ()
            return on_device(this) and any(map(_host_data, (*parts, *value)))
        if name == "copy_":
            nb = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            return on_device(this) and _host_data(args[1]) and not nb
        if name in ("tensor", "as_tensor"):
            return targets(kwargs.get("device")) and not isinstance(args[0], torch.Tensor)
        if name == "to" and _host_data(this):
            where = kwargs.get("device", next((a for a in args[1:] if _is_device(a)), None))
            nb = kwargs.get("non_blocking", any(a is True for a in args[1:]))
            return targets(where) and not nb
        return False

    class _Uploads(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if blocking(name, args, kwargs):
                owner = "Tensor" if args and isinstance(args[0], torch.Tensor) else "torch"
                counts[f"{owner}.{name}"] += 1
            return func(*args, **kwargs)

    with _Uploads(), _stand_in(device):
        yield counts


def _is_device(obj: object) -> bool:
    import torch

    return isinstance(obj, (str, torch.device))
