"""The agent's one reader of the process environment: where the shared directory is, how long a
process may take to reach its first step, and the rank a launcher (torchrun) gave it."""
from __future__ import annotations

import os

from .vocabulary import wire


def shared_directory() -> str:
    return os.environ.get(wire.DIR_ENV) or wire.DEFAULT_DIR


def first_step_grace_seconds() -> float:
    return float(os.environ.get("STEPSCOPE_FIRST_STEP_GRACE_SECONDS", "10"))


def launcher_identity() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) from torchrun's RANK, LOCAL_RANK and WORLD_SIZE; None without
    a RANK, or with one that is not a number."""
    env = os.environ
    if "RANK" not in env:
        return None
    try:
        rank = int(env["RANK"])
        return rank, int(env.get("LOCAL_RANK", rank)), int(env.get("WORLD_SIZE", 1))
    except ValueError:
        return None


def local_rank(rank: int) -> int:
    """LOCAL_RANK, else `rank` (a process whose rank torch.distributed gave)."""
    return int(os.environ.get("LOCAL_RANK", rank))
