"""Jobs of subprocesses that start in a background thread as soon as the tests are collected, so that they run
on the core the rest of the suite mostly leaves idle (most tests are single-threaded Python); the test that
asserts on a job's result waits for it.

A job runs beside the other tests, in their process: it starts subprocesses (run, popen: the environment as
the session started, an explicit cwd) and reads and writes files of its own with the built-in open(). Never
in-process Kedro, MLflow or torch, os.environ or the cwd, which the tests in the foreground change; nor
pathlib's open, read_text or write_text, os.replace or tempfile.mkstemp, which some of them patch.

    def smoke(folder: Path) -> subprocess.CompletedProcess:  # a job: folder is an empty folder of its own
        return background.run([sys.executable, str(SCRIPT)], cwd=folder)

    @pytest.mark.background(job=smoke)  # tests/conftest.py queues the collected tests' jobs, in order
    def test_smoke():
        done = background.result(smoke)  # run here and now if it was not queued or has not started

A job runs once per session; every test naming it gets the same result (or the same exception raised).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Job = Callable[[Path], Any]


class _Scheduler:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Job] = []
        self._started: dict[Job, threading.Event] = {}
        self._outcomes: dict[Job, tuple[Any, BaseException | None]] = {}
        self._seconds: dict[str, tuple[float, bool]] = {}  # job name: (wall seconds, run in the background)
        self._processes: set[subprocess.Popen] = set()
        self._environ = dict(os.environ)
        self._root: Path | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- the queue

    def start(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` (each once) and start the thread that runs them one after the other."""
        with self._lock:
            self._environ = dict(os.environ)  # as the session starts, before any test changes it
            for job in dict.fromkeys(jobs):
                if job not in self._started and job not in self._pending:
                    self._pending.append(job)
            if self._pending and self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._work, name="background-jobs", daemon=True)
                self._thread.start()

    def _next(self) -> Job | None:
        with self._lock:
            if self._closed or not self._pending:
                self._thread = None
                return None
            job = self._pending.pop(0)
            self._started[job] = threading.Event()
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            self._execute(job)

    def _execute(self, job: Job) -> None:
        start = time.monotonic()
        try:
            outcome = (job(self._folder(job)), None)
        except BaseException as error:  # handed to the test that asks for the result
            outcome = (None, error)
        in_background = threading.current_thread() is not threading.main_thread()
        self._seconds[job.__name__] = (time.monotonic() - start, in_background)
        self._outcomes[job] = outcome
        self._started[job].set()

    def _folder(self, job: Job) -> Path:
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="fastlm-background-"))
            return Path(tempfile.mkdtemp(prefix=f"{job.__name__}-", dir=self._root))

    def result(self, job: Job) -> Any:
        """The job's return value (its exception raised), waiting for it; a job not yet started runs here."""
        with self._lock:
            if job in self._pending:
                self._pending.remove(job)
            here = job not in self._started
            if here:
                self._started[job] = threading.Event()
        if here:
            self._execute(job)
        self._started[job].wait()
        value, error = self._outcomes[job]
        if error is not None:
            raise error
        return value

    def close(self) -> None:
        """Drop the jobs not started, kill the processes of the running one, remove the jobs' folders."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            processes, thread = list(self._processes), self._thread
        for process in processes:  # a process that leads a group of its own: the whole group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(process.pid) == process.pid:
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.kill()
        if thread is not None:
            thread.join(timeout=30)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def seconds(self) -> dict[str, tuple[float, bool]]:
        """Each job run so far: its wall seconds and whether it ran in the background thread (not in the
        test that asked for it), for ``pytest --durations``."""
        return dict(self._seconds)

    # -- what a job runs

    def environ(self, **changes: str | None) -> dict[str, str]:
        """The environment as the session started, with ``changes`` (None removes a variable)."""
        env = dict(self._environ)
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def popen(
        self, args: list[str], *, cwd: Path, env: dict[str, str] | None = None, **kwargs
    ) -> subprocess.Popen:
        """``subprocess.Popen`` in ``cwd`` (a job never uses the shared cwd), with the session's environment
        unless ``env`` is given; close() kills it if it is still running."""
        process = subprocess.Popen(args, cwd=cwd, env=self.environ() if env is None else env, **kwargs)
        with self._lock:
            self._processes.add(process)
        return process

    def forget(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._processes.discard(process)

    def run(
        self, args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """``subprocess.run(args, capture_output=True, text=True, timeout=timeout)`` through popen()."""
        process = self.popen(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        finally:
            self.forget(process)
        return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


_scheduler = _Scheduler()
start, result, close, seconds = _scheduler.start, _scheduler.result, _scheduler.close, _scheduler.seconds
environ, popen, forget, run = _scheduler.environ, _scheduler.popen, _scheduler.forget, _scheduler.run
