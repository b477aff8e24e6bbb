"""The Checkpointer, driven directly (no training loop): which steps end with a checkpoint, pruning to
``keep_last`` with early stopping's best checkpoint protected, and a restore that continues the newest
complete checkpoint with its weights, optimizer state and position."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch

from fastlm.engine.batching import StepPlan
from fastlm.engine.checkpoint.discovery import complete_checkpoints
from fastlm.engine.checkpoint.layout import checkpoint_dir
from fastlm.engine.distributed.parallel import SingleProcess
from fastlm.engine.train.persistence import Checkpointer
from fastlm.engine.train.state import TrainState
from fastlm.engine.train.step import Optimization
from tests.support.tiny_models import optimizer_and_scheduler
from tests.support.toy_training import run_toy, toy_model, toy_params, toy_sequences

TOTAL = 7


def checkpointer(tmp_path, *, seed: int = 0, **overrides) -> Checkpointer:
    """A single-process Checkpointer over the toy model and data (``overrides``: train.* settings)."""
    params = toy_params(tmp_path, **{"save_every": 2, "keep_last": 2, "resume": "auto", **overrides})
    model = toy_model(seed)
    optimizer, scheduler = optimizer_and_scheduler(model)
    opt = Optimization(model=model, optimizer=optimizer, scheduler=scheduler, scaler=None, clip=math.inf)
    return Checkpointer(
        params,
        model=model,
        opt=opt,
        comm=SingleProcess(),
        train_set=toy_sequences(20, 1),
        max_length=64,
        plan=StepPlan(lambda epoch: 10, world_size=1, accumulation=1, max_steps=TOTAL),
        device=torch.device("cpu"),
    )


def saved_at(saver: Checkpointer, state: TrainState, step: int):
    state.step = step
    return saver.save(state, {"epoch": 0, "batch_in_epoch": 4 * step})


def steps_on_disk(saver: Checkpointer) -> list[int]:
    return [int(path.name.rpartition("-")[2]) for path in complete_checkpoints(saver.root)]


@pytest.mark.parametrize("save_every, due", [(3, [3, 6, 7]), (2, [2, 4, 6, 7]), (None, [])])
def test_due_every_save_every_steps_and_at_the_last_step_forced_always(tmp_path, save_every, due):
    saver = checkpointer(tmp_path, save_every=save_every)
    assert [step for step in range(1, TOTAL + 1) if saver.due(step)] == due
    assert all(saver.due(step, force=True) for step in range(1, TOTAL + 1))  # a stop signal saves any step


def test_maybe_save_flushes_first_and_writes_only_when_due(tmp_path):
    saver = checkpointer(tmp_path, save_every=3)
    calls: list[int] = []
    state = TrainState()
    for step in range(1, 5):
        state.step = step
        saved = saver.maybe_save(
            state, {"epoch": 0, "batch_in_epoch": step}, before_save=lambda: calls.append(1)
        )
        assert (saved is not None) == (step == 3)
    assert len(calls) == 1  # before_save (the pending metrics row) runs only before a write
    assert state.last_good == checkpoint_dir(saver.root, 3) and steps_on_disk(saver) == [3]


def test_keep_last_prunes_the_oldest_but_the_protected_best_checkpoint_survives(tmp_path):
    saver = checkpointer(tmp_path, keep_last=2)
    state = TrainState()
    for step in (1, 2, 3):
        saved_at(saver, state, step)
    assert steps_on_disk(saver) == [2, 3]
    saver.protected = checkpoint_dir(saver.root, 2)  # early stopping's best step
    for step in (4, 5, 6):
        saved_at(saver, state, step)
    assert steps_on_disk(saver) == [2, 5, 6]


def test_restore_continues_the_newest_complete_checkpoint_with_its_weights_and_position(tmp_path):
    saver = checkpointer(tmp_path, keep_last=3)
    state = TrainState(history=[{"step": 2, "loss": 3.0}], early_stopping={"best_step": 2}, tokens_seen=640)
    saved_at(saver, state, 2)
    with torch.no_grad():  # the weights at step 4 differ from those at step 2
        for param in saver.model.parameters():
            param.add_(0.5)
    saved_at(saver, state, 4)
    weights = {name: tensor.clone() for name, tensor in saver.model.state_dict().items()}
    torn = checkpoint_dir(saver.root, 6)  # an interrupted save: no COMPLETE marker
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"half a file")

    # other initial weights; early stopping on, as the record's run had it
    resumed = checkpointer(tmp_path, keep_last=3, seed=1, early_stopping={"patience": 2})
    restored = resumed.restore()
    assert restored.step == restored.first_step == 4 and restored.resumed_from == checkpoint_dir(
        resumed.root, 4
    )
    assert (
        restored.batch_in_epoch == 16
        and restored.tokens_seen == 640
        and restored.last_good == restored.resumed_from
    )
    assert restored.history == [{"step": 2, "loss": 3.0}]
    # the best step stays protected after a resume; not where early stopping is off (its record set aside)
    assert resumed.protected == checkpoint_dir(resumed.root, 2)
    without = checkpointer(tmp_path, keep_last=3, seed=1)
    assert without.restore().step == 4 and without.protected is None
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name  # the saved tensors, read back


def test_restore_with_nothing_saved_starts_fresh(tmp_path):
    assert checkpointer(tmp_path).restore() == TrainState()


def test_a_resumed_run_trains_with_the_optimizer_settings_it_is_given(tmp_path, monkeypatch, caplog):
    """The NaN stop tells the user to lower ``train.optimizer.lr`` (or raise its warmup) and run again
    (``resume: auto``); the README continues a finished run by raising ``train.max_steps``. The checkpoint's
    optimizer state brought back its own peak rate and weight decay (0.01 and 0.1 applied where 0.001 and 0
    were asked), and a raised max_steps' first step took the old schedule's last rate: the run now follows
    the schedule and settings it is given from the step it resumes at, its AdamW moments kept, and says
    what changed."""
    from fastlm.engine.train.schedule import LRSchedule
    from tests.support.toy_training import run_toy

    applied = []
    adamw_step = torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        applied.append((self.param_groups[0]["lr"], self.param_groups[0]["weight_decay"]))
        return adamw_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    steady = {"log_every": 1, "eval_every": None, "save_every": 100, "resume": "auto"}
    first = {"lr": 1e-2, "warmup_steps": 2, "decay": "linear", "weight_decay": 0.1}
    run_toy(toy_params(tmp_path, optimizer=first, max_steps=3, **steady))
    schedule = LRSchedule(1e-2, 3, 2, "linear")
    assert applied == [(schedule.lr_at(step), 0.1) for step in range(3)]  # the same products: exact
    applied.clear()
    caplog.set_level("WARNING", logger="fastlm")
    second = {"lr": 1e-3, "warmup_steps": 4, "decay": "linear", "weight_decay": 0.0}
    resumed = run_toy(toy_params(tmp_path, optimizer=second, max_steps=6, **steady))
    assert resumed.summary["steps_trained"] == 3
    schedule = LRSchedule(1e-3, 6, 4, "linear")
    assert applied == [(schedule.lr_at(step), 0.0) for step in range(3, 6)]
    said = [r.getMessage() for r in caplog.records if "optimizer settings" in r.getMessage()]
    assert len(said) == 1 and "lr 0.01 -> 0.001" in said[0] and "weight_decay 0.1 -> 0" in said[0], said


def test_a_resumed_run_names_each_schedule_setting_it_changed_and_the_rate_it_jumps_to(tmp_path, caplog):
    """``warmup_steps``, ``decay``, ``min_lr_ratio``, ``grad_clip`` and the planned steps (a raised or
    lowered ``train.max_steps``) reshape the schedule of a resumed run as ``lr`` does, from its step on. Only
    lr, weight_decay, betas and eps were compared: a resume with another warmup (the rate dropping and
    warming up a second time) said nothing. The checkpoint records the schedule's settings; the one line
    names each change and the rate of the first step trained, the checkpoint's schedule's and this run's."""
    from fastlm.engine.train.schedule import LRSchedule
    from tests.support.toy_training import run_toy

    steady = {"log_every": 1, "eval_every": None, "save_every": 100, "resume": "auto"}
    first = {"lr": 1e-2, "warmup_steps": 2, "decay": "cosine", "min_lr_ratio": 0.1, "grad_clip": 1.0}
    run_toy(toy_params(tmp_path, optimizer=first, max_steps=3, **steady))
    caplog.set_level("WARNING", logger="fastlm")
    second = {**first, "warmup_steps": 5, "decay": "linear", "min_lr_ratio": 0.5, "grad_clip": 0.5}
    resumed = run_toy(toy_params(tmp_path, optimizer=second, max_steps=6, **steady))
    assert resumed.summary["steps_trained"] == 3
    said = [r.getMessage() for r in caplog.records if "optimizer settings" in r.getMessage()]
    assert len(said) == 1, said
    for change in (
        "warmup_steps 2 -> 5",
        "decay cosine -> linear",
        "min_lr_ratio 0.1 -> 0.5",
        "grad_clip 1 -> 0.5",
        "total_steps 3 -> 6",
    ):
        assert change in said[0], (change, said[0])
    was, now = LRSchedule(1e-2, 3, 2, "cosine", 0.1).lr_at(3), LRSchedule(1e-2, 6, 5, "linear", 0.5).lr_at(3)
    assert (
        f"first step trains at learning rate {now:.4g}, where the checkpoint's schedule gave {was:.4g}"
        in said[0]
    )
    assert "lr " not in said[0].split(":")[1]  # the peak rate is the same: not named


def test_a_checkpoint_that_recorded_no_schedule_resumes_naming_what_it_can(tmp_path, caplog):
    """A checkpoint written before its schedule settings were recorded resumes: the settings it holds (lr,
    weight_decay, the planned steps) are compared, the others are said to be not comparable, nothing
    fails."""
    import json

    from tests.support.toy_training import run_toy

    steady = {"log_every": 1, "eval_every": None, "save_every": 100, "resume": "auto"}
    run_toy(toy_params(tmp_path, optimizer={"warmup_steps": 2}, max_steps=3, **steady))
    (folder,) = complete_checkpoints(tmp_path / "checkpoints")
    state_file = folder / "trainer_state.json"
    trainer_state = json.loads(state_file.read_text())
    assert trainer_state["state"].pop("schedule")  # recorded now; an earlier fastlm wrote none
    state_file.write_text(json.dumps(trainer_state))
    manifest = json.loads((folder / "COMPLETE").read_text())
    manifest["files"]["trainer_state.json"] = state_file.stat().st_size
    (folder / "COMPLETE").write_text(json.dumps(manifest))
    caplog.set_level("WARNING", logger="fastlm")
    resumed = run_toy(toy_params(tmp_path, optimizer={"warmup_steps": 4, "lr": 1e-3}, max_steps=6, **steady))
    assert resumed.summary["steps_trained"] == 3
    (said,) = [r.getMessage() for r in caplog.records if "optimizer settings" in r.getMessage()]
    assert "lr 0.01 -> 0.001" in said and "total_steps 3 -> 6" in said and "warmup_steps" not in said
    assert "recorded no schedule settings" in said, said


def test_a_resumed_run_derives_its_warmup_ratio_from_the_whole_plan(tmp_path, monkeypatch):
    """``warmup_ratio`` is resumed as ``warmup_steps`` is: the checkpoint is continued (not in the digest)
    and this run's schedule applies from its step on, its warmup ceil(r x T) of the run's planned T (6 here,
    not the 3 steps left), recorded in the summary as the warmup the schedule ran."""
    from fastlm.engine.train.schedule import LRSchedule
    from tests.support.toy_training import run_toy

    applied = []
    adamw_step = torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        applied.append(self.param_groups[0]["lr"])
        return adamw_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    steady = {"log_every": 1, "eval_every": None, "save_every": 100, "resume": "auto"}
    first = {"lr": 1e-2, "warmup_steps": 20, "warmup_ratio": 0.5, "decay": "linear"}
    done = run_toy(toy_params(tmp_path, optimizer=first, max_steps=3, **steady))
    assert done.summary["warmup_steps"] == 2  # ceil(0.5 x 3)
    assert applied == [LRSchedule(1e-2, 3, 2, "linear").lr_at(step) for step in range(3)]  # exact
    applied.clear()
    second = {**first, "warmup_ratio": 0.6}
    resumed = run_toy(toy_params(tmp_path, optimizer=second, max_steps=6, **steady))
    assert resumed.summary["steps_trained"] == 3 and resumed.summary["resumed_from_step"] == 3
    assert resumed.summary["warmup_steps"] == 4  # ceil(0.6 x 6)
    assert applied == [LRSchedule(1e-2, 6, 4, "linear").lr_at(step) for step in range(3, 6)]


def test_a_checkpoint_packed_with_another_resolved_row_length_is_not_continued(tmp_path, monkeypatch, caplog):
    """``row_length: auto`` resolves to the data's row length rounded up to float8's token multiple, which
    the device decides (16 on a CUDA device float8 auto may use, else 1) and the digest does not see: with
    samples of up to 48 tokens and max_length 56, rows of 64 tokens (3 a micro-batch) on one machine and of
    56 (4 a micro-batch) on another. The digest recorded ``auto``, so the other machine continued the
    checkpoint's data position in another packing (a micro-batch trained twice or never). The digest holds
    the resolved length: auto starts fresh saying why."""
    import fastlm.engine.batching as batching_module
    from fastlm.engine.runtime.environment import setup_runtime
    from fastlm.engine.train.loop import train

    params = toy_params(
        tmp_path,
        batching={"mode": "packed", "micro_batch_size": 4, "row_length": "auto"},
        max_steps=6,
        save_every=3,
        eval_every=None,
        resume="auto",
    )

    def run(steps):
        current = params.model_copy(update={"max_steps": steps})
        runtime = setup_runtime(current.runtime, seed=current.seed)
        sets = toy_sequences(300, 1), toy_sequences(40, 2)
        return train(
            toy_model(), *sets, params=current, runtime=runtime, pad_id=1, max_length=56, attn="sdpa"
        )

    with monkeypatch.context() as aligned:  # the first machine: float8's multiple of 16 tokens
        aligned.setattr(batching_module, "token_multiple", lambda *args, **kwargs: 16)
        first = run(3)
    assert first.summary["steps"] == 3
    with caplog.at_level("WARNING"):
        second = run(6)
    assert second.summary["resumed_from"] is None
    assert "batching.row_length 64 -> 56" in caplog.text and "starting fresh" in caplog.text


def test_a_kept_checkpoint_keeps_the_best_checkpoint_it_records(tmp_path):
    """keep_last 2, early stopping's best at step 2, then a new best at 6: step 4 is kept beside 6, and a
    rewind to it (``train.resume: <step 4's folder>``) continues with step 2 as its best, whose weights the
    run returns. Step 2 was pruned when 6 became the best: the rewound run ended in a CheckpointError
    naming the missing step 2. It stays while a kept checkpoint records it, and goes with the last of them."""
    saver = checkpointer(tmp_path, keep_last=2)
    state = TrainState(early_stopping={"best_step": 2})
    saver.protected = checkpoint_dir(saver.root, 2)
    for step in (2, 4):
        saved_at(saver, state, step)
    state.early_stopping = {"best_step": 6}
    saver.protected = checkpoint_dir(saver.root, 6)
    saved_at(saver, state, 6)
    assert steps_on_disk(saver) == [2, 4, 6]  # step 4 records step 2 as its best
    saved_at(saver, state, 8)
    assert steps_on_disk(saver) == [6, 8]


def test_a_resume_whose_best_checkpoint_is_gone_is_refused_in_one_line(tmp_path):
    """A checkpoint whose early-stopping best is no longer on disk (removed by hand, or pruned before kept
    checkpoints kept their bests): with early stopping on, the run would train to its end and then fail to
    load the best step's weights; it is refused before training, naming the folder and the fixes. Without
    early stopping the model is the last step's: it resumes."""
    from fastlm.engine.checkpoint.layout import CheckpointError

    saver = checkpointer(tmp_path, keep_last=3)
    saved_at(saver, TrainState(early_stopping={"best_step": 2}), 4)  # step 2 never saved
    patient = checkpointer(tmp_path, keep_last=3, early_stopping={"patience": 2})
    with pytest.raises(
        CheckpointError, match=r"checkpoint-00000002.*train\.early_stopping\.patience"
    ) as error:
        patient.restore()
    assert "\n" not in str(error.value)
    assert checkpointer(tmp_path, keep_last=3).restore().step == 4


def test_a_resumed_fp16_fused_runs_first_rate_is_the_device_rate_it_would_have_used(tmp_path):
    """fp16 with fused AdamW: the schedule puts each rate on the device as a float32 tensor (the type CUDA's
    fused kernel reads). After a resume the settings kept from this run wrote the rate back as a Python
    float (a double), so the first resumed update used another rounding of the rate than the uninterrupted
    run's; it is the same float32 device tensor now. Same computation twice: exact equality."""
    from fastlm.engine.train.persistence import keep_settings
    from fastlm.engine.train.schedule import AppliedStepsLR, LRSchedule, make_lr_scheduler

    schedule = LRSchedule(1e-3, total_steps=10, warmup_steps=3, decay="cosine")

    def scheduler_of():
        optimizer = torch.optim.AdamW(toy_model().parameters(), lr=1e-3, fused=True)
        return make_lr_scheduler(optimizer, schedule, scaler=torch.amp.GradScaler("cpu"))

    uninterrupted = scheduler_of()
    assert isinstance(uninterrupted, AppliedStepsLR)
    for _ in range(4):
        uninterrupted.advance(torch.zeros(()))
    resumed = scheduler_of()
    resumed.load_state_dict(uninterrupted.state_dict())
    groups = resumed.optimizer.param_groups
    opt = Optimization(toy_model(), resumed.optimizer, resumed, torch.amp.GradScaler("cpu"), math.inf)
    keep_settings(opt, ([{} for _ in groups], list(resumed.base_lrs)), tmp_path)
    rates = [group["lr"] for group in groups]
    expected = [group["lr"] for group in uninterrupted.optimizer.param_groups]
    assert all(isinstance(rate, torch.Tensor) and rate.dtype == torch.float32 for rate in rates)
    assert all(torch.equal(rate, want) for rate, want in zip(rates, expected, strict=True))


def _sigterm_at(step: int):
    """A callback that sends this process SIGTERM once step ``step`` is recorded: the loop saves that step
    and stops (``TrainingInterrupted``), as Ctrl-C does."""

    def terminate(kind, record):
        if kind == "train" and record["step"] == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return [terminate]


def test_a_run_entered_again_with_nothing_to_train_is_finished_for_the_next_unnamed_run(tmp_path):
    """A run stopped at step 3 of 8, asked again with ``max_steps: 3``, trains nothing and returns its model
    (rc 0): it finished. Its newest checkpoint still read "step 3 of 8", so the next unnamed run took it for
    the newest interrupted run, took its name, moved its checkpoints aside and wrote over its model. Now it
    is finished; continued by name with a larger ``max_steps`` it resumes from that checkpoint as before and
    is judged by its new checkpoints again: stopped at 5 of 6 it is unfinished, and once it ends at 6
    without a checkpoint of that step (``save_every: null``) it is finished."""
    from fastlm.engine.checkpoint.discovery import finished_step, unfinished_runs
    from fastlm.engine.train.signals import TrainingInterrupted

    base, steady = (
        tmp_path / "ms1",
        {"log_every": 1, "eval_every": None, "save_every": None, "resume": "auto"},
    )
    run_folder = base / "checkpoints"
    with pytest.raises(TrainingInterrupted):
        run_toy(toy_params(base, max_steps=8, **steady), callbacks=_sigterm_at(3))
    assert unfinished_runs(base) == [run_folder]
    again = run_toy(toy_params(base, max_steps=3, **steady))
    assert again.summary["steps_trained"] == 0 and again.summary["resumed_from_step"] == 3
    assert unfinished_runs(base) == []
    with pytest.raises(TrainingInterrupted):  # continued by name: from step 3, stopped again at 5
        run_toy(toy_params(base, max_steps=6, **steady), callbacks=_sigterm_at(5))
    assert unfinished_runs(base) == [run_folder]
    done = run_toy(toy_params(base, max_steps=6, **steady))
    assert done.summary["resumed_from_step"] == 5 and done.summary["steps_trained"] == 1
    assert [path.name for path in complete_checkpoints(run_folder)][-1] == "checkpoint-00000005"
    assert unfinished_runs(base) == []
    assert finished_step(run_folder / "checkpoint-00000005") == 6  # the step it ended at, not the saved one


@pytest.fixture(scope="module")
def ranks_on_their_checkpoints(tmp_path_factory, bpe_tokenizer, sample_texts):
    """Two gloo ranks running a short job as the torchrun ranks of two nodes do, each with its own
    ``train.checkpoint_dir`` (each node's disk; tests/support/checkpoint_ranks): first both on one folder
    (2 steps, a checkpoint at step 2), then ``resume: auto`` to step 4 where rank 0's folder holds that
    checkpoint and rank 1's none (``node``), then both on a copy of the first folder (``shared``)."""
    import shutil

    from tests.support import checkpoint_ranks
    from tests.support.parallel_jobs import job_params, tokenized_splits

    folder = tmp_path_factory.mktemp("checkpoint_ranks")
    splits = tokenized_splits(bpe_tokenizer, sample_texts)

    def params(where: str, steps: int):
        return job_params(
            folder, accum=1, nproc=2, max_steps=steps, eval_every=None, save_every=2, resume="auto",
            checkpoint_dir=str(folder / where),
        )  # fmt: skip

    (folder / "first").mkdir()
    (folder / "again").mkdir()
    first = checkpoint_ranks.run(folder / "first", bpe_tokenizer, splits, {"first": [params("run", 2)] * 2})
    shutil.copytree(folder / "run", folder / "node0")
    shutil.copytree(folder / "run", folder / "shared")
    (folder / "node1").mkdir()
    cases = {
        "node": [params("node0", 4), params("node1", 4)],
        "shared": [params("shared", 4)] * 2,
    }
    return first, checkpoint_ranks.run(folder / "again", bpe_tokenizer, splits, cases), folder


def test_ranks_that_would_continue_other_checkpoints_each_refuse_in_one_line(ranks_on_their_checkpoints):
    """A node that does not see rank 0's checkpoints (checkpoints on each node's own disk, as when only the
    tokenized data was copied to every node): its ranks started fresh while rank 0 continued step 2, DDP
    averaged the gradients of two models at different steps and learning rates, rank 0 wrote a checkpoint
    of step 4, and rank 1 then waited in a collective until train.distributed.timeout_s. Now every rank
    refuses before training, in one line naming both ranks' choices and the fix; nothing is written."""
    first, again, folder = ranks_on_their_checkpoints
    assert [rank["first"]["steps"] for rank in first] == [2, None]
    seen = [rank["node"] for rank in again]
    assert [case.get("exit_code") for case in seen] == [2, 2]  # every rank refuses, none trains
    line = seen[0]["error"]
    assert line == seen[1]["error"] and "\n" not in line
    assert "rank 0 continues checkpoint-00000002" in line and "rank 1 starts fresh" in line
    assert "train.checkpoint_dir" in line and "Fix:" in line
    assert sorted(path.name for path in (folder / "node0").iterdir()) == ["checkpoint-00000002"]


def test_ranks_that_see_the_same_checkpoints_continue_the_same_one(ranks_on_their_checkpoints):
    _, again, folder = ranks_on_their_checkpoints
    assert [rank["shared"] for rank in again] == [
        {"steps": 2, "resumed_from_step": 2},
        {"steps": None, "resumed_from_step": None},
    ]
    assert "checkpoint-00000004" in {path.name for path in (folder / "shared").iterdir()}
