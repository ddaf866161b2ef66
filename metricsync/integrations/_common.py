"""What the integrations share: the missing-package message and picking numbers out of logs.

>>> scalars({"loss": 0.5, "epoch": 1, "note": "warmup", "ok": True, "hist": [1, 2]})
{'loss': 0.5, 'epoch': 1}
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["is_scalar", "missing_extra", "scalars"]


def missing_extra(integration: str, package: str, extra: str) -> str:
    """The message of the ``ImportError`` an integration raises when its package is missing.

    >>> missing_extra("lightning", "lightning", "lightning")
    'metricsync.integrations.lightning needs the lightning package: pip install "metricsync[lightning]"'
    """
    return (
        f"metricsync.integrations.{integration} needs the {package} package: "
        f'pip install "metricsync[{extra}]"'
    )


def is_scalar(value: object) -> bool:
    """Whether ``value`` is one real number: a Python, numpy or 0-d torch/numpy number.

    Booleans, strings, sequences and arrays with elements are not.

    >>> import numpy as np
    >>> [is_scalar(v) for v in (1, 2.5, np.float32(1.0), np.array(3.0), True, "1", [1.0])]
    [True, True, True, True, False, False, False]
    """
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is None or shape is None or len(tuple(shape)) != 0:
        return False
    if getattr(dtype, "is_complex", False) or getattr(dtype, "kind", "f") in "cbOSUV":
        return False
    return str(dtype) not in ("torch.bool", "torch.complex64", "torch.complex128")


def scalars(logs: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``logs`` that are one real number (see :func:`is_scalar`), in order;
    a real number of another kind than int or float (``Fraction``) as a float, and an int
    beyond float64 left out, as a non-number is.

    >>> from fractions import Fraction
    >>> scalars({"ratio": Fraction(1, 4), "huge": 10**400, "n": 3})
    {'ratio': 0.25, 'n': 3}
    """
    out = {}
    for key, value in logs.items():
        if isinstance(key, str) and is_scalar(value):
            try:
                out[key] = _plain(value)
            except OverflowError:  # no float64 holds it
                continue
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        float(value)  # OverflowError beyond float64
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, (float, numbers.Integral)):
        return value if hasattr(value, "dtype") else float(value)
    return value
