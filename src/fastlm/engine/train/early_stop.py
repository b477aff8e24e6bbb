"""Early stopping on the validation loss (``train.early_stopping``): the bookkeeping a checkpoint keeps.

After each evaluation the loop calls ``update``; an improvement of more than ``min_delta`` makes that step the
best one (the loop then saves a checkpoint there and keeps it past ``keep_last``); ``patience`` evaluations in
a row without one stop the run at that step boundary, and the model the run returns (and writes) is the best
step's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EarlyStopping"]


@dataclass
class EarlyStopping:
    patience: int
    min_delta: float = 0.0
    best: float | None = None
    best_step: int | None = None
    bad_evals: int = 0  # evaluations in a row without an improvement

    def update(self, step: int, value: float) -> bool:
        """Record the evaluation at ``step``; True when it is the new best."""
        if math.isfinite(value) and (self.best is None or value < self.best - self.min_delta):
            self.best, self.best_step, self.bad_evals = value, step, 0
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.bad_evals >= self.patience

    def record(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad_evals": self.bad_evals}

    @classmethod
    def from_record(cls, record: dict | None, *, patience: int, min_delta: float) -> EarlyStopping:
        """The state a checkpoint saved, under this run's settings (they may differ from the saved run's)."""
        return cls(
            patience,
            min_delta,
            **{
                key: value
                for key, value in (record or {}).items()
                if key in ("best", "best_step", "bad_evals")
            },
        )
