"""Checks and timings that need a CUDA device; prints what it finds and exits 0 without one.

Run: .venv/bin/python bench/gpu_check.py

1. Recording CUDA tensors (scalars, masked per-token tensors, weighted tensors,
   quantile metrics, ``nan="error"`` checks) under
   ``torch.cuda.set_sync_debug_mode("error")``: any host synchronization raises.
2. ``compute()`` agrees with torch over the same data.
3. Time per record of a 0-d CUDA tensor against the ``.item()`` pattern it
   replaces.
4. ``sync()`` over a one-rank NCCL group on 127.0.0.1 (packing on the device),
   checked against ``compute()``, and its time for 1,000 metrics.
"""

from __future__ import annotations

import os
import time

import metricsync as ms
from metricsync.testing import free_port


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check")
        return 0
    dev = torch.device("cuda")
    n = 1 << 20
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, device=dev, generator=gen)
    mask = torch.rand(n, device=dev, generator=gen) > 0.3
    w = torch.rand(n, device=dev, generator=gen)
    specs = {
        "loss": ms.Spec(("mean", "std", "min", "max", "last")),
        "ent": ms.Spec("mean", nan="error"),
        "len": ms.Spec(("mean", "p50", "p99")),
        "kl": ms.Spec("mean", across="mean"),
    }
    m = ms.Metrics(specs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            m.record("loss", x.mean())
            m.record("ent", x, mask=mask)
            m.record("len", x.abs() * 100.0, weight=w)
            m.record("kl", x[:1000], weight=3.0)
            m.record("lr", 3e-4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    print("1. recording under set_sync_debug_mode('error'): no host sync")

    got = m.compute()
    want_ent = float(x[mask].mean())
    want_len = float((x.abs() * 100.0 * w).sum() / w.sum())
    assert abs(got["ent"] - want_ent) < 1e-6 * max(1.0, abs(want_ent)), (got["ent"], want_ent)
    assert abs(got["len/mean"] - want_len) < 1e-6 * max(1.0, abs(want_len)), (
        got["len/mean"],
        want_len,
    )
    print(f"2. compute() agrees with torch: ent={got['ent']:.6f} len/mean={got['len/mean']:.4f}")

    scalar = x.mean()
    reps = 2000
    torch.cuda.synchronize()
    start = time.perf_counter()
    values = [scalar.item() for _ in range(reps)]
    item_time = (time.perf_counter() - start) / reps
    timed = ms.Metrics()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        timed.record("loss", scalar)
    torch.cuda.synchronize()
    record_time = (time.perf_counter() - start) / reps
    print(
        f"3. per record of a 0-d CUDA tensor: {record_time * 1e6:.1f} us; .item(): {item_time * 1e6:.1f} us"
    )
    del values

    import torch.distributed as dist

    os.environ["NCCL_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        synced = m.sync(timeout=60)
        assert synced.compute() == got, "sync over NCCL changed the result"
        many = ms.Metrics()
        for i in range(1000):
            many.record(f"m{i}", x[i : i + 8])
        many.sync()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            many.sync()
        print(
            f"4. sync over NCCL matches compute(); 1,000 metrics: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms"
        )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
