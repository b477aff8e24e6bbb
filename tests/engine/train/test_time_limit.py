"""train.max_minutes: a per-run time budget stops training cleanly at a step boundary, with a checkpoint that
resume continues, and the summary says so. The clock is faked: every reading is 30 s after the previous
one."""

import itertools

import pytest

import fastlm.engine.train.time_limit as budget
from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.layout import MARKER
from fastlm.engine.checkpoint.loading import read_checkpoint_state
from fastlm.errors import ConfigError
from tests.support.toy_training import run_toy, toy_params


def test_time_budget_stops_at_a_step_boundary_with_a_checkpoint(tmp_path, monkeypatch):
    ticks = itertools.count(0.0, 30.0)
    # start 0 s, after step 1: 30 s, step 2: 60 s
    monkeypatch.setattr(budget, "monotonic", lambda: next(ticks))
    result = run_toy(toy_params(tmp_path, max_steps=30, max_minutes=1.0, log_every=5, eval_every=15))
    summary = result.summary
    assert summary["stopped_by"] == "time budget" and summary["steps"] == 2 and summary["planned_steps"] == 30
    assert [record["step"] for record in result.history] == [1, 2]  # the stop step is logged
    assert [record["step"] for record in result.eval_history] == [2]  # and evaluated: a final validation loss
    assert summary["final_val_loss"] == result.eval_history[-1]["val_loss"]
    checkpoint = latest_checkpoint(tmp_path / "checkpoints")
    assert checkpoint.name == "checkpoint-00000002" and (checkpoint / MARKER).is_file()
    state = read_checkpoint_state(checkpoint)
    assert state["step"] == 2 and state["total_steps"] == 30  # unfinished: resume: auto continues it

    monkeypatch.setattr(budget, "monotonic", lambda: 0.0)  # a new budget: the resumed run goes to the end
    resumed = run_toy(
        toy_params(tmp_path, max_steps=30, max_minutes=1.0, log_every=5, eval_every=15, resume="auto")
    )
    assert resumed.summary["stopped_by"] is None and resumed.summary["steps"] == 30
    assert resumed.summary["resumed_from_step"] == 2


@pytest.mark.parametrize("value", [0, -1, "soon"])
def test_bad_time_budget_is_one_line(tmp_path, value):
    with pytest.raises(ConfigError, match="train.max_minutes") as raised:
        toy_params(tmp_path, max_minutes=value)
    assert "\n" not in str(raised.value)


def test_a_time_budget_stop_validates_only_where_the_run_validates(tmp_path, monkeypatch):
    """train.eval_every: null: the run never validates, at its last step or at a time-budget stop alike."""
    ticks = itertools.count(0.0, 30.0)
    monkeypatch.setattr(budget, "monotonic", lambda: next(ticks))
    result = run_toy(toy_params(tmp_path, max_steps=30, max_minutes=1.0, log_every=5, eval_every=None))
    assert result.summary["stopped_by"] == "time budget" and result.summary["steps"] == 2
    assert result.eval_history == []  # no validation nobody asked for
    assert result.summary["final_val_loss"] is None
    assert [record["step"] for record in result.history] == [1, 2]  # the stop step is still logged and saved
    assert latest_checkpoint(tmp_path / "checkpoints").name == "checkpoint-00000002"
