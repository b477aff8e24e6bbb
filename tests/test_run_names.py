"""run_name: validated as a safe folder name, default pipeline + timestamp, and with resume: auto the default
reuses the newest interrupted run's name, so running the same command again continues it."""

import datetime as dt

import pytest

from fastlm.engine.checkpoint.files import save_checkpoint
from fastlm.errors import ConfigError
from fastlm.runs import default_run_name, resolve_run_name, validate_run_name
from tests.support.tiny_models import checkpoint_llama, optimizer_and_scheduler

NOW = dt.datetime(2026, 11, 23, 4, 14, 28)


@pytest.mark.parametrize("bad", ["", "a/b", "..", ".hidden", "a b", "x" * 101, "con\x00", "../up", "名前/"])
def test_unsafe_names_are_one_line(bad):
    with pytest.raises(ConfigError) as raised:
        validate_run_name(bad)
    assert "run_name" in str(raised.value) and "\n" not in str(raised.value) and "Fix:" in str(raised.value)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (123, "123 is a number (int), not text"),
        (1.5, "1.5 is a number (float), not text"),
        (True, "True is a boolean, not text"),
        ("", "it is empty"),
        ("a b", "it contains ' ' (a space)"),
        ("a/b", "it contains '/'"),
        (".hidden", "it starts with '.'"),
        ("-x", "it starts with '-'"),
        ("x" * 101, "it is 101 characters long"),
        ("run.", "it ends with '.'"),
        ("a..b", "it contains '..'"),
        ("con", "con is a device name on Windows"),
        ("NUL.txt", "NUL.txt is a device name on Windows"),
    ],
    ids=[
        "int",
        "float",
        "bool",
        "empty",
        "space",
        "slash",
        "dot_first",
        "dash_first",
        "too_long",
        "dot_last",
        "two_dots",
        "con",
        "nul_txt",
    ],
)
def test_a_refused_run_name_says_why_and_what_is_accepted(bad, why):
    """The message names the rule the value broke, and the rules that hold (a number was refused with a
    message saying digits are allowed)."""
    with pytest.raises(ConfigError) as raised:
        validate_run_name(bad)
    message = str(raised.value)
    assert why in message and "\n" not in message and "Fix:" in message, message
    assert "1 to 100 letters, digits, '.', '_', '+' or '-'" in message, message
    if not isinstance(bad, str):  # how to pass it as text
        assert "--params 'run_name=\"" in message and "run-" in message, message


def test_safe_names_pass_and_the_default_is_pipeline_and_time():
    assert validate_run_name("lora-r16_v2.1") == "lora-r16_v2.1"
    assert default_run_name(["train"], NOW) == "train-20261123-041428"
    assert default_run_name(None, NOW) == default_run_name(["__default__"], NOW) == "main-20261123-041428"
    assert default_run_name(["split", "train"], NOW) == "split+train-20261123-041428"


def _checkpoint(root, step, total):
    model = checkpoint_llama(seed=0)
    optimizer, scheduler = optimizer_and_scheduler(model)
    save_checkpoint(
        root,
        step,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state={"step": step, "total_steps": total},
    )


def test_auto_reuses_the_newest_interrupted_run_only(tmp_path):
    base = tmp_path / "checkpoints"
    assert (
        resolve_run_name(None, ["train"], base, resume="auto", trains=True, now=NOW)
        == "train-20261123-041428"
    )
    _checkpoint(base / "train-old", 2, 4)  # interrupted
    _checkpoint(base / "done", 4, 4)  # finished
    assert resolve_run_name(None, ["train"], base, resume="auto", trains=True, now=NOW) == "train-old"
    assert (
        resolve_run_name(None, ["train"], base, resume="never", trains=True, now=NOW)
        == "train-20261123-041428"
    )
    assert (
        resolve_run_name(None, ["report"], base, resume="auto", trains=False, now=NOW)
        == "report-20261123-041428"
    )
    assert resolve_run_name("mine", ["train"], base, resume="auto", trains=True, now=NOW) == "mine"
    _checkpoint(base / "train-old", 4, 4)  # now finished: a new name
    assert (
        resolve_run_name(None, ["train"], base, resume="auto", trains=True, now=NOW)
        == "train-20261123-041428"
    )


def test_a_run_finished_with_nothing_to_train_is_not_the_interrupted_run_an_unnamed_run_continues(tmp_path):
    """``run_name=ms1`` stopped at step 12 of 30, then entered again with ``max_steps: 12``: it trained
    nothing and finished (rc 0, its model written), and its checkpoint's ``FINISHED`` marker says so. The
    next unnamed training run took it for the newest interrupted run: ``Run name: ms1``, its checkpoints
    moved aside and its model written over. It gets a new name; a newer checkpoint of ms1 (continued by name)
    makes it a candidate again."""
    from fastlm.engine.checkpoint.files import mark_finished
    from fastlm.engine.checkpoint.layout import checkpoint_dir

    base = tmp_path / "checkpoints"
    _checkpoint(base / "ms1", 12, 30)
    assert resolve_run_name(None, ["train"], base, resume="auto", trains=True, now=NOW) == "ms1"
    mark_finished(checkpoint_dir(base / "ms1", 12), step=12, reason="nothing to train")
    assert (
        resolve_run_name(None, ["train"], base, resume="auto", trains=True, now=NOW)
        == "train-20261123-041428"
    )
    _checkpoint(base / "ms1", 20, 30)  # continued by name, stopped again
    assert resolve_run_name(None, ["train"], base, resume="auto", trains=True, now=NOW) == "ms1"


@pytest.mark.parametrize("given", ["x", None], ids=["named", "auto-resumed"])
def test_a_training_run_whose_checkpoint_folder_another_live_run_holds_is_refused_before_mlflow(
    tmp_path, given
):
    """Two `kedro run --pipeline=train` of one name (the same command twice: both resume the newest
    interrupted run): the second was refused by the checkpoint lock inside the train node, after MLflow
    had opened a run of that name, left FAILED beside the real one. The run's name is resolved before MLflow
    opens its run; a checkpoint folder of that name held by a running process is refused there, in the same
    line."""
    import json
    import os
    import socket

    from kedro.io import DataCatalog, MemoryDataset
    from kedro.pipeline import Pipeline, node

    from fastlm.engine.checkpoint.layout import LOCK_FILE, CheckpointError
    from fastlm.hooks import RunNameHook

    base = tmp_path / "checkpoints"
    _checkpoint(base / "x", 2, 4)  # interrupted: `resume: auto` continues it
    (base / "x" / LOCK_FILE).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    catalog = DataCatalog(
        {"params:train": MemoryDataset({"checkpoint_dir": str(base), "resume": "auto"})}
        | ({"params:run_name": MemoryDataset(given)} if given else {})
    )
    pipeline = Pipeline([node(lambda train: train, "params:train", "trained_model", name="train_model")])
    with pytest.raises(CheckpointError) as raised:
        RunNameHook().before_pipeline_run({"pipeline_names": ["train"]}, pipeline, catalog)
    message = str(raised.value)
    assert f"PID {os.getppid()}" in message and str(base / "x") in message and "run_name" in message
    (base / "x" / LOCK_FILE).unlink()  # no holder: the run goes on under that name
    RunNameHook().before_pipeline_run({"pipeline_names": ["train"]}, pipeline, catalog)
    assert catalog.load("params:run_name") == "x"
