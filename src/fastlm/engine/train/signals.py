"""Graceful stop on SIGTERM / Ctrl-C: finish the optimizer step, save a checkpoint, exit with one line.

:class:`GracefulStop` is installed by :func:`fastlm.engine.train.loop.train` around the hot loop. Its handler
only records the signal (no work inside a signal handler); the loop reads :attr:`GracefulStop.requested` after
each optimizer step, saves a checkpoint and raises :class:`TrainingInterrupted`. After the first signal the
previous handlers are put back, so a second Ctrl-C raises ``KeyboardInterrupt`` at once (a second SIGTERM
gets the previous handler: under the project CLI the run ends at once with one line,
``fastlm.cli.StopSignal``; elsewhere the default, the process ends). A checkpoint save cut short that way
leaves only a ``.tmp-*`` folder, never a checkpoint that resume would pick.

Signal handlers can only be set from the main thread: elsewhere (a Kedro runner thread, a notebook worker) the
context manager does nothing and the loop never sees a request.

A worker of a run in several processes (``persistent``) keeps its handler for every later signal: a stop sent
to the whole process group (Slurm's cancel, a pre-emption, ``timeout``) reaches the worker directly and again
through the launcher, which forwards it to its workers and kills them after its shutdown timeout. With the
default restored after the first, the second signal killed the worker mid-step, or (both pending at once)
CPython raised "Signal 15 ignored due to race condition" out of the collective the worker was waiting in.

Outside the loop a stop is an exception raised where the process is (Ctrl-C's KeyboardInterrupt; under the
project CLI SIGTERM's and SIGHUP's too, ``fastlm.cli.stop_signals_interrupt``). Raised inside a finalizer (a
weakref callback or ``__del__`` the garbage collector runs, as it often does while a run reads its data and
starts its workers) CPython prints "Exception ignored in ..." and goes on: the run trained to its end. The
CLI's handlers note what they raise (:func:`raised_by_signal`); a noted stop never delivered is raised again
before the workers start and before the first step (:func:`raise_swallowed_stop`).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

from fastlm.errors import FastlmError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# the stop a signal handler raised last, until it reaches the CLI (``stop_delivered``): module docstring
_RAISED: list[BaseException] = []


def raised_by_signal(stop: BaseException) -> BaseException:
    """``stop``, which a stop signal's handler raises now, noted until :func:`stop_delivered`: a finalizer
    that swallows it leaves it for :func:`raise_swallowed_stop`."""
    _RAISED[:] = [stop]
    return stop


def stop_delivered() -> None:
    """The noted stop reached whoever ends the run (the CLI): nothing is left to raise again."""
    _RAISED.clear()


def raise_swallowed_stop() -> None:
    """Raise again the stop a signal's handler raised that never ended the run (a finalizer swallowed it):
    called where a run is about to start its expensive part (its workers, its first step)."""
    if _RAISED:
        raise _RAISED[0].with_traceback(None)


class TrainingInterrupted(FastlmError):
    """SIGTERM or Ctrl-C stopped training after a checkpoint was saved; the CLI exits with status 130."""

    exit_code = 130

    def __init__(self, signal_name: str, step: int, checkpoint: Path, *, resume: str = "auto"):
        self.signal_name, self.step, self.checkpoint = signal_name, step, Path(checkpoint)
        how = (
            "run the same command again (train.resume: auto) to continue"
            if resume == "auto"
            else f"run the same command again with train.resume: auto (it is {resume!r} now) to continue"
        )
        super().__init__(
            f"training stopped by {signal_name} at step {step}; checkpoint {checkpoint} saved; {how}"
        )


class GracefulStop:
    """Context manager: SIGINT/SIGTERM set :attr:`requested` instead of killing the process (main thread
    only)."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS, *, persistent: bool = False):
        """``persistent``: later signals are recorded too (a worker of a multi-process run: module
        docstring), not left to the previous handlers."""
        self.signals, self.persistent = signals, persistent
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __enter__(self) -> GracefulStop:
        raise_swallowed_stop()  # a Ctrl-C a finalizer swallowed before the loop: no step is trained
        if threading.current_thread() is not threading.main_thread():
            return self  # signal.signal raises ValueError outside the main thread: stay inert
        for signum in self.signals:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue  # e.g. SIGINT in a background job: keep ignoring it
            try:
                signal.signal(signum, self._handle)
            except (ValueError, OSError):  # not the main interpreter, or a signal this platform refuses
                continue
            self._previous[signum] = previous
        return self

    def __exit__(self, *exc_info) -> None:
        self._restore()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
        if not self.persistent:
            self._restore()  # the next Ctrl-C / SIGTERM gets the previous (normally the default) behaviour

    def _restore(self) -> None:
        while self._previous:
            signum, previous = self._previous.popitem()
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
