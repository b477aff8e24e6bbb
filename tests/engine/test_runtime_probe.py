"""``runtime.precision: auto`` on CPU: the first micro-batch measures bf16 against fp32, without a trace on the run."""

import pytest
import torch

import fastlm.engine.runtime_probe as probe
from fastlm.engine.runtime import RuntimeConfig, setup_runtime
from fastlm.engine.runtime_probe import MIN_SPEEDUP, MIN_STEP_SECONDS, probe_runtime
from tests.support.toy_training import run_toy, toy_model, toy_params

BATCH = {"input_ids": torch.ones(2, 8, dtype=torch.long), "labels": torch.ones(2, 8, dtype=torch.long)}


def timer(seconds: dict, calls: list | None = None, *, real: bool = False):
    """A ``measure`` reporting ``seconds[precision]``, after running the real pass when ``real``."""
    forward_backward = probe.forward_backward_seconds

    def measure(model, batch, runtime):
        if real:
            forward_backward(model, batch, runtime)
        if calls is not None:
            calls.append(runtime.precision)
        return seconds[runtime.precision]

    return measure


def cpu(precision="auto"):
    return setup_runtime(RuntimeConfig(device="cpu", precision=precision, num_threads=1))


@pytest.fixture
def native_bf16(monkeypatch):
    monkeypatch.setattr(probe, "cpu_has_native_bf16", lambda: True)


@pytest.mark.parametrize(("fp32_s", "bf16_s", "expected"), [
    (1.0, 0.5, "bf16"),  # 2x: chosen
    (1.0, 1.0 / MIN_SPEEDUP, "bf16"),  # exactly the margin
    (1.0, 0.95, "fp32"),  # within noise: fp32 stays
    (1.0, 1.4, "fp32"),  # slower (small products)
])
def test_auto_on_a_cpu_with_native_bf16_takes_bf16_only_when_it_measures_faster(native_bf16, fp32_s, bf16_s,
                                                                                 expected):
    calls = []
    seconds = {"fp32": fp32_s, "bf16": bf16_s}
    runtime, result = probe_runtime(cpu(), "auto", toy_model(), BATCH, measure=timer(seconds, calls))
    assert runtime.precision == result.precision == expected and result.record() == {"precision": expected}
    assert calls == ["fp32", "bf16", "fp32", "bf16", "fp32", "bf16"]  # a warm-up each, then alternated rounds
    assert "measured" in runtime.precision_choice and f"{fp32_s / bf16_s:.2f}x" in runtime.precision_choice
    assert runtime.describe()["precision_choice"] == runtime.precision_choice  # an MLflow parameter
    assert (runtime.autocast_dtype is torch.bfloat16) == (expected == "bf16")


def test_a_micro_batch_too_small_to_pay_keeps_fp32_without_a_bf16_trial(native_bf16):
    calls = []
    runtime, result = probe_runtime(cpu(), "auto", toy_model(), BATCH,
                                    measure=timer({"fp32": MIN_STEP_SECONDS / 2}, calls))
    assert runtime.precision == "fp32" and calls == ["fp32"]
    assert "too small" in result.reason


@pytest.mark.parametrize(("requested", "kwargs", "native", "expected", "reason"), [
    ("fp32", {}, True, "fp32", "set in train.runtime.precision"),
    ("bf16", {}, False, "bf16", "set in train.runtime.precision"),
    ("auto", {}, False, "fp32", "no native bf16"),
    ("auto", {"world_size": 2}, True, "fp32", "several CPU processes"),
    ("auto", {"resumed": {"precision": "bf16"}}, True, "bf16", "resumed checkpoint"),
    ("auto", {"resumed": {"precision": "fp32"}}, True, "fp32", "resumed checkpoint"),
])
def test_nothing_is_measured_where_the_choice_is_already_made(monkeypatch, requested, kwargs, native, expected,
                                                              reason):
    monkeypatch.setattr(probe, "cpu_has_native_bf16", lambda: native)

    def never(*args):
        raise AssertionError("measured although the choice was already made")

    runtime, result = probe_runtime(cpu(requested), requested, toy_model(), BATCH, measure=never, **kwargs)
    assert runtime.precision == expected and reason in result.reason


def test_the_measurement_leaves_no_trace_on_the_model_or_the_random_stream(native_bf16):
    model = toy_model()
    for layer in model.model.layers:  # the measured passes draw dropout masks
        layer.self_attn.attention_dropout = 0.5
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    runtime = cpu()  # setup_runtime seeds the generators: before the state is taken
    rng = torch.random.get_rng_state()
    probe_runtime(runtime, "auto", model, BATCH, measure=timer({"fp32": 1.0, "bf16": 0.5}, real=True))
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(param.grad is None for param in model.parameters())
    assert all(torch.equal(param, before[name]) for name, param in model.named_parameters())


def _real_then(seconds: dict):
    return timer(seconds, real=True)


def test_a_run_left_on_auto_trains_exactly_as_one_set_to_what_was_measured_faster(tmp_path, monkeypatch,
                                                                                   native_bf16):
    """The measured passes run for real on the run's first micro-batch; the run still equals explicit bf16."""
    monkeypatch.setattr(probe, "forward_backward_seconds", _real_then({"fp32": 1.0, "bf16": 0.5}))
    steps = {"max_steps": 6, "log_every": 1, "eval_every": None}
    auto = run_toy(toy_params(tmp_path / "auto", **steps))
    explicit = run_toy(toy_params(tmp_path / "bf16", runtime={"precision": "bf16"}, **steps))
    assert [r["loss"] for r in auto.history] == [r["loss"] for r in explicit.history]
    assert auto.runtime.precision == "bf16" and "measured" in auto.runtime.precision_choice
    assert explicit.runtime.precision_choice == "set in train.runtime.precision"


def test_a_resumed_run_keeps_the_settings_its_checkpoint_trained_with(tmp_path, monkeypatch, native_bf16):
    monkeypatch.setattr(probe, "forward_backward_seconds", _real_then({"fp32": 1.0, "bf16": 0.5}))
    steps = {"log_every": 1, "eval_every": None, "save_every": 2}
    first = run_toy(toy_params(tmp_path, max_steps=2, **steps))
    assert first.runtime.precision == "bf16"

    def never(*args):
        raise AssertionError("a resumed run measured again")

    monkeypatch.setattr(probe, "forward_backward_seconds", never)
    resumed = run_toy(toy_params(tmp_path, max_steps=4, resume="auto", **steps))
    assert resumed.history[-1]["step"] == 4 and resumed.runtime.precision == "bf16"
    assert "resumed checkpoint" in resumed.runtime.precision_choice
