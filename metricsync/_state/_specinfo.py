"""What a fold, a merge and the codec ask of each slot's spec: the columns it carries,
whether it drops NaN, whether it keeps a sketch; cached per table token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import _algebra as al
from ._spec import Spec
from ._tokens import kept, kept_if_any, latest_kept

__all__ = ["SpecInfo", "spec_info"]


class SpecInfo:
    """Per slot of a spec list, what a fold asks of its spec, as arrays: the columns it
    carries ``(NCOL_ALL, n)``, whether it drops NaN, whether it keeps a sketch."""

    __slots__ = ("carried", "ignore", "keep", "need", "sketch", "uncarried")

    def __init__(self, specs: Sequence[Spec], before: SpecInfo | None = None) -> None:
        """``before``: the info of a prefix of ``specs``, extended here by the rest."""
        self.keep = tuple(specs)  # alive while cached, so no other object takes their ids
        done = 0 if before is None else len(before.keep)
        ids, kinds = al.spec_kinds(self.keep[done:])  # specs are few, slots many
        carries = np.array([al.carries(s) for s in kinds], dtype=bool).reshape(-1, al.NCOL_ALL)
        self.carried = carries[ids].T
        self.ignore = np.array([s.nan == "ignore" for s in kinds], dtype=bool)[ids]
        self.sketch = np.array([s.needs_sketch for s in kinds], dtype=bool)[ids]
        if before is not None:
            self.carried = np.concatenate([before.carried, self.carried], axis=1)
            self.ignore = np.concatenate([before.ignore, self.ignore])
            self.sketch = np.concatenate([before.sketch, self.sketch])
        self.uncarried = ~self.carried[: al.NCOL]  # persisted columns a fold sets back
        # the columns any of them carries: a fold computes these for every run (a column a
        # metric does not carry is set back to its identity afterwards)
        self.need = set(np.flatnonzero(self.carried.any(axis=1)).tolist())


def spec_info(specs: Sequence[Spec], key: object = None) -> SpecInfo:
    """The :class:`SpecInfo` of ``specs``, kept by ``key`` (an object that stands for
    exactly these specs, as a table's token does: see :func:`metricsync._tokens.kept`)
    or else by the identity of each spec: a table's spec list changes rarely, and is
    read at every fold.

    >>> spec_info([Spec("max"), Spec(("mean", "p50"), nan="ignore")]).ignore.tolist()
    [False, True]
    """
    by_id = key is None
    if by_id:
        key = tuple(map(id, specs))
    entry = kept_if_any(key)
    info = None if entry is None else entry.info
    if info is None:
        # a table gains names at its end: what was kept last most often holds a prefix
        latest = latest_kept()
        entry = kept(key)
        before = None if latest is None or latest is entry else latest.info
        if before is not None and not (
            len(before.keep) <= len(specs) and before.keep == tuple(specs[: len(before.keep)])
        ):
            before = None
        if before is not None and len(before.keep) == len(specs) and not by_id:
            info = before  # the same specs, nothing to add (by id, it must keep these ones)
        else:
            info = SpecInfo(specs, before)
        entry.info = info  # folds run on several threads (async syncs): either is right
    return info
