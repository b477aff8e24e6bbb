"""``train.runtime.float8: auto`` measured on the first micro-batch where the rule allows it: the choice
follows the measured ratio, a reverted model holds exactly its original layers, a resumed run keeps the
choice.

No GPU and no torchao: the device capability is patched (a Hopper), the width rule lowered to the toy model's
and torchao's converter replaced by one that wraps the filtered Linear layers in ``FakeFloat8`` (same weight
Parameters, as ``Float8Linear``), whose forward counts its calls and may sleep."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import fastlm.engine.runtime.probe as probe
from fastlm.engine.runtime import float8
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.runtime.probe import FLOAT8_MIN_SPEEDUP, Float8Probe, probe_float8
from fastlm.engine.train.loop import train
from tests.support.toy_training import EOS, toy_model, toy_params, toy_sequences

BATCH = {"input_ids": torch.ones(2, 8, dtype=torch.long), "labels": torch.ones(2, 8, dtype=torch.long)}


class FakeFloat8(nn.Module):
    """What torchao's ``Float8Linear`` keeps of a Linear (its Parameters), with a forward that counts."""

    calls = 0
    sleep = 0.0

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        FakeFloat8.calls += 1
        if FakeFloat8.sleep:
            time.sleep(FakeFloat8.sleep)
        return F.linear(x, self.weight, self.bias)


def fake_convert(model: nn.Module, *, module_filter_fn) -> nn.Module:
    """torchao's contract: every module offered to the filter with its name, the kept ones swapped."""
    chosen = [name for name, module in model.named_modules() if name and module_filter_fn(module, name)]
    for name in chosen:
        model.set_submodule(name, FakeFloat8(model.get_submodule(name)))
    return model


@pytest.fixture
def hopper(monkeypatch):
    """A machine where the rule lets float8 be a candidate for the toy model."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(float8, "torchao_installed", lambda: True)
    monkeypatch.setattr(float8, "MIN_HIDDEN_SIZE", 32)
    monkeypatch.setattr(float8, "load_converter", lambda: fake_convert)
    FakeFloat8.calls, FakeFloat8.sleep = 0, 0.0


def cuda_runtime():
    """A CUDA runtime record (the passes are timed by a fake ``measure``, nothing runs on a GPU)."""
    cpu = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    return replace(cpu, device=torch.device("cuda"), precision="bf16")


def converted(model: nn.Module) -> bool:
    return any(isinstance(module, FakeFloat8) for module in model.modules())


def timer(plain_s: float, fp8_s: float, calls: list):
    """A ``measure`` reporting ``fp8_s`` while float8 layers are in the model, ``plain_s`` otherwise."""

    def measure(model, batch, runtime):
        calls.append("fp8" if converted(model) else "plain")
        return fp8_s if converted(model) else plain_s

    return measure


@pytest.mark.parametrize(
    ("fp8_s", "kept"),
    [
        (0.5, True),  # 2x
        (1.0 / FLOAT8_MIN_SPEEDUP, True),  # exactly the margin
        (0.95, False),  # within noise
        (1.3, False),  # slower: the casts cost more than the matmuls save
    ],
)
def test_auto_keeps_float8_only_when_the_first_micro_batch_measures_it_faster(hopper, fp8_s, kept):
    model, calls = toy_model(), []
    originals = dict(model.named_modules())
    runtime = probe_float8(
        cuda_runtime(), model, BATCH, Float8Probe("auto"), measure=timer(1.0, fp8_s, calls)
    )
    assert calls == ["plain", "fp8", "plain", "fp8", "plain", "fp8"]  # a warm-up each, alternated rounds
    assert runtime.float8 is kept and converted(model) is kept
    assert f"fp8 {fp8_s:.3f} s vs bf16 1.000 s ({1.0 / fp8_s:.2f}x; float8 needs {FLOAT8_MIN_SPEEDUP}x)" in (
        runtime.float8_choice
    )
    assert runtime.describe()["float8_choice"] == runtime.float8_choice  # an MLflow parameter, the summary
    if kept:  # 7 Linear layers in each of the 2 blocks; the output head stays plain
        assert "on, 14 Linear layers in float8" in runtime.float8_choice
        swapped = {name: m for name, m in model.named_modules() if isinstance(m, FakeFloat8)}
        assert len(swapped) == 14 and all(m.weight is originals[name].weight for name, m in swapped.items())
    else:  # exactly the original modules, in their places
        assert "original layers put back" in runtime.float8_choice
        assert list(model.named_modules()) == list(originals.items())


def test_the_measured_passes_leave_no_trace(hopper):
    model = toy_model()
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    cuda = cuda_runtime()  # setup_runtime seeds the generators: before the state is taken
    rng = torch.random.get_rng_state()
    forward_backward = probe.forward_backward_seconds

    def real(model, batch, runtime):  # the real passes (CPU, fp32), reported as float8 2x faster
        forward_backward(model, batch, replace(runtime, device=torch.device("cpu"), precision="fp32"))
        return 0.5 if converted(model) else 1.0

    runtime = probe_float8(cuda, model, BATCH, Float8Probe("auto"), measure=real)
    assert runtime.float8 and FakeFloat8.calls > 0  # the float8 layers really ran
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(param.grad is None for param in model.parameters())
    assert all(torch.equal(param, before[name]) for name, param in model.named_parameters())


@pytest.mark.parametrize("kept", [True, False])
def test_a_resumed_run_keeps_its_checkpoints_choice_without_measuring(hopper, kept):
    def never(*args):
        raise AssertionError("a resumed run measured again")

    model = toy_model()
    runtime = probe_float8(
        cuda_runtime(), model, BATCH, Float8Probe("auto"), resumed={"float8": kept}, measure=never
    )
    assert runtime.float8 is kept and converted(model) is kept
    assert "kept from the resumed checkpoint" in runtime.float8_choice


def test_nothing_is_measured_where_the_rule_or_the_setting_decides(hopper, monkeypatch):
    def never(*args):
        raise AssertionError("measured")

    model = toy_model()
    off = probe_float8(cuda_runtime(), model, BATCH, Float8Probe("off", applied="float8 off"), measure=never)
    assert not off.float8 and off.float8_choice == "float8 off" and not converted(model)
    monkeypatch.setattr(float8, "MIN_HIDDEN_SIZE", 2048)  # the rule: too narrow to gain
    narrow = probe_float8(cuda_runtime(), model, BATCH, Float8Probe("auto"), measure=never)
    assert not narrow.float8 and "hidden size 32 < 2048" in narrow.float8_choice and not converted(model)
    monkeypatch.setattr(float8, "MIN_HIDDEN_SIZE", 32)
    several = probe_float8(cuda_runtime(), model, BATCH, Float8Probe("auto"), world_size=2, measure=never)
    assert several.float8 and "follows the rule" in several.float8_choice and converted(model)


def test_a_failing_float8_pass_puts_the_original_layers_back_and_turns_float8_off(hopper, caplog):
    # auto: on only where it pays. A float8 pass that fails (an H100 refused a micro-batch's token count,
    # 2026-11-28) is no reason to stop a run the plain layers train: off, the error named in the choice
    model = toy_model()
    originals = list(model.named_modules())

    def fails_in_float8(model, batch, runtime):
        if converted(model):
            raise RuntimeError("float8 GEMM unsupported\nmore lines of the trace")
        return 1.0

    with caplog.at_level("WARNING", logger="fastlm.engine.runtime.probe"):
        runtime = probe_float8(cuda_runtime(), model, BATCH, Float8Probe("auto"), measure=fails_in_float8)
    assert not runtime.float8 and list(model.named_modules()) == originals
    assert runtime.float8_choice == (
        "float8 auto: its first float8 pass failed (RuntimeError: float8 GEMM unsupported): off, "
        "the original layers put back"
    )
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == [
        f"train.runtime.float8 auto -> off: {runtime.float8_choice}"
    ]


def test_a_failing_plain_pass_raises_with_the_original_layers(hopper):
    model = toy_model()
    originals = list(model.named_modules())

    def fails_in_plain(model, batch, runtime):
        if not converted(model):
            raise RuntimeError("CUDA out of memory")
        return 1.0

    with pytest.raises(RuntimeError, match="out of memory"):
        probe_float8(cuda_runtime(), model, BATCH, Float8Probe("auto"), measure=fails_in_plain)
    assert list(model.named_modules()) == originals


def toy_run(tmp_path, float8_setting: str, model: nn.Module | None = None, runtime_choices=None, **overrides):
    settings = {"max_steps": 4, "log_every": 1, "eval_every": None, **overrides}
    params = toy_params(tmp_path, runtime={"float8": float8_setting}, **settings)
    model = model or toy_model()
    result = train(
        model,
        toy_sequences(120, 1),
        None,
        params=params,
        runtime=setup_runtime(params.runtime, seed=params.seed),
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
        runtime_choices=runtime_choices,
    )
    return model, result


@pytest.fixture
def rule_allows(monkeypatch):
    """The rule passes on this CPU (the conversion is the fake one): the training run's own probe runs."""
    real_rule = float8.float8_decision

    def decision(requested, model, device, *, strategy="ddp", row_length=None):
        if requested == "off":
            return real_rule(requested, model, device, strategy=strategy, row_length=row_length)
        return True, f"float8 on ({requested}): the rule passes (patched)"

    monkeypatch.setattr(float8, "float8_decision", decision)
    monkeypatch.setattr(float8, "load_converter", lambda: fake_convert)
    FakeFloat8.calls, FakeFloat8.sleep = 0, 0.0


def test_a_training_run_reverted_after_measuring_trains_exactly_as_one_with_float8_off(tmp_path, rule_allows):
    """The real timer on the run's first micro-batch: float8 layers that sleep are slower, put back, and the
    run equals one that never tried them."""
    FakeFloat8.sleep = 0.002
    model = toy_model()
    originals = list(model.named_modules())
    model, auto = toy_run(tmp_path / "auto", "auto", model)
    assert FakeFloat8.calls > 0 and not auto.runtime.float8 and not converted(model)
    assert "measured on the first micro-batch" in auto.runtime.float8_choice
    _, off = toy_run(tmp_path / "off", "off")
    assert [r["loss"] for r in auto.history] == [r["loss"] for r in off.history]
    assert list(model.named_modules()) == originals


def test_a_resumed_training_run_keeps_float8_as_measured(tmp_path, rule_allows, monkeypatch):
    forward_backward = probe.forward_backward_seconds

    def fp8_faster(model, batch, runtime):
        forward_backward(model, batch, runtime)
        return 0.5 if converted(model) else 1.0

    monkeypatch.setattr(probe, "forward_backward_seconds", fp8_faster)
    model, first = toy_run(tmp_path, "auto", max_steps=2, save_every=2)
    assert first.runtime.float8 and converted(model) and "2.00x" in first.runtime.float8_choice

    def never(*args):
        raise AssertionError("a resumed run measured again")

    monkeypatch.setattr(probe, "forward_backward_seconds", never)
    model, resumed = toy_run(tmp_path, "auto", max_steps=4, save_every=2, resume="auto")
    assert resumed.history[-1]["step"] == 4 and resumed.runtime.float8 and converted(model)
    assert "kept from the resumed checkpoint" in resumed.runtime.float8_choice


# float8 just above and just below its margin: what two runs of one command on one machine may measure
ABOVE_S, BELOW_S = 1.0 / (FLOAT8_MIN_SPEEDUP + 0.02), 1.0 / (FLOAT8_MIN_SPEEDUP - 0.02)


def test_the_same_command_twice_settles_float8_auto_alike_where_noise_would_flip_it(hopper, tmp_path):
    """The first run's float8 timings are kept in the run's choices file (``runtime_choices.json``), as
    ``compile: auto``'s are: the same command again decides from them, unmeasured, where its own timings
    (under the margin) would train it with the plain layers, with other losses, after the first trained in
    float8. Another precision or a compiled model is another measurement."""
    from fastlm.engine.runtime.remembered import RememberedChoices

    choices = RememberedChoices(tmp_path / "runtime_choices.json")

    def settle(fp8_s: float, kept=choices, runtime=None):
        model, calls = toy_model(), []
        probed = probe_float8(
            runtime or cuda_runtime(),
            model,
            BATCH,
            Float8Probe("auto", choices=kept),
            measure=timer(1.0, fp8_s, calls),
        )
        return probed, model, calls

    first, model, calls = settle(ABOVE_S)
    assert first.float8 and converted(model) and calls
    alone = settle(BELOW_S, kept=None)[0]  # the second run's timings decide the other way on their own
    assert not alone.float8
    second, model, calls = settle(BELOW_S)
    assert second.float8 and converted(model) and calls == []
    assert f"({FLOAT8_MIN_SPEEDUP + 0.02:.2f}x; float8 needs" in second.float8_choice
    assert f"kept from {choices.path}" in second.float8_choice and "delete it to measure again" in (
        second.float8_choice
    )
    assert "on, 14 Linear layers in float8" in second.float8_choice
    fp16, model, calls = settle(BELOW_S, runtime=replace(cuda_runtime(), precision="fp16"))
    assert not fp16.float8 and not converted(model) and calls and "kept from" not in fp16.float8_choice
    compiled, _, calls = settle(BELOW_S, runtime=replace(cuda_runtime(), compile=True))
    assert not compiled.float8 and calls


def test_kept_float8_timings_under_the_margin_keep_the_plain_layers_unmeasured(hopper, tmp_path):
    from fastlm.engine.runtime.remembered import RememberedChoices

    choices = RememberedChoices(tmp_path / "runtime_choices.json")
    probe_float8(cuda_runtime(), toy_model(), BATCH, Float8Probe("auto", choices=choices),
                 measure=timer(1.0, BELOW_S, []))  # fmt: skip
    model, calls = toy_model(), []
    originals = list(model.named_modules())
    again = probe_float8(
        cuda_runtime(), model, BATCH, Float8Probe("auto", choices=choices), measure=timer(1.0, ABOVE_S, calls)
    )
    assert not again.float8 and calls == [] and list(model.named_modules()) == originals
    assert "original layers put back" not in again.float8_choice and "kept from" in again.float8_choice


def test_a_training_run_again_keeps_float8_as_the_first_measured_it(tmp_path, rule_allows, monkeypatch):
    """Through the training run: its choices file (``train(runtime_choices=...)``, the train node's
    ``<train.checkpoint_dir>/runtime_choices.json``) keeps the float8 timings of its first micro-batch."""
    forward_backward = probe.forward_backward_seconds
    path = tmp_path / "runtime_choices.json"

    def fp8_at(ratio: float):
        def measure(model, batch, runtime):
            forward_backward(model, batch, runtime)
            return 1.0 / ratio if converted(model) else 1.0

        return measure

    monkeypatch.setattr(probe, "forward_backward_seconds", fp8_at(FLOAT8_MIN_SPEEDUP + 0.02))
    model, first = toy_run(tmp_path / "a", "auto", runtime_choices=path)
    assert first.runtime.float8 and converted(model)
    monkeypatch.setattr(probe, "forward_backward_seconds", fp8_at(FLOAT8_MIN_SPEEDUP - 0.02))
    model, second = toy_run(tmp_path / "b", "auto", runtime_choices=path)
    assert second.runtime.float8 and converted(model) and "kept from" in second.runtime.float8_choice
    assert [r["loss"] for r in first.history] == [r["loss"] for r in second.history]
