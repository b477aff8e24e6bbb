"""Node of the sweep pipeline: each parameter set of the sweep file is one named training run (an MLflow child
run of this pipeline's run) on the same tokenized data; finished runs are kept, so a rerun continues."""

from __future__ import annotations

import json
import logging

import datasets
import pandas as pd

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.fingerprint import data_folds
from fastlm.engine.config import parse_train_params
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.evaluate.evaluation import EvalOptions, evaluate
from fastlm.engine.runtime.environment import setup_runtime
from fastlm.pipelines.report.nodes import generate_on_references
from fastlm.pipelines.train.nodes import train_model
from fastlm.reporting.params import parse_report_params
from fastlm.reporting.sweep_view import comparison_table, fold_spread, loss_plot, sweep_document, verdict
from fastlm.sweeps import SweepRuns, load_sweep_runs, run_train_params
from fastlm.tracking import RunTracker

log = logging.getLogger(__name__)


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
):
    """Train every run of the sweep file ``sweep`` that has not finished yet (``runs`` keeps the finished
    ones; each run is a child run of ``tracker``'s); the comparison table, the loss plot and the verdict of
    all."""
    folds = data_folds(fingerprint)  # folds: auto runs one model per fold of the data (split.folds)
    spec = load_sweep_runs(sweep, train_params, folds)  # every run's parameters checked before the first one
    plan, names = spec.plan(folds), spec.run_names(folds)
    summaries, histories, evaluations = {}, {}, {}
    for index, (overrides, name) in enumerate(zip(plan, names, strict=True), start=1):
        params = run_train_params(train_params, spec, overrides)
        identity = {"train": params, "data": fingerprint.get("fingerprint"), "overrides": overrides}
        done = runs.finished(spec.name, name, identity)
        if done is None:
            log.info("Sweep %s: run %d of %d, %s: %s", spec.name, index, len(plan), name, overrides)
            with tracker.child_run(name, overrides):
                trained, history, evaluation, summary = train_model(
                    tokenized, fingerprint, tokenizer, params, split_params, run_name=name, tracker=tracker
                )
                scores = {
                    **_test_metrics(
                        trained["model"], tokenizer, tokenized, params, split_params, report_params
                    ),
                    **reference_scores(
                        trained["model"], tokenizer, splits, params, split_params, report_params
                    ),
                }
                if scores:
                    tracker.log_run_metrics(scores)
                summary.update(scores)
            done = {**summary, "sweep_identity": json.loads(json.dumps(identity, default=str))}
            runs.keep(spec.name, name, done, history, evaluation)
        else:
            log.info("Sweep %s: run %d of %d, %s, finished before: kept", spec.name, index, len(plan), name)
        summaries[name] = done
        histories[name], evaluations[name] = runs.histories(spec.name, name)
    table = comparison_table(summaries, dict(zip(names, plan, strict=True)), spec.metric)
    spread = fold_spread(table, spec.metric)  # None unless the runs differ by train.fold
    text = verdict(table, spec.metric, histories, evaluations, spread=spread)
    log.info("Sweep %s: %s", spec.name, text)
    return table, loss_plot(histories, evaluations), sweep_document(spec.name, text, table, spread)


def _test_metrics(
    model, tokenizer, tokenized, train_params: dict, split_params: dict, report_params: dict
) -> dict:
    """Test-split loss, perplexity, accuracy and top-k accuracy of a run's model (``test_*``)."""
    if model is None or len(tokenized["test"]) == 0:
        return {}
    params, report = parse_train_params(train_params), parse_report_params(report_params)
    runtime = setup_runtime(params.runtime, seed=params.seed)
    model.to(runtime.device)
    result = evaluate(
        model,
        TokenSequences.from_arrow(tokenized["test"]),
        tokenizer=tokenizer,
        params=params,
        runtime=runtime,
        max_length=parse_split_params(split_params).max_length,
        attn=model.config._attn_implementation or "sdpa",
        options=EvalOptions(
            analysis=True, max_batches=report.eval_max_batches, top_k=report.top_k, worst=1, pairs=1
        ),
    )
    return {f"test_{key}": result.metrics[key] for key in ("loss", "perplexity", "accuracy", "top5_accuracy")}


def reference_scores(
    model, tokenizer, splits: pd.DataFrame, train_params: dict, split_params: dict, report_params: dict
) -> dict:
    """ROUGE-1/2/L F1 (``test_rouge*``) of a run's generations against the test split's references, as the
    report scores them (prompt/response data under ``report.references``; nothing otherwise)."""
    if model is None:
        return {}
    _, metrics = generate_on_references(
        {"model": model, "tokenizer": tokenizer}, splits, train_params, split_params, report_params
    )
    return {f"test_{key}": metrics[key] for key in ("rouge1", "rouge2", "rougeL") if key in metrics}
