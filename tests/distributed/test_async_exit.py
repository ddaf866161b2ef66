"""Process exit and crashes with async syncs pending, in real subprocesses.

- A rank that leaves with an async sync pending (no timeout, its peer alive
  but never syncing again) and a Tracker left open exits by itself, with
  status 0, after the bounded waits of ``EXIT_WAIT`` seconds; the step it
  could not write is named in a warning.
- A rank that leaves with an async sync it never waited for (no Tracker, its
  peer alive but never syncing again) exits by itself within ``EXIT_WAIT``,
  whether the sync's own timeout is 600 s or none.
- A rank killed (SIGKILL) right after ``tracker.flush()`` returned leaves
  every step logged before it complete in the JSONL log, in order.
- A process that destroys its process groups and initializes new ones gets a
  new bookkeeping group, not the destroyed one.

The bound asserted for the exit is a hang detector (90 s against waits of a
few seconds), not a speed measurement.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from metricsync._log._logread import read_jsonl
from metricsync.testing import free_port

# ranks that die, hang or time out: minutes of waiting, so make test-slow (CI) runs them
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PREAMBLE = r"""
import os, sys, time
from datetime import timedelta
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
import torch.distributed as dist
import metricsync as ms
rank, world, port, run_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
    timeout=timedelta(seconds=120),
)
"""

LEAVE_PENDING = r"""
m = ms.Metrics()
m.record("x", 1.0)
m.sync(timeout=60, async_op=True).wait()  # both ranks: the bookkeeping group exists
if rank == 1:
    time.sleep(600)  # alive, and never syncs again
tracker = ms.Tracker("jsonl", run_dir=run_dir)
tracker.log(m.sync(async_op=True), step=1)  # no timeout: it would wait for ever
print("leaving", flush=True)
"""

LEAVE_UNWAITED = r"""
m = ms.Metrics()
m.record("x", 1.0)
m.sync(timeout=60, async_op=True).wait()  # both ranks: the bookkeeping group exists
if rank == 1:
    time.sleep(600)  # alive, and never syncs again
timeout = None if run_dir == "none" else float(run_dir)
handle = m.sync(timeout=timeout, async_op=True)  # never waited for, and its peer never joins
print("leaving", flush=True)
"""

KILLED_AFTER_FLUSH = r"""
m = ms.Metrics()
tracker = ms.Tracker("jsonl", run_dir=run_dir)
for step in range(1, 6):
    m.record("x", float(step))
    tracker.log(m.sync(timeout=60, async_op=True), step)
    m.reset()
tracker.flush()
print("flushed", flush=True)
for step in range(6, 100_000):  # goes on logging until killed
    m.record("x", float(step))
    tracker.log(m.sync(timeout=60, async_op=True), step)
    m.reset()
"""


REINIT = r"""
from metricsync.testing import free_port
dist.destroy_process_group()
for value in (1.0, 2.0):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    m = ms.Metrics()
    m.record("x", value)
    print(m.sync(timeout=60, async_op=True).wait().compute(), flush=True)
    dist.destroy_process_group()
"""


def _start(script: str, rank: int, world: int, port: int, run_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "always"}
    return subprocess.Popen(
        [sys.executable, "-c", PREAMBLE + script, str(rank), str(world), str(port), str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_rank_leaving_with_a_pending_sync_exits_on_its_own(tmp_path: Path) -> None:
    port = free_port()
    procs = [_start(LEAVE_PENDING, rank, 2, port, tmp_path) for rank in range(2)]
    try:
        out, err = procs[0].communicate(timeout=90)  # a hang would never end
        assert procs[0].returncode == 0, err
        assert "leaving" in out
        assert "steps [1] were not written" in err, err
        assert procs[1].poll() is None  # its peer was alive all along
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("timeout", ["none", "600"])
def test_a_rank_leaving_an_unwaited_sync_exits_within_the_exit_wait(timeout: str) -> None:
    """No Tracker: the worker's sync, stuck in its gather, gets ``EXIT_WAIT`` seconds at
    exit, not its own timeout (600 s, or none): a 90 s hang detector tells the two apart."""
    port = free_port()
    procs = [_start(LEAVE_UNWAITED, rank, 2, port, Path(timeout)) for rank in range(2)]
    try:
        out, err = procs[0].communicate(timeout=90)  # a hang would never end
        assert procs[0].returncode == 0, err
        assert "leaving" in out
        assert procs[1].poll() is None  # its peer was alive all along
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def test_steps_are_complete_on_disk_once_flush_returned(tmp_path: Path) -> None:
    proc = _start(KILLED_AFTER_FLUSH, 0, 1, free_port(), tmp_path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "flushed", proc.stderr.read() if proc.stderr else line
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    _, steps = read_jsonl(tmp_path)
    assert len(steps) >= 5
    assert steps == [(step, {"x": float(step)}) for step in range(1, len(steps) + 1)]


def test_a_new_init_gets_a_new_bookkeeping_group(tmp_path: Path) -> None:
    proc = _start(REINIT, 0, 1, free_port(), tmp_path)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["{'x': 1.0}", "{'x': 2.0}"]
