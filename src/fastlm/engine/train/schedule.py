"""Learning-rate schedule: linear warmup to the peak, then cosine or linear decay to ``min_lr_ratio`` × peak.

``step`` counts optimizer steps already taken: ``lr_at(0)`` is the rate of the first update. Warmup starts
at ``peak / warmup_steps`` (not 0, which would waste the first update) and reaches the peak at step
``warmup_steps - 1``; the decay then runs from step ``warmup_steps`` to ``total_steps``, where it reaches
``min_lr_ratio × peak`` and stays.

A run's schedule (:func:`run_schedule`) warms up over ``train.optimizer.warmup_steps``, or over
ceil(``warmup_ratio`` × the run's planned optimizer steps) as the Hugging Face Trainer's ``warmup_ratio``
(:func:`asked_warmup`): the plan's total, the same on every process and for a resumed run of the same
plan, whatever step a time budget or early stopping ends it at; either is cut to the run's steps.

The schedule counts the updates applied, as the Trainer does (``optimizer_step_was_skipped``): an fp16 step
whose gradients overflowed, which the grad scaler skips (the first steps, while the scale comes down from
65536, and one now and then when it grows again), leaves the schedule where it was, so skipped steps eat no
warmup. Where the optimizer step syncs anyway (a kernel without the scaler's on-device skip, whose
``GradScaler.step`` reads ``found_inf`` on the host) the train step advances the LambdaLR only when the
optimizer stepped. torch's fused AdamW skips on the device and nothing is read back: there
:class:`AppliedStepsLR` counts the applied updates on the device and sets each group's rate as a device
tensor, which the fused kernel reads, at no host sync per step; its saved state is the applied count (read
back when a checkpoint is written), so a resumed run follows the rates of an uninterrupted one.
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

    def factor_of(self, step: torch.Tensor) -> torch.Tensor:
        """``factor_at`` of a step count held on the device (float64), computed there."""
        warm = (step + 1) / max(self.warmup_steps, 1)
        decay_steps = self.total_steps - self.warmup_steps
        if self.decay == "constant":
            after = torch.ones_like(step)
        elif not decay_steps:  # the decay's end at once
            after = torch.full_like(step, self.min_lr_ratio)
        else:
            progress = ((step - self.warmup_steps) / decay_steps).clamp(max=1.0)
            if self.decay == "cosine":
                remaining = 0.5 * (1.0 + torch.cos(math.pi * progress))
            else:
                remaining = 1.0 - progress
            after = self.min_lr_ratio + (1.0 - self.min_lr_ratio) * remaining
        return torch.where(step < self.warmup_steps, warm, after)


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer, schedule: LRSchedule, *, scaler: torch.amp.GradScaler | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following ``schedule``; every param group's lr is set to the peak first (times the
    group's ``lr_scale``, where it has one: LoRA+'s B matrices, ``optim.parameter_groups``). With an enabled
    ``scaler`` (fp16) and an optimizer that skips overflowed updates on the device (fused AdamW): an
    :class:`AppliedStepsLR`, which counts the applied updates there."""
    for group in optimizer.param_groups:
        group["lr"] = schedule.peak_lr * group.get("lr_scale", 1.0)
        group.pop("initial_lr", None)  # LambdaLR takes the base rate from here when it exists
    if scaler is not None and scaler.is_enabled() and getattr(optimizer, "_step_supports_amp_scaling", False):
        return AppliedStepsLR(optimizer, schedule)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor_at)


class AppliedStepsLR(torch.optim.lr_scheduler.LambdaLR):
    """The LambdaLR of ``schedule`` for an optimizer that skips an overflowed fp16 update on the device
    (torch's fused AdamW under an enabled GradScaler): ``advance(found_inf)`` after each step counts the
    applied updates on the device and puts each group's next rate there without a host read (computed in
    float64, given as a 0-d float32 tensor: the type CUDA's fused kernel reads).
    ``last_epoch`` stays the count at construction or load; ``state_dict`` saves the applied count (one read
    back, when a checkpoint is written) and the rates as floats, as a LambdaLR's."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule) -> None:
        super().__init__(optimizer, schedule.factor_at)
        self.schedule = schedule
        device = optimizer.param_groups[0]["params"][0].device
        self.applied = torch.zeros((), dtype=torch.float64, device=device)
        self.place()

    def place(self) -> None:
        """Each group's rate for the applied count, on the device (also after a resume set other rates)."""
        factor = self.schedule.factor_of(self.applied)
        # computed in float64, handed over as float32: CUDA's fused AdamW reads a tensor rate as a float
        self._last_lr = [(base * factor).float() for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr, strict=True):
            group["lr"] = lr

    def advance(self, found_inf: torch.Tensor) -> None:
        """After a step whose ``found_inf`` (the scaler's, nonzero where it skipped the update) is known on
        the device: the applied count and the next rates, all on the device."""
        self.applied += found_inf.to(self.applied.device) == 0
        self.place()

    def state_dict(self) -> dict:
        state = {
            key: value
            for key, value in super().state_dict().items()
            if key not in ("applied", "schedule", "_last_lr")
        }
        state["last_epoch"] = int(self.applied.item())
        state["_last_lr"] = [float(lr) for lr in self._last_lr]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.applied = torch.tensor(float(self.last_epoch), dtype=torch.float64, device=self.applied.device)
        self.place()


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
