"""Atomic checkpoints: exact round trip (weights, AdamW, schedule, RNG), pruning, torn saves, resume
choice."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch

from fastlm.engine.checkpoint.discovery import latest_checkpoint, resolve_resume
from fastlm.engine.checkpoint.files import SaveOptions, save_checkpoint
from fastlm.engine.checkpoint.layout import MARKER, CheckpointError
from fastlm.engine.checkpoint.loading import load_checkpoint
from tests.support.tiny_models import CHECKPOINT_VOCAB as VOCAB
from tests.support.tiny_models import checkpoint_llama, optimizer_and_scheduler

STATE = {
    "step": 2,
    "epoch": 0,
    "position": 17,
    "history": [{"step": 1, "loss": 4.5}],
    "config_digest": "ab12",
}


def batch(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


def train_step(model, optimizer, scheduler, input_ids: torch.Tensor) -> None:
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def draw_rngs() -> tuple:
    return torch.rand(4).tolist(), [random.random() for _ in range(3)], np.random.rand(4).tolist()


def save(root, step, model, optimizer, scheduler, **kwargs):
    return save_checkpoint(
        root,
        step,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state={**STATE, "step": step},
        **kwargs,
    )


def steps_on_disk(root) -> list[str]:
    return sorted(path.name for path in root.iterdir())


@pytest.fixture
def trained():
    model = checkpoint_llama()
    optimizer, scheduler = optimizer_and_scheduler(model)
    for seed in range(2):
        train_step(model, optimizer, scheduler, batch(seed))
    return model, optimizer, scheduler


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_round_trip_is_exact_and_training_continues_identically(tmp_path, tie):
    model = checkpoint_llama(tie=tie)
    if tie:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    optimizer, scheduler = optimizer_and_scheduler(model)
    for seed in range(2):
        train_step(model, optimizer, scheduler, batch(seed))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)

    folder = save_checkpoint(
        tmp_path,
        2,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        grad_scaler=scaler,
        state=STATE,
    )
    assert folder == tmp_path / "checkpoint-00000002"
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer_state = copy.deepcopy(optimizer.state_dict())
    lr = scheduler.get_last_lr()
    expected_draws = draw_rngs()  # what the run would have drawn next without the checkpoint
    train_step(model, optimizer, scheduler, batch(7))
    expected_after = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    resumed = checkpoint_llama(seed=1, tie=tie)
    resumed_optimizer, resumed_scheduler = optimizer_and_scheduler(resumed)
    resumed_scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    state = load_checkpoint(
        folder,
        model=resumed,
        optimizer=resumed_optimizer,
        scheduler=resumed_scheduler,
        grad_scaler=resumed_scaler,
    )

    assert state == STATE
    for name, tensor in resumed.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    if tie:
        assert resumed.lm_head.weight is resumed.model.embed_tokens.weight
    loaded = resumed_optimizer.state_dict()
    assert loaded["param_groups"] == optimizer_state["param_groups"]
    assert loaded["state"].keys() == optimizer_state["state"].keys()
    for index, param_state in optimizer_state["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded["state"][index][key], param_state[key]), (index, key)
    assert resumed_scheduler.last_epoch == 2
    assert resumed_scheduler.get_last_lr() == lr
    assert resumed_scaler.get_scale() == 1024.0
    assert draw_rngs() == expected_draws

    train_step(resumed, resumed_optimizer, resumed_scheduler, batch(7))
    for name, tensor in resumed.state_dict().items():
        assert torch.equal(tensor, expected_after[name]), name


def test_folder_contents_need_no_pickle_for_the_state(tmp_path, trained):
    folder = save(tmp_path, 2, *trained)
    names = {path.name for path in folder.iterdir()}
    assert names == {
        "COMPLETE",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng.pt",
        "trainer_state.json",
    }
    saved = json.loads((folder / "trainer_state.json").read_text())
    assert saved["state"] == STATE
    assert set(saved["rng"]) == {"python", "numpy"}
    manifest = json.loads((folder / "COMPLETE").read_text())
    assert manifest["step"] == 2
    assert manifest["files"]["model.safetensors"] == (folder / "model.safetensors").stat().st_size


def test_state_that_is_not_json_fails_before_writing(tmp_path, trained):
    model, optimizer, scheduler = trained
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(
            tmp_path, 1, model=model, optimizer=optimizer, scheduler=scheduler, state={"x": object()}
        )
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_keep_last_prunes_oldest_and_stale_temporaries(tmp_path, trained):
    stale = tmp_path / ".tmp-checkpoint-00000009-123-deadbeef"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    for step in range(1, 6):
        save(tmp_path, step, *trained, options=SaveOptions(keep_last=2))
    assert steps_on_disk(tmp_path) == ["checkpoint-00000004", "checkpoint-00000005"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-00000005"

    save(tmp_path, 6, *trained, options=SaveOptions(keep_last=None))  # keeps everything
    assert len(steps_on_disk(tmp_path)) == 3


def test_saving_the_same_step_again_replaces_it(tmp_path, trained):
    model, optimizer, scheduler = trained
    save(tmp_path, 3, *trained)
    save_checkpoint(
        tmp_path, 3, model=model, optimizer=optimizer, scheduler=scheduler, state={"step": 3, "v": 2}
    )
    assert steps_on_disk(tmp_path) == ["checkpoint-00000003"]
    assert load_checkpoint(tmp_path / "checkpoint-00000003", model=checkpoint_llama(), restore_rng=False) == {
        "step": 3,
        "v": 2,
    }


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


def test_model_of_another_shape_fails_clearly(tmp_path, trained):
    folder = save(tmp_path, 1, *trained)
    with pytest.raises(CheckpointError, match="does not match the model") as error:
        load_checkpoint(folder, model=checkpoint_llama(vocab=VOCAB + 8))
    assert_names_file_and_fix(error, folder / "model.safetensors")


@pytest.mark.parametrize("step", [3, 2], ids=["new-step", "same-step"])
def test_failure_in_the_middle_of_a_save_leaves_previous_checkpoints(tmp_path, trained, monkeypatch, step):
    save(tmp_path, 1, *trained)
    before = save(tmp_path, 2, *trained)
    manifest_before = (before / "COMPLETE").read_text()
    real_save = torch.save
    calls = []

    def failing_save(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, step, *trained)
    monkeypatch.undo()

    assert steps_on_disk(tmp_path) == ["checkpoint-00000001", "checkpoint-00000002"]  # no .tmp-*, no step 3
    assert (before / "COMPLETE").read_text() == manifest_before
    assert latest_checkpoint(tmp_path) == before
    assert load_checkpoint(before, model=checkpoint_llama(), restore_rng=False)["step"] == 2


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
