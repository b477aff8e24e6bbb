"""Nodes of the report pipeline: summaries, test-split evaluation, ROUGE, plots, run comparison, the
report. The engine (torch, transformers) is imported by the nodes that evaluate or generate, when they run:
building the pipelines, as every `kedro run` does, imports neither (tests/test_project.py)."""

from __future__ import annotations

import dataclasses
import logging

import datasets
import pandas as pd

from fastlm.errors import InputDataError
from fastlm.parameters import parse_group
from fastlm.pipelines.start import start_node
from fastlm.reporting import comparison, plots
from fastlm.reporting.diagnosis import diagnose, epoch_eta
from fastlm.reporting.params import check_id_prompts, check_top_k
from fastlm.reporting.report_document import ReportInputs, build_document
from fastlm.reporting.summaries import (
    TRAINING_ID,
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
    check_one_training(summary, history=history, what=f"the history {_path(paths, 'train_history')}")
    run_id = summary.get("mlflow_run_id")
    findings = diagnose(summary, history)
    for finding in findings:
        if finding.triggered:
            log.info(
                "Diagnosis: %s — %s%s",
                finding.kind,
                finding.message,
                f". What to do: {finding.advice}" if finding.advice else "",
            )
    diagnosis = {
        "findings": [dataclasses.asdict(f) for f in findings],
        "epoch_eta": epoch_eta(summary, history),
        TRAINING_ID: summary.get(TRAINING_ID),  # which training: write_report refuses another's
    }
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
    """Test-split loss, perplexity, accuracy, top-k, error analysis and sample generations."""
    from fastlm.engine.data.collators import TextEnds
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.evaluate.evaluation import EvalOptions, evaluate, top_k_metric
    from fastlm.engine.evaluate.generation import generate_samples
    from fastlm.reporting.predict_inputs import input_limit, sample_prompts

    report = parse_group("report", report_params)
    model, tokenizer = trained["model"], trained["tokenizer"]
    start = start_node(
        train_params,
        split_params,
        fingerprint=fingerprint,
        tokenizer=tokenizer,
        tokenized=tokenized,
        paths=paths,
    )
    if start.split.pretokenized:  # its tokenizer reads an unknown word as EOS: refused before the slow part
        check_id_prompts(report.prompts, start.split.vocab_size)
    if len(tokenized["test"]) == 0:
        raise InputDataError(
            "the test split is empty.", fix="raise split.ratios.test and rerun the split pipeline."
        )
    params, runtime, max_length = start.train, start.runtime, start.split.max_length
    check_top_k(report.top_k, model.config.get_text_config().vocab_size)
    model.to(runtime.device)
    attn = model.config._attn_implementation or "sdpa"
    result = evaluate(
        model,
        TokenSequences.from_arrow(tokenized["test"], text_ends=TextEnds.of(tokenizer)),
        tokenizer=tokenizer,
        params=params,
        runtime=runtime,
        max_length=max_length,
        attn=attn,
        options=EvalOptions(
            analysis=True,
            max_batches=report.eval_max_batches,
            top_k=report.top_k,
            worst=report.worst_samples,
            pairs=report.error_pairs,
        ),
    )
    settings = [setting.model_dump(exclude_none=True) for setting in report.decoding]
    samples = sample_prompts(  # as predict asks the model an input of its training's kind
        report.prompts,
        trained,
        fingerprint,
        fingerprint_source=_path(paths, "tokenized_corpus_fingerprint"),
        limit=input_limit(
            model,
            max_new_tokens=report.max_new_tokens,
            max_input_tokens=None,
            trained_length=max_length,
            parameter="report.max_new_tokens",
        ),
    )
    generations = generate_samples(
        model,
        tokenizer,
        report.prompts,
        settings=settings,
        max_new_tokens=report.max_new_tokens,
        runtime=runtime,
        prompt_ids=samples.ids,
        continuation=samples.continuation,
    )
    log.info(
        "Test split: loss %.4f, perplexity %.2f, accuracy %.3f, top-%d %.3f (%.0f real tokens/s)",
        result.metrics["loss"],
        result.metrics["perplexity"],
        result.metrics["accuracy"],
        report.top_k,
        result.metrics[top_k_metric(report.top_k)],
        result.metrics["real_tokens_per_s"],
    )
    metrics = {**result.metrics, TRAINING_ID: _training_id(trained)}  # which training made the model
    if report.eval_max_batches is not None:  # the report says how many of the split's samples it counted
        metrics["test_split_samples"] = len(tokenized["test"])
        metrics["eval_max_batches"] = report.eval_max_batches
    return metrics, result.wrong_pairs, result.worst_samples, generations


def _training_id(trained: dict) -> str | None:
    return (trained.get("training_data") or {}).get(TRAINING_ID)


def generate_on_references(
    trained: dict,
    splits: pd.DataFrame,
    train_params: dict,
    split_params: dict,
    report_params: dict,
    paths: dict | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Prompt/response data: generations on the test split and their ROUGE against the responses.

    Plain-text data (``report.references.enabled: auto``) or ``enabled: false``: an empty table and no
    metrics, and the report has no ROUGE section.
    """
    from fastlm.reporting.references import (
        PREDICTION_COLUMNS,
        has_references,
        reference_pairs,
        score_test_generations,
    )
    from fastlm.reporting.rouge import tokenless_note

    references = parse_group("report", report_params).references
    found = has_references(splits)
    if references.enabled is True and not found:
        raise InputDataError(
            f"report.references.enabled is true but {_path(paths, 'corpus_splits')} has no prompt/response "
            f"columns (it has {list(map(str, splits.columns))}).",
            fix="split prompt/response data (split.prompt_column and split.response_column) or set "
            "report.references.enabled: auto.",
        )
    if references.enabled is False or not found:
        log.info(
            "No generation against references: %s",
            "report.references.enabled is false" if found else "the data has no prompt/response columns",
        )
        return pd.DataFrame(columns=PREDICTION_COLUMNS), {}
    pairs = reference_pairs(splits, references.max_samples)
    if pairs.empty:
        raise InputDataError(
            f"the test split of {_path(paths, 'corpus_splits')} is empty.",
            fix="raise split.ratios.test and rerun the split pipeline.",
        )
    start = start_node(train_params, split_params, runtime_said=True)  # evaluate_model's line
    runtime = start.runtime
    model = trained["model"].to(runtime.device)
    table, metrics = score_test_generations(
        model,
        trained["tokenizer"],
        pairs,
        references=references,
        runtime=runtime,
        max_length=start.split.max_length,
        chat_variables=start.split.chat_template_kwargs if start.split.data_format == "messages" else None,
    )
    log.info(
        "ROUGE on %d test samples (%s; %s tokenizer): ROUGE-1 %.4f, ROUGE-2 %.4f, ROUGE-L %.4f "
        "(%.1f s, %.0f generated tokens/s)",
        metrics["rouge_samples"],
        metrics["rouge_decoding"],
        metrics["rouge_tokenizer"],
        metrics["rouge1"],
        metrics["rouge2"],
        metrics["rougeL"],
        metrics["generation_seconds"],
        metrics["generated_tokens_per_s"],
    )
    if metrics.get("rouge_tokenless_references"):
        log.warning("ROUGE: %s", tokenless_note(metrics))
    if "tool_call_samples" in metrics:
        log.info(
            "Tool calls on the %d test samples answered by a call: the same functions in %.1f%%, the same "
            "calls in %.1f%% (call_match in reference_predictions.csv)",
            metrics["tool_call_samples"],
            100 * metrics["tool_call_name_accuracy"],
            100 * metrics["tool_call_exact_match"],
        )
        if metrics.get("tool_call_unread_at_limit"):
            log.warning(
                "%d of the %d test answers that call a tool stopped at report.references.max_new_tokens = %d "
                "before their call ended: they read as no call and count as misses; raise "
                "report.references.max_new_tokens to score whole calls",
                metrics["tool_call_unread_at_limit"],
                metrics["tool_call_samples"],
                references.max_new_tokens,
            )
    return table, {**metrics, TRAINING_ID: _training_id(trained)}


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
        comparison.test_metric_values(metrics), summary.get("mlflow_run_id")
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
    runs = (tracker if tracker is not None else RunTracker()).training_runs()
    table = comparison.compare_runs(
        runs,
        parse_group("report", report_params).compare_runs,
        current_run_id=(summary or {}).get("mlflow_run_id"),
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
