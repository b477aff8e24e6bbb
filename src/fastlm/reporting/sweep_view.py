"""The sweep view: one comparison table, every run's loss curve on one plot, and a one-paragraph verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fastlm.reporting.html_report import markdown_table

ROUGE_COLUMNS = ["test_rouge1", "test_rouge2", "test_rougeL"]  # prompt/response data only
SUMMARY_COLUMNS = ["final_train_loss", "final_val_loss", "test_loss", "test_accuracy", "test_top5_accuracy",
                   *ROUGE_COLUMNS, "real_tokens_per_s", "peak_memory_mb", "wall_time_s", "steps"]
LOWER_IS_BETTER = {"final_val_loss", "final_train_loss", "wall_time_s", "test_loss"}
NOTABLE_RATIO = 1.05  # a wall-time ratio below this is noise: the verdict claims no speed-up


def comparison_table(summaries: dict[str, dict], overrides: dict[str, dict], metric: str) -> pd.DataFrame:
    """One row per run: its name, the swept parameters, the summary figures (ROUGE when a run has it), and
    ``stopped`` ("stopped by time budget" for a run that ``max_minutes`` ended before its steps); best first."""
    columns = [column for column in SUMMARY_COLUMNS
               if column not in ROUGE_COLUMNS or any(column in summary for summary in summaries.values())]
    rows = [{"run": name, **{key: overrides[name].get(key) for key in _swept(overrides)},
             **{column: summaries[name].get(column) for column in columns},
             "stopped": f"stopped by {summaries[name]['stopped_by']}" if summaries[name].get("stopped_by") else ""}
            for name in summaries]
    table = pd.DataFrame(rows, columns=["run", *_swept(overrides), *columns, "stopped"])
    return table.sort_values(metric, ascending=metric in LOWER_IS_BETTER, na_position="last", kind="stable",
                             ignore_index=True)


def sweep_document(name: str, verdict_text: str, table: pd.DataFrame) -> str:
    """``sweep.md``: a title naming the sweep, the verdict paragraph, the comparison table (see
    :func:`read_sweep_document`)."""
    return f"# Sweep {name}\n\n{verdict_text}\n\n{markdown_table(table)}"


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
            ax.plot(evaluation["step"], evaluation["val_loss"], color=color, linestyle="--", label=f"{name} val")
    if ax.lines:
        ax.legend(fontsize="small")
    return fig


def verdict(table: pd.DataFrame, metric: str, histories: dict[str, pd.DataFrame],
            evaluations: dict[str, pd.DataFrame] | None = None) -> str:
    """One paragraph: the best run and its settings, the worst, which run reached a common validation loss
    soonest in wall time (or was fastest), which runs the time budget stopped, which runs diverged."""
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
            parts.append(f"{fastest['run']} was the fastest ({times.max() / times.min():.1f}x less wall time "
                         "than the slowest)")
    stopped = table[table["stopped"].fillna("").astype(bool)] if "stopped" in table else table.iloc[:0]
    if len(stopped):
        parts.append("the time budget (max_minutes) stopped " + ", ".join(
            f"{row['run']} at step {row['steps']}" for _, row in stopped.iterrows()))
    diverged = [name for name, history in histories.items() if _diverged(history)]
    if diverged:
        parts.append("diverged: " + ", ".join(f"{name} at step {step}" for name, step in
                                              ((name, _diverged(histories[name])) for name in diverged)))
    return "; ".join(parts) + "."


def _sooner(finite: pd.DataFrame, evaluations: dict, histories: dict, describe) -> str | None:
    """"X reached validation loss L N.Nx sooner in wall time than Y": L is the level every evaluated run
    reached (the highest final validation loss), the times are when each run's evaluation first got there."""
    times = {}
    for name in finite["run"]:
        evaluation, history = evaluations.get(name), histories.get(name)
        if evaluation is None or history is None or "val_loss" not in evaluation or "elapsed_s" not in history:
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
    row = lambda name: finite[finite["run"] == name].iloc[0]  # noqa: E731 - with "run": values keep their types
    return (f"{first} ({describe(row(first))}) reached validation loss {level:.4g} "
            f"{reached[last] / reached[first]:.1f}x sooner in wall time than {last} ({describe(row(last))})")


def _diverged(history: pd.DataFrame) -> int | None:
    """The first step whose loss is not finite or above twice the first logged loss, else None."""
    if history is None or "loss" not in history or history.empty:
        return None
    loss = pd.to_numeric(history["loss"], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(loss) | (loss > 2 * loss[0])
    return int(history["step"].iloc[int(np.argmax(bad))]) if bad.any() else None
