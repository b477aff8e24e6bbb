"""The sweep view: one comparison table, every run's loss curve on one plot, and a one-paragraph verdict."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fastlm.reporting.html_report import markdown_table

ROUGE_COLUMNS = ["test_rouge1", "test_rouge2", "test_rougeL"]  # prompt/response data only
# chat data whose test answers call tools (reporting.references.tool_call_scores)
TOOL_CALL_COLUMNS = ["test_tool_call_name_accuracy", "test_tool_call_exact_match"]
# shown only where a run has them
OPTIONAL_COLUMNS = {*ROUGE_COLUMNS, *TOOL_CALL_COLUMNS}
# The top-k accuracy's place among the columns: its name has the runs' k (report.top_k), test_top5_accuracy...
TOP_K = "test_top<k>_accuracy"
TOP_K_NAME = re.compile(r"test_top[1-9][0-9]*_accuracy")
SUMMARY_COLUMNS = [
    "final_train_loss",
    "final_val_loss",
    "test_loss",
    "test_accuracy",
    "test_top<k>_accuracy",
    *ROUGE_COLUMNS,
    *TOOL_CALL_COLUMNS,
    "real_tokens_per_s",
    "peak_memory_mb",
    "wall_time_s",
    "steps",
]
LOWER_IS_BETTER = {"final_val_loss", "final_train_loss", "model_train_loss", "wall_time_s", "test_loss"}
NOTABLE_RATIO = 1.05  # a wall-time ratio below this is noise: the verdict claims no speed-up
DATA_MARK = "data:"  # sweep.md's comment naming the data its runs trained on
FOLD = "train.fold"  # the swept key of k-fold runs (a sweep with folds: auto)
SMOOTHING = "train.loss.label_smoothing"  # swept: each run's train loss is smoothed by its own
# The ``stopped`` cell of a run that failed (it diverged or ran out of memory): the sweep went on without it,
# its figures are left out of the means, and the next sweep with the same file trains it again.
FAILED = "failed: "
STATISTICS = ("mean", "std", "min", "max")
STD = "sample, n - 1"  # the standard deviation over folds (pandas' default, ddof=1), everywhere it is given
# What the mean and spread over folds are given for: the model's quality, not its speed.
FOLD_METRICS = [
    "final_val_loss",
    "final_train_loss",
    "test_loss",
    "test_accuracy",
    "test_top<k>_accuracy",
    *ROUGE_COLUMNS,
    *TOOL_CALL_COLUMNS,
]


def comparison_table(summaries: dict[str, dict], overrides: dict[str, dict], metric: str) -> pd.DataFrame:
    """One row per run: its name, the swept parameters, the summary figures (ROUGE when a run has it), and
    ``stopped`` ("stopped by time budget" for a run that ``max_minutes`` ended before its steps, "failed:
    <error>" for a run that failed: a summary ``{"failed": "<error>"}``, no figures); best first."""
    columns = [
        column
        for column in _named(SUMMARY_COLUMNS, [key for summary in summaries.values() for key in summary])
        if column not in OPTIONAL_COLUMNS or any(column in summary for summary in summaries.values())
    ]
    rows = [
        {
            "run": name,
            **{key: overrides[name].get(key) for key in _swept(overrides)},
            **{column: summaries[name].get(column) for column in columns},
            "stopped": _stopped(summaries[name]),
        }
        for name in summaries
    ]
    table = pd.DataFrame(rows, columns=["run", *_swept(overrides), *columns, "stopped"])
    _name_the_losses(table, summaries)
    if metric not in table.columns:  # no run has it (each run's figure is under another name): unranked
        table[metric] = math.nan
    ranked = ranking_column(table, metric)
    return table.sort_values(
        ranked, ascending=ranked in LOWER_IS_BETTER, na_position="last", kind="stable", ignore_index=True
    )


MODEL_TRAIN_LOSS = "model_train_loss"


def ranking_column(table: pd.DataFrame, metric: str) -> str:
    """The column of ``table`` that ranks the runs by ``metric``: final_train_loss is the last step's, so
    where a run kept an earlier step's model (the table's ``model_train_loss``) the runs are ranked by the
    model's train loss, as final_val_loss is the model's."""
    return MODEL_TRAIN_LOSS if metric == "final_train_loss" and MODEL_TRAIN_LOSS in table else metric


def _name_the_losses(table: pd.DataFrame, summaries: dict[str, dict]) -> None:
    """In place, as the report's run comparison does: ``label_smoothing`` after final_train_loss where a run's
    train loss was smoothed and the sweep does not set it apart (its validation and test losses are plain),
    and ``model_step`` / ``last_step`` after final_val_loss where a run's model is an earlier step's than its
    last (early stopping's best: final_val_loss and the test figures are that step's, final_train_loss the
    last step's)."""
    runs = [summaries[name] for name in table["run"]]
    smoothing = pd.to_numeric(pd.Series([run.get("label_smoothing") for run in runs]), errors="coerce")
    if "final_train_loss" in table and SMOOTHING not in table and (smoothing > 0).any():
        table.insert(table.columns.get_loc("final_train_loss") + 1, "label_smoothing", smoothing.to_numpy())
    last = pd.to_numeric(pd.Series([run.get("steps") for run in runs]), errors="coerce")
    model = pd.Series([(run.get("early_stopping") or {}).get("model_from_step") for run in runs])
    model = pd.to_numeric(model, errors="coerce").fillna(last)
    if "final_val_loss" in table and (model < last).any():
        at = table.columns.get_loc("final_val_loss") + 1
        table.insert(at, "model_step", model.to_numpy())
        table.insert(at + 1, "last_step", last.to_numpy())
    if "final_train_loss" in table and (model < last).any():  # the model's step's train loss, before it
        # a summary without it (an older version's): the last step's, ranked as before
        kept = pd.to_numeric(pd.Series([run.get(MODEL_TRAIN_LOSS) for run in runs]), errors="coerce")
        kept = kept.fillna(pd.to_numeric(table["final_train_loss"], errors="coerce").reset_index(drop=True))
        table.insert(table.columns.get_loc("final_train_loss"), MODEL_TRAIN_LOSS, kept.to_numpy())


# How the verdict says which runs ended before their planned steps, by the summary's ``stopped_by``.
STOP_CAUSES = {
    "time budget": "the time budget (max_minutes) stopped ",
    "early stopping": "early stopping ended ",
}


def _named(columns: list[str], names) -> list[str]:
    """``columns`` with TOP_K replaced by the top-k accuracy names among ``names`` (none: left out)."""
    top_k = sorted(dict.fromkeys(name for name in names if TOP_K_NAME.fullmatch(name)), key=len)
    return [name for column in columns for name in (top_k if column == TOP_K else [column])]


def _stopped(summary: dict) -> str:
    if summary.get("failed"):
        return f"{FAILED}{summary['failed']}"
    return f"stopped by {summary['stopped_by']}" if summary.get("stopped_by") else ""


def sweep_document(
    name: str,
    verdict_text: str,
    table: pd.DataFrame,
    spread: pd.DataFrame | None = None,
    *,
    data: str | None = None,
) -> str:
    """``sweep.md``: a title naming the sweep, the verdict paragraph, the comparison table (see
    :func:`read_sweep_document`) and, for k-fold runs, the mean and spread over folds (:func:`fold_spread`),
    headed by the standard deviation it gives and each failed fold with its error. ``data``: the identity of
    the split data its runs trained on, kept as a comment the report reads (:func:`read_sweep_data`)."""
    document = f"# Sweep {name}\n\n{verdict_text}\n\n{markdown_table(table)}"
    if spread is not None:
        failures = _failure_lines(table)
        document += f"\n\n## Mean and spread over folds (std: {STD})\n\n"
        document += f"{failures}\n\n" if failures else ""
        document += markdown_table(spread)
    if data is not None:
        document += f"\n\n<!-- {DATA_MARK} {data} -->\n"
    return document


def fold_spread(table: pd.DataFrame, metric: str | None = None) -> pd.DataFrame | None:
    """Per setting of the other swept parameters, per metric (validation, train and test loss, test accuracy,
    ROUGE when present, and ``metric``, by its ``ranking_column``: final_train_loss as the models' own
    train losses where early stopping kept an earlier step): the number of folds, mean, standard deviation
    (n - 1), min and max over the folds; None unless the runs differ by ``train.fold``. Where a fold failed
    or has no value, also the folds ``planned`` and which are ``left out`` (the figures are over the others).
    The folds' models are not averaged or voted: each fold's figures are its own model's, the spread says how
    much they depend on the held-out rows."""
    if FOLD not in table.columns:
        return None
    metric = ranking_column(table, metric) if metric else metric  # final_train_loss: the models' own
    settings = _settings(table)
    rows = []
    for values, group in _setting_groups(table):
        failed = _failed(group)
        for column in _quality_metrics(table, metric):
            scores = pd.to_numeric(group[column], errors="coerce")
            left_out = [
                f"fold {_fold_number(fold)} {'failed' if is_failed else 'has no value'}"
                for fold, score, is_failed in zip(group[FOLD], scores, failed, strict=True)
                if pd.isna(score)
            ]
            aggregate = _aggregate(scores)
            rows.append(
                {
                    **values,
                    "metric": column,
                    "folds": aggregate.pop("count"),
                    **aggregate,
                    "planned": len(group),
                    "left out": ", ".join(left_out),
                }
            )
    spread = pd.DataFrame(rows, columns=[*settings, "metric", "folds", *STATISTICS, "planned", "left out"])
    return spread if spread["left out"].astype(bool).any() else spread.drop(columns=["planned", "left out"])


def cv_metrics(table: pd.DataFrame, metric: str) -> dict[str, float]:
    """The mean and spread over folds as MLflow metrics of the sweep's run: ``cv/<metric>_{mean,std,min,max}``
    for each metric of :func:`fold_spread` (the same figures as ``sweep.md``; std with n - 1), ``cv/folds``
    (the folds planned) and ``cv/folds_completed`` (those whose run did not fail: the figures are over them).
    With a grid, the figures of :func:`cv_setting`'s setting. Empty unless the runs differ by ``train.fold``.
    """
    spread = fold_spread(table, metric)
    if spread is None or spread.empty:
        return {}
    setting = cv_setting(table, metric)
    rows = spread[_matches(spread, setting)]
    runs = table[_matches(table, setting)]
    figures = {
        f"cv/{row['metric']}_{statistic}": float(row[statistic])
        for _, row in rows.iterrows()
        for statistic in STATISTICS
    }
    return {**figures, "cv/folds": len(runs), "cv/folds_completed": int((~_failed(runs)).sum())}


def cv_setting(table: pd.DataFrame, metric: str) -> dict:
    """The setting of the other swept parameters whose mean over folds :func:`cv_metrics` gives: the best by
    ``metric``'s mean among the settings with every fold (then the others), else the first; ``{}`` for a
    sweep over folds alone."""
    spread = fold_spread(table, metric)
    if spread is None or spread.empty:
        return {}
    best = _best_setting(spread, ranking_column(table, metric))
    row = best if best is not None else spread.iloc[0]
    return {key: row[key].item() if hasattr(row[key], "item") else row[key] for key in _settings(table)}


def best_run(table: pd.DataFrame, metric: str) -> str | None:
    """The run whose setting the sweep recommends: for k-fold runs the first run of the setting with the best
    mean of ``metric`` over folds (:func:`cv_setting`), else the best run by ``metric`` (``table`` is sorted
    best first); None where no run has a finite ``metric``."""
    if FOLD in table.columns:
        spread = fold_spread(table, metric)
        if spread is None or spread.empty or _best_setting(spread, ranking_column(table, metric)) is None:
            return None
        runs = table[_matches(table, cv_setting(table, metric))]
        return str(_in_plan_order(runs)["run"].iloc[0]) if len(runs) else None
    ranked = ranking_column(table, metric)
    finite = table[pd.to_numeric(table[ranked], errors="coerce").map(lambda value: math.isfinite(value))]
    return str(finite["run"].iloc[0]) if len(finite) else None


def best_setting_runs(table: pd.DataFrame, metric: str) -> list[str]:
    """The runs of the setting the sweep recommends, in the plan's order: of k-fold runs every fold's run of
    the setting with the best mean (:func:`best_run` is its first), else the best run alone; none where no
    run has a finite ``metric``."""
    best = best_run(table, metric)
    if best is None or FOLD not in table.columns:
        return [best] if best is not None else []
    return [str(run) for run in _in_plan_order(table[_matches(table, cv_setting(table, metric))])["run"]]


def fold_table(table: pd.DataFrame, run_ids: dict[str, str | None], metric: str) -> pd.DataFrame:
    """``sweep_folds.csv``: one row per fold (``row`` "fold": run name, MLflow ``run_id``, the other swept
    parameters, ``fold``, ``status`` completed or failed, the ``error`` of a failed run, and the metrics of
    :func:`fold_spread`), then per setting the rows ``count``, ``mean``, ``std`` (n - 1), ``min`` and ``max``
    over its folds (the figures of ``sweep.md``). A sweep without folds: one row per run (``row`` "run"), no
    aggregate."""
    metrics = _quality_metrics(table, ranking_column(table, metric))
    folds = FOLD in table.columns
    swept = _settings(table) if folds else [column for column in table.columns if column.startswith("train.")]
    rows = []
    for values, group in _setting_groups(table) if folds else [({}, _in_plan_order(table))]:
        for (_, run), failed in zip(group.iterrows(), _failed(group), strict=True):
            rows.append(
                {
                    "row": "fold" if folds else "run",
                    "run": run["run"],
                    "run_id": run_ids.get(run["run"]),
                    **{key: run[key] for key in swept},
                    **({"fold": _fold_number(run[FOLD])} if folds else {}),
                    "status": "failed" if failed else "completed",
                    "error": str(run["stopped"]).removeprefix(FAILED) if failed else "",
                    **{column: run[column] for column in metrics},
                }
            )
        if folds:
            figures = {
                column: _aggregate(pd.to_numeric(group[column], errors="coerce")) for column in metrics
            }
            for statistic in ("count", *STATISTICS):
                rows.append({"row": statistic, **values, **{key: figures[key][statistic] for key in metrics}})
    columns = ["row", "run", "run_id", *swept, *(["fold"] if folds else []), "status", "error", *metrics]
    frame = pd.DataFrame(rows, columns=columns)
    if folds:
        frame["fold"] = frame["fold"].astype("Int64")
    frame[metrics] = frame[metrics].apply(pd.to_numeric, errors="coerce")
    return frame


def _aggregate(scores: pd.Series) -> dict:
    """count, mean, std (n - 1), min and max of the values that are there: the one computation of the
    figures over folds (sweep.md, sweep_folds.csv, the cv/ metrics). Folds of one value have it as their mean
    and no spread (pandas' sum-then-divide gives 4/11 on three folds as 0.36363636363636360, std 6.8e-17)."""
    kept = pd.to_numeric(scores, errors="coerce").dropna()
    low, high = kept.min(), kept.max()
    if len(kept) > 1 and low == high:
        return {"count": len(kept), "mean": low, "std": 0.0, "min": low, "max": high}
    return {"count": len(kept), "mean": kept.mean(), "std": kept.std(), "min": low, "max": high}


def _settings(table: pd.DataFrame) -> list[str]:
    """The swept parameters other than the fold."""
    return [column for column in table.columns if column.startswith("train.") and column != FOLD]


def _in_plan_order(table: pd.DataFrame) -> pd.DataFrame:
    """``table``'s runs in the plan's order: by the number ending each run's name (``sweep-07``: two digits
    up to the 99th run, three from the 100th, so not by the name as text), then by the name."""
    number = pd.to_numeric(table["run"].astype(str).str.extract(r"(\d+)$", expand=False), errors="coerce")
    ordered = table.assign(_plan=number).sort_values(["_plan", "run"], kind="stable", na_position="last")
    return ordered.drop(columns="_plan")


def _setting_groups(table: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """(the setting of the other swept parameters, its runs in the plan's order) per setting; a list or
    mapping value (``train.model.lora.target_modules``) is grouped by its JSON text, given as it is."""
    settings = _settings(table)
    ordered = _in_plan_order(table)  # the plan's order
    if not settings:
        return [({}, ordered)]
    keys = [ordered[key].map(_setting_key).rename(key) for key in settings]
    return [
        ({key: group.iloc[0][key] for key in settings}, group)
        for _, group in ordered.groupby(keys, sort=False, dropna=False)
    ]


def _setting_key(value):
    """A swept value as a key to group or match by: a list or mapping by its JSON text (hashable)."""
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _matches(frame: pd.DataFrame, setting: dict) -> pd.Series:
    """Rows of ``frame`` with ``setting`` (a missing value matches a missing value; lists by their items)."""
    mask = pd.Series(True, index=frame.index)
    for key, value in setting.items():
        wanted = _setting_key(value)
        missing = not isinstance(wanted, str) and pd.isna(wanted)
        mask &= (frame[key].map(_setting_key) == wanted) | (frame[key].isna() & missing)
    return mask


def _quality_metrics(table: pd.DataFrame, metric: str | None) -> list[str]:
    """The metrics given over folds: model quality (``FOLD_METRICS``) and the sweep's ``metric``, where a run
    has them."""
    return [
        column
        for column in dict.fromkeys([*_named(FOLD_METRICS, table.columns), *([metric] if metric else [])])
        if column in table.columns and table[column].notna().any()
    ]


def _failed(table: pd.DataFrame) -> pd.Series:
    """Which runs of ``table`` failed (a ``stopped`` cell "failed: ...")."""
    if "stopped" not in table.columns:
        return pd.Series(False, index=table.index)
    return table["stopped"].fillna("").astype(str).str.startswith(FAILED)


def _fold_number(value) -> int | None:
    return int(value) if value is not None and not pd.isna(value) else None


def _failure_lines(table: pd.DataFrame) -> str:
    """One line per failed fold: its run, setting and error, and over how many folds its setting's figures
    are."""
    lines = []
    for values, group in _setting_groups(table):
        failed = _failed(group)
        named = ", ".join(f"{key.removeprefix('train.')} {value}" for key, value in values.items())
        for _, run in group[failed].iterrows():
            error = str(run["stopped"]).removeprefix(FAILED).rstrip(". ")
            where = f"{run['run']}, {named}" if named else run["run"]
            lines.append(
                f"Fold {_fold_number(run[FOLD])} ({where}) failed: {error}; "
                f"the mean and spread of its setting are over {int((~failed).sum())} of {len(group)} folds."
            )
    if lines:
        lines.append("The same sweep command again trains the failed runs (the finished ones are kept).")
    return "\n".join(lines)


def _best_setting(spread: pd.DataFrame, metric: str) -> pd.Series | None:
    """The spread row of ``metric`` with the best mean, a setting with every fold before one with folds left
    out; None when no setting has a mean of ``metric``."""
    rows = spread[(spread["metric"] == metric) & spread["mean"].notna()]
    if rows.empty:
        return None
    partial = rows["left out"].astype(bool) if "left out" in rows else pd.Series(False, index=rows.index)
    ranked = rows.assign(_partial=partial).sort_values(
        ["_partial", "mean"], ascending=[True, metric in LOWER_IS_BETTER], kind="stable"
    )
    return rows.loc[ranked.index[0]]


def _fold_sentence(spread: pd.DataFrame, metric: str) -> str | None:
    """ "Over k folds: <metric> mean m (std s, min a, max b)", for the best setting by mean when several
    ("Over k of n folds (fold i failed): ..." when folds are left out)."""
    best = _best_setting(spread, metric)
    if best is None:
        return None
    several = ((spread["metric"] == metric) & spread["mean"].notna()).sum() > 1
    named = ", ".join(f"{key.removeprefix('train.')} {best[key]}" for key in _settings(spread))
    figures = (
        f"{metric} mean {best['mean']:.4g} (std {best['std']:.4g}, min {best['min']:.4g}, "
        f"max {best['max']:.4g})"
    )
    left_out = best.get("left out") or ""
    lead = (
        f"Over {int(best['folds'])} of {int(best['planned'])} folds ({left_out}): "
        if left_out
        else f"Over {int(best['folds'])} folds: "
    )
    return lead + (f"{named} is best by {figures}" if several else figures)


def read_sweep_data(text: str) -> str | None:
    """The data identity a :func:`sweep_document` records (None: written before it did)."""
    found = re.search(rf"<!-- {DATA_MARK} (\S+) -->", text)
    return None if found is None else found.group(1)


def read_sweep_document(text: str) -> tuple[str, str]:
    """The sweep's name and verdict paragraph from a :func:`sweep_document`."""
    title, _, rest = text.partition("\n\n")
    return title.removeprefix("# Sweep ").strip(), rest.partition("\n\n")[0].strip()


def _swept(overrides: dict[str, dict]) -> list[str]:
    return list(dict.fromkeys(key for run in overrides.values() for key in run))


def loss_plot(
    histories: dict[str, pd.DataFrame],
    evaluations: dict[str, pd.DataFrame],
    smoothing: dict[str, float | None] | None = None,
) -> Figure:
    """Train loss (solid) and validation loss (dashed, when evaluated) of every run against the step; a
    run's train line named label-smoothed where ``smoothing`` (each run's summary's) says it was."""
    fig = Figure(figsize=(7.0, 3.5), dpi=110, layout="tight")
    ax = fig.add_subplot()
    ax.set_title("Sweep: loss per run")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    for index, (name, history) in enumerate(histories.items()):
        color = f"C{index % 10}"
        if "loss" in history and len(history):
            smoothed = (smoothing or {}).get(name)
            label = f"{name} train" + (f" (label-smoothed {smoothed:g})" if smoothed else "")
            ax.plot(history["step"], history["loss"], color=color, label=label)
        evaluation = evaluations.get(name)
        if evaluation is not None and "val_loss" in evaluation and len(evaluation):
            ax.plot(
                evaluation["step"], evaluation["val_loss"], color=color, linestyle="--", label=f"{name} val"
            )
    if ax.lines:
        ax.legend(fontsize="small")
    return fig


def verdict(
    table: pd.DataFrame,
    metric: str,
    histories: dict[str, pd.DataFrame],
    evaluations: dict[str, pd.DataFrame] | None = None,
    spread: pd.DataFrame | None = None,
) -> str:
    """One paragraph: for k-fold runs (``spread``, :func:`fold_spread`) first the mean and spread of
    ``metric`` over the folds; the best run and its settings, the worst, which run reached a common
    validation loss soonest in wall time (or was fastest), which runs failed (left out), which runs the
    time budget stopped, which runs diverged."""
    folds = _fold_sentence(spread, ranking_column(table, metric)) if spread is not None else None
    text = _runs_verdict(table, metric, histories, evaluations)
    return f"{folds}. {text}" if folds else text


def _runs_verdict(
    table: pd.DataFrame,
    metric: str,
    histories: dict[str, pd.DataFrame],
    evaluations: dict[str, pd.DataFrame] | None,
) -> str:
    metric = ranking_column(table, metric)
    swept = [column for column in table.columns if column.startswith("train.")]
    describe = lambda row: ", ".join(f"{key.removeprefix('train.')} {row[key]}" for key in swept)  # noqa: E731
    finite = table[table[metric].map(lambda value: value is not None and math.isfinite(float(value)))]
    if finite.empty:
        return f"No run of the sweep has a finite {metric}: every run diverged or was not evaluated."
    best, value = finite.iloc[0], float(finite.iloc[0][metric])
    tied = [str(run) for run in finite.loc[finite[metric].astype(float) == value, "run"]]
    taken = f"{best['run']} ({describe(best)}) is taken, first in the sweep's order"
    if len(tied) == len(finite) > 1:  # no run is better than another by the metric
        parts = [f"{_joined(tied)} tie at {metric} = {value:.4g}: none is better by it ({taken})"]
    elif len(tied) > 1:
        parts = [f"{_joined(tied)} tie as best by {metric} = {value:.4g} ({taken})"]
    else:
        parts = [f"{best['run']} ({describe(best)}) is best by {metric} = {value:.4g}"]
    if len(finite) > len(tied):
        last = finite.iloc[-1]
        parts.append(f"the worst, {last['run']} ({describe(last)}), has {float(last[metric]):.4g}")
    if len(finite) > 1 and FOLD not in table.columns:  # each fold validates on its own rows: no race
        sooner = _sooner(finite, evaluations or {}, histories, describe)
        times = (
            finite["wall_time_s"].astype(float) if "wall_time_s" in finite else pd.Series(dtype=float)
        ).dropna()
        if sooner:
            parts.append(sooner)
        elif len(times) > 1 and times.min() > 0 and times.max() / times.min() >= NOTABLE_RATIO:
            fastest = finite.loc[times.idxmin()]
            parts.append(
                f"{fastest['run']} was the fastest ({times.max() / times.min():.1f}x less wall time "
                "than the slowest)"
            )
    failed = _failed(table)
    stopped = (
        table[table["stopped"].fillna("").astype(bool) & ~failed] if "stopped" in table else table.iloc[:0]
    )
    if failed.any():
        parts.append(
            "failed (left out): "
            + ", ".join(
                f"{row['run']} ({str(row['stopped']).removeprefix(FAILED).split(':')[0]})"
                for _, row in table[failed].iterrows()
            )
        )
    for cause, said in STOP_CAUSES.items():  # the summary's stopped_by, in the verdict's words
        by = stopped[stopped["stopped"] == f"stopped by {cause}"]
        if len(by):
            parts.append(said + ", ".join(f"{row['run']} at step {row['steps']}" for _, row in by.iterrows()))
    diverged = [name for name, history in histories.items() if _diverged(history)]
    if diverged:
        parts.append(
            "diverged: "
            + ", ".join(
                f"{name} at step {step}"
                for name, step in ((name, _diverged(histories[name])) for name in diverged)
            )
        )
    if SMOOTHING in table.columns:
        parts.append(
            f"final_train_loss is smoothed by each run's {SMOOTHING} (not comparable between them); the "
            "validation and test losses are plain"
        )
    return "; ".join(parts) + "."


def _joined(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _sooner(finite: pd.DataFrame, evaluations: dict, histories: dict, describe) -> str | None:
    """ "X reached validation loss L N.Nx sooner in wall time than Y": L is the level every evaluated run
    reached (the highest final validation loss), the times are when each run's evaluation first got there."""
    times = {}
    for name in finite["run"]:
        evaluation, history = evaluations.get(name), histories.get(name)
        if (
            evaluation is None
            or history is None
            or "val_loss" not in evaluation
            or "elapsed_s" not in history
        ):
            continue
        times[name] = evaluation
    if len(times) < 2:
        return None
    level = max(float(frame["val_loss"].iloc[-1]) for frame in times.values())
    reached, logged = {}, set()
    for name, evaluation in times.items():
        first = evaluation.loc[evaluation["val_loss"] <= level + 1e-12].iloc[0]
        step = int(first["step"])
        own = pd.to_numeric(pd.Series([first.get("elapsed_s")]), errors="coerce").iloc[0]
        if math.isfinite(own):  # the evaluation's own time
            reached[name] = float(own)
            continue
        history = histories[name]
        before = history.loc[history["step"] <= step]
        reached[name] = float(before["elapsed_s"].iloc[-1]) if len(before) else math.nan
        if len(before) and int(before["step"].iloc[-1]) != step:  # logged before the evaluation's step
            logged.add(name)
    reached = {name: value for name, value in reached.items() if math.isfinite(value) and value > 0}
    if len(reached) < 2:
        return None
    first, last = min(reached, key=reached.get), max(reached, key=reached.get)
    if reached[last] / reached[first] < NOTABLE_RATIO:
        return None
    # with "run": values keep their types
    row = lambda name: finite[finite["run"] == name].iloc[0]  # noqa: E731
    said = (
        " (each evaluation's time is that of the last logged step at or before it: train.eval_every is not "
        "a multiple of train.log_every)"
        if logged & {first, last}
        else ""
    )
    return (
        f"{first} ({describe(row(first))}) reached validation loss {level:.4g} "
        f"{reached[last] / reached[first]:.1f}x sooner in wall time than {last} ({describe(row(last))}){said}"
    )


def _diverged(history: pd.DataFrame) -> int | None:
    """The first step whose loss is not finite or above twice the first logged loss, else None. Rows of steps
    without a target token (``target_tokens`` 0: no loss, NaN) are no divergence."""
    if history is None or "loss" not in history or history.empty:
        return None
    if "target_tokens" in history:
        history = history[pd.to_numeric(history["target_tokens"], errors="coerce").to_numpy() != 0]
        if history.empty:
            return None
    loss = pd.to_numeric(history["loss"], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(loss) | (loss > 2 * loss[0])
    return int(history["step"].iloc[int(np.argmax(bad))]) if bad.any() else None
