"""Checks and timings that need a CUDA device; prints what it finds and exits 0 without one.

Run: .venv/bin/python bench/gpu_check.py

1. Recording CUDA tensors (scalars, masked per-token tensors, weighted tensors,
   quantile metrics, ``nan="error"`` checks) under
   ``torch.cuda.set_sync_debug_mode("error")``: any host synchronization raises.
2. ``compute()`` agrees with torch over the same data, and with the same
   records made from CPU copies of the tensors, for every statistic (weights,
   masks, NaN policies, quantiles, ``across``, thousands of records of one
   name); invalid device data (NaN under ``nan="error"``, a negative weight)
   raises from ``compute()``, naming the metric.
3. Time per record of a 0-d CUDA tensor against the ``.item()`` pattern it
   replaces.
4. Per recording path of a CUDA tensor (0-d, masked mean, masked
   ``(mean, max, min)``, weighted mean, int64 lengths into a quantile
   metric): the aten ops a ``record()`` dispatches on the device, amortized
   over 512 records and the fold among them
   (``metricsync.testing.count_device_ops("cuda")``; each is a kernel
   launch), and the time per record, the final ``compute()`` included,
   against the hand-rolled ``.item()`` code it replaces (interleaved,
   median of repeats).
5. ``sync()`` over a one-rank NCCL group on 127.0.0.1 (packing on the device),
   checked against ``compute()``, and its time for 1,000 metrics.
6. ``bench/step.py``'s RL-shaped step with its tensors on CUDA, on that one
   NCCL rank: metricsync against the hand-rolled verl code (``.item()`` per
   tensor, ``all_gather_object``, numpy), interleaved, median of the per-step
   ratios; checked against each other first. Twice: on tensors already
   computed, and with GPU work queued ahead of each micro-batch's records
   (a bf16 matrix product chain, as a training step leaves in the stream),
   which each ``.item()`` must wait for and a record does not.

Without CUDA it prints the op counts of step 4 on the meta device (the same
counts, no GPU needed) and exits 0. The whole check takes well under two
minutes on a GPU; it ends with a compact summary.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import metricsync as ms
from metricsync.testing import count_device_ops, free_port

RECORDS = 300  # records per timed run of a path
REPEATS = 5  # interleaved runs per side


def path_table(
    device: Any,
) -> dict[str, tuple[ms.Spec, Callable[[ms.Metrics], None], Callable[[list[float]], None]]]:
    """Each recording path: its spec, a metricsync record, and the hand-rolled ``.item()`` twin."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    scalar = torch.randn((), generator=gen).to(device)
    tokens = torch.randn(4, 256, generator=gen).to(device)
    lengths = torch.randint(16, 257, (4,), generator=gen)
    mask = (torch.arange(256).unsqueeze(0) < lengths.unsqueeze(1)).to(device)
    weights = torch.rand(4, 256, generator=gen).to(device)
    ints = torch.randint(16, 4097, (8,), generator=gen, dtype=torch.int64).to(device)

    def twin_mmm(out: list[float]) -> None:
        valid = torch.masked_select(tokens, mask)
        out += [valid.mean().item(), valid.max().item(), valid.min().item()]

    return {
        "0-d tensor": (
            ms.Spec(),
            lambda m: m.record("x", scalar),
            lambda out: out.append(scalar.item()),
        ),
        "masked (4, 256), mean": (
            ms.Spec("mean"),
            lambda m: m.record("x", tokens, mask=mask),
            lambda out: out.append(((tokens * mask).sum() / mask.sum()).item()),
        ),
        "masked (4, 256), (mean, max, min)": (
            ms.Spec(("mean", "max", "min")),
            lambda m: m.record("x", tokens, mask=mask),
            twin_mmm,
        ),
        "weighted (4, 256), mean": (
            ms.Spec("mean"),
            lambda m: m.record("x", tokens, weight=weights),
            lambda out: out.append(((tokens * weights).sum() / weights.sum()).item()),
        ),
        "8 int64 lengths, (mean, p50, p99)": (
            ms.Spec(("mean", "p50", "p99")),
            lambda m: m.record("x", ints),
            lambda out: out.extend(ints.tolist()),
        ),
    }


def op_counts(device: Any, window: int = 512) -> dict[str, float]:
    """Device ops per ``record()`` per path, amortized over ``window`` records that include
    the fold they trigger (inputs made outside the count; meta tensors as stand-ins)."""
    from metricsync._record._device_refs import REF_LIMIT
    from metricsync.testing import meta_records

    counts = {}
    with meta_records():
        for label, (spec, record, _) in path_table(device).items():
            m = ms.Metrics({"x": spec})
            for _ in range(REF_LIMIT - window // 2):  # the fold falls inside the window
                record(m)
            with count_device_ops(device) as ops:
                for _ in range(window):
                    record(m)
            counts[label] = ops.total() / window
    return counts


def timings(device: Any) -> dict[str, tuple[float, float]]:
    """Median seconds per record, metricsync (compute() and a synchronize included) vs ``.item()``."""
    import torch

    out = {}
    for label, (spec, record, twin) in path_table(device).items():

        def ours(spec: ms.Spec = spec, record: Callable[[ms.Metrics], None] = record) -> None:
            m = ms.Metrics({"x": spec})
            for _ in range(RECORDS):
                record(m)
            m.compute()

        def theirs(twin: Callable[[list[float]], None] = twin) -> None:
            values: list[float] = []
            for _ in range(RECORDS):
                twin(values)

        times: dict[str, list[float]] = {"ours": [], "theirs": []}
        ours()
        theirs()
        for r in range(REPEATS):
            for side, fn in (("ours", ours), ("theirs", theirs))[:: 1 if r % 2 == 0 else -1]:
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times[side].append((time.perf_counter() - start) / RECORDS)
        out[label] = (statistics.median(times["ours"]), statistics.median(times["theirs"]))
    return out


class _Busy(list):  # type: ignore[type-arg]
    """Micro-batches that queue GPU work ahead of each one as the step iterates them."""

    def __init__(self, items: list[Any], work: Callable[[], object]) -> None:
        super().__init__(items)
        self.work = work

    def __iter__(self) -> Any:
        for item in super().__iter__():
            self.work()
            yield item


def rl_step(
    steps: int = 30, device: str = "cuda", size: int = 4096
) -> dict[str, tuple[float, float, float]]:
    """Section 6: median ms per step of each side, and the median ratio, per variant
    (``device`` and ``size``, the matrices' side, let it be tried without a GPU)."""
    import sys

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import step as rl  # bench/step.py
    from _interleave import interleaved

    data = rl.make_data(0, 8)
    for mb in data["mbs"]:
        mb["scalars"] = [(n, t.to(device)) for n, t in mb["scalars"]]
        mb["tokens"] = [(n, t.to(device)) for n, t in mb["tokens"]]
        mb["mask"], mb["resp_len"] = mb["mask"].to(device), mb["resp_len"].to(device)
    metrics = ms.Metrics(rl.SPECS)
    scratch: dict[str, float] = {}
    ours, theirs = rl.metricsync_step(metrics, data, scratch), rl.hand_rolled_step(data, scratch)
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))
    masks = [mb["mask"] for mb in data["mbs"]]
    den = sum(float(m.sum()) for m in masks)
    for i, name in enumerate(rl.TOKEN_NAMES):  # token means: against the true global one
        key = name if name != "critic/advantages" else f"{name}/mean"
        num = sum(float(mb["tokens"][i][1].double()[m].sum()) for mb, m in zip(data["mbs"], masks))
        assert abs(ours[key] - num / den) <= 1e-6 * abs(num / den), (key, ours[key], num / den)
        theirs.pop(key)  # verl's are means of micro-batch means
    for key, want in theirs.items():
        if not key.endswith(("/p50", "/p99")):
            assert abs(ours[key] - float(want)) <= 1e-9 * max(1.0, abs(float(want))), (
                key,
                ours[key],
                want,
            )
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def work() -> None:
        for _ in range(4):  # about 0.7 ms of matrix products on an H200
            a @ a

    out = {}
    for variant, mbs in (
        ("tensors ready", list(data["mbs"])),
        ("GPU work queued", _Busy(data["mbs"], work)),
    ):
        data["mbs"] = mbs
        sides = {
            "ours": lambda: rl.metricsync_step(metrics, data, scratch),
            "theirs": lambda: rl.hand_rolled_step(data, scratch),
        }
        out[variant] = interleaved(sides, steps, 2, sync)
    return out


DIFF_SPECS = {
    "s": ms.Spec(("mean", "sum", "count", "min", "max", "last")),
    "v": ms.Spec(("std", "var"), ddof=1),
    "q": ms.Spec(("p0", "p50", "p99", "p100")),
    "qn": ms.Spec(("mean", "p90"), nan="ignore"),
    "a": ms.Spec("sum", across="mean"),
}


def cuda_matches_cpu(device: str = "cuda", records: int = 3000) -> int:
    """The same records from ``device`` tensors and from their CPU copies compute alike;
    returns the number of keys compared."""
    import math

    import torch

    gen = torch.Generator().manual_seed(1)
    sides = {"dev": ms.Metrics(DIFF_SPECS), "cpu": ms.Metrics(DIFF_SPECS)}
    for i in range(records):
        x = torch.randn(4, 64, generator=gen) * 10
        mask = torch.rand(4, 64, generator=gen) > 0.4
        w = torch.rand(4, 64, generator=gen)
        nan_x = torch.where(torch.rand(4, 64, generator=gen) > 0.9, float("nan"), x)
        lengths = torch.randint(1, 5000, (4,), generator=gen)
        for where, m in sides.items():
            move = (lambda t: t.to(device)) if where == "dev" else (lambda t: t)
            m.record("s", move(x[0, 0]))  # 0-d: thousands of records of one name
            m.record("v", move(x), mask=move(mask))
            if i % 10 == 0:
                m.record("q", move(lengths))
                m.record("qn", move(nan_x), weight=move(w))
                m.record("a", move(x[1]), weight=2.0)
    got, want = sides["dev"].compute(), sides["cpu"].compute()
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-12, abs_tol=1e-12), (key, got[key], value)
    for spec, record, words in (
        (
            ms.Spec(nan="error"),
            lambda m: m.record("bad", torch.tensor([1.0, float("nan")], device=device)),
            "NaN",
        ),
        (
            ms.Spec(),
            lambda m: m.record(
                "bad", torch.ones(2, device=device), weight=torch.tensor([1.0, -1.0], device=device)
            ),
            "negative",
        ),
    ):
        m = ms.Metrics({"bad": spec})
        recorded = False
        try:
            record(m)  # host data raises here; device data only from compute()
            recorded = True
            m.compute()
        except ValueError as err:
            assert "bad" in str(err) and (recorded or device == "cpu"), err
        else:
            raise AssertionError(f"no error for {words} device data")
    return len(want)


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; only the op counts, on the meta device:")
        for label, count in op_counts(torch.device("meta")).items():
            print(f"  {label:<36} {count:>6.3f} aten ops per record (512 records, a fold)")
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
    keys = cuda_matches_cpu()
    print(f"   and with the same records from CPU copies ({keys} keys); bad device data raises")

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

    counts = op_counts(dev)
    times = timings(dev)
    print(f"4. per record() of a CUDA tensor ({torch.cuda.get_device_name()}), compute() included:")
    print(f"   {'path':<36} {'ops':>6} {'metricsync':>11} {'.item() twin':>13} {'ratio':>7}")
    for label, count in counts.items():
        ours, theirs = times[label]
        print(
            f"   {label:<36} {count:>6.3f} {ours * 1e6:>8.1f} us {theirs * 1e6:>10.1f} us"
            f" {ours / theirs:>6.2f}x"
        )
    print("   budgets (ops per record, a fold included): 0-d <= 0.1, masked (mean, max, min) <= 1")

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
            f"5. sync over NCCL matches compute(); 1,000 metrics: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms"
        )
        print("6. the RL-shaped step (bench/step.py) on CUDA, one NCCL rank, medians of 30 steps:")
        print(f"   {'variant':<18} {'metricsync':>11} {'hand-rolled':>12} {'ratio':>7}")
        for variant, (ours_ms, theirs_ms, ratio) in rl_step().items():
            print(f"   {variant:<18} {ours_ms:>8.2f} ms {theirs_ms:>9.2f} ms {ratio:>6.2f}x")
    finally:
        dist.destroy_process_group()

    return 0


if __name__ == "__main__":
    raise SystemExit(main())
