"""The training loop: micro-batches -> token-normalised accumulation -> clip -> step, metrics read back only
at logging steps, evaluation, atomic checkpoints and exact resume.

``train`` reads top to bottom; each concern is a component of its own module: batching and the micro-batch
stream (``batching``), the optimizer step (``step.train_step``, also what ``tune`` measures), resume and saves
(``checkpointer.Checkpointer``, ``TrainState``), metric rows, health checks and callbacks (``records``,
``health``), evaluation (``evaluation.evaluate``), the out-of-memory back-off (``backoff``).

Hot-loop rules: no ``.item()``/``.cpu()`` per step (the metrics stay on the device until ``log_every``), no
``empty_cache``, no per-step file I/O, no growing DataFrame (history is a list; one frame at the end).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from time import perf_counter

import torch

from fastlm.engine.batching import loader_settings, micro_batches, seq2seq_batching
from fastlm.engine.checkpoint.files import checkpoint_dir, checkpoint_lock
from fastlm.engine.config import TrainParams
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed.parallel import Collectives, SingleProcess, gradient_sync, wrap_model
from fastlm.engine.evaluate.evaluation import evaluate
from fastlm.engine.model.attention import attention_path, attention_when_compiled, packed_inputs, to_device
from fastlm.engine.model.encoder_decoder import packing_unavailable
from fastlm.engine.model.loss import total_target_tokens
from fastlm.engine.observe.metrics import StepMetrics, device_peak_flops, flops_per_token
from fastlm.engine.observe.profiling import step_profiler
from fastlm.engine.observe.progress import Progress
from fastlm.engine.runtime.environment import Runtime
from fastlm.engine.runtime.probe import probe_runtime
from fastlm.engine.train.backoff import batching_record, halve_micro_batch, resumed_batching
from fastlm.engine.train.early_stop import EarlyStopping
from fastlm.engine.train.persistence import Checkpointer
from fastlm.engine.train.records import Callback, Recorder, run_summary, step_contents
from fastlm.engine.train.signals import GracefulStop, TrainingInterrupted
from fastlm.engine.train.state import TrainState
from fastlm.engine.train.step import make_optimization, train_step
from fastlm.engine.train.time_limit import STOPPED_BY, TimeLimit
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

COUNT_KEYS = ("num_real_tokens", "num_computed_tokens", "num_samples")

__all__ = ["COUNT_KEYS", "Callback", "TrainResult", "train"]


@dataclass
class TrainResult:
    model: torch.nn.Module
    history: list[dict]
    eval_history: list[dict]
    summary: dict = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)  # host wall time of each step this process ran
    runtime: Runtime | None = None  # what the steps ran with (``runtime_probe`` settles CPU choices)


def train(model, train_set: TokenSequences, eval_set: TokenSequences | None, *, params: TrainParams, runtime: Runtime,
          pad_id: int, max_length: int, attn: str, callbacks: Sequence[Callback] = (),
          comm: Collectives | None = None) -> TrainResult:
    """Train ``model`` on ``train_set``; see the module docstring for what the hot loop never does.

    ``comm`` (``engine.distributed.parallel``): this rank's view of a data-parallel run. Every rank runs this function
    on its shard of the batches; only rank 0 writes checkpoints (holding the folder's lock) and calls
    ``callbacks``. Which checkpoint is continued: ``engine.checkpoint.resume.plan_resume``.
    """
    comm = comm or SingleProcess()
    packed_inputs(attn)  # an unknown attention implementation fails here, before any data is read
    params, sides = _batching_for(model, train_set, params, attn)
    with checkpoint_lock(Path(params.checkpoint_dir)) if comm.is_main else nullcontext(), ExitStack() as cleanup:
        device, world, configured, started = runtime.device, comm.world_size, params, perf_counter()
        raw_model = model.to(device)
        wrapped = wrap_model(raw_model, comm, device=device, **_wrapping(params))
        stream_args = {"pad_id": pad_id, "max_length": max_length, "sides": sides, "rank": comm.rank,
                       "world_size": world, "loader_kwargs": loader_settings(params, device)}
        batches_per_epoch = micro_batches(train_set, params, **stream_args).batches_per_epoch()
        steps_per_epoch = max(1, math.ceil(batches_per_epoch / params.batching.gradient_accumulation_steps))
        total_steps = params.max_steps or max(1, math.ceil(params.epochs * steps_per_epoch))
        opt = make_optimization(raw_model, params, runtime, total_steps)
        checkpointer = Checkpointer(params, model=raw_model, opt=opt, comm=comm, train_set=train_set,
                                    max_length=max_length, total_steps=total_steps, device=device)
        state = checkpointer.restore()
        params = resumed_batching(params, state.batching, state.resumed_from)
        state.batching = batching_record(params, configured)
        stream = micro_batches(train_set, params, epoch=state.epoch, batch=state.batch_in_epoch, **stream_args)
        accumulation = params.batching.gradient_accumulation_steps
        first = stream.peek_step(accumulation, device, attn)[0] if state.step < total_steps else None
        # A compiled model may train on another attention path (attention_when_compiled); the probe measures that.
        compiled_attn = attention_when_compiled(attn, params.model.attn_implementation, device) if world == 1 else attn
        runtime, probed = probe_runtime(runtime, params.runtime.precision, raw_model, first, world_size=world,
                                        resumed=state.runtime_choice, compile_request=params.runtime.compile,
                                        micro_batches_left=(total_steps - state.step) * accumulation,
                                        compiled_batch=(to_device(first, device, compiled_attn)
                                                        if first is not None and compiled_attn != attn else None),
                                        compiled_context=partial(attention_path, raw_model, compiled_attn))
        state.runtime_choice = probed.record()
        if runtime.compile and compiled_attn != attn:
            log.info("attention %s -> %s: compiled on %s, the additive-mask path fuses (attention_when_compiled)",
                     attn, compiled_attn, device.type)
            cleanup.enter_context(attention_path(raw_model, compiled_attn))  # put back when training ends
            attn = compiled_attn
            stream.switch_attention(device, attn)
        # The probe's compiled model is trained with (compiled from raw_model: one process, nothing wrapped).
        model = (probed.compiled if probed.compiled is not None and wrapped is raw_model
                 else runtime.compile_model(wrapped))
        sync = gradient_sync(getattr(model, "_orig_mod", model))
        metrics = _step_metrics(raw_model, device, comm, total_steps=total_steps, max_length=max_length)
        recorder = _recorder(state, metrics, raw_model, params, runtime, callbacks, comm, total_steps=total_steps)
        profiler = step_profiler(params.profile, device, enabled=comm.is_main)
        fsdp = params.distributed.strategy == "fsdp"  # FSDP's forward is collective; DDP's is not needed to evaluate
        validate = partial(_validate, model if fsdp else raw_model, eval_set, params=params, runtime=runtime,
                           pad_id=pad_id, max_length=max_length, attn=attn, comm=comm, even_shards=fsdp)
        holds = step_contents(train_set.lengths, steps_per_epoch=steps_per_epoch, rows_per_step=(
            params.batching.micro_batch_size * params.batching.gradient_accumulation_steps * world))
        _log_start(params, total_steps, steps_per_epoch, world, holds)
        log.info("loss: %s", opt.fused_choice)
        budget, out_of_time = TimeLimit(params.max_minutes), False  # train.max_minutes: a stop at a step boundary
        early, ended_early = _early_stopping(params, state), False  # train.early_stopping (engine/train/early_stop.py)
        metrics.start()
        with GracefulStop() as stop:  # SIGTERM / Ctrl-C set a flag, read after each step (engine/train/signals.py)
            while state.step < total_steps:
                profiler.before_step(state.step + 1)
                micro, waited = stream.next_step(params.batching.gradient_accumulation_steps, device, attn)
                metrics.record_data_wait(waited)
                targets, real_tokens, computed_tokens, samples, stop_votes, time_votes = _step_counts(
                    micro, comm, stop, budget)
                try:
                    result = train_step(model, micro, opt, runtime=runtime, total_targets=targets, world_size=world,
                                        gradient_sync=sync)
                except torch.OutOfMemoryError as error:  # this step's update never happened: redo it smaller
                    micro = None
                    stream, params = _backed_off(error, stream, params, state, device, stream_args)
                    state.batching = batching_record(params, configured)
                    continue
                state.step += 1
                state.tokens_seen += real_tokens
                profiler.after_step(state.step)
                recorder.step(result, real_tokens=real_tokens, computed_tokens=computed_tokens, samples=samples,
                              position=stream.progress(batches_per_epoch))
                out_of_time = state.step < total_steps and time_votes > 0
                if out_of_time:  # the stop step is logged, evaluated and saved like a last step
                    recorder.flush(stream.progress(batches_per_epoch))
                best_now = False
                if eval_set is not None and (_due(state.step, params.eval_every, total_steps) or out_of_time):
                    recorder.evaluation(validate())
                    if early is not None:
                        best_now, ended_early = _watch(early, state, checkpointer, total_steps)
                # Read the flag once (a signal may land between the checks); ranks act on the step's common vote.
                stopping = stop.requested if world == 1 else stop_votes > 0
                position = stream.progress(batches_per_epoch)
                saved = checkpointer.maybe_save(state, stream.position,
                                                force=stopping or out_of_time or best_now or ended_early,
                                                before_save=partial(recorder.flush, position))
                if stopping:  # SIGTERM / Ctrl-C arrived during this step: it is complete and saved, stop here
                    recorder.progress.close()
                    comm.barrier()  # the other ranks wait until rank 0's checkpoint is on disk
                    raise TrainingInterrupted(stop.signal_name or "a signal to another rank", state.step, saved,
                                              resume=params.resume)
                if out_of_time:
                    log.info("train.max_minutes (%g) spent at step %d of %d: stopped, checkpoint %s saved "
                             "(train.resume: auto continues it)", params.max_minutes, state.step, total_steps, saved)
                    break
                if ended_early:
                    log.info("early stopping at step %d of %d: no validation-loss improvement in %d evaluations; "
                             "the best was step %d (%.4f)", state.step, total_steps, early.patience,
                             early.best_step, early.best)
                    break
        recorder.progress.close()
        profiler.close(state.step)
        early_summary = _restore_best(early, state, checkpointer)
        summary = run_summary(state, metrics, total_steps=state.step if out_of_time or ended_early else total_steps,
                              steps_per_epoch=steps_per_epoch,
                              wall=perf_counter() - started, n_params=sum(p.numel() for p in raw_model.parameters()),
                              params=params, world_size=world)
        summary.update(compiled=runtime.compile, attention=attn, profile=profiler.summary, planned_steps=total_steps,
                       stopped_by=STOPPED_BY if out_of_time else "early stopping" if ended_early else None, **holds,
                       early_stopping=early_summary,
                       label_smoothing=params.loss.label_smoothing,  # the train loss's; validation is plain
                       fused_linear=opt.fused_head is not None, fused_linear_choice=opt.fused_choice)
        return TrainResult(raw_model, state.history, state.eval_history, summary, metrics.step_times, runtime)


def _batching_for(model, train_set: TokenSequences, params: TrainParams, attn: str) -> tuple[TrainParams, dict]:
    """``params`` and ``seq2seq_batching``'s arguments; an encoder-decoder model on plain text is refused before
    anything is written, and one whose family or attention path cannot keep packed samples apart batches
    ``length_grouped`` instead of ``packed``, said once."""
    sides = seq2seq_batching(model, train_set, attn)  # {} for a causal LM
    if sides and params.batching.mode == "packed" and not sides["seq2seq_packing"]:
        log.warning("train.batching.mode packed is not available here: %s; batching length_grouped instead "
                    "(each side padded to its own batch maximum)", packing_unavailable(model, attn))
        params = params.model_copy(update={"batching": params.batching.model_copy(update={"mode": "length_grouped"})})
    return params, sides


def _step_metrics(raw_model, device: torch.device, comm: Collectives, *, total_steps: int,
                  max_length: int) -> StepMetrics:
    # The whole model's parameters on every strategy: FSDP2's DTensors report their global numel.
    n_params, config, peak = sum(p.numel() for p in raw_model.parameters()), raw_model.config, device_peak_flops(device)
    return StepMetrics(device, total_steps=total_steps, peak_flops=peak * comm.world_size if peak else None,
                       flops_per_token=flops_per_token(n_params, config.num_hidden_layers, config.hidden_size,
                                                       max_length),
                       reduce_loss_sum=comm.sum_device_ if comm.world_size > 1 else None)


def _early_stopping(params: TrainParams, state: TrainState) -> EarlyStopping | None:
    settings = params.early_stopping
    if settings.patience is None:
        return None
    if params.distributed.strategy == "fsdp":
        raise ConfigError("train.early_stopping is not available with distributed.strategy fsdp yet.",
                          fix="use distributed.strategy ddp, or set train.early_stopping.patience: null.")
    return EarlyStopping.from_record(state.early_stopping, patience=settings.patience, min_delta=settings.min_delta)


def _watch(early: EarlyStopping, state: TrainState, checkpointer: Checkpointer,
           total_steps: int) -> tuple[bool, bool]:
    """After an evaluation: (a new best: save this step and keep it, patience ran out before the last step)."""
    best_now = early.update(state.step, state.eval_history[-1]["val_loss"])
    state.early_stopping = early.record()
    if best_now:
        checkpointer.protected = checkpoint_dir(checkpointer.root, state.step)
    return best_now, early.should_stop and state.step < total_steps


def _restore_best(early: EarlyStopping | None, state: TrainState, checkpointer: Checkpointer) -> dict | None:
    """The best step's weights back in the model (the one the run returns and writes), and what to say of it."""
    if early is None:
        return None
    model_step = state.step
    if early.best_step is not None and early.best_step != state.step and checkpointer.protected is not None:
        checkpointer.load_weights(checkpointer.protected)
        model_step = early.best_step
        log.info("early stopping: the model is step %d's (validation loss %.4f), from %s", model_step, early.best,
                 checkpointer.protected)
    return {"best_step": early.best_step, "best_val_loss": early.best, "model_from_step": model_step,
            "best_checkpoint": str(checkpointer.protected) if checkpointer.protected else None,
            "patience": early.patience, "min_delta": early.min_delta}


def _due(step: int, every: int | None, total_steps: int) -> bool:
    return bool(every) and (step % every == 0 or step == total_steps)


def _validate(model, eval_set: TokenSequences, *, params: TrainParams, **kwargs) -> dict:
    """The validation metrics (``evaluation.evaluate``, loss only, ``train.eval_max_batches`` batches)."""
    return evaluate(model, eval_set, params=params, max_batches=params.eval_max_batches, **kwargs).metrics


def _wrapping(params: TrainParams) -> dict:
    """``distributed.wrap_model``'s settings from ``train.distributed``."""
    settings = params.distributed
    return {"strategy": settings.strategy, "find_unused_parameters": settings.find_unused_parameters,
            "bucket_cap_mb": settings.bucket_cap_mb}


def _step_counts(micro: list[dict], comm: Collectives, stop: GracefulStop,
                 budget: TimeLimit) -> tuple[int, int, int, int, float, float]:
    """The step's target, real and computed tokens and samples (host counts from the collator, no sync), summed
    over ranks with the stop and time-budget votes in one small gloo all-reduce; one process: its own counts."""
    counts = [total_target_tokens(micro), *(sum(int(batch[key]) for batch in micro) for key in COUNT_KEYS),
              float(stop.requested), float(budget.spent)]
    if comm.world_size > 1:
        counts = comm.sum_host(counts)
    *numbers, stop_votes, time_votes = counts
    targets, real_tokens, computed_tokens, samples = (int(value) for value in numbers)
    return targets, real_tokens, computed_tokens, samples, stop_votes, time_votes


def _recorder(state: TrainState, metrics: StepMetrics, raw_model, params: TrainParams, runtime: Runtime,
              callbacks: Sequence[Callback], comm: Collectives, *, total_steps: int) -> Recorder:
    """Rows, progress bar and callbacks on rank 0; the other ranks keep the same rows quietly."""
    progress = Progress(total_steps, initial=state.step, quiet=params.quiet or not comm.is_main)
    return Recorder(state, metrics, progress, callbacks if comm.is_main else (), log_every=params.log_every,
                    total_steps=total_steps, compiled=runtime.compile, main=comm.is_main,
                    first_loss={"len_vocab": raw_model.get_input_embeddings().num_embeddings,
                                "from_scratch": getattr(raw_model.config, "_name_or_path", "") == ""})


def _log_start(params: TrainParams, total_steps: int, steps_per_epoch: int, world: int, holds: dict) -> None:
    batching = params.batching
    log.info("Training %d steps (%d per epoch); each optimizer step holds %d rows (%d micro-batch x %d accumulation"
             " x %d process%s), ~%s samples and ~%s real tokens on average; batching %s", total_steps,
             steps_per_epoch, holds["rows_per_step"], batching.micro_batch_size, batching.gradient_accumulation_steps,
             world, "es" if world > 1 else "", f"{holds['samples_per_step']:,.0f}", f"{holds['tokens_per_step']:,.0f}",
             batching.mode)


def _backed_off(error: BaseException, stream, params: TrainParams, state: TrainState, device: torch.device,
                stream_args: dict):
    """The retry's stream and params after an out-of-memory ``error`` (``backoff.halve_micro_batch``, noted in
    ``state.backoffs``): the data restarts at the first sample of the failed step (batch indices double with
    half-size batches)."""
    step = state.step + 1
    smaller = halve_micro_batch(error, params, step, world=stream_args["world_size"], device=device)
    state.backoffs.append({"step": step, "micro_batch_size": smaller.batching.micro_batch_size,
                           "gradient_accumulation_steps": smaller.batching.gradient_accumulation_steps})
    restart = max(0, stream.batch - params.batching.gradient_accumulation_steps) * 2
    return micro_batches(stream.dataset, smaller, **{**stream_args, "rank": 0, "world_size": 1},
                         epoch=stream.epoch, batch=restart), smaller
