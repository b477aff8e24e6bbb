"""Which checkpoints exist and which one to resume: the complete ``checkpoint-*`` folders of a run folder
(a folder without the ``COMPLETE`` marker, a temporary folder or a name that does not parse is never picked),
the runs of a base folder that stopped early, and what ``train.resume`` names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastlm.engine.checkpoint.layout import MARKER, CheckpointError
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
    first; a run early stopping ended (its ``early_stopping`` record says ``stopped``) is finished.

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
        stopped_early = bool((state.get("early_stopping") or {}).get("stopped"))
        if isinstance(total, int) and int(state.get("step", 0)) < total and not stopped_early:
            found.append(((newest / MARKER).stat().st_mtime, folder))
    return [folder for _, folder in sorted(found, reverse=True)]


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
