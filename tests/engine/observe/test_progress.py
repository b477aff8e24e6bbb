"""Progress: one summary line per logging step with fastlm's ETA, nothing when quiet, no bar off a
terminal."""

from __future__ import annotations

import logging

from fastlm.engine.observe.progress import BAR_FORMAT, Progress

RECORD = {
    "step": 40,
    "loss": 1.23456,
    "real_tokens_per_s": 12345.6,
    "lr": 3e-4,
    "grad_norm": 0.5,
    "data_wait_share": 0.02,
    "padding_efficiency": 0.9,
    "eta_s": 1234.4,
}


def test_the_line_names_step_loss_rate_and_the_eta(caplog):
    progress = Progress(100)
    assert progress.bar is None  # pytest's stderr is not a terminal
    with caplog.at_level(logging.INFO, logger="fastlm.engine.observe.progress"):
        progress.show(RECORD)
        progress.show({**RECORD, "eta_s": None, "lr": None, "grad_norm": None, "padding_efficiency": None})
    progress.advance()
    progress.close()
    first, second = (record.getMessage() for record in caplog.records)
    assert first == (
        "step 40: loss 1.2346  12,346 tok/s  lr 3.00e-04  grad-norm 0.5  data-wait 2.0%  padding-eff 90.0%  "
        "eta 1,234s"
    )
    assert second.endswith("lr 0.00e+00  grad-norm 0  data-wait 2.0%  padding-eff 0.0%  eta 0s")
    assert "remaining" not in BAR_FORMAT  # tqdm's own estimate is not shown


def test_quiet_shows_nothing(caplog):
    with caplog.at_level(logging.INFO):
        Progress(100, quiet=True).show(RECORD)
    assert not caplog.records


def test_a_label_smoothed_runs_step_lines_name_their_loss_so_beside_the_plain_validation_loss(
    tmp_path, caplog
):
    """train.loss.label_smoothing: the step lines' loss is the smoothed one the run optimises (higher than the
    plain cross-entropy), logged between the validation lines' plain losses: each says which it is."""
    from tests.support.toy_training import run_toy, toy_params

    params = toy_params(
        tmp_path, max_steps=10, log_every=5, eval_every=5, quiet=False, loss={"label_smoothing": 0.1}
    )
    with caplog.at_level(logging.INFO, logger="fastlm"):
        run_toy(params)
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("step ")]
    steps = [line for line in lines if "tok/s" in line]
    assert [line.split(":")[0] for line in steps] == ["step 1", "step 5", "step 10"]
    assert all(line.split(":")[1].startswith(" train loss (label-smoothed 0.1) ") for line in steps), steps
    assert any(line.startswith("step 5: validation loss ") for line in lines)  # the plain one, unchanged


def test_a_plain_runs_step_line_is_unchanged(caplog):
    with caplog.at_level(logging.INFO, logger="fastlm.engine.observe.progress"):
        Progress(100, label_smoothing=0.0).show(RECORD)
    assert caplog.records[0].getMessage().startswith("step 40: loss 1.2346  12,346 tok/s")
