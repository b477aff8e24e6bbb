"""The checkpoint folder layout: step folders sort by name in step order, and the one checkpoint error is a
FastlmError (one CLI line) that is also a ValueError."""

from __future__ import annotations

from pathlib import Path

from fastlm.engine.checkpoint.layout import MARKER, TMP_PREFIX, CheckpointError, checkpoint_dir
from fastlm.errors import FastlmError


def test_step_folders_are_zero_padded_so_names_sort_in_step_order():
    assert checkpoint_dir(Path("runs/a"), 42) == Path("runs/a/checkpoint-00000042")
    steps = [3, 20, 100, 9]
    names = sorted(checkpoint_dir(Path("r"), step).name for step in steps)
    assert names == [checkpoint_dir(Path("r"), step).name for step in sorted(steps)]
    assert not checkpoint_dir(Path("r"), 1).name.startswith(TMP_PREFIX) and MARKER == "COMPLETE"


def test_checkpoint_error_is_a_one_line_project_error():
    error = CheckpointError("checkpoint x is torn.", fix="delete it.")
    assert isinstance(error, FastlmError) and isinstance(error, ValueError)
    assert "checkpoint x is torn." in str(error) and "delete it." in str(error) and "\n" not in str(error)
