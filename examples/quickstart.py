"""The README's quickstart as a complete script: a tiny model trained with gradient accumulation.

Every rank records its per-micro-batch loss, a per-token entropy under a
response mask, response lengths and the learning rate; once per step the ranks
``sync()`` (one packed collective) and rank 0 logs the result to the console and
``RUN_DIR/metrics.jsonl``. Run it on one process or under torchrun (gloo on CPU)::

    python examples/quickstart.py --steps 3
    torchrun --standalone --nproc-per-node 2 examples/quickstart.py --steps 3
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import metricsync as ms

VOCAB, HIDDEN, MAX_LEN, BATCH, MICRO_BATCHES = 32, 8, 16, 4, 2


def train(num_steps: int, run_dir: str, group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Train for ``num_steps`` steps on this rank; return the last step's synced values."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(rank)
    model = torch.nn.Linear(HIDDEN, VOCAB)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    metrics = ms.Metrics(
        {
            "actor/lr": ms.Spec("last", fmt=".2e"),
            # sum over micro-batches, mean over DP ranks
            "actor/pg_loss": ms.Spec("sum", across="mean"),
            "actor/entropy": ms.Spec("mean", fmt=".4f"),  # token mean over the response mask
            "response_length": ms.Spec(("mean", "max", "p50", "p99"), fmt=".0f"),
            "timing/*": ms.Spec("max", fmt=".3f"),  # glob: every name under timing/
        }
    )
    values: dict[str, float] = {}

    with ms.Tracker(backends=("console", "jsonl"), run_dir=run_dir) as tracker:
        for step in range(num_steps):
            metrics.reset()
            with metrics.timer("timing/step"):
                for _ in range(MICRO_BATCHES):
                    inputs = torch.randn(BATCH, MAX_LEN, HIDDEN)
                    lengths = torch.randint(1, MAX_LEN + 1, (BATCH,))
                    response_mask = torch.arange(MAX_LEN) < lengths[:, None]  # (BATCH, MAX_LEN)
                    log_probs = model(inputs).log_softmax(-1)  # (BATCH, MAX_LEN, VOCAB)
                    entropy = -(log_probs.exp() * log_probs).sum(-1)  # per token
                    token_log_prob = log_probs[..., 0]
                    loss = -(token_log_prob * response_mask).sum() / response_mask.sum()
                    (loss / MICRO_BATCHES).backward()

                    metrics.record("actor/pg_loss", loss.detach())  # stays on its device
                    metrics.record("actor/entropy", entropy.detach(), mask=response_mask)
                    metrics.record("response_length", lengths)  # every element is a sample
                optimizer.step()
                optimizer.zero_grad()
            metrics.record("actor/lr", scheduler.get_last_lr()[0])
            scheduler.step()
            synced = metrics.sync(group=group, timeout=60)  # identical on every rank
            tracker.log(synced, step=step)  # rank 0 writes
            values = synced.compute()
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="runs/quickstart", help="run directory")
    args = parser.parse_args()
    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    try:
        train(args.steps, args.out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
