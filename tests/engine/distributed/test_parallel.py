"""Data parallelism on CPU with gloo: sharding, resume positions, and real 2-process runs via the launcher."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from fastlm.engine.batching import RandomBatches, make_batching
from fastlm.engine.checkpoint.layout import CheckpointError
from fastlm.engine.data import LengthGroupedSampler, PackedBatchSampler, TokenBudget
from fastlm.engine.distributed.parallel import (
    RankInfo,
    launch_mode,
    optimizer_state_by_index,
    optimizer_state_by_name,
    rank_device,
    rank_from_env,
    resolve_backend,
)
from fastlm.engine.launch.job import TrainJob, run_job
from fastlm.engine.train.persistence import resume_position
from fastlm.errors import ConfigError
from tests.support.parallel_jobs import job_params, launch, one_and_two, run_one, tokenized_splits
from tests.support.tolerances import BF16_MODEL_LOSS_REL, TRAINED_FP32_LOSS_REL, TRAINED_FP32_WEIGHTS

LENGTHS = np.random.default_rng(0).integers(3, 40, size=500)


def _samplers():
    return {
        "packed": lambda: PackedBatchSampler(LENGTHS, TokenBudget(row_length=48, rows_per_batch=2), seed=1),
        "length_grouped": lambda: LengthGroupedSampler(LENGTHS, 4, mega_batch_mult=5, seed=1),
        "dynamic": lambda: RandomBatches(LENGTHS, 4, seed=1),
    }


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
@pytest.mark.parametrize(("world", "accum"), [(2, 1), (2, 3), (4, 2)])
def test_each_step_of_the_shards_uses_the_batches_of_one_process_with_world_times_accumulation(
    mode, world, accum
):
    single = _samplers()[mode]()
    global_batches = [tuple(batch) for batch in single]
    shards = []
    for rank in range(world):
        sampler = _samplers()[mode]()
        sampler.shard(rank, world)
        shards.append([tuple(batch) for batch in sampler])
    assert len({len(shard) for shard in shards}) == 1  # every rank runs the same number of steps
    steps = len(shards[0]) // accum
    for step in range(steps):
        ranks_step = {batch for shard in shards for batch in shard[step * accum : (step + 1) * accum]}
        one_process = set(global_batches[step * accum * world : (step + 1) * accum * world])
        assert ranks_step == one_process
    seen = [index for shard in shards for batch in shard for index in batch]
    assert len(seen) == len(set(seen))  # no sample twice within an epoch


def test_packed_shards_are_balanced_by_tokens_not_rows():
    world = 2
    tokens = []
    for rank in range(world):
        sampler = _samplers()["packed"]()
        sampler.shard(rank, world)
        tokens.append([int(LENGTHS[batch].sum()) for batch in sampler])
    per_step = np.array(tokens)  # [rank, step]: one micro-batch per step
    budget = 48 * 2
    assert per_step.max() <= budget
    assert np.median(np.abs(per_step[0] - per_step[1])) <= 0.1 * budget


def test_a_resumed_shard_continues_where_it_stopped():
    sampler = _samplers()["packed"]()
    sampler.shard(1, 2)
    every = [tuple(batch) for batch in sampler]
    sampler.set_epoch(0, start_batch=3)
    assert [tuple(batch) for batch in sampler] == every[3:]


def test_evaluation_shards_keep_the_remainder():
    batches = [tuple(b) for b in _samplers()["dynamic"]()]
    kept = []
    for rank in range(3):
        sampler = _samplers()["dynamic"]()
        sampler.shard(rank, 3, even=False)
        kept += [tuple(b) for b in sampler]
    assert sorted(kept) == sorted(batches)


def test_resume_position_splits_the_global_batch_or_says_why_not(tmp_path):
    state = {"epoch": 0, "batch_in_epoch": 12, "world_size": 2}
    assert resume_position(state, 4, tmp_path) == 3 and resume_position(state, 1, tmp_path) == 12
    with pytest.raises(
        CheckpointError, match=r"global micro-batch 12 .* 5 processes cannot split.*divides 12"
    ):
        resume_position(state, 5, tmp_path)


def _stepped_adamw():
    """A small model and its AdamW (two groups, as weight decay splits them) after one step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    decayed = [model[0].weight, model[2].weight]
    others = [model[0].bias, model[1].weight, model[1].bias, model[2].bias]
    optimizer = torch.optim.AdamW([{"params": decayed}, {"params": others, "weight_decay": 0.0}], lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_an_optimizer_state_keyed_by_parameter_name_loads_in_one_process_and_back():
    """Round twenty-one: FSDP2's checkpoints hold the AdamW state keyed by parameter name (what
    ``full_state_dicts`` gathers), one process's by position; each is rekeyed for the other, every moment on
    its own parameter."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    model, optimizer = _stepped_adamw()
    named = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    assert "0.weight" in named["state"]  # keyed by name, as a sharded run writes it
    groups = [
        [model[0].weight, model[2].weight],
        [model[0].bias, model[1].weight, model[1].bias, model[2].bias],
    ]
    fresh = torch.optim.AdamW([{"params": groups[0]}, {"params": groups[1], "weight_decay": 0.0}], lr=0.1)
    fresh.load_state_dict(optimizer_state_by_index(model, fresh, named))
    for param in model.parameters():  # the same values copied: exact
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(fresh.state[param][key], optimizer.state[param][key], rtol=0, atol=0)
    assert [group["weight_decay"] for group in fresh.param_groups] == [0.01, 0.0]
    by_name = optimizer_state_by_name(model, optimizer, optimizer.state_dict())
    assert by_name["param_groups"][1]["params"] == named["param_groups"][1]["params"]
    assert set(by_name["state"]) == set(named["state"])
    # already keyed as wanted: unchanged
    assert optimizer_state_by_name(model, optimizer, named) is named
    # a state of other parameters: one line, never a moment on another parameter
    other = {**named, "param_groups": [named["param_groups"][1], named["param_groups"][0]]}
    with pytest.raises(ValueError, match="other parameters") as refused:
        optimizer_state_by_index(model, fresh, other)
    assert "\n" not in str(refused.value)


def test_launch_mode_detects_torchrun_spawn_and_single():
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert launch_mode(1, torchrun) == "torchrun" and launch_mode(4, torchrun) == "torchrun"
    assert launch_mode(2, {}) == "spawn" and launch_mode(1, {}) == "single"
    assert rank_from_env(torchrun) == RankInfo(1, 2, 1) and rank_from_env({}) is None


def test_a_lost_peer_is_told_by_the_backends_words_in_its_runtime_error():
    """gloo's and NCCL's words for a collective whose peer process is gone, in the RuntimeError they raise;
    a pipe of this process's own closed (``BrokenPipeError``) or another error's text is not a lost peer."""
    from torch.distributed import DistBackendError

    from fastlm.engine.distributed.parallel import lost_peer

    gloo = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:35216: Connection reset by peer. GLHF!"
    assert lost_peer(RuntimeError(gloo)) == "Connection reset by peer"
    assert (
        lost_peer(RuntimeError("[pair.cc:553] Connection closed by peer [::1]:6797"))
        == "Connection closed by peer"
    )
    assert lost_peer(DistBackendError("NCCL error: remote process exited or there was a network error"))
    assert lost_peer(BrokenPipeError(32, "Broken pipe")) is None
    assert lost_peer(RuntimeError("Timed out waiting 600000ms for recv operation to complete")) is None


def test_nccl_asked_for_a_cpu_run_is_one_line_naming_the_parameter_and_the_fix():
    """Was: each worker failed in torch's process group set-up, `training worker rank 0 of 2 failed:
    RuntimeError: Distributed package doesn't have NCCL built in` (a CUDA build: `ProcessGroupNCCL is only
    supported with GPUs, no GPUs found!`), naming neither the parameter nor the fix."""
    with pytest.raises(ConfigError) as refused:
        resolve_backend("nccl", torch.device("cpu"))
    message = str(refused.value)
    assert "train.distributed.backend" in message and "gloo" in message and "\n" not in message
    assert (
        resolve_backend("auto", torch.device("cpu")) == resolve_backend("gloo", torch.device("cpu")) == "gloo"
    )


def test_more_nccl_processes_than_gpus_is_one_line_naming_the_parameter(monkeypatch):
    """One GPU a process: 4 processes on a machine of 2 GPUs put two ranks on each, which NCCL refuses at
    its first collective (`Duplicate GPU detected : rank 2 and rank 0 both on CUDA device ...`), naming
    neither the parameter nor the fix; a fixed `cuda:1` put every rank on that GPU. gloo may share a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert rank_device("auto", RankInfo(1, 2, 1), local_world=2, backend="auto") == "cuda:1"
    assert rank_device("cuda", RankInfo(3, 4, 3), local_world=4, backend="gloo") == "cuda:1"
    with pytest.raises(ConfigError) as refused:
        rank_device("auto", RankInfo(3, 4, 3), local_world=4, backend="auto")
    message = str(refused.value)
    assert (
        "train.distributed.nproc_per_node" in message and "2 CUDA device" in message and "\n" not in message
    )
    with pytest.raises(ConfigError, match=r"train\.runtime\.device is cuda:1.*2 processes"):
        rank_device("cuda:1", RankInfo(0, 2, 0), local_world=2, backend="nccl")
    assert rank_device("cuda:1", RankInfo(0, 2, 0), local_world=1, backend="nccl") == "cuda:1"  # 2 nodes


# ------------------------------------------------------------------------------------------ real processes


@pytest.fixture(scope="module")
def tokenized(bpe_tokenizer, sample_texts):
    return tokenized_splits(bpe_tokenizer, sample_texts)


@pytest.fixture(scope="module")
def one_process_folder(tmp_path_factory):
    """Where ``one_process`` runs: its checkpoints in checkpoints-1/, which the tests only read."""
    return tmp_path_factory.mktemp("one_process")


@pytest.fixture(scope="module")
def one_process(one_process_folder, bpe_tokenizer, tokenized):
    """The one-process run (2 micro-batches accumulated) the two-process runs are compared with: run once for
    the module, its result only read."""
    folder = one_process_folder
    return run_job(
        TrainJob(job_params(folder, accum=2, nproc=1), 48, *tokenized, bpe_tokenizer, str(folder / "m"))
    )


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, bpe_tokenizer, tokenized):
    """The two-process DDP run with the same effective batch, launched once for the module: its result and
    its folder (checkpoints-2/), which the tests only read."""
    folder = tmp_path_factory.mktemp("two_processes")
    return launch(job_params(folder, accum=1, nproc=2), bpe_tokenizer, tokenized, folder), folder


@pytest.mark.kernels  # two processes vs one: compared with a tolerance
def test_two_workers_match_one_process_with_the_same_effective_batch(one_process, two_processes):
    one, (two, folder) = one_process, two_processes

    assert (
        two.summary["world_size"] == 2
        and two.summary["effective_batch"] == one.summary["effective_batch"] == 4
    )
    # two processes averaging gradients by all-reduce vs one accumulating them: reordered sums, trained on
    np.testing.assert_allclose(
        [r["loss"] for r in two.history], [r["loss"] for r in one.history], rtol=TRAINED_FP32_LOSS_REL
    )
    np.testing.assert_allclose(
        [r["val_loss"] for r in two.eval_history],
        [r["val_loss"] for r in one.eval_history],
        rtol=TRAINED_FP32_LOSS_REL,
    )
    assert [r["real_tokens_per_s"] > 0 for r in two.history] and two.summary["tokens_seen"] == one.summary[
        "tokens_seen"
    ]
    for (name, mine), theirs in zip(one.model.named_parameters(), two.model.parameters(), strict=True):
        torch.testing.assert_close(theirs, mine.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name)
    written = sorted(p.name for p in (folder / "checkpoints-2").iterdir())
    assert written == ["checkpoint-00000002", "checkpoint-00000004"]  # one writer, no stray temporaries
    assert not list(folder.glob(".launch-*"))  # the weights hand-over file is gone


@pytest.mark.kernels  # two processes vs one: compared with a tolerance
def test_a_two_process_checkpoint_resumes_in_one_process_with_the_same_effective_batch(
    tmp_path, bpe_tokenizer, tokenized, one_process, two_processes
):
    import shutil

    one, (_, folder) = one_process, two_processes
    # the two-process run's step-2 checkpoint alone, in a folder of this test's
    checkpoint = tmp_path / "checkpoints-2" / "checkpoint-00000002"
    shutil.copytree(folder / "checkpoints-2" / "checkpoint-00000002", checkpoint)
    resumed_params = job_params(tmp_path, accum=2, nproc=1, resume=str(checkpoint))
    resumed = run_job(TrainJob(resumed_params, 48, *tokenized, bpe_tokenizer, str(tmp_path / "m")))
    # half of it trained by two processes
    np.testing.assert_allclose(
        [r["loss"] for r in resumed.history[-2:]],
        [r["loss"] for r in one.history[-2:]],
        rtol=TRAINED_FP32_LOSS_REL,
    )
    # a whole epoch asked of it: 158 micro-batches, which two processes and one train alike (79 steps), so the
    # step plans agree and the checkpoint continues to the epoch's end
    epoch_params = job_params(
        tmp_path / "epoch",
        accum=2,
        nproc=1,
        max_steps=None,
        epochs=1,
        eval_every=None,
        resume=str(checkpoint),
    )
    epoch = run_job(TrainJob(epoch_params, 48, *tokenized, bpe_tokenizer, str(tmp_path / "e")))
    assert epoch.summary["resumed_from_step"] == 2 and epoch.summary["steps"] == 79
    assert epoch.history[-1]["epoch"] == 1.0 and epoch.summary["epochs"] == 1.0


def test_a_two_process_run_drawing_random_numbers_resumes_bitwise_on_every_rank(
    tmp_path, bpe_tokenizer, tokenized
):
    """Round thirty-two: each rank draws its own numbers (NEFTune's noise over micro-batches of its own
    lengths: dropout alike), so the ranks' generators part after the first step. ``rng.pt`` held rank 0's
    states only, which every rank restored: rank 1 drew rank 0's numbers after a resume, and the resumed run
    trained other steps than the uninterrupted one. Each rank's states are saved and restored: the same
    computation twice, bitwise."""
    import shutil

    drawing = {
        "runtime": {"num_threads": 1, "deterministic": True},
        "model": {**job_params(tmp_path, accum=1, nproc=2).model.model_dump(), "neftune_noise_alpha": 5.0},
        "batching": {"mode": "dynamic", "micro_batch_size": 2, "gradient_accumulation_steps": 1},
        "eval_every": None,
    }
    straight = launch(
        job_params(tmp_path / "a", accum=1, nproc=2, **drawing), bpe_tokenizer, tokenized, tmp_path / "a"
    )
    checkpoint = tmp_path / "b" / "checkpoints-2" / "checkpoint-00000002"
    shutil.copytree(tmp_path / "a" / "checkpoints-2" / "checkpoint-00000002", checkpoint)
    resumed = launch(
        job_params(tmp_path / "b", accum=1, nproc=2, resume=str(checkpoint), **drawing),
        bpe_tokenizer,
        tokenized,
        tmp_path / "b",
    )
    assert resumed.summary["resumed_from_step"] == 2
    assert [r["loss"] for r in resumed.history[-2:]] == [r["loss"] for r in straight.history[-2:]]
    for (name, mine), theirs in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(theirs, mine), name


def test_a_two_process_checkpoint_on_another_step_plan_than_one_process_is_not_continued(
    tmp_path, bpe_tokenizer, tokenized, caplog
):
    """Round eight: 79 packed micro-batches an epoch; two processes train 78 of them (39 steps, the last one
    left out of the even split), one process all 79 (40 steps). A two-process checkpoint continued in one
    process put its data position on the other plan: an explicit folder is refused in one line, ``auto``
    starts fresh saying why in one line (and trains the one-process epoch to its end)."""
    import logging

    from fastlm.engine.checkpoint.layout import CheckpointError

    batching = {"mode": "packed", "micro_batch_size": 4}
    params = job_params(
        tmp_path,
        accum=1,
        nproc=2,
        max_steps=2,
        eval_every=None,
        batching={**batching, "gradient_accumulation_steps": 1},
    )
    two = launch(params, bpe_tokenizer, tokenized, tmp_path)
    # what a step holds: the samples the ranks' samplers train of the epoch (78 micro-batches, 39 steps), not
    # the whole split's 79 over the steps
    lengths = np.array([len(ids) for ids in tokenized[0]["input_ids"]])
    trained = []
    for rank in range(2):
        sampler = make_batching(
            params, lengths, pad_id=bpe_tokenizer.eos_token_id, max_length=48, seed=params.seed
        )[0]
        sampler.shard(rank, 2)
        trained += [index for batch in sampler for index in batch]
    assert len(trained) == len(set(trained)) < len(lengths)
    steps = 39
    assert two.summary["samples_per_step"] == round(len(trained) / steps, 1)
    assert two.summary["tokens_per_step"] == round(int(lengths[trained].sum()) / steps, 1)
    assert two.summary["train_tokens"] == int(lengths[trained].sum())
    folder = tmp_path / "checkpoints-2"
    one = {
        "max_steps": None,
        "epochs": 1,
        "eval_every": None,
        "batching": {**batching, "gradient_accumulation_steps": 2},
    }
    with pytest.raises(CheckpointError) as refused:
        run_one(
            job_params(tmp_path, accum=2, nproc=1, resume=str(folder / "checkpoint-00000002"), **one),
            bpe_tokenizer,
            tokenized,
            tmp_path,
        )
    message = str(refused.value)
    assert "\n" not in message and "2 processes" in message and "epoch 0" in message
    caplog.set_level(logging.INFO, logger="fastlm")
    fresh = run_one(
        job_params(tmp_path, accum=2, nproc=1, resume="auto", checkpoint_dir=str(folder), **one),
        bpe_tokenizer,
        tokenized,
        tmp_path,
    )
    (line,) = [r.getMessage() for r in caplog.records if "starting fresh" in r.getMessage()]
    assert "checkpoint-00000002" in line and "2 processes" in line and "\n" not in line
    assert fresh.summary["resumed_from"] is None and fresh.summary["steps"] == 40
    assert fresh.history[-1]["epoch"] == 1.0


@pytest.mark.kernels  # two processes vs one: compared with a tolerance
def test_fsdp2_trains_like_one_process_and_writes_whole_checkpoints(
    tmp_path, bpe_tokenizer, tokenized, one_process
):
    one = one_process
    params = job_params(tmp_path, accum=1, nproc=2, distributed={"nproc_per_node": 2, "strategy": "fsdp"})
    two = launch(params, bpe_tokenizer, tokenized, tmp_path)
    # sharded all-gather/reduce-scatter vs one process
    np.testing.assert_allclose(
        [r["loss"] for r in two.history], [r["loss"] for r in one.history], rtol=TRAINED_FP32_LOSS_REL
    )
    # the validation split's 19 batches, its last one too: each rank runs 10 collective forwards, rank 1's
    # last one not counted (was: the even shards left the last batch out, 1540 of its 1587 targets)
    assert [r["val_target_tokens"] for r in two.eval_history] == [
        r["val_target_tokens"] for r in one.eval_history
    ]
    np.testing.assert_allclose(
        [r["val_loss"] for r in two.eval_history],
        [r["val_loss"] for r in one.eval_history],
        rtol=TRAINED_FP32_LOSS_REL,
    )
    # MFU's model FLOPs per token: FSDP2 parameters already count the whole model (DTensor numel is global)
    assert two.summary["flops_per_token"] == one.summary["flops_per_token"] > 0
    # a plain model came back
    assert two.summary["distributed_strategy"] == "fsdp" and not any(
        hasattr(p, "full_tensor") for p in two.model.parameters()
    )
    import safetensors.torch

    saved = safetensors.torch.load_file(
        str(tmp_path / "checkpoints-2" / "checkpoint-00000004" / "model.safetensors")
    )
    for name, param in one.model.named_parameters():
        torch.testing.assert_close(saved[name], param.detach().cpu(), **TRAINED_FP32_WEIGHTS)
    # Round twenty-one: its step-2 checkpoint (whole weights and AdamW moments, keyed by parameter name) was
    # refused in one process; it continues there as the uninterrupted run does. Its first two steps are the
    # sharded run's (reordered sums, as above), the last two one process's: the same tolerance.
    resumed = run_one(
        job_params(tmp_path, accum=2, nproc=1, resume=str(tmp_path / "checkpoints-2/checkpoint-00000002")),
        bpe_tokenizer,
        tokenized,
        tmp_path,
    )
    assert resumed.summary["resumed_from_step"] == 2
    np.testing.assert_allclose(
        [r["loss"] for r in resumed.history[-2:]],
        [r["loss"] for r in one.history[-2:]],
        rtol=TRAINED_FP32_LOSS_REL,
    )
    for (name, mine), theirs in zip(one.model.named_parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(
            theirs.detach().cpu(), mine.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name
        )


@pytest.mark.kernels  # one process, then two sharded ones, vs one process throughout: a tolerance
def test_a_one_process_checkpoint_continues_in_two_fsdp2_processes_like_one_process(
    tmp_path, bpe_tokenizer, tokenized, one_process, one_process_folder
):
    """Round twenty-one: a one-process (or DDP) checkpoint holds the AdamW moments keyed by position, which
    FSDP2's loader reads by parameter name; it was refused ("distributed.strategy ... differs"). It continues
    in two FSDP2 processes with the same effective batch, each moment on its own parameter."""
    import shutil

    checkpoint = tmp_path / "checkpoints-2" / "checkpoint-00000002"
    shutil.copytree(one_process_folder / "checkpoints-1" / "checkpoint-00000002", checkpoint)
    distributed = {"nproc_per_node": 2, "strategy": "fsdp"}
    two = launch(
        job_params(tmp_path, accum=1, nproc=2, resume=str(checkpoint), distributed=distributed),
        bpe_tokenizer,
        tokenized,
        tmp_path,
    )
    assert two.summary["resumed_from_step"] == 2 and two.summary["distributed_strategy"] == "fsdp"
    # the last two steps sharded (reduce-scattered sums) vs accumulated in one process
    np.testing.assert_allclose(
        [r["loss"] for r in two.history[-2:]],
        [r["loss"] for r in one_process.history[-2:]],
        rtol=TRAINED_FP32_LOSS_REL,
    )
    for (name, mine), theirs in zip(
        one_process.model.named_parameters(), two.model.parameters(), strict=True
    ):
        torch.testing.assert_close(theirs, mine.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name)


@pytest.mark.kernels  # two sharded processes with the fused head vs one with the plain head: a tolerance
def test_fsdp2_runs_the_fused_head_and_trains_like_one_process_with_the_plain_head(
    tmp_path, bpe_tokenizer, tokenized, one_process
):
    """The fused LM head + loss reads the head's weight after the model's forward. FSDP2 leaves the root
    group's parameters (embedding, final norm, head) unsharded from the root's forward to its post-backward,
    where the head's gradient is reduce-scattered with the rest: the fused loss runs sharded too. So does
    the validation's: the root does not reshard after an evaluation forward either, so its loss runs through
    the fused head, no ``[tokens x vocab]`` logits, with the plain head's validation loss."""
    one = one_process  # plain head (a vocabulary far below auto's threshold)
    params = job_params(
        tmp_path,
        accum=1,
        nproc=2,
        distributed={"nproc_per_node": 2, "strategy": "fsdp"},
        loss={"fused_linear": True},
    )
    through = tmp_path / "fused_validation_batches"
    two = launch(
        params,
        bpe_tokenizer,
        tokenized,
        tmp_path,
        callback_factory=functools.partial(FusedValidation, through),
    )
    assert two.summary["fused_linear"] is True, two.summary["fused_linear_choice"]
    assert one.summary["fused_linear"] is False
    np.testing.assert_allclose(
        [r["loss"] for r in two.history], [r["loss"] for r in one.history], rtol=TRAINED_FP32_LOSS_REL
    )
    # rank 0's validation batches went through the fused head, its whole weight (every token's row)
    assert through.exists() and set(through.read_text().split()) == {f"weight:{two.model.config.vocab_size}"}
    assert [r["step"] for r in two.eval_history] == [r["step"] for r in one.eval_history]
    np.testing.assert_allclose(
        [r["val_loss"] for r in two.eval_history],
        [r["val_loss"] for r in one.eval_history],
        rtol=TRAINED_FP32_LOSS_REL,
    )
    # Two loss kernels give gradients equal to their last bits, but AdamW's lr * m / (sqrt(v) + eps) turns a
    # gradient within a few eps of zero into a step of up to lr on one side and not the other: every weight
    # within lr per step of the other run's, and at most 0.1 % of them outside the fp32 tolerance (a head
    # gradient left unreduced across the ranks would move most of the head's weights apart).
    trained = dict(two.model.named_parameters())
    lr, steps = params.optimizer.lr, len(two.history)
    apart = total = 0
    for name, param in one.model.named_parameters():
        want = param.detach().cpu()
        torch.testing.assert_close(
            trained[name], want, rtol=0, atol=lr * steps, msg=lambda m, n=name: f"{n}: {m}"
        )
        apart += int((~torch.isclose(trained[name], want, **TRAINED_FP32_WEIGHTS)).sum())
        total += want.numel()
    assert apart <= total // 1000, f"{apart} of {total} weights outside {TRAINED_FP32_WEIGHTS}"


class FusedValidation:
    """Rank 0's loop callback (``launch``'s picklable ``callback_factory``) that records, in ``path``, for
    each validation batch whose loss runs through the fused head in that worker process
    (``evaluation.fused_linear_cross_entropy_sum``), whether the kernel read a plain weight or a shard
    (DTensor), and its rows."""

    def __init__(self, path) -> None:
        from fastlm.engine.evaluate import evaluation

        kernel_sum = evaluation.fused_linear_cross_entropy_sum

        def recorded(kernel, hidden, weight, targets, bias=None, **options):
            kind = "shard" if type(weight).__name__ == "DTensor" else "weight"
            with open(path, "a") as file:
                file.write(f"{kind}:{weight.shape[0]}\n")
            return kernel_sum(kernel, hidden, weight, targets, bias, **options)

        evaluation.fused_linear_cross_entropy_sum = recorded

    def __call__(self, kind: str, record: dict) -> None:
        pass


BF16_WEIGHTS = {"precision": "bf16", "param_dtype": "bf16", "num_threads": 1}


@pytest.fixture(scope="module")
def one_process_bf16_weights(tmp_path_factory, bpe_tokenizer, tokenized):
    """One process with bf16 weights and fp32 masters, 2 micro-batches accumulated: the run the two-process
    bf16-weight runs are compared with (read only)."""
    folder = tmp_path_factory.mktemp("one_bf16")
    params = job_params(folder, accum=2, nproc=1, runtime=BF16_WEIGHTS)
    one = run_job(TrainJob(params, 48, *tokenized, bpe_tokenizer, str(folder / "m")))
    assert "fp32 masters" in one.summary["param_dtype"]
    return one


def _trains_like_one_process_with_masters_and_saves_fp32(one, two, folder, lr: float) -> None:
    """Two bf16-weight processes against one with fp32 masters (the same effective batch): losses within the
    bf16 tolerance; the weights as in ``test_fsdp2_runs_the_fused_head...`` (each micro-batch is the same
    bf16 computation on both sides, the sums are fp32 in another order: every weight within lr per step of
    the other run's, at most 0.1 % outside the fp32 tolerance; a step whose gradients were not reduced would
    move most weights apart, here after the first checkpoint); checkpoints and the returned model hold fp32
    weights, not bf16 values."""
    np.testing.assert_allclose(
        [r["loss"] for r in two.history], [r["loss"] for r in one.history], rtol=BF16_MODEL_LOSS_REL
    )
    trained, steps = dict(two.model.named_parameters()), len(two.history)
    apart = total = 0
    for name, param in one.model.named_parameters():
        want = param.detach().cpu()
        torch.testing.assert_close(trained[name], want, rtol=0, atol=lr * steps, msg=name)
        apart += int((~torch.isclose(trained[name], want, **TRAINED_FP32_WEIGHTS)).sum())
        total += want.numel()
    assert apart <= total // 1000, f"{apart} of {total} weights outside {TRAINED_FP32_WEIGHTS}"
    assert {p.dtype for p in two.model.parameters()} == {torch.float32}
    import safetensors.torch

    saved = safetensors.torch.load_file(
        str(folder / "checkpoints-2" / "checkpoint-00000004" / "model.safetensors")
    )
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in saved.values())  # not bf16 values


@pytest.mark.kernels  # two sharded bf16 processes vs one with bf16 weights and fp32 masters: a bf16 tolerance
def test_fsdp2_bf16_weights_gather_bf16_reduce_fp32_and_train_like_one_process_with_masters(
    tmp_path, bpe_tokenizer, tokenized, one_process_bf16_weights
):
    """``train.runtime.param_dtype: bf16`` under FSDP2 is its ``MixedPrecisionPolicy``: the layers compute on
    bf16 weights gathered from fp32 shards (the optimizer's masters), gradients reduced in fp32."""
    params = job_params(
        tmp_path,
        accum=1,
        nproc=2,
        distributed={"nproc_per_node": 2, "strategy": "fsdp"},
        runtime=BF16_WEIGHTS,
    )
    two = launch(params, bpe_tokenizer, tokenized, tmp_path)
    assert "FSDP2 gathers the weights in bfloat16" in two.summary["param_dtype"], two.summary["param_dtype"]
    _trains_like_one_process_with_masters_and_saves_fp32(
        one_process_bf16_weights, two, tmp_path, params.optimizer.lr
    )


@pytest.mark.kernels  # two DDP bf16 processes vs one with bf16 weights and fp32 masters: a bf16 tolerance
def test_ddp_bf16_weights_reduce_in_fp32_into_masters_and_train_like_one_process(
    tmp_path, bpe_tokenizer, tokenized, one_process_bf16_weights
):
    """``train.runtime.param_dtype: bf16`` under DDP (the default strategy): each process runs bf16 weights,
    DDP's buckets hold bf16 gradients, and its reduction adds them into fp32 masters, all-reduced in fp32
    (``MasterWeights.reduce_under``; tests/engine/train/test_master_weights.py checks the figures)."""
    params = job_params(tmp_path, accum=1, nproc=2, runtime=BF16_WEIGHTS)
    two = launch(params, bpe_tokenizer, tokenized, tmp_path)
    assert two.summary["distributed_strategy"] == "ddp"
    assert "under DDP" in two.summary["param_dtype"] and "fp32" in two.summary["param_dtype"]
    _trains_like_one_process_with_masters_and_saves_fp32(
        one_process_bf16_weights, two, tmp_path, params.optimizer.lr
    )


EARLY = {
    "max_steps": 16,
    "eval_every": 2,
    "save_every": 2,
    "keep_last": 1,
    "optimizer": {"lr": 0.8, "warmup_steps": 0, "decay": "constant"},  # too high: it gets worse
    "early_stopping": {"patience": 2},
}


def test_fsdp2_stops_early_and_returns_the_best_steps_weights_like_one_process(  # decisions: no tolerance
    tmp_path, bpe_tokenizer, tokenized
):
    """Early stopping under FSDP2: the best step's whole weights loaded back into the shards (DDP's ranks
    load them as one process does)."""
    one = run_one(
        job_params(tmp_path / "one", accum=2, nproc=1, **EARLY), bpe_tokenizer, tokenized, tmp_path / "one"
    )
    params = job_params(
        tmp_path / "two", accum=1, nproc=2, distributed={"nproc_per_node": 2, "strategy": "fsdp"}, **EARLY
    )
    two = launch(params, bpe_tokenizer, tokenized, tmp_path / "two")
    early, its = two.summary["early_stopping"], one.summary["early_stopping"]
    assert one.summary["stopped_by"] == two.summary["stopped_by"] == "early stopping"
    assert two.summary["steps"] == one.summary["steps"] < EARLY["max_steps"]
    # the same decisions (at this learning rate the reductions' different rounding grows step by step, so
    # the values are the two-process run's own: its evaluation at the best step)
    assert early["best_step"] == its["best_step"] == early["model_from_step"] < two.summary["steps"]
    losses = {record["step"]: record["val_loss"] for record in two.eval_history}
    assert early["best_val_loss"] == losses[early["best_step"]] == min(losses.values())
    import safetensors.torch

    best = tmp_path / "two" / "checkpoints-2" / f"checkpoint-{early['best_step']:08d}"
    assert early["best_checkpoint"] == str(best)
    saved = safetensors.torch.load_file(str(best / "model.safetensors"))
    # the model returned is the best step's, not the last one's: the checkpoint's tensors copied back
    returned = dict(two.model.named_parameters(remove_duplicate=False))  # a tied head is saved once
    last = tmp_path / "two" / "checkpoints-2" / f"checkpoint-{two.summary['steps']:08d}"
    later = safetensors.torch.load_file(str(last / "model.safetensors"))
    for name, tensor in saved.items():
        assert torch.equal(returned[name].detach().cpu(), tensor), name
    assert not all(torch.equal(saved[name], later[name]) for name in saved)
    # asked again (resume: auto), the two processes agree that the run is finished: nothing trained, the
    # best step's weights returned again
    again = launch(
        job_params(
            tmp_path / "two",
            accum=1,
            nproc=2,
            distributed={"nproc_per_node": 2, "strategy": "fsdp"},
            **{**EARLY, "resume": "auto"},
        ),
        bpe_tokenizer,
        tokenized,
        tmp_path / "two",
    )
    assert again.summary["steps_trained"] == 0 and again.summary["steps"] == two.summary["steps"]
    assert again.summary["stopped_by"] == "early stopping"
    assert again.summary["early_stopping"]["best_step"] == early["best_step"]
    returned = dict(again.model.named_parameters(remove_duplicate=False))
    for name, tensor in saved.items():
        assert torch.equal(returned[name].detach().cpu(), tensor), name


@pytest.mark.kernels  # float8 matmuls in two FSDP2 processes vs in one: compared with a tolerance
def test_fsdp2_trains_float8_layers_converted_before_sharding_as_one_process_does(
    tmp_path, bpe_tokenizer, tokenized
):
    """float8 on (the configuration asks for a float8 GPU; on a CPU, torch's _scaled_mm runs torchao's float8
    layers all the same: the same casts and scales, another matmul kernel) in two FSDP2 processes against
    one process with the same micro-batches: each micro-batch's own dynamic scales on both sides, FSDP2's
    gathered weights the one process's values, its reduce-scatter the sum the accumulation makes. The one
    process is a worker of its own too: torch's CPU float8 matmul (oneDNN) fails to find a kernel under a
    capped instruction set once this test process has run bf16 autocast matmuls."""
    pytest.importorskip("torchao")

    def float8_on(params):  # past the configuration's refusal on a CPU, as the GPU run would be set
        runtime = params.runtime.model_copy(update={"float8": "on", "precision": "fp32"})
        return params.model_copy(update={"runtime": runtime})

    quick = {"max_steps": 3, "eval_every": None, "save_every": None}  # float8 on a CPU: slow per op
    alone = float8_on(job_params(tmp_path / "one", accum=2, nproc=1, **quick))
    one = launch(alone, bpe_tokenizer, tokenized, tmp_path / "one")
    sharded = job_params(
        tmp_path / "two", accum=1, nproc=2, distributed={"nproc_per_node": 2, "strategy": "fsdp"}, **quick
    )
    fsdp = launch(float8_on(sharded), bpe_tokenizer, tokenized, tmp_path / "two")
    # the 7 projections of each of the 2 layers (in and out features multiples of 16), not the head
    for run in (one, fsdp):
        assert run.summary["runtime"]["float8_choice"].endswith("14 Linear layers in float8"), run.summary
    np.testing.assert_allclose(
        [r["loss"] for r in fsdp.history], [r["loss"] for r in one.history], rtol=TRAINED_FP32_LOSS_REL
    )
    # the model comes back with plain Linear layers and plain weight names
    assert not any("float8" in type(module).__name__.lower() for module in fsdp.model.modules())
    for (name, mine), theirs in zip(one.model.named_parameters(), fsdp.model.parameters(), strict=True):
        assert theirs.dtype == torch.float32 and theirs.shape == mine.shape, name


@pytest.mark.kernels  # two processes updating in the backward vs one after it: a tolerance
def test_fsdp2_updates_each_shard_in_the_backward_as_one_process_steps_after_it(
    tmp_path, bpe_tokenizer, tokenized
):
    """``train.optimizer.in_backward`` under FSDP2, wired through the run (the updates themselves:
    tests/engine/train/test_master_weights.py): two processes of two micro-batches each, the first not
    synchronizing, against one process stepping after the backward with the same effective batch."""
    settings = {"warmup_steps": 1, "grad_clip": None}
    one, two = one_and_two(
        tmp_path,
        bpe_tokenizer,
        tokenized,
        accum=4,
        optimizer=settings,
        two={"optimizer": {**settings, "in_backward": True}},
    )
    assert "each shard updated in the backward" in two.summary["param_dtype"], two.summary["param_dtype"]
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(
            [r[key] for r in two.history], [r[key] for r in one.history], rtol=TRAINED_FP32_LOSS_REL
        )
    for (name, mine), theirs in zip(one.model.named_parameters(), two.model.parameters(), strict=True):
        torch.testing.assert_close(theirs, mine.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name)


@pytest.mark.kernels  # two QLoRA processes vs one: compared with a tolerance
def test_fsdp2_trains_qlora_adapters_like_one_process_checkpoints_them_alone_and_resumes(
    tmp_path, bpe_tokenizer, tokenized
):
    """LoRA in two processes (here over a 4-bit base, bitsandbytes' CPU backend): the adapters train as in
    one process; checkpoints hold the adapters alone, as one process's do (under FSDP2 the frozen base is
    not gathered from every rank at each save); the model comes back as one process's (the base read again,
    the adapters handed back into it: a 4-bit base's quantization state is no weight to hand back); a run
    resumes from such a checkpoint."""
    from tests.support.tiny_llama import save_tiny_llama

    base = save_tiny_llama(tmp_path / "base", bpe_tokenizer)
    adapters = {"name_or_path": str(base), "lora": {"enabled": True, "r": 4, "load_in_4bit": True}}
    one, two = one_and_two(tmp_path, bpe_tokenizer, tokenized, accum=2, model=adapters)
    sharded = {"nproc_per_node": 2, "strategy": "fsdp"}
    losses = [r["loss"] for r in one.history]
    np.testing.assert_allclose([r["loss"] for r in two.history], losses, rtol=TRAINED_FP32_LOSS_REL)
    trained = {name: p for name, p in one.model.named_parameters() if "lora_" in name}
    returned = dict(two.model.named_parameters())
    assert trained and type(two.model) is type(one.model)
    for name, param in trained.items():
        torch.testing.assert_close(returned[name], param.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name)
    import safetensors.torch

    folder = tmp_path / "two" / "checkpoints-2"
    saved = safetensors.torch.load_file(str(folder / "checkpoint-00000002" / "model.safetensors"))
    assert sorted(saved) == sorted(
        name for name, param in one.model.named_parameters() if param.requires_grad
    )
    resumed = launch(
        job_params(
            tmp_path / "two",
            accum=1,
            nproc=2,
            distributed=sharded,
            model=adapters,
            resume=str(folder / "checkpoint-00000002"),
            checkpoint_dir=str(tmp_path / "resumed"),
        ),
        bpe_tokenizer,
        tokenized,
        tmp_path / "resumed",
    )
    assert resumed.summary["resumed_from_step"] == 2
    np.testing.assert_allclose(
        [r["loss"] for r in resumed.history[-2:]], losses[-2:], rtol=TRAINED_FP32_LOSS_REL
    )


@pytest.mark.kernels  # two LoRA processes vs one: compared with a tolerance
def test_fsdp2_trains_lora_on_a_base_with_tied_embeddings_and_checkpoints_the_adapters_alone(
    tmp_path, bpe_tokenizer, tokenized
):
    """A base whose head shares the input embedding (Llama-3.2-1B/3B, Qwen3-4B): the frozen tied head is
    no trained weight, in the checkpoints or in the weights handed back to the launcher (it was gathered
    with the adapters, and the run failed after its last step)."""
    import safetensors.torch

    from tests.support.tiny_llama import save_tiny_llama

    base = save_tiny_llama(tmp_path / "base", bpe_tokenizer, tied=True)
    adapters = {"name_or_path": str(base), "lora": {"enabled": True, "r": 4}}
    one, two = one_and_two(tmp_path, bpe_tokenizer, tokenized, accum=2, model=adapters)
    np.testing.assert_allclose(
        [r["loss"] for r in two.history], [r["loss"] for r in one.history], rtol=TRAINED_FP32_LOSS_REL
    )
    trained = {name: p for name, p in one.model.named_parameters() if p.requires_grad}
    returned = dict(two.model.named_parameters())
    for name, param in trained.items():
        torch.testing.assert_close(returned[name], param.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name)
    folder = tmp_path / "two" / "checkpoints-2" / "checkpoint-00000002"
    assert sorted(safetensors.torch.load_file(str(folder / "model.safetensors"))) == sorted(trained)


@pytest.mark.kernels  # two processes with the fused LoRA head vs one with the plain head: a tolerance
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_lora_adapted_head_fuses_in_two_processes_and_trains_as_one_with_the_plain_head(
    tmp_path, bpe_tokenizer, tokenized, strategy
):
    """LoRA on the LM head, fused (``linear_loss.fused_head_choice``): its A and B are read after the model's
    forward, by the loss. FSDP2's root group (the head's adapters among its parameters) stays unsharded
    until its post-backward, which reduce-scatters their gradients; DDP all-reduces them with the rest. Two
    processes train as one process with the plain head: the same losses and adapters, the head's included."""
    from tests.support.tiny_llama import save_tiny_llama

    base = save_tiny_llama(tmp_path / "base", bpe_tokenizer)
    lora = {"enabled": True, "r": 4, "target_modules": ["q_proj", "v_proj", "lm_head"]}
    adapters = {"name_or_path": str(base), "lora": lora}
    one, two = one_and_two(
        tmp_path,
        bpe_tokenizer,
        tokenized,
        accum=2,
        strategy=strategy,
        model=adapters,
        loss={"fused_linear": False},
        two={"loss": {"fused_linear": True}},
    )
    assert two.summary["fused_linear"] is True and "LoRA" in two.summary["fused_linear_choice"]
    assert one.summary["fused_linear"] is False
    losses = [r["loss"] for r in one.history]
    np.testing.assert_allclose([r["loss"] for r in two.history], losses, rtol=TRAINED_FP32_LOSS_REL)
    trained = {name: p for name, p in one.model.named_parameters() if "lora_" in name}
    assert any("lm_head.lora_B" in name for name in trained)
    returned = dict(two.model.named_parameters())
    for name, param in trained.items():
        torch.testing.assert_close(returned[name], param.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name)


@pytest.mark.kernels  # two DoRA processes vs one: compared with a tolerance
def test_fsdp2_trains_dora_adapters_with_loraplus_as_one_process(tmp_path, bpe_tokenizer, tokenized):
    """DoRA (fastlm's fused forward: the norms from the weights FSDP2 gathers) with LoRA+'s third optimizer
    group, in two FSDP2 processes: the same losses and adapters (magnitudes included) as one process with
    the same effective batch."""
    from tests.support.tiny_llama import save_tiny_llama

    base = save_tiny_llama(tmp_path / "base", bpe_tokenizer)
    lora = {"enabled": True, "r": 4, "use_dora": True, "loraplus_lr_ratio": 4}
    adapters = {"name_or_path": str(base), "lora": lora}
    one, two = one_and_two(tmp_path, bpe_tokenizer, tokenized, accum=2, model=adapters)
    losses = [r["loss"] for r in one.history]
    np.testing.assert_allclose([r["loss"] for r in two.history], losses, rtol=TRAINED_FP32_LOSS_REL)
    trained = {name: p for name, p in one.model.named_parameters() if "lora_" in name}
    assert any("lora_magnitude_vector" in name for name in trained)
    returned = dict(two.model.named_parameters())
    for name, param in trained.items():
        torch.testing.assert_close(returned[name], param.detach().cpu(), **TRAINED_FP32_WEIGHTS, msg=name)
