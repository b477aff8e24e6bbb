"""Reading a training checkpoint back: its header (manifest and trainer state, no tensors) and the full load
into a model, optimizer, scheduler and grad scaler, with the RNG states (``rng``).

Loading uses ``weights_only=True`` for every ``torch.load`` and checks each file against the manifest first,
so a truncated or missing file fails with one clear line (:class:`CheckpointError`) instead of a stack of
pickle or safetensors internals.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from fastlm.engine.checkpoint.layout import (
    FORMAT_VERSION,
    GRAD_SCALER_FILE,
    MARKER,
    MODEL_FILE,
    OPTIMIZER_FILE,
    RNG_FILE,
    SCHEDULER_FILE,
    STATE_FILE,
    CheckpointError,
)
from fastlm.engine.checkpoint.rng import restore_rng_states, states_of_rank
from fastlm.engine.observe import strict_json

log = logging.getLogger(__name__)


def read_checkpoint_state(path: Path) -> dict:
    """The ``state`` a checkpoint was saved with (step, position, settings digest), without loading tensors.

    A missing or cut-off manifest or state file raises :class:`CheckpointError`.
    """
    return read_header(path)["trainer_state"]["state"]


def read_header(path: Path) -> dict:
    """A checkpoint's manifest and trainer state (``{"manifest": ..., "trainer_state": ...}``), no tensors.

    Read once on resume: :func:`load_checkpoint` takes it back (``header=``) instead of reading the files
    again. A missing or cut-off manifest or state file raises :class:`CheckpointError`.
    """
    folder = Path(path)
    manifest = _read_manifest(folder)
    return {"manifest": manifest, "trainer_state": _read_trainer_state(folder / STATE_FILE)}


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
    rank: tuple[int, int] = (0, 1),
) -> dict:
    """Load a checkpoint folder into ``model`` (and the optimizer, scheduler and grad scaler when given).

    Restores the torch, CUDA, Python and NumPy RNG states when ``restore_rng``: those of ``rank`` (this
    process's rank, the run's number of processes; ``rng.states_of_rank``). Returns the saved ``state``.
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

    trainer_state = (
        header["trainer_state"] if header is not None else _read_trainer_state(folder / STATE_FILE)
    )

    model_file = folder / MODEL_FILE
    try:
        # None: the caller loads the weights itself (a sharded model, see distributed.py)
        if model is not None:
            safetensors.torch.load_model(
                model, str(model_file), strict=True, device=_safetensors_device(map_location)
            )
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
            restore_rng_states(
                *states_of_rank(
                    rng,
                    trainer_state["rng"],
                    rank=rank[0],
                    world_size=rank[1],
                    saved_world_size=int(trainer_state["state"].get("world_size") or 1),
                    where=folder,
                )
            )
        except Exception as error:
            raise _broken(folder / RNG_FILE, f"holds unusable RNG states ({_one_line(error)})") from error
    if restore_rng:  # the full load
        log.info("loaded checkpoint %s (step %s)", folder, trainer_state.get("step"))
    return trainer_state["state"]


def _read_manifest(folder: Path) -> dict:
    marker = folder / MARKER
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint folder {folder} does not exist; set train.resume to 'auto', 'never' or an existing "
            "checkpoint"
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
        trainer_state = strict_json.loads(file.read_text(encoding="utf-8"))
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
        if isinstance(target, torch.optim.Optimizer):
            _check_moment_shapes(target)
    except Exception as error:
        raise _broken(file, f"not a state of this {type(target).__name__} ({_one_line(error)})") from error


# An optimizer's per-parameter tensors shaped as the parameter (torch's AdamW, Adam, SGD); an 8-bit
# optimizer's quantized states have shapes of their own and are not among them.
_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")


def _check_moment_shapes(optimizer: torch.optim.Optimizer) -> None:
    """Raise ValueError where a loaded moment's shape is not its parameter's: torch's ``load_state_dict``
    checks the groups' sizes only, and a step over moments of other parameters (a state of another layout)
    trained on wrong moments, or, fused, read past them."""
    params = [param for group in optimizer.param_groups for param in group["params"]]
    for index, param in enumerate(params):
        state = optimizer.state.get(param, {})
        for key in _MOMENTS:
            moment = state.get(key)
            if isinstance(moment, torch.Tensor) and moment.shape != param.shape:
                raise ValueError(
                    f"its {key} of parameter {index} of {len(params)} has shape {tuple(moment.shape)}, the "
                    f"parameter {tuple(param.shape)}"
                )


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
