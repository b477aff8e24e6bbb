"""Figures of a training run, drawn from the ``history`` and ``eval_history`` tables.

Every function returns a :class:`matplotlib.figure.Figure` built directly (never through ``pyplot``), so
nothing is registered globally, no GUI backend is touched and the figure is freed with its last reference.
A missing or all-NaN column draws no line (the axes then say "no data"); rows whose value is NaN are left
out of a line, so ``Line2D.get_xdata()``/``get_ydata()`` hold only real points; a line of one point (a run
of one step) is drawn as a marker. If ``history`` has no
``step`` column, the row number (from 1) stands in for it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from fastlm.reporting.summaries import train_loss_name

FIGSIZE = (7.0, 3.5)
DPI = 110


def _new_figure(title: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="tight")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _points(frame: pd.DataFrame | None, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``column`` with NaN/non-numeric rows dropped; empty arrays if there is nothing."""
    if frame is None or column not in frame.columns or len(frame) == 0:
        return np.array([], dtype=float), np.array([], dtype=float)
    if "step" in frame.columns:
        steps = pd.to_numeric(frame["step"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    else:
        steps = np.arange(1, len(frame) + 1, dtype=float)
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    keep = np.isfinite(steps) & np.isfinite(values)
    return steps[keep], values[keep]


def _plot(ax: Axes, frame: pd.DataFrame | None, column: str, label: str, **style) -> bool:
    steps, values = _points(frame, column)
    if len(values) == 0:
        return False
    if len(values) == 1 and style.get("marker") is None:  # a line of one point draws nothing: mark it
        style = {**style, "marker": "o"}
    ax.plot(steps, values, label=label, **style)
    return True


def _finish(ax: Axes, drawn: int, *, legend: bool, from_zero: bool = False) -> None:
    if drawn == 0:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
        return
    if legend:
        ax.legend(loc="best", frameon=False)
    if from_zero:
        ax.set_ylim(bottom=0)


def loss_figure(
    history: pd.DataFrame | None, eval_history: pd.DataFrame | None, *, label_smoothing: float | None = None
) -> Figure:
    """Training loss (line) and validation loss (line with markers) against step; the training loss named
    label-smoothed where it was (``label_smoothing``, the summary's: the validation loss is plain)."""
    fig, ax = _new_figure("Loss", "loss")
    drawn = _plot(ax, history, "loss", train_loss_name(label_smoothing), color="C0", linewidth=1.5)
    drawn += _plot(ax, eval_history, "val_loss", "validation loss", color="C1", linewidth=1.5, marker="o")
    _finish(ax, drawn, legend=True)
    return fig


def throughput_figure(history: pd.DataFrame | None) -> Figure:
    """Real (non-padding) tokens/s and computed tokens/s (padding included) against step."""
    fig, ax = _new_figure("Throughput", "tokens/s")
    drawn = _plot(ax, history, "real_tokens_per_s", "real tokens/s", color="C0", linewidth=1.5)
    drawn += _plot(
        ax, history, "tokens_per_s", "computed tokens/s", color="C1", linewidth=1.5, linestyle="--"
    )
    ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    _finish(ax, drawn, legend=True, from_zero=True)
    return fig


def learning_rate_figure(history: pd.DataFrame | None) -> Figure:
    """Learning rate against step."""
    fig, ax = _new_figure("Learning rate", "learning rate")
    drawn = _plot(ax, history, "lr", "learning rate", color="C2", linewidth=1.5)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    _finish(ax, drawn, legend=False, from_zero=True)
    return fig


def memory_figure(history: pd.DataFrame | None) -> Figure:
    """Peak accelerator memory (MB) against step."""
    fig, ax = _new_figure("Peak memory", "peak memory (MB)")
    drawn = _plot(ax, history, "peak_memory_mb", "peak memory (MB)", color="C3", linewidth=1.5)
    _finish(ax, drawn, legend=False, from_zero=True)
    return fig


def tune_figure(
    trials: pd.DataFrame, chosen: int | None, *, ok: str = "ok", chosen_mode: str | None = None
) -> Figure:
    """The tune pipeline's trials table (one row per trial: ``micro_batch_size``, ``status``,
    ``real_tokens_per_s``, ``peak_memory_mb``, and ``mode`` when several batching modes were measured): real
    tokens/s (solid) and peak memory (dotted) against micro-batch size, one colour per mode, each trial whose
    status is not ``ok`` (the cliff, out of memory) marked by a dashed line, ``chosen`` (of ``chosen_mode``)
    by a star."""
    figure = Figure(figsize=FIGSIZE, dpi=DPI)
    speed = figure.add_subplot()
    memory = speed.twinx()
    trials = trials if "mode" in trials.columns else trials.assign(mode=chosen_mode or "")
    measured = trials[trials["real_tokens_per_s"].notna()] if len(trials) else trials
    colours = ("tab:blue", "tab:orange", "tab:purple")
    for index, (mode, rows) in enumerate(measured.groupby("mode", sort=False) if len(measured) else ()):
        label = f" ({mode})" if mode else ""
        speed.plot(
            rows["micro_batch_size"].tolist(),
            rows["real_tokens_per_s"].tolist(),
            marker="o",
            color=colours[index % len(colours)],
            label=f"real tokens/s{label}",
        )
        memory.plot(
            rows["micro_batch_size"].tolist(),
            rows["peak_memory_mb"].tolist(),
            marker="s",
            linestyle=":",
            color=colours[index % len(colours)],
            label=f"peak memory{label}",
        )
    speed.set_xscale("log", base=2)
    speed.set_xlabel("micro-batch size")
    speed.set_ylabel("real tokens/s (solid)")
    memory.set_ylabel("peak memory, MB (dotted)")
    for row in trials.itertuples() if len(trials) else ():
        if row.status != ok:
            speed.axvline(row.micro_batch_size, color="black", linestyle="--", linewidth=1)
            speed.annotate(
                f"{row.mode} {row.status}".strip(),
                (row.micro_batch_size, speed.get_ylim()[1]),
                fontsize=8,
                ha="right",
                va="top",
                rotation=90,
            )
    if chosen is not None:
        rows = measured[
            (measured["micro_batch_size"] == chosen)
            & ((measured["mode"] == chosen_mode) if chosen_mode else True)
        ]
        speed.plot(
            [chosen],
            rows["real_tokens_per_s"].tolist()[:1],
            marker="*",
            markersize=14,
            color="tab:green",
            linestyle="none",
            label="chosen",
        )
    if speed.get_lines():
        speed.legend(loc="lower right", fontsize=8)
    speed.set_title("Throughput and memory against micro-batch size")
    figure.tight_layout()
    return figure
