"""Disk full or unwritable output folders: one clear line before training, and during a checkpoint write."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections import namedtuple
from pathlib import Path

import pytest
import safetensors
import torch

from fastlm.engine.checkpoint import files as checkpoint
from fastlm.engine.checkpoint import storage
from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.files import SaveOptions, save_checkpoint
from fastlm.engine.checkpoint.loading import load_checkpoint
from fastlm.engine.checkpoint.storage import (
    StorageError,
    check_free_space,
    check_training_storage,
    check_writable,
    estimate_run_bytes,
    os_error_in,
)

Usage = namedtuple("Usage", "total used free")


def _one_line(error: BaseException | str, *parts: str) -> str:
    message = str(error)
    assert "\n" not in message and "Fix:" in message, message
    for part in parts:
        assert part in message, message
    return message


def _deny_writes_under(monkeypatch, folder: Path, code: int = errno.EACCES) -> None:
    """Make creating a file under ``folder`` fail as a read-only folder would (root ignores chmod)."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve().is_relative_to(folder.resolve()):
            raise OSError(code, os.strerror(code), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def _tiny_training(tmp_path: Path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def _save(root: Path, step: int, model, optimizer, scheduler) -> Path:
    return save_checkpoint(
        root,
        step,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state={"step": step},
        options=SaveOptions(keep_last=2),
    )


# ------------------------------------------------------------------------------------------- before training


def test_writable_folder_passes_and_nothing_is_created(tmp_path):
    target = tmp_path / "not" / "yet" / "there"
    check_writable(target, parameter="train.checkpoint_dir")
    assert not (tmp_path / "not").exists()
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_unwritable_folder_by_chmod_is_one_line(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        try:  # root (and some CI sandboxes) write through chmod: nothing to show there
            (folder / "probe").write_bytes(b"x")
            (folder / "probe").unlink()
            pytest.skip(
                "this user can write into a folder chmod'ed 0o500 (root); covered by the monkeypatched test"
            )
        except PermissionError:
            pass
        with pytest.raises(StorageError) as raised:
            check_writable(folder / "checkpoints", parameter="train.checkpoint_dir")
        _one_line(
            raised.value,
            "train.checkpoint_dir",
            str(folder / "checkpoints"),
            "not writable",
            "Permission denied",
        )
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_unwritable_folder_is_one_line(tmp_path, monkeypatch, code):
    _deny_writes_under(monkeypatch, tmp_path, code)
    with pytest.raises(StorageError) as raised:
        check_writable(tmp_path / "checkpoints", parameter="train.checkpoint_dir")
    _one_line(
        raised.value,
        f"train.checkpoint_dir: {tmp_path / 'checkpoints'} is not writable",
        os.strerror(code),
        "point train.checkpoint_dir at a writable folder",
    )
    assert not (tmp_path / "checkpoints").exists()


def test_a_file_in_the_way_is_one_line(tmp_path):
    (tmp_path / "data").write_text("not a folder")
    with pytest.raises(StorageError) as raised:
        check_writable(tmp_path / "data" / "checkpoints", parameter="train.checkpoint_dir")
    _one_line(raised.value, "is a file, not a folder", "train.checkpoint_dir")


def test_estimate_covers_a_real_checkpoint(tmp_path):
    model, optimizer, scheduler = _tiny_training(tmp_path)
    written = _save(tmp_path / "ckpt", 1, model, optimizer, scheduler)
    actual = sum(path.stat().st_size for path in written.iterdir())
    estimate = estimate_run_bytes(model, keep_last=2)
    n_params = sum(p.numel() for p in model.parameters())
    assert estimate.checkpoint >= actual
    history = storage.RECORD_BYTES * storage.UNKNOWN_RECORDS  # steps not known: a cautious metric history
    # weights + AdamW moments
    assert estimate.checkpoint - storage.STATE_SLACK_BYTES - history == 3 * 4 * n_params
    assert estimate.checkpoints_at_peak == 3 and estimate.checkpoints_total == 3 * estimate.checkpoint
    assert estimate_run_bytes(model, keep_last=2, saves_checkpoints=False).checkpoints_at_peak == 1


def test_tied_weights_count_once():
    embedding = torch.nn.Embedding(100, 16)
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight = embedding.weight
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    # no tokenizer given
    assert (
        estimate_run_bytes(model, keep_last=1).final_model
        == 100 * 16 * 4 + storage.STATE_SLACK_BYTES + storage.UNKNOWN_TOKENIZER_BYTES
    )


def test_disk_full_before_training_names_bytes_needed_and_free(tmp_path, monkeypatch):
    model, _, _ = _tiny_training(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 5000, 5000))
    with pytest.raises(StorageError) as raised:
        check_training_storage(
            model,
            checkpoint_dir=tmp_path / "checkpoints",
            model_dir=tmp_path / "model",
            keep_last=2,
            saves_checkpoints=True,
        )
    estimate = estimate_run_bytes(model, keep_last=2)
    needed = 3 * estimate.checkpoint + estimate.final_model
    _one_line(
        raised.value,
        "not enough free disk space",
        "train.checkpoint_dir",
        "trained_model",
        f"{needed / 1e6:.1f} MB in all",
        "5.0 KB is free",
        "lower train.keep_last",
    )


def test_room_enough_passes_and_existing_checkpoints_count(tmp_path, monkeypatch):
    model, optimizer, scheduler = _tiny_training(tmp_path)
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        _save(root, step, model, optimizer, scheduler)
    estimate = estimate_run_bytes(model, keep_last=2)
    # two complete checkpoints already on disk: the peak adds one more, plus the final model
    just_enough = estimate.checkpoint + estimate.final_model
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, just_enough))
    check_training_storage(
        model, checkpoint_dir=root, model_dir=tmp_path / "model", keep_last=2, saves_checkpoints=True
    )
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, just_enough - 1))
    with pytest.raises(StorageError):
        check_training_storage(
            model, checkpoint_dir=root, model_dir=tmp_path / "model", keep_last=2, saves_checkpoints=True
        )


def test_folders_on_different_disks_are_checked_separately(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    devices = {str(tmp_path / "a"): 1, str(tmp_path / "b"): 2}
    real_stat = Path.stat

    class FakeStat:
        def __init__(self, device):
            self.st_dev = device

    monkeypatch.setattr(
        Path,
        "stat",
        lambda self, **kw: FakeStat(devices[str(self)]) if str(self) in devices else real_stat(self, **kw),
    )
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**6, 0, 600))
    check_free_space({"x": (tmp_path / "a", 500), "y": (tmp_path / "b", 500)}, fix="free space.")
    monkeypatch.setattr(
        Path, "stat", lambda self, **kw: FakeStat(1) if str(self) in devices else real_stat(self, **kw)
    )
    with pytest.raises(
        StorageError, match=r"x \(.*\) and y \(.*\) need about 1.0 KB in all, 600 bytes is free"
    ):
        check_free_space({"x": (tmp_path / "a", 500), "y": (tmp_path / "b", 500)}, fix="free space.")


def test_os_error_is_found_in_chains_and_library_messages():
    assert os_error_in(OSError(errno.ENOSPC, "No space left on device")).errno == errno.ENOSPC
    wrapped = RuntimeError("writer failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert os_error_in(wrapped).errno == errno.EDQUOT
    text = "Error while serializing: I/O error: No space left on device (os error 28)"
    assert os_error_in(safetensors.SafetensorError(text)).errno == errno.ENOSPC
    assert os_error_in(ValueError("shape mismatch")) is None


# ---------------------------------------------------------------------------------- during a checkpoint write


def _fill_disk_after(monkeypatch, limit: int, only: str) -> None:
    """Files named ``only`` accept ``limit`` bytes, then every write fails with ENOSPC (a disk filling up)."""
    real_open = open

    class FillingFile:
        def __init__(self, handle):
            self.handle, self.written = handle, 0

        def write(self, data):
            if self.written + len(data) > limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written += len(data)
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def filling_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return FillingFile(handle) if Path(path).name == only and "w" in mode else handle

    monkeypatch.setattr(checkpoint, "open", filling_open, raising=False)


def _assert_previous_kept(root: Path, model, optimizer, scheduler, message: str) -> None:
    assert (
        "checkpoint-00000004" in message
        and f"the previous checkpoint {root / 'checkpoint-00000002'} is kept" in message
    )
    assert not list(root.glob(".tmp-*")), "the partial copy must be removed"
    assert latest_checkpoint(root) == root / "checkpoint-00000002"
    assert not (root / "checkpoint-00000004").exists()
    assert load_checkpoint(
        root / "checkpoint-00000002", model=model, optimizer=optimizer, scheduler=scheduler, restore_rng=False
    ) == {"step": 2}


@pytest.mark.parametrize("file", ["optimizer.pt", "rng.pt", "trainer_state.json", "COMPLETE"])
def test_disk_full_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch, file):
    model, optimizer, scheduler = _tiny_training(tmp_path)
    root = tmp_path / "checkpoints"
    _save(root, 2, model, optimizer, scheduler)
    _fill_disk_after(monkeypatch, 64, only=file)
    _save_fails_disk_full(
        root,
        model,
        optimizer,
        scheduler,
        monkeypatch,
        "could not write checkpoint",
        "No space left on device",
        "train.checkpoint_dir",
    )


def test_disk_full_in_the_safetensors_writer(tmp_path, monkeypatch):
    model, optimizer, scheduler = _tiny_training(tmp_path)
    root = tmp_path / "checkpoints"
    _save(root, 2, model, optimizer, scheduler)

    def full(*args, **kwargs):
        raise safetensors.SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(checkpoint.safetensors.torch, "save_model", full)
    _save_fails_disk_full(root, model, optimizer, scheduler, monkeypatch)


def _save_fails_disk_full(root, model, optimizer, scheduler, monkeypatch, *expected: str) -> None:
    """Saving step 4 fails with one disk-full line; with the fault removed, step 2 is still the one
    resumed."""
    with pytest.raises(StorageError) as raised:
        _save(root, 4, model, optimizer, scheduler)
    message = _one_line(raised.value, "the disk is full", *expected)
    monkeypatch.undo()
    _assert_previous_kept(root, model, optimizer, scheduler, message)


def test_disk_full_at_the_rename(tmp_path, monkeypatch):
    model, optimizer, scheduler = _tiny_training(tmp_path)
    root = tmp_path / "checkpoints"
    _save(root, 2, model, optimizer, scheduler)
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "checkpoint-00000004":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    _save_fails_disk_full(root, model, optimizer, scheduler, monkeypatch)


def test_other_write_errors_are_not_disguised(tmp_path, monkeypatch):
    model, optimizer, scheduler = _tiny_training(tmp_path)

    def broken(*args, **kwargs):
        raise ValueError("a bug, not a disk")

    monkeypatch.setattr(checkpoint.safetensors.torch, "save_model", broken)
    with pytest.raises(ValueError, match="a bug, not a disk"):
        _save(tmp_path / "checkpoints", 1, model, optimizer, scheduler)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


# -------------------------------------------------------------------- not every write error is a full disk

_OVER_THE_FILE_SIZE_LIMIT = """
import resource, sys
from fastlm.datasets.atomic_file import save_file_atomically
from fastlm.errors import FastlmError
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    save_file_atomically(sys.argv[1], lambda handle: handle.write(b"x" * 2**20), binary=True)
except FastlmError as error:
    print(error)
"""


def test_a_file_over_the_file_size_limit_is_one_line_that_does_not_call_the_disk_full(tmp_path):
    """EFBIG (a file-size limit, `ulimit -f`, or a file system such as FAT32 that stops at 4 GB) with room on
    the disk: the line says the file is too large for where it goes and how to lift that, not "the disk is
    full" (whose fix, freeing space, changes nothing). A real limit, in a process of its own (Python ignores
    SIGXFSZ, so the write fails with EFBIG)."""
    import subprocess
    import sys

    target = tmp_path / "weights.bin"
    target.write_bytes(b"previous")
    done = subprocess.run(
        [sys.executable, "-c", _OVER_THE_FILE_SIZE_LIMIT, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    message = done.stdout.strip()
    assert done.returncode == 0 and message, done.stderr
    _one_line(message, str(target), os.strerror(errno.EFBIG), "file-size limit", "ulimit -f", "FAT32")
    assert "disk is full" not in message and "free disk space" not in message, message
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["weights.bin"]


def test_a_used_up_disk_quota_is_named_a_quota(tmp_path):
    """EDQUOT: the user's quota, not the disk, is used up: the line says so (the disk may have room)."""
    clear = storage.storage_error(
        OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), f"could not write {tmp_path}", parameter="p.q"
    )
    message = _one_line(clear, "disk quota", os.strerror(errno.EDQUOT), "point p.q at")
    assert "disk is full" not in message, message
