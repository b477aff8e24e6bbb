"""Atomic, resumable training checkpoints: ``root/checkpoint-<step:08d>/``.

A checkpoint is written into a temporary sibling folder (``root/.tmp-checkpoint-<step>-<pid>-<rand>``);
every file is fsync'ed, then the ``COMPLETE`` marker (a small JSON manifest with each file's size) is written
and fsync'ed last, then the folder is renamed into place and ``root`` is fsync'ed. A crash at any point
leaves either the previous checkpoints alone (plus a ``.tmp-*`` folder that the next save removes) or a
complete new one: a ``checkpoint-*`` folder without ``COMPLETE`` never comes from this module, and
:func:`latest_checkpoint` never picks one.

Contents:

- ``model.safetensors``: ``safetensors.torch.save_model`` (one copy of tied tensors, e.g. a tied LM head);
- ``optimizer.pt``, ``scheduler.pt``, ``grad_scaler.pt`` (when given): ``torch.save`` of the state dicts;
- ``rng.pt``: the torch CPU RNG state and, when CUDA is available, every CUDA device's RNG state (tensors);
- ``trainer_state.json``: the caller's ``state`` (JSON: step, epoch, position, metric history, config digest)
  and the Python ``random`` and NumPy global RNG states as plain lists, so nothing needs pickle;
- ``COMPLETE``: ``{"format": 1, "step": ..., "files": {name: size in bytes}}``.

Loading uses ``weights_only=True`` for every ``torch.load`` and checks each file against the manifest first,
so a truncated or missing file fails with one clear line (:class:`CheckpointError`) instead of a stack of
pickle or safetensors internals.

One process writes into a ``root`` (rank 0 under DDP): a save removes every ``.tmp-*`` folder it finds there,
which would break a second writer, so a training run holds :func:`checkpoint_lock` on its folder (a ``.lock``
file naming its PID; a second run is refused in one line, a lock left by a process that no longer runs is taken
over). Pass the unwrapped model (not the DDP wrapper or a ``torch.compile``
module), so the tensor names do not depend on how the model was run.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import secrets
import shutil
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from fastlm.engine.checkpoint.layout import (
    FORMAT_VERSION,
    GRAD_SCALER_FILE,
    LOCK_FILE,
    MARKER,
    MODEL_FILE,
    OPTIMIZER_FILE,
    RNG_FILE,
    SCHEDULER_FILE,
    STATE_FILE,
    SUPERSEDED_PREFIX,
    TMP_PREFIX,
)
from fastlm.engine.checkpoint.storage import os_error_in, storage_error
from fastlm.errors import FastlmError

log = logging.getLogger(__name__)


_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(FastlmError, ValueError):
    """A checkpoint that cannot be used; the message is one line naming the file and the fix.

    A FastlmError, so the project CLI prints it as one line and exits with status 2 (no traceback).
    """


def checkpoint_dir(root: Path, step: int) -> Path:
    return Path(root) / f"checkpoint-{step:08d}"


# --------------------------------------------------------------------------------------------- writing


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    grad_scaler: torch.amp.GradScaler | None = None,
    state: dict,
    keep_last: int | None = 2,
    model_state: dict | None = None,
    optimizer_state: dict | None = None,
    also_keep: Path | None = None,
) -> Path:
    """Write ``root/checkpoint-<step:08d>/`` atomically, then keep only the ``keep_last`` newest ones (and
    ``also_keep``: early stopping's best checkpoint).

    An existing folder for the same step is replaced (the old one is moved aside first, then deleted).
    ``keep_last=None`` keeps every checkpoint. Returns the checkpoint folder.
    ``model_state`` / ``optimizer_state``: full state dicts gathered from a sharded (FSDP2) model, written instead
    of ``model.state_dict()`` / ``optimizer.state_dict()`` (same files, so any world size or strategy resumes).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    trainer_state = {
        "format": FORMAT_VERSION,
        "step": step,
        "state": state,
        "rng": {"python": _python_rng_state(), "numpy": _numpy_rng_state()},
    }
    try:  # fail before touching the disk
        state_bytes = json.dumps(trainer_state, indent=2).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise TypeError(f"checkpoint state must be JSON-serialisable: {error}") from error

    started = time.perf_counter()
    root = Path(root)
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        _fsync_dir(root.parent)
    _remove_temporaries(root)  # space left by an earlier crash, before writing a new copy
    final = checkpoint_dir(root, step)
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        if model_state is None:
            safetensors.torch.save_model(model, str(tmp / MODEL_FILE), metadata={"format": "pt", "step": str(step)})
        else:
            safetensors.torch.save_file(model_state, str(tmp / MODEL_FILE), metadata={"format": "pt", "step": str(step)})
        _fsync_file(tmp / MODEL_FILE)
        _torch_save(optimizer.state_dict() if optimizer_state is None else optimizer_state, tmp / OPTIMIZER_FILE)
        _torch_save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
        if grad_scaler is not None:
            _torch_save(grad_scaler.state_dict(), tmp / GRAD_SCALER_FILE)
        _torch_save(_torch_rng_state(), tmp / RNG_FILE)
        _write_bytes(tmp / STATE_FILE, state_bytes)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        marker = {"format": FORMAT_VERSION, "step": step, "files": files}
        _write_bytes(tmp / MARKER, json.dumps(marker, indent=2).encode("utf-8"))  # last
        _fsync_dir(tmp)
        _move_into_place(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, Exception):  # a full disk or a read-only folder: one line, the previous copy named
            _raise_storage_error(error, final)
        raise
    _remove_temporaries(root)
    _prune(root, keep_last, keep={final, also_keep})
    log.info(
        "saved checkpoint %s (%.1f MB in %.2f s)",
        final,
        sum(files.values()) / 1e6,
        time.perf_counter() - started,
    )
    return final


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
        os_error, f"could not write checkpoint {final}", parameter="train.checkpoint_dir",
        detail=f"; the partial copy was removed, {f'the previous checkpoint {kept} is kept' if kept else 'no earlier checkpoint exists'}",
    )
    if clear is not os_error:
        raise clear from error


def _move_into_place(tmp: Path, final: Path) -> None:
    """``os.replace`` cannot replace a non-empty folder: move an existing one aside first, delete it after."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f"{TMP_PREFIX}replaced-{final.name}-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)  # put the previous copy back
        raise
    _fsync_dir(final.parent)
    if old is not None:
        _remove_path(old)


def _prune(root: Path, keep_last: int | None, *, keep: set[Path | None]) -> None:
    if keep_last is None:
        return
    complete = _complete_checkpoints(root)  # (step, path), oldest first
    for _, path in complete[:-keep_last]:
        if path in keep:
            continue
        trash = root / f"{TMP_PREFIX}delete-{path.name}-{os.getpid()}-{secrets.token_hex(4)}"
        try:  # rename first: a crash during the delete must not leave a half-deleted checkpoint-* folder
            os.replace(path, trash)
        except OSError as error:
            log.warning("could not remove old checkpoint %s: %s", path, error)
            continue
        _remove_path(trash)
        log.info("removed old checkpoint %s (keep_last=%d)", path, keep_last)
    _fsync_dir(root)


def _remove_temporaries(root: Path) -> None:
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
    """A file for ``torch.save`` that keeps the OSError of a failed write (torch's zip writer drops its errno)."""

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


# --------------------------------------------------------------------------------------------- finding


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _CHECKPOINT_RE.match(path.name)
        if match and path.is_dir() and (path / MARKER).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or None.

    Folders without the ``COMPLETE`` marker, temporary folders and names that do not parse are ignored.
    """
    complete = _complete_checkpoints(root)
    return complete[-1][1] if complete else None


def complete_checkpoints(root: Path) -> list[Path]:
    """Every complete checkpoint folder directly under ``root``, oldest (lowest step) first."""
    return [path for _, path in _complete_checkpoints(root)]


def read_checkpoint_state(path: Path) -> dict:
    """The ``state`` a checkpoint was saved with (step, position, settings digest), without loading tensors.

    A missing or cut-off manifest or state file raises :class:`CheckpointError`.
    """
    return read_header(path)["trainer_state"]["state"]


def read_header(path: Path) -> dict:
    """A checkpoint's manifest and trainer state (``{"manifest": ..., "trainer_state": ...}``), no tensors.

    Read once on resume: :func:`load_checkpoint` takes it back (``header=``) instead of reading the files again.
    A missing or cut-off manifest or state file raises :class:`CheckpointError`.
    """
    folder = Path(path)
    manifest = _read_manifest(folder)
    return {"manifest": manifest, "trainer_state": _read_trainer_state(folder / STATE_FILE)}


def unfinished_runs(base: Path) -> list[Path]:
    """Run folders under ``base`` whose newest checkpoint stopped before its run's ``total_steps``, newest first.

    A run folder is a direct subfolder holding ``checkpoint-*`` folders; its newest checkpoint's ``COMPLETE``
    marker time orders the runs. Unreadable states and checkpoints without ``total_steps`` are skipped.
    """
    base = Path(base)
    found = []
    for folder in base.iterdir() if base.is_dir() else ():
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        newest = latest_checkpoint(folder)
        if newest is None:
            continue
        try:
            state = read_checkpoint_state(newest)
        except CheckpointError:
            continue
        total = state.get("total_steps")
        if isinstance(total, int) and int(state.get("step", 0)) < total:
            found.append(((newest / MARKER).stat().st_mtime, folder))
    return [folder for _, folder in sorted(found, reverse=True)]


def move_aside(root: Path) -> Path | None:
    """Move every ``checkpoint-*`` folder of ``root`` into ``root/superseded-<time>/`` (out of the way of a run
    that starts fresh there, kept for the user); returns that folder, or None when there was nothing to move."""
    root = Path(root)
    old = [path for path in root.glob("checkpoint-*") if path.is_dir()] if root.is_dir() else []
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


@contextmanager
def checkpoint_lock(root: Path) -> Iterator[Path]:
    """Hold ``root/.lock`` while one training run writes checkpoints into ``root``.

    A lock held by a running process (this machine) or written on another machine is refused with one
    :class:`CheckpointError` line naming the holder's PID; a lock whose process no longer runs is taken over.
    """
    root = Path(root)
    created = not root.exists()  # removed again when the run leaves it empty (e.g. refused before any step)
    root.mkdir(parents=True, exist_ok=True)
    lock = root / LOCK_FILE
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    for _ in range(3):
        try:
            handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _lock_holder(lock)
            if holder is not None and _holder_runs(holder):
                raise CheckpointError(
                    f"checkpoint folder {root} is in use by another training run (PID {holder['pid']} on "
                    f"{holder.get('host', '?')}, lock file {lock}).",
                    fix="wait for that run to finish or stop it, or give this run its own --params run_name=...; "
                    f"delete {lock} only if that process is gone.") from None
            log.warning("taking over %s: the training run that held it (PID %s) no longer runs", lock,
                        holder.get("pid") if holder else "unknown")
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(mine)
        break
    else:
        raise CheckpointError(f"could not take the lock {lock} of checkpoint folder {root}.",
                              fix="make sure no other training run writes there, delete the file and rerun.")
    try:
        yield lock
    finally:
        try:
            if lock.read_text(encoding="utf-8") == mine:
                lock.unlink()
            if created and not any(root.iterdir()):
                root.rmdir()
        except OSError:
            pass


def _lock_holder(lock: Path) -> dict | None:
    try:
        holder = json.loads(lock.read_text(encoding="utf-8"))
        return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None
    except (OSError, ValueError):
        return None  # cut off while being written: its writer died


def _holder_runs(holder: dict) -> bool:
    """Whether the lock's process still runs; a lock from another machine (a shared disk) counts as held."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder["pid"]
    if os.name == "nt":  # os.kill would terminate the process on Windows
        try:
            import psutil
        except ImportError:
            return True  # cannot tell: the message names the file to delete
        return psutil.pid_exists(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resolve_resume(root: Path, resume: str) -> Path | None:
    """``"auto"``: the latest complete checkpoint under ``root`` (None when there is none); ``"never"``: None;
    anything else: the path of a complete checkpoint folder (absolute, relative to the working directory, or
    a folder name under ``root``), else :class:`CheckpointError`."""
    if resume == "auto":
        return latest_checkpoint(root)
    if resume == "never":
        return None
    if not isinstance(resume, str | os.PathLike) or not str(resume).strip():
        raise CheckpointError(f"train.resume must be 'auto', 'never' or a checkpoint folder, got {resume!r}")
    path = Path(resume).expanduser()
    if not path.exists() and not path.is_absolute() and (Path(root) / path).exists():
        path = Path(root) / path
    if not path.is_dir():
        raise CheckpointError(
            f"train.resume: checkpoint folder {path} does not exist; "
            "set train.resume to 'auto', 'never' or an existing checkpoint folder"
        )
    if not (path / MARKER).is_file():
        raise CheckpointError(
            f"train.resume: {path} is not a complete checkpoint (no {MARKER} marker, the save was interrupted); "
            "point train.resume at a complete checkpoint, or set train.resume: auto or never"
        )
    return path


# --------------------------------------------------------------------------------------------- loading


def load_checkpoint(
    path: Path,
    *,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    grad_scaler: torch.amp.GradScaler | None = None,
    map_location: str | torch.device = "cpu",
    restore_rng: bool = True,
    header: dict | None = None,
) -> dict:
    """Load a checkpoint folder into ``model`` (and the optimizer, scheduler and grad scaler when given).

    Restores the torch, CUDA, Python and NumPy RNG states when ``restore_rng``. Returns the saved ``state``.
    ``header``: :func:`read_header`'s result for this folder when the caller already read it.
    A missing, truncated or mismatched file raises :class:`CheckpointError`.
    """
    folder = Path(path)
    manifest = header["manifest"] if header is not None else _read_manifest(folder)
    files = manifest["files"]
    for name, size in files.items():
        file = folder / name
        if not file.is_file():
            raise _broken(file, "missing")
        actual = file.stat().st_size
        if actual != size:
            raise _broken(file, f"truncated or changed ({actual} bytes, the save wrote {size})")
    for name in (MODEL_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE, STATE_FILE):
        if name not in files:
            raise _broken(folder / name, f"missing (not listed in {MARKER})")

    trainer_state = header["trainer_state"] if header is not None else _read_trainer_state(folder / STATE_FILE)

    model_file = folder / MODEL_FILE
    try:
        if model is not None:  # None: the caller loads the weights itself (a sharded model, see distributed.py)
            safetensors.torch.load_model(model, str(model_file), strict=True, device=_safetensors_device(map_location))
    except Exception as error:
        raise _broken(model_file, f"unreadable or does not match the model ({_one_line(error)})") from error

    if optimizer is not None:
        _load_into(optimizer, folder / OPTIMIZER_FILE, map_location)
    if scheduler is not None:
        _load_into(scheduler, folder / SCHEDULER_FILE, map_location)
    if grad_scaler is not None:
        if GRAD_SCALER_FILE in files:
            _load_into(grad_scaler, folder / GRAD_SCALER_FILE, "cpu")
        else:
            log.warning("%s has no %s; the grad scaler starts fresh", folder, GRAD_SCALER_FILE)
    if restore_rng:
        rng = _torch_load(folder / RNG_FILE, "cpu")  # RNG states must stay CPU byte tensors
        try:
            torch.set_rng_state(rng["torch"])
            _set_cuda_rng_states(rng.get("cuda"))
            _set_python_rng_state(trainer_state["rng"]["python"])
            _set_numpy_rng_state(trainer_state["rng"]["numpy"])
        except Exception as error:
            raise _broken(folder / RNG_FILE, f"holds unusable RNG states ({_one_line(error)})") from error
    if restore_rng:  # the full load
        log.info("loaded checkpoint %s (step %s)", folder, trainer_state.get("step"))
    return trainer_state["state"]


def _read_manifest(folder: Path) -> dict:
    marker = folder / MARKER
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint folder {folder} does not exist; set train.resume to 'auto', 'never' or an existing checkpoint"
        )
    if not marker.is_file():
        raise _broken(marker, "missing (the save was interrupted)")
    try:
        manifest = json.loads(marker.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise ValueError("no 'files' table")
        if manifest.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {manifest.get('format')!r}, this version reads {FORMAT_VERSION}")
    except (OSError, ValueError) as error:
        raise _broken(marker, f"unreadable ({_one_line(error)})") from error
    return manifest


def _read_trainer_state(file: Path) -> dict:
    try:
        trainer_state = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(trainer_state, dict) or not {"state", "rng"} <= trainer_state.keys():
            raise ValueError("no 'state' or 'rng' entry")
    except (OSError, ValueError) as error:
        raise _broken(file, f"unreadable ({_one_line(error)})") from error
    return trainer_state


def _torch_load(file: Path, map_location: Any) -> Any:
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as error:
        raise _broken(file, f"unreadable ({_one_line(error)})") from error


def _load_into(target: Any, file: Path, map_location: Any) -> None:
    state_dict = _torch_load(file, map_location)
    try:
        target.load_state_dict(state_dict)
    except Exception as error:
        raise _broken(file, f"does not match the {type(target).__name__} ({_one_line(error)})") from error


def _broken(file: Path, reason: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint file {file} is {reason}.",
        fix=f"delete {file.parent} to resume from the previous checkpoint, or set train.resume: never.",
    )


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _safetensors_device(map_location: str | torch.device) -> str:
    return str(torch.device(map_location))


# --------------------------------------------------------------------------------------------- RNG


def _torch_rng_state() -> dict:
    rng: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _set_cuda_rng_states(states: list[torch.Tensor] | None) -> None:
    if not states or not torch.cuda.is_available():
        return
    count = torch.cuda.device_count()
    if len(states) != count:
        log.warning("checkpoint has %d CUDA RNG states, this machine %d devices", len(states), count)
    for index, cuda_state in enumerate(states[:count]):
        torch.cuda.set_rng_state(cuda_state.cpu(), index)


def _python_rng_state() -> dict:
    version, internal, gauss_next = random.getstate()
    return {"version": version, "internal": list(internal), "gauss_next": gauss_next}


def _set_python_rng_state(saved: dict) -> None:
    random.setstate((saved["version"], tuple(saved["internal"]), saved["gauss_next"]))


def _numpy_rng_state() -> dict:
    return _to_json(np.random.get_state(legacy=False))


def _set_numpy_rng_state(saved: dict) -> None:
    np.random.set_state(_from_json(saved))


def _to_json(value: Any) -> Any:
    """NumPy arrays and scalars to plain JSON values (arrays tagged so that :func:`_from_json` restores them)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(key): _to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(item) for item in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=np.dtype(value["dtype"]))
        return {key: _from_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_from_json(item) for item in value]
    return value
