"""Async sync handles and the Tracker's background writer, in one process.

Handles that finish when a test says so (finished from another thread)
drive the Tracker: steps reach the backends in the order they were logged,
whichever handle finishes first; ``flush()`` waits; a failing backend warns
in the caller's thread; a failed sync raises from the next call; ``close()``
is bounded. Without a process group ``sync(async_op=True)`` is done at once,
and ``log_every`` syncs, logs and resets every n steps. The snapshot an async
sync takes in two halves (captured at the call, folded on the worker) is the
one ``snapshot()`` gives at the call, whatever is recorded, folded or reset in
between, and CUDA timers are read at the call. The multi-rank behaviour is in
``tests/distributed/test_async.py`` and ``test_async_capture.py``.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import metricsync as ms
from metricsync._log._logread import read_jsonl
from metricsync._record._pending import FAST_LIMIT
from metricsync._record._store import Store
from metricsync._sync._async import done_handle


class Recorder:
    """A backend that keeps what it was given, and can be told to fail."""

    def __init__(self, fail_at: set[int] | None = None) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.fail_at = fail_at or set()
        self.closed = False
        self.threads: set[str] = set()

    def log(self, values: dict[str, float], step: int, formats: dict[str, Any]) -> None:
        self.threads.add(threading.current_thread().name)
        if step in self.fail_at:
            raise OSError(f"disk full at {step}")
        self.steps.append((step, dict(values)))

    def close(self) -> None:
        self.closed = True


def pending() -> ms.SyncHandle:
    return ms.SyncHandle()


def finish(
    handle: ms.SyncHandle, values: dict[str, float] | None = None, error: Any = None
) -> None:
    result = None
    if values is not None:
        result = ms.Metrics()
        result.update(values)
    handle.finish(result, error)


def test_a_handle_reports_done_waits_with_a_bound_and_reraises() -> None:
    handle = pending()
    assert not handle.done() and "pending" in repr(handle)
    with pytest.raises(TimeoutError):
        handle.wait(0.01)
    threading.Timer(0.05, finish, (handle, {"x": 2.0})).start()
    assert handle.wait().compute() == {"x": 2.0}
    assert handle.done() and "done" in repr(handle)
    failed = done_handle(error=ms.SyncError("peer gone"))
    for _ in range(2):  # every wait raises the same error
        with pytest.raises(ms.SyncError, match="peer gone"):
            failed.wait()


def test_without_a_process_group_the_async_sync_is_a_snapshot_done_at_once() -> None:
    m = ms.Metrics({"n": ms.Spec(("sum", "count"))})
    m.record("n", [1.0, 2.0])
    handle = m.sync(async_op=True)
    m.record("n", 10.0)
    m.reset()
    assert handle.done()
    assert handle.wait().compute() == {"n/sum": 3.0, "n/count": 2.0}


def test_steps_are_written_in_log_order_whatever_finishes_first(tmp_path: Path) -> None:
    backend = Recorder()
    h1, h2, h4 = pending(), pending(), pending()
    with ms.Tracker(("jsonl", backend), run_dir=tmp_path) as tracker:
        tracker.log(h1, step=1)
        tracker.log(h2, step=2)
        tracker.log({"d": 3.0}, step=3)  # queued behind the two pending steps
        tracker.log(h4, step=4)
        finish(h4, {"x": 4.0})
        finish(h2, {"x": 2.0})
        time.sleep(0.05)
        assert backend.steps == []  # step 1 still holds everything back
        finish(h1, {"x": 1.0})
        tracker.flush()
        assert [s for s, _ in backend.steps] == [1, 2, 3, 4]
        tracker.log({"d": 5.0}, step=5)  # nothing pending: written at once, in this thread
        assert backend.steps[-1] == (5, {"d": 5.0})
    assert backend.threads == {"metricsync-writer", threading.current_thread().name}
    _, steps = read_jsonl(tmp_path)
    assert steps == backend.steps


def test_a_failing_backend_warns_in_the_callers_thread_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    failing, good = Recorder(fail_at={2, 3}), Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ms.Tracker((failing, good), run_dir=tmp_path) as tracker:
            for step in range(1, 5):
                tracker.log(done_handle(_metrics(x=float(step))), step)
            tracker.flush()
    assert [s for s, _ in good.steps] == [1, 2, 3, 4]
    assert [s for s, _ in failing.steps] == [1, 4]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "failed at step 2" in messages[0], messages
    assert caught[0].filename == __file__  # warned where the user called, not in the thread


def test_a_failed_sync_raises_from_the_next_call_and_its_step_is_skipped(tmp_path: Path) -> None:
    backend = Recorder()
    tracker = ms.Tracker(backend, run_dir=tmp_path)
    tracker.log(done_handle(_metrics(x=1.0)), step=1)
    tracker.log(done_handle(error=ms.SyncError("rank 3 never came")), step=2)
    with pytest.raises(ms.SyncError, match="rank 3 never came") as info:
        tracker.flush()
    assert "step 2" in "".join(getattr(info.value, "__notes__", ["step 2"]))
    tracker.log({"x": 3.0}, step=3)
    tracker.close()
    assert [s for s, _ in backend.steps] == [1, 3]


def test_close_is_bounded_and_names_the_steps_it_could_not_write(tmp_path: Path) -> None:
    backend = Recorder()
    tracker = ms.Tracker(backend, run_dir=tmp_path)
    tracker.log(done_handle(_metrics(x=1.0)), step=1)
    never = pending()
    tracker.log(never, step=2)
    with pytest.raises(TimeoutError, match=r"\[2\]"):
        tracker.flush(timeout=0.05)
    with pytest.warns(RuntimeWarning, match=r"steps \[2\] were not written"):
        tracker.close(timeout=0.05)
    finish(never, {"x": 2.0})  # too late: the backend is closed and is not written to
    time.sleep(0.05)
    assert backend.closed and [s for s, _ in backend.steps] == [1]


def test_leaving_the_block_on_an_error_keeps_that_error(tmp_path: Path) -> None:
    backend = Recorder()
    with (
        pytest.raises(KeyError, match="training failed"),
        pytest.warns(RuntimeWarning, match="step 1 was not logged: SyncError: broken"),
        ms.Tracker(backend, run_dir=tmp_path) as tracker,
    ):
        tracker.log(done_handle(error=ms.SyncError("broken")), step=1)
        raise KeyError("training failed")  # the sync error becomes a warning, not a new error
    assert backend.closed


def test_ranks_that_do_not_write_still_wait_for_and_raise_their_syncs(tmp_path: Path) -> None:
    tracker = ms.Tracker(run_dir=tmp_path, rank=1)
    handle = pending()
    tracker.log(handle, step=1)
    tracker.log({"x": 1.0}, step=2)  # returns at once, writes nothing
    threading.Timer(0.05, finish, (handle, None, ms.SyncError("gone"))).start()
    with pytest.raises(ms.SyncError, match="gone"):
        tracker.flush()
    tracker.close()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_log_every_syncs_logs_and_resets_every_n_steps(tmp_path: Path) -> None:
    backend = Recorder()
    metrics = ms.Metrics({"loss": ms.Spec(("mean", "count"))})
    samples: list[float] = []
    want = []
    with ms.Tracker(backend, run_dir=tmp_path) as tracker:
        for step in range(1, 11):
            value = float(step * step)
            metrics.record("loss", value)
            samples.append(value)
            got = tracker.log_every(4, metrics, step, timeout=30)
            if step % 4 == 0:
                assert isinstance(got, ms.SyncHandle)
                want.append((step, {"loss/mean": np.mean(samples), "loss/count": 4.0}))
                samples = []
            else:
                assert got is None
        assert tracker.log_every(4, metrics, 10, force=True, async_op=False) is not None
        want.append((10, {"loss/mean": np.mean(samples), "loss/count": 2.0}))
    assert backend.steps == want
    assert len(metrics) == 0
    with pytest.raises(ValueError, match="positive int"):
        ms.Tracker(Recorder(), run_dir=tmp_path).log_every(0, metrics, 1)


def _metrics(**values: float) -> ms.Metrics:
    m = ms.Metrics()
    m.update(values)
    return m


# ------------------------------------------------------- the two-half snapshot

CAPTURE_SPECS = {
    "n": ms.Spec(("sum", "count", "max")),
    "lr": ms.Spec("last"),
    "q": ms.Spec(("mean", "p50", "p99", "min")),
    "i": ms.Spec(("mean", "count"), nan="ignore"),
}


def _record_every_kind(m: ms.Metrics, rng: np.random.Generator, n_numbers: int) -> None:
    torch = pytest.importorskip("torch")
    for v in rng.normal(size=n_numbers).tolist():  # the number buffers' fast path
        m.record("n", v)
    m.record("n", 3.0, weight=2.0)  # a weighted pair
    m.record("lr", float(rng.uniform()))
    m.record("lr", [float(rng.uniform())])  # later than the number: the last (by its time)
    m.record("q", rng.normal(size=7))  # buffered array samples
    m.record("q", rng.normal(size=1000))  # reduced on arrival
    m.record("q", torch.tensor(float(rng.normal())))  # a 0-d tensor
    m.record("i", [1.0, float("nan"), float(rng.normal())])  # a list, and a dropped NaN
    m.record("i", torch.from_numpy(rng.normal(size=5)), mask=torch.tensor([1, 0, 1, 1, 0]))


@pytest.mark.parametrize("then", ["record", "fold", "reset"])
def test_the_captured_half_folds_to_the_snapshot_of_the_call(then: str) -> None:
    rng = np.random.default_rng(7)
    m = ms.Metrics(CAPTURE_SPECS)
    store = m._store
    _record_every_kind(m, rng, 50)
    store.flush()  # some samples in the table already, the rest pending
    _record_every_kind(m, rng, 30)
    # the capture first: a snapshot taken before it would be kept, and the capture would
    # hand that fold on instead of folding on its own
    later = store.snapshot_later()
    want = store.snapshot().compute()
    # after the call: more of every kind, buffers that fill and fold (swapped out,
    # never truncated), or a reset; none of it reaches the captured snapshot
    _record_every_kind(m, rng, FAST_LIMIT + 10 if then == "fold" else 20)
    if then == "reset":
        m.reset()
        m.record("n", 1e9)
    got = later().compute()
    assert got == want  # bit for bit: the same folds in the same order
    assert m.compute() != want


def test_a_recording_thread_loses_nothing_and_counts_nothing_twice() -> None:
    n = 3 * FAST_LIMIT + 123  # several buffers fill and fold while it records
    m = ms.Metrics({"t": ms.Spec(("sum", "count", "max"))})
    m.record("t", 0.0)
    started = threading.Event()

    def record() -> None:
        started.set()
        for v in range(1, n):
            m.record("t", float(v))  # the lock-free path

    thread = threading.Thread(target=record)
    thread.start()
    started.wait()
    laters = []
    for _ in range(20):
        laters.append(m._store.snapshot_later())
        time.sleep(0.0005)
    thread.join()
    for later in laters:  # each saw a prefix 0..c-1 of the samples: none lost, none twice
        got = later().compute()
        c = int(got["t/count"])
        assert got["t/sum"] == c * (c - 1) / 2 and got["t/max"] == c - 1
    assert m.compute() == {"t/sum": n * (n - 1) / 2, "t/count": float(n), "t/max": n - 1.0}


def test_cuda_timers_are_read_at_the_call_on_the_calling_thread() -> None:
    store = Store()
    readers: list[str] = []

    def elapsed() -> float:
        readers.append(threading.current_thread().name)
        return 0.25

    store.defer("t", elapsed)
    later = store.snapshot_later()
    assert readers == [threading.current_thread().name]
    store.defer("t", elapsed)  # after the call: the next snapshot's
    result: list[dict[str, float]] = []
    worker = threading.Thread(target=lambda: result.append(later().compute()))
    worker.start()
    worker.join()
    assert result == [{"t": 0.25}] and len(readers) == 1
    assert store.snapshot().compute() == {"t": 0.25} and len(readers) == 2
