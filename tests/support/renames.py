"""A folder swap without the atomic exchange whose second rename fails (the swap tests of the checkpoint
folders and of the catalog's folders); a write killed at its rename (the tests of what killed writers
leave)."""

from __future__ import annotations

import errno
import os

from fastlm.engine.checkpoint import swap


def second_rename_fails(monkeypatch) -> None:
    """Make ``swap.replace_folder`` take its two renames (no ``renameat2`` exchange) and the second one raise
    an I/O error."""
    monkeypatch.setattr(swap, "exchange", lambda first, second: False)
    real_replace, calls = os.replace, []

    def failing(source, destination):
        calls.append(source)
        if len(calls) == 2:
            raise OSError(errno.EIO, "I/O error")
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", failing)


def killed_at_first_rename(write) -> int:
    """Run ``write()`` in a forked child killed (``os._exit``: no ``finally``, no clean-up) as it reaches its
    first ``os.replace``, as a SIGKILL or the OOM killer would leave its temporary file; the child's pid,
    gone once this returns."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.replace = lambda source, destination: os._exit(0)
        try:
            write()
        finally:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the write never reached its rename"
    return child
