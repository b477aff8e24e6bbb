"""report_document: what the report's training summary says in words."""

from fastlm.reporting.report_document import run_lines
from tests.support.reporting import SUMMARY


def test_a_label_smoothed_run_says_which_losses_are_smoothed():
    lines = run_lines({**SUMMARY, "label_smoothing": 0.1}, None)
    said = next(line for line in lines if line.startswith("Loss:"))
    assert "label-smoothed (0.1" in said and "validation and test losses" in said and "plain" in said
    assert not any(line.startswith("Loss:") for line in run_lines({**SUMMARY, "label_smoothing": 0.0}, None))
