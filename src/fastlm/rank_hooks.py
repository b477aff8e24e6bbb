"""Kedro under torchrun: every rank runs ``kedro run``, only rank 0 writes.

``torchrun --nproc-per-node=N --no-python kedro run --pipeline=train`` starts N copies of the whole Kedro run.
Every rank loads the inputs and runs the train node (the training is collective), but the outputs must be
written once: on ranks other than 0 (``RANK`` > 0), :class:`OtherRankOutputsHook` re-registers every output of
the pipeline as an in-memory dataset before the run (nothing reaches the disk), and ``settings.py`` leaves out
the MLflow hooks (no second MLflow run), and from its import on keeps their logs to warnings and errors, each
prefixed with the rank (``fastlm.log_handler.other_rank_logs_warnings_only``): every INFO line is rank 0's,
once. Rank 0 writes checkpoints, catalog outputs and MLflow as usual.
"""

from __future__ import annotations

import logging

from kedro.framework.hooks import hook_impl
from kedro.io import MemoryDataset

from fastlm.engine.distributed.ranks import rank_from_env

log = logging.getLogger(__name__)


def torchrun_rank() -> int:
    """This process's rank under torchrun (0 outside it)."""
    try:
        info = rank_from_env()
    except ValueError:
        return 0
    return info.rank if info is not None and info.world_size > 1 else 0


class OtherRankOutputsHook:
    """On a torchrun rank other than 0: the pipeline's outputs stay in memory (its logs keep to warnings from
    ``settings.py``'s import on)."""

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        rank = torchrun_rank()
        if rank == 0:
            return
        catalog_log = logging.getLogger("kedro.io.data_catalog")
        level, catalog_log.level = catalog_log.level, logging.ERROR  # "Replacing dataset" x outputs
        try:
            for name in sorted(pipeline.all_outputs()):
                catalog[name] = MemoryDataset(copy_mode="assign")
        finally:
            catalog_log.setLevel(level)
