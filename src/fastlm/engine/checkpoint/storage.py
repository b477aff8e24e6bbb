"""Storage checks before a run writes anything: directories writable, enough free space; disk errors as one
line.

A full disk or a read-only output folder otherwise shows up minutes (or hours) into training as an
``OSError`` deep inside ``torch.save``. The checks here run before the first step, where the fix is cheap:

- :func:`check_writable`: a folder (or, when it does not exist yet, its nearest existing ancestor, so a check
  never creates folders) accepts a new file: a probe file is written, then removed.
- :func:`estimate_run_bytes`: what a training run will write at its peak: ``keep_last + 1`` checkpoints
  (the newest is written before the oldest is pruned), each the saved weights (the trainable ones only for
  LoRA) plus AdamW's two fp32 moments per trainable parameter plus RNG states and the metric history, and the
  final model folder (weights, tokenizer files and configs; written beside the old one, then swapped in). The
  estimate stays above what a run writes and within about 3x of it (tests/engine/checkpoint/test_storage.py).
- :func:`check_free_space`: ``shutil.disk_usage`` of each filesystem involved covers what will be written
  there (folders on one device add up).
- :func:`storage_error`: an ``OSError`` such as ENOSPC from a write, as one :class:`StorageError` line.

Kedro-free: the train node passes the folders in.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fastlm.engine.checkpoint.layout import MARKER
from fastlm.errors import FastlmError, exception_chain

if TYPE_CHECKING:  # type hints only: `kedro run` start-up (hooks import check_writable) stays torch-free
    import torch

STATE_SLACK_BYTES = 128 * 2**10  # RNG states (torch, Python, NumPy: ~30 KB as saved), manifest, config files
RECORD_BYTES = 1536  # one metric record in trainer_state.json (about 900 bytes as indented JSON)
UNKNOWN_RECORDS = 2000  # metric records assumed when the number of steps is not known before training
UNKNOWN_TOKENIZER_BYTES = 8 * 2**20  # tokenizer files assumed when no tokenizer is given
DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
_OS_ERROR_TEXT = re.compile(r"\(os error (\d+)\)")


class StorageError(FastlmError):
    """An output folder cannot be written, or its disk has too little room for what the run will write."""


@dataclass(frozen=True)
class RunBytes:
    """What a training run writes at its peak, in bytes."""

    checkpoint: int  # one checkpoint
    checkpoints_at_peak: int  # how many exist at once while the newest is written
    final_model: int

    @property
    def checkpoints_total(self) -> int:
        return self.checkpoint * self.checkpoints_at_peak


def existing_ancestor(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing parent (where it would be created)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(directory: Path, *, parameter: str) -> None:
    """Raise one StorageError line unless a file can be created in ``directory`` (or where it would be
    created).

    ``parameter`` names the setting or catalog entry the user changes to point elsewhere.
    """
    directory = Path(directory)
    target = existing_ancestor(directory)
    if not target.is_dir():
        raise StorageError(
            f"{parameter}: {directory} cannot be created because {target} is a file, not a folder.",
            fix=f"remove or rename {target}, or point {parameter} at another folder.",
        )
    try:
        handle, probe = tempfile.mkstemp(prefix=".fastlm-write-probe-", dir=target)
        try:
            os.write(handle, b"probe")
        finally:
            os.close(handle)
            os.unlink(probe)
    except OSError as error:
        clear = storage_error(error, f"{parameter}: {directory} is not writable", parameter=parameter)
        if clear is error:
            raise
        raise clear from error


def estimate_run_bytes(
    model: torch.nn.Module,
    *,
    keep_last: int,
    saves_checkpoints: bool = True,
    tokenizer=None,
    log_records: int | None = None,
) -> RunBytes:
    """Peak bytes a run of ``model`` writes: checkpoints (weights + AdamW state + history + slack) and the
    final model (weights + tokenizer files + slack).

    Shared (tied) parameters count once, as ``model.parameters()`` yields them once. A model with frozen
    parameters (LoRA) saves its trainable ones only. Without periodic saves a graceful stop (SIGTERM/Ctrl-C)
    still writes one checkpoint. ``log_records``: metric records the history will hold (None: not known).
    """
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    saved = trainable if len(trainable) < len(params) else params
    weights = sum(p.numel() * p.element_size() for p in saved)
    adam_moments = 2 * 4 * sum(p.numel() for p in trainable)  # exp_avg, exp_avg_sq fp32
    history = RECORD_BYTES * (UNKNOWN_RECORDS if log_records is None else log_records)
    checkpoint = weights + adam_moments + history + STATE_SLACK_BYTES
    return RunBytes(
        checkpoint=checkpoint,
        checkpoints_at_peak=keep_last + 1 if saves_checkpoints else 1,
        final_model=weights + tokenizer_bytes(tokenizer) + STATE_SLACK_BYTES,
    )


def tokenizer_bytes(tokenizer) -> int:
    """What ``tokenizer.save_pretrained`` writes, measured in a temporary folder (a cautious guess without
    one)."""
    if tokenizer is None:
        return UNKNOWN_TOKENIZER_BYTES
    with tempfile.TemporaryDirectory(prefix="fastlm-tokenizer-size-") as folder:
        tokenizer.save_pretrained(folder)
        return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def check_free_space(needs: Mapping[str, tuple[Path, int]], *, fix: str) -> None:
    """``needs``: a label (the parameter or output name) -> (folder, bytes it will receive).

    Folders on one filesystem (same ``st_dev`` of their nearest existing ancestor) add up; one StorageError
    line names the folders, the bytes needed and the bytes free.
    """
    by_device: dict[int, list[tuple[str, Path, int]]] = {}
    for label, (folder, size) in needs.items():
        by_device.setdefault(existing_ancestor(folder).stat().st_dev, []).append((label, Path(folder), size))
    for entries in by_device.values():
        needed = sum(size for _, _, size in entries)
        free = shutil.disk_usage(existing_ancestor(entries[0][1])).free
        if needed > free:
            where = " and ".join(f"{label} ({folder}, {_size(size)})" for label, folder, size in entries)
            raise StorageError(
                f"not enough free disk space: {where} need about {_size(needed)} in all, "
                f"{_size(free)} is free on that disk.",
                fix=fix,
            )


def check_training_storage(
    model: torch.nn.Module,
    *,
    checkpoint_dir: Path,
    model_dir: Path,
    keep_last: int,
    saves_checkpoints: bool,
    model_entry: str = "trained_model",
    tokenizer=None,
    log_records: int | None = None,
) -> RunBytes:
    """Before the first step: both output folders writable, and room for the checkpoints and the final model.

    Complete checkpoints already in ``checkpoint_dir`` are on the disk already: they count towards the
    ``keep_last + 1`` that exist at the peak. Returns the estimate (the train node logs it).
    """
    check_writable(checkpoint_dir, parameter="train.checkpoint_dir")
    check_writable(Path(model_dir).parent, parameter=f"{model_entry} (the model output folder {model_dir})")
    estimate = estimate_run_bytes(
        model,
        keep_last=keep_last,
        saves_checkpoints=saves_checkpoints,
        tokenizer=tokenizer,
        log_records=log_records,
    )
    existing = sum(1 for path in Path(checkpoint_dir).glob("checkpoint-*") if (path / MARKER).is_file())
    new_checkpoints = max(estimate.checkpoints_at_peak - min(existing, keep_last), 1)
    check_free_space(
        {
            "train.checkpoint_dir": (Path(checkpoint_dir), new_checkpoints * estimate.checkpoint),
            model_entry: (Path(model_dir), estimate.final_model),
        },
        fix="free disk space, lower train.keep_last, or set train.checkpoint_dir to a disk with room.",
    )
    return estimate


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind ``error``: itself, one in its cause/context chain, or one named in its text.

    Libraries written in Rust or C++ (safetensors) report a failed write as their own exception whose text
    ends in ``(os error 28)``.
    """
    for current in exception_chain(error):
        if isinstance(current, OSError) and current.errno is not None:
            return current
        match = _OS_ERROR_TEXT.search(str(current))
        if match:
            number = int(match.group(1))
            return OSError(number, os.strerror(number))
    return None


def storage_error(error: OSError, what: str, *, parameter: str, detail: str = "") -> StorageError | OSError:
    """``error`` as one StorageError line when it is a full disk, a used-up quota, a file over a size limit
    (each named as what it is) or a permission problem, else ``error`` itself."""
    reason = os.strerror(error.errno) if error.errno else type(error).__name__
    if error.errno == errno.EFBIG:  # the disk may have room: the file outgrew a limit
        return StorageError(
            f"{what}: the file is larger than this file system or the process's file-size limit allows "
            f"({reason}){detail}.",
            fix=f"point {parameter} at a file system that holds files this large (FAT32 stops at 4 GB), or "
            "lift the limit (`ulimit -f unlimited`, or ask whoever set it), then rerun.",
        )
    if error.errno == getattr(errno, "EDQUOT", None):
        return StorageError(
            f"{what}: your disk quota is used up ({reason}){detail}.",
            fix=f"free space within your quota, ask for a larger one, or point {parameter} at a disk with "
            "room, then rerun.",
        )
    if error.errno in DISK_FULL:
        return StorageError(
            f"{what}: the disk is full ({reason}){detail}.",
            fix=f"free disk space, or point {parameter} at a disk with room, then rerun.",
        )
    if error.errno in NOT_WRITABLE:
        return StorageError(
            f"{what} ({reason}){detail}.",
            fix=f"make it writable (permissions, a read-only mount) or point {parameter} at "
            "a writable folder, then rerun.",
        )
    return error


def _size(size: int) -> str:
    value = float(size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1000:
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
