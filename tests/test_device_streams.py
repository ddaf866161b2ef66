"""The stream branches of a device state, run on CPU tensors through a stand-in
:class:`~metricsync._record._streams.Streams` (only CUDA has other streams; these are the
branches a GPU would take, with the same code).

- a record made while a side stream is current is copied, not referenced (a lane, the
  lock-free path, refuses it);
- a fold of references taken on the default stream, run on a side stream, first makes
  that stream wait for the default one;
- the scratch buffer a fold copies 0-d references into is reused only after the
  stream of the fold that last read it;
- whatever a side stream does with a device state (a copy into its buffer, a fold, an
  observation) comes after the default stream's work so far and before its later work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from metricsync._record._device import BAD_CHANGED, DeviceState  # noqa: E402
from metricsync._record._device_refs import Lane  # noqa: E402
from metricsync._record._streams import Streams  # noqa: E402
from metricsync._state import _algebra as al  # noqa: E402
from metricsync._state._spec import Spec  # noqa: E402

CPU = torch.device("cpu")


class FakeStreams(Streams):
    """Streams named by strings, switched by the test; what was asked is logged."""

    def __init__(self) -> None:
        self.stream = "default"
        self.log: list[tuple[str, Any]] = []

    def on_side(self) -> bool:
        return self.stream != "default"

    def wait_for_default(self) -> None:
        self.log.append(("wait_for_default", self.stream))

    def join_default(self) -> None:
        self.log.append(("join_default", self.stream))

    def current(self) -> Any:
        return self.stream

    def after(self, stream: Any) -> None:
        self.log.append(("after", (stream, self.stream)))


def _sums(state: DeviceState) -> tuple[list[float], list[float], float]:
    """Per-row sums and counts of a snapshot, and its largest error code."""
    _, cols, _, errors = state.snapshot()
    return cols[al.S].tolist(), cols[al.W].tolist(), float(errors.max())


def test_a_record_on_a_side_stream_is_copied_not_referenced() -> None:
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    row = state.add(0, Spec("mean"), torch.tensor(1.0), None, None, now=1.0)
    streams.stream = "side"
    scalar, vector = torch.tensor(2.0), torch.tensor([3.0, 4.0])
    state.pend(row, scalar, None, None, now=2.0)
    state.pend(row, vector, None, None, now=2.0)
    scalar.add_(100.0)  # copied at the record: the change reaches nothing
    vector.mul_(10.0)
    streams.stream = "default"
    assert _sums(state) == ([10.0], [4.0], 0.0)


def test_a_reference_on_the_default_stream_is_kept_and_a_change_is_caught() -> None:
    # the same records on the default stream are references: the change is refused
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    row = state.add(0, Spec("mean"), torch.tensor(1.0), None, None, now=1.0)
    scalar = torch.tensor(2.0)
    state.pend(row, scalar, None, None, now=2.0)
    scalar.add_(100.0)
    assert _sums(state)[2] == BAD_CHANGED


def test_a_fold_on_a_side_stream_waits_for_the_default_one_first() -> None:
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    row = state.add(0, Spec("mean"), torch.tensor(1.0), None, None, now=1.0)
    state.pend(
        row, torch.tensor(2.0), None, None, now=2.0
    )  # a reference, taken on the default stream
    streams.stream = "side"
    state.commit()
    assert ("wait_for_default", "side") in streams.log
    streams.stream = "default"
    assert _sums(state) == ([3.0], [2.0], 0.0)


def test_the_scratch_buffer_is_reused_after_the_stream_that_read_it_last() -> None:
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    values = np.arange(300, dtype=np.float64)
    row = state.add(0, Spec("mean"), torch.tensor(values[0]), None, None, now=1.0)
    for v in values[1:100]:
        state.pend(row, torch.tensor(v), None, None, now=2.0)
    state.commit()  # 100 references: copied into the scratch buffer, read on "default"
    assert not [e for e in streams.log if e[0] == "after"]  # a new buffer: nothing to order
    streams.stream = "other"
    for v in values[100:300]:
        state.pend(
            row, torch.tensor(v), None, None, now=2.0
        )  # on a side stream: copied, not referenced
    streams.stream = "default"
    for v in values[:80]:
        state.pend(row, torch.tensor(v), None, None, now=2.0)
    streams.stream = "later"  # the next fold runs on another stream
    state.commit()  # the 80 references reuse the buffer on "later": after "default"
    assert ("after", ("default", "later")) in streams.log
    streams.stream = "default"
    s, w, bad = _sums(state)
    assert (s, w, bad) == ([float(values.sum() + values[:80].sum())], [380.0], 0.0)


def test_a_lane_takes_no_reference_while_a_side_stream_is_current() -> None:
    # the lock-free path of Metrics.record asks the same question as pend: off the
    # default stream it refuses, and the checked path copies the tensor
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    row = state.add(0, Spec("mean"), torch.tensor(1.0), None, None, now=1.0)
    lane = Lane(state, row)
    streams.stream = "side"
    assert not lane.take(torch.tensor(2.0)) and not state.inbox
    streams.stream = "default"
    assert lane.take(torch.tensor(3.0)) and len(state.inbox) == 1
    assert _sums(state)[:2] == ([4.0], [2.0])


def test_a_copy_on_a_side_stream_is_read_by_a_fold_on_the_default_one_after_it() -> None:
    # the copy is enqueued on the side stream; a fold on the default stream read the buffer
    # without waiting for it (on CUDA: the values before the copy), and a later copy on the
    # side stream could overwrite the buffer before a default-stream fold had read it
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    row = state.add(0, Spec("mean"), torch.tensor(1.0), None, None, now=1.0)
    streams.stream = "side"
    state.pend(row, torch.tensor([2.0, 3.0]), None, None, now=2.0)  # copied
    assert ("wait_for_default", "side") in streams.log
    assert streams.log[-1] == ("join_default", "side")
    streams.stream = "default"
    state.commit()
    assert _sums(state) == ([6.0], [3.0], 0.0)


def test_an_observation_on_a_side_stream_waits_for_a_fold_on_the_default_one() -> None:
    # nothing pending: the observation reads the state a default-stream fold wrote in
    # place; it waited for the default stream only when references were pending
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    row = state.add(0, Spec("mean"), torch.tensor(1.0), None, None, now=1.0)
    state.pend(row, torch.tensor(2.0), None, None, now=2.0)
    state.commit()  # on the default stream: the state written in place
    streams.stream = "side"
    assert _sums(state) == ([3.0], [2.0], 0.0)
    assert streams.log == [("wait_for_default", "side"), ("join_default", "side")]


def test_a_fold_on_a_side_stream_is_joined_into_the_default_one() -> None:
    # the references it read are dropped after it: the default stream, whose memory they
    # are, may reuse it only after the fold's reads
    streams = FakeStreams()
    state = DeviceState(CPU, streams)
    row = state.add(0, Spec("mean"), torch.tensor(1.0), None, None, now=1.0)
    state.pend(row, torch.tensor(2.0), None, None, now=2.0)
    streams.stream = "side"
    state.commit()
    assert streams.log[-1] == ("join_default", "side")
    streams.stream = "default"
    assert _sums(state) == ([3.0], [2.0], 0.0)
