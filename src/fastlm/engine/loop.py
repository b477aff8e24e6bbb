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
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

import torch
from torch.utils.data import DataLoader

from fastlm.engine.checkpoint import latest_checkpoint, load_checkpoint, resolve_resume, save_checkpoint
from fastlm.engine.config import TrainParams
from fastlm.engine.data import (
    DynamicPaddingCollator,
    LengthGroupedSampler,
    PackedBatchSampler,
    PackedCollator,
)
from fastlm.engine.data.packing import TokenBudget, block_causal_mask, to_additive_mask
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.loss import accumulate_gradients, causal_lm_loss_sum
from fastlm.engine.metrics import StepMetrics, flops_per_token
from fastlm.engine.model import MASK_FORMATS
from fastlm.engine.optim import make_adamw
from fastlm.engine.profiling import StepProfiler
from fastlm.engine.progress import Progress
from fastlm.engine.runtime import Runtime, usable_cpu_count
from fastlm.engine.schedule import LRSchedule, make_lr_scheduler
from fastlm.engine.signals import GracefulStop, TrainingInterrupted
from fastlm.errors import FastlmError

log = logging.getLogger(__name__)
Callback = Callable[[str, dict], None]  # ("train" | "eval", record)
DEVICE_KEYS = ("input_ids", "labels", "attention_mask", "position_ids")


class NonFiniteLossError(FastlmError):
    """The loss became NaN or inf: training stopped, the last good checkpoint is kept."""


@dataclass
class TrainResult:
    model: torch.nn.Module
    history: list[dict]
    eval_history: list[dict]
    summary: dict = field(default_factory=dict)


def make_batching(params: TrainParams, lengths, *, pad_id: int, max_length: int, attn: str, seed: int,
                  shuffle: bool = True):
    """The batch sampler and collator of the configured mode (packed rows are ``max_length`` long)."""
    batching = params.batching
    if batching.mode == "packed":
        budget = TokenBudget(row_length=max_length, rows_per_batch=batching.micro_batch_size)
        sampler = PackedBatchSampler(lengths, budget, seed=seed)
        # The [rows, 1, T, T] block mask is built on the device from the small sequence ids (see _to_device).
        collator = PackedCollator(pad_id=pad_id, budget=budget, pad_to_multiple_of=batching.pad_to_multiple_of,
                                  attention_mask_format="none")
    else:
        group = 50 if batching.mode == "length_grouped" else 1
        sampler = LengthGroupedSampler(lengths, batching.micro_batch_size, mega_batch_mult=group, seed=seed)
        if batching.mode == "dynamic":
            sampler = _RandomBatches(lengths, batching.micro_batch_size, seed=seed)
        collator = DynamicPaddingCollator(pad_id=pad_id, pad_to_multiple_of=batching.pad_to_multiple_of)
    return sampler, collator


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
    """Endless micro-batches across epochs; ``position`` counts what the loop consumed (for exact resume)."""

    def __init__(self, dataset: TokenSequences, sampler, collator, loader_kwargs: dict, *, epoch: int, batch: int):
        self.dataset, self.sampler, self.collator, self.loader_kwargs = dataset, sampler, collator, loader_kwargs
        self.epoch, self.batch = epoch, batch
        self._iterator: Iterator | None = None

    @property
    def position(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch}

    def batches_per_epoch(self) -> int:
        self.sampler.set_epoch(self.epoch, start_batch=0)
        return len(self.sampler)

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


def _to_device(batch: dict, device: torch.device, attn: str) -> dict:
    """Model inputs to the device (counts stay on the host: reading them costs no sync).

    Packed batches carry per-token ``sequence_ids``; the block-diagonal causal mask that SDPA/eager need is
    built here, on the device, instead of copying ``rows * T * T`` booleans from the host every step.
    Flash-attention varlen needs no mask: it reads the sample boundaries from the restarting position ids.
    """
    moved = {key: batch[key].to(device, non_blocking=True) for key in DEVICE_KEYS if key in batch}
    if "sequence_ids" in batch and "attention_mask" not in batch and MASK_FORMATS[attn] != "none":
        mask = block_causal_mask(batch["sequence_ids"].to(device, non_blocking=True))
        moved["attention_mask"] = mask if MASK_FORMATS[attn] == "bool" else to_additive_mask(mask)
    return {**batch, **moved}


def evaluate(model, dataset: TokenSequences, params: TrainParams, runtime: Runtime, *, pad_id: int, max_length: int,
             attn: str, max_batches: int | None) -> dict:
    """Mean loss and perplexity over target tokens, batched like training, under no_grad and autocast."""
    sampler, collator = make_batching(params, dataset.lengths, pad_id=pad_id, max_length=max_length, attn=attn, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collator)
    loss_sum = torch.zeros((), dtype=torch.float64, device=runtime.device)
    targets = torch.zeros((), dtype=torch.int64, device=runtime.device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for index, batch in enumerate(loader):
            if max_batches is not None and index >= max_batches:
                break
            batch = _to_device(batch, runtime.device, attn)
            with runtime.autocast_context():
                logits = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}).logits
            batch_sum, batch_targets = causal_lm_loss_sum(logits, batch["labels"])
            loss_sum += batch_sum
            targets += batch_targets
    model.train(was_training)
    loss = (loss_sum / targets.clamp(min=1)).item()  # one sync per evaluation
    return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0)), "val_target_tokens": int(targets.item())}


def train(model, train_set: TokenSequences, eval_set: TokenSequences | None, *, params: TrainParams, runtime: Runtime,
          pad_id: int, max_length: int, attn: str, callbacks: Sequence[Callback] = ()) -> TrainResult:
    """Train ``model`` on ``train_set``; see the module docstring for what the hot loop never does."""
    device, accum = runtime.device, params.batching.gradient_accumulation_steps
    model.to(device)
    raw_model, model = model, runtime.compile_model(model)
    sampler, collator = make_batching(params, train_set.lengths, pad_id=pad_id, max_length=max_length,
                                      attn=attn, seed=params.seed)
    stream = MicroBatches(train_set, sampler, collator, loader_settings(params, device), epoch=0, batch=0)
    steps_per_epoch = max(1, math.ceil(stream.batches_per_epoch() / accum))
    total_steps = params.max_steps or max(1, math.ceil(params.epochs * steps_per_epoch))
    optimizer = make_adamw(raw_model, lr=params.optimizer.lr, weight_decay=params.optimizer.weight_decay,
                           betas=(params.optimizer.beta1, params.optimizer.beta2), eps=params.optimizer.eps)
    schedule = LRSchedule(params.optimizer.lr, total_steps, min(params.optimizer.warmup_steps, total_steps),
                          params.optimizer.decay, params.optimizer.min_lr_ratio)
    scheduler = make_lr_scheduler(optimizer, schedule)
    scaler = runtime.make_grad_scaler()
    root = Path(params.checkpoint_dir)
    state = {"step": 0, "history": [], "eval_history": [], "tokens_seen": 0, **stream.position}
    resume_from = resolve_resume(root, params.resume)
    if resume_from is not None:
        state = load_checkpoint(resume_from, model=raw_model, optimizer=optimizer, scheduler=scheduler,
                                grad_scaler=scaler, map_location=device)
        stream.epoch, stream.batch = state["epoch"], state["batch_in_epoch"]
        log.info("Resumed from %s at step %d (epoch %d, micro-batch %d)", resume_from, state["step"],
                 stream.epoch, stream.batch)
    config = raw_model.config
    n_params = sum(p.numel() for p in raw_model.parameters())
    metrics = StepMetrics(device, total_steps=total_steps,
                          flops_per_token=flops_per_token(n_params, config.num_hidden_layers, config.hidden_size,
                                                          max_length))
    log.info("Training %d steps (%d per epoch); effective batch = %d micro-batch x %d accumulation x 1 process; "
             "batching %s", total_steps, steps_per_epoch, params.batching.micro_batch_size, accum,
             params.batching.mode)
    step, history, eval_history, tokens_seen = (state["step"], state["history"], state["eval_history"],
                                                state["tokens_seen"])
    progress = Progress(total_steps, initial=step, quiet=params.quiet)
    grad_norms: list[float] = [record["grad_norm"] for record in history if record.get("grad_norm") is not None]
    clip = params.optimizer.grad_clip if params.optimizer.grad_clip is not None else math.inf
    profile = params.profile
    profiler = (StepProfiler(start_step=profile.start_step, steps=profile.steps, trace_dir=profile.trace_dir,
                             device=device) if profile.enabled else None)
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
            micro = [_to_device(batch, device, attn) for batch in fetched]
            loss_sum, n_targets = accumulate_gradients(model, micro, autocast=runtime.autocast_context,
                                                       grad_scaler=scaler if scaler.is_enabled() else None)
            with torch.profiler.record_function("fastlm.optimizer"):
                if scaler.is_enabled():
                    scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            step += 1
            if profiler is not None:
                profiler.after_step(step)
            real_tokens = sum(int(b["num_real_tokens"]) for b in micro)  # host tensors from the collator: no sync
            tokens_seen += real_tokens
            metrics.update(loss_sum=loss_sum, target_tokens=n_targets, grad_norm=grad_norm, real_tokens=real_tokens,
                           computed_tokens=sum(int(b["num_computed_tokens"]) for b in micro),
                           samples=sum(int(b["num_samples"]) for b in micro), lr=scheduler.get_last_lr()[0])
            progress.advance()
            first_step = step == 1 and not history
            if first_step or step % params.log_every == 0 or step == total_steps:
                record = {**metrics.flush(step), **stream.position}
                _check_finite(record, step, root)
                if first_step:
                    _check_first_loss(record["loss"], len_vocab=raw_model.get_input_embeddings().num_embeddings,
                                      from_scratch=getattr(config, "_name_or_path", "") == "")
                _check_grad_norm(record, grad_norms)
                history.append(record)
                progress.show(record)
                _emit(callbacks, "train", record)
            if eval_set is not None and params.eval_every and (step % params.eval_every == 0 or step == total_steps):
                record = {"step": step, **evaluate(model, eval_set, params, runtime, pad_id=pad_id, max_length=max_length,
                                                    attn=attn, max_batches=params.eval_max_batches)}
                eval_history.append(record)
                log.info("step %d: validation loss %.4f, perplexity %.2f", step, record["val_loss"], record["val_perplexity"])
                _emit(callbacks, "eval", record)
            saved, stopping = None, stop.requested  # read the flag once: a signal may land between the checks
            if (params.save_every and (step % params.save_every == 0 or step == total_steps)) or stopping:
                if metrics.pending_steps:  # never save a checkpoint whose loss was not checked
                    record = {**metrics.flush(step), **stream.position}
                    _check_finite(record, step, root)
                    history.append(record)
                saved = save_checkpoint(root, step, model=raw_model, optimizer=optimizer, scheduler=scheduler,
                                        grad_scaler=scaler, keep_last=params.keep_last,
                                        state={"step": step, "history": history, "eval_history": eval_history,
                                               "tokens_seen": tokens_seen, **stream.position})
            if stopping:  # SIGTERM / Ctrl-C arrived during this step: it is complete and saved, stop here
                progress.close()
                raise TrainingInterrupted(stop.signal_name, step, saved, resume=params.resume)
    progress.close()
    if profiler is not None:
        profiler.close(step)
    summary = _summary(history, eval_history, params, total_steps, perf_counter() - start, n_params, steps_per_epoch)
    summary["tokens_seen"] = tokens_seen
    summary["profile"] = profiler.summary if profiler is not None else {"enabled": False}
    return TrainResult(model=raw_model, history=history, eval_history=eval_history, summary=summary)


def _emit(callbacks: Sequence[Callback], kind: str, record: dict) -> None:
    for callback in callbacks:
        callback(kind, record)


def _check_finite(record: dict, step: int, root: Path) -> None:
    """Stop on a NaN/inf loss, or a NaN/inf gradient norm (that step's update already broke the weights)."""
    norm = record.get("grad_norm")
    if not math.isfinite(record["loss"]) or (norm is not None and not math.isfinite(norm)):
        last = latest_checkpoint(root)
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
    real_tps = [record["real_tokens_per_s"] for record in timed]
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
        "real_tokens_per_s": statistics.fmean(real_tps) if real_tps else None,
        "padding_efficiency": statistics.fmean(r["padding_efficiency"] for r in timed) if timed else None,
        "data_wait_share": statistics.fmean(r["data_wait_share"] for r in timed) if timed else None,
        "peak_memory_mb": max((r["peak_memory_mb"] for r in history), default=None),
    }
