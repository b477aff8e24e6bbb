"""``runtime.precision: auto`` on a CPU measured once per machine, model and micro-batch shape: a later run
takes the same precision, so the same command on the same data gives the same losses (a measurement at the
margin flipped between bf16 and fp32 from run to run)."""

import json
import logging

import pytest
import torch

import fastlm.engine.runtime.probe as probe
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.runtime.probe import MIN_SPEEDUP, probe_runtime
from fastlm.engine.runtime.remembered import RememberedChoices, choice_key
from tests.support.renames import killed_at_first_rename
from tests.support.toy_training import run_toy, toy_model, toy_params

BATCH = {"input_ids": torch.ones(2, 8, dtype=torch.long), "labels": torch.ones(2, 8, dtype=torch.long)}
LONGER = {"input_ids": torch.ones(2, 16, dtype=torch.long), "labels": torch.ones(2, 16, dtype=torch.long)}
# bf16 just above and just below its margin: what two runs on one machine may measure
ABOVE = {"fp32": 1.0, "bf16": 1.0 / (MIN_SPEEDUP + 0.02)}
BELOW = {"fp32": 1.0, "bf16": 1.0 / (MIN_SPEEDUP - 0.02)}


@pytest.fixture(autouse=True)
def native_bf16(monkeypatch):
    monkeypatch.setattr(probe, "cpu_has_native_bf16", lambda: True)


def cpu():
    return setup_runtime(RuntimeConfig(device="cpu", precision="auto", num_threads=1))


def timer(seconds: dict, calls: list, *, real: bool = False):
    forward_backward = probe.forward_backward_seconds

    def measure(model, batch, runtime):
        if real:
            forward_backward(model, batch, runtime)
        calls.append(runtime.precision)
        return seconds[runtime.precision]

    return measure


def test_a_measured_precision_is_kept_for_the_same_machine_model_and_micro_batch_shape(tmp_path, caplog):
    choices, model = RememberedChoices(tmp_path / "runtime_choices.json"), toy_model()
    first_calls, again_calls, other_calls = [], [], []
    first, _ = probe_runtime(cpu(), "auto", model, BATCH, measure=timer(ABOVE, first_calls), choices=choices)
    runtime = cpu()
    caplog.clear()  # the first call's line, where an earlier test left the logger at INFO
    with caplog.at_level(logging.INFO, logger="fastlm"):
        again, kept = probe_runtime(
            runtime, "auto", model, BATCH, measure=timer(BELOW, again_calls), choices=choices
        )
    said = [r.getMessage() for r in caplog.records if r.name == probe.__name__]
    assert said == [f"runtime.precision auto -> bf16: {kept.reason}"], said
    assert first.precision == again.precision == "bf16" and first_calls and again_calls == []
    assert str(choices.path) in kept.reason and "delete it to measure again" in kept.reason
    assert first.precision_choice in kept.reason  # what was measured, and when it was kept
    # another micro-batch shape is another measurement
    other, _ = probe_runtime(cpu(), "auto", model, LONGER, measure=timer(BELOW, other_calls), choices=choices)
    assert other.precision == "fp32" and other_calls
    assert len(json.loads(choices.path.read_text())["choices"]) == 2


def test_what_decides_the_speed_is_in_the_key():
    model, runtime = toy_model(), cpu()
    key = choice_key(runtime, model, BATCH)
    assert key["device"] == "cpu" and key["torch"] == torch.__version__ and key["threads"] == 1
    assert key["batch"] == {"input_ids": [2, 8]}  # the matmul sizes
    assert choice_key(runtime, model, LONGER) != key
    wider = toy_model()
    wider.lm_head = torch.nn.Linear(wider.config.hidden_size, wider.config.vocab_size + 8, bias=False)
    assert choice_key(runtime, wider, BATCH)["model"] != key["model"]
    threads = setup_runtime(RuntimeConfig(device="cpu", precision="auto", num_threads=2))
    assert choice_key(threads, model, BATCH) != key


def test_a_damaged_file_is_measured_again_said_once_and_written_anew(tmp_path, caplog):
    path = tmp_path / "runtime_choices.json"
    path.write_text('{"choices": {"cut')
    calls = []
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        runtime, _ = probe_runtime(
            cpu(), "auto", toy_model(), BATCH, measure=timer(ABOVE, calls), choices=RememberedChoices(path)
        )
    assert runtime.precision == "bf16" and calls
    warned = [record.getMessage() for record in caplog.records if str(path) in record.getMessage()]
    assert len(warned) == 1 and "measured again" in warned[0]
    assert len(json.loads(path.read_text())["choices"]) == 1


def test_an_unwritable_file_leaves_the_run_as_measured(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")
    calls = []
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        runtime, _ = probe_runtime(
            cpu(),
            "auto",
            toy_model(),
            BATCH,
            measure=timer(ABOVE, calls),
            choices=RememberedChoices(blocked / "runtime_choices.json"),
        )
    assert runtime.precision == "bf16" and any("not kept" in r.getMessage() for r in caplog.records)


def test_a_second_run_trains_in_the_precision_the_first_measured(tmp_path, monkeypatch):
    """Through the loop: the file given to ``train`` (the train node gives
    ``<train.checkpoint_dir>/runtime_choices.json``); the second run's timer would have chosen fp32."""
    path = tmp_path / "runtime_choices.json"
    steps = {"max_steps": 2, "log_every": 1, "eval_every": None}
    monkeypatch.setattr(probe, "forward_backward_seconds", timer(ABOVE, [], real=True))
    first = run_toy(toy_params(tmp_path / "a", **steps), runtime_choices=path)
    monkeypatch.setattr(probe, "forward_backward_seconds", timer(BELOW, [], real=True))
    second = run_toy(toy_params(tmp_path / "b", **steps), runtime_choices=path)
    assert first.runtime.precision == second.runtime.precision == "bf16"
    assert [r["loss"] for r in first.history] == [r["loss"] for r in second.history]  # the same computation
    assert "kept from" in second.runtime.precision_choice
    without = run_toy(toy_params(tmp_path / "c", **steps))  # no file given: measured, nothing kept
    assert without.runtime.precision == "fp32"


def test_an_entry_of_another_shape_is_measured_again(tmp_path):
    """A file of this version whose entry under the run's key is no record (edited by hand)."""
    choices, model = RememberedChoices(tmp_path / "runtime_choices.json"), toy_model()
    key = choice_key(cpu(), model, BATCH)
    choices.put(key, {"precision": "bf16", "reason": "r"})
    stored = json.loads(choices.path.read_text())
    stored["choices"] = {name: "bf16" for name in stored["choices"]}
    choices.path.write_text(json.dumps(stored))
    calls = []
    runtime, _ = probe_runtime(cpu(), "auto", model, BATCH, measure=timer(BELOW, calls), choices=choices)
    assert runtime.precision == "fp32" and calls


def test_gradient_checkpointing_is_part_of_the_key():
    """Recomputing the forward in backward changes what bf16 saves: measured apart."""
    model = toy_model()
    plain = choice_key(cpu(), model, BATCH)
    model.gradient_checkpointing_enable()
    assert choice_key(cpu(), model, BATCH) != plain


def test_what_a_killed_write_left_beside_the_file_is_removed_by_the_next(tmp_path):
    """Round twenty: a run killed while writing the choices file left its ``.runtime_choices.json.<pid>.tmp``
    beside it for good (each run names its own). The next write removes what a writer no longer alive left."""
    choices, model = RememberedChoices(tmp_path / "runtime_choices.json"), toy_model()
    key = choice_key(cpu(), model, BATCH)
    lock = ".runtime_choices.json.lock"  # kept: the writers' lock (held_exclusively)
    killed_at_first_rename(lambda: choices.put(key, {"precision": "bf16", "reason": "killed"}))
    left = [path.name for path in tmp_path.iterdir() if path.name != lock]
    assert len(left) == 1 and left[0].startswith(".runtime_choices.json.tmp-"), left  # nothing else
    choices.put(key, {"precision": "fp32", "reason": "r"})
    assert sorted(path.name for path in tmp_path.iterdir()) == [lock, "runtime_choices.json"]
    assert choices.get(key)["precision"] == "fp32"


def test_two_runs_keeping_their_choices_in_one_file_at_once_keep_both(tmp_path, monkeypatch):
    """Two trainings of other run names share ``<train.checkpoint_dir>/runtime_choices.json``; each read the
    file, added its entry and wrote it: the second to read wrote over the first's entry (which measured
    again next time). Here the first reads and waits (up to 0.5 s) for the second to read too before it
    writes: the update is read, merged and written under one lock, so the second reads the first's entry and
    the file keeps both."""
    import threading

    choices, model = RememberedChoices(tmp_path / "runtime_choices.json"), toy_model()
    keys = [choice_key(cpu(), model, batch) for batch in (BATCH, LONGER)]
    read = RememberedChoices._entries
    first_read, second_read = threading.Event(), threading.Event()

    def entries(self, *, warn):
        found = read(self, warn=warn)
        if threading.current_thread().name == "first":
            first_read.set()
            second_read.wait(0.5)  # without a lock, the second reads the file the first has not written
        else:
            second_read.set()
        return found

    monkeypatch.setattr(RememberedChoices, "_entries", entries)

    def second():
        first_read.wait(5)
        choices.put(keys[1], {"precision": "fp32", "reason": "second"})

    first = threading.Thread(target=lambda: choices.put(keys[0], {"precision": "bf16", "reason": "first"}))
    first.name = "first"
    other = threading.Thread(target=second, name="second")
    first.start()
    other.start()
    first.join(5)
    other.join(5)
    monkeypatch.undo()
    assert [(choices.get(key) or {}).get("reason") for key in keys] == ["first", "second"]
