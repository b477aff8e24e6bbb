"""Writing checkpoints atomically: exact round trip (weights, AdamW, schedule, RNG), JSON state, pruning,
replacing a step, a save failing half-way. (Finding them: test_discovery; loading failures: test_loading.)"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import socket

import numpy as np
import pytest
import torch

from fastlm.engine.checkpoint import swap
from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.files import SaveOptions, save_checkpoint
from fastlm.engine.checkpoint.loading import load_checkpoint
from tests.support.checkpoints import STATE, batch, draw_rngs, save, steps_on_disk, train_step
from tests.support.tiny_models import checkpoint_llama, optimizer_and_scheduler


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


def test_saving_the_same_step_again_never_leaves_it_missing(tmp_path, trained, monkeypatch):
    """Round twenty: replacing a step's folder moved it aside, then renamed the new one in: a kill between
    the two renames left no checkpoint of that step. Where the system exchanges two folders in one call, the
    folder is never renamed away."""
    probes = [tmp_path / "probe-a", tmp_path / "probe-b"]
    for probe in probes:
        probe.mkdir()
    if not swap.exchange(*probes):
        pytest.skip("this system or filesystem has no atomic exchange")
    root = tmp_path / "checkpoints"
    model, optimizer, scheduler = trained
    final = save(root, 3, *trained)
    real_replace = os.replace

    def no_rename_of_the_step(source, destination):
        assert os.fspath(source) != os.fspath(final), "the checkpoint was renamed away: a window without it"
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", no_rename_of_the_step)
    save_checkpoint(root, 3, model=model, optimizer=optimizer, scheduler=scheduler, state={"step": 3, "v": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-00000003"]
    assert load_checkpoint(final, model=checkpoint_llama(), restore_rng=False) == {"step": 3, "v": 2}


def test_a_replacement_cut_between_its_renames_is_recovered_by_the_next_save(tmp_path, trained):
    """Round twenty: the next save removed every ``.tmp-*`` folder, the complete new copy of a step whose
    swap was cut between its renames too; now it is put in place first."""
    save(tmp_path, 1, *trained)
    folder = save(tmp_path, 2, *trained)
    shutil.copytree(folder, tmp_path / ".tmp-replaced-checkpoint-00000002-99999999-0a1b2c3d")
    os.replace(folder, tmp_path / ".tmp-checkpoint-00000002-99999999-0a1b2c3d")
    save(tmp_path, 3, *trained, options=SaveOptions(keep_last=None))
    assert steps_on_disk(tmp_path) == ["checkpoint-00000001", "checkpoint-00000002", "checkpoint-00000003"]
    assert load_checkpoint(folder, model=checkpoint_llama(), restore_rng=False)["step"] == 2


def test_a_saves_temporary_folders_name_its_host_and_a_cut_one_of_any_host_is_recovered(
    tmp_path, trained, monkeypatch
):
    """Round twenty: a save's temporary folders name the host with the pid (``<host>-<pid>-<hex>``): on a
    shared filesystem another host's pid says nothing here. A replacement cut between its renames is still
    put back whatever host wrote it (only the lock's holder saves there)."""
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu node-7")  # sanitized: gpu_node-7
    moved, real_replace = [], os.replace

    def recording(source, destination):
        moved.append(os.path.basename(os.fspath(source)))
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", recording)
    folder = save(tmp_path, 2, *trained)
    monkeypatch.undo()
    assert moved and all(
        name.startswith(f".tmp-checkpoint-00000002-gpu_node-7-{os.getpid()}-") for name in moved
    )
    shutil.copytree(folder, tmp_path / ".tmp-replaced-checkpoint-00000002-gpu_node-8-99999999-0a1b2c3d")
    os.replace(folder, tmp_path / ".tmp-checkpoint-00000002-gpu_node-8-99999999-0a1b2c3d")
    save(tmp_path, 3, *trained, options=SaveOptions(keep_last=None))
    assert steps_on_disk(tmp_path) == ["checkpoint-00000002", "checkpoint-00000003"]


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


def test_a_state_holding_a_non_finite_figure_is_strict_json_and_resumes_with_that_figure(tmp_path, trained):
    """An early-stopped run whose every validation loss was NaN keeps that NaN (and an inf) in its state: the
    file parses with a strict parser and the resumed state holds the floats, not None or 0."""
    model, optimizer, scheduler = trained
    state = {**STATE, "best_val_loss": float("nan"), "evals": [{"step": 2, "val_loss": float("inf")}]}
    folder = save_checkpoint(tmp_path, 2, model=model, optimizer=optimizer, scheduler=scheduler, state=state)

    def refuse(name):
        raise ValueError(name)

    json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"), parse_constant=refuse)
    loaded = load_checkpoint(folder, model=model, optimizer=optimizer, scheduler=scheduler)
    assert np.isnan(loaded["best_val_loss"]) and loaded["evals"][0]["val_loss"] == float("inf")


def test_a_checkpoint_s_weights_get_the_mode_of_its_other_files(tmp_path, trained):
    """safetensors 0.8 writes through a temporary file it creates 0o600 and renames into place: the weights
    of a checkpoint were unreadable by the group and others (a shared node, a serving user) while every other
    file of the folder had the umask's mode. Now the weights have it too."""
    previous = os.umask(0o022)
    try:
        folder = save(tmp_path, 2, *trained)
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in folder.iterdir()}
    assert modes["model.safetensors"] == modes["trainer_state.json"] == 0o644, modes
