"""Which checkpoints exist and which one to resume: the complete ``checkpoint-*`` folders of a run folder
(a folder without the ``COMPLETE`` marker, a temporary folder or a name that does not parse is never picked),
the runs of a base folder that stopped early (a checkpoint's ``FINISHED`` marker says its run ended there),
and what ``train.resume`` names.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from fastlm.engine.checkpoint.layout import FINISHED, MARKER, CheckpointError
from fastlm.engine.checkpoint.loading import read_checkpoint_state

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


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


def unfinished_runs(base: Path) -> list[Path]:
    """Run folders under ``base`` whose newest checkpoint stopped before its run's ``total_steps``, newest
    first; a run early stopping ended (its ``early_stopping`` record says ``stopped``) is finished, and so is
    one whose newest checkpoint carries the ``FINISHED`` marker (:func:`finished_step`): a run entered again
    that trained nothing (``max_steps`` lowered to its step, early stopping judged over) or ended without a
    checkpoint of its last step finished there, though the checkpoint's state, written before, reads
    unfinished; otherwise the next unnamed run would take its name and write over its model.

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
        if not finished(newest, state):
            found.append(((newest / MARKER).stat().st_mtime, folder))
    return [folder for _, folder in sorted(found, reverse=True)]


def finished(checkpoint: Path, state: dict) -> bool:
    """Whether the run ended at ``checkpoint`` (``state``: its saved state): its state says so
    (:func:`ended_in_state`) or its ``FINISHED`` marker does (:func:`finished_step`)."""
    return ended_in_state(state) or finished_step(checkpoint) is not None


def ended_in_state(state: dict) -> bool:
    """Whether a checkpoint's saved ``state`` says its run ended there: its step reached the run's
    ``total_steps`` (a state without one counts as ended: nothing says what is left) or early stopping
    stopped it. A time-budget or signal stop is neither: ``train.resume: auto`` continues those."""
    total = state.get("total_steps")
    if not isinstance(total, int) or int(state.get("step", 0)) >= total:
        return True
    return bool((state.get("early_stopping") or {}).get("stopped"))


def finished_step(checkpoint: Path) -> int | None:
    """The step the run ended at, as ``checkpoint``'s ``FINISHED`` marker records it
    (``files.mark_finished``); None without one, or one that cannot be read or records a step before the
    checkpoint's own (nothing writes that): the checkpoint's state then decides, as it did before markers
    existed. The marker lives in the checkpoint's folder, so a newer checkpoint of the run (continued by
    name) is judged on its own, and a checkpoint moved aside takes its marker along."""
    try:
        record = json.loads((Path(checkpoint) / FINISHED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    match = _CHECKPOINT_RE.match(Path(checkpoint).name)
    if not isinstance(step, int) or isinstance(step, bool) or (match and step < int(match.group(1))):
        return None
    return step


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
    inside = latest_checkpoint(path) if not (path / MARKER).is_file() else None
    if inside is not None:  # a run's folder (data/06_models/checkpoints/<run>), not one of its checkpoints
        raise CheckpointError(
            f"train.resume: {path} is a run folder, not a checkpoint: its newest complete checkpoint is "
            f"{inside}",
            fix=f"set train.resume: {inside} (or another checkpoint-* folder of it), or train.resume: auto "
            f"with run_name: {path.name} to continue that run's newest.",
        )
    if not (path / MARKER).is_file():
        raise CheckpointError(
            f"train.resume: {path} is not a complete checkpoint (no {MARKER} marker, the save was "
            "interrupted); "
            "point train.resume at a complete checkpoint, or set train.resume: auto or never"
        )
    return path
