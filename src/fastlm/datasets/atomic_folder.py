"""Write a folder atomically: build it beside the target, then swap it in with renames."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from fastlm.engine.checkpoint.storage import StorageError, os_error_in, storage_error


def write_folder_atomically(target: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a fresh sibling folder; replace ``target`` only if it succeeds.

    A crash or an exception before the swap leaves the old ``target`` untouched; the swap itself is
    two renames on one filesystem. A full disk or a denied write is one ``StorageError`` line naming
    ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = target.with_name(f".{target.name}.tmp-{tag}")
    old = target.with_name(f".{target.name}.old-{tag}")
    try:
        write(tmp)
        _fsync_tree(tmp)
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
    except Exception as exc:
        os_error = os_error_in(exc)
        error = (
            None
            if os_error is None
            else storage_error(
                os_error,
                f"could not write {shown_path(target)}",
                parameter="its path in conf/base/catalog.yml",
                detail="; the partial copy was removed and the previous one is kept",
            )
        )
        if isinstance(error, StorageError):
            raise error from exc
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def shown_path(path: str | Path) -> str:
    """``path`` relative to the working directory (the project root in a run) when it lies under it."""
    relative = os.path.relpath(path)
    return Path(path).as_posix() if relative.startswith("..") else Path(relative).as_posix()
