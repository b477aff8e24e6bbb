"""``runtime.precision: auto`` on CPU: the first micro-batch measures bf16 against fp32, without a trace on
the run."""

import pytest
import torch

import fastlm.engine.runtime.probe as probe
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.runtime.probe import MIN_SPEEDUP, MIN_STEP_SECONDS, CompileProbe, probe_runtime
from tests.support.tolerances import TRAINED_FP32_LOSS_REL
from tests.support.toy_training import run_toy, toy_model, toy_params

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

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


@pytest.mark.parametrize(
    ("fp32_s", "bf16_s", "expected"),
    [
        (1.0, 0.5, "bf16"),  # 2x: chosen
        (1.0, 1.0 / MIN_SPEEDUP, "bf16"),  # exactly the margin
        (1.0, 0.95, "fp32"),  # within noise: fp32 stays
        (1.0, 1.4, "fp32"),  # slower (small products)
    ],
)
def test_auto_on_a_cpu_with_native_bf16_takes_bf16_only_when_it_measures_faster(
    native_bf16, fp32_s, bf16_s, expected
):
    calls = []
    seconds = {"fp32": fp32_s, "bf16": bf16_s}
    runtime, result = probe_runtime(cpu(), "auto", toy_model(), BATCH, measure=timer(seconds, calls))
    assert runtime.precision == result.precision == expected
    assert result.record() == {"precision": expected, "compile": False}
    assert calls == ["fp32", "bf16", "fp32", "bf16", "fp32", "bf16"]  # a warm-up each, then alternated rounds
    assert "measured" in runtime.precision_choice and f"{fp32_s / bf16_s:.2f}x" in runtime.precision_choice
    assert runtime.describe()["precision_choice"] == runtime.precision_choice  # an MLflow parameter
    assert (runtime.autocast_dtype is torch.bfloat16) == (expected == "bf16")


def test_a_micro_batch_too_small_to_pay_keeps_fp32_without_a_bf16_trial(native_bf16):
    calls = []
    runtime, result = probe_runtime(
        cpu(), "auto", toy_model(), BATCH, measure=timer({"fp32": MIN_STEP_SECONDS / 2}, calls)
    )
    assert runtime.precision == "fp32" and calls == ["fp32"]
    assert "too small" in result.reason


@pytest.mark.parametrize(
    ("requested", "kwargs", "native", "expected", "reason"),
    [
        ("fp32", {}, True, "fp32", "set in train.runtime.precision"),
        ("bf16", {}, False, "bf16", "set in train.runtime.precision"),
        ("auto", {}, False, "fp32", "no native bf16"),
        ("auto", {"world_size": 2}, True, "fp32", "several CPU processes"),
        ("auto", {"resumed": {"precision": "bf16"}}, True, "bf16", "resumed checkpoint"),
        ("auto", {"resumed": {"precision": "fp32"}}, True, "fp32", "resumed checkpoint"),
    ],
)
def test_nothing_is_measured_where_the_choice_is_already_made(
    monkeypatch, requested, kwargs, native, expected, reason
):
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


def test_a_run_left_on_auto_trains_exactly_as_one_set_to_what_was_measured_faster(
    tmp_path, monkeypatch, native_bf16
):
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


# --- runtime.compile: auto on CPU ---------------------------------------------------------------------------


class Compiled(torch.nn.Module):
    """What a fake compiler returns: the model itself behind a wrapper (``_orig_mod``, as torch.compile's)."""

    def __init__(self, model, scope="model", mode="default"):
        super().__init__()
        self._orig_mod = model
        self.scope, self.mode = scope, mode

    def forward(self, *args, **kwargs):
        return self._orig_mod(*args, **kwargs)


def compile_timer(eager_s: float, compiled_s: float, calls: list, *, real: bool = False):
    """A ``measure`` reporting ``compiled_s`` for a compiled model and ``eager_s`` otherwise (fp32
    runtime)."""
    forward_backward = probe.forward_backward_seconds

    def measure(model, batch, runtime):
        if real:
            forward_backward(model, batch, runtime)
        compiled = isinstance(model, Compiled)
        calls.append("compiled" if compiled else "eager")
        return compiled_s if compiled else eager_s

    return measure


# micro-batches left, at 1 s each: long enough to repay compiling
LONG_RUN = int(2 * probe.COMPILE_MIN_RUN_SECONDS)


@pytest.mark.parametrize(
    ("eager_s", "compiled_s", "expected"),
    [
        (1.0, 0.5, True),  # 2x: compiled
        (1.0, 1.0 / probe.COMPILE_MIN_SPEEDUP, True),  # exactly the margin
        (1.0, 0.95, False),  # within noise: eager stays
        (1.0, 1.3, False),  # slower
    ],
)
def test_auto_compile_on_cpu_keeps_the_compiled_model_only_where_it_measures_faster(
    eager_s, compiled_s, expected
):
    calls, compiled_models = [], []

    def compiler(model):
        compiled_models.append(Compiled(model))
        return compiled_models[-1]

    runtime, result = probe_runtime(
        cpu("fp32"),
        "fp32",
        toy_model(),
        BATCH,
        compile_probe=CompileProbe("auto", LONG_RUN, compiler=compiler),
        measure=compile_timer(eager_s, compiled_s, calls),
    )
    assert runtime.compile is expected and result.record()["compile"] is expected
    assert (result.compiled is compiled_models[0]) if expected else result.compiled is None
    assert calls[:3] == ["eager", "compiled", "compiled"]  # eager timed, then compiled: compile + warm-up
    assert calls[3:] == ["eager", "compiled"] * probe.ROUNDS  # then alternated rounds
    assert "measured" in runtime.compile_choice and f"{eager_s / compiled_s:.2f}x" in runtime.compile_choice
    assert runtime.describe()["compile_choice"] == runtime.compile_choice  # an MLflow parameter


def test_auto_compile_on_cpu_skips_a_run_too_short_to_repay_compiling():
    calls = []

    def compiler(model):
        raise AssertionError("compiled for a run too short to repay it")

    runtime, result = probe_runtime(
        cpu("fp32"),
        "fp32",
        toy_model(),
        BATCH,
        compile_probe=CompileProbe("auto", 10, compiler=compiler),
        measure=compile_timer(1.0, 0.1, calls),
    )
    assert runtime.compile is False and result.compiled is None and calls == ["eager"]
    assert "would not repay" in runtime.compile_choice


@pytest.mark.parametrize(
    ("request_", "kwargs", "expected", "reason"),
    [
        (True, {}, True, "set in train.runtime.compile"),
        (False, {}, False, "set in train.runtime.compile"),
        ("auto", {"world_size": 2}, False, "several CPU processes"),
        ("auto", {"resumed": {"precision": "fp32", "compile": True}}, True, "resumed checkpoint"),
        ("auto", {"resumed": {"precision": "fp32", "compile": False}}, False, "resumed checkpoint"),
    ],
)
def test_compile_is_not_measured_where_the_choice_is_already_made(request_, kwargs, expected, reason):
    def never(*args):
        raise AssertionError("measured although the choice was already made")

    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1, compile=request_))
    runtime, result = probe_runtime(
        runtime,
        "fp32",
        toy_model(),
        BATCH,
        compile_probe=CompileProbe(request_, LONG_RUN, compiler=never),
        measure=never,
        **kwargs,
    )
    assert runtime.compile is expected and result.compiled is None and reason in runtime.compile_choice


def test_the_same_command_twice_settles_compile_auto_alike_where_noise_would_flip_it(tmp_path):
    """The first run's compile timings are kept beside its precision (``runtime_choices.json``): the same
    command again decides from them, unmeasured, where its own timings (1.05x, under the 1.1x margin) would
    train it eager, with other losses, after the first trained compiled (1.18x). A run too short to repay
    compiling (10 micro-batches of the kept 1.0 s) stays eager, uncompiled; another scope is measured."""
    from fastlm.engine.runtime.remembered import RememberedChoices

    choices = RememberedChoices(tmp_path / "runtime_choices.json")

    def settle(compiled_s: float, left: int = LONG_RUN, kept=choices, scope: str = "model"):
        calls = []

        def compiler(model):
            calls.append("compile")
            return Compiled(model)

        runtime, result = probe_runtime(
            cpu("fp32"),
            "fp32",
            toy_model(),
            BATCH,
            compile_probe=CompileProbe("auto", left, compiler=compiler, scope=scope),
            measure=compile_timer(1.0, compiled_s, calls),
            choices=kept,
        )
        return runtime, result, calls

    first, result, calls = settle(0.85)
    assert first.compile is True and isinstance(result.compiled, Compiled) and "eager" in calls
    alone = settle(0.95, kept=None)[0]  # the second run's timings decide the other way on their own
    assert alone.compile is False
    second, result, calls = settle(0.95)
    assert second.compile is True and isinstance(result.compiled, Compiled) and calls == ["compile"]
    assert "1.18x" in second.compile_choice and "kept from" in second.compile_choice
    short, result, calls = settle(0.5, left=10)
    assert short.compile is False and result.compiled is None and calls == []
    assert "about 10 s of training left" in short.compile_choice
    other, _, calls = settle(0.95, scope="layers")
    assert other.compile is False and "eager" in calls and "kept from" not in other.compile_choice


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_compile_that_fails_under_auto_leaves_the_run_eager_and_says_why(device, caplog):
    """``auto`` promises a compiled model only where it pays: a compile that fails in the probe (an inductor
    or dynamo error on a model or kernel it cannot trace: bitsandbytes' 4-bit layers, a custom kernel) used to
    stop the run in its first micro-batch. Now the run trains eager, the error named in the choice and warned
    (``compile: true`` still raises: nothing is probed there)."""
    import logging

    class Broken(Compiled):
        def forward(self, *args, **kwargs):
            raise RuntimeError("backend='inductor' raised:\nLoweringException: no lowering")

    def measure(model, batch, runtime):  # the pass itself (no GPU here: nothing to wait for), then a time
        model(input_ids=batch["input_ids"])
        return 0.5 if isinstance(model, Compiled) else 1.0

    runtime = cpu("fp32") if device == "cpu" else cuda_runtime()
    with caplog.at_level(logging.WARNING, logger=probe.__name__):
        runtime, result = probe_runtime(
            runtime,
            "fp32" if device == "cpu" else "auto",
            toy_model(),
            BATCH,
            compile_probe=CompileProbe("auto", LONG_RUN, compiler=Broken),
            measure=measure,
        )
    assert runtime.compile is False and result.compiled is None and result.record()["compile"] is False
    assert runtime.compile_choice == (
        f"{probe.COMPILE_FAILED} (RuntimeError: backend='inductor' raised:): eager, the model as it was"
    )
    assert any(probe.COMPILE_FAILED in record.getMessage() for record in caplog.records)


# --- runtime.compile: auto on CUDA, through the probe's calling contract (no GPU here) ----------------------


def cuda_runtime():
    """The runtime ``setup_runtime`` gives a CUDA run left on ``compile: auto`` (compile resolved to True
    until the probe settles it), built on this CPU: the timers below stand in for the GPU's passes."""
    from dataclasses import replace

    return replace(cpu("fp32"), device=torch.device("cuda"), precision="bf16", compile=True)


@pytest.mark.parametrize(
    ("eager_s", "compiled_s", "expected"),
    [
        (1.0, 0.5, True),  # compiled measures faster: kept
        (1.0, 0.95, False),  # within noise: eager
        (1.0, 1.06, False),  # slower compiled: eager (as a liger-fused full fine-tune measured on an H200)
    ],
)
def test_auto_compile_on_cuda_keeps_the_compiled_model_only_where_it_measures_faster(
    eager_s, compiled_s, expected
):
    """``auto`` on CUDA compiled every run: on an H200 a full fine-tune with liger's fused kernels ran
    slower compiled by layers than eager (docs/benchmarks.md), after a compile of its own. Now the first
    micro-batch measures it there too, as on a CPU, and the faster one trains."""
    calls, compiled_models = [], []

    def compiler(model):
        compiled_models.append(Compiled(model))
        return compiled_models[-1]

    runtime, result = probe_runtime(
        cuda_runtime(),
        "auto",
        toy_model(),
        BATCH,
        compile_probe=CompileProbe("auto", LONG_RUN, compiler=compiler),
        measure=compile_timer(eager_s, compiled_s, calls),
    )
    assert runtime.precision == "bf16"  # CUDA's precision is settled at once, not measured
    assert runtime.compile is expected and result.record()["compile"] is expected
    assert (result.compiled is compiled_models[0]) if expected else result.compiled is None
    assert calls == ["eager", "compiled", "compiled"] + ["eager", "compiled"] * probe.ROUNDS
    assert "measured" in runtime.compile_choice and f"{eager_s / compiled_s:.2f}x" in runtime.compile_choice


@pytest.mark.parametrize(
    ("probe_kwargs", "run_kwargs", "expected", "reason"),
    [
        ({"micro_batches_left": 10}, {}, False, "would not repay"),  # a short run: eager, nothing compiled
        # a long run that train.max_minutes ends in 5 s: a compile of tens of seconds would eat the budget
        ({"seconds_left": 5.0}, {}, False, "left by train.max_minutes"),
        ({}, {"world_size": 2}, True, "several processes"),  # every rank alike, as before
        ({"mode": "reduce-overhead"}, {}, True, "reduce-overhead"),  # CUDA graphs need the compile
        # float8 may train (on, or auto where its rule allows): torchao's casts pay only compiled, and float8
        # auto is then measured through the compiled model (an eager run measured float8 slower on an H200)
        ({"float8": True}, {}, True, "float8"),
    ],
)
def test_auto_compile_on_cuda_is_not_compiled_for_nothing_nor_measured_where_a_rule_decides(
    probe_kwargs, run_kwargs, expected, reason
):
    calls = []

    def never(model, *args, **kwargs):
        raise AssertionError("compiled in the probe although a rule decides")

    probe_kwargs = {"micro_batches_left": LONG_RUN} | probe_kwargs
    runtime, result = probe_runtime(
        cuda_runtime(),
        "auto",
        toy_model(),
        BATCH,
        compile_probe=CompileProbe("auto", compiler=never, **probe_kwargs),
        measure=compile_timer(1.0, 0.5, calls),
        **run_kwargs,
    )
    assert runtime.compile is expected and result.compiled is None and reason in runtime.compile_choice
    assert calls == (["eager"] if reason in ("would not repay", "left by train.max_minutes") else [])


def test_the_measurement_leaves_the_gpus_random_streams_as_they_were(monkeypatch):
    """On CUDA the measured passes draw their dropout masks (LoRA's dropout, attention dropout) from the GPU's
    generators, which the probe did not put back: a run left on ``auto`` drew other masks than one set to
    what was measured. The GPU's streams are taken before and put back after, as the CPU's. (No GPU here:
    torch.cuda's generator calls are stand-ins; each measured pass draws from the "GPU" stream.)"""
    streams = {"gpu": ["state before"]}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(streams["gpu"]))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: streams.update(gpu=list(states)))

    def measure(model, batch, runtime):
        streams["gpu"].append("drawn by a measured pass")
        return 0.5 if isinstance(model, Compiled) else 1.0

    probe_runtime(
        cuda_runtime(),
        "auto",
        toy_model(),
        BATCH,
        compile_probe=CompileProbe("auto", LONG_RUN, compiler=Compiled),
        measure=measure,
    )
    assert streams["gpu"] == ["state before"]


def test_a_run_left_on_auto_compile_trains_with_the_compiled_model_it_measured(tmp_path, monkeypatch):
    """The loop trains with the very module the probe compiled (its compile time is not spent twice), and the
    run trains as an eager one (the fake compiler only wraps the model; compiled on CPU, ``auto`` attention
    trains on the additive-mask path, the eager run on SDPA: two kernels, so a tolerance)."""
    compiled_models = []

    def compiler(model, scope="model", mode="default"):
        assert mode == "default"  # train.runtime.compile_mode's default reaches the compiler
        compiled_models.append(Compiled(model, scope))
        return compiled_models[-1]

    seen = []
    monkeypatch.setattr(probe, "forward_backward_seconds", compile_timer(100.0, 50.0, [], real=True))
    monkeypatch.setattr(probe, "compile_module", compiler)
    monkeypatch.setattr(Compiled, "forward", lambda self, *a, **k: seen.append(1) or self._orig_mod(*a, **k))
    steps = {"max_steps": 6, "log_every": 1, "eval_every": None}
    auto = run_toy(toy_params(tmp_path / "auto", runtime={"precision": "fp32", "compile": "auto"}, **steps))
    eager = run_toy(toy_params(tmp_path / "eager", runtime={"precision": "fp32", "compile": False}, **steps))
    assert auto.runtime.compile is True and "measured" in auto.runtime.compile_choice
    # probe passes + every training step
    assert len(compiled_models) == 1 and len(seen) >= 6 + 2 + probe.ROUNDS
    assert auto.summary["attention"] == "eager" and eager.summary["attention"] == "sdpa"
    assert [r["loss"] for r in auto.history] == pytest.approx(
        [r["loss"] for r in eager.history], rel=TRAINED_FP32_LOSS_REL
    )
    assert eager.runtime.compile_choice == "set in train.runtime.compile"


def test_a_compiled_cpu_run_left_on_auto_attention_trains_on_the_additive_mask_path(tmp_path, monkeypatch):
    """Compiled on CPU, ``auto`` attention trains on the eager (additive-mask) path, measured so by the probe:
    every compiled call, the probe's included, runs on that path with an additive mask (a bool one would
    leak), and the model is back on SDPA when training ends."""
    from fastlm.engine.train.loop import train
    from tests.support.toy_training import EOS, toy_model, toy_sequences

    calls = []

    def recording_forward(self, *args, **kwargs):
        calls.append((self._orig_mod.config._attn_implementation, kwargs["attention_mask"].dtype))
        return self._orig_mod(*args, **kwargs)

    monkeypatch.setattr(probe, "forward_backward_seconds", compile_timer(100.0, 50.0, [], real=True))
    monkeypatch.setattr(probe, "compile_module", Compiled)
    monkeypatch.setattr(Compiled, "forward", recording_forward)
    params = toy_params(
        tmp_path, runtime={"precision": "fp32", "compile": "auto"}, max_steps=4, eval_every=None
    )
    model = toy_model()
    result = train(
        model,
        toy_sequences(300, 1),
        None,
        params=params,
        runtime=setup_runtime(params.runtime, seed=params.seed),
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
    )
    assert result.runtime.compile is True and result.summary["attention"] == "eager"
    assert len(calls) == 2 + probe.ROUNDS + 4  # the probe's compiled passes, then every training step
    assert all(path == "eager" and dtype.is_floating_point for path, dtype in calls)
    assert model.config._attn_implementation == "sdpa"

    explicit = toy_params(
        tmp_path / "explicit", runtime={"precision": "fp32", "compile": False}, max_steps=4, eval_every=None
    )
    explicit = explicit.model_copy(
        update={"model": explicit.model.model_copy(update={"attn_implementation": "eager"})}
    )
    eager = train(
        toy_model(),
        toy_sequences(300, 1),
        None,
        params=explicit,
        runtime=setup_runtime(explicit.runtime, seed=explicit.seed),
        pad_id=EOS,
        max_length=64,
        attn="eager",
    )
    # the same kernel reached by two set-ups (the probe's peeked batches rebuilt for it), not one computation
    # run twice: step 1 matches bit for bit, later steps differ by ~1e-8, so a tolerance
    assert [r["loss"] for r in result.history] == pytest.approx(
        [r["loss"] for r in eager.history], rel=TRAINED_FP32_LOSS_REL
    )


def test_timings_kept_on_one_gpu_do_not_decide_on_another_sharing_the_choices_file(tmp_path):
    """``runtime_choices.json`` lives in ``train.checkpoint_dir``, which a shared filesystem gives every
    node of a cluster: the compile timings an A100 node kept (compiled 1.25x faster) must not decide for an
    H100 node, where compiling measures slower, nor for another CUDA build; the same GPU and build take
    them, unmeasured."""
    from dataclasses import replace

    from fastlm.engine.runtime.remembered import RememberedChoices, choice_key

    choices = RememberedChoices(tmp_path / "runtime_choices.json")

    def settle(runtime, compiled_s: float):
        calls = []
        settled, _ = probe_runtime(
            runtime,
            "auto",
            toy_model(),
            BATCH,
            compile_probe=CompileProbe("auto", LONG_RUN, compiler=Compiled),
            measure=compile_timer(1.0, compiled_s, calls),
            choices=choices,
        )
        return settled, calls

    a100 = replace(cuda_runtime(), device_name="NVIDIA A100-SXM4-80GB", cuda_version="12.8")
    h100 = replace(a100, device_name="NVIDIA H100 80GB HBM3")
    assert choice_key(a100, toy_model(), BATCH) != choice_key(h100, toy_model(), BATCH)
    first, calls = settle(a100, 0.8)
    assert first.compile and calls
    other, calls = settle(h100, 1.05)
    assert not other.compile and calls and "kept from" not in other.compile_choice
    rebuilt, calls = settle(replace(a100, cuda_version="13.0"), 1.05)
    assert not rebuilt.compile and calls
    again, calls = settle(a100, 1.05)
    assert again.compile and "kept from" in again.compile_choice and "eager" not in calls
    assert "gpu" not in choice_key(cpu("fp32"), toy_model(), BATCH)  # a CPU's key as it was
