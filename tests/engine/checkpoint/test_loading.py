"""Loading a checkpoint: a torn, missing, corrupt or mismatched file fails in one line naming the file and
the fix, and every ``torch.load`` is ``weights_only``."""

from __future__ import annotations

import json

import pytest
import torch

from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.files import save_checkpoint
from fastlm.engine.checkpoint.layout import CheckpointError
from fastlm.engine.checkpoint.loading import load_checkpoint
from tests.support.checkpoints import STATE, save
from tests.support.tiny_models import CHECKPOINT_VOCAB as VOCAB
from tests.support.tiny_models import checkpoint_llama, optimizer_and_scheduler


def assert_names_file_and_fix(error: pytest.ExceptionInfo, file) -> None:
    message = str(error.value)
    assert "\n" not in message
    assert str(file) in message
    assert f"delete {file.parent} to resume from the previous checkpoint" in message
    assert "train.resume: never" in message


def test_truncated_model_file_is_picked_but_fails_clearly(tmp_path, trained):
    save(tmp_path, 1, *trained)
    folder = save(tmp_path, 2, *trained)
    model_file = folder / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[: model_file.stat().st_size // 2])

    assert latest_checkpoint(tmp_path) == folder  # the marker is there; loading says what to do
    with pytest.raises(CheckpointError, match="truncated") as error:
        load_checkpoint(folder, model=checkpoint_llama())
    assert_names_file_and_fix(error, model_file)

    # Even if the manifest agreed with the torn size, the safetensors error is reported the same way.
    manifest = json.loads((folder / "COMPLETE").read_text())
    manifest["files"]["model.safetensors"] = model_file.stat().st_size
    (folder / "COMPLETE").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder, model=checkpoint_llama())
    assert_names_file_and_fix(error, model_file)

    load_checkpoint(tmp_path / "checkpoint-00000001", model=checkpoint_llama())  # the previous one is fine


def test_missing_or_corrupt_optimizer_file_fails_clearly(tmp_path, trained):
    folder = save(tmp_path, 1, *trained)
    model = checkpoint_llama()
    optimizer, _ = optimizer_and_scheduler(model)
    (folder / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match="missing") as error:
        load_checkpoint(folder, model=model, optimizer=optimizer)
    assert_names_file_and_fix(error, folder / "optimizer.pt")

    folder = save(tmp_path, 2, *trained)
    size = (folder / "optimizer.pt").stat().st_size
    (folder / "optimizer.pt").write_bytes(b"\0" * size)  # same size, garbage content
    with pytest.raises(CheckpointError, match="unreadable") as error:
        load_checkpoint(folder, model=model, optimizer=optimizer)
    assert_names_file_and_fix(error, folder / "optimizer.pt")


def test_optimizer_moments_of_other_shapes_fail_clearly(tmp_path, trained):
    """Round thirty-two: an ``optimizer.pt`` whose moments belong to other parameters (another layout, a
    copy from another checkpoint, the manifest agreeing) loaded without a word: torch checks the groups'
    sizes, not the tensors' shapes, and a fused AdamW then stepped over moments of another size (out of
    bounds, or hung). Refused in one line naming the file, the parameter and both shapes."""
    folder = save(tmp_path, 1, *trained)
    file = folder / "optimizer.pt"
    saved = torch.load(file, weights_only=True)
    shapes = [tuple(state["exp_avg"].shape) for state in saved["state"].values()]
    first, other = 0, next(index for index, shape in enumerate(shapes) if shape != shapes[0])
    saved["state"][first], saved["state"][other] = saved["state"][other], saved["state"][first]
    torch.save(saved, file)
    manifest = json.loads((folder / "COMPLETE").read_text())
    manifest["files"]["optimizer.pt"] = file.stat().st_size
    (folder / "COMPLETE").write_text(json.dumps(manifest))
    model = checkpoint_llama()
    optimizer, _ = optimizer_and_scheduler(model)
    with pytest.raises(CheckpointError, match="is not a state of this AdamW") as error:
        load_checkpoint(folder, model=model, optimizer=optimizer)
    assert_names_file_and_fix(error, file)
    assert f"parameter {first}" in str(error.value) and str(shapes[other]) in str(error.value)


def test_model_of_another_shape_fails_clearly(tmp_path, trained):
    folder = save(tmp_path, 1, *trained)
    with pytest.raises(CheckpointError, match="does not match the model") as error:
        load_checkpoint(folder, model=checkpoint_llama(vocab=VOCAB + 8))
    assert_names_file_and_fix(error, folder / "model.safetensors")


def test_every_torch_load_is_weights_only(tmp_path, trained, monkeypatch):
    model, optimizer, scheduler = trained
    folder = save_checkpoint(
        tmp_path,
        1,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        grad_scaler=torch.amp.GradScaler("cpu"),
        state=STATE,
    )
    real_load = torch.load
    seen = []

    def checking_load(*args, **kwargs):
        assert kwargs.get("weights_only") is True
        seen.append(args[0])
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", checking_load)
    fresh = checkpoint_llama()
    fresh_optimizer, fresh_scheduler = optimizer_and_scheduler(fresh)
    load_checkpoint(
        folder,
        model=fresh,
        optimizer=fresh_optimizer,
        scheduler=fresh_scheduler,
        grad_scaler=torch.amp.GradScaler("cpu"),
    )
    assert sorted(path.name for path in seen) == ["grad_scaler.pt", "optimizer.pt", "rng.pt", "scheduler.pt"]
