"""What a training run records: per-step metrics on the device, a history row at each logging step (checked,
shown on the progress bar and sent to every callback), evaluation rows, and the run's summary.

Every history row, the one written before a checkpoint included, goes through :meth:`Recorder.flush`, so
the callbacks (live MLflow metrics) see exactly the rows of the history.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from fastlm.engine.config import TrainParams
from fastlm.engine.observe.health import (
    GradNormWatch,
    check_finite,
    check_first_loss,
    no_targets,
    overflow_skipped,
)
from fastlm.engine.observe.metrics import StepMetrics
from fastlm.engine.observe.progress import Progress
from fastlm.engine.observe.rates import timed_rate
from fastlm.engine.train.state import TrainState
from fastlm.engine.train.step import StepResult

log = logging.getLogger(__name__)

Callback = Callable[[str, dict], None]  # ("train" | "eval", record)

__all__ = ["Callback", "Recorder", "run_summary"]


class Recorder:
    """Metrics, progress, health checks and callbacks of one run; rows go into ``state``'s histories.

    ``first_loss``: ``check_first_loss``'s keywords (vocabulary size, from scratch) for the run's first row;
    ``main``: this is rank 0 (the others keep the same rows, quietly); ``loss_scale``: the fp16 grad
    scaler's current scale (None: no loss scaling), read where a row's gradient norm is not finite (an
    overflowed step the scaler skipped is no stop, ``health.overflow_skipped``).
    """

    def __init__(
        self,
        state: TrainState,
        metrics: StepMetrics,
        progress: Progress,
        callbacks: Sequence[Callback],
        *,
        log_every: int,
        total_steps: int,
        first_loss: dict,
        main: bool = True,
        loss_scale: Callable[[], float] | None = None,
    ) -> None:
        self.state, self.metrics, self.progress, self.callbacks = state, metrics, progress, tuple(callbacks)
        self.log_every, self.total_steps, self.first_loss = log_every, total_steps, first_loss
        self.loss_scale = loss_scale
        self.grad_norms = GradNormWatch.from_history(state.history)
        self.main = main  # rank 0 logs the evaluations
        self.first_loss_due = not state.history  # the run's first row with a loss is checked
        self.no_targets_said = False

    def step(
        self, result: StepResult, *, real_tokens: int, computed_tokens: int, samples: int, position: dict
    ) -> None:
        """Add one optimizer step (no host read-back); a history row on logging steps."""
        self.metrics.update(
            loss_sum=result.loss_sum,
            target_tokens=result.target_tokens,
            grad_norm=result.grad_norm,
            real_tokens=real_tokens,
            computed_tokens=computed_tokens,
            samples=samples,
            lr=result.lr,
        )
        self.progress.advance()
        step = self.state.step
        # each process's first step (warm-up: a resumed process's too) is a row of its own
        if step == self.state.first_step + 1 or step % self.log_every == 0 or step == self.total_steps:
            self.flush(position)

    def flush(self, position: dict) -> dict | None:
        """The pending steps' row: read back, checked, kept, shown and sent; None when no step is pending."""
        if not self.metrics.pending_steps:
            return None
        state = self.state
        # this process's first step alone (warm-up): every throughput figure leaves the row out
        warmup = state.step == state.first_step + 1 and self.metrics.pending_steps == 1
        record = {**self.metrics.flush(state.step), **position, "warmup": int(warmup)}
        norm = record["grad_norm"]
        overflowed = norm is not None and not math.isfinite(norm) and self.loss_scale is not None
        scale = self.loss_scale() if overflowed else None  # a read-back only where the norm is not finite
        check_finite(record, state.step, state.last_good, loss_scale=scale)
        if overflow_skipped(norm, scale):
            log.info(
                "step %d: the fp16 grad scaler skipped this update (its gradients overflowed; loss scale now "
                "%g): the weights and the learning-rate schedule are unchanged",
                state.step,
                scale,
            )
        if warmup:
            log.info(
                "First step%s: %.2f s%s; the throughput figures leave it out",
                f" of this process (resumed at step {state.first_step})" if state.first_step else "",
                record["step_time_s"] + record["compile_s"],
                f" (torch.compile {record['compile_s']:.2f} s of it)" if record["compile_s"] > 0 else "",
            )
        if no_targets(record):
            self._say_no_targets(record)
        elif self.first_loss_due:
            self.first_loss_due = False
            check_first_loss(record["loss"], **self.first_loss)
        self.grad_norms.check(record)
        state.history.append(record)
        self.progress.show(record)
        self._emit("train", record)
        return record

    def _say_no_targets(self, record: dict) -> None:
        """One warning, at the run's first row whose steps had no target token: what happened, not a
        divergence (the row's loss is NaN: there was none; the run goes on)."""
        if self.no_targets_said or not self.main:
            return
        self.no_targets_said = True
        previous = self.state.history[-1]["step"] if self.state.history else self.state.first_step
        steps = (
            f"step {record['step']}"
            if record["step"] == previous + 1
            else (f"steps {previous + 1}-{record['step']}")
        )
        log.warning(
            "%s had no target tokens: every sample in it is one token long (nothing after it to predict) or "
            "holds prompt tokens only, so there is no loss to log (NaN in the history, left out of MLflow) "
            "and no gradient: its update holds AdamW's momentum and weight decay alone. The run goes on; "
            "later such steps are not said again. Such samples train nothing: dropping them from the data "
            "spends no step on them.",
            steps,
        )

    def evaluation(self, metrics: dict, *, seconds: float) -> dict:
        """An evaluation row (``evaluation.evaluate``'s metrics) for the current step, logged when not
        quiet; ``eval_s``: the evaluation's wall seconds (``seconds``, timed around the whole call)."""
        record = {
            "step": self.state.step,
            "val_loss": metrics["loss"],
            "val_perplexity": metrics["perplexity"],
            "val_target_tokens": metrics["target_tokens"],
            "eval_s": seconds,
        }
        self.state.eval_history.append(record)
        if self.main:
            log.info(
                "step %d: validation loss %.4f, perplexity %.2f (%.2f s)",
                record["step"],
                record["val_loss"],
                record["val_perplexity"],
                seconds,
            )
        self._emit("eval", record)
        return record

    def _emit(self, kind: str, record: dict) -> None:
        for callback in self.callbacks:
            callback(kind, record)


def step_contents(lengths: np.ndarray, *, rows_per_step: int, steps_per_epoch: int) -> dict:
    """What one optimizer step holds, on average over an epoch: its rows (micro-batch x accumulation x
    processes), samples and real tokens, and the epoch's real tokens (``train_tokens``: the epoch time's
    numerator). A packed row holds several samples: the rows alone understate it. ``lengths``: each sample's
    real tokens as the steps count them (an encoder-decoder's with the ends its rows get)."""
    return {
        "rows_per_step": rows_per_step,
        "samples_per_step": round(len(lengths) / steps_per_epoch, 1),
        "tokens_per_step": round(float(np.sum(lengths)) / steps_per_epoch, 1),
        "train_tokens": int(np.sum(lengths)),
    }


def run_summary(
    state: TrainState,
    metrics: StepMetrics,
    *,
    total_steps: int,
    epochs: float,
    wall: float,
    n_params: int,
    params: TrainParams,
    world_size: int,
) -> dict:
    """The run's summary: final losses, throughput over the timed windows (``real_tokens_per_s``:
    ``rates.timed_rate``, the figure every report table shows; wall clock, the first step left out, the
    evaluations and saves within the windows in) and the per-step figures of ``StepMetrics.step_figures``
    (this process's steps; ``steady_real_tokens_per_s``: over the steps' own time, the first step,
    evaluations and saves left out, ``outside_steps_s`` the time those took between steps; ``eval_s``: the
    evaluations' part of it, this process's rows' ``eval_s`` summed)."""
    history, eval_history = state.history, state.eval_history
    # the last row with a loss: steps without a target token have none (``health.no_targets``)
    last = next((row for row in reversed(history) if not no_targets(row)), {})
    final_eval = eval_history[-1] if eval_history else {}
    return {
        "steps": total_steps,
        "epochs": epochs,
        "wall_time_s": round(wall, 3),
        "final_train_loss": last.get("loss"),
        "final_val_loss": final_eval.get("val_loss"),
        "final_val_perplexity": final_eval.get("val_perplexity"),
        "effective_batch": params.batching.micro_batch_size
        * params.batching.gradient_accumulation_steps
        * world_size,
        "batching": params.batching.mode,
        "parameters": n_params,
        "real_tokens_per_s": timed_rate(history),
        **metrics.step_figures(),
        # this process's evaluations (a resumed run's earlier rows are another process's time)
        "eval_s": round(
            sum(row.get("eval_s") or 0.0 for row in eval_history if row["step"] > state.first_step), 3
        ),
        "peak_memory_mb": max((r["peak_memory_mb"] for r in history), default=None),
        "tokens_seen": state.tokens_seen,
        "flops_per_token": metrics.flops_per_token,
        # compile included
        "first_step_s": metrics.step_times[0] + metrics.step_compile_s[0] if metrics.step_times else None,
        # torch.compile's seconds in the steps and between them (a recompile where a shape first varies),
        # left out of every throughput and step time above, and before the first step (compile: auto's
        # probe compiling its candidate: compile_probe_s of them)
        "compile_s": round(metrics.compile_s + metrics.compile_before_start_s, 3),
        "compile_probe_s": round(metrics.compile_before_start_s, 3),
        "steps_trained": state.step - state.first_step,
        "resumed_from": str(state.resumed_from) if state.resumed_from else None,
        "resumed_from_step": state.first_step if state.resumed_from else None,
        "world_size": world_size,
        "oom_backoffs": state.backoffs,
    }
