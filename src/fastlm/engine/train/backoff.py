"""Out-of-memory back-off: halve the micro-batch, double the accumulation (``train.batching.oom_backoff``).

The effective batch, the loss normalisation and the learning-rate schedule are unchanged. A checkpoint saved
after a back-off records the micro-batch in use (``batching_record``), and a resumed run keeps what fitted
(``resumed_batching``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from fastlm.engine.batching import backoff_pieces
from fastlm.engine.config import TrainParams
from fastlm.errors import OutOfMemory

log = logging.getLogger(__name__)

__all__ = ["OutOfMemory", "batching_record", "halve_micro_batch", "resumed_batching"]


def halve_micro_batch(
    error: BaseException,
    params: TrainParams,
    step: int,
    *,
    world: int,
    device: torch.device,
    configured: int | None = None,
) -> TrainParams:
    """The params of the retry after an out-of-memory ``error`` at ``step``, or one line when none is
    possible.

    The micro-batch becomes ``ceil(size / 2)``, the accumulation doubles: after h halvings each configured
    batch of ``configured`` samples is cut in ``2 ** h`` pieces of at most ``ceil(configured / 2 ** h)``
    (``batching.backoff_pieces``), so each step trains the configured step's samples whatever the size; a
    configured size that is not a power of two ends each batch in empty pieces at micro-batch 1 (3: 4
    pieces, the last empty), positions the stream counts and skips.
    Without the opt-in, in a multi-process run (every rank would have to agree), or at micro-batch 1: one
    line.
    """
    batching = params.batching
    where = f"at step {step} with micro_batch_size {batching.micro_batch_size}"
    if not batching.oom_backoff or world > 1 or batching.micro_batch_size == 1:
        raise OutOfMemory(
            f"the {device.type.upper()} device ran out of memory {where} "
            f"(x {batching.gradient_accumulation_steps} accumulation, batching {batching.mode}).",
            fix="run `kedro run --pipeline=tune` to measure the largest micro-batch that fits"
            + (
                ", or set train.batching.oom_backoff: true to halve it automatically"
                if world == 1 and batching.micro_batch_size > 1
                else ""
            )
            + ", or turn on train.model.gradient_checkpointing.",
        ) from error
    smaller = batching.model_copy(
        update={
            "micro_batch_size": -(-batching.micro_batch_size // 2),  # 2 ** halvings pieces: ceil
            "gradient_accumulation_steps": batching.gradient_accumulation_steps * 2,
        }
    )
    if device.type == "cuda":
        torch.cuda.empty_cache()  # once, after a failure: hand the failed step's blocks back to the allocator
    configured = configured or batching.micro_batch_size
    pieces = backoff_pieces(configured, smaller.micro_batch_size)
    exact = configured % pieces == 0
    empty = f", the last {pieces - configured} empty, skipped" if pieces > configured else ""
    log.warning(
        "Out of memory %s: continuing with micro_batch_size %d x gradient_accumulation_steps %d (each "
        "configured micro-batch of %d cut in %d pieces of at most %d%s; the effective batch is unchanged). "
        "%s",
        where,
        smaller.micro_batch_size,
        smaller.gradient_accumulation_steps,
        configured,
        pieces,
        smaller.micro_batch_size,
        empty,
        "Put these in conf/local to skip the failed attempt next time, or run `kedro run --pipeline=tune`."
        if exact
        else f"{configured} is not a multiple of {pieces}: run `kedro run --pipeline=tune` to choose a "
        "micro-batch that fits, to skip the failed attempt next time.",
    )
    return params.model_copy(update={"batching": smaller})


def batching_record(params: TrainParams, configured: TrainParams) -> dict:
    """The micro-batch in use and its accumulation over the configured one's (an OOM back-off changes
    both)."""
    return {
        "micro_batch_size": params.batching.micro_batch_size,
        "accumulation_factor": params.batching.gradient_accumulation_steps
        // configured.batching.gradient_accumulation_steps,
    }


def resumed_batching(params: TrainParams, saved: dict, folder: Path | None) -> TrainParams:
    """``params`` with the smaller micro-batch a checkpoint was saved with after a back-off (else
    unchanged)."""
    micro = saved.get("micro_batch_size", params.batching.micro_batch_size)
    if micro >= params.batching.micro_batch_size:
        return params
    accum = params.batching.gradient_accumulation_steps * int(saved.get("accumulation_factor", 1))
    log.info(
        "Continuing with micro_batch_size %d x gradient_accumulation_steps %d, as %s was saved after an "
        "out-of-memory back-off",
        micro,
        accum,
        folder,
    )
    return params.model_copy(
        update={
            "batching": params.batching.model_copy(
                update={"micro_batch_size": micro, "gradient_accumulation_steps": accum}
            )
        }
    )
