"""The stream questions a device state asks, in one seam: CUDA answers them for real;
off CUDA there is one stream, so every answer is "the default one, nothing to wait for".

A device state asks four things: is a stream other than the device's default one
current (records there are copied, not referenced)? make the current stream wait for
the default one, and the default one wait for the current one (what a side stream
reads or writes of a device state is ordered between the default stream's work before
and after it: copies, folds, observations); and which stream is current, so
that a scratch buffer reused by the next fold is written only after what read it last
(:meth:`Streams.after`). Tests hand a :class:`Streams` stand-in to ``DeviceState`` to
run the side-stream branches on CPU tensors.

>>> import torch
>>> s = Streams.of(torch.device("cpu"))
>>> s.on_side(), s.current()
(False, None)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CudaStreams", "Streams"]


class Streams:
    """One stream (every device but CUDA): no side stream, nothing to order."""

    @staticmethod
    def of(device: torch.device) -> Streams:
        """The streams of ``device``: :class:`CudaStreams` on CUDA, else this one stream."""
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if device.type != "cuda" or raw is None:
            return Streams()
        return CudaStreams(device)

    def on_side(self) -> bool:
        """Whether a stream other than the device's default one is current."""
        return False

    def wait_for_default(self) -> None:
        """Make the current stream wait for the default one (no host wait)."""

    def join_default(self) -> None:
        """Make the default stream wait for the current one (no host wait)."""

    def current(self) -> Any:
        """The current stream (None where there is one stream)."""
        return None

    def after(self, stream: Any) -> None:
        """Order the current stream's next work after what ``stream`` holds now (from
        :meth:`current`; nothing when it is the current one or None)."""


class CudaStreams(Streams):
    """The streams of one CUDA device: a cheap raw-pointer test for the side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._raw = torch._C._cuda_getCurrentRawStream

    def on_side(self) -> bool:
        return bool(self._raw(self.index))  # the default (null) stream is 0

    def wait_for_default(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(torch.cuda.default_stream(self.device))

    def join_default(self) -> None:
        torch.cuda.default_stream(self.device).wait_stream(torch.cuda.current_stream(self.device))

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def after(self, stream: Any) -> None:
        now = torch.cuda.current_stream(self.device)
        if stream is not None and stream != now:
            now.wait_stream(stream)
