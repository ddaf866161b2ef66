"""Turning recorded values, weights and masks into checked arrays.

Host data becomes flat float64 numpy arrays, copied and checked here; accelerator tensors stay
on their device, with only their dtypes and shapes checked.

>>> host_values("loss", 2)
array([2.])
>>> host_values("loss", "2")
Traceback (most recent call last):
...
TypeError: metric 'loss': expected a real number, array or tensor, got str
>>> host_mask("ent", [0.5, 1.0], (2,))
Traceback (most recent call last):
...
ValueError: metric 'ent': a mask holds 0/1 or booleans, got np.float64(0.5); use weight= for fractions
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

__all__ = [
    "ArrayLike",
    "Number",
    "RecordValue",
    "HOST_DEVICE_TYPES",
    "as_torch",
    "check_tensor",
    "device_inputs",
    "device_mask",
    "device_weight",
    "host_mask",
    "host_record",
    "host_scalar",
    "host_values",
    "host_weights",
    "is_plain_tensor",
    "readable_dtypes",
    "is_torch",
    "META_STANDINS",
    "meta_allowed",
    "meta_records",
]


class _SupportsArray(Protocol):
    def __array__(self) -> Any: ...


class _SupportsDLPack(Protocol):
    def __dlpack__(self) -> Any: ...


#: a value ``record`` takes as one sample (``bool`` and ``int`` are ``float`` to a type checker)
Number = float | np.number[Any] | np.bool_
#: a value ``record`` takes as one sample per element: arrays, tensors, lists and tuples
ArrayLike = np.ndarray | _SupportsArray | _SupportsDLPack | list[Any] | tuple[Any, ...]
#: what ``Metrics.record`` takes (a string, ``None`` or a complex number is not one)
RecordValue = Number | ArrayLike

_REAL_KINDS = "biuf"
#: Device types whose tensors live in host memory: recorded as host data, like numpy.
#: Tests empty it to send CPU tensors down the accelerator path.
HOST_DEVICE_TYPES = frozenset({"cpu"})


def _loaded_torch() -> Any:
    """The torch module if it was imported (never importing it); None otherwise.

    Another thread may be importing torch right now (a first ``sync`` does):
    then the module is in ``sys.modules`` but partly initialized, and the
    import statement waits until it is complete.
    """
    torch = sys.modules.get("torch")
    if torch is not None and not hasattr(torch, "from_dlpack"):  # set late in torch's import
        import torch  # waits for the importing thread (returns at once inside that import)
    return torch


def is_torch(value: object) -> bool:
    """Whether ``value`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    tensor = getattr(torch, "Tensor", None)
    if tensor is None:  # torch is being imported by another thread: wait for it
        tensor = getattr(_loaded_torch(), "Tensor", None)
    return tensor is not None and isinstance(value, tensor)


def as_torch(value: object) -> Any:
    """A torch view of a ``__dlpack__`` object (device kept), or None if not applicable."""
    if is_torch(value):
        return value
    if not hasattr(value, "__dlpack__") or isinstance(value, np.ndarray):
        return None
    torch = _loaded_torch()
    return None if torch is None else torch.from_dlpack(value)


#: torch dtypes read as numbers (float8 and bfloat16 through float32); others raise TypeError
_READABLE_DTYPES = (
    ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"),
    ("float16", "bfloat16", "float32", "float64"),
    ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"),
)


def readable_dtypes() -> frozenset[Any]:
    """The torch dtypes whose values can be read as float64 (torch is imported)."""
    global _READABLE
    if _READABLE is None:
        import torch

        _STRIDED[0] = torch.strided
        names = [n for group in _READABLE_DTYPES for n in group if hasattr(torch, n)]
        _READABLE = frozenset(getattr(torch, n) for n in names)
    return _READABLE


_READABLE: frozenset[Any] | None = None


def is_plain_tensor(t: Any) -> bool:
    """Whether ``t`` is a dense tensor of a readable dtype (what :func:`check_tensor` lets
    pass, but for the ``meta`` check): a cheap test for the fast paths."""
    return t.layout is _STRIDED[0] and t.dtype in (_READABLE or readable_dtypes())


_STRIDED: list[Any] = [None]  # torch.strided, once torch is loaded
META_STANDINS = [0]  #: open blocks in which meta tensors stand in for an accelerator's


@contextlib.contextmanager
def meta_records() -> Iterator[None]:
    """Inside the block, tensors on the ``meta`` device are recorded as an accelerator's
    would be (their ops counted, no data read); outside it they are refused at the record."""
    META_STANDINS[0] += 1
    try:
        yield
    finally:
        META_STANDINS[0] -= 1


def meta_allowed() -> bool:
    """Whether meta tensors stand in for an accelerator's now (see :func:`meta_records`)."""
    return META_STANDINS[0] > 0


def check_tensor(name: str, t: Any, what: str = "value") -> None:
    """``TypeError`` naming the metric for tensors metricsync cannot read as real samples
    (a ``meta`` tensor holds none: refused outside :func:`meta_records`, unless empty)."""
    torch = sys.modules["torch"]
    strided = t.layout is torch.strided
    if t.is_meta and not META_STANDINS[0] and t.numel():
        raise TypeError(
            f"metric {name!r}: a {what} tensor on the 'meta' device holds no data to record "
            "(metricsync.testing.meta_records() lets tests record them as stand-ins)"
        )
    if strided and t.dtype in readable_dtypes() and not (t.is_quantized or t.is_nested):
        if t.__class__ is torch.Tensor or not _own_dispatch(t, torch):
            return
        raise TypeError(
            f"metric {name!r}: a {what} tensor of class {t.__class__.__name__} (a tensor "
            "subclass with its own dispatch) cannot be read as samples; record a plain "
            "tensor, e.g. t.to_local() or t.full_tensor() of a DTensor, whichever holds "
            "the samples this rank contributes"
        )
    if t.is_complex():
        raise TypeError(f"metric {name!r}: expected a real tensor, got dtype {t.dtype}")
    if getattr(t, "is_nested", False):
        raise TypeError(
            f"metric {name!r}: a nested {what} tensor cannot be recorded; "
            "record each component (t.unbind()) or t.to_padded_tensor(0.0) with a mask"
        )
    if t.is_quantized:
        raise TypeError(f"metric {name!r}: a quantized {what} tensor; record t.dequantize()")
    if not strided:
        layout = str(t.layout).removeprefix("torch.")
        raise TypeError(
            f"metric {name!r}: a {layout} {what} tensor; record t.to_dense() (or its values())"
        )
    raise TypeError(
        f"metric {name!r}: cannot read a {what} tensor of dtype {t.dtype} as numbers; "
        "convert it to a float dtype first (e.g. t.to(torch.float32))"
    )


def _own_dispatch(t: Any, torch: Any) -> bool:
    """Whether ``t``'s class dispatches torch ops itself (a DTensor, a fake tensor): its
    values are not a plain tensor's (a ``Parameter`` does not)."""
    return type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__


def _type_error(name: str, what: str, value: object) -> TypeError:
    return TypeError(f"metric {name!r}: expected {what}, got {type(value).__name__}")


def _as_array(name: str, value: object, what: str, role: str) -> np.ndarray:
    if isinstance(value, (str, bytes, bytearray)) or value is None or isinstance(value, complex):
        raise _type_error(name, what, value)
    if isinstance(value, (bool, int, float)):
        try:
            return np.array(float(value))
        except OverflowError:
            raise ValueError(f"metric {name!r}: {value!r:.40} does not fit in a float64") from None
    if is_torch(value):
        return _tensor_array(name, value, role)
    if role != "value" and isinstance(value, np.ma.MaskedArray) and np.ma.getmask(value).any():
        raise TypeError(
            f"metric {name!r}: a {role} with masked elements (fill them: {role}.filled(0))"
        )
    try:
        arr = np.asarray(value)
    except Exception as exc:  # an object whose __array__ fails
        raise TypeError(
            f"metric {name!r}: cannot read {type(value).__name__} as an array: {exc}"
        ) from None
    if arr.dtype == object and isinstance(value, (list, tuple)) and _numbers(value):
        # Python ints beyond int64 (numpy keeps them as objects): floats, as one int is
        try:
            return np.array(value, dtype=np.float64)
        except OverflowError:
            raise ValueError(f"metric {name!r}: a number does not fit in a float64") from None
    if arr.dtype.kind not in _REAL_KINDS:
        raise TypeError(f"metric {name!r}: expected {what}, got an array of dtype {arr.dtype}")
    return arr


def _numbers(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether ``values`` holds Python numbers only (bool, int, float)."""
    return all(v.__class__ in (int, float, bool) for v in values)


def _tensor_array(name: str, t: Any, role: str) -> np.ndarray:
    """A host (CPU) tensor as numpy: a zero-copy view where numpy knows the dtype."""
    check_tensor(name, t, role)
    if t.requires_grad:
        t = t.detach()
    if t.dtype.itemsize < 4 and t.is_floating_point():  # float16/bfloat16/float8
        t = t.float()  # no numpy dtype for most of them; float32 holds them all exactly
    if t.is_neg():
        t = t.resolve_neg()
    arr: np.ndarray = t.numpy()
    return arr


def host_scalar(name: str, t: Any) -> float:
    """The number a 0-d host tensor holds: ``float()`` reads it without the numpy view
    :func:`host_values` makes (the same number); ``TypeError`` naming the metric for a
    tensor of no real numbers.

    >>> import torch
    >>> host_scalar("x", torch.tensor(3, dtype=torch.int8)), host_scalar("x", torch.tensor(True))
    (3.0, 1.0)
    """
    check_tensor(name, t)
    if t.requires_grad:  # float() of a tensor in a graph warns; a metric reads it apart
        t = t.detach()
    try:
        return float(t)
    except (TypeError, RuntimeError):  # a dtype ``float()`` cannot read: through numpy
        return float(host_values(name, t)[0])


def opening_number(name: str, value: object, tensor: type | None) -> float | None:
    """The number of a record that may open ``name``'s number buffer directly (the first
    record of a name, unweighted, unmasked): a Python or numpy number, or a 0-d CPU
    tensor (class ``tensor``) while CPU tensors are host data; None for anything else,
    a number too big for a float included (the general path names what is wrong).

    >>> opening_number("x", 3, None), opening_number("x", [3.0], None), opening_number("x", 10**400, None)
    (3.0, None, None)
    """
    cls = value.__class__
    if cls is float or cls is int or cls is np.float64:
        try:
            return float(value)  # type: ignore[arg-type]
        except OverflowError:
            return None
    if cls is not tensor or "cpu" not in HOST_DEVICE_TYPES:
        return None
    t: Any = value
    return host_scalar(name, t) if t.is_cpu and not t.ndim else None


def host_values(name: str, value: object) -> np.ndarray:
    """Flat real samples from a host value (a view where possible, in its own dtype: the
    caller converts and copies what it keeps); ``TypeError`` naming the metric otherwise."""
    arr = _as_array(name, value, "a real number, array or tensor", "value")
    return arr.reshape(-1)


def host_weights(name: str, weight: object, shape: tuple[int, ...]) -> np.ndarray:
    """Weights broadcast to ``shape`` and flattened; finite and non-negative."""
    arr = _as_array(name, weight, "a real weight (number or array)", "weight")
    arr = arr.astype(np.float64, copy=False)
    try:
        arr = np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(
            f"metric {name!r}: weight of shape {arr.shape} does not broadcast to the value's shape {shape}"
        ) from None
    flat = np.asarray(arr, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(flat) | (flat < 0)
    if bad.any():
        raise ValueError(f"metric {name!r}: weights must be finite and >= 0, got {flat[bad][0]!r}")
    return flat


def host_mask(name: str, mask: object, shape: tuple[int, ...]) -> np.ndarray:
    """A flat boolean array from a boolean (or 0/1 numeric) mask of exactly ``shape``."""
    arr = _as_array(name, mask, "a boolean mask array", "mask")
    if arr.shape != tuple(shape):
        raise ValueError(
            f"metric {name!r}: mask has shape {arr.shape}, the value has shape {tuple(shape)}"
        )
    flat = arr.reshape(-1)
    if flat.dtype != np.bool_:
        odd = (flat != 0) & (flat != 1)
        if odd.any():
            raise ValueError(
                f"metric {name!r}: a mask holds 0/1 or booleans, got {flat[odd][0]!r}; "
                "use weight= for fractions"
            )
        return flat != 0
    return flat


def host_record(
    name: str, value: Any, weight: object, mask: object, finite: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """One host record's samples and weights (a mask's zeros among them), checked;
    with ``finite`` (``nan="error"``), a non-finite sample of positive weight raises.

    >>> host_record("ent", [1.0, 2.0], None, [True, False], finite=False)
    (array([1., 2.]), array([ True, False]))
    """
    values = host_values(name, value)
    shape = tuple(value.shape) if is_torch(value) else np.shape(value)
    w = None if weight is None else host_weights(name, weight, shape)
    if mask is not None:  # a boolean array; beside a weight, the weight's zeros
        m = host_mask(name, mask, shape)
        w = m if w is None else w * m
    if isinstance(value, np.ma.MaskedArray) and np.ma.getmask(value) is not np.ma.nomask:
        # np.asarray drops a masked array's mask: its masked elements are no samples
        kept = ~np.broadcast_to(np.ma.getmask(value), shape).reshape(-1)
        w = kept if w is None else w * kept
    if finite:
        bad = ~np.isfinite(values) if w is None else ~np.isfinite(values) & (w > 0)
        if bad.any():
            raise ValueError(
                f"metric {name!r}: non-finite sample {values[bad][0]!r} under nan='error'"
            )
    return values, w


def device_inputs(name: str, x: Any, weight: Any, mask: Any) -> tuple[Any, Any]:
    """``x`` checked, and its weight and mask on its device: ``TypeError``/``ValueError``
    naming the metric for bad input."""
    check_tensor(name, x)
    w = None if weight is None else device_weight(name, weight, x)
    m = None if mask is None else device_mask(name, mask, x)
    return w, m


def device_weight(name: str, weight: Any, x: Any) -> Any:
    """A weight for device tensor ``x``: a checked Python float, or a tensor on ``x``'s device.

    Host weights are checked here; a tensor's values are checked by the fold.
    """
    import torch

    if is_torch(weight):
        check_tensor(name, weight, "weight")
        try:
            shape = torch.broadcast_shapes(weight.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape:
            raise ValueError(
                f"metric {name!r}: weight of shape {tuple(weight.shape)} does not broadcast "
                f"to the value's shape {tuple(x.shape)}"
            )
        return _on_device(weight, x.device)
    if np.ndim(weight) == 0 and not isinstance(weight, np.ndarray):
        return float(host_weights(name, weight, ())[0])
    flat = host_weights(name, weight, tuple(x.shape))
    if not flat.flags.writeable:  # a broadcast view: torch warns about read-only arrays
        flat = flat.copy()
    return _on_device(torch.from_numpy(flat.reshape(x.shape)), x.device)


def _on_device(t: Any, device: Any) -> Any:
    """``t`` on ``device`` without waiting for the device (pinned, non-blocking from the host).

    From the host to CUDA, through a pinned buffer of its own: ``pin_memory()`` returns a
    tensor already pinned as it is, and the caller may write that buffer as soon as
    ``record()`` returns, before the copy ran."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        import torch

        t = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return t.to(device, non_blocking=True)


def device_mask(name: str, mask: Any, x: Any) -> Any:
    """A mask for device tensor ``x``, on its device: bool, or numeric checked 0/1 by the fold."""
    import torch

    if is_torch(mask):
        check_tensor(name, mask, "mask")
        if tuple(mask.shape) != tuple(x.shape):
            raise ValueError(
                f"metric {name!r}: mask has shape {tuple(mask.shape)}, "
                f"the value has shape {tuple(x.shape)}"
            )
        return _on_device(mask, x.device)
    flat = host_mask(name, mask, tuple(x.shape))
    return _on_device(torch.from_numpy(flat.reshape(x.shape)), x.device)
