"""``runtime.precision: auto`` on a CPU: bf16 autocast only where the run's first micro-batch measures it faster.

On CUDA ``runtime.resolve_precision`` settles ``auto`` at once (bf16 on GPUs with native bf16, fp16 otherwise).
On a CPU bf16 autocast pays only with native bf16 instructions (AVX512-BF16 or AMX) *and* products large enough
for its kernels: 1.45x on the demo run's model, 1.7x on the 5.2 M-parameter causal benchmark, no gain (slower once
compiled) on a d_model-128 BART (docs/benchmarks.md). That is a property of the model, the batch and the CPU
together, so it is measured, not guessed: before the first step, the first micro-batch goes forward and backward
on the plain (uncompiled, unwrapped) model in fp32 and in bf16, one warm-up each, then ``ROUNDS`` alternated
timed passes; bf16 is kept when its best time is at least ``MIN_SPEEDUP`` times faster than fp32's.

The measurement leaves no trace: gradients are dropped and the random-number state is restored, so the run equals
one with the chosen precision written in the parameters. A micro-batch under ``MIN_STEP_SECONDS`` in fp32 keeps
fp32 untried (too small to pay, too short to time). A resumed run keeps what its checkpoint recorded; runs of
several processes keep fp32 (every rank must compute alike; set bf16 to choose it for all). The choice and the
timings go into ``Runtime.precision_choice`` (an MLflow parameter) and the log.

Measured and left out: pinning SDPA's math kernel on CPU. Its attention alone beats the default flash kernel on
short bf16 rows (64 tokens: 42 against 59 ms per layer), but whole steps gained 1.01x on the 5.2 M shape and lost
(0.80x) on the demo model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from time import perf_counter

import torch

from fastlm.engine.loss import accumulate_gradients
from fastlm.engine.runtime import Runtime

log = logging.getLogger(__name__)

MIN_SPEEDUP = 1.15  # bf16 must beat fp32 by this much (a margin above run-to-run noise) to be chosen
MIN_STEP_SECONDS = 0.2  # micro-batches faster than this keep their settings untried
ROUNDS = 2  # timed passes per candidate after its warm-up; the best counts

__all__ = ["MIN_SPEEDUP", "MIN_STEP_SECONDS", "ProbeResult", "cpu_has_native_bf16",
           "forward_backward_seconds", "probe_runtime"]

Measure = Callable[[torch.nn.Module, Mapping, Runtime], float]


@dataclass(frozen=True)
class ProbeResult:
    precision: str  # "bf16" | "fp16" | "fp32"
    reason: str  # one line, for the log and the run's parameters
    seconds: dict[str, float]  # best forward+backward time of the first micro-batch per measured precision

    def record(self) -> dict:
        """What a checkpoint keeps, for a resumed run to train the same way."""
        return {"precision": self.precision}


def cpu_has_native_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX512-BF16 or AMX tiles); emulated bf16 is slower than fp32."""
    checks = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(bool(check()) for check in checks if check is not None)


def forward_backward_seconds(model: torch.nn.Module, batch: Mapping, runtime: Runtime) -> float:
    """Wall seconds of one forward and backward of ``batch`` with ``runtime``'s settings (gradients dropped)."""
    start = perf_counter()
    accumulate_gradients(model, [batch], autocast=runtime.autocast_context)
    seconds = perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds


def probe_runtime(runtime: Runtime, requested_precision: str, model: torch.nn.Module, batch: Mapping | None, *,
                  world_size: int = 1, resumed: dict | None = None,
                  measure: Measure | None = None) -> tuple[Runtime, ProbeResult]:
    """The runtime to train with, and why (see the module docstring).

    ``batch``: the run's first micro-batch, already on the device (None: nothing left to train). ``resumed``: what
    the resumed checkpoint recorded (``ProbeResult.record``), if anything. ``measure``: the timer (default
    ``forward_backward_seconds``).
    """
    result = _probe(runtime, requested_precision, model, batch, world_size=world_size, resumed=resumed,
                    measure=measure or forward_backward_seconds)
    if result.seconds or result.precision != runtime.precision:
        log.info("runtime.precision %s -> %s: %s", requested_precision, result.precision, result.reason)
    return replace(runtime, precision=result.precision, precision_choice=result.reason), result


def _probe(runtime: Runtime, requested: str, model, batch, *, world_size: int, resumed: dict | None,
           measure: Measure) -> ProbeResult:
    if requested != "auto":
        return ProbeResult(runtime.precision, "set in train.runtime.precision", {})
    if runtime.device.type != "cpu":
        return ProbeResult(runtime.precision, "auto on CUDA: bf16 where the GPU has it natively, else fp16", {})
    if resumed and resumed.get("precision") in ("bf16", "fp32"):
        return ProbeResult(resumed["precision"], "auto: kept from the resumed checkpoint, which trained in it", {})
    if world_size > 1:
        return ProbeResult("fp32", "auto in a run of several CPU processes keeps fp32 (set bf16 to use it)", {})
    if not cpu_has_native_bf16():
        return ProbeResult("fp32", "auto: this CPU has no native bf16 (AVX512-BF16 or AMX)", {})
    if batch is None:
        return ProbeResult("fp32", "auto: nothing left to train, nothing measured", {})
    rng = torch.random.get_rng_state()  # dropout draws: the training run must not see the measurement
    was_training = model.training
    model.train()
    try:
        return _measure(runtime, model, batch, measure)
    finally:
        torch.random.set_rng_state(rng)
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def _measure(runtime: Runtime, model, batch, measure: Measure) -> ProbeResult:
    fp32, bf16 = replace(runtime, precision="fp32"), replace(runtime, precision="bf16")
    first = measure(model, batch, fp32)  # also fp32's warm-up (one-off allocations)
    if first < MIN_STEP_SECONDS:
        return ProbeResult("fp32", f"auto: the first micro-batch takes {first:.3f} s in fp32 (under "
                                   f"{MIN_STEP_SECONDS} s: too small for bf16 to pay)", {"fp32": first})
    measure(model, batch, bf16)  # warm-up
    times = {"fp32": [], "bf16": []}
    for _ in range(ROUNDS):
        times["fp32"].append(measure(model, batch, fp32))
        times["bf16"].append(measure(model, batch, bf16))
    seconds = {name: min(values) for name, values in times.items()}
    speedup = seconds["fp32"] / seconds["bf16"]
    chosen = "bf16" if speedup >= MIN_SPEEDUP else "fp32"
    return ProbeResult(chosen, f"auto, measured on the first micro-batch: fp32 {seconds['fp32']:.3f} s, bf16 "
                               f"{seconds['bf16']:.3f} s ({speedup:.2f}x; bf16 needs {MIN_SPEEDUP}x)", seconds)
