"""build_training's parts for a fresh toy run: the step plan from max_steps, the optimizer over the raw model,
a fresh state, no validation without a validation split; settle_request refuses an unknown attention before
anything is read."""

from __future__ import annotations

import math
from contextlib import ExitStack

import numpy as np
import pytest
import torch

from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train.build import TrainRequest, build_training, settle_request
from tests.support.toy_training import EOS, toy_model, toy_params, toy_sequences


def _request(tmp_path, attn: str = "sdpa", **overrides) -> TrainRequest:
    params = toy_params(tmp_path, **overrides)
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    return TrainRequest(toy_model(), toy_sequences(60, 0), None, params, runtime, EOS, 64, attn)


def test_a_fresh_run_gets_its_step_plan_optimizer_and_state(tmp_path):
    request = settle_request(_request(tmp_path, max_steps=7, optimizer={"grad_clip": 1.0}))
    with ExitStack() as cleanup:
        parts = build_training(request, cleanup)
        assert (
            parts.total_steps == 7 == parts.plan.total_steps
            and parts.steps_per_epoch == parts.plan.steps(0) >= 1
        )
        assert parts.raw_model is request.model and parts.world == 1
        assert parts.opt.clip == 1.0 and parts.opt.model is parts.raw_model
        optimized = {id(p) for group in parts.opt.optimizer.param_groups for p in group["params"]}
        assert optimized == {id(p) for p in parts.raw_model.parameters()}
        assert parts.state.step == 0 and parts.state.resumed_from is None
        assert parts.validate is None and parts.early is None  # no validation split, no early stopping
        assert parts.params.batching.micro_batch_size == 4 == parts.configured.batching.micro_batch_size
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_no_grad_clip_means_an_infinite_threshold(tmp_path):
    with ExitStack() as cleanup:
        parts = build_training(settle_request(_request(tmp_path, optimizer={"grad_clip": None})), cleanup)
        assert parts.opt.clip == math.inf


def test_settle_request_refuses_an_unknown_attention_before_reading_data(tmp_path):
    with pytest.raises(ValueError, match="warp_attention. is not one of"):
        settle_request(_request(tmp_path, attn="warp_attention"))


def test_compile_auto_hears_whether_float8_layers_may_train_on_the_base_model(tmp_path, monkeypatch):
    """Compile ``auto`` on CUDA compiles where float8 layers may train (runtime.probe): the build asks
    float8's rule with the run's setting and strategy about the base model (under peft's wrapper too), and
    only on CUDA; on a CPU nothing is asked."""
    import torch

    from fastlm.engine.train import build

    asked = []

    def rule(requested, model, device, *, strategy="ddp", row_length=None):
        asked.append((requested, model, device.type, strategy, row_length))
        return requested != "off", "the rule"

    class Wrapped(torch.nn.Module):  # what peft's model answers
        def __init__(self, base):
            super().__init__()
            self.base = base

        def get_base_model(self):
            return self.base

    monkeypatch.setattr(build, "float8_decision", rule)
    base = toy_model()
    params = toy_params(tmp_path, runtime={"device": "cpu", "num_threads": 1, "float8": "auto"})
    assert build._float8_may_train(params, Wrapped(base), torch.device("cuda")) is True
    assert asked == [("auto", base, "cuda", "ddp", None)]
    asked.clear()
    rows = toy_params(tmp_path, runtime={"float8": "auto"}, batching={"mode": "packed", "row_length": 1000})
    build._float8_may_train(rows, base, torch.device("cuda"))
    assert asked == [("auto", base, "cuda", "ddp", 1000)]  # a row float8 cannot take: the rule says off
    off = toy_params(tmp_path, runtime={"device": "cpu", "num_threads": 1, "float8": "off"})
    assert build._float8_may_train(off, base, torch.device("cuda")) is False
    asked.clear()
    assert build._float8_may_train(params, base, torch.device("cpu")) is False and asked == []


def _seq2seq_request(tmp_path, attn: str, mode: str = "packed") -> TrainRequest:
    from fastlm.engine.data.token_dataset import TokenSequences
    from tests.support.tiny_seq2seq import samples, tiny_seq2seq

    rows = samples(12)
    lengths = [len(row["input_ids"]) for row in rows]
    data = TokenSequences(
        np.concatenate([row["input_ids"] for row in rows]),
        np.concatenate([[0], np.cumsum(lengths)]),
        np.array([row["prompt_length"] for row in rows]),
    )
    params = toy_params(tmp_path, batching={"mode": mode, "micro_batch_size": 4})
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    return TrainRequest(tiny_seq2seq("bart", attn), data, None, params, runtime, 1, 64, attn)


@pytest.mark.parametrize("attn", ["sdpa_varlen", "torch_varlen"])
@pytest.mark.parametrize("mode", ["packed", "length_grouped"])
def test_settle_request_refuses_a_varlen_only_attention_for_an_encoder_decoder_model_in_one_line(
    tmp_path, attn, mode
):
    """`kedro run --pipeline=train --params train.model.attn_implementation=sdpa_varlen` on a BART folder
    warned that packed batching was unavailable, then failed at the first forward with a traceback ending in
    "sdpa_varlen attention needs cu_seq_lens_q": the varlen kernels take packed causal rows only, which an
    encoder-decoder model never gets. Refused in one line before anything is read."""
    from fastlm.errors import ConfigError

    with pytest.raises(ConfigError, match=f"{attn}.*encoder-decoder.*sdpa or eager") as refused:
        settle_request(_seq2seq_request(tmp_path, attn, mode))
    assert "\n" not in str(refused.value) and "train.model.attn_implementation" in str(refused.value)
    assert settle_request(_seq2seq_request(tmp_path, "sdpa", mode)).sides is not None


@pytest.mark.parametrize("seq2seq", [False, True])
def test_settle_request_refuses_flex_attention_on_a_cpu_in_one_line(tmp_path, seq2seq):
    """flex_attention has no CPU backward in torch: asked for on a CPU, training failed at its first backward
    with torch's NotImplementedError and a traceback. One line before anything is read."""
    from fastlm.errors import ConfigError

    request = (
        _seq2seq_request(tmp_path, "flex_attention") if seq2seq else _request(tmp_path, "flex_attention")
    )
    with pytest.raises(ConfigError, match="flex_attention.*CPU") as refused:
        settle_request(request)
    assert "\n" not in str(refused.value) and "train.model.attn_implementation" in str(refused.value)


@pytest.mark.parametrize(
    ("warmup", "decay", "said"),
    [
        (20, "cosine", "the cosine decay never starts"),
        (7, "linear", "the linear decay never starts"),
        (20, "constant", "warms up over 7 steps, not 20"),
        (7, "constant", None),  # the warmup asked for, to the last step, and no decay asked for
        (6, "linear", None),
    ],
)
def test_a_warmup_of_the_whole_run_is_said_in_one_line(tmp_path, caplog, warmup, decay, said):
    """``warmup_steps`` not below the run's steps (the default 20 and a small data set's few steps): the
    warmup is cut to the run's steps, so the rate rises to the peak at the last step and the decay asked for
    never happens (the run ends at ``lr``, not at ``min_lr_ratio`` x ``lr``). That was silent."""
    request = settle_request(
        _request(tmp_path, max_steps=7, optimizer={"warmup_steps": warmup, "decay": decay, "lr": 1e-2})
    )
    with caplog.at_level("WARNING", logger="fastlm.engine.train.build"), ExitStack() as cleanup:
        parts = build_training(request, cleanup)
        last = parts.opt.scheduler.lr_lambdas[0](parts.total_steps - 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if said is None:
        assert warnings == []
        return
    assert last == 1.0  # the peak at the last step: what the line warns of
    assert len(warnings) == 1 and said in warnings[0], warnings
    assert f"train.optimizer.warmup_steps {warmup}" in warnings[0] and "below 7" in warnings[0]
    assert "\n" not in warnings[0]


def _lr_factors(scheduler, total: int) -> list[float]:
    """The multiplier of the peak rate at each of ``total`` steps, as the scheduler steps."""
    factors = []
    for _ in range(total):
        factors.append(scheduler.get_last_lr()[0] / scheduler.base_lrs[0])
        scheduler.optimizer.step()
        scheduler.step()
    return factors


@pytest.mark.parametrize("decay", ["cosine", "linear"])
@pytest.mark.parametrize(
    "plan",
    [
        {"max_steps": 7},
        {"max_steps": None, "epochs": 2},
        {"max_steps": None, "epochs": 2, "max_minutes": 0.01},
    ],
    ids=["max-steps", "epochs", "epochs-time-budget"],
)
def test_a_warmup_ratio_is_the_trainers_over_the_runs_planned_steps(tmp_path, decay, plan):
    """``warmup_ratio`` r warms up over ceil(r x T) steps, T the run's planned optimizer steps (max_steps, or
    every epoch's; a time budget stops early, the plan is still T), and decays as the Trainer's
    ``get_scheduler`` then does. fastlm's warmup starts at lr / warmup (the Trainer's at 0): compared as
    such; ``min_lr_ratio`` 0 decays to 0 as the Trainer's does."""
    from transformers import get_scheduler

    ratio = 0.3
    optimizer = {"warmup_steps": 20, "warmup_ratio": ratio, "decay": decay, "min_lr_ratio": 0.0}
    request = settle_request(_request(tmp_path, **plan, optimizer=optimizer))
    with ExitStack() as cleanup:
        parts = build_training(request, cleanup)
        total = parts.plan.total_steps
        ours = [parts.opt.scheduler.lr_lambdas[0](step) for step in range(total)]
    assert total == parts.total_steps > 4 and (total == 7 or not plan.get("max_steps"))
    warmup = math.ceil(total * ratio)
    param = torch.zeros(1, requires_grad=True)
    theirs = _lr_factors(
        get_scheduler(
            decay, torch.optim.SGD([param], lr=1.0), num_warmup_steps=warmup, num_training_steps=total
        ),
        total,
    )
    assert ours[:warmup] == [(step + 1) / warmup for step in range(warmup)]  # the same quotients
    # the same cosine / line of (step - warmup) / (total - warmup): a few float operations apart
    assert ours[warmup:] == pytest.approx(theirs[warmup:], rel=1e-12, abs=1e-15)


def test_a_warmup_ratio_of_the_whole_run_is_said_naming_the_ratio(tmp_path, caplog):
    """ceil(0.7 x 3) = 3 warmup steps of a 3-step run: the warning of a warmup not below the run's steps
    names the ratio it came from and the steps it gave."""
    optimizer = {"warmup_steps": 20, "warmup_ratio": 0.7, "decay": "cosine"}
    request = settle_request(_request(tmp_path, max_steps=3, optimizer=optimizer))
    with caplog.at_level("WARNING", logger="fastlm.engine.train.build"), ExitStack() as cleanup:
        build_training(request, cleanup)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "train.optimizer.warmup_ratio 0.7" in warnings[0], warnings
    assert "3 warmup steps" in warnings[0] and "below this run's 3" in warnings[0] and "\n" not in warnings[0]


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            {"epochs": 3, "max_steps": 4},
            "train.epochs = 3 (train.max_steps = 4 sets the run's length: 4 optimizer",
        ),
        ({"max_steps": 4}, None),  # epochs left at its default: nothing to say
        ({"epochs": 3, "max_steps": None}, None),
        (
            {"early_stopping": {"min_delta": 0.05}},
            "train.early_stopping.min_delta = 0.05 (early stopping is off",
        ),
    ],
)
def test_a_train_setting_the_run_never_reads_is_said_in_one_warning(tmp_path, caplog, overrides, said):
    """``train.epochs`` beside ``train.max_steps`` (a conf/local max_steps and ``--params train.epochs=3``),
    or a ``min_delta`` with early stopping off, changes nothing: the run trains ``max_steps`` steps. One
    warning names the setting, why and the steps an epoch takes (the plan's, counted apart here); the run
    trains as before. Was: taken without a word, 4 steps trained where 3 epochs were asked for."""
    settings = {"optimizer": {"warmup_steps": 1}, **overrides}
    request = settle_request(_request(tmp_path, **settings))
    with caplog.at_level("WARNING", logger="fastlm.engine.train.build"), ExitStack() as cleanup:
        parts = build_training(request, cleanup)
        steps_per_epoch = parts.plan.steps(0)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    asked_steps = overrides.get("max_steps")
    if said is None:
        assert warnings == []
        return
    assert len(warnings) == 1 and said in warnings[0] and "\n" not in warnings[0], warnings
    assert warnings[0].startswith("train settings that change nothing for this run: ")
    if asked_steps is not None:
        assert parts.total_steps == asked_steps
        # an epoch's steps, counted from the stream's own batches (accumulation 1: a step a batch)
        assert steps_per_epoch == len(parts.stream.sampler.epoch_batches())
        assert f"about {asked_steps / steps_per_epoch:.3g} epochs of {steps_per_epoch} steps" in warnings[0]
        assert "set train.max_steps: null to train 3 epochs" in warnings[0]


@pytest.mark.parametrize(("scope", "validated_on"), [("model", "sdpa"), ("layers", "eager")])
def test_a_compiled_cpu_runs_validation_runs_on_the_path_its_model_runs(
    tmp_path, monkeypatch, scope, validated_on
):
    """Compiled on CPU, ``auto`` attention trains on the additive-mask path, which pays only compiled
    (``attention_when_compiled``). With ``compile_scope: model`` validation runs the uncompiled model
    (torch.compile's wrapper is the stepping model's alone): there the additive mask is the slow path (rows of
    2,048: 3.6x SDPA's time), so it validates on SDPA, batches and model alike, and training goes on on the
    additive mask. With ``layers`` the model's own layers are the compiled ones: validation stays on their
    path (another one would compile them again)."""
    import fastlm.engine.runtime.environment as environment
    import fastlm.engine.train.build as build
    from fastlm.engine.train.loop import train

    class Wrapper(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self._orig_mod = model

        def forward(self, *args, **kwargs):
            steps.append(self._orig_mod.config._attn_implementation)
            return self._orig_mod(*args, **kwargs)

    steps, validations = [], []
    real_evaluate = build.evaluate

    def recording_evaluate(model, *args, **kwargs):
        validations.append((kwargs["attn"], model.config._attn_implementation))
        return real_evaluate(model, *args, **kwargs)

    monkeypatch.setattr(
        environment,
        "compile_in_scope",
        lambda model, scope, mode: Wrapper(model) if scope == "model" else model,
    )
    monkeypatch.setattr(build, "evaluate", recording_evaluate)
    params = toy_params(
        tmp_path, runtime={"precision": "fp32", "compile": True, "compile_scope": scope}, max_steps=4
    )
    params = params.model_copy(update={"eval_every": 2})
    model = toy_model()
    result = train(
        model,
        toy_sequences(300, 1),
        toy_sequences(40, 2),
        params=params,
        runtime=setup_runtime(params.runtime, seed=params.seed),
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
    )
    assert result.summary["attention"] == "eager"
    assert validations == [(validated_on, validated_on)] * 2
    assert set(steps) <= {"eager"} and len(steps) == (4 if scope == "model" else 0)
    assert model.config._attn_implementation == "sdpa"
    assert [row["step"] for row in result.eval_history] == [2, 4]
