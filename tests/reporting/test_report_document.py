"""report_document: what the report's training summary says in words."""

from fastlm.reporting.report_document import run_lines
from tests.support.reporting import SUMMARY


def test_a_label_smoothed_run_says_which_losses_are_smoothed():
    lines = run_lines({**SUMMARY, "label_smoothing": 0.1}, None)
    said = next(line for line in lines if line.startswith("Loss:"))
    assert "label-smoothed (0.1" in said and "validation and test losses" in said and "plain" in said
    assert not any(line.startswith("Loss:") for line in run_lines({**SUMMARY, "label_smoothing": 0.0}, None))


def test_an_early_stopped_run_names_the_step_its_model_is_from():
    early = {
        "best_step": 40,
        "best_val_loss": 2.5,
        "model_from_step": 40,
        "patience": 3,
        "best_checkpoint": "data/06_models/checkpoints/run/checkpoint-00000040",
    }
    lines = run_lines({**SUMMARY, "steps": 70, "stopped_by": "early stopping", "early_stopping": early}, None)
    said = next(line for line in lines if line.startswith("Early stopping"))
    assert "stopped early at step 70" in said and "step 40's" in said and "2.5000" in said
    assert "checkpoint-00000040" in said
