"""Resume only what belongs to this run: a checkpoint records what makes it resumable (model, LoRA, data,
batching, seed, layout); `auto` continues only a matching one, otherwise starts fresh and says why in one
line; an explicit folder that does not match is refused; more steps continue to the new total; one writer per
folder."""

import json
import logging
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.layout import CheckpointError
from fastlm.engine.checkpoint.lock import checkpoint_lock
from fastlm.engine.observe.health import NonFiniteLossError
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.loop import train
from tests.support.toy_training import (
    EOS,
    VOCAB,
    poisoned_model,
    run_toy,
    toy_model,
    toy_params,
    toy_sequences,
)

BASE = {"max_steps": 4, "save_every": 2, "log_every": 1, "eval_every": None}


def _train(params, *, model=None, data_seed=1, max_length=64, callbacks=()):
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    return train(
        model if model is not None else toy_model(),
        toy_sequences(300, data_seed),
        None,
        params=params,
        runtime=runtime,
        pad_id=EOS,
        max_length=max_length,
        attn="sdpa",
        callbacks=callbacks,
    )


def _fresh_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "starting fresh" in r.getMessage()]


def test_auto_continues_a_matching_checkpoint_to_a_larger_total_and_reports_this_process(tmp_path):
    _train(toy_params(tmp_path, **{**BASE, "max_steps": 6, "save_every": 3}))
    more = _train(toy_params(tmp_path, **{**BASE, "max_steps": 10, "save_every": 3}, resume="auto"))
    assert [r["step"] for r in more.history] == list(range(1, 11))
    summary = more.summary
    assert summary["steps"] == 10 and summary["steps_trained"] == 4 and summary["resumed_from_step"] == 6
    assert summary["resumed_from"].endswith("checkpoint-00000006")
    assert 0 < summary["wall_time_s"]


def test_a_finished_run_asked_again_trains_nothing_and_says_so(tmp_path, caplog):
    _train(toy_params(tmp_path, **BASE))
    caplog.set_level(logging.INFO, logger="fastlm")
    again = _train(toy_params(tmp_path, **BASE, resume="auto"))
    assert again.summary["steps_trained"] == 0 and again.summary["steps"] == 4
    assert any(
        "nothing to train" in r.getMessage() and "train.max_steps" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"batching": {"micro_batch_size": 2}}, "batching.micro_batch_size"),
        ({"batching": {"mode": "dynamic"}}, "batching.mode"),
        ({"seed": 7}, "seed"),
        ({"data_seed": 7}, "data_seed"),
        ({"batching": {"gradient_accumulation_steps": 2}}, "micro_batches_per_step"),
        # other packed rows: other batches at a position (auto resolves to 64 here: the digest holds that)
        ({"batching": {"row_length": 48}}, "batching.row_length"),
        ({"batching": {"pad_to_multiple_of": 8}}, "batching.pad_to_multiple_of"),
        # another objective: the run's train losses (and the summary's, the report's label) would mix two
        ({"loss": {"label_smoothing": 0.1}}, "loss.label_smoothing"),
        # NEFTune's noise on the embeddings: another objective from the resumed step on, as label smoothing
        ({"model": {"neftune_noise_alpha": 5.0}}, "model.neftune_noise_alpha"),
    ],
)
def test_auto_starts_fresh_when_the_batching_changed_and_says_why_and_where(tmp_path, caplog, change, field):
    _train(toy_params(tmp_path, **BASE))
    root = tmp_path / "checkpoints"
    caplog.set_level(logging.INFO, logger="fastlm")
    again = _train(toy_params(tmp_path, **BASE, **change, resume="auto"))
    assert again.summary["steps_trained"] == 4 and [r["step"] for r in again.history] == [1, 2, 3, 4]
    (line,) = _fresh_lines(caplog)
    assert field in line and "checkpoint-00000004" in line and "\n" not in line
    kept = [p for p in root.rglob("checkpoint-00000004") if p.parent != root]  # the old ones, moved aside
    assert len(kept) == 1 and str(kept[0].parent) in line
    assert latest_checkpoint(root).name == "checkpoint-00000004" and latest_checkpoint(kept[0].parent)


def test_auto_starts_fresh_on_other_data_max_length_or_model_shape(tmp_path, caplog):
    _train(toy_params(tmp_path, **BASE))
    caplog.set_level(logging.INFO, logger="fastlm")
    _train(toy_params(tmp_path, **BASE, resume="auto"), data_seed=5)
    _train(toy_params(tmp_path, **BASE, resume="auto"), data_seed=5, max_length=48)
    torch.manual_seed(0)
    wider = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            eos_token_id=EOS,
            pad_token_id=EOS,
            attn_implementation="sdpa",
            use_cache=False,
        )
    )
    _train(toy_params(tmp_path, **BASE, resume="auto"), data_seed=5, max_length=48, model=wider)
    lines = _fresh_lines(caplog)
    assert len(lines) == 3
    assert "data" in lines[0] and "max_length" in lines[1] and "model.shape" in lines[2]


def test_a_checkpoint_past_the_asked_steps_is_not_resumed(tmp_path, caplog):
    _train(toy_params(tmp_path, **{**BASE, "max_steps": 6}))
    caplog.set_level(logging.INFO, logger="fastlm")
    fewer = _train(toy_params(tmp_path, **BASE, resume="auto"))
    assert fewer.summary["steps_trained"] == 4
    (line,) = _fresh_lines(caplog)
    assert "step 6" in line and "4" in line


def test_an_explicit_folder_that_does_not_match_is_refused_in_one_line(tmp_path):
    _train(toy_params(tmp_path, **BASE))
    folder = tmp_path / "checkpoints" / "checkpoint-00000004"
    with pytest.raises(CheckpointError) as raised:
        _train(toy_params(tmp_path / "other", **{**BASE, "max_steps": 8}, seed=3, resume=str(folder)))
    message = str(raised.value)
    assert "\n" not in message and "seed" in message and str(folder) in message and "train.resume" in message
    assert not (tmp_path / "other" / "checkpoints").exists()  # nothing written


def test_an_explicit_folder_of_another_data_seed_is_refused_in_one_line(tmp_path):
    _train(toy_params(tmp_path, **BASE, data_seed=5))
    folder = tmp_path / "checkpoints" / "checkpoint-00000004"
    with pytest.raises(CheckpointError) as raised:
        _train(toy_params(tmp_path / "other", **{**BASE, "max_steps": 8}, data_seed=6, resume=str(folder)))
    message = str(raised.value)
    assert "\n" not in message and "data_seed 5 -> 6" in message and str(folder) in message
    assert not (tmp_path / "other" / "checkpoints").exists()  # nothing written


def test_the_digest_compares_the_data_order_seed_and_an_older_checkpoint_reads_as_data_seed_null(tmp_path):
    """``data_seed`` in the digest is train.data_seed as set (null: the order follows train.seed); two digests
    match where their orders' seeds do, and a checkpoint written before the field existed reads as null."""
    from fastlm.engine.checkpoint.resume import digest_differences, run_digest

    def digest(**seeds):
        params = toy_params(tmp_path, **BASE, **seeds)
        return run_digest(toy_model(), params, max_length=64, data="d", world_size=1, sharded=False)

    null = digest(seed=3)
    assert null["data_seed"] is None and digest(seed=3, data_seed=8)["data_seed"] == 8
    older = {key: value for key, value in null.items() if key != "data_seed"}
    assert digest_differences(older, null) == []
    assert digest_differences(null, digest(seed=3, data_seed=3)) == []  # the same order
    assert digest_differences(older, digest(seed=3, data_seed=8)) == ["data_seed None (seed 3) -> 8"]
    assert digest_differences(digest(seed=3, data_seed=8), digest(seed=4, data_seed=8)) == ["seed 3 -> 4"]


def test_nan_stop_names_this_runs_checkpoint_not_an_earlier_runs(tmp_path):
    # an earlier run, step 6
    _train(toy_params(tmp_path, **{**BASE, "max_steps": 6, "save_every": 6}, seed=5))
    model, poison = poisoned_model(3)
    with pytest.raises(NonFiniteLossError) as error:
        _train(toy_params(tmp_path, **{**BASE, "max_steps": 8}), model=model, callbacks=[poison])
    message = str(error.value)
    assert "checkpoint-00000002" in message and "checkpoint-00000006" not in message


def test_a_second_writer_is_refused_naming_the_holder_and_a_stale_lock_is_taken_over(tmp_path):
    root = tmp_path / "checkpoints"
    with checkpoint_lock(root):
        with pytest.raises(CheckpointError) as raised:
            _train(toy_params(tmp_path, **BASE, resume="auto"))
    message = str(raised.value)
    assert f"PID {os.getpid()}" in message and "\n" not in message and str(root) in message
    assert not latest_checkpoint(root)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root.mkdir(parents=True, exist_ok=True)
    (root / ".lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    done = _train(toy_params(tmp_path, **BASE, resume="auto"))
    assert done.summary["steps_trained"] == 4 and not (root / ".lock").exists()


def test_the_digest_is_in_the_checkpoint(tmp_path):
    _train(toy_params(tmp_path, **BASE))
    state = json.loads((tmp_path / "checkpoints" / "checkpoint-00000004" / "trainer_state.json").read_text())
    digest = state["state"]["digest"]
    for key in (
        "model.source",
        "model.shape",
        "model.lora",
        "data",
        "batching.mode",
        "batching.micro_batch_size",
        "max_length",
        "seed",
        "data_seed",
        "micro_batches_per_step",
        "distributed.strategy",
    ):
        assert key in digest, key
    assert math.isfinite(state["state"]["total_steps"])


def test_a_run_saved_after_an_oom_backoff_resumes_with_the_micro_batch_it_was_saved_with(
    tmp_path, memory_for_rows
):  # noqa: F811 - the fixture imported above
    seen = memory_for_rows(2)
    settings = {
        **BASE,
        "max_steps": 6,
        "batching": {"micro_batch_size": 8, "oom_backoff": True},
        "runtime": {"deterministic": True},
    }
    straight = _train(toy_params(tmp_path / "a", **settings))
    assert straight.summary["oom_backoffs"]  # backed off to 2 rows at step 1

    def interrupt(kind, record):
        if record["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _train(toy_params(tmp_path / "b", **settings), callbacks=[interrupt])
    seen.clear()
    resumed = _train(toy_params(tmp_path / "b", **settings, resume="auto"))
    assert resumed.summary["resumed_from_step"] == 2 and resumed.summary["oom_backoffs"] == []
    assert max(seen) <= 2  # no second out-of-memory attempt with the configured 8 rows
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]


def test_a_lora_checkpoint_written_before_the_init_setting_resumes_and_another_init_starts_fresh(tmp_path):
    # PiSSA and OLoRA train over a changed base, which no checkpoint holds: adapters trained over one init's
    # base are no adapters for another's. A run at an init that leaves the base alone matches a checkpoint
    # written before the setting existed (its digest has no init).
    from fastlm.engine.checkpoint.resume import digest_differences

    def digest(**lora):
        return _lora_digest(tmp_path, **lora)

    default = digest()
    assert "init" not in default["model.lora"]
    assert digest(init="gaussian") == default  # other initial adapters, the same base: the trained ones load
    for init in ("pissa", "pissa_niter_4", "olora"):
        differences = digest_differences(default, digest(init=init))
        assert [line.split(" ")[0] for line in differences] == ["model.lora"]
    assert digest(init="pissa") != digest(init="pissa_niter_4")


def test_a_lora_checkpoint_continues_under_its_module_lists_written_in_another_order(tmp_path):
    """``lora.target_modules`` and ``lora.modules_to_save`` name sets of modules (peft wraps them in the
    model's own order, so the parameters and their AdamW moments keep their places): the same modules
    written in another order are the same run; another module is another. Was: ``resume: auto`` started
    fresh on ``[lm_head, embed_tokens]`` after ``[embed_tokens, lm_head]``."""
    from fastlm.engine.checkpoint.resume import digest_differences

    def digest(**lora):
        return _lora_digest(tmp_path, **lora)

    saved = digest(target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens", "lm_head"])
    reordered = digest(target_modules=["v_proj", "q_proj"], modules_to_save=["lm_head", "embed_tokens"])
    assert digest_differences(saved, reordered) == []
    other = digest(target_modules=["q_proj", "k_proj"], modules_to_save=["embed_tokens", "lm_head"])
    assert [line.split(" ")[0] for line in digest_differences(saved, other)] == ["model.lora"]


def test_fsdp_in_one_process_trains_unsharded_says_so_and_a_sharded_checkpoint_is_no_other_run(
    tmp_path, caplog
):
    """``strategy: fsdp`` with one process has nothing to shard: the run says it trains unsharded (as ddp
    would). Round twenty-one: a sharded checkpoint is no other run for an unsharded one (was: refused, "fsdp
    (sharded ...) -> unsharded"): its whole weights and moments load in either (tests/engine/distributed/
    test_parallel.py resumes it both ways)."""
    from fastlm.engine.checkpoint.resume import digest_differences

    params = toy_params(tmp_path, max_steps=2, eval_every=None, distributed={"strategy": "fsdp"})
    with caplog.at_level(logging.INFO, logger="fastlm"):
        run_toy(params)
    said = [record.getMessage() for record in caplog.records if "nothing to shard" in record.getMessage()]
    assert len(said) == 1 and "train.distributed.strategy: fsdp" in said[0] and "unsharded" in said[0]
    assert digest_differences({"distributed.strategy": "fsdp"}, {"distributed.strategy": "ddp"}) == []
    assert digest_differences({"distributed.strategy": "ddp"}, {"distributed.strategy": "fsdp"}) == []


def test_a_model_folder_in_the_project_is_named_from_it_so_a_moved_project_resumes(tmp_path, monkeypatch):
    """Round six: the digest held a pretrained folder's absolute path: after `mv` of the project the same run
    was "another model" (`model.source /tmp/a/... -> /tmp/b/...`), its checkpoints were set aside and it
    trained from step 0. A folder inside the project (the working folder of every run) is named relative to
    it; one named absolute by an earlier fastlm still matches the same folder."""
    from fastlm.engine.checkpoint.resume import digest_differences, run_digest

    def digest(project):
        (project / "models" / "base").mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(project)
        params = toy_params(project, model={"name_or_path": "models/base"})
        return run_digest(toy_model(), params, max_length=64, data="d", world_size=1, sharded=False)

    before = digest(tmp_path / "a")
    assert before["model.source"] == "models/base"
    (tmp_path / "a").rename(tmp_path / "b")
    after = digest(tmp_path / "b")
    assert digest_differences(before, after) == []
    older = {**after, "model.source": str((tmp_path / "b" / "models" / "base").resolve())}
    assert digest_differences(older, after) == []
    elsewhere = {**after, "model.source": str(tmp_path / "c" / "models" / "base")}
    assert digest_differences(elsewhere, after) != []


# ------------------------------------------------------------- another number of processes, the step plan

DIGEST = {"data": "d", "micro_batches_per_step": 2}


def _saved_by(root, trained, world_size: int | None, *, step: int = 2, batch: int = 4):
    """A checkpoint of ``world_size`` processes (None: a state without the field, as written before data
    parallelism) at global micro-batch ``batch`` of epoch 0, two micro-batches a step."""
    from fastlm.engine.checkpoint.files import save_checkpoint

    model, optimizer, scheduler = trained
    state = {"step": step, "epoch": 0, "batch_in_epoch": batch, "digest": DIGEST, "history": []}
    if world_size is not None:
        state["world_size"] = world_size
    return save_checkpoint(root, step, model=model, optimizer=optimizer, scheduler=scheduler, state=state)


def _plan(sizes, world_size: int, **total):
    """This run's step plan: ``sizes`` global micro-batches each epoch, two a step over ``world_size``."""
    from fastlm.engine.batching import StepPlan

    counts = sizes if callable(sizes) else (lambda epoch: sizes)
    return StepPlan(counts, world_size=world_size, accumulation=2 // world_size, **total)


@pytest.mark.parametrize(
    ("saved", "now", "sizes", "total", "same"),
    [
        (2, 1, 24, {"epochs": 2}, True),  # even: both train all 24 an epoch
        (2, 1, 25, {"epochs": 2}, False),  # two processes leave the 25th out, one trains it: 12 vs 13 steps
        (2, 1, 25, {"max_steps": 4}, True),  # never at an epoch's end: the same 8 micro-batches
        (2, 1, 25, {"epochs": 0.5}, False),  # half an epoch of 12 steps or of 13: 6 steps or 7
        (2, 1, lambda epoch: [24, 25][epoch], {"epochs": 2}, False),  # packed epochs: the second differs
        (1, 2, 25, {"epochs": 1}, False),  # the other way
        (None, 2, 25, {"epochs": 1}, False),  # no record: one process, which trained the 25th
        (None, 2, 24, {"epochs": 1}, True),
    ],
)
def test_another_number_of_processes_resumes_only_where_the_step_plans_agree(
    tmp_path, trained, caplog, saved, now, sizes, total, same
):
    """Round eight: each epoch's global micro-batches are split evenly over the processes, the last
    ``N mod W`` left out; a checkpoint of W processes resumed by W' where ``N mod W != N mod W'`` continued
    on another step plan (12 vs 13 steps an epoch here), a micro-batch trained twice or never: ``auto``
    starts fresh saying why in one line, an explicit folder is refused in one; where the plans agree the
    checkpoint resumes."""
    from fastlm.engine.checkpoint.resume import plan_resume

    root = tmp_path / "checkpoints"
    folder = _saved_by(root, trained, saved)
    plan = _plan(sizes, now, **total)
    if same:
        assert plan_resume(root, "auto", DIGEST, plan=plan).checkpoint == folder
        assert plan_resume(root, str(folder), DIGEST, plan=plan).checkpoint == folder
        return
    with pytest.raises(CheckpointError) as raised:
        plan_resume(root, str(folder), DIGEST, plan=plan, move_old=False)
    message = str(raised.value)
    assert "\n" not in message and str(folder) in message and "process" in message and "epoch" in message
    caplog.set_level(logging.INFO, logger="fastlm")
    assert plan_resume(root, "auto", DIGEST, plan=plan).checkpoint is None
    (line,) = _fresh_lines(caplog)
    assert "\n" not in line and folder.name in line and "process" in line and "epoch" in line
    assert not (root / folder.name).exists()  # moved aside, kept


def test_the_data_digest_sees_a_chats_trained_answers_and_data_without_them_hashes_as_before():
    """Training a chat's earlier answers changes what a data position trains: a checkpoint of the same ids
    with other answer spans is other data. Data without spans keeps its digest (its checkpoints resume)."""
    import hashlib

    import numpy as np

    from fastlm.engine.checkpoint.resume import data_digest

    values, offsets, prompts = np.arange(12, dtype=np.int32), np.array([0, 5, 12]), np.array([3, 4])
    before = hashlib.blake2b(digest_size=16)
    for array in (values, offsets, prompts):
        before.update(memoryview(array).cast("B"))
        before.update(b"|")
    assert data_digest(values, offsets, prompts) == before.hexdigest()
    one = (np.array([1, 2], dtype=np.int32), np.array([0, 2, 2]))
    other = (np.array([1, 3], dtype=np.int32), np.array([0, 2, 2]))
    digests = {data_digest(values, offsets, prompts, spans) for spans in (None, one, other)}
    assert len(digests) == 3


def test_a_checkpoint_that_recorded_row_length_auto_says_an_earlier_fastlm_wrote_it():
    """A checkpoint of an earlier fastlm recorded ``batching.row_length: auto`` (not the length ``auto``
    packed to, which the digest holds now): a resume starts fresh saying the checkpoint does not record the
    length, not that the setting changed (the user changed nothing); a length that did change reads as one."""
    from fastlm.engine.checkpoint.resume import digest_differences

    now = {"batching.row_length": 128, "seed": 0}
    earlier = {**now, "batching.row_length": "auto"}
    other = {**now, "batching.row_length": 64}
    [said] = digest_differences(earlier, now)
    assert said.startswith("batching.row_length auto -> 128") and "earlier fastlm" in said, said
    assert "not the length" in said, said
    assert digest_differences(other, now) == ["batching.row_length 64 -> 128"]
    assert digest_differences({**earlier, "batching.mode": "packed"}, {**now, "batching.mode": "packed"}) == [
        said
    ]


def test_a_model_config_of_the_same_shapes_but_other_math_is_another_run(tmp_path):
    """A base folder's config.json changed where no weight's shape shows it (another RoPE base or scaling, a
    norm's epsilon, the activation): ``resume: auto`` continued the checkpoint under the other positions or
    activation, without a word. Now ``model.config`` names the changed key; a checkpoint written before the
    field existed still resumes, and the settings that change no computation (the cache, the attention
    kernel, dropout) are no part of it."""
    from fastlm.engine.checkpoint.resume import digest_differences, run_digest

    params = toy_params(tmp_path, **BASE)

    def digest(model):
        return run_digest(model, params, max_length=64, data="d", world_size=1, sharded=False)

    before = digest(toy_model())
    rope = toy_model()
    rope.config.rope_parameters = {"rope_theta": 500000.0, "rope_type": "default"}
    eps = toy_model()
    eps.config.rms_norm_eps = 1e-5
    changed = digest_differences(before, digest(rope)) + digest_differences(before, digest(eps))
    assert [line.split(" ")[0] for line in changed] == [
        "model.config.rope_parameters.rope_theta",
        "model.config.rms_norm_eps",
    ]
    assert "500000" in changed[0] and "1e-05" in changed[1]
    same = toy_model(attn="eager")
    same.config.use_cache, same.config.attention_dropout = True, 0.1
    assert digest_differences(before, digest(same)) == []
    older = {key: value for key, value in before.items() if key != "model.config"}
    assert digest_differences(older, digest(rope)) == []


def test_a_full_fine_tunes_checkpoint_without_base_weights_is_still_resumed():
    """A full fine-tune's checkpoint from before its base folder's weights were recorded (None there) is not
    compared on them; a LoRA one's, or a recorded one's, is."""
    from fastlm.engine.checkpoint.resume import digest_differences

    now = {"model.lora": None, "model.base_weights": "b" * 16}
    assert digest_differences({"model.lora": None, "model.base_weights": None}, now) == []
    (line,) = digest_differences({"model.lora": None, "model.base_weights": "a" * 16}, now)
    assert line.startswith("model.base_weights"), line
    lora = {"model.lora": {"r": 4}, "model.base_weights": "b" * 16}
    assert len(digest_differences({"model.lora": {"r": 4}, "model.base_weights": None}, lora)) == 1


def test_a_replacement_cut_between_its_renames_is_recovered_before_the_resume_is_chosen(
    tmp_path, trained, caplog
):
    """Round twenty: a save of a step already on disk killed between the two renames of its swap (where the
    system has no atomic exchange) left no ``checkpoint-<step>``, its previous copy aside and its complete
    new copy beside it: ``auto`` resumed from an older checkpoint (or started fresh). Now the writing process
    puts the new copy in place first, in one log line."""
    from fastlm.engine.checkpoint.resume import plan_resume

    root = tmp_path / "checkpoints"
    _saved_by(root, trained, 1, step=1)
    folder = _saved_by(root, trained, 1, step=2)
    shutil.copytree(folder, root / ".tmp-replaced-checkpoint-00000002-99999999-0a1b2c3d")
    os.replace(folder, root / ".tmp-checkpoint-00000002-99999999-0a1b2c3d")
    caplog.set_level(logging.INFO, logger="fastlm")
    assert plan_resume(root, "auto", DIGEST, plan=_plan(24, 1, epochs=2)).checkpoint == folder
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-")) == []
    (line,) = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert folder.name in line


def test_a_checkpoint_written_before_label_smoothing_was_recorded_still_resumes():
    """Fields added to the digest later are compared only where the checkpoint recorded them."""
    from fastlm.engine.checkpoint.resume import digest_differences

    now = {"seed": 0, "loss.label_smoothing": 0.1, "eval_max_batches": 2}
    assert digest_differences({"seed": 0}, now) == []
    assert digest_differences({"seed": 0, "loss.label_smoothing": 0.0}, now) == [
        "loss.label_smoothing 0.0 -> 0.1"
    ]


def test_a_checkpoint_written_before_neftune_noise_alpha_was_recorded_still_resumes():
    """NEFTune's alpha is compared as label smoothing is: only where the checkpoint recorded it."""
    from fastlm.engine.checkpoint.resume import digest_differences

    now = {"seed": 0, "model.neftune_noise_alpha": 5.0}
    assert digest_differences({"seed": 0}, now) == []
    assert digest_differences({"seed": 0, "model.neftune_noise_alpha": 0.0}, now) == [
        "model.neftune_noise_alpha 0.0 -> 5.0"
    ]


def _lora_digest(tmp_path, **lora) -> dict:
    """The resume digest of a LoRA run of the toy model with the adapter settings ``lora``."""
    from fastlm.engine.checkpoint.resume import run_digest

    params = toy_params(tmp_path, **BASE)
    model = params.model.model_copy(
        update={"lora": params.model.lora.model_copy(update={"enabled": True, **lora})}
    )
    return run_digest(
        toy_model(),
        params.model_copy(update={"model": model}),
        max_length=64,
        data="d",
        world_size=1,
        sharded=False,
    )


def test_a_length_grouped_checkpoint_of_the_former_order_starts_fresh_saying_why(tmp_path, caplog):
    """length_grouped now groups whole optimizer steps by length (``samplers.LengthGroupedSampler``): a
    checkpoint written under the former order (each micro-batch grouped on its own, no
    ``batching.length_groups`` in its digest) would continue at its saved position in another order, samples
    trained twice or never in its epoch. ``auto`` starts fresh and says why; a checkpoint of the same order
    continues; the other modes' digests have no such field."""
    from fastlm.engine.checkpoint.resume import run_digest

    grouped = {**BASE, "batching": {"mode": "length_grouped", "micro_batch_size": 4}}
    _train(toy_params(tmp_path, **grouped))
    state_file = latest_checkpoint(tmp_path / "checkpoints") / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["state"]["digest"]["batching.length_groups"] == "whole steps"
    again = _train(toy_params(tmp_path, **{**grouped, "max_steps": 6}, resume="auto"))
    assert again.summary["resumed_from_step"] == 4 and not _fresh_lines(caplog)
    state_file = latest_checkpoint(tmp_path / "checkpoints") / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["state"]["digest"]["batching.length_groups"]  # as an earlier fastlm wrote it
    state_file.write_text(json.dumps(state))
    with caplog.at_level(logging.INFO):
        fresh = _train(toy_params(tmp_path, **{**grouped, "max_steps": 8}, resume="auto"))
    assert fresh.summary["resumed_from_step"] is None
    [line] = _fresh_lines(caplog)
    assert (
        "batching.length_groups None -> whole steps (the checkpoint, from an earlier fastlm, grouped each "
        "micro-batch by length on its own: another data order)" in line
    ), line
    for mode in ("packed", "dynamic"):
        params = toy_params(tmp_path, **{**BASE, "batching": {"mode": mode}})
        digest = run_digest(toy_model(), params, max_length=64, data="d", world_size=1, sharded=False)
        assert "batching.length_groups" not in digest
