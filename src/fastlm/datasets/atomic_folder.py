"""Write a folder atomically: build it beside the target, then swap it in (one atomic exchange on Linux).

Beside a target ``name`` a write leaves, only while it runs, ``.name.tmp-<host>-<pid>-<hex>`` (the new copy
being written) and, where the system cannot exchange two folders in one call, ``.name.old-<host>-<pid>-<hex>``
(the previous copy, between the two renames of the swap). A process killed part way leaves them behind:
:func:`recover_folder` (called by the next load and the next write) puts a complete new copy in place of a
missing target, and the next write removes what a writer no longer alive left there (the rules of
``fastlm.temporary_files``: whether a writer is alive is told by its pid on its own host only; another host's,
on a shared filesystem, is taken for alive until nothing it left has changed for ``OTHER_HOST_STALE_S``).
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fastlm.engine.checkpoint.storage import StorageError, os_error_in, storage_error
from fastlm.engine.checkpoint.swap import replace_folder
from fastlm.errors import FastlmError
from fastlm.temporary_files import (
    give_umask_mode,
    remove_leftovers,
    shown_path,
    tag_writer,
    writer_alive,
    writer_tag,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


def write_folder_atomically(target: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a fresh sibling folder; replace ``target`` only if it succeeds.

    A crash or an exception before the swap leaves the old ``target`` untouched; the swap itself is one
    ``renameat2(RENAME_EXCHANGE)`` where the system has it, else two renames on one filesystem (a swap cut
    between them is recovered by :func:`recover_folder`). What earlier writers, no longer alive, left beside
    ``target`` is removed first. A full disk or a denied write is one ``StorageError`` line naming ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_folder(target)
    remove_leftovers(target)
    tag = writer_tag()
    tmp = target.with_name(f".{target.name}.tmp-{tag}")
    old = target.with_name(f".{target.name}.old-{tag}")
    try:
        write(tmp)
        give_umask_mode(tmp)  # safetensors writes its files 0o600
        _fsync_tree(tmp)
        replace_folder(tmp, target, old)
    except Exception as exc:
        error = write_failure(exc, target, "; the partial copy was removed and the previous one is kept")
        if error is not None:
            raise error from exc
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the previous copy after an exchange, else the failed one
        shutil.rmtree(old, ignore_errors=True)


def write_failure(error: BaseException, target: str | Path, detail: str) -> StorageError | None:
    """``error``, raised writing the catalog's ``target``, as one ``StorageError`` line naming it where it is
    a full disk (ENOSPC, EDQUOT, EFBIG) or a denied write, ``detail`` saying what is left; else None."""
    os_error = os_error_in(error)
    failure = (
        None
        if os_error is None
        else storage_error(
            os_error,
            f"could not write {shown_path(target)}",
            parameter="its path in conf/base/catalog.yml",
            detail=detail,
        )
    )
    return failure if isinstance(failure, StorageError) else None


def recover_folder(target: str | Path) -> bool:
    """Where ``target`` is missing but a swap of :func:`write_folder_atomically` was cut between its two
    renames (``.name.old-<tag>`` beside ``.name.tmp-<tag>``, whose writer is gone), put that new copy in place
    (complete: the swap starts only once it is written and fsynced), remove the previous one and say so in
    one log line. True where it did; a swap of a live writer is left to it."""
    target = Path(target)
    if target.exists() or target.is_symlink() or not target.parent.is_dir():
        return False
    prefix = f".{target.name}.old-"
    for old in sorted(target.parent.glob(f"{glob.escape(prefix)}*")):
        tag = old.name[len(prefix) :]
        new = target.with_name(f".{target.name}.tmp-{tag}")
        if not new.is_dir() or writer_alive(tag, new):
            continue
        try:
            os.replace(new, target)
        except OSError:  # another process recovered it first
            return target.exists()
        shutil.rmtree(old, ignore_errors=True)
        host, pid = tag_writer(tag) or ("?", "?")
        log.warning(
            "%s was missing: the run writing it (pid %s on %s) stopped between the two renames that swap a "
            "new copy in; recovered its complete new copy (%s) and removed the previous one",
            shown_path(target),
            pid,
            host,
            new.name,
        )
        return True
    return False


# A folder read (``read_folder_whole``) while another process replaced it: read again this many times at most
READ_AGAIN = 3


def read_folder_whole(target: str | Path, read: Callable[[], T]) -> T:
    """``read()`` of the folder ``target``, read again where :func:`write_folder_atomically` replaced it
    meanwhile (another command's save: a training ending while a report or predict loads its model), so what
    it returns comes from one folder, never the old folder's files with the new one's. The folder is
    replaced whole by a rename: its inode (and change time) differ after a swap. A read that fails while the
    folder was being replaced is read again too; one that still sees it replaced after ``READ_AGAIN`` more
    reads is one ``FastlmError`` line."""
    target = Path(target)
    for _ in range(READ_AGAIN + 1):
        before = _folder_state(target)
        try:
            result = read()
        except Exception:
            if _folder_state(target) == before:  # not replaced (or not there at all): the read's own failure
                raise
            continue
        if before is not None and _folder_state(target) == before:
            return result
    raise FastlmError(
        f"{shown_path(target)} was replaced by another command each time it was read ({READ_AGAIN + 1} "
        "times): a training or another run is writing it.",
        fix="wait for that command to finish, then rerun.",
    )


def _folder_state(folder: Path) -> tuple[int, int, int] | None:
    try:
        found = os.stat(folder)
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_ctime_ns


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
