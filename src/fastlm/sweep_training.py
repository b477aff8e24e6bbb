"""Running a sweep, Kedro-free: every run of the sweep file that has not finished yet is trained as an MLflow
child run, its model scored on the test split as the report scores it, and kept (``SweepRuns``), so that a
rerun continues; then the comparison of all runs, the loss plot, the verdict, the per-fold table and the run
configuration of the best setting. The sweep pipeline's node hands it its catalog inputs, the training
function (the train pipeline's) and the weights digest of a local base model. The engine (torch,
transformers) is imported when a run trains or is scored, not as the pipelines are built."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import datasets
import pandas as pd
import yaml

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.fingerprint import data_folds, data_identity, folds_mismatch
from fastlm.engine.config import parse_train_params
from fastlm.errors import ConfigError
from fastlm.reporting.params import check_top_k, parse_report_params
from fastlm.reporting.sweep_view import (
    best_run,
    best_setting_runs,
    comparison_table,
    cv_metrics,
    cv_setting,
    fold_spread,
    fold_table,
    loss_plot,
    sweep_document,
    verdict,
)
from fastlm.sweeps import (
    SweepRuns,
    SweepSpec,
    best_run_command,
    best_run_config,
    child_run_params,
    kept_run,
    load_sweep_runs,
    replaced_budgets,
    run_train_params,
)
from fastlm.tracking import RunTracker

log = logging.getLogger(__name__)

# trains one run: (tokenized, fingerprint, tokenizer, train params, split params, run_name=, tracker=,
# choices_dir=) -> (model and tokenizer, history, evaluation history, summary), as the train pipeline's node
TrainFunction = Callable[..., tuple[dict, pd.DataFrame, pd.DataFrame, dict]]


@dataclass(frozen=True)
class SweepInputs:
    """What every run of a sweep trains on and is scored on: the catalog's tokenized data, its fingerprint,
    the tokenizer, the splits (``corpus_splits``, for the references), and the train, split and report
    parameter groups as given (each run's train parameters are these with its overrides)."""

    tokenized: datasets.DatasetDict | None
    fingerprint: dict
    tokenizer: object
    splits: pd.DataFrame | None
    train_params: dict
    split_params: dict
    report_params: dict


# Test metrics of the runs' generations on the test split's references (``reference_scores``): ROUGE on
# prompt/response and chat data, the tool-call rates where the test answers scored call tools.
ROUGE_METRICS = ("test_rouge1", "test_rouge2", "test_rougeL")
TOOL_CALL_METRICS = ("test_tool_call_name_accuracy", "test_tool_call_exact_match")


def refuse_unscored_metric(metric: str, sweep: str, inputs: SweepInputs, references) -> None:
    """Refuse, in one line naming the sweep file, a ``metric`` no run of the sweep would get, before the
    first run trains: ROUGE or a tool-call rate on data without prompt/response pairs (plain text,
    pre-tokenized ids) or with ``report.references.enabled: false``, and a tool-call rate where no test
    answer scored (``report.references.max_samples``) calls a tool. Every run would train and none be
    ranked (the verdict: no setting to train)."""
    if metric not in ROUGE_METRICS + TOOL_CALL_METRICS:
        return
    from fastlm.reporting.references import has_references

    splits = inputs.splits
    others = "rank the runs by final_val_loss or test_loss (every run has them)"
    if splits is None or not has_references(splits):
        why = (
            "the data has no prompt/response pairs (split.prompt_column and split.response_column, or "
            "split.messages_column), and only those are generated on and scored"
        )
        fix = f"write another metric in {sweep}: {others}; or split prompt/response or chat data."
    elif references.enabled is False:
        why = "report.references.enabled is false: no run generates on the test split's references"
        fix = f"set report.references.enabled: auto, or write another metric in {sweep}: {others}."
    elif (
        metric in TOOL_CALL_METRICS and (calls := _tool_calls_scored(inputs, splits, references)) != "scored"
    ):
        why = (
            "no test answer the runs are scored on calls a tool (tool-call rates score chat data whose test "
            "answers call one, in the chat template's call format"
            + (
                f"; report.references.max_samples {references.max_samples} of them"
                if calls == "capped"
                else ""
            )
            + ")"
        )
        fix = f"write another metric in {sweep}: test_rouge1, or {others}" + (
            "; or raise report.references.max_samples (null: every test answer) to score those that call "
            "tools."
            if calls == "capped"
            else "."
        )
    else:
        return
    raise ConfigError(
        f"sweep file {sweep}: metric {metric} is never computed for these runs: {why}; every run would "
        "train and none be ranked by it.",
        fix=fix,
    )


def _tool_calls_scored(inputs: SweepInputs, splits: pd.DataFrame, references) -> str:
    """Whether the runs' reference scores hold tool-call rates (``references.score_test_generations``: chat
    data whose test answers scored call tools in the template's call format): ``scored``; ``capped`` where
    only test answers beyond ``references.max_samples`` call tools; ``none`` otherwise."""
    from fastlm.reporting.references import call_reader, reference_pairs

    split = parse_split_params(inputs.split_params)
    if split.data_format != "messages":
        return "none"
    variables = split.chat_template_kwargs
    scored = reference_pairs(splits, references.max_samples)
    if call_reader(inputs.tokenizer, variables, scored["response"]) is not None:
        return "scored"
    whole = reference_pairs(splits, None)
    if len(whole) > len(scored) and call_reader(inputs.tokenizer, variables, whole["response"]) is not None:
        return "capped"
    return "none"


def run_failures() -> tuple[type[Exception], ...]:
    """A run's own failures (its setting or fold diverged or did not fit in memory): left out, the sweep
    goes on."""
    from fastlm.engine.observe.health import NonFiniteLossError
    from fastlm.engine.train.backoff import OutOfMemory

    return (NonFiniteLossError, OutOfMemory)


def train_sweep(
    inputs: SweepInputs,
    sweep: str,
    runs: SweepRuns,
    tracker: RunTracker,
    *,
    train: TrainFunction,
    weights_identity: Callable[[str | None], str | None],
    best_run_source: str,
    tuned: TunedFile | None = None,
):
    """Train every run of the sweep file ``sweep`` that has not finished yet with ``train`` (``runs`` keeps
    the finished ones; each run is a child run of ``tracker``'s; ``weights_identity``: the digest of a local
    base model folder, None otherwise, part of what a kept run was trained on); the comparison table, the
    loss plot, the verdict, the per-fold table of all and the run configuration of the best setting (the
    file ``best_run_source``: ``kedro run --config <file>`` trains it), and for k-fold runs the mean and
    spread over folds as ``cv/`` metrics of the sweep's run.

    A run that diverges or runs out of memory (``run_failures``) is left out and named, and the sweep goes
    on; the next sweep trains it again. A stop signal or any other error stops the sweep, as does every run
    failing.

    ``tuned``: the tuned file the run applies (``tune.record.TunedInEffect``): a run whose settings are not
    what it was measured on (its grid sets the adapter, checkpointing, precision, ...) trains without it,
    from the other files' settings, said in one warning."""
    failures = run_failures()
    fingerprint, train_params, split_params = inputs.fingerprint, inputs.train_params, inputs.split_params
    folds = data_folds(fingerprint)  # folds: auto runs one model per fold of the data (split.folds)
    report = parse_report_params(inputs.report_params)
    check_top_k(report.top_k, len(inputs.tokenizer))
    scoring = report.model_dump(mode="json", include={"top_k", "eval_max_batches", "references"})
    # every run's parameters checked before the first one
    spec = load_sweep_runs(sweep, train_params, folds, top_k=report.top_k)
    refuse_unscored_metric(spec.metric, sweep, inputs, report.references)
    plan, names = spec.plan(folds), spec.run_names(folds)
    for line in replaced_budgets(spec, train_params, sweep):  # said once, not per run
        log.warning("Sweep %s: %s", spec.name, line)
    configured = (split_params or {}).get("folds")
    if spec.folds is not None and folds_mismatch(fingerprint, configured):  # said once, not per run
        log.warning("Sweep %s: %s", spec.name, folds_mismatch(fingerprint, configured))
        split_params = {**split_params, "folds": folds}
    checkpoints = str(
        parse_train_params(train_params).checkpoint_dir
    )  # the runs' choices kept with plain runs'
    trainer = SweepTrainer(replace(inputs, split_params=split_params), tracker, checkpoints, train)
    summaries, histories, evaluations, errors = {}, {}, {}, []
    for index, (overrides, name) in enumerate(zip(plan, names, strict=True), start=1):
        params = run_train_params(train_params, spec, overrides)
        if tuned is not None:
            params = _tuned_or_not(tuned, spec, overrides, params, name)
        identity = {
            "train": params,
            "data": data_identity(fingerprint),
            "overrides": overrides,
            "scoring": scoring,  # its test figures are the report's: another k or sample is another run
        }
        weights = weights_identity((params.get("model") or {}).get("name_or_path"))
        if weights is not None:  # a local base folder: other weights put in it are another run
            identity["model weights"] = weights
        done, why = kept_run(runs, spec.name, name, identity)
        if why is not None:
            log.info("Sweep %s: run %s is trained again, from scratch: %s", spec.name, name, why)
            # Its checkpoints are those of the run it finished with other settings: resuming the last one
            # would train nothing (its step is the budget's) and keep the old model under the new settings.
            runs.forget(spec.name, name)
            params = {**params, "resume": "never"}  # the old checkpoints moved aside, kept for the user
        if done is None:
            log.info("Sweep %s: run %d of %d, %s: %s", spec.name, index, len(plan), name, overrides)
            try:
                done, history, evaluation = trainer.train(name, params, overrides)
            except failures as error:
                log.warning(
                    "Sweep %s: run %s failed, left out (the next sweep retries it): %s",
                    spec.name,
                    name,
                    error,
                )
                errors.append(error)
                summaries[name] = {"failed": f"{type(error).__name__}: {str(error).split(' Fix: ')[0]}"}
                histories[name], evaluations[name] = pd.DataFrame(), pd.DataFrame()
                continue
            done = {**done, "sweep_identity": json.loads(json.dumps(identity, default=str))}
            runs.keep(spec.name, name, done, history, evaluation)
        else:
            log.info("Sweep %s: run %d of %d, %s, finished before: kept", spec.name, index, len(plan), name)
            trainer.run_ids[name] = done.get("mlflow_run_id")
            tracker.adopt_child_run(done.get("mlflow_run_id"))  # a child of this sweep's run, as the others
        summaries[name] = done
        histories[name], evaluations[name] = runs.histories(spec.name, name)
    if len(errors) == len(plan):
        raise errors[0]  # nothing to compare
    table = comparison_table(summaries, dict(zip(names, plan, strict=True)), spec.metric)
    spread = fold_spread(table, spec.metric)  # None unless the runs differ by train.fold
    log_cv_metrics(table, spec.metric, tracker)
    best = best_run(table, spec.metric)
    command = best_run_command(best_run_source)
    text = verdict(table, spec.metric, histories, evaluations, spread=spread)
    if best is not None:
        text += f" To train {_setting_of(table, spec.metric)} on the whole training split: `{command}`."
    log.info("Sweep %s: %s", spec.name, text)
    return (
        table,
        loss_plot(
            histories, evaluations, {name: run.get("label_smoothing") for name, run in summaries.items()}
        ),
        sweep_document(spec.name, text, table, spread, data=data_identity(fingerprint)),
        fold_table(table, trainer.run_ids, spec.metric),
        best_run_file(
            spec,
            best,
            dict(zip(names, plan, strict=True)),
            command,
            (train_params, split_params),
            setting=_setting_of(table, spec.metric),
        ),
    )


class TunedFile(Protocol):
    """The tuned file a run applies (``tune.record.TunedInEffect``): where, what it sets, the run's train
    parameters without it, and what given train parameters differ in from what it was measured on."""

    where: str
    leaves: tuple[tuple[str, ...], ...]
    untuned: dict
    changes: Callable[[dict], str | None]


def _tuned_or_not(tuned: TunedFile, spec, overrides: dict, params: dict, name: str) -> dict:
    """The train parameters of the sweep run ``name``: ``params`` (the tuned file's settings and the run's
    overrides) where the file was measured on its settings, else the run's settings without the file (its
    overrides over the other files'), with one warning naming the run, what changed and what it drops."""
    plain = run_train_params(tuned.untuned, spec, overrides)
    changed = tuned.changes(plain)
    if changed is None:
        return params
    dropped = []
    for path in tuned.leaves:
        value, instead = _at(params, path), _at(plain, path)
        if value != instead:
            dropped.append(f"train.{'.'.join(path)}={value} (now {instead})")
    log.warning(
        "Sweep %s: run %s trains without %s%s: it was measured on other settings than this run's (%s); "
        "tune them (`kedro run --pipeline=tune --params ...` with this run's settings) or set "
        "train.batching in the sweep file for this run",
        spec.name,
        name,
        tuned.where,
        f" ({', '.join(dropped)})" if dropped else "",
        changed,
    )
    return plain


def _at(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _setting_of(table, metric: str) -> str:
    """The recommended setting in words: "the setting of s-03 and s-04 (one run a fold)" for k-fold runs
    (chosen by its mean over them: no run of it is "the best"), else "s-02's setting"."""
    runs = best_setting_runs(table, metric)
    if len(runs) > 1:
        return f"the setting of {' and '.join(runs)} (one run a fold)"
    return f"{runs[0]}'s setting" if runs else "no setting"


def best_run_header(sweep: str, best: str, metric: str, command: str, *, setting: str | None = None) -> str:
    """The comment heading ``sweep_best_run``: whose setting it is and how to train it (``setting``: k-fold
    runs' "the setting of a and b (one run a fold)", chosen by its mean ``metric``). A ``--params`` given
    with ``--config`` is merged over the file's parameters key by key (``fastlm.cli.run_params``)."""
    named = (
        f"{setting}, best by its mean {metric} over the folds"
        if setting and setting.startswith("the setting of ")
        else f"the setting of {best}, best by {metric}"
    )
    return (
        f"# Sweep {sweep}: {named}, with the sweep's budgets,\n"
        "# its parameters (its --env and --params included) and no fold (the whole training split).\n"
        "# Train it with\n"
        f"#   {command}\n"
        "# and change values here, or give --params with --config: they are merged over these parameters\n"
        "# key by key (--params train.max_steps=1000 changes that value; the others stay as they are here).\n"
    )


def best_run_file(
    spec: SweepSpec,
    best: str | None,
    plan: dict[str, dict],
    command: str,
    groups: tuple[dict, dict],
    *,
    setting: str | None = None,
) -> str:
    """``sweep_best_run``: the best setting as a Kedro run configuration (with the train and split
    parameter groups ``groups``), headed by how to use it; a comment alone where no run has a finite
    metric."""
    if best is None:
        return f"# Sweep {spec.name}: no run has a finite {spec.metric}: no setting to train.\n"
    header = best_run_header(spec.name, best, spec.metric, command, setting=setting)
    config = best_run_config(spec, plan[best], *groups)
    return header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True)


@dataclass
class SweepTrainer:
    """What every run of a sweep trains on and reports to; ``run_ids``: each run's MLflow child run."""

    inputs: SweepInputs
    tracker: RunTracker
    choices_dir: str  # where plain runs keep their measured runtime choices (train.checkpoint_dir)
    train_function: TrainFunction
    run_ids: dict = field(default_factory=dict)

    def train(self, name: str, params: dict, overrides: dict) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
        """One run as a child run (ended FAILED when it raises), its model scored on the test split: its
        summary (with its ``mlflow_run_id``), training and evaluation histories."""
        inputs = self.inputs
        with self.tracker.child_run(name, child_run_params(params, overrides)) as run_id:
            self.run_ids[name] = run_id
            trained, history, evaluation, summary = self.train_function(
                inputs.tokenized,
                inputs.fingerprint,
                inputs.tokenizer,
                params,
                inputs.split_params,
                run_name=name,
                tracker=self.tracker,
                choices_dir=self.choices_dir,
            )
            model, scored = trained["model"], (params, inputs.split_params, inputs.report_params)
            scores = {
                **run_test_metrics(model, inputs.tokenizer, inputs.tokenized, *scored),
                **reference_scores(model, inputs.tokenizer, inputs.splits, *scored),
            }
            if scores:
                self.tracker.log_run_metrics(scores)
        return {**summary, **scores, "mlflow_run_id": run_id}, history, evaluation


def log_cv_metrics(table: pd.DataFrame, metric: str, tracker: RunTracker) -> None:
    """k-fold runs: the mean and spread over folds as ``cv/`` metrics of the sweep's run, and with a grid the
    setting they are of as ``cv/<parameter>`` parameters."""
    figures, setting = cv_metrics(table, metric), cv_setting(table, metric)
    if figures:
        tracker.log_run_metrics(figures)
    if setting:
        tracker.log_params({f"cv/{key}": value for key, value in setting.items()})


def run_test_metrics(
    model, tokenizer, tokenized, train_params: dict, split_params: dict, report_params: dict
) -> dict:
    """Test-split loss, perplexity, accuracy and top-k accuracy of a run's model (``test_*``)."""
    from fastlm.engine.evaluate.evaluation import EvalOptions, top_k_metric
    from fastlm.engine.runtime.environment import setup_runtime
    from fastlm.reporting.evaluation_run import evaluate_on_test

    if model is None or len(tokenized["test"]) == 0:
        return {}
    params, report = parse_train_params(train_params), parse_report_params(report_params)
    runtime = setup_runtime(params.runtime, seed=params.seed)
    result = evaluate_on_test(
        model,
        tokenizer,
        tokenized,
        settings=(params, parse_split_params(split_params).max_length, runtime),
        options=EvalOptions(
            analysis=True, max_batches=report.eval_max_batches, top_k=report.top_k, worst=1, pairs=1
        ),
    )
    keys = ("loss", "perplexity", "accuracy", top_k_metric(report.top_k))
    return {f"test_{key}": result.metrics[key] for key in keys}


def reference_scores(
    model, tokenizer, splits: pd.DataFrame, train_params: dict, split_params: dict, report_params: dict
) -> dict:
    """ROUGE-1/2/L F1 (``test_rouge*``) of a run's generations against the test split's references, and
    where its answers call tools their calls' scores (``test_tool_call_*``), as the report scores them
    (prompt/response data under ``report.references``; nothing otherwise)."""
    from fastlm.reporting.evaluation_run import pairs_to_score, score_reference_pairs

    if model is None:
        return {}
    references = parse_report_params(report_params).references
    pairs = pairs_to_score(splits, references, "corpus_splits")
    if pairs is None:
        return {}
    from fastlm.engine.runtime.environment import setup_runtime  # imports torch: after the checks above

    train, split = parse_train_params(train_params), parse_split_params(split_params)
    runtime = setup_runtime(train.runtime, seed=train.seed, said=True)  # run_test_metrics said it
    _, metrics = score_reference_pairs(
        {"model": model, "tokenizer": tokenizer}, pairs, references=references, split=split, runtime=runtime
    )
    keys = ("rouge1", "rouge2", "rougeL", "tool_call_name_accuracy", "tool_call_exact_match")
    return {f"test_{key}": metrics[key] for key in keys if key in metrics}
