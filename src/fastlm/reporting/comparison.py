"""Compare the experiment's training runs from MLflow: the parameters that differ, speed, loss, wall time."""

from __future__ import annotations

import json
import logging
import math
import re
from numbers import Number

import pandas as pd

log = logging.getLogger(__name__)
# The run's throughput over its timed steps (fastlm.engine.observe.rates.timed_rate), logged once by the train
# node; runs from before it have only the per-window metric, whose last value stands in.
SPEED = "metrics.real_tokens_per_s"
WINDOW_SPEED = "metrics.train/real_tokens_per_s"
VAL_LOSS = "metrics.eval/val_loss"
# The returned model's validation loss (early stopping: its best step's), logged by the train node; runs from
# before it have the last evaluation's alone.
MODEL_VAL_LOSS = "metrics.final_val_loss"
TRAIN_LOSS = "metrics.train/loss"
FINAL_TRAIN_LOSS = "metrics.final_train_loss"  # the train node's, from the summary
# The training's wall time (train_summary.json's, a resumed run's earlier processes counted), logged by the
# train node; runs from before it have none (their MLflow span held the split and the report too).
WALL_TIME = "metrics.wall_time_s"
# The run's name is its MLflow name (a sweep's child runs have no run_name parameter: the column would blank
# theirs); the torch build is the runtime's, not a setting; a resumed run's checkpoint path is its run name's
# folder (its resumed_from_step is shown).
NOT_COMPARED = ("params.run_name", "params.runtime.torch", "params.resumed_checkpoint")
# why a runtime setting was chosen (``runtime.precision_choice``, ``compile_choice``, ``float8_choice``,
# ``fused_linear_choice``): sentences with the timings measured, other in every run; the choices are compared
WHY_CHOSEN = "_choice"
# The parameter groups a run logs whole where it logs any of their keys (each node logs the groups it reads),
# leaving out the unset (null) ones alone: a key such a run lacks is unset there, a difference from a value.
SETTING_GROUPS = ("split", "train", "report")
# The step a resumed training went on from, logged by the train node where it resumed (nothing otherwise): a
# run that logged its train.* settings without it started fresh, a difference from one that resumed
RESUMED_STEP = "params.resumed_from_step"
# The train loss's label smoothing (the train loss is smoothed by it, validation and test losses plain)
SMOOTHING = "params.train.loss.label_smoothing"
# The step whose weights the run returned (early stopping's best, else the last) and the run's last step,
# logged by the train node: final_val_loss is the first's, final_train_loss the second's
MODEL_STEP, LAST_STEP = "metrics.model_step", "metrics.steps"
# The steps a run set out to train (logged by the train node; runs from before it have their train.max_steps
# alone): a run stopped before them (train.max_minutes, early stopping) shows the step it reached
PLANNED_STEPS, MAX_STEPS = "metrics.planned_steps", "params.train.max_steps"
# Test-split metrics logged by the report (``test_<name>``), shown in the comparison when a run has them.
TEST_METRICS = (
    "loss",
    "perplexity",
    "accuracy",
    "rouge1",
    "rouge2",
    "rougeL",
    "rouge1_precision",
    "rouge1_recall",
    "rouge2_precision",
    "rouge2_recall",
    "rougeL_precision",
    "rougeL_recall",
    "tool_call_name_accuracy",
    "tool_call_exact_match",
    "tool_call_spurious",
)
# and the top-k accuracy, named by its k (``report.top_k``): top5_accuracy, top10_accuracy, ...
TOP_K_ACCURACY = re.compile(r"top[1-9][0-9]*_accuracy")
COMPARED_TEST_METRICS = ("loss", "rouge1", "rouge2", "rougeL")
# How the report scored ROUGE (its decoding and max_new_tokens, report.references.rouge_tokenizer): settings
# of the report's run, set as tags (``test_<name>``) beside the figures on the training run; shown where runs
# differ
TEST_SETTINGS = ("rouge_decoding", "rouge_tokenizer")
# How many test samples the figures cover (``report.eval_max_batches`` / ``report.references.max_samples``
# cap them): logged with them, shown in the comparison where runs differ, after the figures they count.
TEST_SAMPLE_COUNTS = ("samples", "rouge_samples")
# The tokenized data a run trained and was evaluated on (the tokenizer, the split settings and the texts),
# logged by the train node: per-token losses of runs on other data do not compare.
DATA = "params.data.fingerprint"
# Its test split alone (``corpus.fingerprint.identity_of_test_split``), logged by the train node since it was
# recorded (older runs have none): a k-fold run (split.folds, part of DATA) on the texts of a run split
# without folds was evaluated on the same test rows. And the fold a run trained without (train.fold): two
# folds of one split trained on other rows.
TEST_DATA, FOLD = "params.data.test", "params.train.fold"
SAME, OTHER_TRAIN, OTHER = "same", "other train, same test", "other"


def compare_runs(runs: pd.DataFrame, limit: int = 20, current_run_id: str | None = None) -> pd.DataFrame:
    """One row per training run (newest first) from ``mlflow.search_runs`` output.

    Only parameters whose values differ among the runs that have them are shown (a report-only key missing
    from train-only runs is not a difference), as values (lists as ``a, b``), so "batch 8 vs 16" or "packed vs
    dynamic" is one look. ``real_tokens_per_s`` is the run's throughput over its timed steps, the figure of
    its own report; final_train_loss is the last step's, final_val_loss the returned model's step's, named
    where that matters (``_name_the_losses``); wall time is the training's (``WALL_TIME``). Test loss
    and ROUGE-1/2/L (F1) columns appear when at least one run has them (a report logged them), how the ROUGE
    was scored (``TEST_SETTINGS``) where runs differ in it. ``this run``
    marks ``current_run_id``; ``status`` appears where a run did not finish (``_unfinished_status``).
    """
    if runs.empty or not {SPEED, WINDOW_SPEED} & set(runs.columns):
        return pd.DataFrame(columns=["run_id", "run_name", "start_time"])
    runs = _numeric_metrics(runs)
    speed = runs.get(SPEED, pd.Series(math.nan, index=runs.index)).fillna(
        runs.get(WINDOW_SPEED, pd.Series(math.nan, index=runs.index))
    )
    runs = runs.assign(_speed=speed)
    runs = _newest_with(
        runs[runs["_speed"].notna()].sort_values("start_time", ascending=False), limit, current_run_id
    )
    # in their names' order: search_runs orders them as a set iterates, another order in each process
    params = {
        column: runs[column].map(param_value)
        for column in sorted(runs.columns)
        if column.startswith("params.")
        and not column.startswith(NOT_COMPARED)
        and not column.endswith(WHY_CHOSEN)
        and column != SMOOTHING
    }
    differing = [column for column, values in params.items() if _differs(column, values, runs)]
    table = pd.DataFrame(
        {
            "this run": ["◀" if run_id == current_run_id else "" for run_id in runs["run_id"]],
            "run_id": runs["run_id"].str.slice(0, 8),
            "run_name": runs.get("tags.mlflow.runName"),
            "start_time": _start_times(runs["start_time"]) if "start_time" in runs else None,
            "real_tokens_per_s": runs["_speed"],
            # the summary's (a run entered again with nothing to train logs no train/loss), else the last
            "final_train_loss": _first_present(runs, FINAL_TRAIN_LOSS, TRAIN_LOSS),
            "final_val_loss": _first_present(runs, MODEL_VAL_LOSS, VAL_LOSS),
            "wall_time_s": runs.get(WALL_TIME),
        }
    )
    _name_the_losses(table, runs)
    status = _unfinished_status(runs, current_run_id)
    if status is not None:
        table.insert(3, "status", status.to_numpy())
    for name in COMPARED_TEST_METRICS:
        column = f"metrics.test_{name}"
        if column in runs and runs[column].notna().any():
            table[f"test_{name}"] = runs[column]
    for name in TEST_SETTINGS:  # ROUGE generated or tokenized otherwise does not compare
        column = f"tags.test_{name}"
        if column in runs and runs[column].dropna().nunique() > 1:
            table[f"test_{name}"] = runs[column]
    for name in TEST_SAMPLE_COUNTS:
        column = f"metrics.test_{name}"
        if column in runs and runs[column].dropna().nunique() > 1:
            table[f"test_{name}"] = runs[column]
    for column in differing:
        table[column.removeprefix("params.")] = params[column]
    data = _same_data(runs, current_run_id)
    if data is not None:
        table.insert(table.columns.get_loc("real_tokens_per_s"), "data", data.to_numpy())
    return table.reset_index(drop=True)


def _start_times(starts: pd.Series) -> pd.Series:
    """Each run's start as text: in UTC, said (MLflow's times are UTC; the log lines beside the report are in
    the machine's local time); a time without a zone as it is."""
    if getattr(starts.dt, "tz", None) is None:
        return starts.dt.strftime("%Y-%m-%d %H:%M")
    return starts.dt.tz_convert("UTC").dt.strftime("%Y-%m-%d %H:%M UTC")


def _newest_with(runs: pd.DataFrame, limit: int, current_run_id: str | None) -> pd.DataFrame:
    """The ``limit`` first of ``runs`` (newest first), the reported run ``current_run_id`` among them where
    ``runs`` holds it (a report of an earlier training): it and the ``limit`` - 1 newest others."""
    newest = runs.head(limit)
    current = runs["run_id"] == current_run_id
    if current_run_id is None or not current.any() or (newest["run_id"] == current_run_id).any():
        return newest
    return runs[current | runs.index.isin(runs[~current].head(limit - 1).index)]


def _differs(column: str, values: pd.Series, runs: pd.DataFrame) -> bool:
    """Whether the parameter ``column`` (its ``values`` as read) differs among the runs that have it: for a
    key of a parameter group (``SETTING_GROUPS``), every run that logged a key of that group has it, a
    missing value being unset (MLflow logs no null: ``train.max_minutes`` 30 beside no time budget), and so is
    ``RESUMED_STEP`` for every run that logged its train settings (a run started fresh beside a resumed one);
    for any other, the runs holding a value."""
    group = "train" if column == RESUMED_STEP else column.removeprefix("params.").split(".", 1)[0]
    if column != RESUMED_STEP and (group not in SETTING_GROUPS or column.count(".") < 2):
        return values.dropna().nunique() > 1
    keys = [name for name in runs.columns if name.startswith(f"params.{group}.")]
    logged = runs[keys].notna().any(axis=1)
    return values[logged].map(lambda value: (value is not None, value)).nunique() > 1


def _same_data(runs: pd.DataFrame, current_run_id: str | None) -> pd.Series | None:
    """Per run, whether it trained on the tokenized data (``DATA``) and fold (``FOLD``) of the reported run
    (without one in the table, the newest run): ``same``; ``other train, same test`` where it trained on
    other rows (another fold, or data split with other ``split.folds``) but was evaluated on the same test
    split (``TEST_DATA`` equal, or the same data); ``other`` where the test split differs or is unknown (an
    older run's); ``""`` for a run that logged no data. None where every run's data and fold agree."""
    if DATA not in runs:
        return None
    data = runs[DATA].map(param_value)
    fold = runs[FOLD].map(param_value) if FOLD in runs else pd.Series(None, index=runs.index, dtype=object)
    test = runs[TEST_DATA].map(param_value) if TEST_DATA in runs else pd.Series(None, index=runs.index)
    known = data.notna()
    trained = pd.Series(list(zip(data, fold.where(fold.notna(), None), strict=True)), index=runs.index)
    if trained[known].nunique() < 2:
        return None
    current = known & (runs["run_id"] == current_run_id)
    reference = current.idxmax() if current.any() else known.idxmax()

    def judged(index) -> str:
        if not known[index]:
            return ""
        if trained[index] == trained[reference]:
            return SAME
        same_test = data[index] == data[reference] or (
            isinstance(test[index], str) and test[index] == test[reference]
        )
        return OTHER_TRAIN if same_test else OTHER

    return pd.Series([judged(index) for index in runs.index], index=runs.index)


def data_note(table: pd.DataFrame) -> str:
    """What the runs marked ``data: other`` (``compare_runs``: their losses do not compare) and ``data: other
    train, same test`` (their test figures compare, their train and validation losses do not) mean, one
    sentence each; "" where there are none."""
    if "data" not in table:
        return ""
    marked = table["this run"] == "◀" if "this run" in table else pd.Series(False, index=table.index)
    # the runs are judged against the reported run where it logged its data (``_same_data``), else the newest
    # run that did
    if (marked & (table["data"] != "")).any():
        reference = "this run"
    elif marked.any():
        reference = "the newest run that recorded its data"
    else:
        reference = "the newest run"
    said = []
    fold_runs = int((table["data"] == OTHER_TRAIN).sum())
    if fold_runs:
        one, its = fold_runs == 1, "its" if fold_runs == 1 else "their"
        said.append(
            f"{fold_runs} run{'' if one else 's'} (data: {OTHER_TRAIN}) trained on other rows than "
            f"{reference} (another fold: train.fold, or the same texts split with other split.folds) and "
            f"{'was' if one else 'were'} evaluated on the same test split (data.test): {its} test figures "
            f"compare with {reference}'s, {its} train and validation losses (on other rows) do not."
        )
    others = int((table["data"] == OTHER).sum())
    if others:
        one, its = others == 1, "its" if others == 1 else "their"
        said.append(
            f"{others} run{'' if one else 's'} (data: other) trained and {'was' if one else 'were'} "
            f"evaluated on other tokenized data than {reference} (another tokenizer, other split settings or "
            f"other texts: data.fingerprint): {its} losses do not compare with {reference}'s (a loss is per "
            "token of its own tokenizer, on its own texts), nor test figures on other texts."
        )
    return " ".join(said)


def _name_the_losses(table: pd.DataFrame, runs: pd.DataFrame) -> None:
    """In place: ``label_smoothing`` after final_train_loss where any run's train loss was smoothed (its
    validation and test losses are plain), and ``model_step`` / ``last_step`` after final_val_loss where a
    run's model is an earlier step's than its last (early stopping's best: final_val_loss is that step's,
    final_train_loss the last step's); ``last_step`` alone where a run stopped before the steps it planned
    (``_planned_steps``: a time budget's stop at step 4 of 300 read as a run of train.max_steps 300)."""
    smoothing = pd.to_numeric(runs.get(SMOOTHING, pd.Series(math.nan, index=runs.index)), errors="coerce")
    if (smoothing > 0).any():
        table.insert(table.columns.get_loc("final_train_loss") + 1, "label_smoothing", smoothing.to_numpy())
    if LAST_STEP not in runs:
        return
    last = pd.to_numeric(runs[LAST_STEP], errors="coerce")
    at = table.columns.get_loc("final_val_loss") + 1
    if MODEL_STEP in runs:
        model = pd.to_numeric(runs[MODEL_STEP], errors="coerce")
        if (model < last).any():
            table.insert(at, "model_step", model.to_numpy())
            table.insert(at + 1, "last_step", last.to_numpy())
            return
    if (last < _planned_steps(runs)).any():
        table.insert(at, "last_step", last.to_numpy())


def _planned_steps(runs: pd.DataFrame) -> pd.Series:
    """Per run, the steps it set out to train: its logged ``planned_steps``, else (a run from before it) its
    ``train.max_steps``; NaN where neither is known (a run of epochs from before)."""
    planned = pd.Series(math.nan, index=runs.index)
    for column in (PLANNED_STEPS, MAX_STEPS):
        if column in runs:
            planned = planned.fillna(pd.to_numeric(runs[column], errors="coerce"))
    return planned


def _unfinished_status(runs: pd.DataFrame, current_run_id: str | None) -> pd.Series | None:
    """Each run's MLflow status, lowercased (``finished``, ``failed``, ``killed``, ``running``), where a run
    other than the report's own (open while it writes) did not finish; None where all did. A run stopped part
    way and the run that resumed it share a name: this tells them apart."""
    if "status" not in runs:
        return None
    status = runs["status"].fillna("UNKNOWN").astype(str)
    others = status[runs["run_id"] != current_run_id]
    if (others == "FINISHED").all():
        return None
    return status.str.lower()


def param_value(text):
    """A logged parameter as a person reads it: JSON lists as ``a, b``, ``None``/missing as missing."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or text == "None":
        return None
    if isinstance(text, str) and text[:1] in "[{":
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, list):
            return ", ".join(
                item if isinstance(item, str) else json.dumps(item, ensure_ascii=False) for item in value
            )
    return text


def test_metric_values(metrics: dict) -> dict:
    """``test_<name>`` for the TEST_METRICS, top-k accuracy and TEST_SAMPLE_COUNTS in ``metrics``: what the
    run comparison reads back. A figure that is not finite (an infinite test loss) is NaN: logged over an
    earlier report's finite one, which would otherwise stay the training's in the comparison."""
    names = [
        name
        for name in metrics
        if name in TEST_METRICS or name in TEST_SAMPLE_COUNTS or TOP_K_ACCURACY.fullmatch(name)
    ]
    return {
        f"test_{name}": float(metrics[name]) if math.isfinite(metrics[name]) else math.nan
        for name in names
        if isinstance(metrics.get(name), Number) and not isinstance(metrics.get(name), bool)
    }


def test_scoring_tags(metrics: dict) -> dict:
    """``test_<name>`` for the TEST_SETTINGS in ``metrics`` (texts: tags, not metrics): how the ROUGE beside
    them was scored, read back by the run comparison; none where no ROUGE was scored."""
    return {f"test_{name}": metrics[name] for name in TEST_SETTINGS if isinstance(metrics.get(name), str)}


def _numeric_metrics(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with every metric a number: a value that reads as none (a run record holding text where MLflow
    keeps a number) is blank, said in one warning naming the runs and metrics, never shown as a figure."""
    runs = runs.copy()
    bad: dict[str, list[str]] = {}
    names = runs.get("tags.mlflow.runName", runs.get("run_id", pd.Series("?", index=runs.index)))
    for column in [column for column in runs.columns if column.startswith("metrics.")]:
        values = pd.to_numeric(runs[column], errors="coerce")
        for index in runs.index[values.isna() & runs[column].notna()]:
            bad.setdefault(str(names.get(index) or runs["run_id"].get(index, "?")), []).append(
                column.removeprefix("metrics.")
            )
        runs[column] = values.astype(float)
    if bad:
        log.warning(
            "run comparison: %s hold values that are no numbers; they are left blank",
            "; ".join(f"run {run}: {', '.join(metrics)}" for run, metrics in bad.items()),
        )
    return runs


def _first_present(runs: pd.DataFrame, *columns: str) -> pd.Series | None:
    """Per run, the first of ``columns`` it has a value in (None where no column exists)."""
    present = [runs[column] for column in columns if column in runs]
    if not present:
        return None
    values = present[0]
    for other in present[1:]:
        values = values.fillna(other)
    return values
