"""Throughput autotune: measure the real training step for a ladder of micro-batch sizes, find the memory
cliff, pick the fastest size under a memory headroom, and the accumulation that keeps an effective batch.

Doubling the micro-batch can make a big model slower per token (memory near the device limit: allocator
retries, or a silent spill to host memory) while it makes a small model faster. Nobody should guess: each
trial runs warm-up steps (not timed) then timed steps of ``step.train_step``, the training loop's own step
(forward/backward under the runtime's precision, gradient clipping, AdamW, the learning-rate scheduler, the
model compiled when ``train.runtime.compile`` is true; eager under ``auto``, which the run's first micro-batch
settles and may leave eager: a compiled step usually holds less activation memory than the eager one, so the
eager step is the safer size) on the user's real model, data and checkpointing settings, and records real
tokens/s, step time and peak memory. Every trial starts from the weights the model was built with (a copy of
its trainable weights, on the CPU, is put back after each: ``trained_weights``), so a size's figures and loss
are its own, not those of the steps earlier trials, modes or checkpointing policies took. The ladder stops at
out-of-memory (caught and cleaned up: the process goes on), past the memory headroom, at the cliff
(throughput falls while memory rises), at a size the training data makes fewer batches of than a trial's
steps, or at a trial whose loss was not finite (NaN or inf: a learning rate or precision the training
diverges at). Such a trial is no measurement of the training (a step skipped on an overflow is faster) and is
never chosen; its ladder ends there. The loss is checked once per trial, from a flag kept on the device.

``tune.max_minutes`` bounds the whole measurement (a trial of a 3B model can take a minute, a compiled one
more): past its deadline no new trial starts (each ladder's first size excepted, so a mode measured has a
choice), no further batching mode or checkpointing policy is measured, and the explanation names what the
limit left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from time import perf_counter

import numpy as np
import torch

from fastlm.errors import ConfigError

OK, OOM, CLIFF, OVER, TIME = "ok", "out of memory", "cliff", "over headroom", "time limit"
FEW = "too few batches"  # the training data makes fewer micro-batches of this size than a trial's steps
NONFINITE = "loss not finite"  # the trial's loss was NaN or inf: the training diverged, no speed to choose by


class TooFewBatches(ValueError):
    """A micro-batch size the training data makes fewer batches of than a trial's warm-up and timed steps:
    no larger size can be measured either, so the ladder ends there."""


TIME_PARAM = "tune.max_minutes"


@dataclass(frozen=True)
class Trial:
    micro_batch_size: int
    status: str
    real_tokens_per_s: float | None = None
    step_time_s: float | None = None
    peak_memory_mb: float | None = None
    peak_reserved_mb: float | None = None
    alloc_retries: int | None = None
    error: str | None = None
    samples_per_micro_batch: float | None = None  # packed rows hold several samples each
    rows_per_micro_batch: float | None = (
        None  # packed: micro_batch_size x max_length tokens in rows of row_length
    )

    def as_row(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Measurement:
    real_tokens_per_s: float
    step_time_s: float
    peak_memory_mb: float
    alloc_retries: int | None = None
    peak_reserved_mb: float | None = None
    samples_per_micro_batch: float | None = None
    rows_per_micro_batch: float | None = None
    loss_finite: bool = True  # every step's loss was finite (read once, at the trial's end)


def memory_budget_mb(device: torch.device, limit_gb: float | None, *, total_mb: float | None) -> float | None:
    """The memory the trials may use: the device's (``total_mb``), or ``tune.memory_limit_gb`` to tune for a
    smaller card than this one. On CUDA the process is then capped to it
    (``set_per_process_memory_fraction``), so the trials run out of memory, and retry the allocator, where
    that card would."""
    if limit_gb is None:
        return total_mb
    limit_mb = limit_gb * 1024
    if total_mb is not None and limit_mb > total_mb:
        raise ConfigError(
            f"tune.memory_limit_gb = {limit_gb:g} is more than this device has ({total_mb / 1024:.1f} GB).",
            fix="set tune.memory_limit_gb to at most the device's memory, or null to use all of it.",
        )
    if device.type == "cuda" and total_mb:
        torch.cuda.set_per_process_memory_fraction(limit_mb / total_mb, device)
    return limit_mb


def ladder(smallest: int, largest: int) -> list[int]:
    """Powers of two from ``smallest`` up to ``largest`` (both included)."""
    sizes, size = [], max(1, smallest)
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError | MemoryError) or "out of memory" in str(error).lower()


@contextlib.contextmanager
def collecting_trials_only() -> Iterator[None]:
    """The garbage collections between trials (``release_memory``) scan only the objects the trials made:
    those alive before wait in the collector's permanent generation (``gc.freeze``) and are put back after.
    A full collection in a process holding torch, transformers, Kedro and MLflow otherwise scans hundreds of
    thousands of objects each time, twice a trial. A process that froze objects itself is left as is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@collecting_trials_only()
def run_ladder(
    measure: Callable[[int], Measurement],
    sizes: Sequence[int],
    *,
    memory_limit_mb: float | None,
    headroom: float,
    cliff_tolerance: float,
    deadline: float | None = None,
) -> list[Trial]:
    """Measure each size in order until out-of-memory, the headroom, a loss that was not finite, the cliff,
    or (after the first size) ``deadline`` (a ``perf_counter`` time: ``tune.max_minutes``); every trial is
    kept. A size slower than the fastest before it is measured once more, and the faster of its two
    measurements counts: a cliff holds, a trial slowed by something else on the machine (a few timed steps
    on shared cores) does not end the ladder."""
    trials: list[Trial] = []
    budget = memory_limit_mb * (1 - headroom) if memory_limit_mb else None
    for size in sizes:
        if trials and past(deadline):
            trials.append(Trial(size, TIME))
            break
        try:
            result = measure(size)
            release_memory()  # the trial's optimizer state and activations, before the next size
            if _slower(result, trials, cliff_tolerance) and not result.alloc_retries:
                again = measure(size)
                release_memory()
                if again.real_tokens_per_s > result.real_tokens_per_s:
                    peak = max(result.peak_memory_mb, again.peak_memory_mb)
                    result = replace(
                        again, peak_memory_mb=peak, loss_finite=result.loss_finite and again.loss_finite
                    )
        except TooFewBatches as error:
            release_memory()
            trials.append(Trial(size, FEW, error=str(error)))
            break
        except Exception as error:  # noqa: BLE001 - only out-of-memory is expected; anything else re-raised
            if not is_out_of_memory(error):
                raise
            release_memory()
            trials.append(Trial(size, OOM, error=str(error).splitlines()[0][:200]))
            break
        best = max((t for t in trials if t.status == OK), key=lambda t: t.real_tokens_per_s, default=None)
        status = OK
        if budget is not None and result.peak_memory_mb > budget:
            status = OVER
        elif not result.loss_finite:
            status = NONFINITE  # diverged: no measurement of the training, and its weights may be NaN
        elif best is not None and (
            _slower(result, trials, cliff_tolerance)
            or (result.alloc_retries and result.real_tokens_per_s <= best.real_tokens_per_s)
        ):
            status = CLIFF  # slower while using more memory, or the CUDA allocator had to retry for no gain
        trials.append(
            Trial(
                size,
                status,
                result.real_tokens_per_s,
                result.step_time_s,
                result.peak_memory_mb,
                result.peak_reserved_mb,
                result.alloc_retries,
                samples_per_micro_batch=result.samples_per_micro_batch,
                rows_per_micro_batch=result.rows_per_micro_batch,
            )
        )
        if status != OK:
            break
    return trials


def _slower(result: Measurement, trials: Sequence[Trial], cliff_tolerance: float) -> bool:
    """Whether ``result`` is slower than the fastest finished trial by more than ``cliff_tolerance`` while
    using more memory than the trial before it: the cliff, where it holds."""
    best = max((t for t in trials if t.status == OK), key=lambda t: t.real_tokens_per_s, default=None)
    return (
        best is not None
        and result.real_tokens_per_s < best.real_tokens_per_s * (1 - cliff_tolerance)
        and result.peak_memory_mb > trials[-1].peak_memory_mb
    )


def deadline_after(minutes: float | None) -> float | None:
    """The ``perf_counter`` time ``minutes`` from now (``tune.max_minutes``; None: no limit)."""
    return perf_counter() + 60 * minutes if minutes else None


def past(deadline: float | None) -> bool:
    """Whether ``deadline`` (a ``perf_counter`` time, or None: no limit) has passed."""
    return deadline is not None and perf_counter() >= deadline


def choose(trials: Sequence[Trial]) -> Trial | None:
    """The fastest trial that finished within the headroom and before the cliff."""
    return max((t for t in trials if t.status == OK), key=lambda t: t.real_tokens_per_s, default=None)


@dataclass(frozen=True)
class ModeLadder:
    """One batching mode's trials (``tune.modes``), its own best size, or why it was not measured."""

    mode: str
    trials: list[Trial]
    chosen: Trial | None
    skipped: str | None = None


@dataclass(frozen=True)
class LadderSettings:
    """One ladder's settings (the ``tune`` parameters), the same for every batching mode measured: ``warmup``
    untimed and ``timed`` steps per trial, the micro-batch ``sizes`` tried in order, and where the ladder
    stops (``memory_limit_mb`` less its ``headroom`` share; a throughput drop beyond ``cliff_tolerance``)."""

    warmup: int
    timed: int
    sizes: Sequence[int]
    memory_limit_mb: float | None
    headroom: float
    cliff_tolerance: float
    deadline: float | None = None  # perf_counter time (tune.max_minutes); None: no limit


def tune_modes(
    model,
    dataset,
    modes: Sequence[str],
    *,
    params,
    runtime,
    pad_id: int,
    max_length: int,
    attn: str,
    settings: LadderSettings,
) -> list[ModeLadder]:
    """The size ladder (``run_ladder``) of each batching mode in ``modes`` on the real training step
    (``real_step_measurer``); a mode the model cannot train in (``unavailable_modes``), or one left when the
    time limit has passed after a mode with a choice, is skipped with its reason."""
    unavailable = unavailable_modes(model, dataset, attn)
    ladders = []
    for mode in modes:
        reason = unavailable(mode)
        if reason is None and past(settings.deadline) and any(ladder.chosen for ladder in ladders):
            reason = f"{TIME_PARAM} was reached first"
        if reason is not None:
            ladders.append(ModeLadder(mode, [], None, skipped=reason))
            continue
        mode_params = params.model_copy(
            update={"batching": params.batching.model_copy(update={"mode": mode})}
        )
        measure = real_step_measurer(
            model,
            dataset,
            params=mode_params,
            runtime=runtime,
            pad_id=pad_id,
            max_length=max_length,
            attn=attn,
            warmup=settings.warmup,
            timed=settings.timed,
        )
        trials = run_ladder(
            measure,
            settings.sizes,
            memory_limit_mb=settings.memory_limit_mb,
            headroom=settings.headroom,
            cliff_tolerance=settings.cliff_tolerance,
            deadline=settings.deadline,
        )
        ladders.append(ModeLadder(mode, trials, choose(trials)))
    return ladders


def best_mode(ladders: Sequence[ModeLadder]) -> ModeLadder | None:
    """The mode whose chosen size has the most real tokens/s (None: no size of any mode fit)."""
    return max(
        (ladder for ladder in ladders if ladder.chosen is not None),
        key=lambda ladder: ladder.chosen.real_tokens_per_s,
        default=None,
    )


def mode_accumulation(ladder: ModeLadder, target: int | None, *, current: int, world_size: int = 1) -> int:
    """``accumulation_for`` the mode's chosen size (its measured samples per micro-batch): what the
    tuned parameters get when this mode is chosen (``current`` without a target or a choice)."""
    chosen = ladder.chosen
    if chosen is None:
        return current
    return accumulation_for(
        target,
        chosen.micro_batch_size,
        world_size,
        current,
        samples_per_micro_batch=chosen.samples_per_micro_batch,
    )


def explain_modes(
    ladders: Sequence[ModeLadder],
    best: ModeLadder | None,
    *,
    current_accumulation: int,
    target: int | None,
    world_size: int = 1,
    **explain_kwargs,
) -> str:
    """``explain`` for each mode, with the accumulation its own chosen size needs for ``target``
    (``mode_accumulation``), then the choice across modes."""
    parts = [
        f"{ladder.mode}: not measured ({ladder.skipped})."
        if ladder.skipped
        else f"{ladder.mode}: "
        + explain(
            ladder.trials,
            ladder.chosen,
            accumulation=mode_accumulation(
                ladder, target, current=current_accumulation, world_size=world_size
            ),
            target=target,
            world_size=world_size,
            **explain_kwargs,
        )
        for ladder in ladders
    ]
    if best is not None and len(ladders) > 1:
        parts.append(
            f"Fastest: batching {best.mode}, micro-batch {best.chosen.micro_batch_size} "
            f"({best.chosen.real_tokens_per_s:,.0f} real tokens/s)."
        )
    return " ".join(parts)


def unavailable_modes(model, dataset, attn: str) -> Callable[[str], str | None]:
    """``unavailable(mode)``: why the model cannot train in that mode (None: it can): packed rows of an
    encoder-decoder family or attention path that cannot keep samples apart."""
    from fastlm.engine.batching import seq2seq_batching
    from fastlm.engine.model.attention.windows import packing_leak
    from fastlm.engine.model.encoder_decoder import packing_unavailable, unwrapped

    sides = seq2seq_batching(model, dataset, attn)
    if sides is not None:
        cannot_pack = not sides.packing
        return lambda mode: packing_unavailable(model, attn) if mode == "packed" and cannot_pack else None
    leak = packing_leak(unwrapped(model).config)
    return lambda mode: leak if mode == "packed" else None


def accumulation_for(
    target_effective_batch: int | None,
    micro_batch_size: int,
    world_size: int = 1,
    current: int = 1,
    *,
    samples_per_micro_batch: float | None = None,
) -> int:
    """Accumulation steps so that the samples of micro-batches x accumulation x world size reach the target
    (samples per optimizer step; at least 1). A packed micro-batch holds ``samples_per_micro_batch`` samples
    (measured), not ``micro_batch_size``: its rows hold several each."""
    if target_effective_batch is None:
        return current
    per_micro_batch = samples_per_micro_batch or micro_batch_size
    return max(1, math.ceil(target_effective_batch / (per_micro_batch * world_size)))


def explain(
    trials: Sequence[Trial],
    chosen: Trial | None,
    *,
    accumulation: int,
    target: int | None,
    headroom: float,
    memory_limit_mb: float | None,
    world_size: int = 1,
) -> str:
    """One paragraph, with the figures, saying what was measured and why this size."""
    measured = ", ".join(
        f"{t.micro_batch_size}: {t.real_tokens_per_s:,.0f} tok/s at {t.peak_memory_mb:,.0f} MB"
        + (" (loss not finite)" if t.status == NONFINITE else "")
        for t in trials
        if t.real_tokens_per_s is not None
    )
    stop = trials[-1] if trials else None
    ended = _why_stopped(stop, headroom, memory_limit_mb) if stop is not None else ""
    if chosen is None:
        return f"No micro-batch size finished within the limits ({measured or 'nothing measured'}); {ended}."
    rows = (chosen.rows_per_micro_batch or chosen.micro_batch_size) * accumulation * world_size
    samples = (chosen.samples_per_micro_batch or chosen.micro_batch_size) * accumulation * world_size
    return (
        f"Measured real tokens/s and peak memory per micro-batch size ({measured})"
        + (f"; the ladder stopped because {ended}" if ended else "; the ladder reached its largest size")
        + f". Fastest within {1 - headroom:.0%} of the device memory: micro-batch {chosen.micro_batch_size} "
        f"({chosen.real_tokens_per_s:,.0f} real tokens/s, {chosen.peak_memory_mb:,.0f} MB). With "
        f"{accumulation} accumulation step(s) x {world_size} process(es) an optimizer step holds "
        f"{rows:,.0f} rows (~{samples:,.0f} samples)"
        + (f" (target {target} samples): the accumulation is rounded up to reach it." if target else ".")
    )


def no_fit_error(
    results: Sequence[PolicyLadders],
    *,
    min_size: int,
    headroom: float,
    memory_limit_mb: float | None,
    tuned_file: str,
    limit_gb: float | None = None,
) -> ConfigError:
    """The one line when no micro-batch size of any ladder (``results``: ``tune_checkpointing``'s) fit: what
    failed first (a mode not measured and why, or the first size that did not finish and why), the paragraph
    of what was measured, and the fix for that failure: memory advice only where memory (out of memory, over
    the headroom) stopped a ladder, first the user's ``tune.memory_limit_gb`` (``limit_gb``) where the trials
    ran under it, with the least limit a measured size fits under; ``tuned_file`` is left as it was."""
    first, memory, fixes, peaks = "", False, [], []
    for result in results:
        for ladder in result.ladders:
            failed = next((trial for trial in ladder.trials if trial.status != OK), None)
            if ladder.skipped:
                said = f"{ladder.mode}: not measured ({ladder.skipped})"
                fixes.append("set tune.modes to a batching mode the model trains in")
            elif failed is not None:
                said = f"{ladder.mode}: {_why_stopped(failed, headroom, memory_limit_mb)}"
                memory = memory or failed.status in (OOM, OVER)
                if failed.status == OVER and failed.peak_memory_mb:
                    peaks.append(failed.peak_memory_mb)
                if failed.status == NONFINITE:
                    fixes.append(
                        "the training diverges at these settings: lower train.optimizer.lr (or raise its "
                        "warmup_steps), or set train.runtime.precision to bf16 or fp32 instead of fp16"
                    )
                if failed.status == FEW:
                    fixes.append(
                        "lower tune.warmup_steps + tune.timed_steps or tune.min_micro_batch_size, or split "
                        "more training data"
                    )
            else:
                said = f"{ladder.mode}: nothing measured"
            first = first or said
    if memory and limit_gb is not None:  # the user's own limit stopped the trials, not this device
        least = math.ceil(min(peaks) / (1 - headroom) / 1024 * 100) / 100 if peaks else None
        fixes.append(
            f"the trials ran under tune.memory_limit_gb: {limit_gb:g}: raise it"
            + (f" (tune.memory_limit_gb: {least:g} fits the smallest size measured)" if least else "")
            + " or set it to null to tune for this device's memory"
        )
    if memory:
        fixes.append("free device memory, turn on train.model.gradient_checkpointing, or use a smaller model")
    explained = f"first failure: {first}." if first else "nothing was measured."
    measured = " ".join(
        f"{ladder.mode}: {', '.join(f'{t.micro_batch_size} {t.status}' for t in ladder.trials) or 'no size'}"
        for result in results
        for ladder in result.ladders
    )
    fix = "; ".join(dict.fromkeys(fixes)) or "correct what the first failure names"
    return ConfigError(
        f"no micro-batch size from {min_size} fit: {explained} Sizes tried: {measured or 'none'}.",
        fix=f"{fix}; {tuned_file} was left as it was.",
    )


def _why_stopped(stop: Trial, headroom: float, memory_limit_mb: float | None) -> str:
    if stop.status == OOM:
        return f"micro-batch {stop.micro_batch_size} ran out of memory"
    if stop.status == CLIFF:
        return (
            f"micro-batch {stop.micro_batch_size} was slower ({stop.real_tokens_per_s:,.0f} tok/s) while "
            "using more memory: the cliff"
        )
    if stop.status == FEW:
        return (
            stop.error or f"micro-batch {stop.micro_batch_size} leaves too few batches in the training data"
        )
    if stop.status == TIME:
        return f"{TIME_PARAM} was reached before micro-batch {stop.micro_batch_size}"
    if stop.status == NONFINITE:
        return (
            f"micro-batch {stop.micro_batch_size}'s loss was not finite (NaN or inf): the training diverged"
        )
    if stop.status == OVER:
        return (
            f"micro-batch {stop.micro_batch_size} needed {stop.peak_memory_mb:,.0f} MB, over the "
            f"{1 - headroom:.0%} of {memory_limit_mb or 0:,.0f} MB allowed"
        )
    return ""


def release_memory() -> None:
    """Free what a failed trial left behind (between trials only: never in the training loop)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def current_rss_mb() -> float:
    """Resident memory of this process now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


_CLEAR_REFS, _STATUS = "/proc/self/clear_refs", "/proc/self/status"


def reset_peak_rss() -> bool:
    """Reset this process's resident-memory high-water mark (Linux: ``5`` into ``/proc/self/clear_refs``,
    the kernel's reset of ``VmHWM``) to its resident memory now; False where it cannot be."""
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
        return peak_rss_mb() is not None
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    """This process's resident-memory high-water mark (``VmHWM``) in MB since it was last reset; None where
    unavailable."""
    try:
        with open(_STATUS) as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def measure_training_step(
    step: Callable[[int], int], *, device: torch.device, warmup: int, timed: int
) -> Measurement:
    """Time ``timed`` calls of ``step(i) -> real tokens`` after ``warmup`` untimed ones; peak memory of all.

    CUDA: ``max_memory_allocated`` and ``max_memory_reserved`` (reset first) and the allocator's
    ``num_alloc_retries`` during the trial (retries with no speed gain mark the cliff);
    CPU: the process's resident-memory high-water mark over the trial (``reset_peak_rss`` as it starts):
    a step's activations are freed before it returns, large blocks given back to the system at once, so the
    resident memory after a step misses them; where the mark cannot be reset, the largest resident memory
    seen after each step.
    """
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        retries_before = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    high_water = not on_cuda and reset_peak_rss()
    peak_rss = current_rss_mb()
    tokens = 0
    start = 0.0
    for index in range(warmup + timed):
        if index == warmup:
            if on_cuda:
                torch.cuda.synchronize(device)
            start = perf_counter()
        real = step(index)
        if index >= warmup:
            tokens += real
        if not on_cuda:
            peak_rss = max(peak_rss, current_rss_mb())
    if on_cuda:
        torch.cuda.synchronize(device)
    elapsed = max(perf_counter() - start, 1e-9)
    reserved = None
    if on_cuda:
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        reserved = torch.cuda.max_memory_reserved(device) / 2**20
        retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - retries_before
    else:
        peak, retries = max(peak_rss, (peak_rss_mb() or 0.0) if high_water else 0.0), None
    return Measurement(tokens / elapsed, elapsed / timed, peak, retries, reserved)


def real_step_measurer(
    model, dataset, *, params, runtime, pad_id: int, max_length: int, attn: str, warmup: int, timed: int
) -> Callable[[int], Measurement]:
    """``measure(micro_batch_size)``: the training step itself (``step.train_step``: the same batching,
    precision, torch.compile when set (eager under ``auto``: see the module docstring), AdamW, gradient
    clipping and learning-rate schedule as ``loop.train``), one micro-batch per step (the accumulation
    multiplies the time per step, not the memory)."""
    from fastlm.engine.batching import make_batching, seq2seq_batching
    from fastlm.engine.model.attention.inputs import to_device
    from fastlm.engine.runtime.probe import probe_runtime
    from fastlm.engine.train.step import make_optimization, train_step

    model.to(runtime.device)
    model.train()
    runtime = runtime.compiling_as(params.runtime)  # the parameters' compile scope and mode
    # compile auto: the run's first micro-batch decides (runtime_probe) and may train eager; CUDA graphs
    # (reduce-overhead) are compiled whatever it measures
    if params.runtime.compile == "auto" and params.runtime.compile_mode != "reduce-overhead":
        runtime = dataclasses.replace(runtime, compile=False)
    compiled = runtime.compile_model(model)
    # an encoder-decoder model measures its own (seq2seq) batches
    sides = seq2seq_batching(model, dataset, attn)
    # each trial trains from these weights and puts them back (the next trial, mode or policy starts there)
    start, start_mb = trained_weights(model)

    def measure(size: int) -> Measurement:
        batching = params.batching.model_copy(update={"micro_batch_size": size})
        trial_params = params.model_copy(update={"batching": batching})
        sampler, collator = make_batching(
            trial_params,
            dataset.lengths,
            pad_id=pad_id,
            max_length=max_length,
            seed=params.order_seed,
            sides=sides,
        )
        sampler.set_epoch(0)
        epoch = list(iter(sampler))
        if len(epoch) < warmup + timed:
            raise TooFewBatches(
                f"micro-batch {size} leaves fewer than {warmup + timed} batches in the training data "
                f"({len(epoch)}; tune.warmup_steps + tune.timed_steps)"
            )
        batches = with_largest_batch(sampler, epoch, warmup + timed)
        # precision auto on CPU: what the run would measure at this size (runtime_probe, on the first batch)
        first = to_device(collator(dataset.__getitems__(epoch[0])), runtime.device, attn)
        trial_runtime, _ = probe_runtime(runtime, params.runtime.precision, model, first)
        opt = make_optimization(model, trial_params, trial_runtime, total_steps=warmup + timed)

        rows: list[
            int
        ] = []  # a packed micro-batch's rows: micro_batch_size x max_length tokens in row_length
        finite: torch.Tensor | None = None  # every step's loss so far finite: kept on the device, no sync

        def step(index: int) -> int:
            nonlocal finite
            batch = collator(dataset.__getitems__(batches[index]))
            rows.append(len(batch["input_ids"]))
            result = train_step(
                compiled, [to_device(batch, runtime.device, attn)], opt, runtime=trial_runtime
            )
            now = torch.isfinite(result.loss_sum.detach()).all()
            finite = now if finite is None else finite & now
            return int(batch["num_real_tokens"])

        try:
            measured = measure_training_step(step, device=runtime.device, warmup=warmup, timed=timed)
            samples = sum(len(indices) for indices in batches) / len(batches)
            return dataclasses.replace(
                measured,
                # off CUDA the peak is the process's memory, which holds the copy of the starting weights
                # that a training run does not
                peak_memory_mb=measured.peak_memory_mb - (start_mb if runtime.device.type != "cuda" else 0.0),
                samples_per_micro_batch=samples,
                rows_per_micro_batch=sum(rows) / len(rows),
                loss_finite=finite is None or bool(finite),  # the trial's one read of the flag
            )
        finally:  # the optimizer state goes with this call's frame; bf16 weights back to their fp32 masters
            opt.optimizer.zero_grad(set_to_none=True)
            opt.release()
            restore_weights(model, start)
            release_memory()

    return measure


def with_largest_batch(sampler, epoch: list, count: int) -> list:
    """The ``count`` batches a trial runs: the epoch's first ones, the first of them replaced by its largest
    where micro-batches are padded to their longest sample (length_grouped, dynamic: memory grows with that
    sample; the largest holds the most padded tokens, ``len x longest`` in ``sampler.lengths``) and the
    first ones do not hold it. The first step runs it (the untimed warm-up where there is one), so the
    trial's peak memory is the one the run meets at its longest batch, not that of the epoch's first, often
    short, ones. Packed micro-batches each fill one token budget: the first ones, as they are."""
    from fastlm.engine.data.samplers import PackedBatchSampler

    batches = epoch[:count]
    if isinstance(sampler, PackedBatchSampler) or not batches:
        return batches
    lengths = np.asarray(sampler.lengths)

    def padded(batch) -> tuple[int, int]:
        longest = int(lengths[np.asarray(batch, dtype=np.int64)].max()) if len(batch) else 0
        return len(batch) * longest, longest

    largest = max(epoch, key=padded)
    if padded(largest) <= max(padded(batch) for batch in batches):
        return batches
    return [largest, *batches[1:]]


def trained_weights(model) -> tuple[dict[str, torch.Tensor], float]:
    """A copy, on the CPU, of the weights a trial trains (the trainable parameters: a LoRA model's adapters,
    a full fine-tune's every weight), and its size in MB. A trial trains the model a few steps at the run's
    learning rate: without the copy put back (``restore_weights``) each trial, mode and checkpointing policy
    went on from the weights the trials before it left, so a learning rate that diverges after some steps
    made a later size's loss NaN, and the NaN weights every later trial's."""
    copies = {
        name: param.detach().to("cpu", copy=True)
        for name, param in model.named_parameters()
        if param.requires_grad
    }
    return copies, sum(t.numel() * t.element_size() for t in copies.values()) / 2**20


def restore_weights(model, copies: dict[str, torch.Tensor]) -> None:
    """The weights of ``trained_weights`` back into ``model``'s parameters, in place (the same tensors: a
    compiled model's guards hold)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in copies:
                param.copy_(copies[name])


CHECKPOINTING_ORDER = ("off", "selective", "full")  # ever more recompute for ever less activation memory


def modes_to_measure(modes: Sequence[str], compile_mode: str) -> tuple[list[str], str]:
    """The batching modes tune measures of ``tune.modes``, and a sentence naming those left out (empty if
    none): CUDA graphs (``compile_mode: reduce-overhead``) replay packed micro-batches of one shape, and train
    refuses another mode with them, so only ``packed`` is measured."""
    if compile_mode != "reduce-overhead":
        return list(modes), ""
    others = [mode for mode in modes if mode != "packed"]
    note = (
        f"tune.modes {', '.join(others)} not measured: train.runtime.compile_mode reduce-overhead replays "
        "packed micro-batches of one shape."
        if others
        else ""
    )
    return ["packed"], note


@dataclass(frozen=True)
class PolicyLadders:
    """The batching-mode ladders measured under one gradient checkpointing policy, and their best."""

    policy: str
    ladders: list[ModeLadder]
    best: ModeLadder | None
    next_not_measured: str | None = None  # the policy memory called for that the time limit left out
    # memory called for recompute and CUDA graphs (compile_mode reduce-overhead) rule it out
    recompute_ruled_out: bool = False


def memory_bound(ladders: Sequence[ModeLadder]) -> bool:
    """True when memory (out of memory, or over the headroom) stopped some mode's ladder."""
    return any(ladder.trials and ladder.trials[-1].status in (OOM, OVER) for ladder in ladders)


def tune_checkpointing(
    run_modes: Callable[[], list[ModeLadder]],
    set_policy: Callable[[str], None],
    requested: str,
    deadline: float | None = None,
    *,
    cuda_graphs: bool = False,
) -> list[PolicyLadders]:
    """The ladders (``run_modes()``, e.g. ``tune_modes``) under each checkpointing policy worth measuring.

    A set policy (``off``, ``selective``, ``full``) is measured alone. ``auto``: ``off`` first, then the next
    policy of ``CHECKPOINTING_ORDER`` only while memory stopped the previous one's ladder: recompute makes
    every step slower, so it can only win by letting a larger micro-batch fit. ``set_policy`` applies one.
    Past ``deadline`` (``tune.max_minutes``) no further policy is measured; the last result names the one
    memory called for (``next_not_measured``). ``cuda_graphs`` (``compile_mode: reduce-overhead``, which a
    checkpointed layer's recompute breaks): ``auto`` measures ``off`` alone, and says so where memory
    stopped it.
    """
    policies = CHECKPOINTING_ORDER if requested == "auto" else (requested,)
    results: list[PolicyLadders] = []
    for index, policy in enumerate(policies):
        set_policy(policy)
        ladders = run_modes()
        results.append(PolicyLadders(policy, ladders, best_mode(ladders)))
        if not memory_bound(ladders):
            break
        if cuda_graphs and index + 1 < len(policies):
            results[-1] = dataclasses.replace(results[-1], recompute_ruled_out=True)
            break
        if index + 1 < len(policies) and past(deadline):
            results[-1] = dataclasses.replace(results[-1], next_not_measured=policies[index + 1])
            break
    return results


def best_policy(results: Sequence[PolicyLadders]) -> PolicyLadders | None:
    """The policy whose best (mode, size) has the most real tokens/s (None: nothing fit under any)."""
    return max(
        (result for result in results if result.best is not None),
        key=lambda result: result.best.chosen.real_tokens_per_s,
        default=None,
    )


def explain_checkpointing(results: Sequence[PolicyLadders], best: PolicyLadders | None) -> str:
    """One sentence comparing the policies measured (empty when only one was and nothing was left out)."""
    if results and results[-1].recompute_ruled_out:
        return (
            f"Memory stopped the ladder under checkpointing {results[-1].policy}; recompute was not "
            "measured: train.runtime.compile_mode reduce-overhead (CUDA graphs) does not run with gradient "
            "checkpointing."
        )
    left_out = results[-1].next_not_measured if results else None
    cut = (
        f" Memory stopped the ladder under checkpointing {results[-1].policy}, but {TIME_PARAM} was reached "
        f"before {left_out} recompute could be measured."
        if left_out
        else ""
    )
    if len(results) < 2:
        return cut.strip()
    parts = [
        f"{r.policy}: micro-batch {r.best.chosen.micro_batch_size} "
        f"({r.best.chosen.real_tokens_per_s:,.0f} real tokens/s)"
        if r.best
        else f"{r.policy}: nothing fit"
        for r in results
    ]
    chosen = f" Gradient checkpointing {best.policy} is the fastest." if best else ""
    measured = "; ".join(parts)
    return f"Memory stopped the ladder, so checkpointing policies were measured ({measured}).{chosen}{cut}"
