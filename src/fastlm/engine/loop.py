"""The training loop: micro-batches -> token-normalised accumulation -> clip -> step, metrics read back only
at logging steps, evaluation, atomic checkpoints and exact resume.

Hot-loop rules: no ``.item()``/``.cpu()`` per step (the metrics stay on the device until ``log_every``), no
``empty_cache``, no per-step file I/O, no growing DataFrame (history is a list; one frame at the end).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

import torch
from torch.utils.data import DataLoader

from fastlm.engine.attention import packed_inputs, to_device
from fastlm.engine.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    checkpoint_lock,
    load_checkpoint,
    save_checkpoint,
)
from fastlm.engine.config import TrainParams
from fastlm.engine.data import (
    DynamicPaddingCollator,
    LengthGroupedSampler,
    PackedBatchSampler,
    PackedCollator,
    Seq2SeqCollator,
    seq2seq_lengths,
)
from fastlm.engine.data.packing import TokenBudget, choose_row_length
from fastlm.engine.data.samplers import LENGTH_GROUPED_MEGA_BATCHES
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed import (
    Collectives,
    SingleProcess,
    full_state_dicts,
    gradient_sync,
    is_sharded,
    load_full_state_dicts,
    wrap_model,
)
from fastlm.engine.loss import accumulate_gradients, causal_lm_loss_sum, forward_logits, total_target_tokens
from fastlm.engine.metrics import StepMetrics, device_peak_flops, flops_per_token
from fastlm.engine.optim import make_adamw
from fastlm.engine.profiling import StepProfiler
from fastlm.engine.progress import Progress
from fastlm.engine.rates import timed_rate
from fastlm.engine.resume import data_digest, plan_resume, run_digest
from fastlm.engine.runtime import Runtime, resolve_device, usable_cpu_count
from fastlm.engine.schedule import LRSchedule, make_lr_scheduler
from fastlm.engine.signals import GracefulStop, TrainingInterrupted
from fastlm.errors import ConfigError, FastlmError

log = logging.getLogger(__name__)
Callback = Callable[[str, dict], None]  # ("train" | "eval", record)


class NonFiniteLossError(FastlmError):
    """The loss became NaN or inf: training stopped, the last good checkpoint is kept."""


@dataclass
class TrainResult:
    model: torch.nn.Module
    history: list[dict]
    eval_history: list[dict]
    summary: dict = field(default_factory=dict)


def make_batching(params: TrainParams, lengths, *, pad_id: int, max_length: int, attn: str, seed: int,
                  shuffle: bool = True, prompt_lengths=None, decoder_start_id: int | None = None):
    """The batch sampler and collator of the configured mode (packed: ``packed_budget``).

    Encoder-decoder models (``decoder_start_id`` and ``prompt_lengths`` given, see ``seq2seq_batching``): a
    ``Seq2SeqCollator`` padding each side to its own batch maximum, batches grouped by the longer side;
    ``packed`` is not available for them yet (cross-attention isolation) and runs ``length_grouped``, logged.
    """
    batching = params.batching
    pad_multiple = batching.pad_multiple(resolve_device(params.runtime.device).type)
    seq2seq = decoder_start_id is not None
    mode = batching.mode
    if seq2seq:
        lengths = seq2seq_lengths(lengths, prompt_lengths)
        if mode == "packed":  # train() says so once, in its log and summary
            mode = "length_grouped"
    if mode == "packed":
        budget = packed_budget(batching, lengths, max_length)
        sampler = PackedBatchSampler(lengths, budget, seed=seed)
        packed_inputs(attn)  # an unknown implementation fails here, before any data is read
        # Masks / varlen boundaries are made per attention path by attention.to_device, on the device.
        collator = PackedCollator(pad_id=pad_id, budget=budget, pad_to_multiple_of=pad_multiple,
                                  attention_mask_format="none")
    else:
        group = LENGTH_GROUPED_MEGA_BATCHES if mode == "length_grouped" else 1
        sampler = LengthGroupedSampler(lengths, batching.micro_batch_size, mega_batch_mult=group, seed=seed)
        if mode == "dynamic":
            sampler = _RandomBatches(lengths, batching.micro_batch_size, seed=seed)
        collator = (Seq2SeqCollator(pad_id=pad_id, decoder_start_id=decoder_start_id,
                                    pad_to_multiple_of=pad_multiple) if seq2seq else
                    DynamicPaddingCollator(pad_id=pad_id, pad_to_multiple_of=pad_multiple))
    return sampler, collator


def packed_budget(batching, lengths, max_length: int) -> TokenBudget:
    """Rows of ``batching.row_length`` tokens (``auto``: chosen from ``lengths``) holding together the
    micro-batch's ``micro_batch_size * max_length`` tokens."""
    row_length = batching.row_length
    if row_length == "auto":
        row_length = choose_row_length(lengths, max_length)
    longest = int(lengths.max()) if len(lengths) else 0
    if longest > row_length:
        raise ConfigError(f"train.batching.row_length is {row_length} tokens but the data has a sample of {longest}.",
                          fix=f"set train.batching.row_length to auto or to at least {longest}.")
    return TokenBudget(row_length=row_length,
                       rows_per_batch=max(1, batching.micro_batch_size * max_length // row_length))


def seq2seq_batching(model, dataset: TokenSequences) -> dict:
    """``make_batching``'s encoder-decoder arguments for ``model`` on ``dataset`` (none for a causal LM).

    The prompt feeds the encoder and the response is the decoder target, so the data must be prompt/response.
    """
    config = getattr(model, "config", None)
    if not getattr(config, "is_encoder_decoder", False):
        return {}
    if dataset.prompt_lengths is None:
        raise ConfigError(
            f"{type(model).__name__} is an encoder-decoder model: it trains on prompt/response data (the prompt "
            "feeds the encoder, the response is the decoder target), but the tokenized split has no prompts.",
            fix="set split.prompt_column and split.response_column (or split.messages_column) and rerun `kedro "
            "run --pipeline=split`, or train a decoder-only model on plain text.")
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "pad_token_id", None)
    if start is None:
        raise ConfigError(f"{type(model).__name__} has no decoder_start_token_id in its config.json.",
                          fix="set decoder_start_token_id in the model folder's config.json (BART: the EOS id, "
                          "T5: the pad id).")
    return {"prompt_lengths": dataset.prompt_lengths, "decoder_start_id": int(start)}


class _RandomBatches(LengthGroupedSampler):
    """``dynamic`` mode: random batches (no length grouping), each padded to its own longest sample."""

    def _make_batches(self, rng):
        order = rng.permutation(self.lengths.size)
        return [order[i : i + self.batch_size] for i in range(0, order.size, self.batch_size)]


def loader_settings(params: TrainParams, device: torch.device) -> dict:
    """Workers from the cores (none on CPU, where they would compete with the math), pinned memory on CUDA."""
    settings = params.dataloader
    workers = settings.num_workers
    if workers == "auto":
        workers = min(8, max(2, usable_cpu_count() // 2)) if device.type == "cuda" else 0
    pin = device.type == "cuda" if settings.pin_memory == "auto" else settings.pin_memory
    extra = {"persistent_workers": settings.persistent_workers, "prefetch_factor": settings.prefetch_factor}
    return {"num_workers": workers, "pin_memory": pin, **(extra if workers else {})}


class MicroBatches:
    """Endless micro-batches across epochs; ``position`` counts what the loop consumed (for exact resume).

    ``batch`` counts this rank's batches; ``position`` reports GLOBAL batches (``batch * shards``: every rank
    has consumed as many), so a checkpoint can be resumed by another number of ranks (``resume_position``).
    """

    def __init__(self, dataset: TokenSequences, sampler, collator, loader_kwargs: dict, *, epoch: int, batch: int):
        self.dataset, self.sampler, self.collator, self.loader_kwargs = dataset, sampler, collator, loader_kwargs
        self.epoch, self.batch = epoch, batch
        self._iterator: Iterator | None = None

    @property
    def position(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch * self.sampler.num_shards}

    def batches_per_epoch(self) -> int:
        self.sampler.set_epoch(self.epoch, start_batch=0)
        return len(self.sampler)

    def progress(self, batches_per_epoch: int) -> dict:
        """``position`` for a metric record, ``epoch`` as epochs done (1.5: half-way through the second)."""
        return {**self.position, "epoch": round(self.epoch + self.batch / max(1, batches_per_epoch), 4)}

    def __next__(self) -> dict:
        if self._iterator is None:
            self.sampler.set_epoch(self.epoch, start_batch=self.batch)
            loader = DataLoader(self.dataset, batch_sampler=self.sampler, collate_fn=self.collator, **self.loader_kwargs)
            self._iterator = iter(loader)
        try:
            batch = next(self._iterator)
        except StopIteration:
            self.epoch, self.batch, self._iterator = self.epoch + 1, 0, None
            return next(self)
        self.batch += 1
        return batch


def evaluate(model, dataset: TokenSequences, params: TrainParams, runtime: Runtime, *, pad_id: int, max_length: int,
             attn: str, max_batches: int | None, comm: Collectives | None = None, even_shards: bool = False) -> dict:
    """Mean loss and perplexity over target tokens, batched like training, under no_grad and autocast.

    Data parallel: each rank evaluates its shard of the batches (``max_batches`` is split between ranks) and
    the sums are added across ranks once, at the end. ``even_shards`` for FSDP, whose forward is collective.
    """
    comm = comm or SingleProcess()
    sampler, collator = make_batching(params, dataset.lengths, pad_id=pad_id, max_length=max_length, attn=attn, seed=0,
                                      **seq2seq_batching(model, dataset))
    sampler.shard(comm.rank, comm.world_size, even=even_shards)
    if max_batches is not None:
        max_batches = math.ceil(max_batches / comm.world_size)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collator)
    loss_sum = torch.zeros((), dtype=torch.float64, device=runtime.device)
    targets = torch.zeros((), dtype=torch.int64, device=runtime.device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for index, batch in enumerate(loader):
            if max_batches is not None and index >= max_batches:
                break
            batch = to_device(batch, runtime.device, attn)
            with runtime.autocast_context():
                logits = forward_logits(model, batch)
            batch_sum, batch_targets = causal_lm_loss_sum(logits, batch["labels"])
            loss_sum += batch_sum
            targets += batch_targets
    model.train(was_training)
    if comm.world_size > 1:
        sums = comm.sum_device_(torch.stack([loss_sum, targets.to(torch.float64)]))
        loss_sum, targets = sums[0], sums[1].round().to(torch.int64)
    loss = (loss_sum / targets.clamp(min=1)).item()  # one sync per evaluation
    return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0)), "val_target_tokens": int(targets.item())}


def train(model, train_set: TokenSequences, eval_set: TokenSequences | None, *, params: TrainParams, runtime: Runtime,
          pad_id: int, max_length: int, attn: str, callbacks: Sequence[Callback] = (),
          comm: Collectives | None = None) -> TrainResult:
    """Train ``model`` on ``train_set``; see the module docstring for what the hot loop never does.

    ``comm`` (``engine.distributed``): this rank's view of a data-parallel run. Every rank runs this function
    on its shard of the batches; only rank 0 writes checkpoints (holding the folder's lock) and calls
    ``callbacks``. Which checkpoint is continued: ``engine.resume.plan_resume``.
    """
    comm = comm or SingleProcess()
    # An encoder-decoder model on plain text is refused before anything is written; packing is not available for
    # it yet (cross-attention isolation per sample): it batches length_grouped, and the log and summary say so.
    sides = seq2seq_batching(model, train_set)  # {} for a causal LM
    if sides and params.batching.mode == "packed":
        log.warning("train.batching.mode packed is not available for encoder-decoder models yet: batching "
                    "length_grouped instead (each side padded to its own batch maximum)")
        params = params.model_copy(update={"batching": params.batching.model_copy(update={"mode": "length_grouped"})})
    with checkpoint_lock(Path(params.checkpoint_dir)) if comm.is_main else nullcontext():
        return _train(model, train_set, eval_set, params=params, runtime=runtime, pad_id=pad_id,
                      max_length=max_length, attn=attn, callbacks=callbacks, comm=comm, sides=sides)


def _train(model, train_set: TokenSequences, eval_set: TokenSequences | None, *, params: TrainParams,
           runtime: Runtime, pad_id: int, max_length: int, attn: str, callbacks: Sequence[Callback],
           comm: Collectives, sides: dict) -> TrainResult:
    """``train`` under the checkpoint lock; ``sides``: ``seq2seq_batching``'s arguments ({} for a causal LM)."""
    device, accum, world = runtime.device, params.batching.gradient_accumulation_steps, comm.world_size
    dist_params = params.distributed
    model.to(device)
    raw_model = model
    model = runtime.compile_model(wrap_model(raw_model, comm, strategy=dist_params.strategy, device=device,
                                             find_unused_parameters=dist_params.find_unused_parameters,
                                             bucket_cap_mb=dist_params.bucket_cap_mb))
    sync = gradient_sync(model if not hasattr(model, "_orig_mod") else model._orig_mod)
    sampler, collator = make_batching(params, train_set.lengths, pad_id=pad_id, max_length=max_length,
                                      attn=attn, seed=params.seed, **sides)
    sampler.shard(comm.rank, world)
    stream = MicroBatches(train_set, sampler, collator, loader_settings(params, device), epoch=0, batch=0)
    batches_per_epoch = stream.batches_per_epoch()
    steps_per_epoch = max(1, math.ceil(batches_per_epoch / accum))
    total_steps = params.max_steps or max(1, math.ceil(params.epochs * steps_per_epoch))
    optimizer = make_adamw(raw_model, lr=params.optimizer.lr, weight_decay=params.optimizer.weight_decay,
                           betas=(params.optimizer.beta1, params.optimizer.beta2), eps=params.optimizer.eps)
    schedule = LRSchedule(params.optimizer.lr, total_steps, min(params.optimizer.warmup_steps, total_steps),
                          params.optimizer.decay, params.optimizer.min_lr_ratio)
    scheduler = make_lr_scheduler(optimizer, schedule)
    scaler = runtime.make_grad_scaler()
    root = Path(params.checkpoint_dir)
    state = {"step": 0, "history": [], "eval_history": [], "tokens_seen": 0, **stream.position}
    configured = params  # an OOM back-off (now or before the checkpoint) replaces params.batching
    sharded = is_sharded(raw_model)  # FSDP2: checkpoints hold the gathered, whole state dicts
    # LoRA: the frozen base comes from name_or_path again; checkpoints hold the trainable tensors only.
    trainable_only = not sharded and any(not param.requires_grad for param in raw_model.parameters())
    digest = run_digest(raw_model, params, max_length=max_length, world_size=world, sharded=sharded,
                        data=data_digest(train_set.values, train_set.offsets, train_set.prompt_lengths))
    plan = plan_resume(root, params.resume, digest, total_steps=total_steps, world_size=world,
                       move_old=comm.is_main)
    resume_from = plan.checkpoint
    if resume_from is not None:
        saved = plan.state.get("batching") or {}
        saved_micro = saved.get("micro_batch_size", params.batching.micro_batch_size)
        if saved_micro < params.batching.micro_batch_size:  # saved after an OOM back-off: keep what fitted
            accum *= int(saved.get("accumulation_factor", 1))
            params = params.model_copy(update={"batching": params.batching.model_copy(
                update={"micro_batch_size": saved_micro, "gradient_accumulation_steps": accum})})
            sampler, collator = make_batching(params, train_set.lengths, pad_id=pad_id, max_length=max_length,
                                              attn=attn, seed=params.seed, **sides)
            sampler.shard(comm.rank, world)
            stream = MicroBatches(train_set, sampler, collator, stream.loader_kwargs, epoch=0, batch=0)
            log.info("Continuing with micro_batch_size %d x gradient_accumulation_steps %d, as %s was saved after "
                     "an out-of-memory back-off", saved_micro, accum, resume_from)
        own_loader = sharded or plan.state.get("trainable_only", False)
        state = load_checkpoint(resume_from, model=None if own_loader else raw_model,
                                optimizer=None if sharded else optimizer, scheduler=scheduler, grad_scaler=scaler,
                                map_location=device)
        if sharded:
            load_full_state_dicts(raw_model, optimizer, resume_from)
        elif own_loader:
            _load_trainable(raw_model, resume_from)
        stream.epoch, stream.batch = state["epoch"], resume_position(state, world, resume_from)
        log.info("Resumed from %s at step %d of %d (epoch %d, micro-batch %d of this rank)", resume_from,
                 state["step"], total_steps, stream.epoch, stream.batch)
        if state["step"] >= total_steps:
            log.warning("%s already reached step %d of this run's %d: nothing to train. Raise train.max_steps (or "
                        "train.epochs) to continue it, or set train.resume: never to train again from scratch.",
                        resume_from, state["step"], total_steps)
    config = raw_model.config
    # The whole model's parameters on every strategy: FSDP2's DTensors report their global numel.
    n_params = sum(p.numel() for p in raw_model.parameters())
    peak = device_peak_flops(device)
    metrics = StepMetrics(device, total_steps=total_steps, peak_flops=peak * world if peak else None,
                          flops_per_token=flops_per_token(n_params, config.num_hidden_layers, config.hidden_size,
                                                          max_length),
                          reduce_loss_sum=comm.sum_device_ if world > 1 else None)
    log.info("Training %d steps (%d per epoch); effective batch = %d micro-batch x %d accumulation x %d process%s; "
             "batching %s", total_steps, steps_per_epoch, params.batching.micro_batch_size, accum, world,
             "es" if world > 1 else "", params.batching.mode)
    step, history, eval_history, tokens_seen = (state["step"], state["history"], state["eval_history"],
                                                state["tokens_seen"])
    if not comm.is_main:
        callbacks = ()
    progress = Progress(total_steps, initial=step, quiet=params.quiet or not comm.is_main)
    grad_norms: list[float] = [record["grad_norm"] for record in history if record.get("grad_norm") is not None]
    clip = params.optimizer.grad_clip if params.optimizer.grad_clip is not None else math.inf
    profile = params.profile
    profiler = (StepProfiler(start_step=profile.start_step, steps=profile.steps, trace_dir=profile.trace_dir,
                             device=device) if profile.enabled and comm.is_main else None)
    eval_model = model if dist_params.strategy == "fsdp" else raw_model  # DDP's forward is not needed to evaluate
    backoffs: list[dict] = []
    first_step, last_good = step, resume_from  # this process's first step; this run's newest checkpoint
    start = perf_counter()
    metrics.start()
    with GracefulStop() as stop:  # SIGTERM / Ctrl-C set a flag, read after each step (engine/signals.py)
        while step < total_steps:
            if profiler is not None:
                profiler.before_step(step + 1)
            waited = perf_counter()
            with torch.profiler.record_function("fastlm.data"):
                fetched = [next(stream) for _ in range(accum)]  # data wait: time blocked on the DataLoader only
            metrics.record_data_wait(perf_counter() - waited)
            micro = [to_device(batch, device, attn) for batch in fetched]
            # Host-side counts from the collator (no sync); summed over ranks in one small gloo all-reduce.
            counts = [total_target_tokens(micro), *(sum(int(b[key]) for b in micro) for key in COUNT_KEYS)]
            if world > 1:
                *counts, stop_votes = comm.sum_host([*counts, float(stop.requested)])
            targets, real_tokens, computed_tokens, samples = (int(value) for value in counts)
            try:
                loss_sum, n_targets = accumulate_gradients(model, micro, autocast=runtime.autocast_context,
                                                           grad_scaler=scaler if scaler.is_enabled() else None,
                                                           total_targets=targets, world_size=world,
                                                           gradient_sync=sync)
            except torch.OutOfMemoryError as error:  # this step's update never happened: redo it smaller
                micro = fetched = None
                optimizer.zero_grad(set_to_none=True)
                params, stream = _back_off(error, params, stream, step + 1, world=world, device=device,
                                           lengths=train_set.lengths, pad_id=pad_id, max_length=max_length,
                                           attn=attn, sides=sides)
                accum = params.batching.gradient_accumulation_steps
                backoffs.append({"step": step + 1, "micro_batch_size": params.batching.micro_batch_size,
                                 "gradient_accumulation_steps": accum})
                continue
            with torch.profiler.record_function("fastlm.optimizer"):
                if scaler.is_enabled():
                    scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip)
                step_lr = scheduler.get_last_lr()[0]  # the rate this update uses (host float, no sync)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            step += 1
            if profiler is not None:
                profiler.after_step(step)
            tokens_seen += real_tokens
            metrics.update(loss_sum=loss_sum, target_tokens=n_targets, grad_norm=_local(grad_norm),
                           real_tokens=real_tokens, computed_tokens=computed_tokens, samples=samples,
                           lr=step_lr)
            progress.advance()
            very_first = step == 1 and not history
            if very_first or step % params.log_every == 0 or step == total_steps:
                record = {**metrics.flush(step), **stream.progress(batches_per_epoch)}
                _check_finite(record, step, last_good)
                if very_first:
                    log.info("First step: %.2f s%s; the throughput figures leave it out", record["step_time_s"],
                             " (torch.compile included)" if runtime.compile else "")
                    _check_first_loss(record["loss"], len_vocab=raw_model.get_input_embeddings().num_embeddings,
                                      from_scratch=getattr(config, "_name_or_path", "") == "")
                _check_grad_norm(record, grad_norms)
                history.append(record)
                progress.show(record)
                _emit(callbacks, "train", record)
            if eval_set is not None and params.eval_every and (step % params.eval_every == 0 or step == total_steps):
                record = {"step": step, **evaluate(eval_model, eval_set, params, runtime, pad_id=pad_id,
                                                    max_length=max_length, attn=attn, comm=comm,
                                                    max_batches=params.eval_max_batches,
                                                    even_shards=dist_params.strategy == "fsdp")}
                eval_history.append(record)
                if comm.is_main:
                    log.info("step %d: validation loss %.4f, perplexity %.2f", step, record["val_loss"],
                             record["val_perplexity"])
                _emit(callbacks, "eval", record)
            # Read the flag once (a signal may land between the checks); ranks act on the step's common vote.
            saved, stopping = None, stop.requested if world == 1 else stop_votes > 0
            if (params.save_every and (step % params.save_every == 0 or step == total_steps)) or stopping:
                if metrics.pending_steps:  # never save a checkpoint whose loss was not checked
                    record = {**metrics.flush(step), **stream.progress(batches_per_epoch)}
                    _check_finite(record, step, last_good)
                    history.append(record)
                saved = checkpoint_dir(root, step)
                model_state, optimizer_state = full_state_dicts(raw_model, optimizer) if sharded else (None, None)
                if trainable_only:
                    model_state = {name: param.detach() for name, param in raw_model.named_parameters()
                                   if param.requires_grad}
                if comm.is_main:  # one writer (checkpoint.py removes other writers' temporaries)
                    saved = save_checkpoint(root, step, model=raw_model, optimizer=optimizer, scheduler=scheduler,
                                            grad_scaler=scaler, keep_last=params.keep_last,
                                            model_state=model_state, optimizer_state=optimizer_state,
                                            state={"step": step, "history": history, "eval_history": eval_history,
                                                   "tokens_seen": tokens_seen, "world_size": world,
                                                   "sharded": sharded, "trainable_only": trainable_only,
                                                   "total_steps": total_steps, "digest": digest,
                                                   "batching": _batching_now(params, configured),
                                                   **stream.position})
                last_good = saved
            if stopping:  # SIGTERM / Ctrl-C arrived during this step: it is complete and saved, stop here
                progress.close()
                comm.barrier()  # the other ranks wait until rank 0's checkpoint is on disk
                raise TrainingInterrupted(stop.signal_name or "a signal to another rank", step, saved,
                                          resume=params.resume)
    progress.close()
    if profiler is not None:
        profiler.close(step)
    summary = _summary(history, eval_history, params, total_steps, perf_counter() - start, n_params, steps_per_epoch)
    summary.update(steps_trained=step - first_step, resumed_from=str(resume_from) if resume_from else None,
                   resumed_from_step=first_step if resume_from else None)
    summary["tokens_seen"] = tokens_seen
    summary["flops_per_token"] = metrics.flops_per_token
    summary["first_step_s"] = metrics.step_times[0] if metrics.step_times else None  # compile included
    summary["compiled"] = runtime.compile
    summary["attention"] = attn
    summary["world_size"] = world
    summary["oom_backoffs"] = backoffs
    summary["effective_batch"] *= world
    summary["profile"] = profiler.summary if profiler is not None else {"enabled": False}
    return TrainResult(model=raw_model, history=history, eval_history=eval_history, summary=summary)


COUNT_KEYS = ("num_real_tokens", "num_computed_tokens", "num_samples")


def _local(value):
    """A DTensor (FSDP2's gradient norm) as a plain tensor; anything else unchanged."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


class OutOfMemory(FastlmError):
    """The device ran out of memory and the back-off was off or could not shrink the micro-batch further."""


def _back_off(error: BaseException, params: TrainParams, stream: MicroBatches, step: int, *, world: int,
              device: torch.device, lengths, pad_id: int, max_length: int, attn: str, sides: dict):
    """CUDA out of memory: halve the micro-batch and double the accumulation (``batching.oom_backoff``).

    The effective batch, the loss normalisation and the learning-rate schedule are unchanged; the data stream
    restarts at the first sample of the failed step (batch indices double with half-size batches).
    Without the opt-in, in a multi-process run (every rank would have to agree), or at micro-batch 1: one line.
    """
    batching = params.batching
    where = f"at step {step} with micro_batch_size {batching.micro_batch_size}"
    if not batching.oom_backoff or world > 1 or batching.micro_batch_size == 1:
        raise OutOfMemory(
            f"the {device.type.upper()} device ran out of memory {where} (x {batching.gradient_accumulation_steps} "
            f"accumulation, batching {batching.mode}).",
            fix="run `kedro run --pipeline=tune` to measure the largest micro-batch that fits"
            + (", or set train.batching.oom_backoff: true to halve it automatically" if world == 1 and
               batching.micro_batch_size > 1 else "")
            + ", or turn on train.model.gradient_checkpointing.") from error
    smaller = batching.model_copy(update={"micro_batch_size": batching.micro_batch_size // 2,
                                          "gradient_accumulation_steps": batching.gradient_accumulation_steps * 2})
    params = params.model_copy(update={"batching": smaller})
    if device.type == "cuda":
        torch.cuda.empty_cache()  # once, after a failure: hand the failed step's blocks back to the allocator
    log.warning("Out of memory %s: continuing with micro_batch_size %d x gradient_accumulation_steps %d (the "
                "effective batch is unchanged). Put these in conf/local to skip the failed attempt next time, or "
                "run `kedro run --pipeline=tune`.", where, smaller.micro_batch_size, smaller.gradient_accumulation_steps)
    sampler, collator = make_batching(params, lengths, pad_id=pad_id, max_length=max_length, attn=attn,
                                      seed=params.seed, **sides)
    sampler.shard(0, 1)
    restart = max(0, stream.batch - batching.gradient_accumulation_steps) * 2
    return params, MicroBatches(stream.dataset, sampler, collator, stream.loader_kwargs, epoch=stream.epoch,
                                batch=restart)


def _load_trainable(model: torch.nn.Module, folder: Path) -> None:
    """A trainable-only (LoRA) checkpoint: its tensors must be exactly the model's trainable parameters."""
    import safetensors.torch

    file = folder / "model.safetensors"
    saved = safetensors.torch.load_file(str(file))
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    if set(saved) != trainable:
        raise CheckpointError(
            f"checkpoint file {file} holds {len(saved)} tensors, but this model trains {len(trainable)} "
            "(a different LoRA set-up).",
            fix="resume with the train.model.lora settings the checkpoint was written with, or set train.resume: never.")
    model.load_state_dict(saved, strict=False)


def resume_position(state: dict, world_size: int, folder: Path) -> int:
    """This rank's micro-batch to resume from: the checkpoint's global batch count split over ``world_size``.

    Every rank consumed the same number of batches, so a checkpoint written by W ranks at global batch ``b``
    resumes exactly with W' ranks when W' divides ``b`` (e.g. the same effective batch with W' * a' = W * a).
    """
    global_batch = int(state["batch_in_epoch"])
    if global_batch % world_size:
        raise CheckpointError(
            f"checkpoint {folder} was saved after global micro-batch {global_batch} of epoch {state['epoch']} "
            f"by {state.get('world_size', 1)} process(es); {world_size} processes cannot split that position evenly.",
            fix=f"resume with a number of processes that divides {global_batch} (it was {state.get('world_size', 1)}), "
            "or set train.resume: never to start over.",
        )
    return global_batch // world_size


def _emit(callbacks: Sequence[Callback], kind: str, record: dict) -> None:
    for callback in callbacks:
        callback(kind, record)


def _batching_now(params: TrainParams, configured: TrainParams) -> dict:
    """The micro-batch in use and its accumulation over the configured one's (an OOM back-off changes both)."""
    return {"micro_batch_size": params.batching.micro_batch_size,
            "accumulation_factor": params.batching.gradient_accumulation_steps
            // configured.batching.gradient_accumulation_steps}


def _check_finite(record: dict, step: int, last: Path | None) -> None:
    """Stop on a NaN/inf loss, or a NaN/inf gradient norm (that step's update already broke the weights).

    ``last``: this run's newest checkpoint (saved or resumed from by this process), the one to name as good.
    """
    norm = record.get("grad_norm")
    if not math.isfinite(record["loss"]) or (norm is not None and not math.isfinite(norm)):
        what = f"loss became {record['loss']}" if not math.isfinite(record["loss"]) else f"gradient norm became {norm}"
        raise NonFiniteLossError(
            f"the training {what} by step {step}; training stopped"
            + (f", the last good checkpoint {last} is kept" if last else "") + ".",
            fix="lower train.optimizer.lr (or raise warmup_steps), keep grad_clip on, or use precision bf16/fp32 "
            "instead of fp16; then rerun (train.resume: auto continues from the last good checkpoint).",
        )


def _check_first_loss(loss: float, *, len_vocab: int, from_scratch: bool) -> None:
    uniform = math.log(len_vocab)
    if loss > 1.5 * uniform or (from_scratch and loss < 0.5 * uniform):
        log.warning("The first loss is %.3f, far from ln(vocab) = %.3f: check the labels, the tokenizer/model "
                    "pairing and the initialisation.", loss, uniform)


def _check_grad_norm(record: dict, seen: list[float]) -> None:
    norm = record.get("grad_norm")
    if norm is None:
        return
    if len(seen) >= 3 and norm > 10 * statistics.median(seen):
        log.warning("Gradient norm %.3g at step %d is over 10x its median so far (%.3g): the run may be "
                    "diverging; consider a lower learning rate.", norm, record["step"], statistics.median(seen))
    seen.append(norm)


def _summary(history, eval_history, params: TrainParams, total_steps, wall, n_params, steps_per_epoch) -> dict:
    last = history[-1] if history else {}
    timed = [record for record in history[1:]] or history  # the first window holds warm-up
    final_eval = eval_history[-1] if eval_history else {}
    return {
        "steps": total_steps,
        "epochs": round(total_steps / steps_per_epoch, 4),
        "wall_time_s": round(wall, 3),
        "final_train_loss": last.get("loss"),
        "final_val_loss": final_eval.get("val_loss"),
        "final_val_perplexity": final_eval.get("val_perplexity"),
        "effective_batch": params.batching.micro_batch_size * params.batching.gradient_accumulation_steps,
        "batching": params.batching.mode,
        "parameters": n_params,
        "real_tokens_per_s": timed_rate(history),
        "padding_efficiency": statistics.fmean(r["padding_efficiency"] for r in timed) if timed else None,
        "data_wait_share": statistics.fmean(r["data_wait_share"] for r in timed) if timed else None,
        "peak_memory_mb": max((r["peak_memory_mb"] for r in history), default=None),
    }
