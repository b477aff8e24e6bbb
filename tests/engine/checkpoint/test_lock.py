"""The checkpoint folder lock on its own: held while a run writes, a live holder refused in one line naming
its PID, a dead holder's lock taken over, released afterwards. (Two training runs end to end:
test_resume.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from fastlm.engine.checkpoint.layout import LOCK_FILE, CheckpointError
from fastlm.engine.checkpoint.lock import checkpoint_lock


def test_the_lock_names_this_process_and_is_released_and_its_new_folder_removed(tmp_path):
    root = tmp_path / "run"
    with checkpoint_lock(root) as lock:
        assert lock == root / LOCK_FILE
        assert json.loads(lock.read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    assert not root.exists()  # created for the run and left empty: removed again
    root.mkdir()
    with checkpoint_lock(root):
        (root / "checkpoint-00000001").mkdir()
    assert sorted(path.name for path in root.iterdir()) == ["checkpoint-00000001"]


def test_a_live_holder_is_refused_in_one_line_and_keeps_its_lock(tmp_path):
    with checkpoint_lock(tmp_path) as lock:
        with pytest.raises(CheckpointError) as raised:
            with checkpoint_lock(tmp_path):
                pass
        message = str(raised.value)
        assert f"PID {os.getpid()}" in message and str(lock) in message and "\n" not in message
        assert lock.exists()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "another-machine"}))
    with pytest.raises(CheckpointError, match="another-machine"):  # a shared disk: cannot tell, held
        with checkpoint_lock(tmp_path):
            pass


@pytest.mark.parametrize("content", ["dead", "{cut off"], ids=["dead-pid", "torn-file"])
def test_a_lock_of_a_process_that_no_longer_runs_is_taken_over(tmp_path, caplog, content):
    if content == "dead":
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        content = json.dumps({"pid": dead.pid, "host": socket.gethostname()})
    (tmp_path / LOCK_FILE).write_text(content)
    with checkpoint_lock(tmp_path) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists() and "taking over" in caplog.text


def test_a_stale_lock_another_run_took_over_meanwhile_is_not_taken_from_it(tmp_path, monkeypatch):
    """Round twenty-one: a worker SIGKILLed leaves its ``.lock``; two runs started after it both find it
    stale. The first takes it over; the second, which read the dead holder before that, removed the lock file
    by name, so the first's lock, and held the folder too: two live runs writing into one folder. The second
    now sees the first's lock and is refused in one line; the first's lock stays."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    first = {"pid": os.getppid(), "host": socket.gethostname()}  # a live process of this machine
    kill = os.kill

    def meanwhile(pid, signal):  # while this run checks the dead holder, another run takes the lock over
        if pid == dead.pid:
            lock.write_text(json.dumps(first))
            raise ProcessLookupError(pid)
        return kill(pid, signal)

    monkeypatch.setattr(os, "kill", meanwhile)
    with pytest.raises(CheckpointError) as raised:
        with checkpoint_lock(tmp_path):
            pass
    assert f"PID {first['pid']}" in str(raised.value) and "\n" not in str(raised.value)
    assert json.loads(lock.read_text()) == first
    assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK_FILE]  # no takeover file left
