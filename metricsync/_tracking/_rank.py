"""Which rank this process is: an explicit rank, then an initialized default process group,
then the launcher's global-rank variables, then 0.

>>> detect_rank(environ={"SLURM_PROCID": "5", "LOCAL_RANK": "1"})
5
>>> detect_rank(environ={"LOCAL_RANK": "3"})
3
>>> detect_rank(environ={})
0
"""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Mapping

__all__ = ["GLOBAL_RANK_VARIABLES", "detect_rank"]

GLOBAL_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Environment variables holding the global rank, in the order they are read."""


def _read(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected ${name} to be an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"expected ${name} to be a non-negative integer, got {text!r}")
    return value


def detect_rank(rank: int | None = None, *, environ: Mapping[str, str] | None = None) -> int:
    """This process's rank (see the module docstring for the order of sources).

    torch.distributed is asked only when it is already imported and its
    default process group is initialized (an uninitialized or unimported one
    cannot hold a rank), so this never pays for importing torch. ``environ``
    defaults to ``os.environ``. An empty variable counts as unset; one that
    is not a non-negative integer raises ``ValueError`` naming it.

    >>> detect_rank(3)
    3
    >>> detect_rank(environ={"RANK": "2", "SLURM_PROCID": "7"})
    2
    >>> detect_rank(environ={"JSM_NAMESPACE_RANK": "4"})
    4
    >>> detect_rank(environ={"RANK": "one"})
    Traceback (most recent call last):
    ...
    ValueError: expected $RANK to be an integer, got 'one'
    """
    if rank is not None:
        if isinstance(rank, bool) or operator.index(rank) < 0:
            raise ValueError(f"expected rank to be a non-negative int, got {rank!r}")
        return operator.index(rank)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    env = os.environ if environ is None else environ
    for name in GLOBAL_RANK_VARIABLES:
        value = _read(env, name)
        if value is not None:
            return value
    local = _read(env, "LOCAL_RANK")
    return 0 if local is None else local
