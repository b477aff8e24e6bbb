"""Causal language-model loss: the logits a training step computes (only where a label is predicted:
``positions_to_keep``, ``training_logits``) and their summed cross-entropy (``causal_lm_loss_sum``,
chunked on CPU). Summed, not averaged: ``accumulation`` divides by the target tokens of the whole
optimizer step.

A target token is a label that some position predicts: position t predicts label t+1, so the first label
of each row is never a target, and labels equal to ``IGNORE_INDEX`` (prompt, padding) are skipped.
``schema.count_target_tokens`` is the one definition; a collator's ``num_target_tokens`` must agree with it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from fastlm.engine.data.schema import (
    IGNORE_INDEX,
    TARGET_POSITIONS,
    VARLEN_REAL_TOKENS,
    model_inputs,
    shift_labels,
)
from fastlm.engine.model.encoder_decoder import HEAD_POSITIONS, takes_head_positions, unwrapped
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)


def forward_logits(model: torch.nn.Module, batch: Mapping) -> torch.Tensor:
    """The model's logits for ``batch``, shaped like its labels (varlen paths run rows flattened to one)."""
    logits = model(**routed_inputs(model, batch)).logits
    return logits.view(*batch["labels"].shape, logits.shape[-1])


def positions_to_keep(
    labels: torch.Tensor, device: torch.device, *, flattened: bool, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor | None:
    """The positions that predict a target, from the collator's host-side ``labels``, as transformers'
    ``logits_to_keep`` takes them, so that a training step computes no logit for a prompt token, a sample's
    last token or padding (on SFT data most of the ``[tokens x vocab]`` LM-head work).

    ``flattened`` (varlen paths: the rows go to the model as one ``[1, rows*T]`` row): ``[1, K]`` positions in
    that row, made on the host (no device sync anywhere). Otherwise, on a CPU device: the ``[rows, T]`` bool
    mask. None (every logit computed) on an accelerator with several rows (selecting by a mask there would
    sync the host), when every position has a target or none has, or when this transformers cannot slice by
    positions.
    """
    if (
        labels.device.type != "cpu"
        or not (flattened or device.type == "cpu")
        or not slicing_by_mask_supported()
    ):
        return None
    keep = shift_labels(labels, ignore_index) != ignore_index
    kept = int(keep.sum())
    if kept in (0, keep.numel()):
        return None
    if not flattened:
        return keep
    positions = keep.reshape(-1).nonzero().reshape(1, -1)
    if labels.is_pinned():  # pinned as the loader's batch (CUDA): the transfer stays asynchronous
        positions = positions.pin_memory()
    return positions.to(device, non_blocking=True)


@functools.cache
def slicing_by_mask_supported() -> bool:
    """This transformers' ``slice_logits_to_keep`` takes a 2D bool mask (recent 5.x; older ones read it as
    positions)."""
    try:
        from transformers.modeling_utils import slice_logits_to_keep
    except ImportError:
        return False
    try:
        sliced = slice_logits_to_keep(torch.zeros(1, 3, 1), torch.tensor([[True, False, True]]))
    except (TypeError, IndexError, RuntimeError):
        return False
    return tuple(sliced.shape) == (2, 1)


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the transformers model under ``model``'s wrappers (DDP, compile, PEFT) slices its hidden states
    with ``logits_to_keep`` positions (``slice_logits_to_keep``; a few older model files slice
    differently)."""
    return _class_takes_logits_to_keep(type(unwrapped(model)))


@functools.cache
def _class_takes_logits_to_keep(cls: type) -> bool:
    for klass in cls.__mro__:  # the class that defines forward (FSDP2 subclasses the model's class)
        if "forward" in vars(klass):
            module = sys.modules.get(klass.__module__)
            parameters = inspect.signature(klass.forward).parameters
            return "logits_to_keep" in parameters and hasattr(module, "slice_logits_to_keep")
    return False


def training_logits(
    model: torch.nn.Module, batch: Mapping, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, vocab]`` logits and the ``[N]`` targets they predict: only the positions with a target where the
    batch says which (``TARGET_POSITIONS``) and the model can slice them (``logits_to_keep``; an
    encoder-decoder model through its head hook, ``seq2seq_hooks.enable_target_head``), else every position
    (ignored ones carry ``ignore_index``)."""
    logits, targets, _ = training_outputs(model, batch, ignore_index)
    return logits, targets


def training_outputs(
    model: torch.nn.Module, batch: Mapping, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``training_logits``' logits and targets, and the model's weighted router loss (``router_aux_loss``:
    None but for a mixture-of-experts model with ``output_router_logits``; over the real tokens of a varlen
    row, ``VARLEN_REAL_TOKENS``), from the same forward."""
    targets = shift_labels(batch["labels"], ignore_index)
    keep = batch.get(TARGET_POSITIONS)
    real = batch.get(VARLEN_REAL_TOKENS)
    inputs = routed_inputs(model, batch)
    if keep is not None and takes_logits_to_keep(model):
        outputs = model(**inputs, logits_to_keep=keep)
    elif keep is not None and keep.dtype != torch.bool and takes_head_positions(model):
        outputs = model(**inputs, **{HEAD_POSITIONS: keep})
    else:
        outputs = model(**inputs)
        logits = outputs.logits.view(*batch["labels"].shape, outputs.logits.shape[-1])
        aux = router_aux_loss(model, outputs, real)
        return logits.reshape(-1, logits.size(-1)), targets.reshape(-1), aux
    logits = outputs.logits
    logits = logits.reshape(-1, logits.size(-1))
    kept = targets[keep] if keep.dtype == torch.bool else targets.reshape(-1)[keep.reshape(-1)]
    if logits.size(0) != kept.size(0):
        raise RuntimeError(
            f"{type(model).__name__} returned {logits.size(0)} logits for {kept.size(0)} kept "
            "positions: it does not slice logits_to_keep as transformers' slice_logits_to_keep does"
        )
    return logits, kept, router_aux_loss(model, outputs, real)


def routed_inputs(model: torch.nn.Module, batch: Mapping) -> dict:
    """``model_inputs(batch)``, refused in one line where the model's config sets ``output_router_logits``
    and the attention mask is not the ``[rows, T]`` padding mask: transformers' ``load_balancing_loss_func``
    (run inside the model's forward) reads that mask flattened and fails on packed rows' dense
    ``[rows, 1, T, T]`` mask or flex attention's block mask. A host-side shape check: no sync."""
    inputs = model_inputs(batch)
    mask = inputs.get("attention_mask")
    if mask is None or (isinstance(mask, torch.Tensor) and mask.dim() == 2) or not _routes(model):
        return inputs
    shape = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
    raise ConfigError(
        f"The model's config sets output_router_logits: true (its router load-balancing loss) and this run's "
        f"packed rows reach it with a {shape} attention mask, from which transformers cannot compute that "
        "loss.",
        fix="set train.batching.mode: length_grouped (padded rows), or train.model.attn_implementation to a "
        "varlen one (flash_attention_2, torch_varlen, sdpa_varlen), or output_router_logits: false in the "
        "model's config.json.",
    )


def _routes(model: torch.nn.Module) -> bool:
    config = getattr(unwrapped(model), "config", None)
    texts = [config, config.get_text_config()] if hasattr(config, "get_text_config") else [config]
    return any(getattr(each, "output_router_logits", False) for each in texts)


def router_aux_loss(
    model: torch.nn.Module, outputs, real_tokens: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``router_aux_loss_coef * aux_loss``: the router load-balancing loss a mixture-of-experts model
    (Mixtral, Qwen2/3-MoE, OLMoE, ...) returns when its config sets ``output_router_logits`` (transformers'
    ``load_balancing_loss_func`` over the router logits of every layer, padding excluded by the attention
    mask), weighted as the model's own forward adds it to its loss when given labels; None when the model
    returns none. Still on the device (no sync).

    ``real_tokens`` (``VARLEN_REAL_TOKENS``: a varlen row with padding, which reaches the model without an
    attention mask, so its own aux loss routes the padding as text): the loss is computed again from the
    model's ``router_logits`` by its family's ``load_balancing_loss_func`` with that mask, as the padded
    path's attention mask has it (``varlen_router_loss``)."""
    aux = getattr(outputs, "aux_loss", None)
    if aux is None:
        return None
    base = unwrapped(model)
    coef = getattr(base, "router_aux_loss_coef", None)
    if coef is None:
        coef = getattr(getattr(base, "config", None), "router_aux_loss_coef", None)
    if coef is None:
        raise ValueError(
            f"{type(base).__name__} returns a router aux_loss (config output_router_logits: true) but no "
            "router_aux_loss_coef to weight it: set router_aux_loss_coef in the model's config, or set "
            "output_router_logits: false"
        )
    if real_tokens is not None:
        aux = varlen_router_loss(base, outputs, real_tokens, aux)
    return aux.float() * float(coef)


def varlen_router_loss(base: torch.nn.Module, outputs, real_tokens: torch.Tensor, aux: torch.Tensor):
    """The router load-balancing loss over the real tokens of a varlen row only (``real_tokens``,
    ``[1, width]`` bool on the device): the family's own ``load_balancing_loss_func`` (its modeling module's)
    given the model's ``router_logits``, ``num_experts``, ``num_experts_per_tok`` and that mask, the call its
    forward makes with the attention mask of padded rows; no sync (transformers counts experts with fixed
    bins). A family without that function, those attributes or router logits keeps its own ``aux`` (padding
    included), said once in the log."""
    balancing = _balancing_loss_function(type(base))
    routing = _routing(base)
    logits = getattr(outputs, "router_logits", None)
    missing = (
        "load_balancing_loss_func(gate_logits, num_experts, top_k, attention_mask) in its modeling module"
        if balancing is None
        else "num_experts / num_experts_per_tok"
        if routing is None
        else "router_logits in its outputs"
        if not isinstance(logits, tuple) or not logits
        else ""
    )
    if missing:
        _say_padding_routed(type(base).__name__, missing)
        return aux
    return balancing(logits, *routing, real_tokens)


@functools.cache
def _balancing_loss_function(cls: type):
    """The ``load_balancing_loss_func`` of the modeling module of ``cls`` or of the first class of its MRO
    that has one (FSDP2 subclasses the model's class), when it takes transformers' arguments."""
    for klass in cls.__mro__:
        function = getattr(sys.modules.get(klass.__module__), "load_balancing_loss_func", None)
        if function is None:
            continue
        try:
            names = list(inspect.signature(function).parameters)[:4]
        except (TypeError, ValueError):
            return None
        return function if names == ["gate_logits", "num_experts", "top_k", "attention_mask"] else None
    return None


def _routing(base: torch.nn.Module) -> tuple[int, int] | None:
    """The experts and experts per token the model's forward gives ``load_balancing_loss_func``: its own
    attributes, else its language model's config's (a multimodal model's)."""
    config = getattr(base, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for owner in (base, text):
        experts, top_k = getattr(owner, "num_experts", None), getattr(owner, "num_experts_per_tok", None)
        if isinstance(experts, int) and isinstance(top_k, int):
            return experts, top_k
    return None


@functools.cache
def _say_padding_routed(name: str, missing: str) -> None:
    log.warning(
        "router loss: %s has no %s, so on this varlen path its load-balancing loss (router_aux_loss_coef) "
        "is the model's own, which routes the row's padding tokens as text; train.batching.mode: "
        "length_grouped with train.model.attn_implementation sdpa or eager leaves the padding out",
        name,
        missing,
    )


def router_loss_choice(model: torch.nn.Module) -> str:
    """For the run's log and summary: whether the training loss includes the router load-balancing loss
    (``router_aux_loss``), "" for a model whose config does not ask for it."""
    config = getattr(unwrapped(model), "config", None)
    texts = [config, config.get_text_config()] if hasattr(config, "get_text_config") else [config]
    on = [each for each in texts if getattr(each, "output_router_logits", False)]
    if not on:
        return ""
    coef = getattr(on[0], "router_aux_loss_coef", None)
    return (
        "; the training loss includes the router load-balancing loss, "
        f"router_aux_loss_coef {coef} x aux_loss (the model's config sets output_router_logits: true; "
        "the evaluation loss is the cross-entropy alone)"
    )


# Logit elements (tokens x vocab) per cross-entropy chunk: 2**21 fp32 values = 8 MiB, small enough to stay in
# the CPU's caches between the passes over one chunk; a GPU does not mind the loop (a handful of chunks).
CE_CHUNK_ELEMENTS = 2**21


def causal_lm_loss_sum(
    logits: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    *,
    reuse_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy (computed in fp32) and the number of target tokens it sums over.

    ``logits``: (batch, seq, vocab), any float dtype; ``labels``: (batch, seq) with ``ignore_index`` where
    no loss is wanted. ``loss_sum / n_targets`` is the usual mean loss (what a Hugging Face model returns
    as ``outputs.loss`` when given ``labels``).

    On CPU it is computed chunk by chunk of tokens (``ChunkedCrossEntropySum``): no full-size fp32 copy,
    log-softmax, zero-filled gradient or log-softmax gradient of the ``[tokens x vocab]`` logits is made; the
    gradient ``softmax - one_hot`` is written once, during the forward, while each chunk is in cache (the loss
    with its backward took 0.68x the time of ``F.cross_entropy`` on 10,240 x 7,680 logits, 2 quiet cores).
    With ``reuse_logits=True`` it is written over ``logits`` themselves (no second ``[tokens x vocab]``
    buffer): only for a caller that never reads the logits again (``accumulate_gradients``); a model whose
    last op saved its output for its own backward then fails loudly (autograd's in-place check), never
    silently. On CUDA ``F.cross_entropy`` stays: one fused kernel there, and the chunk loop measured 5.8x
    slower.
    """
    targets = shift_labels(labels, ignore_index)
    loss_sum = cross_entropy_sum(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index, reuse_logits=reuse_logits
    )
    return loss_sum, (targets != ignore_index).sum()


def cross_entropy_sum(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    *,
    reuse_logits: bool = False,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Summed fp32 cross-entropy of ``[N, vocab]`` logits against their ``[N]`` targets (already shifted), the
    core of ``causal_lm_loss_sum`` (see there: chunked on CPU, fused ``F.cross_entropy`` elsewhere).

    ``label_smoothing`` (``train.loss.label_smoothing``): ``F.cross_entropy``'s definition, each target's
    distribution ``(1 - s) * one_hot + s / vocab``; training only (evaluation reports the plain loss)."""
    if logits.device.type != "cpu":  # one fused kernel; chunks only add launches (measured 5.8x slower, H200)
        return F.cross_entropy(
            logits.float(),
            targets,
            ignore_index=ignore_index,
            reduction="sum",
            label_smoothing=label_smoothing,
        )
    if torch.is_grad_enabled() and logits.requires_grad:
        return ChunkedCrossEntropySum.apply(logits, targets, ignore_index, reuse_logits, label_smoothing)
    return chunked_cross_entropy_sum(logits, targets, ignore_index, label_smoothing=label_smoothing)


def _chunk_rows(vocab: int) -> int:
    return max(1, CE_CHUNK_ELEMENTS // max(vocab, 1))


def chunked_cross_entropy_sum(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    grad_out: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Summed fp32 cross-entropy of ``logits`` (tokens, vocab) against ``targets`` (tokens,), chunk by chunk.

    ``grad_out`` (same shape as ``logits``, may be ``logits`` itself): receives d(loss_sum)/d(logits), i.e.
    ``softmax - one_hot`` on target rows and 0 on ignored rows, in its own dtype. With ``label_smoothing`` s
    the target distribution is ``(1 - s) * one_hot + s / vocab``: the loss adds ``s`` times the mean negative
    log-probability over the vocabulary to ``1 - s`` times the target's, and the gradient subtracts that
    distribution from the softmax.
    """
    smooth, vocab = float(label_smoothing), logits.size(-1)
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    step = _chunk_rows(logits.size(-1))
    buffer = None  # one chunk of fp32 log-probabilities, reused: it stays in cache
    for start in range(0, logits.size(0), step):
        chunk = logits[start : start + step]
        target = targets[start : start + step]
        if buffer is None or buffer.size(0) != chunk.size(0):
            buffer = torch.empty(chunk.shape, dtype=torch.float32, device=logits.device)
        # bf16/fp16 logits: the log-probabilities in fp32, written straight into the buffer (no temporary)
        log_probs = torch.log_softmax(chunk, dim=-1, dtype=torch.float32, out=buffer)
        valid = target != ignore_index
        index = torch.where(valid, target, 0).unsqueeze(1)
        picked = log_probs.gather(1, index).squeeze(1)
        if smooth:
            picked = (1 - smooth) * picked + (smooth / vocab) * log_probs.sum(-1)
        total -= torch.where(valid, picked, 0.0).sum()
        if grad_out is not None:
            part = grad_out[start : start + step]
            torch.exp(log_probs, out=part)  # softmax (the chunk of logits may be overwritten now)
            # no target: zero gradient. Only those rows are written (CPU only: reading which ones costs no
            # device sync); a pass over the whole chunk cost as much as the exp
            part.index_fill_(0, (~valid).nonzero().squeeze(1), 0)
            if smooth:  # minus the uniform share on every entry of the rows with a target
                part.sub_(valid.to(part.dtype).unsqueeze(1) * (smooth / vocab))
            # minus the one-hot
            part.scatter_add_(1, index, -(1 - smooth) * valid.to(part.dtype).unsqueeze(1))
    return total


class ChunkedCrossEntropySum(torch.autograd.Function):
    """``chunked_cross_entropy_sum`` with its gradient, computed in the forward pass (one read of the logits).

    The backward only scales the stored gradient by the incoming scalar gradient. ``reuse_logits``: the
    gradient overwrites the logits' memory (the caller must not read the logits afterwards).
    """

    @staticmethod
    def forward(ctx, logits, targets, ignore_index, reuse_logits, label_smoothing=0.0):
        grad = logits if reuse_logits and logits.is_contiguous() else torch.empty_like(logits)
        with torch.no_grad():
            loss_sum = chunked_cross_entropy_sum(
                logits, targets, ignore_index, grad_out=grad, label_smoothing=label_smoothing
            )
        ctx.save_for_backward(grad)
        ctx.used = False
        return loss_sum

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.used:  # the stored gradient was scaled in place by the first backward
            raise RuntimeError("ChunkedCrossEntropySum supports one backward pass (no retain_graph reuse)")
        ctx.used = True
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_loss.to(grad.dtype)), None, None, None, None
