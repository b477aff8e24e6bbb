"""A per-run time budget (``train.max_minutes``): read as each optimizer step starts, with the step's counts
(in one collective for all processes), so the first step that starts past it is the last: the run stops at
that step's boundary with a checkpoint, which ``train.resume: auto`` continues.

The budget counts this process's training loop (model building, data loading and evaluation after the loop
are not in it); a resumed run gets a new budget.
"""

from __future__ import annotations

from time import monotonic

STOPPED_BY = "time budget"  # the summary's ``stopped_by`` when the budget ended the run


class TimeLimit:
    """``spent`` is true once ``minutes`` have passed since it was made (never when ``minutes`` is None)."""

    def __init__(self, minutes: float | None):
        self.seconds = None if minutes is None else float(minutes) * 60.0
        self.started = monotonic()

    @property
    def spent(self) -> bool:
        return self.seconds is not None and monotonic() - self.started >= self.seconds
