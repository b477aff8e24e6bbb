"""A folder put in place of another without a moment where neither is there.

``os.replace`` cannot replace a non-empty folder: the usual way moves the old one aside, then renames the new
one in, and a process killed between those two renames (SIGKILL, the OOM killer, a power loss) leaves no
folder at the target. On Linux (glibc >= 2.28) ``renameat2(..., RENAME_EXCHANGE)`` swaps two paths in one
atomic call: :func:`replace_folder` uses it where the system has it and the filesystem accepts it, and falls
back to the two renames elsewhere (whose second, failing, puts the previous folder back).

The temporary copies such a write leaves beside its target while it runs are named with a
:func:`writer_tag` (``<host>-<pid>-<hex>``), which :func:`tag_writer` reads back (both kept in
``fastlm.temporary_files``, which the files written atomically share): whether their writer still runs can be
told only on its host (on a shared filesystem, NFS or a cluster's shared home, another host's pid means
nothing here).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 2
_REFUSED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


def _libc_renameat2():
    """libc's ``renameat2`` (None where there is none: not Linux, or glibc < 2.28)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_renameat2 = _libc_renameat2()


def exchange(first: str | Path, second: str | Path) -> bool:
    """Swap two existing paths (on one filesystem) in one atomic call; True when done. False, nothing
    moved, where the call is missing or the filesystem refuses it (EINVAL, ENOSYS, EOPNOTSUPP); any other
    failure is its ``OSError``."""
    call = _renameat2
    if call is None:
        return False
    first, second = os.fsencode(first), os.fsencode(second)
    if call(AT_FDCWD, first, AT_FDCWD, second, RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _REFUSED:
        return False
    raise OSError(code, os.strerror(code), os.fsdecode(first), None, os.fsdecode(second))


def replace_folder(new: Path, target: Path, aside: Path) -> Path | None:
    """Put the folder ``new`` at ``target`` (same filesystem). An existing ``target`` is exchanged with
    ``new`` in one call where the system can, else moved to ``aside`` before ``new`` is renamed in (the
    previous folder put back where that second rename fails). Returns the path that now holds the previous
    folder (``new`` after an exchange, ``aside`` after the two renames; the caller removes it), None where
    there was none."""
    new, target, aside = Path(new), Path(target), Path(aside)
    if not (target.exists() or target.is_symlink()):
        os.replace(new, target)
        return None
    if exchange(new, target):
        return new
    os.replace(target, aside)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(aside, target)  # put the previous copy back
        raise
    return aside
