"""The Recorder and run_summary, driven directly: the rows the callbacks (live MLflow metrics) receive are
exactly the history rows, the row flushed before a checkpoint included, and the summary's figures follow from
the state and the metrics they are given."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.engine.observe.health import NonFiniteLossError
from fastlm.engine.observe.metrics import StepMetrics
from fastlm.engine.observe.progress import Progress
from fastlm.engine.train.records import Recorder, run_summary
from fastlm.engine.train.state import TrainState
from fastlm.engine.train.step import StepResult

VOCAB = 64


def recorder(state: TrainState, *, log_every: int = 3, total_steps: int = 7):
    """A Recorder on the CPU with a callback that keeps what it receives."""
    received: list[tuple[str, dict]] = []
    metrics = StepMetrics("cpu", total_steps=total_steps)
    rec = Recorder(
        state,
        metrics,
        Progress(total_steps, quiet=True),
        [lambda kind, row: received.append((kind, row))],
        log_every=log_every,
        total_steps=total_steps,
        first_loss={"len_vocab": VOCAB, "from_scratch": True},
    )
    return rec, received


def run_step(rec: Recorder, *, loss_sum: float, targets: int, position: dict | None = None) -> None:
    """One optimizer step as the loop records it: the state's step advanced, then ``Recorder.step``."""
    rec.state.step += 1
    result = StepResult(
        loss_sum=torch.tensor(loss_sum), target_tokens=targets, grad_norm=torch.tensor(1.0), lr=0.1
    )
    rec.step(
        result,
        real_tokens=targets + 1,
        computed_tokens=2 * targets,
        samples=2,
        position=position or {"epoch": 0, "batch_in_epoch": 2 * rec.state.step},
    )


def test_flushed_rows_are_the_history_rows_the_callbacks_receive():
    state = TrainState()
    rec, received = recorder(state, log_every=3, total_steps=7)
    # per step (loss_sum, targets): exact binary fractions so the window means are exact
    steps = [(4.0, 1), (6.0, 3), (12.0, 3), (1.0, 1), (1.0, 1), (2.0, 2), (8.0, 2)]
    for loss_sum, targets in steps:
        run_step(rec, loss_sum=loss_sum, targets=targets)
    # the first step, every log_every-th step and the last one
    assert [row["step"] for row in state.history] == [1, 3, 6, 7]
    assert [kind for kind, _ in received] == ["train"] * 4
    assert [row for _, row in received] == state.history
    assert all(sent is kept for (_, sent), kept in zip(received, state.history, strict=True))
    # each row is the mean over its own window of steps (summed loss / summed targets), not a mean of means
    assert [row["loss"] for row in state.history] == [4.0, 18.0 / 6, 4.0 / 4, 8.0 / 2]
    assert state.history[2]["batch_in_epoch"] == 12 and state.history[2]["epoch"] == 0


def test_the_row_before_a_checkpoint_is_flushed_once_and_sent_like_any_other():
    state = TrainState()
    rec, received = recorder(state, log_every=3, total_steps=7)
    for _ in range(4):  # steps 1..4: rows at 1 and 3, step 4 pending
        run_step(rec, loss_sum=2.0, targets=1)
    before_save = rec.flush({"epoch": 0, "batch_in_epoch": 8})  # what the loop calls before writing step 4
    assert before_save is not None and before_save["step"] == 4 and before_save["batch_in_epoch"] == 8
    assert state.history[-1] is before_save and received[-1] == ("train", before_save)
    assert rec.flush({"epoch": 0, "batch_in_epoch": 8}) is None  # nothing pending: no duplicate row
    assert len(received) == len(state.history) == 3
    run_step(rec, loss_sum=3.0, targets=1)
    run_step(rec, loss_sum=5.0, targets=1)  # step 6 logs the window of steps 5-6 only
    assert state.history[-1]["step"] == 6 and state.history[-1]["loss"] == 4.0
    assert [row for _, row in received] == state.history


def test_an_evaluation_row_is_kept_and_sent_as_eval():
    state = TrainState(step=5)
    rec, received = recorder(state)
    row = rec.evaluation({"loss": 1.5, "perplexity": 4.48, "target_tokens": 120}, seconds=0.25)
    assert row == {
        "step": 5,
        "val_loss": 1.5,
        "val_perplexity": 4.48,
        "val_target_tokens": 120,
        "eval_s": 0.25,
    }
    assert state.eval_history == [row] and received == [("eval", row)]


def test_a_non_finite_row_stops_the_run_naming_the_last_good_checkpoint_and_is_not_sent():
    state = TrainState(last_good=Path("ckpt/checkpoint-00000002"))
    rec, received = recorder(state)
    with pytest.raises(NonFiniteLossError, match="checkpoint-00000002"):
        run_step(rec, loss_sum=float("nan"), targets=1)  # the first step's row is flushed at once
    assert received == [] and state.history == []


def test_run_summary_figures_on_a_hand_made_state(tmp_path):
    params = parse_train_params(
        {
            "batching": {"mode": "packed", "micro_batch_size": 4, "gradient_accumulation_steps": 2},
            "checkpoint_dir": str(tmp_path),
            "runtime": {"device": "cpu"},
        }
    )
    history = [
        {"step": 1, "loss": 4.0, "step_time_s": 2.0, "real_tokens_per_s": 100.0, "peak_memory_mb": 10.0},
        {"step": 5, "loss": 3.0, "step_time_s": 1.0, "real_tokens_per_s": 200.0, "peak_memory_mb": 30.0},
        {"step": 10, "loss": 2.5, "step_time_s": 0.5, "real_tokens_per_s": 400.0, "peak_memory_mb": 20.0},
    ]
    state = TrainState(
        step=10,
        tokens_seen=5000,
        history=history,
        first_step=2,
        resumed_from=tmp_path / "c-2",
        eval_history=[
            {"step": 2, "val_loss": 3.6, "val_perplexity": 36.6, "eval_s": 9.0},  # the earlier process's
            {"step": 5, "val_loss": 3.2, "val_perplexity": 24.5, "eval_s": 1.5},
            {"step": 10, "val_loss": 2.7, "val_perplexity": 14.9, "eval_s": 0.75},
        ],
        backoffs=[{"step": 3, "micro_batch_size": 2}],
    )
    metrics = StepMetrics("cpu", total_steps=10, flops_per_token=6e3)
    metrics.step_times = [5.0, 1.0, 2.0, 3.0]  # the first (compile) left out of the step figures
    metrics.step_compile_s = [4.5, 0.0, 0.0, 0.0]  # torch.compile's seconds, apart from the step times
    metrics.compile_s = 4.5
    metrics.step_data_waits = [1.0, 0.5, 0.5, 2.0]
    metrics.step_real_tokens = [10.0, 30.0, 30.0, 30.0]
    metrics.step_computed_tokens = [20.0, 40.0, 40.0, 40.0]
    metrics.outside_steps_s = 7.25  # evaluations and saves between the steps
    summary = run_summary(
        state,
        metrics,
        total_steps=10,
        epochs=2.5,
        wall=12.34567,
        n_params=1234,
        params=params,
        world_size=3,
    )
    # timed rate: step 1's window left out; windows weigh by steps x step time (4 x 1.0 s, 5 x 0.5 s)
    expected_rate = (200.0 * 4 + 400.0 * 2.5) / 6.5
    assert summary["real_tokens_per_s"] == pytest.approx(expected_rate, rel=1e-12)
    assert summary | {"real_tokens_per_s": None} == {
        "steps": 10,
        "epochs": 2.5,
        "wall_time_s": 12.346,
        "final_train_loss": 2.5,
        "final_val_loss": 2.7,
        "final_val_perplexity": 14.9,
        "effective_batch": 4 * 2 * 3,
        "batching": "packed",
        "parameters": 1234,
        "real_tokens_per_s": None,
        "step_time_p50_s": 2.0,
        "step_time_p90_s": pytest.approx(2.8),
        "step_time_p99_s": pytest.approx(2.98),
        "step_time_max_s": 3.0,
        "data_wait_share": 3.0 / 6.0,
        "padding_efficiency": 90.0 / 120.0,
        "steady_real_tokens_per_s": 90.0 / 6.0,  # the steps after the first over their own time
        "outside_steps_s": 7.25,
        "eval_s": 2.25,  # this process's evaluations (steps 5 and 10), part of outside_steps_s
        "oom_failed_s": 0.0,  # no attempt ran out of memory
        "peak_memory_mb": 30.0,
        "tokens_seen": 5000,
        "flops_per_token": 6e3,
        "first_step_s": 9.5,  # the step and its compile
        "compile_s": 4.5,
        "compile_probe_s": 0.0,  # nothing compiled before the first step
        "steps_trained": 8,
        "resumed_from": str(tmp_path / "c-2"),
        "resumed_from_step": 2,
        "world_size": 3,
        "oom_backoffs": [{"step": 3, "micro_batch_size": 2}],
    }


def test_run_summary_of_a_run_without_rows_has_no_figures(tmp_path):
    params = parse_train_params({"checkpoint_dir": str(tmp_path), "runtime": {"device": "cpu"}})
    summary = run_summary(
        TrainState(),
        StepMetrics("cpu"),
        total_steps=1,
        epochs=1.0,
        wall=0.0,
        n_params=1,
        params=params,
        world_size=1,
    )
    assert summary["final_train_loss"] is None and summary["real_tokens_per_s"] is None
    assert summary["peak_memory_mb"] is None and summary["first_step_s"] is None
    assert summary["resumed_from"] is None and summary["resumed_from_step"] is None


def test_a_window_without_target_tokens_is_said_and_trains_on_never_called_a_divergence(caplog):
    state = TrainState(last_good=Path("ckpt/checkpoint-00000002"))
    rec, received = recorder(state, log_every=2, total_steps=6)
    with caplog.at_level("WARNING"):
        run_step(rec, loss_sum=0.0, targets=0)  # step 1 alone: every sample one token long
        run_step(rec, loss_sum=0.0, targets=0)
        run_step(rec, loss_sum=12.0, targets=3)  # a window holding targets: their mean alone
        run_step(rec, loss_sum=0.0, targets=0)
    rows = state.history
    assert [row["step"] for row in rows] == [1, 2, 4] and [row["target_tokens"] for row in rows] == [0, 0, 3]
    assert math.isnan(rows[0]["loss"]) and math.isnan(rows[1]["loss"]) and rows[2]["loss"] == 4.0
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1, warnings  # said once, at the first such row
    assert "no target tokens" in warnings[0] and "step 1" in warnings[0]
    assert "learning rate" not in warnings[0] and "lr" not in warnings[0].split()
    assert [row for _, row in received] == rows
    params = parse_train_params({"checkpoint_dir": "unused", "runtime": {"device": "cpu"}})
    summary = run_summary(state, rec.metrics, total_steps=4, epochs=1.0, wall=1.0, n_params=10, params=params,
                          world_size=1)  # fmt: skip
    assert summary["final_train_loss"] == 4.0  # the last row with a loss, not the NaN after it


def test_a_nan_loss_of_a_window_with_target_tokens_still_stops_the_run():
    state = TrainState()
    rec, _ = recorder(state)
    run_step(rec, loss_sum=0.0, targets=0)
    with pytest.raises(NonFiniteLossError, match="loss became nan"):
        for _ in range(2):
            run_step(rec, loss_sum=float("nan"), targets=2)
