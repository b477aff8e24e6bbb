"""Which checkpoint is picked: only complete ``checkpoint-*`` folders, the newest for ``auto``, what
``train.resume`` names, and the runs of a base folder that stopped before their total."""

from __future__ import annotations

import json
import os

import pytest

from fastlm.engine.checkpoint.discovery import (
    complete_checkpoints,
    finished_step,
    latest_checkpoint,
    resolve_resume,
    unfinished_runs,
)
from fastlm.engine.checkpoint.files import mark_finished
from fastlm.engine.checkpoint.layout import FINISHED, FORMAT_VERSION, MARKER, CheckpointError
from fastlm.engine.checkpoint.loading import load_checkpoint
from tests.support.checkpoints import save
from tests.support.tiny_models import checkpoint_llama


def test_torn_or_foreign_folders_are_never_picked(tmp_path, trained):
    save(tmp_path, 1, *trained)
    torn = save(tmp_path, 2, *trained)
    (torn / "COMPLETE").unlink()  # as if the save had stopped before the marker
    (tmp_path / "checkpoint-00000009").mkdir()  # no marker
    tmp = tmp_path / ".tmp-checkpoint-00000010-1-abcd"
    tmp.mkdir()
    (tmp / "COMPLETE").write_text("{}")
    odd = tmp_path / "checkpoint-latest"
    odd.mkdir()
    (odd / "COMPLETE").write_text("{}")
    (tmp_path / "checkpoint-00000011").write_text("a file, not a folder")

    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-00000001"
    assert resolve_resume(tmp_path, "auto") == tmp_path / "checkpoint-00000001"
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_resume(tmp_path, str(torn))
    with pytest.raises(CheckpointError, match="COMPLETE"):
        load_checkpoint(torn, model=checkpoint_llama())


def test_resolve_resume(tmp_path, trained, monkeypatch):
    assert resolve_resume(tmp_path / "nothing-yet", "auto") is None
    assert resolve_resume(tmp_path, "auto") is None
    first = save(tmp_path, 1, *trained)
    second = save(tmp_path, 2, *trained)
    assert resolve_resume(tmp_path, "auto") == second
    assert resolve_resume(tmp_path, "never") is None
    assert resolve_resume(tmp_path, str(first)) == first
    assert resolve_resume(tmp_path, "checkpoint-00000001") == first  # a name under root
    monkeypatch.chdir(tmp_path.parent)
    assert resolve_resume(tmp_path, f"{tmp_path.name}/checkpoint-00000001").resolve() == first

    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_resume(tmp_path, str(tmp_path / "checkpoint-00000042"))
    with pytest.raises(CheckpointError, match="'auto', 'never'"):
        resolve_resume(tmp_path, "")
    (second / MARKER).unlink()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_resume(tmp_path, str(second))
    assert resolve_resume(tmp_path, "auto") == first


def _fake_checkpoint(root, step: int, state: dict | None = None, mtime: float = 0.0):
    """A folder that discovery reads as complete: the marker and a trainer state, no tensors."""
    folder = root / f"checkpoint-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"state": state or {"step": step}, "rng": {}}))
    (folder / MARKER).write_text(json.dumps({"format": FORMAT_VERSION, "files": {}}))
    os.utime(folder / MARKER, (mtime, mtime))
    return folder


def test_complete_checkpoints_are_listed_by_step_not_by_name_order(tmp_path):
    late, early = _fake_checkpoint(tmp_path, 120), _fake_checkpoint(tmp_path, 9)
    (tmp_path / "checkpoint-00000200").mkdir()  # no marker
    assert complete_checkpoints(tmp_path) == [early, late]
    assert (
        complete_checkpoints(tmp_path / "missing") == [] and latest_checkpoint(tmp_path / "missing") is None
    )


def test_unfinished_runs_are_the_runs_stopped_before_their_total_newest_first(tmp_path):
    _fake_checkpoint(tmp_path / "older", 4, {"step": 4, "total_steps": 10}, mtime=1_000)
    _fake_checkpoint(tmp_path / "newer", 2, {"step": 2, "total_steps": 10}, mtime=2_000)
    _fake_checkpoint(tmp_path / "finished", 10, {"step": 10, "total_steps": 10}, mtime=3_000)
    _fake_checkpoint(tmp_path / "no-total", 3, mtime=4_000)
    torn = _fake_checkpoint(tmp_path / "torn-state", 3, mtime=5_000)
    (torn / "trainer_state.json").write_text("{cut")
    _fake_checkpoint(tmp_path / ".hidden", 1, {"step": 1, "total_steps": 10}, mtime=6_000)
    (tmp_path / "empty").mkdir()
    assert unfinished_runs(tmp_path) == [tmp_path / "newer", tmp_path / "older"]
    assert unfinished_runs(tmp_path / "nothing-here") == []


def test_a_run_marked_finished_at_its_newest_checkpoint_is_not_unfinished_until_a_newer_one(tmp_path):
    """A run entered again with nothing to train (``max_steps`` lowered to its checkpoint's step, early
    stopping judged over) finished there, but its checkpoint still reads "step 12 of 30": the next unnamed
    run took its name and wrote over its model. Its ``FINISHED`` marker says it finished; a newer checkpoint
    (the run continued by name with a larger ``max_steps``) is judged on its own again."""
    run = tmp_path / "ms1"
    twelve = _fake_checkpoint(run, 12, {"step": 12, "total_steps": 30}, mtime=1_000)
    _fake_checkpoint(tmp_path / "other", 2, {"step": 2, "total_steps": 10}, mtime=500)
    assert unfinished_runs(tmp_path) == [run, tmp_path / "other"]
    mark_finished(twelve, step=12, reason="nothing to train")
    assert finished_step(twelve) == 12 and not list(twelve.glob(".*"))  # written whole, no temporary left
    assert unfinished_runs(tmp_path) == [tmp_path / "other"]
    assert latest_checkpoint(run) == twelve  # the checkpoint itself is untouched: a named run continues it
    _fake_checkpoint(run, 20, {"step": 20, "total_steps": 30}, mtime=2_000)  # continued, then stopped again
    assert unfinished_runs(tmp_path) == [run, tmp_path / "other"]
    (twelve / FINISHED).write_text("{cut")  # unreadable: the checkpoint's own state decides
    assert finished_step(twelve) is None


def test_a_run_folder_named_for_resume_is_said_to_be_one_with_its_newest_checkpoint(tmp_path, trained):
    """``train.resume: data/06_models/checkpoints/<run>`` (the run's folder, not one of its checkpoints) was
    refused as "not a complete checkpoint (no COMPLETE marker, the save was interrupted)": nothing had been
    interrupted. The line says it is a run folder and names its newest complete checkpoint to give."""
    run = tmp_path / "xa"
    save(run, 1, *trained)
    newest = save(run, 2, *trained)
    with pytest.raises(CheckpointError) as caught:
        resolve_resume(tmp_path, str(run))
    said = str(caught.value)
    assert "run folder" in said and str(newest) in said and "interrupted" not in said
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_resume(tmp_path, str(empty))
