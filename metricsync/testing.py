"""Helpers for testing code that uses metricsync across processes.

:func:`run_distributed` starts ``world_size`` processes on 127.0.0.1 with a
free port, initializes a gloo process group in each, runs ``fn(rank,
world_size, *args)`` and returns every rank's result. A failure in any rank
fails the call; a rank that hangs past ``timeout`` is killed. Teardown always
happens.

>>> run_distributed(_doctest_rank, world_size=2)
[0, 2]
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = ["RankFailure", "format_example", "free_port", "run_distributed"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout: float,
    args: tuple[Any, ...],
    results: Any,
) -> None:
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
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, backend, timeout, args, results),
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
