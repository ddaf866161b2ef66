"""verl's own PPO update on its single controller, on metricsync: exact metrics in two lines.

The driver starts verl's ``RayWorkerGroup`` of verl ``Worker`` s on CPU (Ray
and gloo on 127.0.0.1): two data-parallel (DP) ranks, or with ``--tp 2`` a
2 x 2 DP x TP mesh of four, dispatched by DP rank as verl 0.9.1's engine
workers are (``make_nd_compute_dataproto_dispatch_fn(mesh_name="train")``).
Each step, every DP rank runs what verl's engine worker runs, with verl's
own functions and nothing of metricsync's::

    for each mini-batch:
        for each micro-batch (2 on DP rank 0, 3 on DP rank 1: uneven, where verl alone raises):
            loss, metrics = ppo_loss(config, model_output, micro_batch)   # verl's loss
            append_to_dict(mini_metrics, metrics)
        gathered = allgather_dict_into_dict(mini_metrics, group=dp_group)
        gathered = {key: Metric.aggregate_dp(val) ...}                   # verl's train_mini_batch
        append_to_dict(metrics, gathered)

and the driver reduces the result with verl's ``reduce_metrics`` and logs
it through ``metricsync.integrations.verl.Tracking`` with verl's
``["console", "file"]`` loggers, as verl's trainer does. The model is left
out: the "model output" is random log-probs, and the response masks are
random lengths.

The metricsync lines are two: ``metricsync.verl_compat.install()`` in the
driver and in each worker (with its default ``token_mean=True``, verl's
``actor/ppo_kl``, ``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower``
become global token means over micro-batches, mini-batches and DP ranks),
and the ``Tracking``. At the end, the example recomputes every logged key
from all the samples at once and prints the largest relative difference.
Run it with::

    python examples/verl_single_controller.py --steps 2 [--tp 2]

It needs verl (``pip install "metricsync[verl]"`` and ``pip install --no-deps
verl==0.9.1``); without it, it says so and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from datetime import timedelta
from itertools import chain, pairwise
from typing import Any

import torch
import torch.distributed as dist

import metricsync.verl_compat as vc
from metricsync.integrations.verl import Tracking

ROWS_PER_DP = 12  # responses per DP rank per step
MINI_BATCHES = 2  # per step
MICRO_BATCHES = (2, 3)  # per mini-batch, on DP rank 0 and DP rank 1
MAX_LEN = 24
LOSS_CONFIG = {  # the fields of verl's ActorConfig that ppo_loss reads
    "clip_ratio": 0.2,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "global_batch_info": {},
    "loss_scale_factor": None,
    "loss_agg_mode": "token-mean",
    "policy_loss": {"loss_mode": "vanilla"},
    "entropy_coeff": 0.0,
    "use_kl_loss": True,
    "kl_loss_type": "k1",
    "kl_loss_coef": 0.1,
}

try:  # verl is optional: without it, main() says so
    from verl.protocol import DataProto
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import (
        Dispatch,
        make_nd_compute_dataproto_dispatch_fn,
        register,
    )
except ImportError as exc:
    VERL_MISSING: ImportError | None = exc
else:
    VERL_MISSING = None

    class PPOActor(Worker):
        """One rank of the actor: verl's Worker running verl's loss and metric glue."""

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self, tp: int, token_mean: bool = True) -> None:
            from omegaconf import OmegaConf

            vc.install(token_mean=token_mean)  # in this process too, before the loss is used
            torch.set_num_threads(1)
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=120),
            )
            self.dp_rank, tp_rank = divmod(self.rank, tp)
            dp_size = self.world_size // tp
            # one DP group per TP rank, made by every rank in the same order
            groups = [dist.new_group([d * tp + t for d in range(dp_size)]) for t in range(tp)]
            self.dp_group, self.dp_size = groups[tp_rank], dp_size
            self.is_collect = tp_rank == 0  # one TP replica of each DP rank returns
            self._register_dispatch_collect_info("train", self.dp_rank, self.is_collect)
            self.loss_config = OmegaConf.create(LOSS_CONFIG)

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def update_actor(self, data: DataProto) -> Any:
            """Two DP ranks, no mesh: verl's DataProto dispatch."""
            return self._update(data)

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
        def train_mini_batch(self, data: DataProto) -> Any:
            """A DP x TP mesh: dispatched by DP rank, collected from one TP rank each."""
            return self._update(data)

        def _update(self, data: DataProto) -> Any:
            from verl.utils import tensordict_utils as tu
            from verl.utils.metric import Metric  # metricsync's, after install()
            from verl.utils.py_functional import append_to_dict
            from verl.utils.torch_functional import allgather_dict_into_dict
            from verl.workers.utils.losses import ppo_loss

            metrics: dict[str, Any] = {}
            for mini in split(data.batch, MINI_BATCHES):
                # verl's engine: the mini-batch's valid tokens over the DP group scale the loss
                tokens = mini["response_mask"].sum()
                dist.all_reduce(tokens, group=self.dp_group)
                mini_metrics: dict[str, Any] = {}
                losses = []
                for micro in split(mini, MICRO_BATCHES[self.dp_rank]):
                    batch, model_output = as_engine_input(micro, int(tokens), self.dp_size)
                    loss, micro_metrics = ppo_loss(self.loss_config, model_output, batch)
                    append_to_dict(mini_metrics, micro_metrics)
                    losses.append(loss)
                # verl's _postprocess_output and train_mini_batch, as they are (but gloo has
                # no ReduceOp.AVG: SUM over the DP group, then divided)
                loss = torch.stack(losses).sum()
                dist.all_reduce(loss, group=self.dp_group)
                gathered = allgather_dict_into_dict(mini_metrics, group=self.dp_group)
                gathered["loss"] = loss.item() / self.dp_size
                for key, val in gathered.items():
                    if isinstance(val, list):
                        gathered[key] = (
                            Metric.aggregate_dp(val)
                            if isinstance(val[0], Metric)
                            else list(chain.from_iterable(val))
                        )
                append_to_dict(metrics, gathered)
            if not self.is_collect:
                return None
            return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


def split(batch: Any, parts: int) -> list[Any]:
    """``parts`` contiguous slices of a batch's rows (sizes differing by at most one)."""
    bounds = torch.linspace(0, batch.batch_size[0], parts + 1).round().long().tolist()
    return [batch[a:b] for a, b in pairwise(bounds)]


def as_engine_input(micro: Any, batch_tokens: int, dp_size: int) -> tuple[Any, dict[str, Any]]:
    """A micro-batch as verl's engine hands it to ``ppo_loss``, and the "model output".

    Each sequence is a one-token prompt and its response; the model output
    is flat over the sequences (no padding), shifted by one token, as verl's
    ``no_padding_2_padding`` reads it.
    """
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    mask = micro["response_mask"]
    rows = mask.shape[0]
    prompt = torch.ones(rows, 1, dtype=torch.int64)
    batch = TensorDict(
        {
            "prompts": prompt,
            "responses": torch.ones_like(mask, dtype=torch.int64),
            "attention_mask": torch.cat([prompt, mask.long()], dim=1),
            "response_mask": mask.long(),
            "old_log_probs": micro["old_log_probs"],
            "advantages": micro["advantages"],
            "ref_log_prob": micro["ref_log_prob"],
        },
        batch_size=[rows],
    )
    tu.assign_non_tensor(
        batch, dp_size=dp_size, batch_num_tokens=batch_tokens, global_batch_size=None
    )

    def flat(key: str) -> torch.Tensor:
        lengths = mask.sum(-1).tolist()
        pad = torch.zeros(1, dtype=torch.float64)
        return torch.cat([t for i, n in enumerate(lengths) for t in (micro[key][i, :n], pad)])

    return batch, {"log_probs": flat("log_probs"), "entropy": flat("entropy")}


def make_batch(step: int, dp_size: int) -> Any:
    """Random responses: log-probs (old, new, reference), advantages, entropy, masks."""
    gen = torch.Generator().manual_seed(step)
    rows = ROWS_PER_DP * dp_size
    lengths = torch.randint(1, MAX_LEN + 1, (rows,), generator=gen)
    scale = (2.0 / lengths.double())[:, None]  # short responses move more than long ones
    old = -torch.rand(rows, MAX_LEN, generator=gen, dtype=torch.float64) * 2

    def noise() -> torch.Tensor:
        return torch.randn(rows, MAX_LEN, generator=gen, dtype=torch.float64)

    return DataProto.from_dict(
        tensors={
            "old_log_probs": old,
            "log_probs": old + (1.5 * noise() - 0.5) * scale,
            "ref_log_prob": old + noise() * 0.1,
            "advantages": noise(),
            "entropy": torch.rand(rows, MAX_LEN, generator=gen, dtype=torch.float64),
            "response_mask": torch.arange(MAX_LEN)[None, :] < lengths[:, None],
        }
    )


def driver_step(group: Any, batch: Any, tp: int) -> dict[str, Any]:
    """Dispatch, collect and reduce one step as verl's trainer does (its ``_update_actor``)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics  # metricsync's, after install()
    from verl.utils.py_functional import rename_dict

    out = group.update_actor(batch) if tp == 1 else group.train_mini_batch(batch)
    metrics = rename_dict(tu.get(out, "metrics"), "actor/")
    actor_output = DataProto.from_single_dict(data={}, meta_info={"metrics": metrics})
    return reduce_metrics(actor_output.meta_info["metrics"])


def brute_force(batches: list[Any], dp_size: int) -> dict[str, float]:
    """Every logged key from all the samples at once (torch, no verl, no metricsync)."""
    clip_low, clip_high, clip_c = 0.2, 0.28, 3.0
    token_means: dict[str, list[torch.Tensor]] = {}
    per_mini: dict[str, list[float]] = {}
    for batch in batches:
        ranks = [split(part, MINI_BATCHES) for part in split(batch.batch, dp_size)]
        for j in range(MINI_BATCHES):
            mini = torch.cat([rank[j] for rank in ranks])  # over DP ranks
            mask = mini["response_mask"]
            log_ratio = (mini["log_probs"] - mini["old_log_probs"]).clamp(-20.0, 20.0)[mask]
            adv = mini["advantages"][mask]
            ratio = log_ratio.exp()
            unclipped = -adv * ratio
            clipped = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
            pessimistic = torch.maximum(unclipped, clipped)
            pg = torch.where(adv < 0, torch.minimum(-adv * clip_c, pessimistic), pessimistic)
            kl = (mini["log_probs"] - mini["ref_log_prob"])[mask]
            for key, values in {
                "actor/ppo_kl": -log_ratio,
                "actor/pg_clipfrac": (clipped > unclipped).double(),
                "actor/pg_clipfrac_lower": ((pessimistic > -adv * clip_c) & (adv < 0)).double(),
            }.items():
                token_means.setdefault(key, []).append(values)
            for key, value in {  # verl's SUM-scaled losses: the mini-batch's token mean
                "actor/pg_loss": pg.mean(),
                "actor/entropy_loss": mini["entropy"][mask].mean(),
                "actor/kl_loss": kl.mean(),
                "actor/loss": pg.mean() + LOSS_CONFIG["kl_loss_coef"] * kl.mean(),
            }.items():
                per_mini.setdefault(key, []).append(float(value))
    out = {key: float(torch.cat(values).mean()) for key, values in token_means.items()}
    out.update({key: sum(values) / len(values) for key, values in per_mini.items()})
    out["actor/kl_coef"] = float(LOSS_CONFIG["kl_loss_coef"])
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_workers(tp: int, token_mean: bool = True) -> Any:
    """verl's RayWorkerGroup of 2 * tp CPU workers (gloo on loopback), switched to metricsync."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    group = RayWorkerGroup(
        RayResourcePool([2 * tp], use_gpu=False, max_colocate_count=1),
        RayClassWithInitArgs(cls=ray.remote(PPOActor)),
        device_name="cpu",
        master_addr="127.0.0.1",
        master_port=str(free_port()),
        worker_env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
    )
    group.init_model(tp, token_mean)
    return group


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1, choices=(1, 2), help="TP size (DP is 2)")
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if VERL_MISSING is not None:
        print(f"this example needs verl ({VERL_MISSING}); see its docstring", file=sys.stderr)
        return 0
    import ray

    run_dir = args.out or tempfile.mkdtemp(prefix="verl_single_controller_")
    os.makedirs(run_dir, exist_ok=True)
    os.environ["VERL_FILE_LOGGER_PATH"] = os.path.join(run_dir, "metrics.jsonl")  # verl's file
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=2 * args.tp,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        with vc.install():  # the driver's verl modules (its reduce_metrics)
            group = start_workers(args.tp)
            tracking = Tracking("metricsync-examples", "verl-ppo", ["console", "file"])
            batches = [make_batch(step, dp_size=2) for step in range(1, args.steps + 1)]
            for step, batch in enumerate(batches, start=1):
                tracking.log(data=driver_step(group, batch, args.tp), step=step)
            tracking.finish(exit_code=0)
    finally:
        ray.shutdown()
    with open(os.environ["VERL_FILE_LOGGER_PATH"]) as f:
        logged = [json.loads(line)["data"] for line in f]
    worst = max(
        abs(row[key] - want) / max(abs(want), 1e-12)
        for step, row in enumerate(logged)
        for key, want in brute_force([batches[step]], dp_size=2).items()
    )
    print(f"every logged key against all samples at once: largest relative difference {worst:.1e}")
    print(f"verl's file logger wrote {os.environ['VERL_FILE_LOGGER_PATH']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
