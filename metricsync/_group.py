"""Process groups as a sync sees them: the default group, a 1-D ``DeviceMesh``, the device
collectives run on, the key a group's memory is kept under, and timeouts.

>>> check_timeout(2), check_timeout(None)
(2.0, None)
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable
from datetime import timedelta
from typing import Any, NamedTuple

__all__ = [
    "check_timeout",
    "GroupFacts",
    "comm_device",
    "group_facts",
    "group_key",
    "initialized_dist",
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


def sync_target(group: Any, timeout: Any) -> tuple[Any, Any, float | None]:
    """A sync's checked arguments ``(dist, group, seconds)``; ``dist`` is None without an
    initialized process group (bad arguments fail with or without one)."""
    seconds = check_timeout(timeout)
    dist = initialized_dist()
    if dist is None:
        return None, group, seconds
    group = resolve_group(dist, group)
    group_facts(dist, group)  # raises for a group this rank is not a member of
    return dist, group, seconds


class GroupFacts(NamedTuple):
    """What a sync asks of a process group: none of it changes while the group lives."""

    rank: int
    world: int
    key: Hashable  # the key a group's memory is kept under
    backend: str


_FACTS: dict[int, tuple[Any, Any, GroupFacts]] = {}  # id(group) -> (group, dist, facts)


def group_facts(dist: Any, group: Any) -> GroupFacts:
    """This rank's :class:`GroupFacts` of ``group`` (asked of ``dist`` once per group: an
    entry holds its group, so no other object takes its id); ``ValueError`` if this rank
    is not a member."""
    hit = _FACTS.get(id(group))
    if hit is not None and hit[0] is group and hit[1] is dist:
        return hit[2]
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this rank is not a member of the given process group")
    facts = GroupFacts(
        rank,
        dist.get_world_size(group),
        group_key(dist, group),
        str(dist.get_backend(group)).lower(),
    )
    while len(_FACTS) >= 64:
        _FACTS.pop(next(iter(_FACTS)))
    _FACTS[id(group)] = (group, dist, facts)
    return facts


def group_key(dist: Any, group: Any) -> Hashable:
    return (getattr(group, "group_name", None), tuple(dist.get_process_group_ranks(group)))


def comm_device(dist: Any, group: Any) -> Any:
    """The device a group's collectives run on: the current CUDA device for NCCL."""
    import torch

    if "nccl" in group_facts(dist, group).backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
