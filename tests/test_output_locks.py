"""``OutputsLockHook``: one `kedro run` at a time writes an output of the project. A second command whose
pipeline writes an output another live command is writing (two splits, two predicts, a split during a
split-train-report run) is refused in one line naming that command's PID, before anything is written; a lock
left by a process that no longer runs (or by this process, an earlier in-process run) is taken over, and the
locks are released when the run ends. The other holder is simulated: its lock file written as a live process
would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _catalog(tmp_path):
    from kedro.io import DataCatalog, MemoryDataset
    from kedro_datasets.json import JSONDataset

    return DataCatalog(
        {
            "split_counts": JSONDataset(filepath=str(tmp_path / "data" / "split_counts.json")),
            "in_memory": MemoryDataset(),
        }
    )


def _pipeline():
    from kedro.pipeline import Node, Pipeline

    return Pipeline([Node(lambda: (1, 2), None, ["split_counts", "in_memory"], name="write")])


def _params():
    return {"pipeline_names": ["split"], "runtime_params": {}}


def _lock_of(tmp_path):
    from fastlm.hooks import output_lock_file

    return output_lock_file(tmp_path / "data" / "split_counts.json")


@pytest.fixture
def live_pid():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process.pid
    process.kill()
    process.wait()


def test_an_output_another_live_command_writes_is_refused_in_one_line(tmp_path, live_pid):
    from fastlm.errors import FastlmError
    from fastlm.hooks import OutputsLockHook

    lock = _lock_of(tmp_path)
    lock.parent.mkdir(parents=True)
    held = json.dumps(
        {"pid": live_pid, "host": socket.gethostname(), "command": "kedro run --pipeline=split"}
    )
    lock.write_text(held)
    with pytest.raises(FastlmError) as raised:
        OutputsLockHook().before_pipeline_run(_params(), _pipeline(), _catalog(tmp_path))
    message = str(raised.value)
    assert f"PID {live_pid}" in message and "split_counts" in message and "\n" not in message
    assert "kedro run --pipeline=split" in message
    assert lock.read_text() == held  # the other command keeps its lock
    assert sorted(p.name for p in lock.parent.iterdir()) == [lock.name]  # nothing else written


def test_the_locks_are_held_during_the_run_and_released_after_it(tmp_path):
    from fastlm.errors import FastlmError
    from fastlm.hooks import OutputsLockHook

    first, second = OutputsLockHook(), OutputsLockHook()
    first.before_pipeline_run(_params(), _pipeline(), _catalog(tmp_path))
    lock = _lock_of(tmp_path)
    record = json.loads(lock.read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    first.after_pipeline_run()
    assert not lock.exists()
    second.before_pipeline_run(_params(), _pipeline(), _catalog(tmp_path))
    second.on_pipeline_error()
    assert not lock.exists()
    # an earlier in-process run that never reached its end (a later hook refused it): taken over, not refused
    first.before_pipeline_run(_params(), _pipeline(), _catalog(tmp_path))
    try:
        second.before_pipeline_run(_params(), _pipeline(), _catalog(tmp_path))
    except FastlmError as error:  # pragma: no cover - the failure's message
        pytest.fail(str(error))
    second.after_pipeline_run()


def test_a_lock_of_a_command_that_no_longer_runs_is_taken_over(tmp_path):
    from fastlm.hooks import OutputsLockHook

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = _lock_of(tmp_path)
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    hook = OutputsLockHook()
    hook.before_pipeline_run(_params(), _pipeline(), _catalog(tmp_path))
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    hook.after_pipeline_run()
    assert not lock.exists()


def test_the_project_registers_the_hook():
    from fastlm.hooks import OutputsLockHook
    from fastlm.settings import HOOKS

    assert any(isinstance(hook, OutputsLockHook) for hook in HOOKS)


def test_two_trainings_of_other_run_names_may_run_at_once(tmp_path, live_pid):
    """A training's outputs (the model folder, its histories and summary) are the latest training's: two
    trainings under other run names at once (one per GPU) each write their own checkpoint folder (its lock)
    and their own copies (data/06_models/runs/<name>, data/08_reporting/runs/<name>), and every reader checks
    that the latest four are one training's. Those four take no project lock; the rest of the pipeline's
    outputs still do."""
    from kedro.io import DataCatalog
    from kedro.pipeline import Node, Pipeline
    from kedro_datasets.json import JSONDataset

    from fastlm.hooks import OutputsLockHook, output_lock_file

    names = ("trained_model", "train_history", "eval_history", "train_summary")
    catalog = DataCatalog(
        {name: JSONDataset(filepath=str(tmp_path / "data" / f"{name}.json")) for name in names}
    )
    catalog["split_counts"] = JSONDataset(filepath=str(tmp_path / "data" / "split_counts.json"))
    (tmp_path / "data").mkdir()
    other = json.dumps(
        {"pid": live_pid, "host": socket.gethostname(), "command": "kedro run --pipeline=train"}
    )
    for name in names:
        output_lock_file(tmp_path / "data" / f"{name}.json").write_text(other)
    train = Pipeline([Node(lambda: (1, 2, 3, 4), None, list(names), name="train_model")])
    hook = OutputsLockHook()
    hook.before_pipeline_run(_params(), train, catalog)  # not refused
    hook.after_pipeline_run()
    assert all(output_lock_file(tmp_path / "data" / f"{name}.json").read_text() == other for name in names)
    with_split = Pipeline([*train.nodes, Node(lambda: 1, None, "split_counts", name="split")])
    hook.before_pipeline_run(_params(), with_split, catalog)
    assert output_lock_file(tmp_path / "data" / "split_counts.json").exists()
    hook.after_pipeline_run()


def test_a_model_folder_replaced_while_it_is_read_is_read_whole_again(tmp_path, monkeypatch):
    """A report or predict started while a training ends reads the trained model (its weights, tokenizer and
    training record: several files) as the training's save swaps in the new folder: what it returns is one
    folder's, never the old weights with the new record."""
    import torch

    from fastlm.datasets.pretrained_model import PretrainedModelDataset
    from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama

    tokenizer = llama_style_tokenizer(["a b c d e f g"], vocab_size=60)
    first, second = (
        save_tiny_llama(tmp_path / name, tokenizer, hidden_size=16, seed=seed)
        for name, seed in (("a", 0), ("b", 1))
    )
    target = tmp_path / "data" / "06_models" / "model"
    dataset = PretrainedModelDataset(str(target))

    def as_saved(source: Path, record: str) -> dict:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(source)
        return {
            "model": model,
            "tokenizer": AutoTokenizer.from_pretrained(source),
            "training_data": {"fingerprint": record},
        }

    dataset.save(as_saved(first, "first"))
    newer = as_saved(second, "second")
    real, swaps = PretrainedModelDataset._load_tokenizer, []

    def tokenizer_after_a_save(self):  # the weights are read; the training's save swaps the folder now
        if not swaps:
            swaps.append(1)
            PretrainedModelDataset(str(target)).save(newer)
        return real(self)

    monkeypatch.setattr(PretrainedModelDataset, "_load_tokenizer", tokenizer_after_a_save)
    loaded = dataset.load()
    assert swaps and loaded["training_data"] == {"fingerprint": "second"}
    for name, tensor in newer["model"].state_dict().items():
        assert torch.equal(loaded["model"].state_dict()[name], tensor), name


def test_a_folder_replaced_at_every_read_is_one_line_and_a_missing_one_its_own_error(tmp_path):
    from fastlm.datasets.atomic_folder import read_folder_whole, write_folder_atomically
    from fastlm.errors import FastlmError

    target = tmp_path / "model"

    def replaced_each_time():
        write_folder_atomically(target, lambda folder: folder.mkdir())
        return "read"

    write_folder_atomically(target, lambda folder: folder.mkdir())
    with pytest.raises(FastlmError) as raised:
        read_folder_whole(target, replaced_each_time)
    assert "was replaced by another command" in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(FileNotFoundError):
        read_folder_whole(tmp_path / "none", lambda: (tmp_path / "none" / "config.json").read_text())
    assert read_folder_whole(target, lambda: "read") == "read"
