"""``Metrics.timer``: host timers on a fake clock, and CUDA timers on fake events.

The host clock is replaced by one the test moves by hand, so every duration
is exact. The CUDA path runs without a GPU: ``torch.cuda.Event`` is replaced
by a fake that logs every call and refuses ``elapsed_time`` before its end
event was waited for, as CUDA does, which checks that nothing reads an event
until ``compute()``/``sync()`` and that reading then works.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, ClassVar

import pytest

import metricsync as ms


class Clock:
    """A ``perf_counter`` that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


STATS = ms.Spec(("count", "sum", "min", "max"))


def test_nested_timers_record_their_own_blocks(clock: Clock) -> None:
    m = ms.Metrics()
    with m.timer("timing/step"):
        clock.advance(1.0)
        with m.timer("timing/gen"):
            clock.advance(2.0)
        clock.advance(4.0)
    assert m.compute() == {"timing/step": 7.0, "timing/gen": 2.0}


def test_default_spec_and_an_explicit_rule_wins(clock: Clock) -> None:
    m = ms.Metrics({"timing/ref/*": ms.Spec("sum", fmt=".1f")})
    for seconds in (0.25, 0.5):
        with m.timer("timing/gen"):
            clock.advance(seconds)
        with m.timer("timing/ref/logp"):
            clock.advance(seconds)
    assert m.spec("timing/gen") == ms.Spec("max", fmt=".3f")
    assert m.spec("timing/ref/logp") == ms.Spec("sum", fmt=".1f")
    assert m.compute() == {"timing/gen": 0.5, "timing/ref/logp": 0.75}
    assert m.format().split() == ["timing/gen=0.500", "timing/ref/logp=0.8"]
    # a name already recorded keeps the spec it has
    m.record("plain", 1.0)
    with m.timer("plain"):
        clock.advance(3.0)
    assert m.spec("plain") == ms.Spec() and m.compute()["plain"] == 2.0


def test_decorator_times_every_call_recursion_included(clock: Clock) -> None:
    m = ms.Metrics({"timing/fn": STATS})

    @m.timer("timing/fn")
    def countdown(n: int) -> int:
        clock.advance(1.0)
        return n if n == 0 else countdown(n - 1)

    assert countdown(3) == 0 and countdown.__name__ == "countdown"
    # the calls last 4, 3, 2 and 1 ticks (each includes the calls below it)
    assert m.compute() == {
        "timing/fn/count": 4.0,
        "timing/fn/sum": 10.0,
        "timing/fn/min": 1.0,
        "timing/fn/max": 4.0,
    }


def test_a_block_that_raises_still_records(clock: Clock) -> None:
    m = ms.Metrics({"timing/*": STATS})
    with pytest.raises(KeyError), m.timer("timing/block"):
        clock.advance(2.0)
        raise KeyError("boom")

    @m.timer("timing/fn")
    def fails() -> None:
        clock.advance(3.0)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fails()
    values = m.compute()
    assert values["timing/block/sum"] == 2.0 and values["timing/fn/sum"] == 3.0


def test_one_timer_reentered_and_shared_by_threads(clock: Clock) -> None:
    m = ms.Metrics({"t": STATS})
    timer = m.timer("t")
    with timer:
        clock.advance(1.0)
        with timer:
            clock.advance(2.0)
    # thread A enters, then B; A leaves first: each must close its own start
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def thread_a() -> None:
        with timer:
            a_in.set()
            b_in.wait(5)
            clock.advance(10.0)
        a_out.set()

    def thread_b() -> None:
        a_in.wait(5)
        clock.advance(1.0)  # B starts a tick after A
        with timer:
            b_in.set()
            a_out.wait(5)
            clock.advance(20.0)

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert m.compute() == {
        "t/count": 4.0,
        "t/sum": 3.0 + 2.0 + 11.0 + 30.0,
        "t/min": 2.0,
        "t/max": 30.0,
    }


def test_coroutine_functions_are_timed_until_they_finish(clock: Clock) -> None:
    m = ms.Metrics()

    @m.timer("timing/rollout")
    async def rollout() -> str:
        await asyncio.sleep(0)
        clock.advance(5.0)
        return "done"

    assert asyncio.run(rollout()) == "done"
    assert m.compute() == {"timing/rollout": 5.0}


def test_devices_other_than_cpu_and_cuda_are_refused() -> None:
    pytest.importorskip("torch")
    m = ms.Metrics()
    with m.timer("t", device="cpu"):
        pass
    assert "t" in m
    with pytest.raises(ValueError, match="'meta' has no event timing"):
        m.timer("u", device="meta")


# ---------------------------------------------------------------- CUDA events


class FakeEvent:
    """A CUDA event that logs its calls; ``elapsed_time`` needs the end event waited for."""

    log: ClassVar[list[tuple[str, int]]] = []
    ticks: ClassVar[int] = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: int | None = None
        self.done = False

    def record(self, stream: Any = None) -> None:
        assert stream == "stream of cuda"
        FakeEvent.ticks += 1
        self.at = FakeEvent.ticks
        FakeEvent.log.append(("record", id(self)))

    def synchronize(self) -> None:
        FakeEvent.log.append(("synchronize", id(self)))
        self.done = True

    def query(self) -> bool:
        FakeEvent.log.append(("query", id(self)))
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        FakeEvent.log.append(("elapsed_time", id(self)))
        if not end.done:
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        assert self.at is not None and end.at is not None
        return 250.0 * (end.at - self.at)  # milliseconds: a quarter second per tick


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    FakeEvent.log, FakeEvent.ticks = [], 0
    return FakeEvent.log


def _reads(log: list[tuple[str, int]]) -> list[str]:
    return [call for call, _ in log if call != "record"]


def test_cuda_timers_read_nothing_until_compute(fake_cuda: list[tuple[str, int]]) -> None:
    m = ms.Metrics()
    m.record("loss", 1.0)
    with m.timer("timing/step", device="cuda"), m.timer("timing/gen", device="cuda"):
        pass

    @m.timer("timing/fn", device="cuda")
    def fn() -> None:
        pass

    fn()
    with pytest.raises(KeyError), m.timer("timing/raises", device="cuda"):
        raise KeyError("boom")
    assert [call for call, _ in fake_cuda] == ["record"] * 8
    # names, len, in and key_formats count the pending timers without reading them
    assert m.names == ["loss", "timing/gen", "timing/step", "timing/fn", "timing/raises"]
    assert len(m) == 5 and "timing/step" in m and "timing/other" not in m
    assert m.key_formats()["timing/step"] == ".3f"
    assert _reads(fake_cuda) == []
    values = m.compute()
    # ticks: step 1, gen 2..3, step end 4, fn 5..6, raises 7..8
    assert values == {
        "loss": 1.0,
        "timing/gen": 0.25,
        "timing/step": 0.75,
        "timing/fn": 0.25,
        "timing/raises": 0.25,
    }
    assert _reads(fake_cuda) == ["synchronize", "elapsed_time"] * 4
    assert m.compute() == values and len(_reads(fake_cuda)) == 8  # read once
    m.reset()
    with m.timer("timing/step", device="cuda"):
        pass
    assert m.names == ["timing/step"] and len(_reads(fake_cuda)) == 8
    assert m.sync().compute() == {"timing/step": 0.25}  # a sync reads them too
    assert _reads(fake_cuda)[8:] == ["synchronize", "elapsed_time"]


def test_cuda_timer_without_cuda_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        ms.Metrics().timer("t", device="cuda")
