"""Temporary files and folders written beside a target, then renamed over it (``write_file_atomically``
here; ``datasets.atomic_folder`` for folders, ``engine.checkpoint.files`` for checkpoints), and
:func:`held_exclusively`, for a read-change-write of a file that two processes may do at once.

Each is named with a :func:`writer_tag` (``<host>-<pid>-<hex>``), unique per write, so two writers of one
target never write into one temporary file, and :func:`tag_writer` reads it back: a process killed part way
leaves its temporary copy, which the next write of the target removes once its writer is gone
(:func:`remove_leftovers`). Whether a writer still runs can be told only on its host: on a shared filesystem
(NFS, a cluster's shared home) another host's pid means nothing here, so its copy is taken for a live
writer's until nothing in it has changed for ``OTHER_HOST_STALE_S``.

Imports nothing of fastlm: the engine's lowest layers write through it too.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

log = logging.getLogger(__name__)
# A leftover of a writer on another host (NFS, a cluster's shared home: its pid means nothing here) is kept as
# a live writer's until nothing in it has changed for this long (seconds): a day, longer than any write takes.
OTHER_HOST_STALE_S = 24 * 3600


# <host>-<pid>-<hex>; the tags written before the host was named, <pid>-<hex>, are this host's
WRITER_TAG = re.compile(r"(?:(?P<host>[A-Za-z0-9_.-]+)-)?(?P<pid>\d+)-[0-9a-f]+")


def host_name() -> str:
    """This host's name as a tag holds it: letters, digits, ``_``, ``.`` and ``-`` (others become ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64] or "_"


def writer_tag() -> str:
    """``<host>-<pid>-<hex>``: which process of which host writes a temporary copy, unique per write."""
    return f"{host_name()}-{os.getpid()}-{secrets.token_hex(4)}"


def tag_writer(tag: str) -> tuple[str, int] | None:
    """The host and pid a :func:`writer_tag` names (a tag without a host: this host's), None if unreadable."""
    match = WRITER_TAG.fullmatch(tag)
    if match is None:
        return None
    return match.group("host") or host_name(), int(match.group("pid"))


def write_file_atomically(
    target: str | Path,
    write: Callable[[TextIO], object] | Callable[[BinaryIO], object],
    *,
    binary: bool = False,
) -> None:
    """``write(handle)`` into a sibling temporary file (``.name.tmp-<writer_tag>``; text, UTF-8, no newline
    translation, or bytes where ``binary``), fsynced, then renamed to ``target``; what earlier writers killed
    part way left beside ``target`` is removed first (:func:`remove_leftovers`). A failure (its ``OSError`` as
    raised, a ``KeyboardInterrupt``) leaves the previous ``target`` and no temporary file."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(target)
    temporary = target.with_name(f".{target.name}.tmp-{writer_tag()}")
    text = {} if binary else {"encoding": "utf-8", "newline": ""}
    try:
        with open(temporary, "wb" if binary else "w", **text) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def held_exclusively(lock: str | Path) -> Iterator[None]:
    """An exclusive ``flock`` on the file ``lock`` (created where missing, kept: removing it would let a
    waiter lock a file another process no longer sees) while the block runs: one process (or thread) at a
    time, the others wait. Released when the block ends or its process dies; where it cannot be taken (no
    ``fcntl``: Windows; a filesystem without locks, an unwritable folder), the block runs unheld."""
    handle = None
    try:
        import fcntl  # POSIX; elsewhere the block runs unheld

        handle = open(lock, "a")  # noqa: SIM115 - held open for the block
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    except (ImportError, OSError) as exc:
        log.debug("%s not locked (%s)", lock, exc)
    try:
        yield
    finally:
        if handle is not None:
            handle.close()  # releases the lock


def remove_leftovers(target: str | Path) -> None:
    """Remove the temporary copies (``.name.tmp-<host>-<pid>-<hex>``, ``.name.old-<host>-<pid>-<hex>``, or
    ``<pid>-<hex>`` of before hosts were named, files or folders) that writers of ``target`` killed part way
    left beside it, and say what in one log line. One whose writer may be alive is kept: another run (of this
    host or another) may be writing it."""
    target = Path(target)
    removed = []
    for kind in ("tmp", "old"):
        prefix = f".{target.name}.{kind}-"
        for path in sorted(target.parent.glob(f"{glob.escape(prefix)}*")):
            tag = path.name[len(prefix) :]
            if tag_writer(tag) is None or writer_alive(tag, path):
                continue
            size = _size(path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            if not (path.exists() or path.is_symlink()):
                removed.append(f"{path.name} ({size / 1e6:.1f} MB)")
    if removed:
        log.info(
            "removed what a stopped write of %s left beside it: %s", shown_path(target), ", ".join(removed)
        )


def writer_alive(tag: str, path: Path) -> bool:
    """Whether the process that wrote ``path`` (``tag``: ``<host>-<pid>-<hex>``, or ``<pid>-<hex>``, this
    host's) may still be writing. Of this host: this process, or a live one that started before ``path`` last
    changed (a process started since, e.g. after a reboot, only has the same pid). Of another host (a shared
    filesystem), whose pid cannot be looked up here: unless nothing in ``path`` has changed for
    ``OTHER_HOST_STALE_S``. An unreadable tag counts as alive."""
    writer = tag_writer(tag)
    if writer is None:
        return True
    host, pid = writer
    if host != host_name():
        return time.time() - _last_change(path) < OTHER_HOST_STALE_S
    if pid == os.getpid():
        return True  # another thread of this run may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    except (OSError, OverflowError):
        return False
    started = _process_start(pid)
    try:
        changed = path.lstat().st_mtime
    except OSError:
        return True
    return started is None or started <= changed + 1


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch; Linux /proc), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, after "pid (comm)"
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text(encoding="utf-8").splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _last_change(path: Path) -> float:
    """When ``path`` or anything in it last changed (a writer adds to a file inside a folder without changing
    the folder's own time); now where it cannot be read."""
    try:
        items = [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]
        return max(item.lstat().st_mtime for item in items)
    except OSError:
        return time.time()


def _size(path: Path) -> int:
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


def shown_path(path: str | Path) -> str:
    """``path`` relative to the working directory (the project root in a run) when it lies under it."""
    relative = os.path.relpath(path)
    return Path(path).as_posix() if relative.startswith("..") else Path(relative).as_posix()


def umask_mode() -> int:
    """The mode a new file gets under this process's umask (``0o666 & ~umask``)."""
    try:  # Linux: read without changing it (other threads may be creating files)
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def give_umask_mode(folder: str | Path) -> None:
    """Give the ``.safetensors`` files under ``folder`` the mode any new file gets under the umask:
    safetensors (0.8) writes each through a temporary file it creates 0o600 and renames into place, so a
    model's weights were readable by their writer alone beside config and tokenizer files readable by all."""
    mode = umask_mode()
    for path in Path(folder).rglob("*.safetensors"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)
