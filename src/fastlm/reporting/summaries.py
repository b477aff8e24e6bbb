"""One-row summary tables of a training run, built from ``train_summary.json`` and the metric histories.

Every summary key and history column may be missing (runs from older versions): a missing figure is
``None``/NaN, never an error. The first history row is step 1 alone (warm-up: CUDA context, allocator,
compilation), as is each resumed process's first step (marked ``warmup``); rates and step times leave them out
whenever there are other rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from fastlm.engine.observe.rates import timed_rate, timed_windows
from fastlm.errors import InputDataError, StaleDataError

__all__ = [
    "TRAINING_ID",
    "after_warmup",
    "check_history_steps",
    "check_one_training",
    "check_report_sources",
    "check_train_summary",
    "efficiency_summary",
    "end_of_run_losses",
    "numeric",
    "throughput",
    "train_loss_name",
    "training_summary",
]


# The key of a training's id in its summary, its model folder's training_data.json and the report's metrics
TRAINING_ID = "training_id"


def check_one_training(summary: dict, *, training_id: str | None = None, history: pd.DataFrame | None = None,
                       what: str) -> None:  # fmt: skip
    """Refuse a report that read ``what`` of another training than ``summary``'s: the model folder, the test
    metrics (``training_id``, written by the train node beside the summary's) or the training history (its
    last step, which every training logs, is the summary's ``steps``). A record without an id (an older
    fastlm) is not compared."""
    ours = summary.get(TRAINING_ID)
    other = training_id is not None and ours is not None and training_id != ours
    name = summary.get("run_name") or "an unnamed run"
    steps = pd.to_numeric(history["step"], errors="coerce").dropna() if _has_steps(history) else None
    if steps is not None and len(steps) and int(steps.max()) != summary.get("steps"):
        raise StaleDataError(
            f"the report read {what}, which ends at step {int(steps.max())}, not the training summary's "
            f"({name}, {summary.get('steps')} steps): another training's, one that finished while the report "
            "ran, or a history cut short (copied in part).",
            fix="run `kedro run --pipeline=report` again, whole, when no training is writing its outputs; if "
            "it is refused again, train again (`kedro run --pipeline=train`) to write the history and the "
            "summary together.",
        )
    if other:
        raise StaleDataError(
            f"the report read {what} of another training than the training summary's ({name}, "
            f"{summary.get('steps')} steps): a training finished while the report ran, or the report ran in "
            "part after another training.",
            fix="run `kedro run --pipeline=report` again, whole, when no training is writing its outputs.",
        )


def _has_steps(history: pd.DataFrame | None) -> bool:
    return history is not None and "step" in history and len(history) > 0


def check_history_steps(history: pd.DataFrame, shown: str) -> None:
    """One InputDataError line naming ``shown`` (the file) where a step of ``history`` is no whole step number
    (two histories joined with ``cat``: the second header a row; a cell edited into text), or a row lacks its
    step time (the file cut inside it); the row counted from 1 after the header."""
    if history is None or "step" not in history:
        return
    steps = pd.to_numeric(history["step"], errors="coerce")
    bad = history["step"].notna() & (steps.isna() | (steps % 1 != 0))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputDataError(
            f"{shown} holds step values that are not step numbers (row {row + 1}: "
            f"{history['step'].iloc[row]!r}): it is not a history fastlm wrote (two joined with its second "
            "header inside, or edited).",
            fix="rerun `kedro run --pipeline=train` to write it again.",
        )
    if "step_time_s" not in history:
        return
    # every row the training writes has its step time: a row without it was cut (a copy stopped, a disk full)
    cut = history["step"].notna() & pd.to_numeric(history["step_time_s"], errors="coerce").isna()
    if cut.any():
        row = int(np.flatnonzero(cut.to_numpy())[0])
        raise InputDataError(
            f"{shown} has an incomplete row (row {row + 1}, step {int(steps.iloc[row])}: no step time): "
            "the file was cut while it was written or copied; that window would be left out of every rate.",
            fix="copy the file again whole, or rerun `kedro run --pipeline=train` to write it again.",
        )


def check_report_sources(
    summary: dict, *, test_metrics: dict | None = None, diagnosis: dict | None = None, runs=None
) -> None:
    """Refuse (``check_one_training``) what the report reads of one training when it was written for another
    than ``summary``'s: the test metrics, the diagnosis (beside the training and efficiency tables), the run
    comparison's ``this run`` mark; one not given is not checked."""
    if test_metrics is not None:
        check_one_training(summary, training_id=test_metrics.get(TRAINING_ID), what="test metrics")
    if diagnosis is not None:
        check_one_training(
            summary,
            training_id=diagnosis.get(TRAINING_ID),
            what="the training and efficiency tables and the diagnosis (summarize_training)",
        )
    if runs is not None:
        check_one_training(
            summary, training_id=marked_run(runs, summary), what="the run comparison (compare_training_runs)"
        )


def marked_run(runs: pd.DataFrame | None, summary: dict) -> str | None:
    """The training the run comparison ``runs`` was made for, as :func:`check_one_training` compares it: the
    summary's own ``training_id`` when the row marked ``this run`` is the summary's MLflow run (run ids are
    shown shortened), a marker of another training when it is another run's; None when nothing is marked or
    the summary names no MLflow run (not compared)."""
    ours = summary.get("mlflow_run_id")
    if runs is None or not ours or "this run" not in runs or "run_id" not in runs:
        return None
    marked = [str(run_id) for run_id in runs.loc[runs["this run"] == "◀", "run_id"]]
    if not marked:
        return None
    return summary.get(TRAINING_ID) if any(str(ours).startswith(run_id) for run_id in marked) else "another"


def check_train_summary(summary: Any, shown: str) -> dict:
    """``summary`` when it is a training run's summary (a JSON object with its step count ``steps``, which
    every fastlm version wrote, and a ``runtime`` that is an object, or null: unknown), else one
    InputDataError line naming ``shown`` (the file)."""
    steps = summary.get("steps") if isinstance(summary, dict) else None
    runtime = summary.get("runtime") if isinstance(summary, dict) else None
    if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0:
        if runtime is not None and not isinstance(runtime, dict):  # null: read as unknown, as without it
            raise InputDataError(
                f"{shown} holds runtime = {runtime!r}, not the record of a training's runtime (an object): "
                "it is not a summary fastlm wrote.",
                fix="rerun `kedro run --pipeline=train` to write it again.",
            )
        return summary
    if summary is None:
        what = "null"
    elif not isinstance(summary, dict):
        what = {bool: "a boolean", str: "a string", list: "a list"}.get(type(summary), "a number")
    elif not summary:
        what = "an empty object"
    elif "steps" not in summary:
        what = f"an object without a step count (steps; it has {', '.join(map(str, list(summary)[:4]))})"
    else:
        what = f"steps = {steps!r}, not a step count"
    raise InputDataError(
        f"{shown} holds {what}, not the summary of a training run.",
        fix="rerun `kedro run --pipeline=train` to write it again.",
    )


def train_loss_name(label_smoothing: float | None) -> str:
    """What the train loss is called where it stands beside the validation loss: "train loss (label-smoothed
    0.1)" for a run with ``train.loss.label_smoothing`` (the smoothed loss it optimised, higher than the plain
    cross-entropy every validation and test loss is), else "train loss"."""
    return f"train loss (label-smoothed {label_smoothing:g})" if label_smoothing else "train loss"


def end_of_run_losses(summary: dict) -> str:
    """The losses the end of a training says, each pair of one step: the train and validation losses of the
    model the run returns. An early-stopped run whose model is an earlier step's (its best) gives that step's
    pair (``model_train_loss``, ``final_val_loss``), then the last step's (``final_train_loss``,
    ``last_val_loss``), each named by its step. The train loss is named label-smoothed where it was
    (``train_loss_name``)."""
    train, figure = train_loss_name(summary.get("label_smoothing")), summary.get
    model_step = (summary.get("early_stopping") or {}).get("model_from_step")
    if model_step is None or model_step == summary.get("steps"):
        return (
            f"{train} {_loss(figure('final_train_loss'))}, validation loss {_loss(figure('final_val_loss'))}"
        )
    return (
        f"the model is step {model_step}'s (early stopping's best): {train} "
        f"{_loss(figure('model_train_loss'))}, validation loss {_loss(figure('final_val_loss'))}; "
        f"the last step, {figure('steps')}: {train} {_loss(figure('final_train_loss'))}, "
        f"validation loss {_loss(figure('last_val_loss'))}"
    )


def _loss(value: Any) -> str:
    return "none" if value is None or value != value else f"{value:.4f}"


def after_warmup(history: pd.DataFrame | None) -> pd.DataFrame:
    """The history without its warm-up rows (its first, and each resumed process's first step, marked
    ``warmup``: :func:`fastlm.engine.observe.rates.timed_windows`), unless they are all there is."""
    if history is None or history.empty:
        return pd.DataFrame()
    kept = timed_windows(history.to_dict("records"))
    return history.iloc[kept] if kept else history


def throughput(history: pd.DataFrame | None, column: str = "real_tokens_per_s") -> float:
    """:func:`fastlm.engine.observe.rates.timed_rate` of a history frame (NaN when not measured): the one
    figure. ``column`` may be any per-window rate, ``mfu`` too (proportional to the window's real
    tokens/s)."""
    if history is None or history.empty or column not in history or "step_time_s" not in history:
        return math.nan
    columns = ["step", "step_time_s", column] + (["warmup"] if "warmup" in history else [])
    frame = history[columns].apply(pd.to_numeric, errors="coerce").astype("float64")
    rate = timed_rate(frame.to_dict("records"), column)
    return math.nan if rate is None else rate


def numeric(frame: pd.DataFrame | None, column: str) -> pd.Series:
    """``frame[column]`` as floats (``None`` -> NaN); an empty series when the column is missing."""
    if frame is None or column not in frame.columns:
        return pd.Series(dtype="float64")
    return pd.to_numeric(frame[column], errors="coerce").astype("float64")


def _mean(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.mean()) if len(values) else math.nan


def _max(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.max()) if len(values) else math.nan


def _quantile(values: pd.Series, q: float) -> float:
    values = values.dropna()
    return float(values.quantile(q)) if len(values) else math.nan


def _last(frame: pd.DataFrame | None, column: str) -> float:
    values = numeric(frame, column).dropna()
    return float(values.iloc[-1]) if len(values) else math.nan


def _at_step(frame: pd.DataFrame | None, column: str, step: Any) -> float:
    """``column`` of ``frame``'s row of ``step`` (NaN when it has none)."""
    values = numeric(frame, column)[numeric(frame, "step") == step].dropna()
    return float(values.iloc[-1]) if len(values) else math.nan


def _first_known(*values: Any) -> Any:
    """The first value that is neither ``None`` nor NaN (``None`` when there is none)."""
    for value in values:
        if value is None:
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        return value
    return None


def _exp(loss: Any) -> float | None:
    if loss is None:
        return None
    try:
        return math.exp(float(loss))
    except OverflowError:
        return math.inf


def training_summary(
    summary: dict, history: pd.DataFrame, eval_history: pd.DataFrame, run_id: str | None = None
) -> pd.DataFrame:
    """One row: what was trained, for how long, and how it ended.

    Columns: run_id, steps, epochs, wall_time_s, model_step (the step whose weights the run returned: early
    stopping's best, else the last), model_train_loss (that step's train loss), final_val_loss and
    final_val_perplexity (that step's validation figures), final_train_loss and last_val_loss (the last
    step's), label_smoothing (the train losses are smoothed by it where it is above 0), effective_batch (rows
    per optimizer step), rows_per_step, samples_per_step and tokens_per_step (the mean samples and real tokens
    a step holds: several samples per packed row), tokens_seen, batching, parameters, device. Losses fall
    back to the last history rows (the model step's train loss to its history row); the perplexity to
    ``exp(final_val_loss)`` when it was not recorded.
    """
    summary = summary or {}
    runtime = summary.get("runtime") or {}
    last_step = _max(numeric(history, "step"))
    steps = _first_known(summary.get("steps"), None if math.isnan(last_step) else int(last_step))
    model_step = _first_known((summary.get("early_stopping") or {}).get("model_from_step"), steps)
    final_train_loss = _first_known(summary.get("final_train_loss"), _last(history, "loss"))
    final_val_loss = _first_known(summary.get("final_val_loss"), _last(eval_history, "val_loss"))
    final_val_perplexity = _first_known(
        summary.get("final_val_perplexity"), _last(eval_history, "val_perplexity"), _exp(final_val_loss)
    )
    at_last_step = model_step == steps
    row = {
        "run_id": run_id,
        "steps": steps,
        "epochs": summary.get("epochs"),
        "wall_time_s": _first_known(summary.get("wall_time_s"), _last(history, "elapsed_s")),
        "model_step": model_step,
        "model_train_loss": _first_known(
            summary.get("model_train_loss"),
            final_train_loss if at_last_step else _at_step(history, "loss", model_step),
        ),
        "final_val_loss": final_val_loss,
        "final_val_perplexity": final_val_perplexity,
        "final_train_loss": final_train_loss,
        "last_val_loss": _first_known(
            summary.get("last_val_loss"), final_val_loss if at_last_step else _last(eval_history, "val_loss")
        ),
        "label_smoothing": summary.get("label_smoothing") or 0.0,
        "effective_batch": summary.get("effective_batch"),
        "rows_per_step": summary.get("rows_per_step", summary.get("effective_batch")),
        "samples_per_step": summary.get("samples_per_step"),  # a packed row holds several samples
        "tokens_per_step": summary.get("tokens_per_step"),
        "tokens_seen": summary.get("tokens_seen"),
        "batching": summary.get("batching"),
        "parameters": summary.get("parameters"),
        "device": runtime.get("device"),
    }
    return pd.DataFrame([row])


_TEXT_COLUMNS = ("run_id", "rate_steps", "step_figure_steps")


def _spans(steps: list[tuple[int, int]]) -> str:
    """``[(2, 6), (8, 12)]`` as "2-6, 8-12" (touching spans joined, a single step alone)."""
    joined: list[list[int]] = []
    for first, last in steps:
        if joined and first <= joined[-1][1] + 1:
            joined[-1][1] = max(joined[-1][1], last)
        else:
            joined.append([first, last])
    return ", ".join(f"{first}-{last}" if last > first else f"{first}" for first, last in joined)


def _rate_steps(history: pd.DataFrame | None) -> str | None:
    """The steps the throughput covers: the windows :func:`throughput` counts (each process's first step
    left out), as "2-6, 8-12"; None without a history."""
    if history is None or history.empty or "step" not in history:
        return None
    records = history.to_dict("records")
    kept = timed_windows(records) or range(len(records))
    spans = []
    for index in kept:
        last = int(records[index]["step"])
        first = int(records[index - 1]["step"]) + 1 if index > 0 else 1
        spans.append((first, last))
    return _spans(spans)


def _step_figure_steps(summary: dict) -> str | None:
    """The steps the summary's per-step figures (step times, data wait, padding) cover: the last process's
    (``StepMetrics.step_figures``), its first left out unless it is the only one; None when the summary has
    none (the windows' fallback covers the throughput's steps)."""
    steps = summary.get("steps")
    if _first_known(summary.get("step_time_p50_s")) is None or not isinstance(steps, int):
        return None
    start = summary.get("resumed_from_step") or 0
    trained = summary.get("steps_trained")
    trained = trained if isinstance(trained, int) else steps - start
    if trained < 1:
        return None
    return _spans([(start + (2 if trained > 1 else 1), steps)])


def efficiency_summary(summary: dict, history: pd.DataFrame, run_id: str | None = None) -> pd.DataFrame:
    """One row: throughput, step-time spread, input/padding overheads, memory and MFU.

    Rates are :func:`throughput` (total over time, warm-up left out: the figure every table shows). Step times
    (``step_time_p50/p90/p99_s`` percentiles and ``step_time_max_s``), data wait (total wait / total time) and
    padding (real / computed tokens) are the run's figures over its single steps, from ``summary`` (the engine
    computes them, first step left out); a run without them falls back to the logging windows after the
    warm-up row (percentiles of the window mean step times, means of the window shares). ``peak_memory_mb`` is
    the maximum over all rows (the warm-up row included: memory peaks count wherever they happen). Figures the
    history lacks come from ``summary`` when it has them. ``mfu`` is the run's (:func:`throughput` of the
    windows' MFU: flops_per_token x real tokens/s / peak is linear in the rate, so the run's MFU is that of
    the run's real tokens/s, not a mean of window MFUs); NaN when never measured (CPU runs).
    ``rate_steps`` says which steps the rates cover ("2-6, 8-12": each process's first step left out),
    ``step_figure_steps`` which steps the step times, data wait and padding cover: a resumed run's are its
    last process's ("8-12"), its history's windows before it not among them.
    """
    summary = summary or {}
    timed = after_warmup(history)
    step_times = numeric(timed, "step_time_s")
    slowest = _first_known(summary.get("step_time_max_s"), _max(numeric(timed, "step_time_max_s")))

    def _window_quantile(q: float) -> float:
        # a window's step time is its wall time over its steps, evaluations and saves between them included;
        # no step is slower than the slowest one's own time: the fallback's percentiles are bounded by it
        value = _quantile(step_times, q)
        return min(value, slowest) if isinstance(slowest, float) and math.isfinite(slowest) else value

    row = {
        "run_id": run_id,
        "windows": len(timed),
        "real_tokens_per_s": _first_known(throughput(history), summary.get("real_tokens_per_s"), math.nan),
        "tokens_per_s": throughput(history, "tokens_per_s"),
        "samples_per_s": throughput(history, "samples_per_s"),
        "step_time_p50_s": _first_known(summary.get("step_time_p50_s"), _window_quantile(0.50)),
        "step_time_p90_s": _first_known(summary.get("step_time_p90_s"), _window_quantile(0.90)),
        "step_time_p99_s": _first_known(summary.get("step_time_p99_s"), _window_quantile(0.99)),
        "step_time_max_s": slowest,
        "data_wait_share": _first_known(
            summary.get("data_wait_share"), _mean(numeric(timed, "data_wait_share")), math.nan
        ),
        "padding_efficiency": _first_known(
            summary.get("padding_efficiency"), _mean(numeric(timed, "padding_efficiency")), math.nan
        ),
        "peak_memory_mb": _first_known(
            _max(numeric(history, "peak_memory_mb")), summary.get("peak_memory_mb"), math.nan
        ),
        "mfu": throughput(history, "mfu"),
        "rate_steps": _rate_steps(history),
        "step_figure_steps": _step_figure_steps(summary) or _rate_steps(history),
    }
    frame = pd.DataFrame([row])
    numeric_columns = [column for column in frame.columns if column not in _TEXT_COLUMNS]
    frame[numeric_columns] = frame[numeric_columns].astype(np.float64)
    frame["windows"] = frame["windows"].astype("int64")
    return frame
