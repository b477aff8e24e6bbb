"""The checkpoint folder lock on its own: held while a run writes, a live holder refused in one line naming
its PID, a dead holder's lock taken over, released afterwards. (Two training runs end to end:
test_resume.py.)"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

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
    past = time.time() - 60  # a torn file is its killed writer's once older than a write takes
    os.utime(tmp_path / LOCK_FILE, (past, past))
    with checkpoint_lock(tmp_path) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists() and "taking over" in caplog.text


@pytest.mark.parametrize("content", ["", '{"pid": 12'], ids=["created", "half-written"])
def test_a_lock_another_run_is_writing_is_not_taken_from_it(tmp_path, content):
    """Round twenty-one: a run creates its ``.lock`` empty, then writes its PID. A second run that read it in
    between found no holder, took it for a killed writer's torn file and removed it under the guard (still
    empty): both runs then wrote into one folder. An unreadable lock younger than ``GUARD_STALE_S`` is being
    written: refused in one line, the lock kept."""
    lock = tmp_path / LOCK_FILE
    lock.write_text(content)
    with pytest.raises(CheckpointError) as raised:
        with checkpoint_lock(tmp_path):
            pass
    assert str(lock) in str(raised.value) and "\n" not in str(raised.value)
    assert lock.read_text() == content


def test_a_stale_lock_another_run_took_over_meanwhile_is_not_taken_from_it(tmp_path, monkeypatch, caplog):
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
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError) as raised:
        with checkpoint_lock(tmp_path):
            pass
    assert f"PID {first['pid']}" in str(raised.value) and "\n" not in str(raised.value)
    assert json.loads(lock.read_text()) == first
    assert not [r for r in caplog.records if "taking over" in r.getMessage()]  # nothing was taken over
    assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK_FILE]  # no takeover file left


@pytest.mark.parametrize("age_s", [60.0, 0.0], ids=["left-by-a-killed-run", "held-now"])
def test_a_takeover_guard_left_by_a_killed_run_is_removed_and_a_fresh_one_refused(tmp_path, caplog, age_s):
    """Round twenty-one: a run killed while it held ``.lock.takeover`` (held for one read and one unlink)
    left it behind, and every later run failed after ~1 s asking to delete it. A guard older than
    ``GUARD_STALE_S`` is no process's: removed with one warning, and the stale lock taken over; a fresh one
    is another run's and still refused."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    guard = tmp_path / (LOCK_FILE + ".takeover")
    guard.touch()
    past = time.time() - age_s
    os.utime(guard, (past, past))
    if age_s:
        with checkpoint_lock(tmp_path):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert sorted(path.name for path in tmp_path.iterdir()) == []
        warnings = [record.getMessage() for record in caplog.records if str(guard) in record.getMessage()]
        assert len(warnings) == 1 and "\n" not in warnings[0]
    else:
        with pytest.raises(CheckpointError, match="takeover") as raised:
            with checkpoint_lock(tmp_path):
                pass
        assert "\n" not in str(raised.value)
        assert guard.exists() and json.loads(lock.read_text())["pid"] == dead.pid


@pytest.mark.parametrize("errno_", ["ENOSPC", "EDQUOT"])
def test_a_lock_that_cannot_be_written_on_a_full_disk_is_one_line_and_leaves_no_file(
    tmp_path, monkeypatch, errno_
):
    """A disk with room for a file's name but not its bytes (less than ~40 KB free as a run starts): the lock
    was created, its write raised ENOSPC out of the run's first hook as a 220-line traceback, and the empty
    lock stayed behind (the next run warned it took it over). Now one storage line, no lock file left."""
    import errno

    from fastlm.engine.checkpoint.lock import held_lock
    from fastlm.engine.checkpoint.storage import StorageError

    real_fdopen = os.fdopen

    def full(handle, *args, **kwargs):
        file = real_fdopen(handle, *args, **kwargs)
        file.close()
        raise OSError(getattr(errno, errno_), os.strerror(getattr(errno, errno_)))

    monkeypatch.setattr(os, "fdopen", full)
    lock = tmp_path / ".report.json.lock"
    with pytest.raises(StorageError) as raised:
        with held_lock(lock, lambda holder: RuntimeError("held")):
            pass
    message = str(raised.value)
    assert str(lock) in message and ("disk is full" in message or "quota" in message), message
    assert "\n" not in message and "Fix:" in message
    assert list(tmp_path.iterdir()) == []
