"""A folder swap without the atomic exchange whose second rename fails (the swap tests of the checkpoint
folders and of the catalog's folders)."""

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
