"""Process groups as a sync sees them: one :class:`GroupContext` per sync, and the one
registry of what each group remembers between syncs.

A sync resolves its group once, at its top (:func:`sync_target`, :func:`resolve`):
the default group for None, a 1-D ``DeviceMesh``'s group, this rank's facts, the
device its collectives run on and the group's :class:`GroupMemory`; that one
:class:`GroupContext` is passed down to the protocol and its collectives. Without an
initialized process group a sync is one rank's (:func:`alone`): the same protocol in a
group of this one rank, which runs no collective, so its result is what a sync over
a group of one gives (names in name order, ``argrank`` ranks, ``across`` aggregates).

**The registry's identity rule.** A group's memory is keyed by the process-group
object itself, held weakly: the default group is the object ``dist.group.WORLD``
names; a group re-created under a former one's name (``init_process_group`` after
``destroy_process_group``) is another object and starts afresh; an entry leaves
with its group, and a forked child starts with none (process groups do not survive
a fork). An async sync's bookkeeping group is a group too, with an entry of its own.

>>> check_timeout(2), check_timeout(None)
(2.0, None)
"""

from __future__ import annotations

import numbers
import os
import threading
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from ._layout import GroupState

__all__ = [
    "GroupContext",
    "GroupMemory",
    "alone",
    "check_timeout",
    "initialized_dist",
    "resolve",
    "resolve_group",
    "sync_target",
]

_MAX_TIMEOUT = 1e9  # seconds (about 31 years): longer ones mean no limit


def check_timeout(timeout: Any) -> float | None:
    """Seconds as a float; None (and timeouts beyond ``timedelta``'s range) wait without a limit."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    seconds = float(timeout)
    if not seconds > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return seconds if seconds < _MAX_TIMEOUT else None


def initialized_dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def resolve_group(dist: Any, group: Any) -> Any:
    """A process group: ``None`` is the default group, a 1-D ``DeviceMesh`` its group."""
    if group is None:
        return dist.group.WORLD
    if type(group).__name__ == "DeviceMesh":
        if group.ndim != 1:
            raise ValueError(
                f"sync takes a 1-D DeviceMesh (e.g. mesh['dp']), got one with {group.ndim} dims"
            )
        return group.get_group()
    return group


@dataclass(eq=False)
class GroupMemory:
    """What one process group remembers while it lives (the registry's entry)."""

    rank: int  # this rank's, in the group
    world: int
    backend: str
    ranks: tuple[int, ...]  # the group's global ranks, ascending
    state: GroupState = field(default_factory=GroupState)  # the agreed layout and its syncs
    bookkeeping: Any = None  # the gloo group of async syncs, or the SyncError creating it
    async_started: int = 0  # async syncs started on the bookkeeping group
    # per Metrics (its store): the position of its last async sync among those started
    async_last: weakref.WeakKeyDictionary[Any, int] = field(
        default_factory=weakref.WeakKeyDictionary
    )


class GroupContext(NamedTuple):
    """A sync's process group, resolved once at the sync's top and passed down."""

    dist: Any  # torch.distributed (None: no process group, see alone())
    group: Any  # the process group
    rank: int
    world: int
    backend: str
    device: Any  # where its collectives run: the current CUDA device for NCCL, else the CPU
    # (None without a process group: no collective runs)
    memory: GroupMemory

    @property
    def state(self) -> GroupState:
        """The group's agreed layout and what its syncs keep."""
        return self.memory.state


_REGISTRY: weakref.WeakKeyDictionary[Any, GroupMemory] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _alone_memory() -> GroupMemory:
    return GroupMemory(0, 1, "", (0,))


_ALONE = _alone_memory()  # the memory of the syncs without a process group


def _forget_after_fork() -> None:  # process groups do not survive a fork, nor a held lock
    global _REGISTRY, _LOCK, _ALONE
    _REGISTRY = weakref.WeakKeyDictionary()
    _LOCK = threading.Lock()
    _ALONE = _alone_memory()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def resolve(dist: Any, group: Any) -> GroupContext:
    """The :class:`GroupContext` of ``group`` (None: the default group; a 1-D
    ``DeviceMesh``: its group); ``ValueError`` if this rank is not a member."""
    group = resolve_group(dist, group)
    memory = _remembered(dist, group)
    return GroupContext(
        dist, group, memory.rank, memory.world, memory.backend, _device(memory.backend), memory
    )


def _remembered(dist: Any, group: Any) -> GroupMemory:
    """``group``'s entry in the registry (its facts asked of ``dist`` once)."""
    try:
        with _LOCK:
            memory = _REGISTRY.get(group)
    except TypeError:  # no weak reference to it: not a process group
        raise TypeError(f"metricsync sync: {group!r} is not a process group") from None
    if memory is not None:
        return memory
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this rank is not a member of the given process group")
    made = GroupMemory(
        rank,
        dist.get_world_size(group),
        str(dist.get_backend(group)).lower(),
        tuple(sorted(dist.get_process_group_ranks(group))),
    )
    with _LOCK:
        return _REGISTRY.setdefault(group, made)


_CPU: Any = None  # torch.device("cpu"), made once


def _device(backend: str) -> Any:
    """The device a group's collectives run on: the current CUDA device for NCCL."""
    global _CPU
    if "nccl" in backend:
        import torch

        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
    if _CPU is None:
        import torch

        _CPU = torch.device("cpu")
    return _CPU


def alone() -> GroupContext:
    """The context of a sync without a process group: a group of this one rank, with a
    memory of its own (as the default group has), whose syncs run no collective."""
    return GroupContext(None, None, 0, 1, "", None, _ALONE)


def sync_target(group: Any, timeout: Any) -> tuple[GroupContext, float | None]:
    """A sync's checked arguments ``(context, seconds)``; without an initialized process
    group, :func:`alone` (bad arguments fail with or without one)."""
    seconds = check_timeout(timeout)
    dist = initialized_dist()
    if dist is None:
        return alone(), seconds
    return resolve(dist, group), seconds
