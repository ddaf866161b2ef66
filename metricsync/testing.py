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
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["free_port", "run_distributed"]


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

    ``fn`` must be importable (a module-level function). With
    ``allow_failures=True`` a failing rank's entry is its traceback text (a
    string starting with ``"Traceback"``) instead of failing the call, and a
    rank that never reports is ``None``.
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
    failures: list[str] = []
    try:
        for proc in procs:
            proc.start()
        for _ in range(world_size):
            try:
                rank, ok, value = results.get(timeout=timeout + 60.0)
            except queue.Empty:
                failures.append(f"a rank did not report within {timeout + 60.0:.0f} s")
                break
            out[rank] = value
            if not ok:
                failures.append(f"rank {rank} failed:\n{value}")
    finally:
        for proc in procs:
            proc.join(timeout=10.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
    if failures and not allow_failures:
        raise AssertionError("\n".join(failures))
    return out


def _doctest_rank(rank: int, world_size: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return int(t.item()) * rank * 2
