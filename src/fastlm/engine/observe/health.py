"""Health checks on the metric records of a training run, at logging steps only (never a per-step sync).

``check_finite`` stops a run whose loss or gradient norm became NaN/inf (one line naming the last good
checkpoint), but for the overflowed gradients of a step the fp16 grad scaler skipped (``overflow_skipped``);
``check_first_loss`` warns when the first loss is far from ``ln(vocab)`` (labels, tokenizer or
initialisation wrong); ``GradNormWatch`` warns when a gradient norm jumps over 10x its running median.
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path

from fastlm.errors import FastlmError

log = logging.getLogger(__name__)

__all__ = [
    "GradNormWatch",
    "NonFiniteLossError",
    "check_finite",
    "check_first_loss",
    "no_targets",
    "overflow_skipped",
]


class NonFiniteLossError(FastlmError):
    """The loss became NaN or inf: training stopped, the last good checkpoint is kept."""


def check_finite(record: dict, step: int, last: Path | None, *, loss_scale: float | None = None) -> None:
    """Stop on a NaN/inf loss, or a NaN/inf gradient norm (that step's update already broke the weights), but
    for an fp16 overflow the grad scaler skipped (``overflow_skipped``: nothing was updated).

    ``last``: this run's newest checkpoint (saved or resumed from by this process), the one to name as good.
    ``loss_scale``: the fp16 grad scaler's scale after the record's step (None: no loss scaling).
    """
    norm = record.get("grad_norm")
    # steps without a target token (``no_targets``) have no loss: a NaN there is no divergence
    loss = 0.0 if no_targets(record) else record["loss"]
    if math.isfinite(loss) and overflow_skipped(norm, loss_scale):
        return
    if not math.isfinite(loss) or (norm is not None and not math.isfinite(norm)):
        what = (
            f"loss became {record['loss']}"
            if not math.isfinite(record["loss"])
            else f"gradient norm became {norm}"
        )
        raise NonFiniteLossError(
            f"the training {what} by step {step}; training stopped"
            + (f", the last good checkpoint {last} is kept" if last else "")
            + ".",
            fix="lower train.optimizer.lr (or raise warmup_steps), keep grad_clip on, or use precision "
            "bf16/fp32 instead of fp16; then rerun (train.resume: auto continues from the last good "
            "checkpoint).",
        )


def no_targets(record: dict) -> bool:
    """Whether a history row's steps had no target token at all (every sample one token long, nothing after
    it to predict; or only prompt tokens): their loss is undefined (NaN in the row), their gradient zero."""
    return record.get("target_tokens") == 0


def overflow_skipped(norm: float | None, loss_scale: float | None) -> bool:
    """Whether a step's non-finite gradient norm is an fp16 overflow the grad scaler skipped: under loss
    scaling, a gradient with an inf or NaN is exactly what ``GradScaler.step`` skips (the weights, the AdamW
    moments and the schedule untouched) and its scale is halved, as it is while the scale comes down from
    65536 in the first steps and again now and then after it grew. Not where the scale has fallen below 1
    (it is halved at every skip): the gradients overflowed unscaled, the run diverged."""
    return norm is not None and not math.isfinite(norm) and loss_scale is not None and loss_scale >= 1.0


def check_first_loss(loss: float, *, len_vocab: int, from_scratch: bool) -> None:
    """Warn when the first loss is far from the uniform guess ``ln(vocab)``."""
    uniform = math.log(len_vocab)
    if loss > 1.5 * uniform or (from_scratch and loss < 0.5 * uniform):
        log.warning(
            "The first loss is %.3f, far from ln(vocab) = %.3f: check the labels, the tokenizer/model "
            "pairing and the initialisation.",
            loss,
            uniform,
        )


class GradNormWatch:
    """Warns when a logged gradient norm is over 10x the median of the ones logged before it."""

    def __init__(self, seen: list[float] | None = None) -> None:
        self.seen = list(seen or [])

    @classmethod
    def from_history(cls, history: list[dict]) -> GradNormWatch:
        return cls(
            [
                record["grad_norm"]
                for record in history
                if record.get("grad_norm") is not None
                and math.isfinite(record["grad_norm"])
                and not no_targets(record)
            ]
        )

    def check(self, record: dict) -> None:
        norm = record.get("grad_norm")
        # an update the fp16 grad scaler skipped: no norm; steps without targets: a zero norm, no gradient
        if norm is None or not math.isfinite(norm) or no_targets(record):
            return
        if len(self.seen) >= 3 and norm > 10 * statistics.median(self.seen):
            log.warning(
                "Gradient norm %.3g at step %d is over 10x its median so far (%.3g): the run may be "
                "diverging; consider a lower learning rate.",
                norm,
                record["step"],
                statistics.median(self.seen),
            )
        self.seen.append(norm)
