"""Faults during training: SIGTERM / Ctrl-C stop after a saved step; SIGKILL at a step or in the middle of a
checkpoint write loses at most the steps since the last complete checkpoint; every resume is bitwise exact."""

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.layout import MARKER
from fastlm.engine.checkpoint.loading import load_checkpoint
from fastlm.engine.train.signals import TrainingInterrupted
from tests.support import background
from tests.support.toy_training import run_toy, toy_model, toy_params

REPO_ROOT = Path(__file__).resolve().parents[3]
MODES = ["packed", "length_grouped", "dynamic"]
STEPS = 8
# Deterministic, a record every step (so the final loss covers the same one-step window in every run),
# no eval.
DETERMINISTIC = {"runtime": {"deterministic": True}, "log_every": 1, "eval_every": None, "max_steps": STEPS}
_straight_runs: dict[str, tuple[float, list[torch.Tensor]]] = {}


def _settings(mode: str, **overrides) -> dict:
    return {**DETERMINISTIC, "batching": {"mode": mode}, **overrides}


def _straight(tmp_path_factory, mode: str) -> tuple[float, list[torch.Tensor]]:
    """The final loss and weights of an uninterrupted run (one per mode for the whole module)."""
    if mode not in _straight_runs:
        result = run_toy(toy_params(tmp_path_factory.mktemp(f"straight-{mode}"), **_settings(mode)))
        _straight_runs[mode] = (
            result.history[-1]["loss"],
            [p.detach().clone() for p in result.model.parameters()],
        )
    return _straight_runs[mode]


def _assert_resumes_exactly(tmp_path, tmp_path_factory, mode: str, **overrides):
    resumed = run_toy(toy_params(tmp_path, **_settings(mode, resume="auto", **overrides)))
    assert resumed.history[-1]["step"] == STEPS
    loss, weights = _straight(tmp_path_factory, mode)
    assert resumed.history[-1]["loss"] == loss  # bitwise: deterministic mode
    for expected, actual in zip(weights, resumed.model.parameters(), strict=True):
        assert torch.equal(expected, actual)
    return resumed


# ----------------------------------------------------------------------------------------- SIGTERM / Ctrl-C


class _SignalledInFinalizer:
    """An object whose finalizer (run by the garbage collector, as weakref callbacks are) is where a stop
    signal lands: the handler's exception is raised there, and CPython prints "Exception ignored in ..."."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        for _ in range(1000):  # the handler runs at the next bytecode boundary: in here
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed stop
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_stop_a_finalizer_swallowed_before_the_loop_still_stops_the_run(tmp_path, signum):
    """Round thirty-two: Ctrl-C (or SIGTERM under the project CLI) while a run read its data and prepared
    its workers landed, two times in three, in a weakref callback of the garbage collector: CPython printed
    "Exception ignored in: <function WeakValueDictionary...remove>" and the run trained to its end, status
    0. The CLI's handlers note what they raise; the loop raises it again before its first step (and the
    launcher before its workers start): nothing trained, no checkpoint written."""
    from fastlm import cli

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    trained = []
    try:
        with cli.stop_signals_interrupt():
            _SignalledInFinalizer(signum)  # dropped at once: its finalizer runs here
            with pytest.raises(KeyboardInterrupt) as stopped:
                run_toy(
                    toy_params(tmp_path, **DETERMINISTIC), callbacks=[lambda kind, record: trained.append(1)]
                )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        cli.stop_delivered()
    assert not trained and not list((tmp_path / "checkpoints").glob("checkpoint-*"))
    assert type(stopped.value) is (KeyboardInterrupt if signum == signal.SIGINT else cli.StopSignal)


def test_a_stop_noted_in_one_run_does_not_stop_the_next_run_of_the_process(tmp_path):
    """A stop a handler noted in one CLI run that ended otherwise (the stop swallowed after its last step, or
    the run ended by another error) is that run's: the next run in the same process (a notebook, a test
    session calling the CLI again) trains."""
    from fastlm import cli
    from fastlm.engine.train.signals import raise_swallowed_stop, raised_by_signal

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with cli.stop_signals_interrupt():
            raised_by_signal(KeyboardInterrupt())  # raised, and swallowed where nothing delivers it
        with cli.stop_signals_interrupt():
            raise_swallowed_stop()
            result = run_toy(toy_params(tmp_path, **DETERMINISTIC))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        cli.stop_delivered()
    assert result.history[-1]["step"] == STEPS


@pytest.mark.parametrize("mode", MODES)
def test_sigterm_saves_the_step_and_resumes_exactly(tmp_path, tmp_path_factory, mode):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def terminate(kind, record):
        if record["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    params = toy_params(tmp_path, **_settings(mode, save_every=None, resume="auto"))
    with pytest.raises(TrainingInterrupted) as error:
        run_toy(params, callbacks=[terminate])
    checkpoint = tmp_path / "checkpoints" / "checkpoint-00000003"
    assert str(error.value) == (
        f"training stopped by SIGTERM at step 3; checkpoint {checkpoint} saved; "
        "run the same command again (train.resume: auto) to continue"
    )
    assert error.value.exit_code == 130 and error.value.step == 3
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # handlers restored
    assert latest_checkpoint(tmp_path / "checkpoints") == checkpoint and (checkpoint / MARKER).is_file()
    state = load_checkpoint(checkpoint, model=toy_model(), restore_rng=False)
    assert state["step"] == 3 and [r["step"] for r in state["history"]] == [1, 2, 3]
    resumed = _assert_resumes_exactly(tmp_path, tmp_path_factory, mode, save_every=None)
    assert [r["step"] for r in resumed.history] == list(range(1, STEPS + 1))


def test_ctrl_c_mid_step_finishes_the_step_flushes_and_names_the_fix(tmp_path, monkeypatch):
    """SIGINT in the middle of step 6 (before its forward pass), which is neither a logging nor a saving
    step: the step still completes, its pending metrics are flushed and checked, a checkpoint is written
    anyway, and a run with resume: never is told to switch to auto."""
    import fastlm.engine.train.step as step_module

    calls = {"n": 0}
    real = step_module.accumulate_gradients

    def accumulate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", accumulate)
    params = toy_params(tmp_path, **_settings("packed", log_every=4, save_every=None, resume="never"))
    with pytest.raises(TrainingInterrupted) as error:
        run_toy(params)
    checkpoint = tmp_path / "checkpoints" / "checkpoint-00000006"
    message = str(error.value)
    assert message.startswith(f"training stopped by SIGINT at step 6; checkpoint {checkpoint} saved;")
    assert "with train.resume: auto (it is 'never' now)" in message
    assert latest_checkpoint(tmp_path / "checkpoints") == checkpoint == error.value.checkpoint
    history = load_checkpoint(checkpoint, model=toy_model(), restore_rng=False)["history"]
    assert [r["step"] for r in history] == [1, 4, 6] and calls["n"] == 6


# ----------------------------------------------------------------------------------------- SIGKILL

DRIVER = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.support.toy_training import toy_params, run_toy

settings = {settings!r}
kill_at_step = {kill_at_step!r}

if {kill_in_save!r}:  # SIGKILL inside torch.save of the checkpoint for step kill_in_save: a torn write
    import fastlm.engine.checkpoint.files as checkpoint
    real_save = checkpoint.torch.save

    def torn_save(obj, handle, *args, **kwargs):
        if "checkpoint-%08d-" % {kill_in_save!r} in str(getattr(handle, "name", handle)):
            handle.write(b"half a file")
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, handle, *args, **kwargs)

    checkpoint.torch.save = torn_save


def kill(kind, record):
    if record["step"] == kill_at_step:
        os.kill(os.getpid(), signal.SIGKILL)


run_toy(toy_params(Path({tmp!r}), **settings), callbacks=[kill])
print("finished without being killed")
"""


def _run_killed(folder: Path, settings: dict, *, kill_at_step=None, kill_in_save=None):
    """The toy run of ``settings`` in ``folder`` in a process of its own, killed as asked."""
    folder.mkdir(parents=True, exist_ok=True)
    source = textwrap.dedent(DRIVER).format(
        repo=str(REPO_ROOT),
        settings=settings,
        tmp=str(folder),
        kill_at_step=kill_at_step,
        kill_in_save=kill_in_save,
    )
    with open(folder / "driver.py", "w", encoding="utf-8") as file:  # the built-in open: a background job
        file.write(source)
    return background.run([sys.executable, str(folder / "driver.py")], cwd=folder, timeout=120)


def runs_killed_by_sigkill(folder: Path) -> dict:
    """A background job: the toy runs SIGKILLed at step 5 (each batching mode; a checkpoint every 2 steps)
    and in the middle of the step-4 checkpoint's write (packed). Each run's folder and process result."""
    runs = {}
    for mode in MODES:
        runs[mode] = _run_killed(folder / mode, _settings(mode, save_every=2, resume="auto"), kill_at_step=5)
    settings = _settings("packed", save_every=2, resume="auto")
    runs["in_save"] = _run_killed(folder / "in_save", settings, kill_in_save=4)
    return {name: (folder / name, done) for name, done in runs.items()}


def _killed(name: str) -> Path:
    folder, done = background.result(runs_killed_by_sigkill)[name]
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    return folder


@pytest.mark.background(job=runs_killed_by_sigkill)
@pytest.mark.parametrize("mode", MODES)
def test_sigkill_at_a_step_resumes_from_the_last_checkpoint(tmp_path_factory, mode):
    folder = _killed(mode)
    root = folder / "checkpoints"
    assert latest_checkpoint(root).name == "checkpoint-00000004"
    assert not list(root.glob("checkpoint-00000005*"))
    _assert_resumes_exactly(folder, tmp_path_factory, mode, save_every=2)


@pytest.mark.background(job=runs_killed_by_sigkill)
def test_sigkill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path_factory):
    folder = _killed("in_save")
    root = folder / "checkpoints"
    assert latest_checkpoint(root).name == "checkpoint-00000002"  # the torn step-4 copy is never picked
    assert not (root / "checkpoint-00000004").exists()
    leftovers = list(root.glob(".tmp-checkpoint-00000004-*"))
    assert len(leftovers) == 1 and not (leftovers[0] / MARKER).exists()
    _assert_resumes_exactly(folder, tmp_path_factory, "packed", save_every=2)
    assert not list(root.glob(".tmp-*"))  # the next save cleared the leftover
    assert latest_checkpoint(root).name == f"checkpoint-{STEPS:08d}"
