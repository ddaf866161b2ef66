"""Turning recorded values, weights and masks into validated arrays.

Host data (Python numbers, numpy) becomes flat float64 numpy arrays and is
checked here. Torch tensors stay torch tensors on their own device; only their
dtypes and shapes are checked here, never their values.

>>> host_values("loss", 2)
array([2.])
>>> host_values("loss", "2")
Traceback (most recent call last):
...
TypeError: metric 'loss': expected a real number, array or tensor, got str
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["as_torch", "host_mask", "host_values", "host_weights", "is_torch"]

_REAL_KINDS = "biuf"


def is_torch(value: object) -> bool:
    """Whether ``value`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def as_torch(value: object) -> Any:
    """A torch view of a ``__dlpack__`` object (device kept), or None if not applicable."""
    if is_torch(value):
        return value
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        return torch.from_dlpack(value)
    return None


def _type_error(name: str, what: str, value: object) -> TypeError:
    return TypeError(f"metric {name!r}: expected {what}, got {type(value).__name__}")


def _as_array(name: str, value: object, what: str) -> np.ndarray:
    if isinstance(value, (str, bytes, bytearray)) or value is None or isinstance(value, complex):
        raise _type_error(name, what, value)
    if isinstance(value, (bool, int, float)):
        try:
            return np.array(float(value))
        except OverflowError:
            raise ValueError(f"metric {name!r}: {value!r} does not fit in a float64") from None
    try:
        arr = np.asarray(value)
    except Exception as exc:  # an object whose __array__ fails
        raise TypeError(
            f"metric {name!r}: cannot read {type(value).__name__} as an array: {exc}"
        ) from None
    if arr.dtype.kind not in _REAL_KINDS:
        raise TypeError(f"metric {name!r}: expected {what}, got an array of dtype {arr.dtype}")
    return arr


def host_values(name: str, value: object) -> np.ndarray:
    """Flat float64 samples from a host value; ``TypeError`` naming the metric otherwise."""
    arr = _as_array(name, value, "a real number, array or tensor")
    return arr.astype(np.float64, copy=False).reshape(-1)


def host_weights(name: str, weight: object, shape: tuple[int, ...]) -> np.ndarray:
    """Weights broadcast to ``shape`` and flattened; finite and non-negative."""
    arr = _as_array(name, weight, "a real weight (number or array)").astype(np.float64, copy=False)
    try:
        arr = np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(
            f"metric {name!r}: weight of shape {arr.shape} does not broadcast to the value's shape {shape}"
        ) from None
    flat = np.ascontiguousarray(arr).reshape(-1)
    bad = ~np.isfinite(flat) | (flat < 0)
    if bad.any():
        raise ValueError(f"metric {name!r}: weights must be finite and >= 0, got {flat[bad][0]!r}")
    return flat


def host_mask(name: str, mask: object, shape: tuple[int, ...]) -> np.ndarray:
    """A flat float64 0/1 weight from a boolean (or 0/1 numeric) mask of exactly ``shape``."""
    arr = _as_array(name, mask, "a boolean mask array")
    if arr.shape != tuple(shape):
        raise ValueError(
            f"metric {name!r}: mask has shape {arr.shape}, the value has shape {tuple(shape)}"
        )
    return (arr.reshape(-1) != 0).astype(np.float64)
