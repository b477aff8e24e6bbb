"""Nodes of the report pipeline: summaries, test-split evaluation, ROUGE, plots, run comparison, the
report. The engine (torch, transformers) is imported by the nodes that evaluate or generate, when they run:
building the pipelines, as every `kedro run` does, imports neither (tests/test_project.py)."""

from __future__ import annotations

import logging

import datasets
import pandas as pd

from fastlm.errors import InputDataError
from fastlm.parameters import parse_group
from fastlm.pipelines.start import start_node
from fastlm.reporting import comparison, evaluation_run, plots
from fastlm.reporting.diagnosis import diagnosis_record
from fastlm.reporting.report_document import ReportInputs, build_document
from fastlm.reporting.summaries import (
    TRAINING_ID,
    check_history_steps,
    check_one_training,
    check_report_sources,
    check_train_summary,
    efficiency_summary,
    training_summary,
)
from fastlm.tracking import RunTracker

log = logging.getLogger(__name__)


def _path(paths: dict | None, name: str) -> str:
    """The file of catalog entry ``name`` (from ``dataset_paths``), for messages; the entry's name without
    one."""
    return (paths or {}).get(name, name)


def summarize_training(
    summary: dict, history: pd.DataFrame, eval_history: pd.DataFrame, paths: dict | None = None
):
    """training_summary and efficiency_summary rows, and the bottleneck diagnosis with an epoch ETA."""
    if history is None or history.empty or "step" not in history:
        raise InputDataError(
            f"{_path(paths, 'train_history')} has no training steps.",
            fix="run `kedro run --pipeline=train` first.",
        )
    summary = check_train_summary(summary, _path(paths, "train_summary"))
    check_history_steps(history, _path(paths, "train_history"))
    check_one_training(summary, history=history, what=f"the history {_path(paths, 'train_history')}")
    run_id = summary.get("mlflow_run_id")
    diagnosis = diagnosis_record(summary, history)
    return (
        training_summary(summary, history, eval_history, run_id),
        efficiency_summary(summary, history, run_id),
        diagnosis,
    )


def evaluate_model(
    trained: dict,
    tokenized: datasets.DatasetDict,
    fingerprint: dict,
    train_params: dict,
    split_params: dict,
    report_params: dict,
    paths: dict | None = None,
):
    """Test-split loss, perplexity, accuracy, top-k, error analysis and sample generations
    (``evaluation_run.evaluate_test_split``), on data checked fresh and with the runtime applied."""
    report = parse_group("report", report_params)
    start = start_node(
        train_params,
        split_params,
        fingerprint=fingerprint,
        tokenizer=trained["tokenizer"],
        tokenized=tokenized,
        paths=paths,
    )
    return evaluation_run.evaluate_test_split(
        trained,
        tokenized,
        fingerprint,
        settings=(start.train, start.split, start.runtime),
        report=report,
        fingerprint_source=_path(paths, "tokenized_corpus_fingerprint"),
    )


def generate_on_references(
    trained: dict,
    splits: pd.DataFrame,
    train_params: dict,
    split_params: dict,
    report_params: dict,
    paths: dict | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Prompt/response data: generations on the test split and their ROUGE against the responses
    (``evaluation_run.pairs_to_score`` and ``score_reference_pairs``).

    Plain-text data (``report.references.enabled: auto``) or ``enabled: false``: an empty table and no
    metrics, and the report has no ROUGE section.
    """
    references = parse_group("report", report_params).references
    pairs = evaluation_run.pairs_to_score(splits, references, _path(paths, "corpus_splits"))
    if pairs is None:
        return evaluation_run.no_reference_predictions(), {}
    start = start_node(train_params, split_params, runtime_said=True)  # evaluate_model's line
    return evaluation_run.score_reference_pairs(
        trained, pairs, references=references, split=start.split, runtime=start.runtime
    )


def collect_test_metrics(
    evaluation: dict, references: dict, summary: dict, tracker: RunTracker | None = None
) -> dict:
    """Loss, perplexity and accuracy beside ROUGE (when scored), handed to ``tracker`` (``run_tracker``),
    which logs them as ``test_<name>`` on this run and on the training run, where the run comparison finds
    them."""
    for part, what in ((evaluation, "the model it evaluated"), (references, "the model it generated with")):
        check_one_training(summary, training_id=part.get(TRAINING_ID), what=what)
    metrics = {**evaluation, **references}
    (tracker if tracker is not None else RunTracker()).log_test_metrics(
        comparison.test_metric_values(metrics),
        summary.get("mlflow_run_id"),
        tags=comparison.test_scoring_tags(metrics),  # how the ROUGE was scored: other settings do not compare
    )
    return metrics


def plot_training(history: pd.DataFrame, eval_history: pd.DataFrame, summary: dict):
    """Loss, throughput, learning rate and peak memory against step, as PNGs through the catalog; the train
    loss named label-smoothed where ``summary`` (``train_summary``) says it was."""
    return (
        plots.loss_figure(history, eval_history, label_smoothing=summary.get("label_smoothing")),
        plots.throughput_figure(history),
        plots.learning_rate_figure(history),
        plots.memory_figure(history),
    )


def compare_training_runs(
    report_params: dict, test_metrics: dict, summary: dict | None = None, tracker: RunTracker | None = None
) -> pd.DataFrame:
    """The experiment's training runs (from ``tracker``, ``run_tracker``) side by side (parameters that
    differ, tokens/s, loss, test loss and ROUGE, wall time), the reported training run marked.
    ``test_metrics`` is an input so that this run's are logged before the search."""
    training_run = (summary or {}).get("mlflow_run_id")
    runs = (tracker if tracker is not None else RunTracker()).training_runs(training_run)
    table = comparison.compare_runs(
        runs,
        parse_group("report", report_params).compare_runs,
        current_run_id=training_run,
    )
    log.info("Run comparison: %d training runs", len(table))
    note = comparison.data_note(table)
    if note:
        log.warning("Run comparison: %s", note)
    return table


def write_report(
    summary: dict,
    history: pd.DataFrame,
    eval_history: pd.DataFrame,
    training: pd.DataFrame,
    efficiency: pd.DataFrame,
    diagnosis: dict,
    test_metrics: dict,
    error_pairs: pd.DataFrame,
    worst: pd.DataFrame,
    generations: pd.DataFrame,
    predictions: pd.DataFrame,
    runs: pd.DataFrame,
    split_report: dict | None = None,
    sweep: dict | None = None,
    paths: dict | None = None,
) -> tuple[str, str]:
    """One self-contained HTML report (plots embedded) and a Markdown summary; with a sweep section when
    ``sweep_results`` holds a sweep's results. The Markdown links the plot files this run's ``plot_training``
    wrote (``paths``: ``dataset_paths``), none without it. Kedro passes each catalog input as its own
    argument; they travel on together as one ``ReportInputs``."""
    check_report_sources(summary, test_metrics=test_metrics, diagnosis=diagnosis, runs=runs)
    return build_document(
        ReportInputs(
            summary=summary,
            history=history,
            eval_history=eval_history,
            training=training,
            efficiency=efficiency,
            diagnosis=diagnosis,
            test_metrics=test_metrics,
            error_pairs=error_pairs,
            worst=worst,
            generations=generations,
            predictions=predictions,
            runs=runs,
            split_report=split_report,
            sweep=sweep,
            paths=paths,
        )
    )
