"""The collectives of one sync: numpy buffers through a process group, under one deadline.

:class:`Comm` waits with what remains of the deadline and turns backend failures into
:class:`~metricsync.SyncError`, marking the group broken. On gloo a gather is one all-to-all,
and host collectives are polled before blocking (cheaper wake-ups on small payloads); a group
of one rank runs no collective.

>>> import numpy as np
>>> remaining(None) is None
True
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import numpy as np

from .._state._errors import SyncError
from ._group import GroupContext

__all__ = ["EXCHANGE_MAX", "POLL_SECONDS", "Comm", "remaining"]

#: the largest group whose gloo gathers are all-to-alls: its input is the array repeated
#: once per rank, memory that grows with the group (a ring all_gather's does not)
EXCHANGE_MAX = 64

#: how long a wait for a host collective polls (yielding the CPU) before it blocks
POLL_SECONDS = 0.005

_YIELD = getattr(os, "sched_yield", None)  # not on every platform: there, no poll


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic`` value), or None without one."""
    return None if deadline is None else deadline - time.monotonic()


def poll(work: Any, seconds: float, pause: Any) -> bool:
    """Whether ``work`` completed within about ``seconds``, checked between calls of
    ``pause`` (a work without ``is_completed`` is never polled: False).

    >>> class Done:
    ...     def is_completed(self): return True
    >>> poll(Done(), 0.001, lambda: None), poll(object(), 0.001, lambda: None)
    (True, False)
    """
    done = getattr(work, "is_completed", None)
    if done is None:
        return False
    end = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= end:
            return False
        pause()
    return True


class Comm:
    """Collectives of one sync on the group of ``ctx``; see the module docstring."""

    def __init__(self, ctx: GroupContext, deadline: float | None, poll: bool = True) -> None:
        self.ctx = ctx
        self.exchange = ctx.backend == "gloo"  # gather by an all-to-all (see all_gather)
        self.host = ctx.device is None or ctx.device.type == "cpu"  # None: no process group
        self.poll = poll and _YIELD is not None and self.host  # see _wait
        self.deadline = deadline
        self.count = 0
        self.bytes_sent = 0

    def _fail(self, what: str, exc: BaseException | None) -> SyncError:
        reason = f"{what} did not complete" + (f": {exc}" if exc is not None else "")
        self.ctx.state.broken = f"an earlier sync failed ({reason})"
        return SyncError(f"metricsync sync: {reason}")

    def _wait(self, work: Any, what: str) -> None:
        left = remaining(self.deadline)
        if left is not None and left <= 0:
            raise self._fail(what, TimeoutError("the sync's timeout ran out"))
        try:
            if self.poll:  # see the module docstring
                poll(work, POLL_SECONDS if left is None else min(POLL_SECONDS, left / 2), _YIELD)
                left = None if left is None else max(left - POLL_SECONDS, left / 2)
            if left is None:
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=left))
        except Exception as exc:  # the backend's timeout, or a peer that went away
            raise self._fail(what, exc) from exc

    def _start(self, fn: Any, what: str, *args: Any) -> Any:
        left = remaining(self.deadline)
        if left is not None and left <= 0:
            raise self._fail(what, TimeoutError("the sync's timeout ran out"))
        self.count += 1
        try:
            return fn(*args, group=self.ctx.group, async_op=True)
        except Exception as exc:
            raise self._fail(what, exc) from exc

    def _tensor(self, array: np.ndarray) -> Any:
        import torch

        t = torch.from_numpy(array)
        return t if self.host else t.to(self.ctx.device)

    def _array(self, tensor: Any) -> np.ndarray:
        result: np.ndarray = tensor.numpy() if self.host else tensor.cpu().numpy()
        return result

    def all_gather(self, array: np.ndarray, what: str) -> np.ndarray:
        """Every rank's ``array`` (equal shapes on every rank), stacked by rank; in a group
        of one rank, this one's, with no collective (gloo would still hand it to a thread
        and back, NCCL copy it to the device and back)."""
        world, dist = self.ctx.world, self.ctx.dist
        if world == 1:
            return np.ascontiguousarray(array).reshape(1, *array.shape)
        import torch

        mine = self._tensor(np.ascontiguousarray(array))
        out = torch.empty(world * mine.numel(), dtype=mine.dtype, device=mine.device)
        self.bytes_sent += array.nbytes
        if self.exchange and 1 < world <= EXCHANGE_MAX:
            # gloo: every rank sends its array to every other rank at once (an all-to-all
            # of it repeated), where gloo's all_gather passes the arrays around a ring in
            # world - 1 steps; each rank puts the same bytes on the wire, in less time.
            # Host arrays are repeated by numpy: a torch op costs more around the copy
            spread = dist.all_to_all_single
            copies = (
                self._tensor(np.concatenate([array] * world)) if self.host else mine.repeat(world)
            )
            self._wait(self._start(spread, what, out, copies), what)
        else:
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            self._wait(self._start(gather, what, out, mine), what)
        return self._array(out).reshape(world, *array.shape)

    def all_reduce(self, array: np.ndarray, op: Any, what: str) -> np.ndarray:
        """``array`` reduced with ``op`` over every rank (in place for host buffers)."""
        t = self._tensor(np.ascontiguousarray(array))
        self.bytes_sent += array.nbytes
        self._wait(self._start(self.ctx.dist.all_reduce, what, t, op), what)
        return self._array(t)
