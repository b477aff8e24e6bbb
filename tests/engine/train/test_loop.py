"""The training loop on a tiny Llama: loss falls in every batching mode, exact resume, NaN stops cleanly."""

import inspect
import itertools
import math
import multiprocessing
from contextlib import ExitStack

import numpy as np
import pytest
import torch

from fastlm.engine.batching import MicroBatches, StreamLayout, micro_batches
from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.checkpoint.loading import load_checkpoint
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.observe.health import NonFiniteLossError
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.build import TrainingParts, TrainRequest, build_training, settle_request
from fastlm.engine.train.loop import train
from fastlm.engine.train.persistence import Checkpointer
from fastlm.engine.train.records import Recorder
from fastlm.engine.train.schedule import LRSchedule
from fastlm.engine.train.state import TrainState
from fastlm.errors import ConfigError
from tests.support.toy_training import (
    EOS,
    VOCAB,
    poisoned_model,
    run_toy,
    toy_model,
    toy_params,
    toy_sequences,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
def test_loss_falls_and_metrics_are_logged(tmp_path, mode):
    seen = []
    result = run_toy(
        toy_params(tmp_path, batching={"mode": mode}), callbacks=[lambda kind, record: seen.append(kind)]
    )
    losses = [record["loss"] for record in result.history]
    assert losses[-1] < losses[0] - 0.3
    assert abs(losses[0] - math.log(VOCAB)) < 1.0  # a fresh model starts near ln(vocab)
    last = result.history[-1]
    for key in (
        "lr",
        "grad_norm",
        "real_tokens_per_s",
        "samples_per_s",
        "step_time_s",
        "data_wait_share",
        "padding_efficiency",
        "peak_memory_mb",
        "eta_s",
    ):
        assert last[key] is not None, key
    if mode == "packed":
        assert last["padding_efficiency"] > 0.9
    assert (
        seen.count("eval") == 2
        and result.eval_history[-1]["val_loss"] < result.eval_history[0]["val_loss"] + 1
    )
    assert result.summary["steps"] == 30
    # every step's real tokens are counted once, in the state and in the logged windows (rate x window time)
    windows = zip([0] + [row["step"] for row in result.history[:-1]], result.history, strict=True)
    logged = sum(
        round(row["real_tokens_per_s"] * row["step_time_s"] * (row["step"] - before))
        for before, row in windows
    )
    assert result.summary["tokens_seen"] == logged > 30 * 4


@pytest.mark.parametrize(
    "random_draws",
    [{}, {"model": {"neftune_noise_alpha": 5.0}}, {"model": {"neftune_noise_alpha": 5.0}, "eval_every": 4}],
    ids=["no_draws", "noise_each_step", "noise_and_evaluations"],
)
def test_interrupted_run_resumes_to_the_same_loss(tmp_path, random_draws):
    """Bitwise, also where every step draws random numbers (NEFTune's noise here; dropout alike): the
    resumed run draws the numbers the uninterrupted one drew, so nothing of its own (the data stream's
    first fetch, an evaluation) may draw from the global generator after the checkpoint's states are back."""
    deterministic = {
        "runtime": {"deterministic": True},
        "log_every": 1,
        "save_every": 4,
        "eval_every": None,
        "max_steps": 12,
        **random_draws,
    }
    straight = run_toy(toy_params(tmp_path / "a", **deterministic))

    def interrupt(kind, record):
        if record["step"] == 6:
            raise KeyboardInterrupt

    interrupted = toy_params(tmp_path / "b", **deterministic)
    with pytest.raises(KeyboardInterrupt):
        run_toy(interrupted, callbacks=[interrupt])
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "checkpoint-00000004"
    resumed = run_toy(toy_params(tmp_path / "b", **deterministic, resume="auto"))
    assert [r["step"] for r in resumed.history][-1] == 12
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]  # bitwise: deterministic mode
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_nan_loss_stops_with_the_last_good_checkpoint_kept(tmp_path):
    params = toy_params(tmp_path, log_every=1, save_every=2, eval_every=None)
    model, poison = poisoned_model(3)
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    with pytest.raises(NonFiniteLossError) as error:
        train(
            model,
            toy_sequences(300, 1),
            None,
            params=params,
            runtime=runtime,
            pad_id=EOS,
            max_length=64,
            attn="sdpa",
            callbacks=[poison],
        )
    message = str(error.value)
    assert (
        "by step 4" in message and "checkpoint-00000002" in message and "lower train.optimizer.lr" in message
    )
    last = latest_checkpoint(tmp_path / "checkpoints")
    assert last.name == "checkpoint-00000002"
    state = load_checkpoint(last, model=toy_model(), restore_rng=False)
    assert state["step"] == 2 and all(math.isfinite(r["loss"]) for r in state["history"])


def test_mask_built_on_the_device_equals_the_collators_own(tmp_path):
    from fastlm.engine.data import PackedCollator, TokenBudget
    from fastlm.engine.model.attention.inputs import VARLEN_ROW_MULTIPLE, to_device

    data = toy_sequences(50, 3)
    samples = data.__getitems__(range(8))
    budget = TokenBudget(row_length=64, rows_per_batch=4)
    reference = PackedCollator(pad_id=EOS, budget=budget, attention_mask_format="bool")(samples)
    shipped = PackedCollator(pad_id=EOS, budget=budget, attention_mask_format="none")(samples)
    assert "attention_mask" not in shipped
    cpu = torch.device("cpu")
    assert torch.equal(
        to_device(shipped, cpu, "sdpa")["model_inputs"]["attention_mask"], reference["attention_mask"]
    )
    additive = to_device(shipped, cpu, "eager")["model_inputs"]["attention_mask"]
    assert torch.equal(additive == 0, reference["attention_mask"])
    varlen = to_device(shipped, cpu, "flash_attention_2")["model_inputs"]
    # the varlen view: the real tokens in one row, the rows' padding tails left out (inputs.without_padding)
    real = int(shipped["num_real_tokens"])
    width = -(-real // VARLEN_ROW_MULTIPLE) * VARLEN_ROW_MULTIPLE
    assert "attention_mask" not in varlen and varlen["input_ids"].shape == (1, width) and width < 4 * 64
    bounds, flat_real = shipped["cu_seq_lens"].tolist(), shipped["real_mask"].reshape(-1)
    lengths = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True) if flat_real[a]])
    assert varlen["cu_seq_lens_q"].tolist()[: len(lengths) + 1] == [0, *lengths.cumsum(0).tolist()]
    assert int(lengths.sum()) == real and len(lengths) == 8


def test_profiling_records_the_requested_window(tmp_path):
    trace_dir = tmp_path / "profile"
    params = toy_params(
        tmp_path,
        max_steps=6,
        eval_every=None,
        profile={"enabled": True, "start_step": 3, "steps": 2, "trace_dir": str(trace_dir)},
    )
    profile = run_toy(params).summary["profile"]
    assert profile["recorded"] and profile["steps"] == "3-4"
    assert (trace_dir / "steps_3-4.pt.trace.json").stat().st_size > 1000
    shares = profile["phase_share"]
    assert set(shares) == {"data", "forward", "backward", "optimizer"}
    # shares of the window's wall clock: the phases lie inside it (at most all of it); how much of an 18 ms
    # window of two toy steps they fill depends on the machine's load (0.94 here alone, 0.28 beside the
    # suite's background jobs on a fresh clone), so no lower bound but that each phase was recorded
    assert shares["forward"] > 0 and shares["backward"] > 0 and shares["optimizer"] > 0
    assert 0 < sum(shares.values()) <= 1.05 and profile["window_ms"] > 0
    assert profile["top_operators"][0]["self_cpu_ms"] >= profile["top_operators"][-1]["self_cpu_ms"] > 0


def test_the_logged_learning_rate_is_the_one_the_step_used(tmp_path, monkeypatch):
    import fastlm.engine.train.step as step_module

    used, make_optimizer = [], step_module.make_optimizer

    def recording_optimizer(*args, **kwargs):
        optimizer = make_optimizer(*args, **kwargs)
        optimizer.register_step_pre_hook(lambda opt, a, k: used.append(opt.param_groups[0]["lr"]))
        return optimizer

    monkeypatch.setattr(step_module, "make_optimizer", recording_optimizer)
    params = toy_params(tmp_path, max_steps=4, log_every=1, eval_every=None, optimizer={"warmup_steps": 3})
    result = run_toy(params)
    assert len(used) == 4 and used[0] < used[1] < used[2]  # warmup: the rate grows step by step
    assert [record["lr"] for record in result.history] == pytest.approx(used)


def test_an_fp16_update_the_grad_scaler_skips_on_a_logging_step_does_not_stop_the_run(tmp_path, caplog):
    """Under fp16 loss scaling an overflowed gradient is what ``GradScaler.step`` skips (the weights and the
    schedule untouched, the scale halved), as it does in an fp16 run's first steps and now and then after the
    scale grew: the step's row keeps its non-finite norm, the run goes on, and the next update uses the rate
    the skipped one would have (the schedule's, computed apart). A NaN loss still stops (see above)."""
    import dataclasses

    params = toy_params(
        tmp_path,
        max_steps=5,
        log_every=1,
        eval_every=None,
        optimizer={"warmup_steps": 4, "decay": "linear"},
        runtime={"precision": "fp32", "compile": False},  # no probe: one backward a step
    )
    runtime = dataclasses.replace(  # the loss scaling of an fp16 run (precision fp16 needs CUDA)
        setup_runtime(params.runtime, seed=params.seed), grad_scaler=True
    )
    model, backwards = toy_model(), []

    def overflow_at_step_3(grad):
        backwards.append(1)
        return grad * math.inf if len(backwards) == 3 else grad

    model.lm_head.weight.register_hook(overflow_at_step_3)
    with caplog.at_level("INFO", logger="fastlm.engine.train.records"):
        result = train(
            model,
            toy_sequences(300, 1),
            None,
            params=params,
            runtime=runtime,
            pad_id=EOS,
            max_length=64,
            attn="sdpa",
        )
    rows = result.history
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(row["loss"]) for row in rows)
    assert math.isinf(rows[2]["grad_norm"]) and all(math.isfinite(rows[i]["grad_norm"]) for i in (0, 1, 3, 4))
    schedule = LRSchedule(params.optimizer.lr, 5, 4, "linear", params.optimizer.min_lr_ratio)
    applied = [0, 1, 2, 2, 3]  # step 3's update skipped: step 4 trains at the rate step 3 was given
    assert [row["lr"] for row in rows] == pytest.approx([schedule.lr_at(k) for k in applied], rel=1e-6)
    assert "step 3: the fp16 grad scaler skipped this update" in caplog.text


@pytest.mark.parametrize(("mode", "accumulation"), [("packed", 3), ("length_grouped", 4)])
def test_an_epoch_trains_each_sample_once_when_the_accumulation_does_not_divide_it(
    tmp_path, monkeypatch, mode, accumulation
):
    """`epochs: 1` with micro-batches per epoch not a multiple of the accumulation: the last step took
    micro-batches of the next epoch (samples trained twice; `epochs: 2` rounded up again), the history's
    epoch past 1. The epoch's last step now takes the micro-batches left, as the Trainer's does; the loss
    stays the mean over that step's targets."""
    steps = _recorded_steps(monkeypatch)  # each step's samples per micro-batch
    params = toy_params(
        tmp_path,
        max_steps=None,
        epochs=2,
        log_every=1,
        eval_every=None,
        batching={"mode": mode, "micro_batch_size": 4, "gradient_accumulation_steps": accumulation},
    )
    result = run_toy(params)
    per_epoch = len(steps) // 2
    epochs = [steps[:per_epoch], steps[per_epoch:]]
    assert len(steps) == 2 * per_epoch and len(steps) == result.summary["steps"]
    for epoch in epochs:
        assert sum(sum(counts) for counts in epoch) == 300  # toy_sequences(300): each sample once
        assert [len(counts) for counts in epoch[:-1]] == [accumulation] * (per_epoch - 1)
        assert 0 < len(epoch[-1]) < accumulation  # the case this test is about: the epoch's rest
    assert result.history[per_epoch - 1]["epoch"] == 1.0 and result.history[-1]["epoch"] == 2.0
    assert result.summary["epochs"] == 2.0


def test_a_packed_run_of_three_epochs_trains_each_sample_once_an_epoch_though_epochs_pack_differently(
    tmp_path, monkeypatch
):
    """Packed epochs are re-packed with each epoch's shuffle, so they hold slightly different micro-batch
    counts (5,000 samples pack in windows: 105 and 106 here). `epochs: 3` planned epoch 0's steps three
    times: one step short of the third epoch's end (its last micro-batch never trained, the history's epoch
    2.99) or one step into a fourth. The plan is now each epoch's own steps, summed."""
    recorded = _recorded_steps(monkeypatch)  # each step's samples per micro-batch
    params = toy_params(
        tmp_path,
        max_steps=None,
        epochs=3,
        log_every=1,
        eval_every=None,
        seed=1,
        batching={"micro_batch_size": 8},
    )
    data = toy_sequences(5000, 1)
    layout = StreamLayout(EOS, 64, None, {"num_workers": 0})
    stream = micro_batches(data, params, layout)
    per_epoch = [stream.sampler.set_epoch(epoch) or len(stream.sampler) for epoch in range(3)]
    assert len(set(per_epoch)) > 1  # the case this test is about
    runtime = setup_runtime(params.runtime, seed=params.seed)
    result = train(
        toy_model(), data, None, params=params, runtime=runtime, pad_id=EOS, max_length=64, attn="sdpa"
    )
    steps = [sum(counts) for counts in recorded]
    assert len(steps) == sum(per_epoch) == result.summary["steps"]
    ends = [sum(per_epoch[: epoch + 1]) for epoch in range(3)]
    assert [result.history[end - 1]["epoch"] for end in ends] == [1.0, 2.0, 3.0]
    assert [sum(steps[start:end]) for start, end in zip([0, *ends], ends, strict=False)] == [5000] * 3
    assert result.summary["epochs"] == 3.0
    # the schedule decays over those steps: the last one at the rate of the schedule's last step
    settings = params.optimizer
    schedule = LRSchedule(
        settings.lr, sum(per_epoch), settings.warmup_steps, settings.decay, settings.min_lr_ratio
    )
    assert result.history[-1]["lr"] == pytest.approx(schedule.lr_at(sum(per_epoch) - 1))


def _recorded_steps(monkeypatch) -> list[list[int]]:
    """Filled as the loop trains: each optimizer step's samples per micro-batch."""
    import fastlm.engine.train.loop as loop_module

    steps, step = [], loop_module.train_step

    def recording_step(model, micro_batches, *args, **kwargs):
        steps.append([_samples_in(batch) for batch in micro_batches])
        return step(model, micro_batches, *args, **kwargs)

    monkeypatch.setattr(loop_module, "train_step", recording_step)
    return steps


def _samples_in(batch: dict) -> int:
    """The samples a host micro-batch holds: packed rows' segment starts, else its rows."""
    if "sequence_ids" in batch:
        starts = batch["position_ids"] == 0
        return int((starts & batch["real_mask"]).sum() if "real_mask" in batch else starts.sum())
    return int(batch["input_ids"].shape[0])


def test_a_run_with_persistent_loader_workers_ends_them_when_it_ends(tmp_path):
    """``train.dataloader.persistent_workers`` keeps the workers across epochs: the run's end still ends
    them (no process of the run left behind, none to hang the exit)."""
    params = toy_params(
        tmp_path,
        max_steps=None,
        epochs=2,
        eval_every=None,
        batching={"mode": "dynamic", "micro_batch_size": 64, "gradient_accumulation_steps": 2},
        dataloader={"num_workers": 2, "persistent_workers": True, "prefetch_factor": 2},
    )
    before = {child.pid for child in multiprocessing.active_children()}
    during = set()  # the run's processes, seen at each logged step of both epochs

    def children(kind, record):
        during.update(child.pid for child in multiprocessing.active_children())

    result = run_toy(params.model_copy(update={"log_every": 1}), callbacks=[children])
    assert result.summary["epochs"] == 2.0 and result.summary["steps"] == 6  # 3 steps an epoch
    assert len(during - before) == 2  # the same 2 workers both epochs
    assert {child.pid for child in multiprocessing.active_children()} == before


def test_train_reads_top_to_bottom_in_at_most_60_lines():
    """The set-up lives in ``build.build_training``; ``train`` keeps only the loop and the finish."""
    assert len(inspect.getsource(train).splitlines()) <= 60


def test_the_build_step_returns_the_parts_and_a_resumed_build_restores_the_step(tmp_path):
    run_toy(toy_params(tmp_path, max_steps=4, save_every=2, eval_every=None))
    params = toy_params(tmp_path, max_steps=6, save_every=2, eval_every=None, resume="auto")
    runtime = setup_runtime(params.runtime, seed=params.seed)
    request = settle_request(
        TrainRequest(
            toy_model(),
            toy_sequences(300, 1),
            None,
            params=params,
            runtime=runtime,
            pad_id=EOS,
            max_length=64,
            attn="sdpa",
        )
    )
    with ExitStack() as cleanup:
        parts = build_training(request, cleanup)
    assert isinstance(parts, TrainingParts) and isinstance(parts.state, TrainState)
    assert isinstance(parts.stream, MicroBatches) and isinstance(parts.checkpointer, Checkpointer)
    assert isinstance(parts.recorder, Recorder) and parts.validate is None and parts.early is None
    assert parts.state.step == 4 and parts.state.resumed_from is not None and parts.total_steps == 6
    assert parts.raw_model is request.model and parts.runtime.precision in ("fp32", "bf16")


@pytest.mark.parametrize(
    ("overrides", "fused", "kernel"),
    [
        ({}, False, None),  # the toy vocabulary is below fused_linear auto's threshold: the plain head
        ({"loss": {"fused_linear": True}, "model": {"gradient_checkpointing": "auto"}}, True, "fastlm"),
    ],
)
def test_the_summary_says_which_levers_a_cpu_run_used(tmp_path, overrides, fused, kernel):
    params = toy_params(tmp_path, max_steps=2, log_every=1, eval_every=None, **overrides)
    summary = run_toy(params).summary
    assert summary["fused_linear"] is fused and summary["fused_linear_kernel"] == kernel
    assert summary["fused_linear_choice"].startswith("fused LM head" if fused else "plain LM head")
    assert summary["liger"].startswith("liger kernels off (auto: this run is not on a CUDA device")
    assert summary["gradient_checkpointing"] == "off"  # auto is off until the tune pipeline chooses one
    assert summary["checkpointed_layers"] == "0 of 2"
    assert summary["optimizer"] == "adamw"


def test_the_summary_reports_the_checkpointing_the_model_ran_with(tmp_path):
    """A model handed to ``train`` already built (the train node builds it from ``train.model``; a caller
    may bring its own): the summary says what its layers did, not what the parameter asked for."""
    from fastlm.engine.model.recompute import enable_checkpointing

    params = toy_params(tmp_path, max_steps=1, log_every=1, eval_every=None)
    assert params.model.gradient_checkpointing == "off"
    model = toy_model()
    enable_checkpointing(model, "selective")
    summary = run_toy(params, model=model).summary
    assert summary["gradient_checkpointing"] == "selective" and summary["checkpointed_layers"] == "1 of 2"


def test_a_rewind_to_an_earlier_checkpoint_moves_the_abandoned_later_ones_aside(tmp_path):
    """``train.resume: <checkpoint-10>`` in a run folder that holds 15 and 20: the run continues from 10, the
    abandoned line's later checkpoints go to a ``superseded-*`` folder (kept), and a stop then ``resume:
    auto`` (as the stop message advises) continues the rewound line, not the abandoned one's step 20."""
    settings = {"log_every": 1, "save_every": 5, "keep_last": 10, "eval_every": None, "max_steps": 20}
    root = tmp_path / "checkpoints"
    run_toy(toy_params(tmp_path, **settings))
    assert [p.name for p in sorted(root.glob("checkpoint-*"))][-1] == "checkpoint-00000020"

    def interrupt(kind, record):
        if record["step"] == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_toy(
            toy_params(tmp_path, **settings, resume=str(root / "checkpoint-00000010")), callbacks=[interrupt]
        )
    assert latest_checkpoint(root).name == "checkpoint-00000010"
    aside = [p.name for p in sorted(root.glob("superseded-*/checkpoint-*"))]
    assert aside == ["checkpoint-00000015", "checkpoint-00000020"]
    resumed = run_toy(toy_params(tmp_path, **settings, resume="auto"))
    assert resumed.summary["resumed_from_step"] == 10 and resumed.summary["steps_trained"] == 10


def test_steps_whose_samples_are_all_one_token_train_on_without_a_divergence_stop(tmp_path, caplog):
    """length_grouped batches the one-token samples (no target: nothing follows the token) together: those
    steps have no loss, said once as what happened, and the run trains to its end."""
    base = toy_sequences(100, 1)
    rows = [base.values[start:end].tolist() for start, end in itertools.pairwise(base.offsets)] + [[EOS]] * 60
    lengths = np.array([len(row) for row in rows])
    data = TokenSequences(np.concatenate(rows), np.concatenate([[0], np.cumsum(lengths)]))
    params = toy_params(tmp_path, batching={"mode": "length_grouped", "micro_batch_size": 4}, log_every=1)
    with caplog.at_level("WARNING"):
        result = train(
            toy_model(),
            data,
            toy_sequences(40, 2),
            params=params,
            runtime=setup_runtime(params.runtime, seed=0),
            pad_id=EOS,
            max_length=64,
            attn="sdpa",
        )
    assert result.summary["steps"] == 30 and result.summary["stopped_by"] is None
    empty = [row for row in result.history if row["target_tokens"] == 0]
    assert empty and all(math.isnan(row["loss"]) and row["grad_norm"] == 0.0 for row in empty)
    assert all(math.isfinite(row["loss"]) for row in result.history if row["target_tokens"])
    said = [record.getMessage() for record in caplog.records if "no target tokens" in record.getMessage()]
    assert len(said) == 1 and "learning rate" not in said[0]


def test_training_data_without_a_single_target_token_is_refused_in_one_line(tmp_path):
    data = TokenSequences(np.full(20, EOS, dtype=np.int32), np.arange(21))  # 20 samples of one token
    params = toy_params(tmp_path)
    with pytest.raises(ConfigError, match="no target token") as raised:
        train(
            toy_model(),
            data,
            None,
            params=params,
            runtime=setup_runtime(params.runtime, seed=0),
            pad_id=EOS,
            max_length=64,
            attn="sdpa",
        )
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
def test_accumulated_micro_batches_train_what_one_batch_of_the_step_would(tmp_path, mode):
    """Micro-batch 4 x accumulation 1, 2 x 2 and 1 x 4 are one step of 4 samples (the Trainer's
    ``group_by_length`` groups by ``train_batch_size * gradient_accumulation_steps``): the same samples in
    each step, so the same losses and weights within the rounding of another summation order (the tune
    pipeline trades one for the other). Was, under length_grouped: each micro-batch drawn on its own from
    the length-sorted mega-batches, so 2 x 2 trained other samples in every step than 4 x 1 (step 1's loss
    4.1571 against 4.1503, weights 0.08 apart after 6 steps)."""
    from tests.support.tolerances import TRAINED_FP32_LOSS_REL

    results = {}
    for size, accumulation in ((4, 1), (2, 2), (1, 4)):
        batching = {"mode": mode, "micro_batch_size": size, "gradient_accumulation_steps": accumulation}
        params = toy_params(
            tmp_path / f"{size}x{accumulation}", max_steps=6, log_every=1, eval_every=None, batching=batching
        )
        results[size] = run_toy(params)
    whole = results[4]
    for size in (2, 1):
        result = results[size]
        assert [row["target_tokens"] for row in result.history] == [
            row["target_tokens"] for row in whole.history
        ]
        assert [row["loss"] for row in result.history] == pytest.approx(
            [row["loss"] for row in whole.history], rel=TRAINED_FP32_LOSS_REL
        )
        # another summation order (length_grouped: each micro-batch padded to its own longest sample, other
        # shapes), and AdamW's first updates are about lr x sign(gradient): a weight whose gradient is within
        # rounding of zero moves by a little of lr (1e-2) either way; measured <= 9e-6 apart (1.4e-6 under the
        # vector-less kernels, packed), other samples 8e-2
        close = {"rtol": 1e-5, "atol": 5e-5}
        for (name, param), other in zip(
            result.model.named_parameters(), whole.model.parameters(), strict=True
        ):
            torch.testing.assert_close(param, other, **close, msg=lambda text, name=name: f"{name}: {text}")
