"""Headless Chromium for the HTML checks: each call in its own process group, killed afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

TIMEOUT_S = 60


def find_chromium() -> str | None:
    for candidate in ("chromium", "chromium-browser", "/usr/bin/chromium"):
        path = shutil.which(candidate)
        if path:
            return path
    return None


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """One headless Chromium call; its whole process group is killed afterwards, also on timeout."""
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        *args,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        process.communicate()
        pytest.fail(f"chromium did not finish within {TIMEOUT_S} s: {' '.join(args)}")
    finally:
        _kill_group(process.pid)  # helpers (zygote, crashpad) that outlived the browser
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
