"""Write a folder atomically: build it beside the target, then swap it in with renames."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def write_folder_atomically(target: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a fresh sibling folder; replace ``target`` only if it succeeds.

    A crash or an exception before the swap leaves the old ``target`` untouched; the swap itself is
    two renames on one filesystem.
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
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
