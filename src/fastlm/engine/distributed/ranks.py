"""Which rank this process is: THE reading of the elastic agent's environment (torchrun or our launcher).

Torch-free, so the Kedro settings can ask it at start-up (``rank_hooks``) without importing the engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TORCHRUN_VARS", "RankInfo", "rank_from_env"]

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits: ``rank`` of ``world_size`` (``local_rank`` picks the GPU on its node)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_from_env(environ: dict | None = None) -> RankInfo | None:
    """The rank an elastic agent (torchrun, or our launcher) gave this process; None outside one."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    return RankInfo(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", "0")))
