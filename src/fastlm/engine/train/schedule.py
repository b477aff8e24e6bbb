"""Learning-rate schedule: linear warmup to the peak, then cosine or linear decay to ``min_lr_ratio`` × peak.

``step`` counts optimizer steps already taken: ``lr_at(0)`` is the rate of the first update. Warmup starts
at ``peak / warmup_steps`` (not 0, which would waste the first update) and reaches the peak at step
``warmup_steps - 1``; the decay then runs from step ``warmup_steps`` to ``total_steps``, where it reaches
``min_lr_ratio × peak`` and stays.

A run's schedule (:func:`run_schedule`) warms up over ``train.optimizer.warmup_steps``, or over
ceil(``warmup_ratio`` × the run's planned optimizer steps) as the Hugging Face Trainer's ``warmup_ratio``
(:func:`asked_warmup`): the plan's total, the same on every process and for a resumed run of the same
plan, whatever step a time budget or early stopping ends it at; either is cut to the run's steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fastlm.engine.config import OptimizerParams

DECAYS = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class LRSchedule:
    peak_lr: float
    total_steps: int
    warmup_steps: int = 0
    decay: str = "cosine"  # "cosine" | "linear" | "constant" (no decay after warmup)
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.decay not in DECAYS:
            raise ValueError(f"decay must be one of {DECAYS}, got {self.decay!r}")
        if self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(f"need 0 <= warmup_steps <= total_steps and total_steps >= 1, got {self}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def factor_at(self, step: int) -> float:
        """The multiplier of the peak rate at ``step`` (what LambdaLR wants)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        decay_steps = self.total_steps - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / decay_steps) if decay_steps else 1.0
        if self.decay == "cosine":
            remaining = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            remaining = 1.0 - progress
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * remaining

    def lr_at(self, step: int) -> float:
        return self.peak_lr * self.factor_at(step)


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer, schedule: LRSchedule
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following ``schedule``; every param group's lr is set to the peak first (times the
    group's ``lr_scale``, where it has one: LoRA+'s B matrices, ``optim.parameter_groups``)."""
    for group in optimizer.param_groups:
        group["lr"] = schedule.peak_lr * group.get("lr_scale", 1.0)
        group.pop("initial_lr", None)  # LambdaLR takes the base rate from here when it exists
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor_at)


def asked_warmup(settings: OptimizerParams, total_steps: int) -> int:
    """The warmup steps ``settings`` ask of a run of ``total_steps`` planned optimizer steps:
    ``warmup_steps``, or ceil(``warmup_ratio`` × ``total_steps``) as the Trainer computes it
    (``TrainingArguments.get_warmup_steps``); not yet cut to the run's steps."""
    if settings.warmup_ratio is None:
        return settings.warmup_steps
    return math.ceil(total_steps * settings.warmup_ratio)


def run_schedule(settings: OptimizerParams, total_steps: int) -> LRSchedule:
    """The schedule of a run of ``total_steps`` planned optimizer steps, its warmup cut to them."""
    return LRSchedule(
        settings.lr,
        total_steps,
        min(asked_warmup(settings, total_steps), total_steps),
        settings.decay,
        settings.min_lr_ratio,
    )
