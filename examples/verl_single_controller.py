"""metricsync inside verl's own single controller: a worker group of two CPU actors on Ray.

The driver starts verl's ``RayWorkerGroup`` of two verl ``Worker`` s (CPU,
Ray and gloo on 127.0.0.1). Each step it dispatches a ``DataProto`` batch of
responses with ``Dispatch.DP_COMPUTE_PROTO``. Each worker splits its half into
gradient-accumulation micro-batches (a different number per worker), runs
verl's own ``compute_policy_loss_vanilla`` on each, and records:

- into a :class:`metricsync.Metrics`: ``actor/pg_loss`` summed over micro-batches
  and averaged over workers, ``actor/ppo_kl`` and ``actor/pg_clipfrac``
  weighted by each micro-batch's valid tokens, ``actor/entropy`` per token
  under the response mask, ``response_length`` statistics;
- with verl's own names (``from verl.utils.metric import Metric``), which
  ``metricsync.verl_compat.install()`` switched to metricsync, the micro-batch
  ``actor/grad_norm``, reduced over the DP group by verl's own
  ``allgather_dict_into_dict`` (now one metricsync sync).

Each worker syncs its ``Metrics`` over the workers' gloo world and rank 0
returns it in the ``DataProto``'s ``meta_info["metrics"]``; verl concatenates
the workers' outputs and the driver merges and logs. Run it with::

    python examples/verl_single_controller.py --steps 3

It needs verl (``pip install "metricsync[verl]"`` and ``pip install --no-deps
verl==0.9.1``); without it, it says so and exits.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from datetime import timedelta
from typing import Any

import torch

import metricsync as ms
import metricsync.verl_compat as vc

SPECS = {
    "actor/pg_loss": ms.Spec("sum", across="mean", fmt=".4f"),  # verl's SUM: globally scaled
    "actor/ppo_kl": ms.Spec("mean", fmt=".2e"),  # token-weighted
    "actor/pg_clipfrac": ms.Spec("mean", fmt=".3f"),  # token-weighted
    "actor/entropy": ms.Spec("mean", fmt=".4f"),  # per token, masked
    "response_length": ms.Spec(("mean", "max", "min"), fmt=".0f"),
}
WORLD = 2
BATCH, MAX_LEN = 16, 48


try:  # verl is optional: without it, main() says so
    from verl.protocol import DataProto
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
except ImportError as exc:
    VERL_MISSING: ImportError | None = exc
else:
    VERL_MISSING = None

    class PPOActor(Worker):
        """One DP rank of the actor: verl's Worker, metrics on metricsync."""

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self) -> None:
            from omegaconf import OmegaConf

            vc.install()  # in this process too: verl's metric helpers now run on metricsync
            torch.set_num_threads(1)
            torch.distributed.init_process_group(
                "gloo",
                init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=60),
            )
            self.loss_config = OmegaConf.create(
                {
                    "clip_ratio": 0.2,
                    "clip_ratio_low": 0.2,
                    "clip_ratio_high": 0.2,
                    "global_batch_info": {},
                }
            )

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def update_actor(self, data: DataProto) -> DataProto:
            from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
            from verl.utils.metric import AggregationType, Metric  # metricsync's, after install()
            from verl.utils.py_functional import append_to_dict
            from verl.utils.torch_functional import allgather_dict_into_dict

            metrics = ms.Metrics(SPECS)
            verl_style: dict[str, Any] = {}
            n_micro = 2 ** (self.rank + 1)  # workers accumulate 2, 4 micro-batches
            for part in data.chunk(n_micro):
                b = part.batch
                mask = b["response_mask"]
                # verl's global-token scaling: summed over micro-batches, averaged over
                # workers, pg_loss is the token mean of the whole batch
                self.loss_config.global_batch_info = {
                    "dp_size": self.world_size,
                    "batch_num_tokens": data.meta_info["batch_num_tokens"],
                }
                pg_loss, pg_metrics = compute_policy_loss_vanilla(
                    b["old_log_probs"],
                    b["log_probs"],
                    b["advantages"],
                    mask,
                    "token-mean",
                    self.loss_config,
                )
                metrics.record("actor/pg_loss", pg_loss.detach())
                tokens = mask.sum()  # the token weights verl already has
                metrics.record("actor/ppo_kl", pg_metrics["actor/ppo_kl"], weight=tokens)
                metrics.record("actor/pg_clipfrac", pg_metrics["actor/pg_clipfrac"], weight=tokens)
                metrics.record("actor/entropy", b["entropy"], mask=mask)
                metrics.record("response_length", mask.sum(-1))
                grad_norm = 1.0 + pg_loss.detach().abs()  # stands in for the clipped grad norm
                append_to_dict(
                    verl_style, {"actor/grad_norm": Metric(AggregationType.MAX, grad_norm)}
                )
            # verl's own DP reduction of its metrics dict: one metricsync sync, no pickle
            gathered = allgather_dict_into_dict(verl_style)
            grad_norm_max = float(Metric.aggregate_dp(gathered["actor/grad_norm"]))
            synced = metrics.sync(timeout=60.0)  # over the workers' gloo world
            if self.rank == 0:
                synced.record("actor/grad_norm_max", grad_norm_max)
            return DataProto(
                meta_info={"metrics": {"metricsync": synced if self.rank == 0 else None}}
            )


def make_batch(step: int) -> Any:
    """Responses of uneven lengths: old/new log-probs, advantages, entropy, response mask."""
    gen = torch.Generator().manual_seed(step)
    lengths = torch.randint(4, MAX_LEN + 1, (BATCH,), generator=gen)
    old = -torch.rand(BATCH, MAX_LEN, generator=gen) * 2
    return DataProto.from_dict(
        meta_info={"batch_num_tokens": int(lengths.sum())},
        tensors={
            "old_log_probs": old,
            "log_probs": old - torch.randn(BATCH, MAX_LEN, generator=gen).abs() * 0.1,
            "advantages": torch.randn(BATCH, MAX_LEN, generator=gen),
            "entropy": torch.rand(BATCH, MAX_LEN, generator=gen) * 2 / (1 + 0.2 * step),
            "response_mask": torch.arange(MAX_LEN)[None, :] < lengths[:, None],
        },
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if VERL_MISSING is not None:
        print(f"this example needs verl ({VERL_MISSING}); see its docstring", file=sys.stderr)
        return 0
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    vc.install()  # the driver's verl modules too (its reduce_metrics, say)
    run_dir = args.out or tempfile.mkdtemp(prefix="verl_single_controller_")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        group = RayWorkerGroup(
            RayResourcePool([WORLD], use_gpu=False, max_colocate_count=1),
            RayClassWithInitArgs(cls=ray.remote(PPOActor)),
            device_name="cpu",
            master_addr="127.0.0.1",  # keep the workers' gloo world on loopback
            master_port=str(free_port()),
            worker_env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        )
        group.init_model()
        with ms.Tracker(backends=("console", "jsonl"), run_dir=run_dir) as tracker:
            for step in range(1, args.steps + 1):
                out = group.update_actor(make_batch(step))  # verl concatenates the workers' outputs
                merged = ms.collect(out.meta_info["metrics"]["metricsync"])  # [rank 0's, None]
                tracker.log(merged, step=step)
    finally:
        ray.shutdown()
    print(f"metrics written to {os.path.join(run_dir, 'metrics.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
