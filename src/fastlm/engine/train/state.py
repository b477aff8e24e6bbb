"""Where a training run is: the state a checkpoint saves and a resume restores."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter


@dataclass
class TrainState:
    """Where a run is: what a checkpoint saves and a resume restores, plus this process's bookkeeping."""

    step: int = 0
    tokens_seen: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # this rank's micro-batches of the epoch consumed (resume_position of the global)
    history: list[dict] = field(default_factory=list)  # one metric record per logging step
    eval_history: list[dict] = field(default_factory=list)
    # micro_batch_size / accumulation_factor after an OOM back-off
    batching: dict = field(default_factory=dict)
    resumed_from: Path | None = None
    first_step: int = 0  # this process's first step
    last_good: Path | None = None  # this run's newest checkpoint (saved, or resumed from)
    # this process's out-of-memory back-offs (step, new sizes)
    backoffs: list[dict] = field(default_factory=list)
    # runtime_probe's measured settings (a resume keeps them)
    runtime_choice: dict = field(default_factory=dict)
    # early_stop.EarlyStopping.record() (a resume keeps it)
    early_stopping: dict = field(default_factory=dict)
    # the run's training time in the processes before this one (a checkpoint's ``elapsed_s``)
    elapsed_before_s: float = 0.0
    clock_start: float | None = None  # this process's training clock (perf_counter), started by the build

    def elapsed_s(self) -> float:
        """The run's training time so far: its earlier processes' and this one's (what a checkpoint saves and
        the history's ``elapsed_s`` counts)."""
        since = perf_counter() - self.clock_start if self.clock_start is not None else 0.0
        return self.elapsed_before_s + since
