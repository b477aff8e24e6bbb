"""One training run per checkpoint folder: :func:`checkpoint_lock` holds ``root/.lock`` (naming its PID and
host) while the run writes there; :func:`held_lock` is that lock for any file (``fastlm.hooks``: one `kedro
run` at a time writes an output).

Why: a save removes every ``.tmp-*`` folder it finds in its folder (``files.save_checkpoint``), which would
break a second writer. A second run is refused in one line; a lock left by a process that no longer runs (a
worker killed by SIGKILL or the OOM killer) is taken over, by one run only: two runs that both find it stale
take turns, and the second finds the first's lock and is refused.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fastlm.engine.checkpoint.layout import LOCK_FILE, CheckpointError
from fastlm.engine.checkpoint.storage import storage_error

log = logging.getLogger(__name__)


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
    try:
        with held_lock(lock, lambda holder: checkpoint_in_use(root, holder)):
            yield lock
    finally:
        try:
            if created and not any(root.iterdir()):
                root.rmdir()
        except OSError:
            pass


def checkpoint_in_use(root: Path, holder: dict) -> CheckpointError:
    """The one line refusing a run whose checkpoint folder ``root`` another run (``holder``) holds."""
    lock = Path(root) / LOCK_FILE
    return CheckpointError(
        f"checkpoint folder {root} is in use by another training run (PID {holder['pid']} on "
        f"{holder.get('host', '?')}, lock file {lock}).",
        fix="wait for that run to finish or stop it, or give this run its own --params "
        f"run_name=...; delete {lock} only if that process is gone.",
    )


def refuse_held_checkpoint(root: Path) -> None:
    """Refuse, before a run starts (before MLflow opens a run of its name), where another running process
    holds the checkpoint folder ``root`` (:func:`checkpoint_lock` still decides when training starts)."""
    holder = _lock_holder(_lock_text(Path(root) / LOCK_FILE))
    if holder is not None and not _is_this_process(holder) and _holder_runs(holder):
        raise checkpoint_in_use(root, holder)


@contextmanager
def held_lock(
    lock: Path,
    refusal: Callable[[dict], Exception],
    *,
    record: dict | None = None,
    own_is_stale: bool = False,
) -> Iterator[Path]:
    """Hold the file ``lock`` (``{"pid", "host"}`` and ``record``) while the block runs (its folder exists).

    A lock of a running process (this machine) or written on another machine raises ``refusal(holder)``; a
    lock whose process no longer runs (or, with ``own_is_stale``, this process's: an earlier use that never
    reached its end) is taken over. Released (removed while it is still this one's) when the block ends.
    """
    lock = Path(lock)
    mine = json.dumps({**(record or {}), "pid": os.getpid(), "host": socket.gethostname()})
    being_written = False
    for _ in range(_ATTEMPTS):
        try:
            handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            seen = _lock_text(lock)
            holder = _lock_holder(seen)
            own = holder is not None and _is_this_process(holder)
            if holder is not None and _holder_runs(holder) and not (own and own_is_stale):
                raise refusal(holder) from None
            # no holder in a young lock: created and not yet written by its run (a killed writer's is older)
            being_written = holder is None and seen is not None and _younger_than(lock, GUARD_STALE_S)
            if being_written:
                time.sleep(_GUARD_WAIT_S)
                continue
            removed = _remove_if_unchanged(lock, seen)
            if removed is None:
                time.sleep(_GUARD_WAIT_S)  # another process is taking it over: it holds it or frees it
            elif removed and not own:  # else it changed meanwhile (another run's now): read again
                log.warning(
                    "taking over %s: the process that held it (PID %s) no longer runs",
                    lock,
                    holder.get("pid") if holder else "unknown",
                )
            continue
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(mine)
        except OSError as error:  # a disk with room for the name but not the bytes: no empty lock left
            lock.unlink(missing_ok=True)
            clear = storage_error(error, f"could not write the lock {lock}", parameter="that folder")
            if clear is error:
                raise
            raise clear from error
        break
    else:
        if being_written:
            raise CheckpointError(
                f"could not take the lock {lock}: it names no process, and was written less than "
                f"{GUARD_STALE_S:g} s ago (another run is writing it, or was killed while it did).",
                fix=f"make sure no other process writes there and rerun in {GUARD_STALE_S:g} s (a lock left "
                "cut off by a killed process is taken over then).",
            )
        raise CheckpointError(
            f"could not take the lock {lock}: another process held {_guard(lock)} meanwhile.",
            fix=f"make sure no other process writes there and rerun in {GUARD_STALE_S:g} s (a guard left "
            "by a killed process is removed then).",
        )
    try:
        yield lock
    finally:
        try:
            if lock.read_text(encoding="utf-8") == mine:
                lock.unlink()
        except OSError:
            pass


# A stale lock is removed under a guard file, and only while it still holds what was read as stale: two runs
# that both found it stale would otherwise each remove it by name, the second removing the lock the first had
# just taken, and both write into one folder. The guard is held for a read and an unlink (microseconds): one
# older than GUARD_STALE_S was left by a process killed in between, and is removed (one warning); a younger
# one that stays through the attempts ends them with a line naming it.
_ATTEMPTS = 20
_GUARD_WAIT_S = 0.05
GUARD_STALE_S = 10.0


def _guard(lock: Path) -> Path:
    return lock.with_name(lock.name + ".takeover")


def _remove_if_unchanged(lock: Path, seen: str | None) -> bool | None:
    """Remove ``lock`` if it still holds ``seen`` (a holder that no longer runs): True when removed, False
    when it changed meanwhile, None when another process holds the guard (nothing done)."""
    guard = _guard(lock)
    try:
        os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        if not _remove_stale_guard(guard):
            return None
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return None  # another process took the guard first
    try:
        unchanged = _lock_text(lock) == seen
        if unchanged:
            lock.unlink(missing_ok=True)
    finally:
        guard.unlink(missing_ok=True)
    return unchanged


def _remove_stale_guard(guard: Path) -> bool:
    """Remove ``guard`` if it is older than :data:`GUARD_STALE_S` (its process was killed while holding it);
    True when it is gone. It is moved aside to a name of this process's first and removed only if that is
    the file found stale: two processes that both found it stale would otherwise each remove it by name, the
    second removing the guard the first had just taken."""
    try:
        seen = guard.stat()
    except FileNotFoundError:
        return True
    if time.time() - seen.st_mtime < GUARD_STALE_S:
        return False
    aside = guard.with_name(f"{guard.name}.{socket.gethostname()}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(guard, aside)
    except FileNotFoundError:
        return True  # another process removed it first
    moved = aside.stat()
    if (moved.st_dev, moved.st_ino, moved.st_mtime_ns) != (seen.st_dev, seen.st_ino, seen.st_mtime_ns):
        try:  # another process's fresh guard, taken in between: put it back
            os.link(aside, guard)
        except OSError:
            pass
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    log.warning(
        "removed %s, left %.0f s ago by a process killed while it took over a stale lock",
        guard,
        time.time() - seen.st_mtime,
    )
    return True


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False  # gone meanwhile


def _is_this_process(holder: dict) -> bool:
    return holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()


def _lock_text(lock: Path) -> str | None:
    try:
        return lock.read_text(encoding="utf-8")
    except OSError:
        return None  # gone meanwhile


def _lock_holder(text: str | None) -> dict | None:
    try:
        holder = json.loads(text) if text is not None else None
        return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None
    except ValueError:
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
