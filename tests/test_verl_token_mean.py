"""``install(token_mean=True)``: verl 0.9.1's own ``ppo_loss`` and ``value_loss``, unchanged, give
global token means across micro-batches, mini-batches and DP ranks.

The engine worker's flow runs in one process: each micro-batch through verl's loss function
(called as its engine calls it), ``append_to_dict`` per micro-batch, the DP gather as verl's
pickled ``all_gather_object`` returns it (one entry per rank), ``Metric.aggregate_dp`` per
mini-batch, ``append_to_dict`` over mini-batches, then ``reduce_metrics`` on the driver. The
oracle pools every valid token of every micro-batch with torch.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from functools import partial
from itertools import chain
from typing import Any

import pytest

import metricsync.verl_compat as vc

torch = pytest.importorskip("torch")
omegaconf = pytest.importorskip("omegaconf")
losses = pytest.importorskip(
    "verl.workers.utils.losses", reason="verl (test extra) is not installed"
)
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
tu = pytest.importorskip("verl.utils.tensordict_utils")
vmu = pytest.importorskip("verl.utils.metric.utils")
py_functional = pytest.importorskip("verl.utils.py_functional")
TensorDict = pytest.importorskip("tensordict").TensorDict

# micro-batches per [DP rank][mini-batch]
SPLITS = {"equal": [[2, 2], [2, 2]], "uneven": [[1, 3], [3, 2]]}
TOKEN_MEANS = [
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
]


@pytest.fixture(autouse=True)
def _never_left_installed() -> Iterator[None]:
    yield
    vc.uninstall()


def micro_batch(gen: Any, rows: int, length: int) -> dict[str, Any]:
    """One micro-batch's raw per-token tensors; short responses move more than long ones."""
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    scale = 2.0 / length
    old = -torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return {
        "old": old,
        "new": old - torch.randn(rows, length, generator=gen, dtype=torch.float64) * scale - scale,
        "adv": torch.randn(rows, length, generator=gen, dtype=torch.float64),
        "vpreds": torch.randn(rows, length, generator=gen, dtype=torch.float64) + 1 / length,
        "values": torch.randn(rows, length, generator=gen, dtype=torch.float64),
        "returns": torch.randn(rows, length, generator=gen, dtype=torch.float64),
        "mask": mask,
        "lengths": lengths,
    }


def batches(seed: int, split: list[list[int]]) -> list[list[list[dict[str, Any]]]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        [
            [micro_batch(gen, 3, int(torch.randint(2, 30, (1,), generator=gen))) for _ in range(n)]
            for n in per_mini
        ]
        for per_mini in split
    ]


def model_output(b: dict[str, Any], key: str) -> Any:
    """What the engine's model returns: (total_nnz,) over prompt (1 token) + response tokens,
    shifted left by one as verl's ``no_padding_2_padding`` reads it."""
    pieces = []
    for row, n in enumerate(b["lengths"].tolist()):
        pieces += [b[key][row, :n], torch.zeros(1, dtype=torch.float64)]
    return torch.cat(pieces)


def loss_data(b: dict[str, Any], global_tokens: int, dp_size: int) -> Any:
    rows, length = b["mask"].shape
    prompt = torch.ones(rows, 1, dtype=torch.int64)
    data = TensorDict(
        {
            "prompts": prompt,
            "responses": torch.ones(rows, length, dtype=torch.int64),
            "attention_mask": torch.cat([prompt, b["mask"].long()], dim=1),
            "response_mask": b["mask"].long(),
            "old_log_probs": b["old"],
            "advantages": b["adv"],
            "values": b["values"],
            "returns": b["returns"],
        },
        batch_size=[rows],
    )
    tu.assign_non_tensor(
        data, dp_size=dp_size, batch_num_tokens=global_tokens, global_batch_size=None
    )
    return data


def config() -> tuple[Any, Any]:
    actor = omegaconf.OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
            "loss_scale_factor": None,
            "policy_loss": {"loss_mode": "vanilla"},
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0,
            "use_kl_loss": False,
        }
    )
    critic = omegaconf.OmegaConf.create(
        {"cliprange_value": 0.1, "loss_agg_mode": "token-mean", "loss_scale_factor": None}
    )
    return actor, critic


def run_engine_flow(data: list[list[list[dict[str, Any]]]]) -> dict[str, float]:
    """verl 0.9.1's engine worker and driver, with whatever its modules now hold."""
    actor_cfg, critic_cfg = config()
    # the worker builds its loss functions after install(), as verl's engine workers do
    actor_loss = partial(losses.ppo_loss, config=actor_cfg)
    critic_loss = partial(losses.value_loss, config=critic_cfg)
    dp_size, minis = len(data), len(data[0])
    append_to_dict = py_functional.append_to_dict
    metric_cls = vmu.Metric
    metrics: dict[str, Any] = {}
    for mini in range(minis):
        global_tokens = sum(int(b["mask"].sum()) for rank in data for b in rank[mini])
        per_rank = []
        for rank in data:
            aggregated: dict[str, Any] = {}
            for b in rank[mini]:
                td = loss_data(b, global_tokens, dp_size)
                out = {"log_probs": model_output(b, "new"), "values": model_output(b, "vpreds")}
                _, m = actor_loss(model_output=out, data=td, dp_group=None)
                append_to_dict(aggregated, m)
                _, m = critic_loss(model_output=out, data=td, dp_group=None)
                append_to_dict(aggregated, m)
            per_rank.append(pickle.loads(pickle.dumps(aggregated)))  # all_gather_object
        gathered = {key: [rank[key] for rank in per_rank] for key in per_rank[0]}
        for key, val in gathered.items():  # verl's train_mini_batch, verbatim
            gathered[key] = (
                metric_cls.aggregate_dp(val)
                if isinstance(val[0], metric_cls)
                else list(chain.from_iterable(val))
            )
        append_to_dict(metrics, gathered)
    reduced = vmu.reduce_metrics(pickle.loads(pickle.dumps(metrics)))  # to the driver
    return {k: float(v) for k, v in reduced.items()}


def brute_force(data: list[list[list[dict[str, Any]]]]) -> dict[str, float]:
    every = [b for rank in data for mini in rank for b in mini]

    def tokens(key: str) -> Any:
        return torch.cat([b[key][b["mask"]] for b in every])

    log_ratio = (tokens("new") - tokens("old")).clamp(-20.0, 20.0)
    ratio, adv = log_ratio.exp(), tokens("adv")
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(0.8, 1.2)
    pessimistic = torch.maximum(unclipped, clipped)
    vpreds, values, returns = tokens("vpreds"), tokens("values"), tokens("returns")
    vclipped = torch.minimum(torch.maximum(vpreds, values - 0.1), values + 0.1)
    return {
        "actor/ppo_kl": float((-log_ratio).mean()),
        "actor/pg_clipfrac": float((clipped > unclipped).double().mean()),
        "actor/pg_clipfrac_lower": float(((pessimistic > -adv * 3.0) & (adv < 0)).double().mean()),
        "critic/vf_clipfrac": float(
            ((vclipped - returns) ** 2 > (vpreds - returns) ** 2).double().mean()
        ),
        "critic/vpred_mean": float(vpreds.mean()),
    }


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_token_mean_install_gives_the_global_token_means(split: str) -> None:
    data = batches(7, SPLITS[split])
    truth = brute_force(data)
    with vc.install(token_mean=True):
        got = run_engine_flow(data)
    for key in TOKEN_MEANS:
        assert math.isclose(got[key], truth[key], rel_tol=1e-6), (key, got[key], truth[key])
    # verl's SUM-scaled loss stays what it was: the mean over mini-batches of the batch loss
    assert set(TOKEN_MEANS) | {"actor/pg_loss", "critic/vf_loss"} <= got.keys()


def test_verls_own_numbers_are_means_of_micro_batch_means() -> None:
    # the oracle can tell: verl's equal-split numbers are far from the token means
    data = batches(7, SPLITS["equal"])
    truth = brute_force(data)
    got = run_engine_flow(data)  # verl's own modules
    assert abs(got["actor/ppo_kl"] - truth["actor/ppo_kl"]) > 0.05 * abs(truth["actor/ppo_kl"])
    with vc.install(token_mean=False):  # the metric objects only: verl's numbers
        plain = run_engine_flow(data)
    for key in TOKEN_MEANS:
        assert math.isclose(plain[key], got[key], rel_tol=1e-9), key


def test_plain_install_raises_on_uneven_micro_batches_as_verl_does() -> None:
    data = batches(7, SPLITS["uneven"])
    with pytest.raises(ValueError, match="same number of values"):
        run_engine_flow(data)  # verl's own modules
    with (
        vc.install(token_mean=False),
        pytest.raises(
            ValueError, match=r"'actor/pg_clipfrac'.*different numbers of values .*\[1, 3\]"
        ),
    ):
        run_engine_flow(data)


def test_uninstall_gives_verl_its_loss_functions_back() -> None:
    before = dict(core_algos.POLICY_LOSS_REGISTRY)
    value_loss = losses.value_loss
    with vc.install(token_mean=True):
        assert losses.value_loss is not value_loss
        assert all(core_algos.POLICY_LOSS_REGISTRY[k] is not fn for k, fn in before.items())
    assert before == core_algos.POLICY_LOSS_REGISTRY and losses.value_loss is value_loss
    assert core_algos.compute_policy_loss_vanilla is before["vanilla"]


def test_a_direct_call_of_verls_loss_still_gets_plain_numbers() -> None:
    # code that calls verl's policy loss itself (and records the floats) keeps working
    b = micro_batch(torch.Generator().manual_seed(3), 4, 9)
    actor_cfg, _ = config()
    with vc.install():
        _, metrics = core_algos.compute_policy_loss_vanilla(
            b["old"], b["new"], b["adv"], b["mask"], "token-mean", actor_cfg
        )
    for key in ("actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
        assert isinstance(metrics[key], float) and metrics[key] + 0.0 == float(metrics[key])
        assert metrics[key].weight == int(b["mask"].sum())  # what the compat Metric reads
