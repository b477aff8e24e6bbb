"""Early stopping on the validation loss (``train.early_stopping``): the bookkeeping a checkpoint keeps.

After each evaluation the loop calls ``update``. The lowest finite validation loss so far is the best step
(the loop then saves a checkpoint there and keeps it past ``keep_last``), and the model the run returns (and
writes) is the best step's, as the Trainer's ``load_best_model_at_end`` keeps its best checkpoint.
``patience`` evaluations in a row without an improvement of more than ``min_delta`` stop the run at that
step boundary; the improvement is measured from ``reference``, the loss of the last evaluation that reset the
count (Keras' rule), so small improvements add up. ``min_delta`` never decides which model is kept: an
evaluation lower than the best by less than ``min_delta`` is the new best, and a step of patience used.
An evaluation off the schedule (a ``train.max_minutes`` stop between two ``eval_every`` steps, or the last
step of a run whose length ``eval_every`` does not divide) may be the best but uses no patience and resets
none: a run continued after it (a new time budget, more ``train.max_steps``) stops where the same run without
the stop does.

A checkpoint keeps the reference (None until a scheduled evaluation had a finite loss, though an
off-schedule one may be the best already), the ``min_delta`` it counted under and the off-schedule
evaluations' steps: a run entered again with another ``min_delta`` counts its evaluations (the checkpoint's
``eval_history``) again under it (``from_record``), so a looser one may let a run early stopping ended
continue. A checkpoint written before they were recorded keeps its count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["EarlyStopping"]


@dataclass
class EarlyStopping:
    patience: int
    min_delta: float = 0.0
    best: float | None = None
    best_step: int | None = None
    bad_evals: int = 0  # evaluations in a row without an improvement of more than min_delta
    reference: float | None = None  # the loss an improvement is measured from (the last reset's)
    unscheduled: list[int] = field(default_factory=list)  # steps of evaluations that used no patience

    def update(self, step: int, value: float, *, scheduled: bool = True) -> bool:
        """Record the evaluation at ``step``; True when it is the new best (the lowest loss so far).
        ``scheduled``: False for an evaluation off the ``eval_every`` steps, which counts as a candidate
        for the best only."""
        if not scheduled:
            self.unscheduled.append(step)
        if not math.isfinite(value):
            self.bad_evals += int(scheduled)
            return False
        if scheduled and (self.reference is None or value < self.reference - self.min_delta):
            self.reference, self.bad_evals = value, 0
        elif scheduled:
            self.bad_evals += 1
        if self.best is None or value < self.best:
            self.best, self.best_step = value, step
            return True
        return False

    @property
    def should_stop(self) -> bool:
        return self.bad_evals >= self.patience

    def without_improvement(self) -> str:
        """What stopped the run, in words: the evaluations in a row without an improvement (of more than
        ``min_delta``, where one is set: the best step may be one of them)."""
        counted = f" of more than {self.min_delta:g}" if self.min_delta > 0 else ""
        return f"no validation-loss improvement{counted} in {self.bad_evals} evaluations"

    def best_said(self) -> str:
        """The best evaluation, in words: its step and loss, or that none had a finite loss."""
        if self.best_step is None:
            return "no evaluation had a finite validation loss (NaN or inf): the model is the last step's"
        return f"the best was step {self.best_step} ({self.best:.4f})"

    def record(self) -> dict:
        """What a checkpoint keeps; ``stopped``: patience ran out (the run ended there: a finished run for
        ``checkpoint.discovery.unfinished_runs``)."""
        return {
            "best": self.best,
            "best_step": self.best_step,
            "bad_evals": self.bad_evals,
            "reference": self.reference,
            "stopped": self.should_stop,
            "min_delta": self.min_delta,  # what the count was counted under: another is counted again
            "unscheduled": list(self.unscheduled),
        }

    @classmethod
    def from_record(
        cls, record: dict | None, *, patience: int, min_delta: float, evaluations: list[dict] = ()
    ) -> EarlyStopping:
        """The state a checkpoint saved, under this run's settings (they may differ from the saved run's):
        where its recorded ``min_delta`` is another, the count and reference again over ``evaluations``
        (the checkpoint's ``eval_history``) under this one; the best is the same under any."""
        record = record or {}
        kept = cls(
            patience,
            min_delta,
            **{
                key: value
                for key, value in record.items()
                if key in ("best", "best_step", "bad_evals", "reference", "unscheduled")
            },
        )
        if "reference" not in record:  # written before the reference was kept apart: its best was both
            kept.reference = kept.best
        kept.unscheduled = list(kept.unscheduled)  # its own: the record's stays as saved
        if record.get("min_delta", min_delta) == min_delta:
            return kept
        again = cls(patience, min_delta)
        for row in evaluations:
            loss = row.get("val_loss")
            loss = float(loss) if isinstance(loss, int | float) else math.nan
            again.update(row["step"], loss, scheduled=row["step"] not in kept.unscheduled)
        kept.bad_evals, kept.reference = again.bad_evals, again.reference
        return kept
