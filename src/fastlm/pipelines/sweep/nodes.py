"""Node of the sweep pipeline: each parameter set of the sweep file is one named training run (an MLflow child
run of this pipeline's run) on the same tokenized data; finished runs are kept, so a rerun continues. The
work is ``fastlm.sweep_training``'s; the node hands it the catalog inputs, the train pipeline's training, the
weights digest of a local base model and the tuned file the run applies (each run checked against what it was
measured on). The engine (torch, transformers) is imported when the node runs,
not as the pipelines are built."""

from __future__ import annotations

import datasets
import pandas as pd

from fastlm.pipelines.train.nodes import train_model
from fastlm.pipelines.tune.record import in_effect, weights_identity
from fastlm.sweep_training import SweepInputs, train_sweep
from fastlm.sweeps import SweepRuns
from fastlm.tracking import RunTracker


def run_sweep(
    tokenized: datasets.DatasetDict,
    fingerprint: dict,
    tokenizer,
    splits: pd.DataFrame,
    train_params: dict,
    split_params: dict,
    report_params: dict,
    sweep: str,
    runs: SweepRuns,
    tracker: RunTracker,
    paths: dict | None = None,
):
    """Train every run of the sweep file ``sweep`` that has not finished yet (``runs`` keeps the finished
    ones; each run is a child run of ``tracker``'s) and compare them (``sweep_training.train_sweep``): the
    comparison table, the loss plot, the verdict, the per-fold table (``sweep_folds.csv``) and the run
    configuration of the best setting (``sweep_best_run``: ``kedro run --config <file>`` trains it)."""
    return train_sweep(
        SweepInputs(tokenized, fingerprint, tokenizer, splits, train_params, split_params, report_params),
        sweep,
        runs,
        tracker,
        train=train_model,
        weights_identity=weights_identity,
        tuned=in_effect(),
        best_run_source=(paths or {}).get("sweep_best_run", "sweep_best_run"),
    )
