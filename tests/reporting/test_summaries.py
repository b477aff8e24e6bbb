"""One-row training and efficiency summaries from synthetic histories."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fastlm.reporting.summaries import after_warmup, efficiency_summary, end_of_run_losses, training_summary
from tests.support.reporting import SUMMARY, make_history

EVAL = pd.DataFrame(
    {
        "step": [25, 50],
        "val_loss": [3.5, 3.2],
        "val_perplexity": [33.1, 24.5],
        "val_target_tokens": [1000, 1000],
    }
)


def test_training_summary_is_one_row_with_the_summary_figures():
    frame = training_summary(SUMMARY, make_history(6), EVAL, run_id="abc")
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["run_id"] == "abc"
    assert (row["steps"], row["epochs"], row["effective_batch"], row["tokens_seen"]) == (50, 0.5, 32, 99999)
    assert (row["batching"], row["parameters"], row["device"]) == ("packed", 123456, "cpu")
    # a packed step of 32 rows holds ~505 samples: the table says both
    assert (row["rows_per_step"], row["samples_per_step"], row["tokens_per_step"]) == (32, 505.3, 9710.0)
    assert row["final_val_perplexity"] == pytest.approx(24.5)


def test_training_summary_perplexity_is_exp_of_val_loss_when_missing():
    summary = {k: v for k, v in SUMMARY.items() if k != "final_val_perplexity"}
    frame = training_summary(summary, make_history(3), pd.DataFrame())
    assert frame.loc[0, "final_val_perplexity"] == pytest.approx(math.exp(3.2))


def test_training_summary_tolerates_an_empty_summary():
    history = make_history(4)
    frame = training_summary({}, history, EVAL)
    row = frame.iloc[0]
    assert len(frame) == 1 and row["run_id"] is None and row["device"] is None
    assert row["steps"] == 30 and row["final_train_loss"] == pytest.approx(3.0)
    assert row["final_val_loss"] == pytest.approx(3.2) and row["final_val_perplexity"] == pytest.approx(24.5)
    assert row["wall_time_s"] == pytest.approx(4.0)


def test_efficiency_summary_excludes_the_warm_up_row():
    history = make_history(
        5,
        real_tokens_per_s=[10.0, 1000, 1000, 1000, 1000],
        step_time_s=[5.0, 0.1, 0.1, 0.1, 0.1],
        step_time_max_s=[5.0, 0.2, 0.3, 0.2, 0.2],
        data_wait_share=[0.9, 0.02, 0.02, 0.02, 0.02],
        peak_memory_mb=[900.0, 500, 500, 500, 500],
    )
    frame = efficiency_summary(SUMMARY, history, run_id="r1")
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["run_id"] == "r1" and row["windows"] == 4
    assert row["real_tokens_per_s"] == pytest.approx(1000)
    assert row["step_time_p50_s"] == pytest.approx(0.1) and row["step_time_max_s"] == pytest.approx(0.3)
    assert row["data_wait_share"] == pytest.approx(0.02)
    assert row["peak_memory_mb"] == pytest.approx(900)  # memory peaks count wherever they happen
    assert math.isnan(row["mfu"])  # CPU: never measured


def test_efficiency_summary_percentiles_of_the_window_step_times():
    times = [9.0, *np.arange(1, 101) / 100]  # warm-up, then 0.01 .. 1.00
    frame = efficiency_summary({}, make_history(101, step_time_s=times, step_time_max_s=times, mfu=0.4))
    row = frame.iloc[0]
    assert row["step_time_p50_s"] == pytest.approx(0.505)
    assert row["step_time_p90_s"] == pytest.approx(0.901)
    assert row["step_time_p99_s"] == pytest.approx(0.9901)
    assert row["mfu"] == pytest.approx(0.4)


def test_window_step_time_percentiles_never_exceed_the_slowest_step():
    """A history's window step times are wall time over steps, an evaluation or checkpoint save between them
    included; its ``step_time_max_s`` the slowest step's own time, without them. A run whose summary has no
    per-step figures (one entered again with nothing to train) falls back to the windows: the percentiles are
    bounded by the slowest step (no step is slower than it). Was: p90 0.56 s and p99 0.61 s beside a
    max of 0.59 s (the report of a resumed run with nothing to train)."""
    history = make_history(
        5, step_time_s=[1.27, 0.61, 0.54, 0.28, 0.21], step_time_max_s=[1.27, 0.55, 0.48, 0.2, 0.25]
    )
    row = efficiency_summary({}, history).iloc[0]
    assert row["step_time_max_s"] == pytest.approx(0.55)
    assert row["step_time_p50_s"] == pytest.approx(
        0.41
    )  # the median of 0.61, 0.54, 0.28, 0.21: below the max
    assert row["step_time_p90_s"] == pytest.approx(0.55) and row["step_time_p99_s"] == pytest.approx(0.55)
    assert (
        row["step_time_p50_s"] <= row["step_time_p90_s"] <= row["step_time_p99_s"] <= row["step_time_max_s"]
    )


def test_a_single_row_history_is_kept():
    history = make_history(1, real_tokens_per_s=777.0)
    assert len(after_warmup(history)) == 1
    assert efficiency_summary({}, history).loc[0, "real_tokens_per_s"] == pytest.approx(777)


def test_missing_columns_fall_back_to_the_summary_or_nan():
    history = make_history(3)[["step", "loss"]]
    frame = efficiency_summary({"real_tokens_per_s": 321.0, "data_wait_share": 0.2}, history)
    row = frame.iloc[0]
    assert row["real_tokens_per_s"] == pytest.approx(321) and row["data_wait_share"] == pytest.approx(0.2)
    assert math.isnan(row["step_time_p90_s"]) and math.isnan(row["peak_memory_mb"])
    assert len(efficiency_summary({}, pd.DataFrame())) == 1


def test_efficiency_summary_takes_the_runs_per_step_figures():
    """A run's summary holds percentiles of its single steps' times (engine: StepMetrics.step_figures); the
    window means of the history are only the fallback for runs that do not have them."""
    times = [9.0, *np.arange(1, 101) / 100]
    per_step = {
        "step_time_p50_s": 0.2,
        "step_time_p90_s": 0.7,
        "step_time_p99_s": 1.5,
        "step_time_max_s": 2.0,
        "data_wait_share": 0.05,
        "padding_efficiency": 0.8,
    }
    row = efficiency_summary(
        per_step, make_history(101, step_time_s=times, data_wait_share=0.5, padding_efficiency=0.3)
    ).iloc[0]
    assert {key: row[key] for key in per_step} == pytest.approx(per_step)


def test_the_end_of_run_losses_name_a_label_smoothed_train_loss():
    """The train loss of a label-smoothed run is the smoothed one (higher than the plain cross-entropy the
    validation loss is): the end-of-run line says so; without smoothing it reads as it always did."""
    plain = {"steps": 50, "final_train_loss": 3.0, "final_val_loss": 3.2, "label_smoothing": 0.0}
    assert end_of_run_losses(plain) == "train loss 3.0000, validation loss 3.2000"
    smoothed = {**plain, "label_smoothing": 0.1}
    assert end_of_run_losses(smoothed) == "train loss (label-smoothed 0.1) 3.0000, validation loss 3.2000"
    assert (
        end_of_run_losses({"steps": 5, "final_train_loss": 3.0}) == "train loss 3.0000, validation loss none"
    )


def test_the_end_of_run_losses_of_an_early_stopped_run_pair_the_kept_steps_figures():
    """The model of an early-stopped run is its best step's: the line gives that step's train and validation
    losses together, and the last step's apart, each named by its step (was: the last step's train loss
    beside the kept step's validation loss, as if of one model)."""
    summary = {
        "steps": 70,
        "final_train_loss": 1.9,  # the last step's (70)
        "model_train_loss": 2.1,  # the kept step's (40)
        "final_val_loss": 2.5,  # the kept step's
        "last_val_loss": 2.8,
        "label_smoothing": 0.1,
        "early_stopping": {"best_step": 40, "model_from_step": 40},
    }
    assert end_of_run_losses(summary) == (
        "the model is step 40's (early stopping's best): train loss (label-smoothed 0.1) 2.1000, validation "
        "loss 2.5000; the last step, 70: train loss (label-smoothed 0.1) 1.9000, validation loss 2.8000"
    )
    # the model is the last step's (its best): one pair, as without early stopping
    last = {**summary, "early_stopping": {"best_step": 70, "model_from_step": 70}, "label_smoothing": 0.0}
    assert end_of_run_losses(last) == "train loss 1.9000, validation loss 2.5000"


def test_a_resumed_runs_efficiency_table_says_which_steps_each_figure_covers():
    """A run of 12 steps resumed at step 6: the throughput is over the history's windows (steps 2-6 and
    8-12, each process's first step, marked ``warmup``, left out), the step times, data wait and padding
    over the resuming process's own steps after its first (8-12). The table showed both with no word of
    which steps they were."""
    history = make_history(
        6,
        step=[1, 3, 6, 7, 9, 12],
        warmup=[1, 0, 0, 1, 0, 0],
        real_tokens_per_s=[10.0, 1000, 1000, 20.0, 500, 500],
        step_time_s=[1.0, 0.1, 0.1, 2.0, 0.2, 0.2],
    )
    summary = {**SUMMARY, "steps": 12, "resumed_from_step": 6, "steps_trained": 6, "step_time_p50_s": 0.2}
    row = efficiency_summary(summary, history).iloc[0]
    # (1000 x 0.5 s + 500 x 1.0 s) / 1.5 s: the warm-up windows (steps 1 and 7) left out
    assert row["real_tokens_per_s"] == pytest.approx(2000 / 3, rel=1e-12)
    assert row["windows"] == 4
    assert row["rate_steps"] == "2-6, 8-12"
    assert row["step_figure_steps"] == "8-12"
    fresh = efficiency_summary({**SUMMARY, "steps": 50, "step_time_p50_s": 0.1}, make_history(6)).iloc[0]
    assert (fresh["rate_steps"], fresh["step_figure_steps"]) == ("2-50", "2-50")
