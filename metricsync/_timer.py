"""Timers: the elapsed seconds of a block (or of each call of a function) as a sample.

On the host the clock is ``time.perf_counter``. For a CUDA device, two CUDA
events bracket the block on the current stream; they are read when the
metrics are next computed or synced (which copy to the host anyway), so
timing adds no host sync. Timers nest, and one timer used as a decorator
times every call, recursive ones included.

>>> import metricsync as ms
>>> m = ms.Metrics()
>>> @m.timer("timing/fn")
... def work() -> int:
...     return 1
>>> work() + work()
2
>>> m.compute()["timing/fn"] >= 0.0
True
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["Timer"]

F = TypeVar("F", bound=Callable[..., Any])


class Timer:
    """Context manager and decorator recording elapsed seconds under ``name``."""

    def __init__(
        self,
        name: str,
        device: Any,
        record: Callable[[str, float], None],
        defer: Callable[[str, Callable[[], float]], None],
    ) -> None:
        self.name = name
        self._record = record
        self._defer = defer
        self._cuda = _is_cuda(device)
        self._starts: list[Any] = []  # a stack: the same timer may be entered again inside itself

    def __enter__(self) -> Timer:
        if self._cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._starts.append(event)
        else:
            self._starts.append(time.perf_counter())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        start = self._starts.pop()
        if not self._cuda:
            self._record(self.name, time.perf_counter() - start)
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._defer(self.name, lambda: start.elapsed_time(end) / 1000.0)  # read later, synced

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return timed  # type: ignore[return-value]


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    import torch

    return torch.device(device).type == "cuda"
