"""``runtime.precision: auto`` on a CPU: bf16 autocast only where the run's first micro-batch measures it
faster.

On CUDA ``runtime.resolve_precision`` settles ``auto`` at once (bf16 on GPUs with native bf16, fp16
otherwise). On a CPU bf16 autocast pays only with native bf16 instructions (AVX512-BF16 or AMX) *and* products
large enough for its kernels: 1.45x on the demo run's model, 1.7x on the 5.2 M-parameter causal benchmark, no
gain (slower once compiled) on a d_model-128 BART (docs/benchmarks.md). That is a property of the model, the
batch and the CPU together, so it is measured, not guessed: before the first step, the first micro-batch goes
forward and backward on the plain (uncompiled, unwrapped) model in fp32 and in bf16, one warm-up each, then
``ROUNDS`` alternated timed passes; bf16 is kept when its best time is at least ``MIN_SPEEDUP`` times faster
than fp32's.

The measurement leaves no trace: gradients are dropped and the random-number states (the CPU's, and the GPUs'
where CUDA is in use) are restored, so the run equals one with the chosen precision written in the parameters.
A micro-batch under ``MIN_STEP_SECONDS`` in fp32 keeps fp32 untried (too small to pay, too short to time). A
resumed run keeps what its checkpoint recorded; runs of several processes keep fp32 (every rank must compute
alike; set bf16 to choose it for all). The choice and the timings go into ``Runtime.precision_choice`` (an
MLflow parameter) and the log.

``runtime.compile: auto`` is settled the same way, after the precision, on a CPU and on CUDA: compiling costs
tens of seconds per batch shape (about 25 s for the 5.2 M-parameter benchmark model on 2 CPU cores), so it is
tried only when the run's remaining micro-batches take at least ``COMPILE_MIN_RUN_SECONDS`` eager (by the
first micro-batch's measured time). Then the first micro-batch runs compiled (the compile, then a warm-up) and
``ROUNDS`` alternated eager / compiled timed passes follow; the compiled model is kept, and trained with (its
compile is not paid twice), when its best time is at least ``COMPILE_MIN_SPEEDUP`` times faster. The timings
are kept in the run's choices file as the precision's are (``_KeptTimings``): the same command again decides
from them, unmeasured. Measured:
1.19x (tiny demo model) and 1.21-1.27x (5.2 M) real tokens per second on packed bf16 steps
(docs/benchmarks.md). On CUDA ``auto`` was a rule (compiled) until a full fine-tune with liger's fused kernels
ran no faster compiled by layers than eager on an H200 (two runs, docs/benchmarks.md, 2026-11-28): measured
there too now. A resumed run keeps its checkpoint's choice; runs of several processes stay eager on CPU and
compiled on CUDA (every rank alike) unless compile is set, and CUDA graphs (``compile_mode: reduce-overhead``)
are compiled, as is a CUDA run where float8 layers may train (``float8: on``, or ``auto`` where its rule
allows): torchao's float8 casts fuse only compiled, and float8 ``auto`` is then measured through the compiled
model. A compiled pass that fails under ``auto`` (a model or kernel the compiler cannot trace) leaves the run
eager, the layers compiled in place put back and the error named in the choice (``COMPILE_FAILED``, warned).

``train.runtime.float8: auto`` (CUDA) is measured the same way where ``float8.float8_decision``'s rule allows
it (compute capability 8.9+, torchao, hidden size 2048+): the first micro-batch runs, through the model that
will step (compiled when the run compiles: each variant is compiled once, in its warm-up), with the plain
Linear layers and then with float8 ones (``float8.Float8Swap``: converted once, then swapped, alternated over
``ROUNDS`` timed passes); float8 is kept when its best time is at least ``FLOAT8_MIN_SPEEDUP`` times faster,
else the original layers go back in. The best times are kept in the run's choices file, as compile's are
(under a key of the machine, model, micro-batch shape, precision and compile settings): the same command again
decides from them, unmeasured, where noise near the margin would flip it. A resumed run keeps its checkpoint's
choice; a run of several processes follows the rule (each rank would measure its own). Measured on an H200
(2026-11-28): the eager 3B full fine-tune ran slower in float8 (torchao's casts unfused without compile) and
kept its plain layers.

Measured and left out: pinning SDPA's math kernel on CPU. Its attention alone beats the default flash kernel
on short bf16 rows (64 tokens: 42 against 59 ms per layer), but whole steps gained 1.01x on the 5.2 M shape
and lost (0.80x) on the demo model.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from time import perf_counter

import torch

from fastlm.engine.model.accumulation import accumulate_gradients
from fastlm.engine.runtime import float8
from fastlm.engine.runtime.environment import Runtime
from fastlm.engine.runtime.regions import compile_in_scope, eager_stance, uncompile_layers
from fastlm.engine.runtime.remembered import RememberedChoices, choice_key

log = logging.getLogger(__name__)

MIN_SPEEDUP = 1.15  # bf16 must beat fp32 by this much (a margin above run-to-run noise) to be chosen
MIN_STEP_SECONDS = 0.2  # micro-batches faster than this keep their settings untried
ROUNDS = 2  # timed passes per candidate after its warm-up; the best counts
# compile auto: only for runs at least this long eager (compiling takes tens of seconds)
COMPILE_MIN_RUN_SECONDS = 300.0
COMPILE_MIN_SPEEDUP = 1.1  # the compiled model must beat eager by this much to be kept
FLOAT8_MIN_SPEEDUP = 1.1  # float8 matmuls must beat the plain layers by this much to be kept
FLOAT8_PASS_FAILED = "float8 auto: its first float8 pass failed"  # the choice's words (warned)
COMPILE_FAILED = "compile auto: its compiled pass failed"  # the choice's words (warned)
KEPT = "; kept from "  # a choice measured by an earlier run (engine.runtime.remembered): the choice's words

__all__ = [
    "COMPILE_FAILED",
    "COMPILE_MIN_RUN_SECONDS",
    "COMPILE_MIN_SPEEDUP",
    "FLOAT8_MIN_SPEEDUP",
    "MIN_SPEEDUP",
    "MIN_STEP_SECONDS",
    "CompileProbe",
    "Float8Probe",
    "ProbeResult",
    "compile_module",
    "cpu_has_native_bf16",
    "forward_backward_seconds",
    "probe_float8",
    "probe_runtime",
]

Measure = Callable[[torch.nn.Module, Mapping, Runtime], float]


@dataclass(frozen=True)
class ProbeResult:
    precision: str  # "bf16" | "fp16" | "fp32"
    reason: str  # one line, for the log and the run's parameters
    seconds: dict[str, float]  # best forward+backward time of the first micro-batch per measured precision
    compile: bool = False
    compile_reason: str = ""
    compiled: torch.nn.Module | None = field(default=None, compare=False)  # the model compiled and measured

    def record(self) -> dict:
        """What a checkpoint keeps, for a resumed run to train the same way."""
        return {"precision": self.precision, "compile": self.compile}


def compile_module(model: torch.nn.Module, scope: str = "model", mode: str = "default") -> torch.nn.Module:
    """The probe's compiled candidate (``regions.compile_in_scope``; with ``layers``, ``model`` itself)."""
    return compile_in_scope(model, scope, mode)


def cpu_has_native_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX512-BF16 or AMX tiles); emulated bf16 is slower than
    fp32."""
    checks = (
        getattr(torch.cpu, "_is_avx512_bf16_supported", None),
        getattr(torch.cpu, "_is_amx_tile_supported", None),
    )
    return any(bool(check()) for check in checks if check is not None)


def forward_backward_seconds(model: torch.nn.Module, batch: Mapping, runtime: Runtime) -> float:
    """Wall seconds of one forward and backward of ``batch`` with ``runtime``'s settings (gradients
    dropped). On CUDA the queued kernels are waited for at both ends: the launch alone times nothing."""
    _synchronize(runtime.device)
    start = perf_counter()
    accumulate_gradients(model, [batch], autocast=runtime.autocast_context)
    _synchronize(runtime.device)
    seconds = perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds


@dataclass(frozen=True)
class CompileProbe:
    """``train.runtime.compile`` and what settling ``auto`` needs, one object because they travel together.

    ``request``: the setting (True, False or "auto"); ``micro_batches_left``: what the run still trains (the
    compile decision weighs the compile time against it), ``seconds_left`` the time budget that may end it
    first (``train.max_minutes``: a compile of 33 s took a run asked to train 2 s); ``compiler``:
    ``torch.compile`` by default (``compile_module``, in ``scope``); ``batch`` / ``context``: the compiled
    candidate's own inputs (None: the probe's batch) and the context its passes run in (another attention
    path: ``attention.attention_when_compiled``), so the candidate measured is the one trained with;
    ``float8``: float8 layers may train (``float8: on``, or ``auto`` where its rule allows), and ``auto`` on
    CUDA then compiles (torchao's casts fuse only compiled; float8 ``auto`` is measured through the compiled
    model).
    """

    request: bool | str
    micro_batches_left: int = 0
    compiler: Callable[[torch.nn.Module], torch.nn.Module] | None = None
    seconds_left: float | None = None  # train.max_minutes: the run stops by then, whatever steps are left
    batch: Mapping | None = None
    context: Callable[[], contextlib.AbstractContextManager] | None = None
    scope: str = "model"  # train.runtime.compile_scope: what the default compiler compiles
    mode: str = "default"  # train.runtime.compile_mode: torch.compile's mode (reduce-overhead: CUDA graphs)
    float8: bool = False  # float8 layers may train (float8 on, or auto where its rule allows)
    # where the measured timings are kept (engine.runtime.remembered; None: measured every run): the same
    # command twice decides alike, where run-to-run noise would flip a speedup near the margin
    choices: RememberedChoices | None = None


def probe_runtime(
    runtime: Runtime,
    requested_precision: str,
    model: torch.nn.Module,
    batch: Mapping | None,
    *,
    world_size: int = 1,
    resumed: dict | None = None,
    measure: Measure | None = None,
    compile_probe: CompileProbe | None = None,
    choices: RememberedChoices | None = None,
) -> tuple[Runtime, ProbeResult]:
    """The runtime to train with, and why (see the module docstring).

    ``batch``: the run's first micro-batch, already on the device (None: nothing left to train). ``resumed``:
    what the resumed checkpoint recorded (``ProbeResult.record``), if anything. ``measure``: the timer
    (default ``forward_backward_seconds``). ``compile_probe``: ``train.runtime.compile`` and its inputs (None:
    the runtime's compile setting is left as it is). A compiled model that was kept comes back as
    ``ProbeResult.compiled`` (compiled from ``model``): train with it. ``choices``: the precision measured
    before for this machine, model and micro-batch shape is kept, and a new measurement kept there
    (``engine.runtime.remembered``; None: measured every run).
    """
    measure = measure or forward_backward_seconds
    result = _probe(
        runtime,
        requested_precision,
        model,
        batch,
        world_size=world_size,
        resumed=resumed,
        measure=measure,
        choices=choices,
    )
    if result.seconds or result.precision != runtime.precision or KEPT in result.reason:
        log.info("runtime.precision %s -> %s: %s", requested_precision, result.precision, result.reason)
    runtime = replace(runtime, precision=result.precision, precision_choice=result.reason)
    if compile_probe is None:
        return runtime, replace(result, compile=runtime.compile)
    if compile_probe.choices is None and choices is not None:  # the run's choices file, for both choices
        compile_probe = replace(compile_probe, choices=choices)
    compiled, reason, module = _compile_choice(
        runtime,
        model,
        batch,
        compile_probe,
        world_size=world_size,
        resumed=resumed,
        measured=result.seconds,
        measure=measure,
    )
    if compile_probe.request == "auto":
        level = logging.WARNING if reason.startswith(COMPILE_FAILED) else logging.INFO
        log.log(level, "runtime.compile auto -> %s: %s", "on" if compiled else "off", reason)
    return (
        replace(runtime, compile=compiled, compile_choice=reason),
        replace(result, compile=compiled, compile_reason=reason, compiled=module),
    )


def _compile_choice(
    runtime: Runtime,
    model,
    batch,
    probe: CompileProbe,
    *,
    world_size: int,
    resumed: dict | None,
    measured: dict,
    measure: Measure,
) -> tuple[bool, str, torch.nn.Module | None]:
    requested = probe.request
    if requested != "auto":
        return bool(requested), "set in train.runtime.compile", None
    on_cuda = runtime.device.type == "cuda"
    if on_cuda and probe.mode == "reduce-overhead":
        return True, "auto on CUDA with compile_mode reduce-overhead: compiled (CUDA graphs need it)", None
    if on_cuda and probe.float8:
        return True, "auto on CUDA where float8 layers may train: compiled (torchao's casts fuse there)", None
    if resumed and isinstance(resumed.get("compile"), bool):
        return resumed["compile"], "auto: kept from the resumed checkpoint, which trained so", None
    if world_size > 1 and on_cuda:
        return True, "auto on CUDA in a run of several processes: compiled (every rank alike)", None
    if world_size > 1:
        return (
            False,
            "auto in a run of several CPU processes stays eager (set true to compile on every rank)",
            None,
        )
    if batch is None:
        return False, "auto: nothing left to train, nothing measured", None
    compiled_batch = batch if probe.batch is None else probe.batch
    compiled_context = probe.context or contextlib.nullcontext
    kept = _KeptTimings.of(probe, runtime, model, batch)
    with _no_trace(model):
        eager = kept.seconds.get("eager") or measured.get(runtime.precision) or measure(model, batch, runtime)
        left, budget = eager * probe.micro_batches_left, ""
        if probe.seconds_left is not None and probe.seconds_left < left:  # the time budget ends it first
            left, budget = probe.seconds_left, " by train.max_minutes"
        if left < COMPILE_MIN_RUN_SECONDS:
            kept.keep({"eager": eager})
            return (
                False,
                (
                    f"auto: about {left:.0f} s of training left{budget} ({eager:.3f} s per micro-batch "
                    "eager); "
                    f"compiling (tens of seconds per batch shape) would not repay under "
                    f"{COMPILE_MIN_RUN_SECONDS:.0f} s"
                )
                + kept.said(),
                None,
            )
        compiled = probe.compiler(model) if probe.compiler else compile_module(model, probe.scope, probe.mode)
        if {"eager_best", "compiled"} <= kept.seconds.keys():  # an earlier run's: decided as it decided
            best = {"eager": kept.seconds["eager_best"], "compiled": kept.seconds["compiled"]}
            return _compiled_or_eager(model, compiled, best, kept.seconds.get("compile", 0.0), kept.said())

        def eager_pass() -> float:
            with eager_stance():  # layers compiled in place run eagerly here
                return measure(model, batch, runtime)

        def compiled_pass() -> float:
            with compiled_context():
                return measure(compiled, compiled_batch, runtime)

        try:
            start = perf_counter()
            compiled_pass()  # compiles
            compile_seconds = perf_counter() - start
            compiled_pass()  # warm-up
            best = _alternated_best({"eager": eager_pass, "compiled": compiled_pass})
        except Exception as error:  # auto compiles only where it pays: one that cannot compile trains eager
            uncompile_layers(model)
            first = str(error).splitlines()[0] if str(error) else ""
            reason = f"{COMPILE_FAILED} ({type(error).__name__}: {first}): eager, the model as it was"
            return False, reason, None
    kept.keep(
        {
            "eager": eager,
            "eager_best": best["eager"],
            "compiled": best["compiled"],
            "compile": compile_seconds,
        }
    )
    return _compiled_or_eager(model, compiled, best, compile_seconds, "")


def _compiled_or_eager(
    model, compiled, best: dict[str, float], compile_seconds: float, kept: str
) -> tuple[bool, str, torch.nn.Module | None]:
    """The compiled candidate where its best time beats eager's by ``COMPILE_MIN_SPEEDUP``, else eager (the
    layers compiled in place put back); why, in words (``kept``: where the timings came from)."""
    speedup = best["eager"] / best["compiled"]
    reason = (
        f"auto, measured on the first micro-batch: eager {best['eager']:.3f} s, compiled "
        f"{best['compiled']:.3f} s ({speedup:.2f}x; compiled needs {COMPILE_MIN_SPEEDUP}x; compiling took "
        f"{compile_seconds:.0f} s){kept}"
    )
    if speedup >= COMPILE_MIN_SPEEDUP:
        return True, reason, compiled
    uncompile_layers(model)  # scope layers compiled them in place: eager again
    return False, reason, None


@dataclass
class _KeptTimings:
    """The compile probe's timings an earlier run kept for this machine, model, micro-batch shape, precision
    and compile scope and mode (``seconds``: ``eager``, the first pass's, which weighs the run's length, and
    where it measured the compiled candidate ``eager_best``, ``compiled`` and ``compile``; empty: none), and
    where this run's new ones go (``keep``: those kept before stay as they were): as
    ``runtime.precision: auto``'s choice, so that noise near ``COMPILE_MIN_SPEEDUP`` or
    ``COMPILE_MIN_RUN_SECONDS`` cannot train the same command once compiled and once eager, with other
    losses."""

    choices: RememberedChoices | None = None
    key: dict | None = None
    seconds: dict = field(default_factory=dict)
    measured: str | None = None

    @classmethod
    def of(cls, probe: CompileProbe, runtime: Runtime, model, batch) -> _KeptTimings:
        if probe.choices is None:
            return cls()
        key = {
            **choice_key(runtime, model, batch),
            "compile": {"precision": runtime.precision, "scope": probe.scope, "mode": probe.mode},
        }
        earlier = probe.choices.get(key) or {}
        timings = earlier.get("compile_seconds")
        valid = isinstance(timings, dict) and all(
            isinstance(value, int | float) and math.isfinite(value) and value >= 0
            for value in timings.values()
        )
        seconds = dict(timings) if valid and timings.get("eager", 0) > 0 else {}
        return cls(probe.choices, key, seconds, earlier.get("measured") if seconds else None)

    def keep(self, seconds: dict) -> None:
        """Keep this run's timings beside those kept before, which stay (nothing new: nothing written)."""
        merged = {**seconds, **self.seconds}
        if self.choices is not None and merged != self.seconds:
            self.choices.put(self.key, {"compile_seconds": merged})

    def said(self) -> str:
        """Where the timings came from, for the choice's words ("" where this run measured them)."""
        if self.measured is None:
            return ""
        return (
            f"{KEPT}{self.choices.path} (timed {self.measured} on this machine for this model and "
            "micro-batch shape; delete it to measure again)"
        )


def _probe(
    runtime: Runtime,
    requested: str,
    model,
    batch,
    *,
    world_size: int,
    resumed: dict | None,
    measure: Measure,
    choices: RememberedChoices | None,
) -> ProbeResult:
    if requested != "auto":
        return ProbeResult(runtime.precision, "set in train.runtime.precision", {})
    if runtime.device.type != "cpu":
        return ProbeResult(
            runtime.precision, "auto on CUDA: bf16 where the GPU has it natively, else fp16", {}
        )
    if resumed and resumed.get("precision") in ("bf16", "fp32"):
        return ProbeResult(
            resumed["precision"], "auto: kept from the resumed checkpoint, which trained in it", {}
        )
    if world_size > 1:
        return ProbeResult(
            "fp32", "auto in a run of several CPU processes keeps fp32 (set bf16 to use it)", {}
        )
    if not cpu_has_native_bf16():
        return ProbeResult("fp32", "auto: this CPU has no native bf16 (AVX512-BF16 or AMX)", {})
    if batch is None:
        return ProbeResult("fp32", "auto: nothing left to train, nothing measured", {})
    key = choice_key(runtime, model, batch) if choices is not None else None
    earlier = choices.get(key) if choices is not None else None
    if earlier is not None and earlier.get("precision") in ("bf16", "fp32"):
        return ProbeResult(
            earlier["precision"],
            f"{earlier.get('reason')}{KEPT}{choices.path} (measured {earlier.get('measured')} on this "
            "machine for this model and micro-batch shape; delete it to measure again)",
            {},
        )
    with _no_trace(model):
        result = _measure(runtime, model, batch, measure)
    if choices is not None:
        choices.put(key, {"precision": result.precision, "reason": result.reason})
    return result


@contextlib.contextmanager
def _no_trace(model: torch.nn.Module):
    """Measured passes leave no trace: the random streams (dropout draws: the CPU's, and the GPUs' where CUDA
    is in use) and the gradients as they were."""
    rng = torch.random.get_rng_state()
    on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    cuda_rng = torch.cuda.get_rng_state_all() if on_cuda else None
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def _measure(runtime: Runtime, model, batch, measure: Measure) -> ProbeResult:
    fp32, bf16 = replace(runtime, precision="fp32"), replace(runtime, precision="bf16")
    first = measure(model, batch, fp32)  # also fp32's warm-up (one-off allocations)
    if first < MIN_STEP_SECONDS:
        return ProbeResult(
            "fp32",
            f"auto: the first micro-batch takes {first:.3f} s in fp32 (under "
            f"{MIN_STEP_SECONDS} s: too small for bf16 to pay)",
            {"fp32": first},
        )
    measure(model, batch, bf16)  # warm-up
    seconds = _alternated_best(
        {"fp32": lambda: measure(model, batch, fp32), "bf16": lambda: measure(model, batch, bf16)}
    )
    speedup = seconds["fp32"] / seconds["bf16"]
    chosen = "bf16" if speedup >= MIN_SPEEDUP else "fp32"
    return ProbeResult(
        chosen,
        f"auto, measured on the first micro-batch: fp32 {seconds['fp32']:.3f} s, bf16 "
        f"{seconds['bf16']:.3f} s ({speedup:.2f}x; bf16 needs {MIN_SPEEDUP}x)",
        seconds,
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Float8Probe:
    """``train.runtime.float8`` and what settling ``auto`` needs.

    ``request``: the setting (off | on | auto; under FSDP2 what was settled before sharding); ``strategy``:
    ``train.distributed.strategy``; ``applied``: what ``float8.apply_float8`` said when the optimizer was
    made (the reason kept where nothing is measured); ``stepping``: the model the timed passes run through
    (the compiled one; None: the raw model); ``converter``: torchao's ``convert_to_float8_training`` by
    default; ``row_length``: packed rows of a length the user set (``float8.float8_decision``).
    """

    request: str
    strategy: str = "ddp"
    applied: str = ""
    stepping: torch.nn.Module | None = field(default=None, compare=False)
    converter: Callable | None = None
    row_length: int | None = None
    # where the measured timings are kept (engine.runtime.remembered; None: measured every run), as
    # CompileProbe's: the same command twice decides alike where noise would flip a speedup near the margin
    choices: RememberedChoices | None = None


def probe_float8(
    runtime: Runtime,
    model: torch.nn.Module,
    batch: Mapping | None,
    probe: Float8Probe,
    *,
    world_size: int = 1,
    resumed: dict | None = None,
    measure: Measure | None = None,
) -> Runtime:
    """``runtime`` with ``float8`` and ``float8_choice`` settled (see the module docstring); ``model`` (the
    raw model, made with ``apply_float8(measured_later=True)``) converted in place where float8 is kept.
    ``resumed``: the checkpoint's record (``"float8"``), if any."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    on, rule = float8.float8_decision(
        probe.request, base, runtime.device, strategy=probe.strategy, row_length=probe.row_length
    )
    if probe.request != "auto" or not on:
        return replace(runtime, float8=on, float8_choice=probe.applied or rule)
    if resumed and isinstance(resumed.get("float8"), bool):
        keep, reason = resumed["float8"], "float8 auto: kept from the resumed checkpoint, which trained so"
        swap = float8.Float8Swap(model, probe.converter) if keep else None
    elif world_size > 1:
        keep, reason = True, f"{rule}; a run of several processes follows the rule (each rank would measure)"
        swap = float8.Float8Swap(model, probe.converter)
    elif batch is None:
        keep, reason, swap = False, "float8 auto: nothing left to train, nothing measured", None
    else:
        keep, reason, swap = _kept_or_measured_float8(
            runtime, model, batch, probe, measure or forward_backward_seconds
        )
    if keep:
        reason = f"{reason}: on, {len(swap)} Linear layers in float8"
    level = logging.WARNING if reason.startswith(FLOAT8_PASS_FAILED) else logging.INFO
    log.log(level, "train.runtime.float8 auto -> %s: %s", "on" if keep else "off", reason)
    return replace(runtime, float8=keep, float8_choice=reason)


def _kept_or_measured_float8(
    runtime: Runtime, model: torch.nn.Module, batch: Mapping, probe: Float8Probe, measure: Measure
) -> tuple[bool, str, float8.Float8Swap | None]:
    """``_measure_float8``'s choice, kept in ``probe.choices`` (its best times, under a key of the machine,
    model, micro-batch shape, precision and compile settings), or the one such kept times decide, unmeasured
    (the layers converted where they keep float8). A failed float8 pass keeps nothing: the next run measures
    again."""
    if probe.choices is None:
        return _measure_float8(runtime, model, batch, probe, measure)[:3]
    key = {
        **choice_key(runtime, model, batch),
        "float8": {
            "precision": runtime.precision,
            "compile": runtime.compile,
            "scope": runtime.compile_scope,
            "mode": runtime.compile_mode,
        },
    }
    earlier = probe.choices.get(key) or {}
    timings = earlier.get("float8_seconds")
    if isinstance(timings, dict) and all(
        isinstance(timings.get(name), int | float) and math.isfinite(timings[name]) and timings[name] > 0
        for name in ("plain", "fp8")
    ):
        keep, reason = _float8_or_plain(runtime.precision, timings["plain"], timings["fp8"])
        reason += (
            f"{KEPT}{probe.choices.path} (timed {earlier.get('measured')} on this machine for this model and "
            "micro-batch shape; delete it to measure again)"
        )
        return keep, reason, float8.Float8Swap(model, probe.converter) if keep else None
    keep, reason, swap, best = _measure_float8(runtime, model, batch, probe, measure)
    if best:
        probe.choices.put(key, {"float8_seconds": best})
    return keep, reason, swap


def _float8_or_plain(plain: str, plain_s: float, fp8_s: float) -> tuple[bool, str]:
    """float8 where its best time beats the plain layers' by ``FLOAT8_MIN_SPEEDUP``; why, in words."""
    speedup = plain_s / fp8_s
    reason = (
        f"float8 auto, measured on the first micro-batch: fp8 {fp8_s:.3f} s vs {plain} "
        f"{plain_s:.3f} s ({speedup:.2f}x; float8 needs {FLOAT8_MIN_SPEEDUP}x)"
    )
    return speedup >= FLOAT8_MIN_SPEEDUP, reason


def _measure_float8(
    runtime: Runtime, model: torch.nn.Module, batch: Mapping, probe: Float8Probe, measure: Measure
) -> tuple[bool, str, float8.Float8Swap, dict[str, float]]:
    """The plain layers' warm-up, one conversion and the float8 warm-up, then alternated timed rounds; the
    plain layers put back unless float8 is faster by ``FLOAT8_MIN_SPEEDUP``. A pass that fails with the
    float8 layers in turns float8 off, the error named (auto promises float8 only where it pays; the plain
    layers train); one that fails with the plain layers raises, the plain layers back in the model. The best
    times (``plain`` and ``fp8``; none where a float8 pass failed) come last."""
    stepping = probe.stepping if probe.stepping is not None else model
    plain = runtime.precision
    swap = None
    with _no_trace(model):
        try:
            measure(stepping, batch, runtime)  # the plain layers' warm-up (and compile)
            swap = float8.Float8Swap(model, probe.converter)
            measure(stepping, batch, runtime)  # float8's warm-up (and compile)

            def timed(on: bool) -> Callable[[], float]:
                def run() -> float:
                    swap.use(on)
                    return measure(stepping, batch, runtime)

                return run

            best = _alternated_best({"plain": timed(False), "fp8": timed(True)})
        except Exception as error:
            in_float8 = swap is not None and swap.converted
            if swap is not None:
                swap.use(False)
            if not in_float8:
                raise
            first = str(error).splitlines()[0] if str(error) else ""
            failed = f"{FLOAT8_PASS_FAILED} ({type(error).__name__}: {first})"
            return False, f"{failed}: off, the original layers put back", swap, {}
        except BaseException:  # Ctrl-C and the like: the plain layers back, and on its way
            if swap is not None:
                swap.use(False)
            raise
    keep, reason = _float8_or_plain(plain, best["plain"], best["fp8"])
    swap.use(keep)
    return keep, reason if keep else f"{reason}: off, the original layers put back", swap, best


def _alternated_best(candidates: dict[str, Callable[[], float]]) -> dict[str, float]:
    """The best time of each candidate over ``ROUNDS`` rounds, the candidates alternated within each round."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(ROUNDS):
        for name, timed in candidates.items():
            times[name].append(timed())
    return {name: min(values) for name, values in times.items()}
