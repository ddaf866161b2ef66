"""Timers: the elapsed seconds of a block (or of each call of a function) as a sample.

On the host ``time.perf_counter``; on a CUDA device two events on the current stream, read when
the metrics are next observed, so timing adds no host sync. Timers nest, work across threads,
and as decorators time every call (coroutines awaited).

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
import inspect
import threading
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
        self._cuda = _cuda_device(name, device)  # None: the host clock
        self._local = threading.local()

    def _start(self) -> Any:
        if self._cuda is None:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._cuda))
        return event

    def _stop(self, start: Any) -> None:
        if self._cuda is None:
            self._record(self.name, time.perf_counter() - start)
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self._cuda))
        self._defer(self.name, functools.partial(_elapsed_seconds, start, end))

    def _starts(self) -> list[Any]:
        """This thread's open blocks of this timer, innermost last."""
        starts: list[Any] | None = getattr(self._local, "starts", None)
        if starts is None:
            starts = self._local.starts = []
        return starts

    def __enter__(self) -> Timer:
        self._starts().append(self._start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop(self._starts().pop())

    def __call__(self, fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
                start = self._start()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self._stop(start)

            return timed_coroutine  # type: ignore[return-value]

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self._start()
            try:
                return fn(*args, **kwargs)
            finally:
                self._stop(start)

        return timed  # type: ignore[return-value]


def _elapsed_seconds(start: Any, end: Any) -> float:
    """Seconds between two recorded CUDA events, waiting for the end one (read time only)."""
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0


def _cuda_device(name: str, device: Any) -> Any:
    """The CUDA device to time on, or None for the host clock; other devices are refused."""
    if device is None:
        return None
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(
            f"timer {name!r}: device {str(dev)!r} has no event timing here; give a CUDA "
            "device, or None (the host clock, which times only the launch of asynchronous work)"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"timer {name!r}: device {str(dev)!r} asks for CUDA events but CUDA is not "
            "available; pass the device of your tensors (None or 'cpu' use the host clock)"
        )
    return dev
