"""An RL-shaped training step: metricsync against verl's hand-rolled metrics, step by step.

Run: .venv/bin/python bench/step.py [--worlds 2 4] [--steps 20] [--warmup 2] [--micro-batches 8]

On each of N local gloo ranks (127.0.0.1), every step records, per micro-batch:

- 60 scalar 0-d tensors (losses, clip fractions, norms ...), spec ``mean``;
- 6 per-token ``(4, 256)`` float32 tensors with a response mask: token means;
  ``critic/advantages`` also asks for ``max`` and ``min``;
- the 4 response lengths, an int64 tensor, into ``(mean, max, min, p50, p99)``;
- the 4 prompt lengths, a Python list, into ``(mean, p50)``;
- on odd ranks only, 5 more scalar 0-d tensors (a layout that differs by rank);

and once per step 30 timing floats (``max``), 20 throughput floats (``sum``)
and the learning rate (``last``). Then every rank syncs and computes.

Two ways of doing that run interleaved, step by step, in the same processes
(the order alternates every step), on the same tensors:

- **metricsync**: ``Metrics.record`` for everything, then ``sync().compute()``
  and ``reset()``;
- **hand-rolled**, replicated from verl (``verl/utils/metric/utils.py``,
  ``verl/utils/py_functional.py``, ``verl/utils/torch_functional.py``,
  ``verl/trainer/ppo/metric_utils.py``, ``verl/workers/engine_workers.py``):
  ``.detach().item()`` on every tensor, masked means computed in torch then
  ``.item()``, ``masked_select`` + ``max``/``min`` + ``.item()``, one dict per
  micro-batch folded into a dict of lists by ``append_to_dict``, the timing and
  throughput floats as verl ``Metric`` objects (``max`` and ``sum``), the lr
  kept aside as verl's workers do, ``all_gather_object`` of the dict
  (``allgather_dict_into_dict``), the per-rank lists chained, then verl's
  ``reduce_metrics`` (``np.max`` / ``np.min`` / ``np.mean`` chosen by the key
  name, ``Metric.aggregate`` for ``Metric`` objects) plus ``np.percentile``
  for the p50/p99 a hand-roller would add.

Before timing, the two are checked against each other wherever their
definitions agree (scalar means, maxima, minima, sums, length statistics,
quantiles within the sketch's 1%), and metricsync's token means against the
global token mean computed directly (verl's are means of micro-batch means,
which differ; the benchmark prints by how much).

A step's time is the slowest rank's; the table gives per-step medians and
the median over steps of the ratio metricsync / hand-rolled (target <= 0.5x).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from enum import Enum
from itertools import chain
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import metricsync as ms
from metricsync.testing import run_distributed

N_SCALARS = 60
TOKEN_NAMES = (
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "critic/vf_clipfrac",
    "critic/values",
    "critic/advantages",  # also max and min
)
N_TIMING = 30
N_PERF = 20
N_ODD_EXTRA = 5
BATCH, SEQ = 4, 256

SPECS = {
    "critic/advantages": ms.Spec(("mean", "max", "min")),
    "response_length": ms.Spec(("mean", "max", "min", "p50", "p99"), fmt=".0f"),
    "prompt_length": ms.Spec(("mean", "p50"), fmt=".0f"),
    "timing_s/*": ms.Spec("max", fmt=".3f"),
    "perf/*": ms.Spec("sum", fmt=",.0f"),
    "actor/lr": ms.Spec("last", fmt=".2e"),
}


# --- verl's metric helpers, replicated (same behaviour, written for this benchmark) ---


class AggregationType(Enum):
    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


class Metric:
    """verl's ``Metric``: a list of numbers and how to aggregate them."""

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        self.aggregation = (
            AggregationType(aggregation) if isinstance(aggregation, str) else aggregation
        )
        self.values: list[Any] = []
        if value is not None:
            self.append(value)

    def append(self, value: Any) -> None:
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError("only scalar tensors can be converted to float")
            value = value.detach().item()
        if not isinstance(value, (int, float, torch.Tensor)):
            raise ValueError(f"unsupported value type {type(value)}")
        self.values.append(value)

    def extend(self, values: Any) -> None:
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError("aggregation mismatch")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> Any:
        fn = {
            AggregationType.MEAN: np.mean,
            AggregationType.SUM: np.sum,
            AggregationType.MIN: np.min,
            AggregationType.MAX: np.max,
        }[self.aggregation]
        return fn(self.values)

    def init_list(self) -> Metric:
        return Metric(self.aggregation)

    @classmethod
    def chain(cls, metrics: list[Metric]) -> Metric:
        out = cls(metrics[0].aggregation)
        for m in metrics:
            out.extend(m)
        return out


def append_to_dict(data: dict[str, Any], new_data: dict[str, Any]) -> None:
    """verl's ``append_to_dict``: lists extend, ``Metric`` objects merge, the rest appends."""
    for key, val in new_data.items():
        if key not in data:
            data[key] = val.init_list() if isinstance(val, Metric) else []
        if isinstance(val, list):
            data[key].extend(val)
        else:
            data[key].append(val)


def allgather_dict_into_dict(data: dict[str, Any], group: Any = None) -> dict[str, list[Any]]:
    """verl's ``allgather_dict_into_dict``: ``all_gather_object``, then a list per key by rank."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, data, group=group)
    out: dict[str, list[Any]] = {}
    for part in gathered:
        for key, val in part.items():
            out.setdefault(key, []).append(val)
    return out


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """verl's ``reduce_metrics``: ``Metric.aggregate``, else max/min/mean by the key's name."""
    for key, val in metrics.items():
        if isinstance(val, Metric):
            metrics[key] = val.aggregate()
        elif "max" in key:
            metrics[key] = np.max(val)
        elif "min" in key:
            metrics[key] = np.min(val)
        else:
            metrics[key] = np.mean(val)
    return metrics


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's ``masked_mean`` (``torch_functional``), over all elements."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


# --- the workload ------------------------------------------------------------


def make_data(rank: int, micro_batches: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1000 + rank)
    mbs = []
    for _ in range(micro_batches):
        resp_len = torch.randint(16, SEQ + 1, (BATCH,), generator=gen, dtype=torch.int64)
        mask = torch.arange(SEQ).unsqueeze(0) < resp_len.unsqueeze(1)
        scalars = [
            (f"actor/metric_{i:02d}", torch.randn((), generator=gen)) for i in range(N_SCALARS)
        ]
        if rank % 2 == 1:
            scalars += [
                (f"rollout/odd_{i}", torch.randn((), generator=gen)) for i in range(N_ODD_EXTRA)
            ]
        tokens = [
            (name, torch.randn(BATCH, SEQ, generator=gen) * 0.5 + (i + 1))
            for i, name in enumerate(TOKEN_NAMES)
        ]
        prompt_len = torch.randint(32, 1025, (BATCH,), generator=gen).tolist()
        mbs.append(
            {
                "scalars": scalars,
                "tokens": tokens,
                "mask": mask,
                "resp_len": resp_len,
                "prompt_len": prompt_len,
            }
        )
    rng = np.random.default_rng(rank)
    return {
        "mbs": mbs,
        "timing": [
            (f"timing_s/section_{i:02d}", float(rng.uniform(0.1, 5.0))) for i in range(N_TIMING)
        ],
        "perf": [(f"perf/throughput_{i:02d}", float(rng.uniform(1e3, 1e5))) for i in range(N_PERF)],
        "lr": 3e-6,
    }


def record_step(metrics: ms.Metrics, data: dict[str, Any]) -> None:
    """One step's records into ``metrics`` (what each rank records before it syncs)."""
    record = metrics.record
    for mb in data["mbs"]:
        for name, t in mb["scalars"]:
            record(name, t)
        mask = mb["mask"]
        for name, t in mb["tokens"]:
            record(name, t, mask=mask)
        record("response_length", mb["resp_len"])
        record("prompt_length", mb["prompt_len"])
    for name, v in data["timing"]:
        record(name, v)
    for name, v in data["perf"]:
        record(name, v)
    record("actor/lr", data["lr"])


def metricsync_step(
    metrics: ms.Metrics, data: dict[str, Any], times: dict[str, float]
) -> dict[str, float]:
    t0 = time.perf_counter()
    record_step(metrics, data)
    t1 = time.perf_counter()
    synced = metrics.sync()
    t2 = time.perf_counter()
    out = synced.compute()
    metrics.reset()
    t3 = time.perf_counter()
    times.update(record=t1 - t0, sync=t2 - t1, compute=t3 - t2)
    return out


def hand_rolled_step(data: dict[str, Any], times: dict[str, float]) -> dict[str, Any]:
    t0 = time.perf_counter()
    metrics: dict[str, Any] = {}
    for mb in data["mbs"]:
        mask = mb["mask"]
        mb_metrics: dict[str, Any] = {}
        for name, t in mb["scalars"]:
            mb_metrics[name] = t.detach().item()
        for name, t in mb["tokens"]:
            if name == "critic/advantages":
                valid = torch.masked_select(t, mask)
                mb_metrics[f"{name}/mean"] = torch.mean(valid).detach().item()
                mb_metrics[f"{name}/max"] = torch.max(valid).detach().item()
                mb_metrics[f"{name}/min"] = torch.min(valid).detach().item()
            else:
                mb_metrics[name] = masked_mean(t, mask).detach().item()
        resp_len = mb["resp_len"].float()
        mb_metrics["response_length/mean"] = torch.mean(resp_len).detach().item()
        mb_metrics["response_length/max"] = torch.max(resp_len).detach().item()
        mb_metrics["response_length/min"] = torch.min(resp_len).detach().item()
        mb_metrics["response_length"] = mb["resp_len"].tolist()  # kept for the quantiles
        mb_metrics["prompt_length"] = list(mb["prompt_len"])
        append_to_dict(metrics, mb_metrics)
    for name, v in data["timing"]:
        metrics[name] = Metric(AggregationType.MAX, v)
    for name, v in data["perf"]:
        metrics[name] = Metric(AggregationType.SUM, v)
    lr = data["lr"]  # verl's workers keep the lr aside: every rank has the same
    t1 = time.perf_counter()
    gathered = allgather_dict_into_dict(metrics)
    for key, val in gathered.items():  # flatten dp ranks and micro-batches, as verl's worker does
        gathered[key] = (
            Metric.chain(val) if isinstance(val[0], Metric) else list(chain.from_iterable(val))
        )
    resp = np.asarray(gathered.pop("response_length"), dtype=np.float64)
    prompt = np.asarray(gathered.pop("prompt_length"), dtype=np.float64)
    out = reduce_metrics(gathered)
    out["response_length/p50"] = np.percentile(resp, 50)
    out["response_length/p99"] = np.percentile(resp, 99)
    out["prompt_length/mean"] = np.mean(prompt)
    out["prompt_length/p50"] = np.percentile(prompt, 50)
    out["actor/lr"] = lr
    t2 = time.perf_counter()
    times.update(record=t1 - t0, sync=t2 - t1, compute=0.0)
    return out


def global_token_means(data: dict[str, Any]) -> dict[str, float]:
    """The true token mean of each per-token name over every micro-batch of every rank."""
    sums = torch.zeros(len(TOKEN_NAMES) * 2, dtype=torch.float64)
    for mb in data["mbs"]:
        m = mb["mask"]
        for i, (_, t) in enumerate(mb["tokens"]):
            sums[2 * i] += t.double()[m].sum()
            sums[2 * i + 1] += m.sum()
    dist.all_reduce(sums)
    return {name: float(sums[2 * i] / sums[2 * i + 1]) for i, name in enumerate(TOKEN_NAMES)}


def all_lengths(data: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every rank's response and prompt lengths, sorted."""
    local = {
        "response_length": [x for mb in data["mbs"] for x in mb["resp_len"].tolist()],
        "prompt_length": [x for mb in data["mbs"] for x in mb["prompt_len"]],
    }
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return {k: np.sort(np.concatenate([p[k] for p in parts]).astype(np.float64)) for k in local}


def check_quantile(key: str, got: float, samples: np.ndarray) -> None:
    """``got`` lies, within the sketch's 1%, between the two order statistics numpy's
    linear-interpolation quantile interpolates between (it answers one of them)."""
    q = float(key.rsplit("/p", 1)[1]) / 100.0
    pos = q * (samples.size - 1)
    lo, hi = samples[math.floor(pos)], samples[math.ceil(pos)]
    assert lo * 0.99 <= got <= hi * 1.01, (key, got, lo, hi)


def check_agreement(ours: dict[str, float], theirs: dict[str, Any], data: dict[str, Any]) -> float:
    """Assert both sides agree where their definitions do; return verl's worst token-mean error."""
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))
    truth = global_token_means(data)
    lengths = all_lengths(data)
    token_keys = {n if n != "critic/advantages" else f"{n}/mean" for n in TOKEN_NAMES}
    worst = 0.0
    for key, want in theirs.items():
        got = ours[key]
        want = float(want)
        if key in token_keys:
            true = truth[key.removesuffix("/mean")]
            assert math.isclose(got, true, rel_tol=1e-6, abs_tol=1e-9), (key, got, true)
            worst = max(worst, abs(want - true) / max(abs(true), 1e-12))
        elif key.endswith(("/p50", "/p99")):
            check_quantile(key, got, lengths[key.rsplit("/", 1)[0]])
        else:
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), (key, got, want)
    return worst


def _bench_rank(
    rank: int, world: int, steps: int, warmup: int, micro_batches: int
) -> dict[str, Any]:
    data = make_data(rank, micro_batches)
    metrics = ms.Metrics(SPECS)
    scratch: dict[str, float] = {}
    ours = metricsync_step(metrics, data, scratch)
    theirs = hand_rolled_step(data, scratch)
    worst = check_agreement(ours, theirs, data)

    sides: dict[str, Callable[[dict[str, float]], object]] = {
        "metricsync": lambda times: metricsync_step(metrics, data, times),
        "hand-rolled": lambda times: hand_rolled_step(data, times),
    }
    rows: list[
        list[float]
    ] = []  # per step: ours total, record, sync, compute; theirs total, record, sync
    for step in range(warmup + steps):
        order = list(sides) if step % 2 == 0 else list(reversed(sides))
        got: dict[str, dict[str, float]] = {}
        for side in order:
            times: dict[str, float] = {}
            dist.barrier()
            start = time.perf_counter()
            sides[side](times)
            times["total"] = time.perf_counter() - start
            got[side] = times
        if step >= warmup:
            o, h = got["metricsync"], got["hand-rolled"]
            rows.append(
                [
                    o["total"],
                    o["record"],
                    o["sync"],
                    o["compute"],
                    h["total"],
                    h["record"],
                    h["sync"],
                ]
            )
    per_step = torch.tensor(rows, dtype=torch.float64)
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
    return {"rows": per_step.tolist(), "keys": len(ours), "verl_token_mean_error": worst}


def summarize(world: int, result: dict[str, Any]) -> dict[str, float]:
    rows = result["rows"]
    col = list(zip(*rows))
    med = [statistics.median(c) for c in col]
    ratio = statistics.median(r[0] / r[4] for r in rows)
    return {
        "world": world,
        "keys": result["keys"],
        "ours": med[0],
        "ours_record": med[1],
        "ours_sync": med[2],
        "ours_compute": med[3],
        "theirs": med[4],
        "theirs_record": med[5],
        "theirs_sync": med[6],
        "ratio": ratio,
        "verl_err": result["verl_token_mean_error"],
    }


def format_table(rows: list[dict[str, float]]) -> str:
    def ms_(x: float) -> str:
        return f"{x * 1e3:.1f}"

    lines = [
        "ranks  keys  metricsync ms (record/sync/compute)  hand-rolled ms (record/gather+reduce)"
        "  metricsync/hand-rolled (target <= 0.5x)",
    ]
    for r in rows:
        ours = f"{ms_(r['ours'])} ({ms_(r['ours_record'])}/{ms_(r['ours_sync'])}/{ms_(r['ours_compute'])})"
        theirs = f"{ms_(r['theirs'])} ({ms_(r['theirs_record'])}/{ms_(r['theirs_sync'])})"
        lines.append(
            f"{int(r['world']):>5} {int(r['keys']):>5}  {ours:<35}  {theirs:<37}  {r['ratio']:.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20, help="measured steps (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured first steps (default 2)")
    parser.add_argument("--micro-batches", type=int, default=8)
    args = parser.parse_args()
    rows = []
    for world in args.worlds:
        results = run_distributed(
            _bench_rank, world, args=(args.steps, args.warmup, args.micro_batches), timeout=900
        )
        rows.append(summarize(world, results[0]))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(
        f"{args.micro_batches} micro-batches per step, {args.steps} measured steps (after "
        f"{args.warmup}), medians; the slowest rank's time per step"
    )
    print(format_table(rows))
    worst = max(r["verl_err"] for r in rows)
    print(
        "both sides agree on every key where their definitions do; verl's token means "
        f"(means of micro-batch means) are off the true token mean by up to {worst:.2%}"
    )


if __name__ == "__main__":
    main()
