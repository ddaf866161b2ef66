"""What a launcher such as torchrun tells a rank, for trainers run on run_distributed's ranks."""

from __future__ import annotations

import os


def as_launched(rank: int, world: int, **extra: str) -> None:
    """Set this rank's environment as a launcher would (``extra``: more variables); the
    process group already exists, so the port is never used."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29500",  # unused: the group already exists
        **extra,
    )
