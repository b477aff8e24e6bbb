"""What limits a run's speed: a few conservative rules over ``train_summary.json`` and the history.

``diagnose`` returns one :class:`Finding` per rule, triggered or not, so a report can show which checks
passed. The rules, in order (thresholds are the module constants below):

* ``input-bound`` -- the training loop waits for the DataLoader: ``data_wait_share`` (the run's total wait
  over its steps' own time, as ``efficiency_summary.csv`` shows it) is at least ``INPUT_BOUND_SHARE``.
* ``padding-bound`` -- much of the computed tokens is padding: ``padding_efficiency`` (the run's real over
  computed tokens) is below ``PADDING_BOUND_EFFICIENCY``.
* ``host-sync-bound`` -- CUDA only: measured where the run recorded a GPU profile (the GPU waiting for the
  host at least ``HOST_BOUND_IDLE_SHARE`` of the profiled window), else see :func:`_host_sync_bound` for
  the heuristic.
* ``memory-saturated`` -- peak memory is at least ``MEMORY_SATURATED_SHARE`` of the device memory *and*
  step time rises over the run (allocator thrashing, fragmentation, swapping): both are needed; full memory
  over fewer than 3 timed logging windows (no thirds to compare) is not judged. The advice
  names the memory levers the run's own decisions show it left unused (``_unused_memory_levers``).
* ``eval-bound`` -- the evaluations and checkpoint saves between steps (``outside_steps_s``) took at least
  ``EVAL_BOUND_SHARE`` of the run's wall time: their cadence, not the steps' math, sets the pace. The advice:
  raise ``train.eval_every`` and ``train.save_every`` (or cap ``train.eval_max_batches``).
* ``compile-bound`` -- a compiled run spent at least ``COMPILE_BOUND_SHARE`` of its wall time compiling
  (the summary's ``compile_s``, recompiles and ``compile: auto``'s probe included; a summary without it:
  the first step, compile included): a start-up cost, so it does not keep the steady state from being
  compute-bound. The advice: ``train.runtime.compile_scope: layers`` where the whole model was compiled,
  else a run this short does not repay compiling.
* ``recompile-limit`` -- a compiled run reached ``torch._dynamo.config.recompile_limit`` (the summary's
  ``recompile_limit_hit``): the functions it names ran eagerly for the rest of the run, compiled in name
  only and slower than compiled, a steady-state cost (judged from any step). The advice: the run's warning's
  fix (fewer micro-batch shapes, compile off, or a higher limit).
* ``compute-bound`` -- none of the steady-state rules above, over at least ``MIN_TIMED_STEPS`` timed steps
  (a shorter run concludes nothing and says how long a run is needed): the run spends its time in the
  math, as it should. On a GPU its advice names the speed levers the run's own decisions show it left unused
  (``_unused_speed_levers``: precision, compile, liger's kernels or float8 missing their package, bf16
  weights with fp32 masters where a full fine-tune kept fp32 weights, memory headroom), or says none was.

Everything is measured after the warm-up rows (step 1, and each resumed process's first step), except the
memory peak. Missing keys or columns (older runs) make a rule not trigger, with "n/a" as its figure.

A run of fewer than ``MIN_TIMED_STEPS`` timed steps (``train.max_steps=2``: one) is too short for any verdict
from step timing: ``input-bound``, ``host-sync-bound``, ``eval-bound`` (its final validation and save, which
every run has, would read as the cadence), ``memory-saturated`` where the memory is full (its rising step
time), ``compute-bound`` and :func:`epoch_eta` say so (``NOT_JUDGED``) instead. Judged from any step:
``padding-bound`` (real over computed tokens: counts, not time), ``memory-saturated`` below its threshold (no
rise needed) and ``compile-bound`` (the first step's share of the wall time: a start-up cost).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

from fastlm.engine.observe.rates import timed_windows
from fastlm.reporting.summaries import TRAINING_ID, after_warmup, numeric, throughput

log = logging.getLogger(__name__)

__all__ = [
    "COMPILE_BOUND",
    "COMPILE_BOUND_SHARE",
    "COMPUTE_BOUND",
    "EVAL_BOUND",
    "EVAL_BOUND_SHARE",
    "HOST_BOUND_IDLE_SHARE",
    "HOST_SYNC_BOUND",
    "HOST_SYNC_LOW_DATA_WAIT_SHARE",
    "HOST_SYNC_MAX_MFU",
    "HOST_SYNC_MIN_PADDING_EFFICIENCY",
    "HOST_SYNC_SPIKE_RATIO",
    "INPUT_BOUND",
    "INPUT_BOUND_SHARE",
    "MEMORY_SATURATED",
    "MEMORY_SATURATED_SHARE",
    "MIN_TIMED_STEPS",
    "NOT_JUDGED",
    "PADDING_BOUND",
    "PADDING_BOUND_EFFICIENCY",
    "RECOMPILE_LIMIT",
    "ROOMY_SHARE",
    "STEP_TIME_RISE_RATIO",
    "Finding",
    "diagnose",
    "epoch_eta",
    "format_duration",
]

INPUT_BOUND = "input-bound"
PADDING_BOUND = "padding-bound"
HOST_SYNC_BOUND = "host-sync-bound"
MEMORY_SATURATED = "memory-saturated"
EVAL_BOUND = "eval-bound"
COMPILE_BOUND = "compile-bound"
RECOMPILE_LIMIT = "recompile-limit"
COMPUTE_BOUND = "compute-bound"

#: compute-bound on a GPU: a peak memory below this share of the device leaves room for bigger micro-batches.
ROOMY_SHARE = 0.5
#: input-bound when the share of the steps' time spent blocked on the DataLoader reaches this.
INPUT_BOUND_SHARE = 0.10
#: padding-bound when the share of real (non-padding) tokens among computed tokens is below this.
PADDING_BOUND_EFFICIENCY = 0.80
#: host-sync: a GPU profile (train.profile) measured the GPU waiting for the host at least this share of its
#: window (engine/observe/gpu_idle.py): the measured signal, where a run recorded one.
HOST_BOUND_IDLE_SHARE = 0.10
#: host-sync: the median over windows of (slowest step / mean step) that reads as periodic stalls.
HOST_SYNC_SPIKE_RATIO = 3.0
#: host-sync: MFU below this, with the input and padding ruled out, reads as host overhead.
HOST_SYNC_MAX_MFU = 0.15
#: host-sync needs the data wait this low (stricter than INPUT_BOUND_SHARE: conservative).
HOST_SYNC_LOW_DATA_WAIT_SHARE = 0.05
#: host-sync by MFU needs the padding efficiency this high (padding would explain a low MFU otherwise).
HOST_SYNC_MIN_PADDING_EFFICIENCY = 0.90
#: memory-saturated: peak memory at least this share of the device memory (GPU total, or host RAM on CPU).
MEMORY_SATURATED_SHARE = 0.90
#: memory-saturated: mean step time of the last third of windows at least this times the first third's.
STEP_TIME_RISE_RATIO = 1.15
#: eval-bound: the evaluations and saves between steps took at least this share of the run's wall time.
EVAL_BOUND_SHARE = 0.25
#: compile-bound: the first step (compile included) took at least this share of the run's wall time.
COMPILE_BOUND_SHARE = 0.25
#: compute-bound is concluded from at least this many timed optimizer steps (the warm-up steps left out:
#: step 1, and each resumed process's first).
MIN_TIMED_STEPS = 5
#: how the message of a rule that judged nothing (too few timed steps) begins: the report shows it so.
NOT_JUDGED = "too few steps to judge"

_NA = "n/a"


@dataclass(frozen=True)
class Finding:
    """One rule's verdict: ``figure`` is the measured figure it judged, formatted ("34 %")."""

    kind: str
    triggered: bool
    figure: str
    message: str
    advice: str


def _mean(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.mean()) if len(values) else math.nan


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _measured(summary: dict, timed: pd.DataFrame, column: str) -> float:
    """The run's figure over its single steps (the summary's: total data wait over the steps' own time, total
    real over computed tokens), the one ``efficiency_summary.csv`` shows; a summary without it (an older run)
    falls back to the mean of ``column`` over the windows after warm-up (whose wall clock holds the
    validations and saves); else NaN."""
    if _known(summary.get(column)):
        return float(summary[column])
    return _mean(numeric(timed, column))


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def _is_cuda(summary: dict) -> bool:
    return str((summary.get("runtime") or {}).get("device") or "").startswith("cuda")


def _input_bound(summary: dict, timed: pd.DataFrame) -> Finding:
    share = _measured(summary, timed, "data_wait_share")
    if math.isnan(share):
        return Finding(INPUT_BOUND, False, _NA, "the data wait was not measured", "")
    figure = _percent(share)
    if share < INPUT_BOUND_SHARE:
        return Finding(
            INPUT_BOUND,
            False,
            figure,
            f"data wait is {figure} of step time (below {_percent(INPUT_BOUND_SHARE)})",
            "",
        )
    workers = summary.get("dataloader_workers")
    if not _known(workers):
        advice = "raise train.dataloader.num_workers (e.g. to 4)"
    elif int(workers) == 0:
        advice = "raise train.dataloader.num_workers from 0 (loading in the training process) to 2"
    else:
        advice = f"raise train.dataloader.num_workers from {int(workers)} to {max(2, 2 * int(workers))}"
    if _is_cuda(summary):
        advice += (
            "; keep train.dataloader.pin_memory on and raise train.dataloader.prefetch_factor "
            "so batches are ready and copied asynchronously"
        )
    return Finding(INPUT_BOUND, True, figure, f"data wait is {figure} of step time", advice)


# Which mode is faster depends on the model, the data and the device (packed rows attend over whole rows on
# the CPU's masked kernels; length_grouped pads): the tune pipeline measures both on the run's own data
_MODES_MEASURED = (
    "; `kedro run --pipeline=tune` measures packed and length_grouped on this data and device "
    "(tune.modes) and writes the faster"
)


def _padding_bound(summary: dict, timed: pd.DataFrame) -> Finding:
    efficiency = _measured(summary, timed, "padding_efficiency")
    if math.isnan(efficiency):
        return Finding(PADDING_BOUND, False, _NA, "the padding efficiency was not measured", "")
    figure = _percent(efficiency)
    if efficiency >= PADDING_BOUND_EFFICIENCY:
        return Finding(
            PADDING_BOUND,
            False,
            figure,
            f"{figure} of the computed tokens are real (at least {_percent(PADDING_BOUND_EFFICIENCY)})",
            "",
        )
    mode = summary.get("batching")
    if mode == "packed":
        advice = _packed_padding_advice(summary)
    elif mode == "length_grouped":
        advice = f"switch train.batching.mode from length_grouped to packed{_MODES_MEASURED}"
    elif mode:
        advice = f"switch train.batching.mode from {mode} to packed (or length_grouped){_MODES_MEASURED}"
    else:
        advice = f"switch train.batching.mode to packed (or length_grouped){_MODES_MEASURED}"
    return Finding(
        PADDING_BOUND,
        True,
        figure,
        f"only {figure} of the computed tokens are real: the rest is padding",
        advice,
    )


def _packed_padding_advice(summary: dict) -> str:
    """What pads packed rows: the multiple lengths round up to (``pad_to_multiple_of``, the summary's, auto
    resolved), rows left part empty, an encoder-decoder pair's shorter side (rows packed by the longer)."""
    multiple = summary.get("pad_to_multiple_of")
    if summary.get("encoder_decoder"):
        advice = (
            "an encoder-decoder's rows are packed by each pair's longer side, so the shorter side's share of "
            "a row is padding: check split.max_length against the prompt and response lengths"
        )
    elif multiple is None:  # a summary of a run before the figure was recorded
        return (
            "packed batching should barely pad: lower train.batching.pad_to_multiple_of and check "
            "split.max_length against the document lengths"
        )
    else:
        advice = (
            "packed batching should barely pad: rows are left part empty; set train.batching.row_length to "
            "auto (or shorter) and check split.max_length against the document lengths"
        )
    if isinstance(multiple, int) and multiple > 1:
        advice += f"; lower train.batching.pad_to_multiple_of ({multiple} now)"
    return advice


def _host_sync_bound(summary: dict, history: pd.DataFrame, timed: pd.DataFrame) -> Finding:
    """CUDA only. Triggered by either signal, each with the input and padding ruled out:

    * stalls: the median over windows of ``step_time_max_s / step_time_s`` is at least
      ``HOST_SYNC_SPIKE_RATIO`` -- in a typical window one step takes 3x the mean, the signature of the
      host blocking on the GPU (``.item()``, ``torch.cuda.synchronize``, a print) every few steps --
      while the data wait is below ``HOST_SYNC_LOW_DATA_WAIT_SHARE`` (so the slow steps are not data);
    * starved GPU: the run's MFU (over its timed steps, as its throughput) is below ``HOST_SYNC_MAX_MFU``
      while the data wait is below ``HOST_SYNC_LOW_DATA_WAIT_SHARE`` and the padding efficiency is at least
      ``HOST_SYNC_MIN_PADDING_EFFICIENCY`` -- neither input nor padding explains the idle GPU, so the
      host (Python, kernel launches, syncs) does.

    Conservative: unmeasured figures (NaN MFU, no data wait) never trigger it, and a data wait between
    the two thresholds triggers neither this nor ``input-bound``.

    Where the run recorded a GPU profile (``train.profile``: the summary's ``profile.gpu_idle``), its
    measure triggers it too: the GPU waited for the host at least ``HOST_BOUND_IDLE_SHARE`` of the window,
    named by phase, launching operator and host sync (engine/observe/gpu_idle.py).
    """
    if not _is_cuda(summary):
        device = (summary.get("runtime") or {}).get("device") or "unknown device"
        return Finding(HOST_SYNC_BOUND, False, _NA, f"checked on CUDA only (this run: {device})", "")
    wait = _measured(summary, timed, "data_wait_share")
    efficiency = _measured(summary, timed, "padding_efficiency")
    mfu = throughput(history, "mfu")  # the run's, as its real tokens/s
    ratios = (
        (numeric(timed, "step_time_max_s") / numeric(timed, "step_time_s"))
        .replace([math.inf, -math.inf], math.nan)
        .dropna()
    )
    spike = float(ratios.median()) if len(ratios) else math.nan
    low_wait = not math.isnan(wait) and wait < HOST_SYNC_LOW_DATA_WAIT_SHARE
    stalls = low_wait and not math.isnan(spike) and spike >= HOST_SYNC_SPIKE_RATIO
    starved = (
        low_wait
        and not math.isnan(mfu)
        and mfu < HOST_SYNC_MAX_MFU
        and not math.isnan(efficiency)
        and efficiency >= HOST_SYNC_MIN_PADDING_EFFICIENCY
    )
    idle = (summary.get("profile") or {}).get("gpu_idle") or {}
    host_share = (
        idle["host_bound_ms_per_step"] / idle["window_ms_per_step"]
        if idle.get("window_ms_per_step")
        else math.nan
    )
    profiled = not math.isnan(host_share) and host_share >= HOST_BOUND_IDLE_SHARE
    parts = []
    if not math.isnan(host_share):
        parts.append(f"GPU waiting for the host {host_share * 100:.1f} % of the profiled window")
    if not math.isnan(spike):
        parts.append(f"slowest/mean step {spike:.1f}x")
    if not math.isnan(mfu):
        parts.append(f"MFU {_percent(mfu)}")
    figure = ", ".join(parts) or _NA
    if not (stalls or starved or profiled):
        return Finding(HOST_SYNC_BOUND, False, figure, "no sign of the host stalling the GPU", "")
    reasons = [_profiled_reason(idle, host_share)] if profiled else []
    if stalls:
        reasons.append(f"in a typical window the slowest step takes {spike:.1f}x the mean step time")
    if starved:
        reasons.append(f"MFU is only {_percent(mfu)} although data wait and padding are low")
    advice = (
        "remove host-device syncs from the step: .item()/.cpu()/print of tensors, torch.cuda.synchronize, "
        "CPU-side work between steps; raise train.log_every so metrics are read back less often"
    )
    advice += _launch_advice(summary)
    syncs = idle.get("host_bound_top_syncs") or []
    if profiled and syncs:
        advice = f"first the host sync in {syncs[0]['where']} (the profile's largest); then " + advice
    return Finding(
        HOST_SYNC_BOUND, True, figure, "the host seems to stall the GPU: " + "; ".join(reasons), advice
    )


def _launch_advice(summary: dict) -> str:
    """The launch-overhead levers this run left: compile where it ran eager, then CUDA graphs of its layers
    (``compile_mode: reduce-overhead``, one launch per layer) as an A/B to run, named by the settings it ran
    with, and what graphs also need from its batching and checkpointing; where its graphs ran, nothing; where
    compiled graphs ran without them, how to see why."""
    runtime = summary.get("runtime") or {}
    if summary.get("distributed_strategy") == "fsdp" and _world_size(summary) > 1:
        return ""  # FSDP2's collectives around each layer: no CUDA graphs of the layers (the config refuses)
    if runtime.get("compile_mode") == "reduce-overhead":
        graphs = str(summary.get("cuda_graphs") or "")
        if "ran without" not in graphs:
            return ""
        shown = graphs.split(" (")[0]
        return f"; CUDA graphs: {shown}: run with TORCH_LOGS=cudagraphs to see inductor's reason for each"
    if runtime.get("compile") is not True:
        first = "; set train.runtime.compile: true (fused kernels, fewer launches), then A/B "
        setting = "compile_scope: layers, compile_mode: reduce-overhead"
    elif runtime.get("compile_scope") != "layers":
        first, setting = "; A/B ", "train.runtime.compile_scope: layers, compile_mode: reduce-overhead"
    else:
        first, setting = "; A/B ", "train.runtime.compile_mode: reduce-overhead"
    needs = []
    if summary.get("batching") not in (None, "packed"):
        needs.append("train.batching.mode: packed")
    if summary.get("gradient_checkpointing") in ("selective", "full"):
        needs.append("train.model.gradient_checkpointing: off")
    also = f"; CUDA graphs also need {' and '.join(needs)}" if needs else ""
    # an A/B, not advice: the one GPU run that measured them found the graphs slower than eager
    return (
        f"{first}{setting} against this run (one CUDA graph per layer: fewer launches, but slower than "
        f"eager where measured (docs/benchmarks.md){also})"
    )


def _profiled_reason(idle: dict, share: float) -> str:
    """The profile's measure in words: how long the GPU waited for the host, where and after what."""
    text = (
        f"the profile measured the GPU waiting for the host {share * 100:.1f} % of its window "
        f"({idle['host_bound_ms_per_step']:.2f} ms per step"
    )
    phases = idle.get("host_bound_by_phase_ms_per_step") or {}
    if phases:
        phase, ms = next(iter(phases.items()))
        text += f", most in {phase}: {ms:.2f} ms"
    text += ")"
    launchers = idle.get("host_bound_top_launchers") or []
    if launchers:
        text += f", the largest share before kernels of {launchers[0]['where']}"
    syncs = idle.get("host_bound_top_syncs") or []
    if syncs and idle.get("after_sync_ms_per_step"):
        after = idle["after_sync_ms_per_step"]
        text += f"; {after:.2f} ms per step after host syncs, most in {syncs[0]['where']}"
    return text


def _memory_saturated(summary: dict, history: pd.DataFrame, timed: pd.DataFrame, steps: _Timed) -> Finding:
    peaks = numeric(history, "peak_memory_mb").dropna()
    peak = float(peaks.max()) if len(peaks) else math.nan
    if math.isnan(peak) and _known(summary.get("peak_memory_mb")):
        peak = float(summary["peak_memory_mb"])
    total = summary.get("device_memory_mb")
    if math.isnan(peak) or not _known(total) or float(total) <= 0:
        return Finding(MEMORY_SATURATED, False, _NA, "peak or device memory unknown", "")
    share = peak / float(total)
    figure = f"{_percent(share)} of {float(total):,.0f} MB"
    step_times = numeric(timed, "step_time_s").dropna()
    third = len(step_times) // 3
    rise = math.nan
    if third >= 1:
        first = float(step_times.iloc[:third].mean())
        rise = float(step_times.iloc[-third:].mean()) / first if first > 0 else math.nan
    full = share >= MEMORY_SATURATED_SHARE
    if full and steps.count < MIN_TIMED_STEPS:  # the verdict needs the step time's rise over the run
        return Finding(MEMORY_SATURATED, False, figure, _too_few(steps), "")
    rising = not math.isnan(rise) and rise >= STEP_TIME_RISE_RATIO
    if full and rising:
        return Finding(
            MEMORY_SATURATED,
            True,
            figure,
            f"peak memory is {figure} and step time rose {rise:.2f}x from the first to the last "
            "third of the run",
            "run `kedro run --pipeline=tune`, lower train.batching.micro_batch_size and raise "
            "train.batching.gradient_accumulation_steps to keep the effective batch"
            + "".join(f", or {lever}" for lever in _unused_memory_levers(summary)),
        )
    if full and math.isnan(rise):  # no third of the windows to compare: the rise was not measured
        windows = len(step_times)
        message = (
            f"{NOT_JUDGED}: peak memory is {figure}, and whether step time rises over the run needs 3 timed "
            f"logging windows ({windows} here: a lower train.log_every gives more)"
        )
    elif full:
        message = f"peak memory is {figure}, but step time does not rise"
    else:
        message = f"peak memory is {figure} (below {_percent(MEMORY_SATURATED_SHARE)})"
    return Finding(MEMORY_SATURATED, False, figure, message, "")


def _unused_memory_levers(summary: dict) -> list[str]:
    """The memory levers this run did not use, from its own decisions (``train_summary.json``): the fused LM
    head where only a setting kept it off, the next checkpointing policy after the one it ran, an 8-bit AdamW
    on CUDA, updates in the backward where its weights allow them, FSDP2 for several DDP processes. A
    summary without those keys (an older run) gets the checkpointing switch in general."""
    levers = []
    choice = str(summary.get("fused_linear_choice") or "")
    if summary.get("fused_linear") is False and (
        "fused_linear: false" in choice or "auto: a vocab" in choice
    ):
        levers.append("set train.loss.fused_linear: true (no [tokens x vocab] logits)")
    policy = summary.get("gradient_checkpointing")
    if policy is None:
        levers.append("set train.model.gradient_checkpointing: selective")
    elif policy in ("off", "selective"):
        following = {"off": "selective", "selective": "full"}[policy]
        levers.append(f"set train.model.gradient_checkpointing: {following} (this run: {policy})")
    if _is_cuda(summary) and summary.get("optimizer") == "adamw":
        levers.append("set train.optimizer.name: adamw_8bit or paged_adamw_8bit (bitsandbytes)")
    if _updates_in_backward_possible(summary):
        levers.append(
            "set train.optimizer.in_backward: true with grad_clip: null (each weight updated as soon as its "
            "gradient is complete, the gradient freed: 4 bytes per weight less at the step's peak)"
        )
    world = _world_size(summary)
    if summary.get("distributed_strategy") == "ddp" and world > 1:
        levers.append(
            f"set train.distributed.strategy: fsdp (each of the {world} processes holds 1/{world} of the "
            "weights, gradients and AdamW states instead of all of them)"
        )
    return levers


def _updates_in_backward_possible(summary: dict) -> bool:
    """A full fine-tune whose AdamW updates fp32 masters of bf16 weights or FSDP2's shards, not updating them
    in the backward already (the summary's ``param_dtype`` says which)."""
    choice = str(summary.get("param_dtype") or "")
    sharded = summary.get("distributed_strategy") == "fsdp" and _world_size(summary) > 1
    return (
        summary.get("optimizer") == "adamw"
        and summary.get("lora") is False
        and (choice.startswith("bf16 weights") or sharded)
        and "in the backward" not in choice
    )


def _world_size(summary: dict) -> int:
    try:
        return int(summary.get("world_size") or 1)
    except (TypeError, ValueError):
        return 1


def _eval_bound(summary: dict) -> Finding:
    """The evaluations' and checkpoint saves' time between steps (``outside_steps_s``) over the run's wall
    time: the windows' wall clock (``real_tokens_per_s``, the compute-bound figure) holds it, the steps' own
    throughput (``steady_real_tokens_per_s``) does not. A resumed run's outside time is its last process's
    only while its wall time is the whole run's: not compared."""
    outside, wall = summary.get("outside_steps_s"), summary.get("wall_time_s")
    if not (_known(outside) and _known(wall)) or float(wall) <= 0:
        return Finding(EVAL_BOUND, False, _NA, "the time between steps was not measured", "")
    if summary.get("resumed_from_step") is not None:
        return Finding(
            EVAL_BOUND, False, _NA, "a resumed run: its time between steps is its last process's only", ""
        )
    share = float(outside) / float(wall)
    figure = _percent(share)
    message = (
        f"evaluations and checkpoint saves between steps took {float(outside):.1f} s, {figure} of the run's "
        f"{float(wall):.1f} s wall time"
    )
    if share < EVAL_BOUND_SHARE:
        return Finding(EVAL_BOUND, False, figure, message, "")
    steady = summary.get("steady_real_tokens_per_s")
    if _known(steady):
        message += f"; the steps alone ran at {float(steady):,.0f} real tokens/s"
    advice = (
        "raise train.eval_every and train.save_every (fewer validations and saves between steps), or cap "
        "train.eval_max_batches (a validation on part of the validation split)"
    )
    return Finding(EVAL_BOUND, True, figure, message, advice)


def _compile_bound(summary: dict) -> Finding:
    runtime = summary.get("runtime") or {}
    # every compile's seconds (recompiles included, left out of the step times) where the summary records
    # them; a summary from before compile_s has the first step's time (its compile included) alone
    compile_s, wall = summary.get("compile_s"), summary.get("wall_time_s")
    first = compile_s if _known(compile_s) and compile_s > 0 else summary.get("first_step_s")
    if runtime.get("compile") is not True or not (_known(first) and _known(wall)) or wall <= 0:
        return Finding(COMPILE_BOUND, False, _NA, "not compiled, or no first-step time recorded", "")
    share = float(first) / float(wall)
    what = (
        "all of torch.compile's compiles, recompiles included: the summary's compile_s"
        if first is compile_s
        else "the first step, compile included"
    )
    message = f"compiling took {first:.0f} s, {_percent(share)} of the run's {wall:.0f} s ({what})"
    if share < COMPILE_BOUND_SHARE:
        return Finding(COMPILE_BOUND, False, _percent(share), message, "")
    if runtime.get("compile_scope", "model") == "model":
        advice = (
            "train.runtime.compile_scope: layers (each transformer layer compiled once and reused: about one "
            "layer's compile time at any depth; benchmarks/compile_scope.py measures both)"
        )
    else:
        advice = (
            "a run this short does not repay compiling: train.runtime.compile: false (or auto: it compiles "
            "only a run long enough to repay it, where the first micro-batch measures it faster), or train "
            "longer"
        )
    return Finding(COMPILE_BOUND, True, _percent(share), message, advice)


def _recompile_limit(summary: dict) -> Finding:
    """A compiled run that reached dynamo's recompile limit (``recompile_limit_hit``): the functions of
    ``recompile_limit_functions`` ("function (file:line): last guard that failed") ran eagerly from then
    on."""
    hit = summary.get("recompile_limit_hit")
    if (summary.get("runtime") or {}).get("compile") is not True or not isinstance(hit, bool):
        return Finding(RECOMPILE_LIMIT, False, _NA, "not compiled, or the recompile limit not recorded", "")
    functions = [str(entry).split(": ", 1)[0] for entry in summary.get("recompile_limit_functions") or []]
    if not hit:
        return Finding(
            RECOMPILE_LIMIT, False, "0", "no function reached torch._dynamo.config.recompile_limit", ""
        )
    count = f"{len(functions)} function{'' if len(functions) == 1 else 's'}" if functions else "a function"
    message = (
        f"{count} reached torch._dynamo.config.recompile_limit ({', '.join(functions) or 'unnamed'}) and ran "
        "eagerly for the rest of the run: compiled in name only there, slower than compiled"
    )
    figure = str(len(functions)) if functions else "at least 1"
    # here, not at the top: the regions module imports torch, which Kedro's start-up leaves to the nodes
    from fastlm.engine.runtime.regions import RECOMPILE_LIMIT_FIX

    return Finding(RECOMPILE_LIMIT, True, figure, message, RECOMPILE_LIMIT_FIX.removeprefix("Fix: "))


def _speed(summary: dict, history: pd.DataFrame) -> float:
    """The run's real tokens/s (:func:`throughput`), else the summary's figure, else NaN."""
    value = throughput(history)
    if math.isnan(value) and _known(summary.get("real_tokens_per_s")):
        value = float(summary["real_tokens_per_s"])
    return value


class _Timed(NamedTuple):
    """The optimizer steps the rate covers (``count``), the warm-up steps left out (``warmups``: the first
    step, and each resumed process's first) and what run would be judged (``judged``: :func:`_judged_run`)."""

    count: int
    warmups: int
    judged: str = f"a run of train.max_steps >= {MIN_TIMED_STEPS + 1} is judged"


def _timed_steps(summary: dict, history: pd.DataFrame) -> _Timed:
    """Optimizer steps the rate covers: those of the history's windows :func:`throughput` counts (each
    process's first step, a ``warmup`` row, left out: a resumed run's as the first's); without a history,
    the summary's ``steps_trained`` - 1; else none."""
    steps = numeric(history, "step").to_numpy()
    if len(steps) and not pd.isna(steps).all():
        marks = _warmup_marks(history)
        records = [{"step": step, "warmup": mark} for step, mark in zip(steps, marks, strict=True)]
        windows = timed_windows(records)
        spans = (steps[index] - steps[index - 1] for index in windows)
        count, warmups = sum(max(int(span), 1) for span in spans if span == span), len(records) - len(windows)
        return _Timed(
            count, warmups, _judged_run(summary, count, warmups, last=float(pd.Series(steps).max()))
        )
    if _known(summary.get("steps_trained")) and float(summary["steps_trained"]) >= 1:
        return _Timed(int(summary["steps_trained"]) - 1, 1)
    return _Timed(0, 1)


def _warmup_marks(history: pd.DataFrame) -> list:
    """Each history row's ``warmup`` mark (None for a history without the column)."""
    return numeric(history, "warmup").tolist() if "warmup" in history else [None] * len(history)


def _judged_run(summary: dict, count: int, warmups: int, *, last: float) -> str:
    """What run the rules from step timing would judge, for one with ``count`` timed steps, ``warmups`` left
    out and ``last`` its last step: a fresh run of train.max_steps >= MIN_TIMED_STEPS + 1, unless this one
    had that many planned and was stopped before (``stopped_by``: its time budget, early stopping), or
    resumed (each process's first step left out: more steps going on with it)."""
    fresh = f"a run of train.max_steps >= {MIN_TIMED_STEPS + 1} is judged"
    steps, planned = summary.get("steps"), summary.get("planned_steps")
    at = f"at step {steps if _known(steps) else int(last)}{f' of {planned}' if _known(planned) else ''}"
    longer = f"a run of {MIN_TIMED_STEPS + 1} steps or more is judged"
    stopped = summary.get("stopped_by")
    if stopped == "time budget":
        return f"train.max_minutes stopped this run {at}: raise train.max_minutes; {longer}"
    if stopped == "early stopping":
        return (
            f"early stopping ended this run {at}, train.early_stopping.patience validations without "
            f"improvement; {longer}"
        )
    if warmups > 1 and last == last:
        going_on = int(last) + MIN_TIMED_STEPS - count
        return (
            f"judged from {MIN_TIMED_STEPS} timed steps: train.max_steps >= {going_on} going on with this "
            f"run (train.resume: auto), or >= {MIN_TIMED_STEPS + 1} in one process"
        )
    return fresh


def _too_few(steps: _Timed) -> str:
    """The message of a rule or figure not judged from ``steps`` timed steps (fewer than MIN_TIMED_STEPS)."""
    timed = f"{steps.count} timed step{'' if steps.count == 1 else 's'}"
    left_out = (
        f"{timed} after the warm-up step"
        if steps.warmups <= 1
        else f"{timed}, the {steps.warmups} warm-up steps (each process's first) left out"
    )
    return f"{NOT_JUDGED}: {left_out} ({steps.judged})"


def _steady(finding: Finding, steps: _Timed) -> Finding:
    """A rule judged from step timing: not judged over fewer than MIN_TIMED_STEPS timed steps (its figure
    kept); an unmeasured or inapplicable one (figure "n/a") keeps its own message."""
    if steps.count >= MIN_TIMED_STEPS or finding.figure == _NA:
        return finding
    return Finding(finding.kind, False, finding.figure, _too_few(steps), "")


def _compute_bound(
    summary: dict, history: pd.DataFrame, timed: pd.DataFrame, others: list[Finding], steps: _Timed
) -> Finding:
    tokens = _speed(summary, history)
    rate = f"{tokens:,.0f} real tokens/s" if not math.isnan(tokens) else "unknown real tokens/s"
    runtime = summary.get("runtime") or {}
    if _is_cuda(summary):
        mfu = throughput(history, "mfu")  # the run's, as its real tokens/s
        where = (
            f"at MFU {_percent(mfu)}" if not math.isnan(mfu) else f"on {runtime.get('device')} (MFU unknown)"
        )
        levers = _unused_speed_levers(summary)
        advice = (
            "; ".join(levers)
            if levers
            else "no speed lever left unused in this run's summary (precision, compile, liger's kernels, "
            "float8, bf16 weights, memory headroom): more speed needs a faster GPU or more of them"
        )
    else:
        threads = runtime.get("num_threads")
        where = f"on {threads} CPU threads" if _known(threads) else "on the CPU"
        advice = "train on a GPU (train.runtime.device: cuda): a CPU run is limited by its cores"
    figure = f"{rate} {where}"
    if steps.count < MIN_TIMED_STEPS:
        return Finding(COMPUTE_BOUND, False, figure, _too_few(steps), "")
    blocking = [finding.kind for finding in others if finding.triggered]
    if blocking:
        return Finding(
            COMPUTE_BOUND, False, figure, f"not compute-bound yet: {', '.join(blocking)} first", ""
        )
    return Finding(COMPUTE_BOUND, True, figure, f"the run is compute-bound: {figure}", advice)


def _unused_speed_levers(summary: dict) -> list[str]:
    """The speed levers a compute-bound GPU run left unused, from its own decisions (``train_summary.json``):
    a precision below bf16, no compile, liger's kernels or torchao's float8 off only for want of the package
    (not by the user's choice or the rule), fp32 weights in a full fine-tune, a peak memory leaving most of
    the GPU unused. A key the summary lacks (an older run) says nothing."""
    runtime = summary.get("runtime") or {}
    levers = []
    precision = runtime.get("precision")
    if precision in ("fp32", "fp16"):
        levers.append(
            f"train.runtime.precision: bf16 where the GPU has it (Ampere or newer; this run: {precision})"
        )
    if runtime.get("compile") is False:
        levers.append("train.runtime.compile: true (compile_scope: layers compiles each layer once)")
    for choice, package, what in (
        (summary.get("liger"), "liger-kernel", "liger's fused norm, rotary and SwiGLU kernels"),
        (
            runtime.get("float8_choice"),
            "torchao",
            "float8 matmuls, kept where the first micro-batch measures them faster",
        ),
    ):
        if f"`pip install {package}`" in str(choice or ""):
            levers.append(f"`pip install {package}` ({what})")
    levers += _weights_advice(str(summary.get("param_dtype") or ""))
    peak, total = summary.get("peak_memory_mb"), summary.get("device_memory_mb")
    share = float(peak) / float(total) if _known(peak) and _known(total) and float(total) > 0 else math.nan
    if share < ROOMY_SHARE:  # False for NaN
        levers.append(
            f"a bigger train.batching.micro_batch_size: peak memory was {_percent(share)} of "
            f"{float(total):,.0f} MB (`kedro run --pipeline=tune` measures the fastest that fits)"
        )
    return levers


def _weights_advice(choice: str) -> list[str]:
    """A GPU full fine-tune that kept fp32 weights under autocast (the summary's ``param_dtype``,
    engine/train/master_weights.py): what bf16 weights with fp32 masters would remove; nothing for a run that
    had them or for LoRA (its base is bf16 already)."""
    if not choice.startswith("fp32 weights") or "frozen" in choice:
        return []
    why = (
        "autocast over fp32 weights keeps an fp32 residual stream and casts each projection's input and "
        "gradient"
    )
    return [f"train.runtime.param_dtype: auto (bf16 weights with fp32 masters; {why})"]


def diagnose(summary: dict, history: pd.DataFrame) -> list[Finding]:
    """One :class:`Finding` per rule, in the order of the module docstring; ``compute-bound`` last."""
    summary = summary or {}
    history = history if history is not None else pd.DataFrame()
    timed = after_warmup(history)
    steps = _timed_steps(summary, history)
    findings = [
        _steady(_input_bound(summary, timed), steps),
        _padding_bound(summary, timed),  # real / computed tokens: counts, judged from any step
        _steady(_host_sync_bound(summary, history, timed), steps),
        _memory_saturated(summary, history, timed, steps),
        _steady(_eval_bound(summary), steps),
    ]
    # the compile is a start-up cost: it does not keep the steady state from being compute-bound; a function
    # run eagerly past the recompile limit does
    recompile = _recompile_limit(summary)
    compute = _compute_bound(summary, history, timed, [*findings, recompile], steps)
    return [*findings, _compile_bound(summary), recompile, compute]


def format_duration(seconds: float | None) -> str | None:
    """``"1 h 12 min"``, ``"3 min 20 s"``, ``"45 s"``, ``"2 d 3 h"``; ``None`` when unknown."""
    if seconds is None or math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        return None
    if seconds < 1:
        return "< 1 s"
    if seconds < 600:
        whole = round(seconds)
        minutes, secs = divmod(whole, 60)
        return f"{minutes} min {secs} s" if minutes else f"{secs} s"
    if seconds < 86400:
        minutes = round(seconds / 60)
        hours, minutes = divmod(minutes, 60)
        return f"{hours} h {minutes} min" if hours else f"{minutes} min"
    hours = round(seconds / 3600)
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def epoch_eta(summary: dict, history: pd.DataFrame) -> dict:
    """Time for one full epoch of the train split at the measured speed: ``train_tokens / real_tokens_per_s``.

    Returns ``{"seconds", "human", "train_tokens", "real_tokens_per_s", "not_judged"}``; fields are ``None``
    when unknown. The speed is :func:`throughput` (after warm-up), else the summary's figure. Over fewer than
    ``MIN_TIMED_STEPS`` timed steps no ETA is given: ``not_judged`` says why (else ``None``).
    """
    summary = summary or {}
    history = history if history is not None else pd.DataFrame()
    tokens = summary.get("train_tokens")
    rate = _speed(summary, history)
    rate = None if math.isnan(rate) or rate <= 0 else rate
    tokens = int(tokens) if _known(tokens) else None
    steps = _timed_steps(summary, history)
    judged = steps.count >= MIN_TIMED_STEPS
    seconds = tokens / rate if tokens is not None and rate is not None and judged else None
    return {
        "seconds": seconds,
        "human": format_duration(seconds),
        "train_tokens": tokens,
        "real_tokens_per_s": rate,
        "not_judged": None if judged else _too_few(steps),
    }


def diagnosis_record(summary: dict, history: pd.DataFrame) -> dict:
    """``bottleneck_diagnosis``: every finding of :func:`diagnose` (the triggered ones said, each in a line
    with what to do), the :func:`epoch_eta`, and which training it is of (the report refuses another's)."""
    findings = diagnose(summary, history)
    for finding in findings:
        if finding.triggered:
            log.info(
                "Diagnosis: %s — %s%s",
                finding.kind,
                finding.message,
                f". What to do: {finding.advice}" if finding.advice else "",
            )
    return {
        "findings": [dataclasses.asdict(f) for f in findings],
        "epoch_eta": epoch_eta(summary, history),
        TRAINING_ID: summary.get(TRAINING_ID),  # which training: write_report refuses another's
    }
