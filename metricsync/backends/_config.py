"""Hyperparameters (``Tracker(config=...)``) in the shapes backends accept.

W&B, SwanLab and Trackio take a nested mapping as it is; TensorBoard's
hparams and MLflow's params are flat, so :func:`flat_config` joins nested
keys with ``/`` and turns values that are not ``bool``, ``int``, ``float`` or
``str`` into their ``str``.

>>> flat_config({"optim": {"lr": 3e-4, "betas": (0.9, 0.95)}, "seed": 1, "amp": True})
{'optim/lr': 0.0003, 'optim/betas': '(0.9, 0.95)', 'seed': 1, 'amp': True}
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["as_config", "flat_config"]


def as_config(config: object) -> dict[str, Any]:
    """``config`` as a plain dict: a mapping, a dataclass instance or an ``argparse.Namespace``.

    >>> import argparse
    >>> as_config(argparse.Namespace(lr=0.1))
    {'lr': 0.1}
    >>> as_config([("lr", 0.1)])
    Traceback (most recent call last):
    ...
    TypeError: expected config to be a mapping, a dataclass instance or an argparse.Namespace, got list
    """
    if isinstance(config, Mapping):
        out = dict(config)
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        out = dataclasses.asdict(config)
    elif isinstance(config, argparse.Namespace):
        out = dict(vars(config))
    else:
        raise TypeError(
            "expected config to be a mapping, a dataclass instance or an argparse.Namespace, "
            f"got {type(config).__name__}"
        )
    bad = [key for key in out if not isinstance(key, str)]
    if bad:
        raise TypeError(f"expected config keys to be str, got {bad[0]!r}")
    return out


def _scalar(value: object) -> bool | int | float | str:
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def flat_config(config: Mapping[str, Any], sep: str = "/") -> dict[str, bool | int | float | str]:
    """Nested mappings flattened to ``outer/inner`` keys with scalar values.

    >>> import numpy as np
    >>> flat_config({"a": {"b": {"c": np.float32(0.5)}}, "n": np.int64(3), "none": None})
    {'a/b/c': 0.5, 'n': 3, 'none': 'None'}
    """
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            for inner, leaf in flat_config(value, sep).items():
                out[f"{key}{sep}{inner}"] = leaf
        else:
            out[str(key)] = _scalar(value)
    return out
