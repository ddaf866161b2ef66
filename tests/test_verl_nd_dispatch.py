"""verl 0.9.1's production dispatch: ``make_nd_compute_dataproto_dispatch_fn(mesh_name="train")``
on a 2 x 2 DP x TP mesh of 4 CPU Ray workers.

Each worker registers its DP rank and whether it answers for it (TP rank 0), as verl's engine
workers do. ``train`` runs verl's own ``ppo_loss``/``value_loss`` per micro-batch and verl's
own glue (``append_to_dict``, ``allgather_dict_into_dict`` over the DP group,
``Metric.aggregate_dp``), with ``install()`` in every worker and on the driver or not at all;
``raw`` returns a ``metricsync.Metrics`` per worker through :func:`make_nd_collect_metrics`.
The oracle pools every valid token of every micro-batch of both DP ranks with torch: a TP
replica counted twice or a DP rank lost changes the numbers.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from itertools import chain
from typing import Any

import pytest
from _ray import local_ray

import metricsync as ms
import metricsync.verl_compat as vc

ray = pytest.importorskip("ray", reason="ray (test extra) is not installed")
pytest.importorskip("verl.single_controller.ray", reason="verl (test extra) is not installed")
torch = pytest.importorskip("torch")
from tensordict import TensorDict  # noqa: E402
from test_verl_token_mean import (  # noqa: E402
    TOKEN_MEANS,
    brute_force,
    config,
    loss_data,
    micro_batch,
    model_output,
)
from verl.protocol import DataProto  # noqa: E402
from verl.single_controller.base import Worker  # noqa: E402
from verl.single_controller.base.decorator import (  # noqa: E402
    Dispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.single_controller.ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
)

# 4 workers start on a busy CPU; minutes: make test-slow (CI) runs it
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]
DP, TP = 2, 2
SPLITS = {"equal": [[2, 2], [2, 2]], "uneven": [[1, 3], [3, 2]]}  # [DP rank][mini-batch]
SEEDS = [11, 12]  # per DP rank


def rank_batches(seed: int, counts: list[int]) -> list[list[dict[str, Any]]]:
    """One DP rank's micro-batches, per mini-batch (TP replicas make the same)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        [micro_batch(gen, 3, int(torch.randint(2, 30, (1,), generator=gen))) for _ in range(n)]
        for n in counts
    ]


class MeshWorker(Worker):
    """A verl Worker in a DP x TP mesh running verl's loss and metric glue."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_mesh(self) -> int:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=60),
        )
        self.dp_rank, self.tp_rank = divmod(self.rank, TP)
        groups = [dist.new_group([tp + TP * dp for dp in range(DP)]) for tp in range(TP)]
        self.dp_group = groups[self.tp_rank]
        self._register_dispatch_collect_info("train", self.dp_rank, self.tp_rank == 0)
        return int(self.dp_rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def switch(self, mode: str) -> None:
        vc.uninstall()
        if mode != "verl":
            vc.install(token_mean=mode == "token_mean")

    def _flow(self, seed: int, counts: list[int], group: Any) -> dict[str, Any]:
        """verl's train_mini_batch and _postprocess_output, with the names verl's modules hold."""
        import torch.distributed as dist
        import verl.utils.py_functional as pf
        import verl.utils.torch_functional as tf
        from verl.utils.metric.utils import Metric
        from verl.workers.utils import losses

        actor_cfg, critic_cfg = config()
        actor_loss = partial(losses.ppo_loss, config=actor_cfg)
        critic_loss = partial(losses.value_loss, config=critic_cfg)
        dp_size = dist.get_world_size(group)
        metrics: dict[str, Any] = {}
        for mini in rank_batches(seed, counts):
            tokens = torch.tensor(sum(int(b["mask"].sum()) for b in mini))
            dist.all_reduce(tokens, group=group)  # verl's global token count
            aggregated: dict[str, Any] = {}
            for b in mini:
                td = loss_data(b, int(tokens), dp_size)
                out = {"log_probs": model_output(b, "new"), "values": model_output(b, "vpreds")}
                pf.append_to_dict(
                    aggregated, actor_loss(model_output=out, data=td, dp_group=None)[1]
                )
                pf.append_to_dict(
                    aggregated, critic_loss(model_output=out, data=td, dp_group=None)[1]
                )
            final = tf.allgather_dict_into_dict(data=aggregated, group=group)
            for key, val in final.items():
                final[key] = (
                    Metric.aggregate_dp(val)
                    if isinstance(val[0], Metric)
                    else list(chain.from_iterable(val))
                )
            pf.append_to_dict(metrics, final)
        return metrics

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"))
    def train(self, data: TensorDict) -> TensorDict | None:
        import verl.utils.tensordict_utils as tu

        counts = [int(n) for n in data["n_micro"][0].tolist()]
        metrics = self._flow(int(data["seed"][0]), counts, self.dp_group)
        if self.tp_rank != 0:  # verl: only the ranks with outputs answer
            return None
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    # The other dispatch modes: every worker is a DP rank of the whole world.
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def one_to_all(self, seeds: list[int], splits: list[list[int]]) -> dict[str, Any]:
        return self._flow(seeds[self.rank], splits[self.rank], None)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def dp_compute(self, seed: int, counts: list[int]) -> dict[str, Any]:
        return self._flow(seed, counts, None)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def dp_metric(self, data: DataProto) -> dict[str, Any]:
        return self._flow(int(data.batch["seed"][0]), data.batch["n_micro"][0].tolist(), None)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def dp_proto(self, data: DataProto) -> DataProto:
        metrics = self._flow(int(data.batch["seed"][0]), data.batch["n_micro"][0].tolist(), None)
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def dp_proto_func(self, func: Any, data: DataProto) -> DataProto:
        seed = func(int(data.batch["seed"][0]))
        metrics = self._flow(seed, data.batch["n_micro"][0].tolist(), None)
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=vc.make_nd_collect_metrics("train"))
    def raw(self, data: TensorDict) -> ms.Metrics:
        """Every worker (TP replicas too) returns its DP rank's raw token metrics."""
        counts = [int(n) for n in data["n_micro"][0].tolist()]
        metrics = ms.Metrics({"ppo_kl": ms.Spec("mean"), "tokens": ms.Spec("sum")})
        for mini in rank_batches(int(data["seed"][0]), counts):
            for b in mini:
                metrics.record("ppo_kl", (b["old"] - b["new"])[b["mask"]])
                metrics.record("tokens", float(b["mask"].sum()))
        return metrics


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def mesh() -> Iterator[Any]:
    # verl's nd dispatch wraps the method in a closure over its transfer-queue module, which
    # cannot be pickled by value: the workers import this module (and its worker class) by name.
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])
    with local_ray(DP * TP, runtime_env={"env_vars": {"PYTHONPATH": path}}):
        wg = RayWorkerGroup(
            RayResourcePool([DP * TP], use_gpu=False, max_colocate_count=1),
            RayClassWithInitArgs(cls=ray.remote(num_cpus=1)(MeshWorker)),
            device_name="cpu",
            master_addr="127.0.0.1",
            master_port=str(free_port()),
            worker_env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        )
        assert wg.init_mesh() == [0, 0, 1, 1]
        yield wg


def batch(split: str) -> TensorDict:
    return TensorDict(
        {"seed": torch.tensor(SEEDS), "n_micro": torch.tensor(SPLITS[split])}, batch_size=[DP]
    )


def every_batch(split: str) -> list[list[list[dict[str, Any]]]]:
    return [rank_batches(seed, counts) for seed, counts in zip(SEEDS, SPLITS[split])]


def driver_metrics(mesh: Any, mode: str, split: str) -> dict[str, float]:
    """The driver's side: verl's _update_actor reads the collected metrics and reduces them."""
    import verl.utils.metric.utils as vmu
    import verl.utils.tensordict_utils as tu

    mesh.switch(mode)
    vc.uninstall()
    with vc.install(token_mean=mode == "token_mean") if mode != "verl" else _nothing():
        out = mesh.train(batch(split))
        return {k: float(v) for k, v in vmu.reduce_metrics(tu.get(out, "metrics")).items()}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_nd_dispatch_with_token_mean_gives_global_token_means(mesh: Any, split: str) -> None:
    got = driver_metrics(mesh, "token_mean", split)
    truth = brute_force(every_batch(split))
    for key in TOKEN_MEANS:
        assert math.isclose(got[key], truth[key], rel_tol=1e-6), (key, got[key], truth[key])


def test_nd_dispatch_plain_install_gives_verls_numbers_or_raises_as_verl(mesh: Any) -> None:
    verl = driver_metrics(mesh, "verl", "equal")
    ours = driver_metrics(mesh, "plain", "equal")
    assert verl.keys() == ours.keys()
    for key, value in verl.items():
        assert math.isclose(ours[key], value, rel_tol=1e-9), key
    for mode in ("verl", "plain"):  # uneven micro-batch counts: both raise, neither a number
        with pytest.raises(ray.exceptions.RayTaskError, match="number"):
            driver_metrics(mesh, mode, "uneven")


def test_nd_collect_metrics_counts_each_dp_rank_once(mesh: Any) -> None:
    got = mesh.raw(batch("uneven")).compute()
    every = [b for rank in every_batch("uneven") for mini in rank for b in mini]
    kl = torch.cat([(b["old"] - b["new"])[b["mask"]] for b in every])
    assert got["tokens"] == float(kl.numel())  # a TP replica counted too would double it
    assert math.isclose(got["ppo_kl"], float(kl.mean()), rel_tol=1e-9)


WORLD_SEEDS = [21, 22, 23, 24]
WORLD_SPLIT = [[1, 2], [3, 1], [2, 2], [1, 3]]  # uneven micro-batch counts on 4 DP ranks


def same_seed(seed: int) -> int:
    """The function DP_COMPUTE_PROTO_WITH_FUNC ships to the workers."""
    return seed


@pytest.mark.parametrize(
    "mode", ["ONE_TO_ALL", "DP_COMPUTE", "DP_COMPUTE_METRIC", "DP_COMPUTE_PROTO", "WITH_FUNC"]
)
def test_every_other_dispatch_mode_gives_global_token_means(mesh: Any, mode: str) -> None:
    import verl.utils.metric.utils as vmu

    mesh.switch("token_mean")
    proto = DataProto.from_dict(
        tensors={"seed": torch.tensor(WORLD_SEEDS), "n_micro": torch.tensor(WORLD_SPLIT)}
    )
    vc.uninstall()
    with vc.install(token_mean=True):
        if mode == "ONE_TO_ALL":
            metrics = mesh.one_to_all(WORLD_SEEDS, WORLD_SPLIT)[0]  # every rank holds the group
        elif mode == "DP_COMPUTE":
            metrics = mesh.dp_compute(WORLD_SEEDS, WORLD_SPLIT)[0]
        elif mode == "DP_COMPUTE_METRIC":
            metrics = mesh.dp_metric(proto)[0]
        elif mode == "DP_COMPUTE_PROTO":  # verl's concat lists the workers' copies of the group
            metrics = mesh.dp_proto(proto).meta_info["metrics"]
        else:
            metrics = mesh.dp_proto_func(same_seed, proto).meta_info["metrics"]
        got = {k: float(v) for k, v in vmu.reduce_metrics(metrics).items()}
    data = [rank_batches(seed, counts) for seed, counts in zip(WORLD_SEEDS, WORLD_SPLIT)]
    truth = brute_force(data)
    for key in TOKEN_MEANS:
        assert math.isclose(got[key], truth[key], rel_tol=1e-6), (key, got[key], truth[key])
