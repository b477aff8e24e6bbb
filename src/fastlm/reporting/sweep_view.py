"""The sweep view: one comparison table, every run's loss curve on one plot, and a one-paragraph verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fastlm.reporting.html_report import markdown_table

ROUGE_COLUMNS = ["test_rouge1", "test_rouge2", "test_rougeL"]  # prompt/response data only
SUMMARY_COLUMNS = [
    "final_train_loss",
    "final_val_loss",
    "test_loss",
    "test_accuracy",
    "test_top5_accuracy",
    *ROUGE_COLUMNS,
    "real_tokens_per_s",
    "peak_memory_mb",
    "wall_time_s",
    "steps",
]
LOWER_IS_BETTER = {"final_val_loss", "final_train_loss", "wall_time_s", "test_loss"}
NOTABLE_RATIO = 1.05  # a wall-time ratio below this is noise: the verdict claims no speed-up
FOLD = "train.fold"  # the swept key of k-fold runs (a sweep with folds: auto)
# What the mean and spread over folds are given for: the model's quality, not its speed.
FOLD_METRICS = [
    "final_val_loss",
    "final_train_loss",
    "test_loss",
    "test_accuracy",
    "test_top5_accuracy",
    *ROUGE_COLUMNS,
]


def comparison_table(summaries: dict[str, dict], overrides: dict[str, dict], metric: str) -> pd.DataFrame:
    """One row per run: its name, the swept parameters, the summary figures (ROUGE when a run has it), and
    ``stopped`` ("stopped by time budget" for a run that ``max_minutes`` ended before its steps); best
    first."""
    columns = [
        column
        for column in SUMMARY_COLUMNS
        if column not in ROUGE_COLUMNS or any(column in summary for summary in summaries.values())
    ]
    rows = [
        {
            "run": name,
            **{key: overrides[name].get(key) for key in _swept(overrides)},
            **{column: summaries[name].get(column) for column in columns},
            "stopped": f"stopped by {summaries[name]['stopped_by']}"
            if summaries[name].get("stopped_by")
            else "",
        }
        for name in summaries
    ]
    table = pd.DataFrame(rows, columns=["run", *_swept(overrides), *columns, "stopped"])
    return table.sort_values(
        metric, ascending=metric in LOWER_IS_BETTER, na_position="last", kind="stable", ignore_index=True
    )


def sweep_document(
    name: str, verdict_text: str, table: pd.DataFrame, spread: pd.DataFrame | None = None
) -> str:
    """``sweep.md``: a title naming the sweep, the verdict paragraph, the comparison table (see
    :func:`read_sweep_document`) and, for k-fold runs, the mean and spread over folds
    (:func:`fold_spread`)."""
    document = f"# Sweep {name}\n\n{verdict_text}\n\n{markdown_table(table)}"
    if spread is not None:
        document += f"\n\n## Mean and spread over folds\n\n{markdown_table(spread)}"
    return document


def fold_spread(table: pd.DataFrame, metric: str | None = None) -> pd.DataFrame | None:
    """Per setting of the other swept parameters, per metric (validation, train and test loss, test accuracy,
    ROUGE when present, and ``metric``): the number of folds, mean, standard deviation (n - 1), min and max
    over the folds; None unless the runs differ by ``train.fold``. The folds' models are not averaged or
    voted: each fold's figures are its own model's, the spread says how much they depend on the held-out
    rows."""
    if FOLD not in table.columns:
        return None
    settings = [column for column in table.columns if column.startswith("train.") and column != FOLD]
    metrics = [
        column
        for column in dict.fromkeys([*FOLD_METRICS, *([metric] if metric else [])])
        if column in table.columns and table[column].notna().any()
    ]
    ordered = table.sort_values("run", kind="stable")  # the plan's order
    rows = []
    for key, group in ordered.groupby(settings, sort=False, dropna=False) if settings else [((), ordered)]:
        values = dict(zip(settings, key if isinstance(key, tuple) else (key,), strict=True))
        for column in metrics:
            scores = pd.to_numeric(group[column], errors="coerce").dropna()
            rows.append(
                {
                    **values,
                    "metric": column,
                    "folds": len(scores),
                    "mean": scores.mean(),
                    "std": scores.std(),
                    "min": scores.min(),
                    "max": scores.max(),
                }
            )
    return pd.DataFrame(rows, columns=[*settings, "metric", "folds", "mean", "std", "min", "max"])


def _fold_sentence(spread: pd.DataFrame, metric: str) -> str | None:
    """ "Over k folds: <metric> mean m (std s, min a, max b)", for the best setting by mean when several."""
    rows = spread[(spread["metric"] == metric) & spread["mean"].notna()]
    if rows.empty:
        return None
    best = rows.sort_values("mean", ascending=metric in LOWER_IS_BETTER, kind="stable").iloc[0]
    settings = [column for column in spread.columns if column.startswith("train.")]
    named = ", ".join(f"{key.removeprefix('train.')} {best[key]}" for key in settings)
    figures = (
        f"{metric} mean {best['mean']:.4g} (std {best['std']:.4g}, min {best['min']:.4g}, "
        f"max {best['max']:.4g})"
    )
    lead = f"Over {int(best['folds'])} folds: "
    return lead + (f"{named} is best by {figures}" if len(rows) > 1 else figures)


def read_sweep_document(text: str) -> tuple[str, str]:
    """The sweep's name and verdict paragraph from a :func:`sweep_document`."""
    title, _, rest = text.partition("\n\n")
    return title.removeprefix("# Sweep ").strip(), rest.partition("\n\n")[0].strip()


def _swept(overrides: dict[str, dict]) -> list[str]:
    return list(dict.fromkeys(key for run in overrides.values() for key in run))


def loss_plot(histories: dict[str, pd.DataFrame], evaluations: dict[str, pd.DataFrame]) -> Figure:
    """Train loss (solid) and validation loss (dashed, when evaluated) of every run against the step."""
    fig = Figure(figsize=(7.0, 3.5), dpi=110, layout="tight")
    ax = fig.add_subplot()
    ax.set_title("Sweep: loss per run")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    for index, (name, history) in enumerate(histories.items()):
        color = f"C{index % 10}"
        if "loss" in history and len(history):
            ax.plot(history["step"], history["loss"], color=color, label=f"{name} train")
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
    validation loss soonest in wall time (or was fastest), which runs the time budget stopped, which runs
    diverged."""
    folds = _fold_sentence(spread, metric) if spread is not None else None
    text = _runs_verdict(table, metric, histories, evaluations)
    return f"{folds}. {text}" if folds else text


def _runs_verdict(
    table: pd.DataFrame,
    metric: str,
    histories: dict[str, pd.DataFrame],
    evaluations: dict[str, pd.DataFrame] | None,
) -> str:
    swept = [column for column in table.columns if column.startswith("train.")]
    describe = lambda row: ", ".join(f"{key.removeprefix('train.')} {row[key]}" for key in swept)  # noqa: E731
    finite = table[table[metric].map(lambda value: value is not None and math.isfinite(float(value)))]
    if finite.empty:
        return f"No run of the sweep has a finite {metric}: every run diverged or was not evaluated."
    best = finite.iloc[0]
    parts = [f"{best['run']} ({describe(best)}) is best by {metric} = {float(best[metric]):.4g}"]
    if len(finite) > 1:
        last = finite.iloc[-1]
        parts.append(f"the worst, {last['run']} ({describe(last)}), has {float(last[metric]):.4g}")
        sooner = _sooner(finite, evaluations or {}, histories, describe)
        times = finite["wall_time_s"].astype(float)
        fastest = finite.loc[times.idxmin()]
        if sooner:
            parts.append(sooner)
        elif times.min() > 0 and times.max() / times.min() >= NOTABLE_RATIO:
            parts.append(
                f"{fastest['run']} was the fastest ({times.max() / times.min():.1f}x less wall time "
                "than the slowest)"
            )
    stopped = table[table["stopped"].fillna("").astype(bool)] if "stopped" in table else table.iloc[:0]
    if len(stopped):
        parts.append(
            "the time budget (max_minutes) stopped "
            + ", ".join(f"{row['run']} at step {row['steps']}" for _, row in stopped.iterrows())
        )
    diverged = [name for name, history in histories.items() if _diverged(history)]
    if diverged:
        parts.append(
            "diverged: "
            + ", ".join(
                f"{name} at step {step}"
                for name, step in ((name, _diverged(histories[name])) for name in diverged)
            )
        )
    return "; ".join(parts) + "."


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
    reached = {}
    for name, evaluation in times.items():
        step = int(evaluation.loc[evaluation["val_loss"] <= level + 1e-12, "step"].iloc[0])
        history = histories[name]
        before = history.loc[history["step"] <= step, "elapsed_s"]
        reached[name] = float(before.iloc[-1]) if len(before) else math.nan
    reached = {name: value for name, value in reached.items() if math.isfinite(value) and value > 0}
    if len(reached) < 2:
        return None
    first, last = min(reached, key=reached.get), max(reached, key=reached.get)
    if reached[last] / reached[first] < NOTABLE_RATIO:
        return None
    # with "run": values keep their types
    row = lambda name: finite[finite["run"] == name].iloc[0]  # noqa: E731
    return (
        f"{first} ({describe(row(first))}) reached validation loss {level:.4g} "
        f"{reached[last] / reached[first]:.1f}x sooner in wall time than {last} ({describe(row(last))})"
    )


def _diverged(history: pd.DataFrame) -> int | None:
    """The first step whose loss is not finite or above twice the first logged loss, else None."""
    if history is None or "loss" not in history or history.empty:
        return None
    loss = pd.to_numeric(history["loss"], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(loss) | (loss > 2 * loss[0])
    return int(history["step"].iloc[int(np.argmax(bad))]) if bad.any() else None
