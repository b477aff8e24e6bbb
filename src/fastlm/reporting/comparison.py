"""Compare the experiment's training runs from MLflow: the parameters that differ, speed, loss, wall time."""

from __future__ import annotations

import logging

import pandas as pd

log = logging.getLogger(__name__)
SPEED = "metrics.train/real_tokens_per_s"
VAL_LOSS = "metrics.eval/val_loss"
TRAIN_LOSS = "metrics.train/loss"


def compare_runs(runs: pd.DataFrame, limit: int = 20) -> pd.DataFrame:
    """One row per training run (newest first) from ``mlflow.search_runs`` output.

    Only parameters whose values differ between the runs are shown, so "batch 8 vs 16" or "packed vs
    dynamic" is one look. Speed and losses are the last values logged; wall time is end - start.
    """
    if runs.empty or SPEED not in runs.columns:
        return pd.DataFrame(columns=["run_id", "run_name", "start_time"])
    runs = runs[runs[SPEED].notna()].sort_values("start_time", ascending=False).head(limit)
    params = [c for c in runs.columns if c.startswith("params.") and not c.startswith("params.runtime.torch")]
    differing = [c for c in params if runs[c].astype("string").fillna("<unset>").nunique() > 1]
    table = pd.DataFrame({
        "run_id": runs["run_id"].str.slice(0, 8),
        "run_name": runs.get("tags.mlflow.runName"),
        "start_time": runs["start_time"].dt.strftime("%Y-%m-%d %H:%M") if "start_time" in runs else None,
        "real_tokens_per_s": runs[SPEED],
        "final_train_loss": runs.get(TRAIN_LOSS),
        "final_val_loss": runs.get(VAL_LOSS),
        "wall_time_s": (runs["end_time"] - runs["start_time"]).dt.total_seconds() if "end_time" in runs else None,
    })
    for column in differing:
        table[column.removeprefix("params.")] = runs[column]
    return table.reset_index(drop=True)


def search_training_runs(experiment: str | None = None) -> pd.DataFrame:
    """The runs of the active (or named) experiment; an empty frame, with one warning, if MLflow fails."""
    try:
        import mlflow

        if experiment is None:
            active = mlflow.active_run()
            ids = [active.info.experiment_id] if active is not None else None
            return mlflow.search_runs(experiment_ids=ids, max_results=500) if ids else pd.DataFrame()
        return mlflow.search_runs(experiment_names=[experiment], max_results=500)
    except Exception as exc:  # noqa: BLE001 - a report without the comparison beats no report
        log.warning("Run comparison skipped: MLflow search failed (%s: %s)", type(exc).__name__, exc)
        return pd.DataFrame()
