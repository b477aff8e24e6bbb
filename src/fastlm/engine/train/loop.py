"""The training loop: micro-batches -> token-normalised accumulation -> clip -> step, metrics read back only
at logging steps, evaluation, atomic checkpoints and exact resume.

``train`` reads top to bottom like torchtitan's ``Trainer.train``: the set-up is ``build.build_training``
(model wrapping, runtime probe, compile, attention switch, micro-batch stream, optimizer, checkpointer and
restore, recorder, early stopping, time budget); the loop fetches a step's micro-batches, counts them, steps
(``step.train_step``, also what ``tune`` measures; an out-of-memory step is redone smaller, ``backoff``),
records (``records``), evaluates (``evaluation.evaluate``) and watches early stopping, saves
(``persistence.Checkpointer``) and checks the stops (signals, time budget, early stopping); then finishes
(the best step's weights back, the summary).

Hot-loop rules: no ``.item()``/``.cpu()`` per step (the metrics stay on the device until ``log_every``), no
``empty_cache``, no per-step file I/O, no growing DataFrame (history is a list; one frame at the end).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import NamedTuple

import torch

from fastlm.engine.batching import micro_batches
from fastlm.engine.checkpoint.layout import checkpoint_dir
from fastlm.engine.checkpoint.lock import checkpoint_lock
from fastlm.engine.config import TrainParams
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed.parallel import Collectives, SingleProcess
from fastlm.engine.model.accumulation import total_target_tokens
from fastlm.engine.model.encoder_decoder import unwrapped
from fastlm.engine.model.lora import model_parameters
from fastlm.engine.model.recompute import checkpointing_in_use
from fastlm.engine.runtime.environment import Runtime
from fastlm.engine.runtime.float8 import plain_layers
from fastlm.engine.runtime.regions import cuda_graph_census, describe_cuda_graphs
from fastlm.engine.train.backoff import batching_record, halve_micro_batch
from fastlm.engine.train.build import TrainingParts, TrainRequest, build_training, settle_request
from fastlm.engine.train.early_stop import EarlyStopping
from fastlm.engine.train.persistence import Checkpointer
from fastlm.engine.train.records import Callback, run_summary
from fastlm.engine.train.schedule import run_schedule
from fastlm.engine.train.signals import GracefulStop, TrainingInterrupted
from fastlm.engine.train.state import TrainState
from fastlm.engine.train.step import Optimization, StepResult, train_step
from fastlm.engine.train.time_limit import STOPPED_BY, TimeLimit

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


class StepCounts(NamedTuple):
    """One step's host counts, summed over ranks, and the ranks' stop and time-budget votes."""

    targets: int
    real_tokens: int
    computed_tokens: int
    samples: int
    stop_votes: float
    time_votes: float


def train(model, train_set: TokenSequences, eval_set: TokenSequences | None, *, params: TrainParams,
          runtime: Runtime, pad_id: int, max_length: int, attn: str, callbacks: Sequence[Callback] = (),
          comm: Collectives | None = None, runtime_choices: Path | None = None) -> TrainResult:  # fmt: skip
    """Train ``model`` on ``train_set``; see the module docstring for what the hot loop never does.

    ``comm`` (``engine.distributed.parallel``): this rank's view of a data-parallel run. Every rank runs this
    function on its shard of the batches; only rank 0 writes checkpoints (holding the folder's lock) and calls
    ``callbacks``. Which checkpoint is continued: ``engine.checkpoint.resume.plan_resume``.
    ``runtime_choices``: the precisions measured before (``engine.runtime.remembered``; None: measure).
    """
    request = settle_request(TrainRequest(model, train_set, eval_set, params=params, runtime=runtime,
                                          pad_id=pad_id, max_length=max_length, attn=attn,
                                          callbacks=callbacks, comm=comm or SingleProcess(),
                                          runtime_choices=runtime_choices))  # fmt: skip
    lock = checkpoint_lock(Path(request.params.checkpoint_dir)) if request.comm.is_main else nullcontext()
    with lock, ExitStack() as cleanup:
        run = build_training(request, cleanup)
        cleanup.callback(lambda: run.stream.close())  # the stream in use at the end (a back-off swaps it)
        state, stopped_by = run.state, _ended_early_before(run)
        # SIGTERM / Ctrl-C set a flag, read after each step (engine/train/signals.py); a worker of several
        # processes keeps handling them (its launcher sends the signal once more)
        with GracefulStop(persistent=run.world > 1) as stop:
            while stopped_by is None and state.step < run.total_steps:
                run.profiler.before_step(state.step + 1)
                micro, waited = run.stream.next_step(run.accumulation, run.device, run.attn)
                run.metrics.record_data_wait(waited)
                counts = _step_counts(micro, run.comm, stop, run.budget)
                try:
                    result = train_step(
                        run.model,
                        micro,
                        run.opt,
                        runtime=run.runtime,
                        total_targets=counts.targets,
                        world_size=run.world,
                        gradient_sync=run.sync,
                    )
                except torch.OutOfMemoryError as error:  # this step's update never happened: redo it smaller
                    micro = None
                    run.metrics.discard_attempt()  # its time apart (oom_failed_s), not the redone step's
                    _back_off(run, error)
                    continue
                _count_step(run, result, counts)
                out_of_time = state.step < run.total_steps and counts.time_votes > 0
                if out_of_time:  # the stop step is logged, evaluated and saved like a last step
                    run.recorder.flush(run.position())
                best_now, ended_early = _evaluate_if_due(run, out_of_time)
                # Read the flag once (a signal may land between the checks); ranks act on the step's common
                # vote.
                stopping = stop.requested if run.world == 1 else counts.stop_votes > 0
                saved = _save(run, force=stopping or out_of_time or best_now or ended_early)
                run.metrics.set_aside()  # the evaluation's and the save's time: not the next step's
                if stopping:  # SIGTERM / Ctrl-C arrived during this step: it is complete and saved, stop here
                    _interrupt(run, stop, saved)
                stopped_by = _stop_reason(run, saved, out_of_time=out_of_time, ended_early=ended_early)
                if stopped_by is not None:
                    break
        result = _finish(run, stopped_by)
        _mark_ended(run, stopped_by)
        return result


def _mark_ended(run: TrainingParts, stopped_by: str | None) -> None:
    """The run ended (its last step, early stopping, or nothing to train), not a time-budget stop, which
    ``train.resume: auto`` continues: said on its newest checkpoint where that reads unfinished
    (``Checkpointer.ended``), so the next unnamed run does not take it for the newest interrupted run and
    write over its model. After ``_finish``: a run that failed there did not end."""
    if stopped_by == STOPPED_BY:
        return
    state = run.state
    nothing_trained = state.resumed_from is not None and state.step == state.first_step
    run.checkpointer.ended(state, "nothing to train" if nothing_trained else stopped_by or "last step")


def _step_counts(micro: list[dict], comm: Collectives, stop: GracefulStop, budget: TimeLimit) -> StepCounts:
    """The step's target, real and computed tokens and samples (host counts from the collator, no sync),
    summed over ranks with the stop and time-budget votes in one small gloo all-reduce; one process: its own
    counts."""
    counts = [
        total_target_tokens(micro),
        *(sum(int(batch[key]) for batch in micro) for key in COUNT_KEYS),
        float(stop.requested),
        float(budget.spent),
    ]
    if comm.world_size > 1:
        counts = comm.sum_host(counts)
    *numbers, stop_votes, time_votes = counts
    targets, real_tokens, computed_tokens, samples = (int(value) for value in numbers)
    return StepCounts(targets, real_tokens, computed_tokens, samples, stop_votes, time_votes)


def _back_off(run: TrainingParts, error: BaseException) -> None:
    """The retry's stream and params after an out-of-memory ``error`` in a step
    (``backoff.halve_micro_batch``, noted in ``state.backoffs``): the data restarts at the first sample of
    the failed step (its position doubles: every configured batch is cut in twice the pieces, a short
    batch's last ones empty)."""
    state, stream, step = run.state, run.stream, run.state.step + 1
    configured = run.configured.batching.micro_batch_size
    smaller = halve_micro_batch(
        error, run.params, step, world=run.layout.world_size, device=run.device, configured=configured
    )
    state.backoffs.append(
        {
            "step": step,
            "micro_batch_size": smaller.batching.micro_batch_size,
            "gradient_accumulation_steps": smaller.batching.gradient_accumulation_steps,
        }
    )
    epoch, start = stream.step_start  # a configured batch's first piece: each of its pieces now two
    stream.close()  # its workers (persistent ones) load the old batching: the new stream starts its own
    run.stream = micro_batches(
        stream.dataset,
        smaller,
        replace(run.layout, rank=0, world_size=1),
        epoch=epoch,
        batch=start * 2,
        configured=configured,  # its batches cut in twice the pieces: the same samples
    )
    run.params = smaller
    state.batching = batching_record(smaller, run.configured)


def _count_step(run: TrainingParts, result: StepResult, counts: StepCounts) -> None:
    """The step is done: advance the state and record its row (metrics stay on the device until
    ``log_every``)."""
    state = run.state
    state.step += 1
    state.tokens_seen += counts.real_tokens
    run.profiler.after_step(state.step)
    run.recorder.step(
        result,
        real_tokens=counts.real_tokens,
        computed_tokens=counts.computed_tokens,
        samples=counts.samples,
        position=run.position(),
    )


def _evaluate_if_due(run: TrainingParts, out_of_time: bool) -> tuple[bool, bool]:
    """Validation when due (``train.eval_every``, the last step, a time-budget stop; none of them where
    ``eval_every`` is null: such a run never validates, so its stop is as quick as its end), then early
    stopping's watch: (a new best: save this step and keep it, patience ran out before the last step).
    Only the ``eval_every`` steps count patience: a last step or a stop between them is evaluated off the
    schedule (``EarlyStopping.update``), so a run continued past it (more ``train.max_steps``, a new time
    budget) stops where the run that never ended there does."""
    step, every = run.state.step, run.params.eval_every
    if run.validate is None or not every or not (_due(step, every, run.total_steps) or out_of_time):
        return False, False
    started = perf_counter()
    metrics = run.validate()
    run.recorder.evaluation(metrics, seconds=perf_counter() - started)
    if run.early is None:
        return False, False
    return _watch(run.early, run.state, run.checkpointer, run.total_steps, scheduled=step % every == 0)


def _save(run: TrainingParts, *, force: bool) -> Path | None:
    """A checkpoint when due or forced (the pending metric rows flushed first); its folder, else None."""
    position = run.position()
    return run.checkpointer.maybe_save(
        run.state, run.stream.position, force=force, before_save=partial(run.recorder.flush, position)
    )


def _interrupt(run: TrainingParts, stop: GracefulStop, saved: Path | None) -> None:
    """Stop on a signal: the step is complete and saved; the other ranks wait until rank 0's checkpoint is on
    disk."""
    run.recorder.progress.close()
    run.comm.barrier()
    raise TrainingInterrupted(
        stop.signal_name or "a signal to another rank", run.state.step, saved, resume=run.params.resume
    )


def _ended_early_before(run: TrainingParts) -> str | None:
    """ "early stopping" for a resumed run that early stopping had ended, under this run's patience: nothing
    to train (its best model comes back), said once; None otherwise."""
    state, early = run.state, run.early
    if early is None or state.resumed_from is None or not early.should_stop or state.step >= run.total_steps:
        return None
    log.warning(
        "%s: early stopping ended this run at step %d (%s; %s): nothing to train. Raise "
        "train.early_stopping.patience to continue it, or set train.resume: never to train again "
        "from scratch.",
        state.resumed_from,
        state.step,
        early.without_improvement(),
        early.best_said(),
    )
    return "early stopping"


def _stop_reason(
    run: TrainingParts, saved: Path | None, *, out_of_time: bool, ended_early: bool
) -> str | None:
    """Why the run stops after this step (the summary's ``stopped_by``), said once; None: it goes on."""
    state, total_steps, early = run.state, run.total_steps, run.early
    if out_of_time:
        log.info(
            "train.max_minutes (%g) spent at step %d of %d: stopped, checkpoint %s saved "
            "(train.resume: auto continues it)",
            run.params.max_minutes,
            state.step,
            total_steps,
            saved,
        )
        return STOPPED_BY
    if ended_early:
        log.info(
            "early stopping at step %d of %d: %s; %s",
            state.step,
            total_steps,
            early.without_improvement(),
            early.best_said(),
        )
        return "early stopping"
    return None


def _finish(run: TrainingParts, stopped_by: str | None) -> TrainResult:
    """The best step's weights back (early stopping), the run's summary and the result."""
    state, params, opt = run.state, run.params, run.opt
    run.recorder.progress.close()
    run.profiler.close(state.step)
    early_summary = _restore_best(run.early, state, run.checkpointer)
    summary = run_summary(
        state,
        run.metrics,
        total_steps=state.step if stopped_by else run.total_steps,
        epochs=run.plan.epochs_at(state.step if stopped_by else run.total_steps),  # in each epoch's own steps
        wall=state.elapsed_before_s + perf_counter() - run.started,  # the run's, not only this process's
        n_params=model_parameters(run.raw_model),  # a QLoRA base's 4-bit weights unpacked
        params=run.configured,  # the effective batch as configured (a back-off cuts its batches in pieces)
        world_size=run.world,
    )
    clock = run.compile_clock
    limit_hits = clock.recompile_limit_hits()
    summary.update(
        compiled=run.runtime.compile,
        compiles=clock.compiles,  # torch.compile's compiles in this process: the probes', the steps', eval's
        # functions dynamo ran eagerly past torch._dynamo.config.recompile_limit, said once as a warning
        recompile_limit_hit=bool(limit_hits),
        recompile_limit_functions=limit_hits,
        attention=run.attn,
        profile=run.profiler.summary,
        planned_steps=run.total_steps,
        # the schedule's warmup: warmup_steps, or warmup_ratio's of the planned steps, cut to them
        warmup_steps=run_schedule(params.optimizer, run.total_steps).warmup_steps,
        stopped_by=stopped_by,
        **run.holds,
        early_stopping=early_summary,
        label_smoothing=params.loss.label_smoothing,  # the train loss's; validation is plain
        neftune_noise_alpha=params.model.neftune_noise_alpha,  # training's embeddings; validation is plain
        # a chat's earlier answers were its encoder's input, its last answer alone trained (the report says)
        encoder_decoder=bool(getattr(unwrapped(run.raw_model).config, "is_encoder_decoder", False)),
        **_lever_summary(params, opt),
        cuda_graphs=_cuda_graphs(run),
    )
    summary.update(_model_figures(state, early_summary))
    if run.world == 1:  # several processes hand back a model rebuilt from the weights: plain already
        plain_layers(run.raw_model)  # float8's layers: the model computes as the one saved
    return TrainResult(
        run.raw_model, state.history, state.eval_history, summary, run.metrics.step_times, run.runtime
    )


def _model_figures(state: TrainState, early_summary: dict | None) -> dict:
    """``final_val_loss`` / ``final_val_perplexity`` are the returned model's: early stopping's best step's
    where its weights came back (``last_val_loss``: the last evaluation); otherwise nothing changes.
    ``model_train_loss``: the train loss of the returned model's step (its logged row: a best step is saved,
    its pending rows flushed first), ``final_train_loss`` where that is the last step."""
    last = state.eval_history[-1] if state.eval_history else {}
    model_step = (early_summary or {}).get("model_from_step")
    if model_step is None or model_step == state.step:
        trained = state.history[-1] if state.history else {}
    else:
        trained = next((record for record in state.history if record["step"] == model_step), {})
    figures = {"last_val_loss": last.get("val_loss"), "model_train_loss": trained.get("loss")}
    if model_step is None or model_step == last.get("step"):
        return figures
    kept = next((record for record in state.eval_history if record["step"] == model_step), {})
    return {
        **figures,
        "final_val_loss": kept.get("val_loss"),
        "final_val_perplexity": kept.get("val_perplexity"),
    }


def _cuda_graphs(run: TrainingParts) -> str | None:
    """``compile_mode: reduce-overhead``: the CUDA graphs the run recorded and the compiled graphs that ran
    without one (None in the default mode); a warning where some did on CUDA."""
    if run.graphs_at_start is None:
        return None
    text = describe_cuda_graphs(run.graphs_at_start, cuda_graph_census(run.device), run.device)
    if run.device.type == "cuda" and "ran without" in text:
        log.warning("train.runtime.compile_mode reduce-overhead: CUDA graphs %s", text)
    return text


def _lever_summary(params: TrainParams, opt: Optimization) -> dict:
    """What the run's levers did, for the summary and its MLflow parameters (``tracking.SUMMARY_PARAMS``):
    the optimizer, the gradient-checkpointing policy read from the model's layers and how many of them
    checkpoint (``auto`` builds ``off`` until the tune pipeline writes a policy), liger's patch and the fused
    LM head with its kernel (None: a plain head), each decision with its reason where one was made. float8's
    is the runtime's (``runtime.float8_choice``)."""
    fused = opt.fused_head
    checkpointing, checkpointed = checkpointing_in_use(opt.model)
    return {
        "optimizer": params.optimizer.name,
        "gradient_checkpointing": checkpointing,
        "checkpointed_layers": checkpointed,
        "liger": opt.liger_choice,
        "fused_linear": fused is not None,
        "fused_linear_kernel": fused.kernel if fused is not None else None,
        "fused_linear_choice": opt.fused_choice,
        "param_dtype": opt.param_dtype_choice,
    }


def _watch(
    early: EarlyStopping, state: TrainState, checkpointer: Checkpointer, total_steps: int, *, scheduled: bool
) -> tuple[bool, bool]:
    """After an evaluation: (a new best: save this step and keep it, patience ran out before the last
    step). ``scheduled``: False for an evaluation between two ``eval_every`` steps (a time-budget stop's, a
    last step's), which may be the best but uses no patience (``EarlyStopping.update``)."""
    best_now = early.update(state.step, state.eval_history[-1]["val_loss"], scheduled=scheduled)
    state.early_stopping = early.record()
    if best_now:
        checkpointer.protected = checkpoint_dir(checkpointer.root, state.step)
    return best_now, early.should_stop and state.step < total_steps


def _restore_best(early: EarlyStopping | None, state: TrainState, checkpointer: Checkpointer) -> dict | None:
    """The best step's weights back in the model (the one the run returns and writes), and what to say of
    it."""
    if early is None:
        return None
    model_step = state.step
    if early.best_step is not None and early.best_step != state.step and checkpointer.protected is not None:
        checkpointer.load_weights(checkpointer.protected)
        model_step = early.best_step
        log.info(
            "early stopping: the model is step %d's (validation loss %.4f), from %s",
            model_step,
            early.best,
            checkpointer.protected,
        )
    return {
        "best_step": early.best_step,
        "best_val_loss": early.best,
        "model_from_step": model_step,
        "best_checkpoint": str(checkpointer.protected) if checkpointer.protected else None,
        "patience": early.patience,
        "min_delta": early.min_delta,
    }


def _due(step: int, every: int | None, total_steps: int) -> bool:
    return bool(every) and (step % every == 0 or step == total_steps)
