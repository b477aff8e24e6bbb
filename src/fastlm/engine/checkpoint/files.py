"""Atomic, resumable training checkpoints: ``root/checkpoint-<step:08d>/``.

A checkpoint is written into a temporary sibling folder (``root/.tmp-checkpoint-<step>-<host>-<pid>-<rand>``);
every file is fsync'ed, then the ``COMPLETE`` marker (a small JSON manifest with each file's size) is written
and fsync'ed last, then the folder is renamed into place and ``root`` is fsync'ed. A crash at any point
leaves either the previous checkpoints alone (plus a ``.tmp-*`` folder that the next save removes) or a
complete new one: a ``checkpoint-*`` folder without ``COMPLETE`` never comes from this module, and
``discovery.latest_checkpoint`` never picks one. A step saved again replaces its folder in one atomic
exchange where the system has it (``swap.replace_folder``); elsewhere a crash between the two renames that
move the old one aside and the new one in is recovered (``recover_checkpoints``) before the writing process
chooses what to resume and at its next save.

Contents:

- ``model.safetensors``: ``safetensors.torch.save_model`` (one copy of tied tensors, e.g. a tied LM head);
- ``optimizer.pt``, ``scheduler.pt``, ``grad_scaler.pt`` (when given): ``torch.save`` of the state dicts;
- ``rng.pt`` (``rng``): the torch CPU RNG state and, when CUDA is available, every CUDA device's RNG state
  (tensors); of a run of several processes, also every rank's states under ``ranks`` (``SaveOptions``);
- ``trainer_state.json``: the caller's ``state`` (JSON: step, epoch, position, metric history, config digest)
  and the Python ``random`` and NumPy global RNG states as plain lists, so nothing needs pickle;
- ``COMPLETE``: ``{"format": 1, "step": ..., "files": {name: size in bytes}}``;
- later, only where its run ended there though its state reads unfinished: ``FINISHED``
  (:func:`mark_finished`), outside the manifest.

One process writes into a ``root`` (rank 0 under DDP) and holds its lock (``lock.checkpoint_lock``): a save
removes every ``.tmp-*`` folder it finds there. Pass the unwrapped model (not the DDP wrapper or a
``torch.compile`` module), so the tensor names do not depend on how the model was run. Reading back:
``loading``; which checkpoints exist: ``discovery``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from fastlm.engine.checkpoint.discovery import complete_checkpoints, latest_checkpoint
from fastlm.engine.checkpoint.layout import (
    FINISHED,
    FORMAT_VERSION,
    GRAD_SCALER_FILE,
    MARKER,
    MODEL_FILE,
    OPTIMIZER_FILE,
    RNG_FILE,
    SCHEDULER_FILE,
    STATE_FILE,
    SUPERSEDED_PREFIX,
    TMP_PREFIX,
    CheckpointError,
    checkpoint_dir,
)
from fastlm.engine.checkpoint.loading import read_checkpoint_state
from fastlm.engine.checkpoint.rng import host_rng_state, torch_rng_state
from fastlm.engine.checkpoint.storage import os_error_in, storage_error
from fastlm.engine.checkpoint.swap import replace_folder
from fastlm.engine.observe import strict_json
from fastlm.temporary_files import WRITER_TAG, give_umask_mode, write_file_atomically, writer_tag

log = logging.getLogger(__name__)
# .tmp-replaced-<checkpoint-NNNNNNNN>-<tag>: a tag of any host (temporary_files.writer_tag), or an older one
_REPLACED = re.compile(rf"{re.escape(TMP_PREFIX)}replaced-(checkpoint-\d+)-({WRITER_TAG.pattern})")


@dataclass(frozen=True)
class SaveOptions:
    """What a save keeps and writes beyond the defaults, one object because these travel together from the
    trainer's ``Checkpointer``: the ``keep_last`` newest checkpoints (None: every one) and ``also_keep``
    (early stopping's best; the best each checkpoint that stays records is kept too, ``_prune``);
    ``model_state`` / ``optimizer_state``: full state dicts gathered from a sharded (FSDP2) model (or a LoRA
    model's trainable tensors), written instead of ``model.state_dict()`` / ``optimizer.state_dict()`` (same
    files, so any world size or strategy resumes); ``rank_rng``: every rank's RNG states in rank order
    (``rng.rank_rng_state``, gathered to the writer), which ``rng.pt`` keeps under ``ranks``."""

    keep_last: int | None = 2
    also_keep: Path | None = None
    model_state: dict | None = None
    optimizer_state: dict | None = None
    rank_rng: list[dict] | None = None


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    grad_scaler: torch.amp.GradScaler | None = None,
    state: dict,
    options: SaveOptions | None = None,
) -> Path:
    """Write ``root/checkpoint-<step:08d>/`` atomically, then keep only the ``options.keep_last`` newest ones
    (and ``options.also_keep``); see ``SaveOptions``.

    An existing folder for the same step is replaced (the old one is moved aside first, then deleted).
    Returns the checkpoint folder.
    """
    options = options or SaveOptions()
    keep_last, model_state, optimizer_state = options.keep_last, options.model_state, options.optimizer_state
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    trainer_state = {
        "format": FORMAT_VERSION,
        "step": step,
        "state": state,
        "rng": host_rng_state(),
    }
    try:  # fail before touching the disk
        state_bytes = strict_json.dumps(trainer_state, indent=2).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise TypeError(f"checkpoint state must be JSON-serialisable: {error}") from error

    started = time.perf_counter()
    root = Path(root)
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        _fsync_dir(root.parent)
    _remove_temporaries(root)  # space left by an earlier crash, before writing a new copy
    final = checkpoint_dir(root, step)
    tag = writer_tag()
    tmp = root / f"{TMP_PREFIX}{final.name}-{tag}"
    tmp.mkdir()
    try:
        if model_state is None:
            safetensors.torch.save_model(
                model, str(tmp / MODEL_FILE), metadata={"format": "pt", "step": str(step)}
            )
        else:
            safetensors.torch.save_file(
                model_state, str(tmp / MODEL_FILE), metadata={"format": "pt", "step": str(step)}
            )
        give_umask_mode(tmp)  # safetensors writes its files 0o600
        _fsync_file(tmp / MODEL_FILE)
        _torch_save(
            optimizer.state_dict() if optimizer_state is None else optimizer_state, tmp / OPTIMIZER_FILE
        )
        _torch_save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
        if grad_scaler is not None:
            _torch_save(grad_scaler.state_dict(), tmp / GRAD_SCALER_FILE)
        rng = torch_rng_state()
        if options.rank_rng is not None:
            rng["ranks"] = options.rank_rng
        _torch_save(rng, tmp / RNG_FILE)
        _write_bytes(tmp / STATE_FILE, state_bytes)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        marker = {"format": FORMAT_VERSION, "step": step, "files": files}
        _write_bytes(tmp / MARKER, json.dumps(marker, indent=2).encode("utf-8"))  # last
        _fsync_dir(tmp)
        _move_into_place(tmp, final, root / f"{TMP_PREFIX}replaced-{final.name}-{tag}")
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        # a full disk or a read-only folder: one line, the previous copy named
        if isinstance(error, Exception):
            _raise_storage_error(error, final)
        raise
    _remove_temporaries(root)
    _prune(root, keep_last, keep={final, options.also_keep})
    log.info(
        "saved checkpoint %s (%.1f MB in %.2f s)",
        final,
        sum(files.values()) / 1e6,
        time.perf_counter() - started,
    )
    return final


def mark_finished(checkpoint: Path, *, step: int, reason: str) -> Path:
    """Write ``checkpoint/FINISHED`` (``{"format", "step", "reason"}``): the run ended at ``step`` from this
    checkpoint, which its saved state cannot say (a run entered again with nothing to train: ``max_steps``
    lowered to its step, early stopping judged over; or one that ended without a checkpoint of its last
    step). Without it ``discovery.unfinished_runs`` took the finished run for an interrupted one, and the
    next unnamed run took its name and wrote over its model.

    A file beside the checkpoint's own, outside its manifest: the checkpoint stays byte for byte what was
    saved, and a run continued by name from it still does (``resume`` never reads the marker). Written to a
    temporary file, fsynced and renamed in (``write_file_atomically``), the folder fsynced: a crash leaves
    the marker whole or absent. Only the process holding the run folder's lock calls it."""
    marker = Path(checkpoint) / FINISHED
    record = {"format": FORMAT_VERSION, "step": int(step), "reason": reason}
    write_file_atomically(marker, lambda handle: handle.write(json.dumps(record) + "\n"))
    _fsync_dir(marker.parent)
    return marker


def _raise_storage_error(error: Exception, final: Path) -> None:
    """Re-raise a disk-full or permission ``error`` as one StorageError line; other errors return unchanged.

    safetensors reports the OS error inside its own exception's text; :func:`_torch_save` re-raises the
    OSError that torch's writer turns into a RuntimeError.
    """
    os_error = os_error_in(error)
    if os_error is None:
        return
    kept = latest_checkpoint(final.parent)
    clear = storage_error(
        os_error,
        f"could not write checkpoint {final}",
        parameter="train.checkpoint_dir",
        detail="; the partial copy was removed, "
        f"{f'the previous checkpoint {kept} is kept' if kept else 'no earlier checkpoint exists'}",
    )
    if clear is not os_error:
        raise clear from error


def _move_into_place(tmp: Path, final: Path, aside: Path) -> None:
    """``os.replace`` cannot replace a non-empty folder: an existing one is exchanged with ``tmp`` in one
    call where the system can, else moved to ``aside`` first (``aside`` shares ``tmp``'s tag, so a crash
    between the two renames is recovered by ``recover_checkpoints``); the previous copy is deleted after."""
    old = replace_folder(tmp, final, aside)
    _fsync_dir(final.parent)
    if old is not None:
        _remove_path(old)


def recover_checkpoints(root: Path) -> list[Path]:
    """Put back the checkpoints whose replacement (a step saved again) was cut between its two renames: the
    step's folder missing, its previous copy moved aside (``.tmp-replaced-<name>-<tag>``) and the complete new
    copy beside it (``.tmp-<name>-<tag>``, its ``COMPLETE`` marker written). The new copy is renamed into
    place, the previous one removed, each said in one log line; returns the folders put back. Only the
    process holding ``root``'s lock calls it (a save of another process is never half-way there)."""
    root = Path(root)
    recovered = []
    for aside in sorted(root.glob(f"{TMP_PREFIX}replaced-*")) if root.is_dir() else []:
        match = _REPLACED.fullmatch(aside.name)
        if match is None:
            continue
        name, tag = match.group(1, 2)
        new, final = root / f"{TMP_PREFIX}{name}-{tag}", root / name
        if final.exists() or final.is_symlink() or not (new / MARKER).is_file():
            continue
        os.replace(new, final)
        _fsync_dir(root)
        _remove_path(aside)
        recovered.append(final)
        log.warning(
            "checkpoint %s was missing: the save replacing it stopped between the two renames that swap the "
            "new copy in; recovered its complete new copy and removed the previous one",
            final,
        )
    return recovered


def _recorded_best(folder: Path) -> int | None:
    """The early-stopping best step checkpoint ``folder`` records (None: none, or unreadable)."""
    try:
        record = read_checkpoint_state(folder).get("early_stopping") or {}
    except (CheckpointError, OSError, ValueError):
        return None
    return record.get("best_step")


def _prune(root: Path, keep_last: int | None, *, keep: set[Path | None]) -> None:
    """Remove all but the ``keep_last`` newest complete checkpoints and ``keep``, sparing the early-stopping
    best each checkpoint that stays records (``early_stopping.best_step`` of its state): a rewind to one of
    them continues with its best model on disk."""
    if keep_last is None:
        return
    complete = complete_checkpoints(root)  # oldest first
    staying = [*complete[-keep_last:], *(path for path in keep if path is not None)]
    spared = keep | {checkpoint_dir(root, step) for step in map(_recorded_best, staying) if step is not None}
    for path in complete[:-keep_last]:
        if path in spared:
            continue
        trash = root / f"{TMP_PREFIX}delete-{path.name}-{writer_tag()}"
        try:  # rename first: a crash during the delete must not leave a half-deleted checkpoint-* folder
            os.replace(path, trash)
        except OSError as error:
            log.warning("could not remove old checkpoint %s: %s", path, error)
            continue
        _remove_path(trash)
        log.info("removed old checkpoint %s (keep_last=%d)", path, keep_last)
    _fsync_dir(root)


def move_aside(root: Path, only: list[Path] | None = None) -> Path | None:
    """Move every ``checkpoint-*`` folder of ``root`` (or those of ``only``) into ``root/superseded-<time>/``
    (out of the way of a run that starts fresh there, or rewinds, kept for the user); returns that folder, or
    None when there was nothing to move."""
    root = Path(root)
    old = [path for path in root.glob("checkpoint-*") if path.is_dir()] if root.is_dir() else []
    if only is not None:
        old = [path for path in old if path in set(only)]
    if not old:
        return None
    aside = root / f"{SUPERSEDED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"
    while aside.exists():
        aside = aside.with_name(f"{aside.name}-{secrets.token_hex(2)}")
    aside.mkdir()
    for path in old:
        os.replace(path, aside / path.name)
    _fsync_dir(root)
    return aside


def _remove_temporaries(root: Path) -> None:
    recover_checkpoints(root)  # a complete copy cut between the renames of its swap is kept, not removed
    for path in root.glob(f"{TMP_PREFIX}*"):
        _remove_path(path)


def _remove_path(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("could not remove %s: %s", path, error)


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as handle:
        writer = _ErrorKeepingWriter(handle)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is not None:  # e.g. ENOSPC, which torch reports as "unexpected pos"
                raise writer.error from None
            raise
        handle.flush()
        os.fsync(handle.fileno())


class _ErrorKeepingWriter:
    """A file for ``torch.save`` that keeps the OSError of a failed write (torch's zip writer drops its
    errno)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.name = handle.name  # the path, as a plain file would show it
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.handle.flush()


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make renames and new entries in ``path`` durable (POSIX; some filesystems refuse, which is fine)."""
    if os.name == "nt":
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
