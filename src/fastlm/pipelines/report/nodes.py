"""Nodes of the report pipeline: summaries, test-split evaluation, plots, run comparison, the report."""

from __future__ import annotations

import dataclasses
import logging

import datasets
import pandas as pd

from fastlm.corpus.fingerprint import check_fresh
from fastlm.corpus.params import parse_split_params
from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.evaluation import evaluate_split, generate_samples
from fastlm.engine.runtime import RuntimeConfig, setup_runtime
from fastlm.errors import InputDataError
from fastlm.reporting import comparison, plots
from fastlm.reporting.diagnosis import diagnose, epoch_eta
from fastlm.reporting.params import parse_report_params
from fastlm.reporting.report_document import build_document
from fastlm.reporting.summaries import efficiency_summary, training_summary

log = logging.getLogger(__name__)
HISTORY = "data/07_model_output/train_history.csv"


def summarize_training(summary: dict, history: pd.DataFrame, eval_history: pd.DataFrame):
    """training_summary and efficiency_summary rows, and the bottleneck diagnosis with an epoch ETA."""
    if history is None or history.empty or "step" not in history:
        raise InputDataError(f"{HISTORY} has no training steps.", fix="run `kedro run --pipeline=train` first.")
    run_id = summary.get("mlflow_run_id")
    findings = diagnose(summary, history)
    for finding in findings:
        if finding.triggered:
            log.info("Diagnosis: %s — %s %s", finding.kind, finding.message, finding.advice)
    diagnosis = {"findings": [dataclasses.asdict(f) for f in findings], "epoch_eta": epoch_eta(summary, history)}
    return (training_summary(summary, history, eval_history, run_id), efficiency_summary(summary, history, run_id),
            diagnosis)


def evaluate_model(trained: dict, tokenized: datasets.DatasetDict, fingerprint: dict, train_params: dict,
                   split_params: dict, report_params: dict):
    """Test-split loss, perplexity, accuracy, top-k, error analysis and sample generations."""
    params, report = parse_train_params(train_params), parse_report_params(report_params)
    max_length = parse_split_params(split_params).max_length
    model, tokenizer = trained["model"], trained["tokenizer"]
    check_fresh(fingerprint, tokenizer, max_length, where="data/05_model_input/tokenized_corpus")
    if len(tokenized["test"]) == 0:
        raise InputDataError("the test split is empty.", fix="raise split.ratios.test and rerun the split pipeline.")
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    model.to(runtime.device)
    attn = model.config._attn_implementation or "sdpa"
    result = evaluate_split(model, tokenizer, TokenSequences.from_arrow(tokenized["test"]), params=params,
                            runtime=runtime, max_length=max_length, attn=attn, max_batches=report.eval_max_batches,
                            top_k=report.top_k, worst=report.worst_samples, pairs=report.error_pairs)
    settings = [setting.model_dump(exclude_none=True) for setting in report.decoding]
    generations = generate_samples(model, tokenizer, report.prompts, settings=settings,
                                   max_new_tokens=report.max_new_tokens, runtime=runtime)
    log.info("Test split: loss %.4f, perplexity %.2f, accuracy %.3f, top-%d %.3f (%.0f real tokens/s)",
             result.metrics["loss"], result.metrics["perplexity"], result.metrics["accuracy"], report.top_k,
             result.metrics["top5_accuracy"], result.metrics["real_tokens_per_s"])
    return result.metrics, result.wrong_pairs, result.worst_samples, generations


def plot_training(history: pd.DataFrame, eval_history: pd.DataFrame):
    """Loss, throughput, learning rate and peak memory against step, as PNGs through the catalog."""
    return (plots.loss_figure(history, eval_history), plots.throughput_figure(history),
            plots.learning_rate_figure(history), plots.memory_figure(history))


def compare_training_runs(report_params: dict) -> pd.DataFrame:
    """The experiment's training runs side by side (parameters that differ, tokens/s, loss, wall time)."""
    table = comparison.compare_runs(comparison.search_training_runs(), parse_report_params(report_params).compare_runs)
    log.info("Run comparison: %d training runs", len(table))
    return table


def write_report(summary: dict, history: pd.DataFrame, eval_history: pd.DataFrame, training: pd.DataFrame,
                 efficiency: pd.DataFrame, diagnosis: dict, test_metrics: dict, error_pairs: pd.DataFrame,
                 worst: pd.DataFrame, generations: pd.DataFrame, runs: pd.DataFrame) -> tuple[str, str]:
    """One self-contained HTML report (plots embedded) and a Markdown summary."""
    return build_document(summary=summary, history=history, eval_history=eval_history, training=training,
                          efficiency=efficiency, diagnosis=diagnosis, test_metrics=test_metrics,
                          error_pairs=error_pairs, worst=worst, generations=generations, runs=runs)
