"""Helpers for testing code that uses metricsync across processes.

:func:`run_distributed` starts ``world_size`` processes on 127.0.0.1 with a
free port, initializes a gloo process group in each, runs ``fn(rank,
world_size, *args)`` and returns every rank's result. A failure in any rank
fails the call; a rank that hangs past ``timeout`` is killed. Teardown always
happens. Each call's ranks are new processes, forked from a server that
imported torch once (multiprocessing's ``forkserver``; ``spawn`` where the
platform lacks it), so a call costs a fraction of a second rather than a
torch import per rank.

:func:`count_device_ops` counts the aten ops that code dispatches on the
tensors of one device (the ``meta`` device by default),
:func:`count_blocking_uploads` the calls that copy host data to that device
and make the host wait (each a stream synchronization on CUDA), and
:func:`count_collectives` the ``torch.distributed`` collectives it calls and
the bytes it hands them: counts and sizes, which tests can assert on a noisy
machine where timings cannot be. Inside :func:`meta_records` (and inside the
first two counters on the ``meta`` device) ``record()`` accepts tensors of the
data-less ``meta`` device as stand-ins for an accelerator's; elsewhere it refuses
them, naming the metric.

>>> run_distributed(_doctest_rank, world_size=2)
[0, 2]
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ._record._convert import meta_records
from ._record._opcount import count_blocking_uploads, count_device_ops

__all__ = [
    "CollectiveCounts",
    "RankFailure",
    "count_blocking_uploads",
    "count_collectives",
    "count_device_ops",
    "format_example",
    "free_port",
    "meta_records",
    "run_distributed",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: what the fork server imports once, before it forks each rank
_PRELOAD = ["numpy", "torch", "torch.distributed", "metricsync"]


def _context() -> Any:
    """The start method of the ranks: ``forkserver`` (preloading torch), else ``spawn``."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read when the server starts, on the first call
    return ctx


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout: float,
    args: tuple[Any, ...],
    results: Any,
    environ: dict[str, str],
) -> None:
    # The caller's environment now, not the fork server's from its start.
    os.environ.clear()
    os.environ.update(environ)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo's traffic on loopback
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


@dataclass(frozen=True)
class RankFailure:
    """What a rank left instead of a result: a traceback, or an exit code without a report."""

    rank: int
    traceback: str | None = None
    exitcode: int | None = None

    def __str__(self) -> str:
        if self.traceback is not None:
            return f"rank {self.rank} failed:\n{self.traceback}"
        return f"rank {self.rank} exited with code {self.exitcode} without reporting"


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    backend: str = "gloo",
    *,
    timeout: float = 120.0,
    args: tuple[Any, ...] = (),
    allow_failures: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return results by rank.

    ``fn`` must be importable (a module-level function). A rank that raises,
    or whose process exits without reporting (noticed at once), fails the
    call; so does a rank still running ``timeout`` + 30 s after the start. With
    ``allow_failures=True`` such ranks' entries are :class:`RankFailure`
    objects instead (``None`` for a rank still running at the deadline).
    """
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, backend, timeout, args, results, environ),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    out: list[Any] = [None] * world_size
    pending = set(range(world_size))
    deadline = time.monotonic() + timeout + 30.0
    try:
        for proc in procs:
            proc.start()
        while pending and time.monotonic() < deadline:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                for rank in sorted(pending):
                    if procs[rank].exitcode is not None:
                        time.sleep(0.5)  # its report may still be in the queue's pipe
                        if rank in pending:
                            out[rank] = RankFailure(rank, exitcode=procs[rank].exitcode)
                            pending.discard(rank)
                continue
            out[rank] = value if ok else RankFailure(rank, traceback=value)
            pending.discard(rank)
    finally:
        for proc in procs:
            if proc.pid is None:  # never started (its start raised): nothing to join
                continue
            proc.join(timeout=10.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
    if not allow_failures:
        failures = [str(r) for r in out if isinstance(r, RankFailure)]
        failures += [
            f"rank {rank} did not finish within {timeout + 30.0:.0f} s" for rank in sorted(pending)
        ]
        if failures:
            raise AssertionError("\n".join(failures))
    return out


# function name -> (position, keyword) of what this rank contributes; None: nothing
_TENSOR_COLLECTIVES: dict[str, tuple[int, str] | None] = {
    "all_reduce": (0, "tensor"),
    "reduce": (0, "tensor"),
    "broadcast": (0, "tensor"),
    "all_gather": (1, "tensor"),
    "all_gather_into_tensor": (1, "input_tensor"),
    "all_gather_single": (1, "input_tensor"),
    "reduce_scatter_tensor": (1, "input"),
    "all_to_all_single": (1, "input"),
    "gather": (0, "tensor"),
    "scatter": (0, "tensor"),
    "reduce_scatter": (1, "input_list"),
    "all_to_all": (1, "input_tensor_list"),
    "barrier": None,
}
#: all-to-alls (where their ``group`` is): the payload counted is one destination's chunk
_ALL_TO_ALL = {"all_to_all_single": 4, "all_to_all": 2}
_OBJECT_COLLECTIVES: dict[str, tuple[int, str] | None] = {  # pickled: one object, or a list
    "all_gather_object": (1, "obj"),
    "gather_object": (0, "obj"),
    "broadcast_object_list": (0, "object_list"),
    "scatter_object_list": (1, "scatter_object_input_list"),
}


@dataclass
class CollectiveCounts:
    """What :func:`count_collectives` saw: calls by function name, and payload bytes.

    ``bytes`` adds up, per call, the size of what this rank handed to the
    collective: the tensor (or the tensors of a list) it contributes, its
    chunk per rank for the all-to-all functions (the input over the group
    size), or the pickle of the object for the ``*_object*`` functions. It
    is the payload, not the wire traffic, which depends on the backend's
    algorithm (a ring all-reduce moves about twice the payload per rank; an
    all-gather and an all-to-all of equal chunks move the same). ``log`` lists every
    call in order as ``(function name, payload bytes)``.
    """

    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes: int = 0
    log: list[tuple[str, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        """The number of collective calls."""
        return sum(self.calls.values())


def _payload_bytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return int(obj.numel() * obj.element_size())
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(item) for item in obj)
    return 0


@contextlib.contextmanager
def count_collectives() -> Iterator[CollectiveCounts]:
    """Count the ``torch.distributed`` collectives called inside the block, and their bytes.

    Wraps the collective functions of the ``torch.distributed`` namespace for
    the duration of the block (and restores them after), so it sees code that
    calls ``dist.all_reduce(...)`` through the module, as metricsync does; a
    name imported before the block (``from torch.distributed import
    all_reduce``) is not seen. Nested calls (``all_gather_object`` uses
    ``all_gather`` inside) count once, as the outer call.

    >>> run_distributed(_doctest_collectives, world_size=2)
    [[('all_reduce', 80), ('barrier', 0)], [('all_reduce', 80), ('barrier', 0)]]
    """
    import torch.distributed as dist

    counts = CollectiveCounts()
    originals: dict[str, Any] = {}

    def wrap(name: str, where: tuple[int, str] | None, pickled: bool) -> Callable[..., Any]:
        original = originals[name]

        def counted(*args: Any, **kwargs: Any) -> Any:
            size = 0
            if where is not None:
                position, keyword = where
                payload = args[position] if len(args) > position else kwargs.get(keyword)
                if pickled:
                    items = payload if name.endswith("_list") else [payload]
                    size = sum(len(pickle.dumps(item)) for item in items or [])
                else:
                    size = _payload_bytes(payload)
                if name in _ALL_TO_ALL:
                    at = _ALL_TO_ALL[name]
                    group = args[at] if len(args) > at else kwargs.get("group")
                    size //= max(dist.get_world_size(group), 1)
            counts.calls[name] += 1
            counts.bytes += size
            counts.log.append((name, size))
            return original(*args, **kwargs)

        return counted

    table = [(n, w, False) for n, w in _TENSOR_COLLECTIVES.items()]
    table += [(n, w, True) for n, w in _OBJECT_COLLECTIVES.items()]
    try:
        for name, where, pickled in table:
            if hasattr(dist, name):
                originals[name] = getattr(dist, name)
                setattr(dist, name, wrap(name, where, pickled))
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def format_example() -> Any:
    """A ``Metrics`` that uses every part of the binary format, for codec tests and fuzzing.

    Glob and declared-only rules, a ``last`` with a format, quantiles, an
    ``across`` metric merged from another rank, NaN dropped under
    ``nan="ignore"`` from a torch tensor, and a name without a spec.

    >>> sorted(format_example().compute())[:3]
    ['ent/mean', 'ent/nan_dropped', 'ent/std']
    """
    import numpy as np
    import torch

    import metricsync as ms

    m = ms.Metrics(
        {
            "lr": ms.Spec("last", fmt=".2e"),
            "timing/*": ms.Spec("max", fmt=".3f"),
            "len": ms.Spec(("mean", "max", "p50", "p99")),
            "pg": ms.Spec("sum", across="mean"),
            "ent": ms.Spec(("mean", "std"), nan="ignore"),
            "declared/only": ms.Spec("min"),
        }
    )
    m.record("lr", 3e-4)
    m.record("timing/step", 1.25)
    m.record("len", np.arange(1.0, 101.0))
    m.record("pg", 2.0)
    m.record("ent", torch.tensor([0.5, float("nan"), 1.5]))
    m.record("plain", 1.0)
    m.record("plain", 2.0)
    other = ms.Metrics({"pg": ms.Spec("sum", across="mean")})
    other.record("pg", 4.0)
    return m.merge(other)


def _doctest_rank(rank: int, world_size: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return int(t.item()) * rank * 2


def _doctest_collectives(rank: int, world_size: int) -> list[tuple[str, int]]:
    import torch
    import torch.distributed as dist

    with count_collectives() as seen:
        dist.all_reduce(torch.zeros(10, dtype=torch.float64))
        dist.barrier()
    assert seen.total == 2 and seen.bytes == 80
    return seen.log
