"""GracefulStop and TrainingInterrupted on their own: a signal only sets a flag, a second one gets the
previous behaviour, nothing is installed outside the main thread, and the stop names the checkpoint and the
fix. (The loop stopping on SIGTERM/Ctrl-C end to end: test_interrupts.py.)"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from fastlm.engine.train.signals import GracefulStop, TrainingInterrupted


def test_graceful_stop_flag_second_ctrl_c_and_restore():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with GracefulStop() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signal_name == "SIGINT"  # the handler only set the flag
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: default behaviour again, at once
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_workers_graceful_stop_records_every_later_signal_and_names_the_first():
    """A worker of several processes gets a group stop twice (directly, then forwarded by its launcher): the
    second signal is recorded too, never the default action (which killed the worker mid-step)."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with GracefulStop(persistent=True) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt with the default back
        assert stop.requested and stop.signal_name == "SIGTERM"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_graceful_stop_is_inert_outside_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    seen = {}

    def body():
        with GracefulStop() as stop:
            seen["handler"] = signal.getsignal(signal.SIGTERM)
            seen["requested"] = stop.requested

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == {"handler": before, "requested": False}


def test_training_interrupted_names_the_checkpoint_and_how_to_continue():
    stop = TrainingInterrupted("SIGTERM", 6, Path("ck/checkpoint-00000006"))
    assert stop.exit_code == 130 and stop.checkpoint == Path("ck/checkpoint-00000006")
    assert str(stop).startswith(
        "training stopped by SIGTERM at step 6; checkpoint ck/checkpoint-00000006 saved;"
    )
    assert "(train.resume: auto) to continue" in str(stop)
    assert "with train.resume: auto (it is 'never' now)" in str(
        TrainingInterrupted("SIGINT", 1, "c", resume="never")
    )
