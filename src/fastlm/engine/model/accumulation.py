"""Gradient accumulation: the causal LM loss normalised over all the target tokens of one optimizer step.

With gradient accumulation, one optimizer step sees k micro-batches. Taking the mean loss of each
micro-batch and averaging the k means weights every micro-batch equally, so a token in a micro-batch with
few targets counts more than a token in one with many: the gradient is not the gradient of the big batch
(the gradient-accumulation bug found in Hugging Face trainers in 2024). The fix is to sum the per-token
losses of each micro-batch and divide by the number of target tokens of the WHOLE step:

    total = total_target_tokens(micro_batches)          # known on the host from the collator, no sync
    for batch in micro_batches:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss_sum, _ = causal_lm_loss_sum(logits, batch["labels"])
        (loss_sum / total).backward()                   # the grads add up to the big-batch gradient

``accumulate_gradients`` is that loop, with autocast and an optional fp16 GradScaler. Under data
parallelism, ``total`` must also be summed over ranks and the result multiplied by the world size (DDP
averages gradients over ranks): ``accumulate_gradients(..., total_targets=global, world_size=W)``.

A mixture-of-experts model whose config sets ``output_router_logits: true`` (Mixtral, Qwen2/3-MoE, OLMoE,
...) also returns its router load-balancing loss; ``router_aux_loss_coef`` times it is added as the model's
own forward adds it to its loss when given labels, once per optimizer step: each of the k micro-batches adds
``coef * aux / k``, so the step optimises the cross-entropy over all its target tokens plus the coefficient
times the micro-batches' mean aux loss (under data parallelism the mean over every rank's micro-batches:
DDP averages that term's gradients). The weight of the router loss does not change with the accumulation.
The step's returned loss sum includes that term (``coef * aux * total / (k * world_size)`` per micro-batch),
so the logged training ``loss`` is what was optimised, router loss included, as transformers' ``loss``.
On a varlen path (one row, no attention mask) that loss is taken over the row's real tokens only, as the
attention mask has it on padded rows (``loss.router_aux_loss``, ``VARLEN_REAL_TOKENS``).

What a target token is: ``loss``; ``schema.count_target_tokens`` counts them (the one definition).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from fastlm.engine.data.schema import count_target_tokens
from fastlm.engine.model.liger import fused_linear_cross_entropy_sum
from fastlm.engine.model.linear_loss import head_operands, head_returns_hidden
from fastlm.engine.model.loss import cross_entropy_sum, training_outputs


@dataclass(frozen=True)
class FusedHead:
    """The LM head whose matmul runs fused into the loss (``linear_loss.fused_head_choice``) and whose kernel
    runs it (``liger.linear_ce_kernel_choice``: ``fastlm`` or ``liger``): chosen together, once per run
    (``train.step.make_optimization``), used together by every step. ``head``: a Linear, or peft's LoRA
    layer over one (``linear_loss.head_operands``)."""

    head: torch.nn.Module
    kernel: str = "fastlm"


def total_target_tokens(micro_batches: Iterable[Mapping]) -> int:
    """Target tokens of all the micro-batches of one optimizer step.

    Uses each batch's ``num_target_tokens`` (counted by the collator on the host, before the transfer, so
    reading it costs no device sync); counts from the labels when a batch does not carry it.
    """
    total = 0
    for batch in micro_batches:
        count = batch.get("num_target_tokens")
        if count is None:
            count = count_target_tokens(batch["labels"])
        total += int(count)
    return total


def accumulate_gradients(
    model: torch.nn.Module,
    micro_batches: Sequence[Mapping[str, torch.Tensor]],
    *,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    grad_scaler: torch.amp.GradScaler | None = None,
    total_targets: int | None = None,
    world_size: int = 1,
    gradient_sync: Callable[[bool], contextlib.AbstractContextManager] | None = None,
    label_smoothing: float = 0.0,
    fused_head: torch.nn.Module | FusedHead | None = None,
) -> tuple[torch.Tensor, int]:
    """Backpropagate the micro-batches of one optimizer step, each weighted by its share of the targets.

    The gradients left in ``model`` equal those of one batch holding every sample. Returns the step's
    summed loss (detached, still on the device: no sync) and its number of target tokens, for metrics.
    The caller unscales/clips, steps the optimizer and zeroes the gradients.

    Data parallel: ``total_targets`` is the step's target count summed over ALL ranks, ``world_size`` undoes
    DDP's gradient averaging, and ``gradient_sync(last)`` is entered around each micro-batch so that
    gradients are reduced across ranks only on the last one (see ``distributed.gradient_sync``).
    ``label_smoothing``: the smoothed loss is what is optimised and returned (see ``cross_entropy_sum``).
    ``fused_head`` (``linear_loss.fused_head_choice``): that head's matmul and the loss run fused, chunk by
    chunk of tokens (``linear_loss``): no ``[tokens x vocab]`` logits; a ``FusedHead`` also names the kernel,
    ``liger`` (liger-kernel's, on CUDA; it reads the micro-batch's target count back to the host once) or
    ``fastlm`` (ours, what a bare Linear gets).
    """
    total = total_target_tokens(micro_batches) if total_targets is None else int(total_targets)
    if isinstance(fused_head, torch.nn.Module):
        fused_head = FusedHead(fused_head)
    step_loss_sum = None
    last_index = len(micro_batches) - 1
    for index, batch in enumerate(micro_batches):
        sync = gradient_sync(index == last_index) if gradient_sync is not None else contextlib.nullcontext()
        with sync:
            with torch.profiler.record_function("fastlm.forward"), autocast():
                loss_sum, aux = _micro_batch_loss_sum(model, batch, label_smoothing, fused_head)
            loss = (loss_sum * world_size if world_size != 1 else loss_sum) / max(total, 1)
            if aux is not None:  # the router loss: the micro-batches' mean, once per step (module docstring)
                loss = loss + aux / len(micro_batches)
                # in the returned sum too, so that sum / targets (summed over ranks) is what was optimised
                loss_sum = loss_sum + aux * (max(total, 1) / (len(micro_batches) * world_size))
            with torch.profiler.record_function("fastlm.backward"):
                (grad_scaler.scale(loss) if grad_scaler is not None else loss).backward()
        loss_sum = loss_sum.detach()
        step_loss_sum = loss_sum if step_loss_sum is None else step_loss_sum + loss_sum
    if step_loss_sum is None:
        raise ValueError("accumulate_gradients needs at least one micro-batch")
    return step_loss_sum, total


def _micro_batch_loss_sum(
    model, batch: Mapping, label_smoothing: float, fused: FusedHead | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The micro-batch's summed cross-entropy and the model's weighted router loss (or None)."""
    if fused is None:
        logits, targets, aux = training_outputs(model, batch)
        return cross_entropy_sum(logits, targets, reuse_logits=True, label_smoothing=label_smoothing), aux
    head = fused.head
    with head_returns_hidden(head):
        hidden, targets, aux = training_outputs(model, batch)
    weight, bias, up = head_operands(head)
    loss_sum = fused_linear_cross_entropy_sum(
        fused.kernel, hidden, weight, targets, bias, up=up, label_smoothing=label_smoothing
    )
    return loss_sum, aux
