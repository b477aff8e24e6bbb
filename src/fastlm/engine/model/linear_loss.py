"""Linear cross-entropy without ``[tokens x vocab]`` logits: the LM head and the loss fused, chunk by chunk.

With a 128k-150k vocabulary (Llama-3, Qwen3) the logits of one 8k-token micro-batch are 8,192 x 128,256
values: 4.2 GB in fp32, and their gradient as much again, more than the rest of a LoRA step. Here the head's
matmul, the log-softmax, the loss and the gradients run over chunks of tokens:

    for each chunk of tokens c:   z = h_c @ W.T (+ b)            [c x vocab], fp32, the only vocab-wide buffer
                                  loss += CE(z, y_c)               (label smoothing as ``F.cross_entropy``)
                                  g = softmax(z) - target_dist     d(loss)/dz, 0 on ignored rows
                                  dh_c = g @ W ;  dW += g.T @ h_c ;  db += g.sum(0)

The gradients are computed in the forward pass (one pass over the weights per chunk, as liger-kernel's
FusedLinearCrossEntropy does on GPUs) and scaled by the incoming gradient in the backward. Accumulation is
fp32 whatever the inputs' dtype; the returned gradients take the inputs' dtypes. This pure-PyTorch version is
the CPU path and the reference for GPU kernels (liger-kernel, cut-cross-entropy).
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn.functional as F

from fastlm.engine.model.encoder_decoder import unwrapped

__all__ = [
    "FUSED_MIN_VOCAB",
    "LINEAR_CE_CHUNK_ELEMENTS",
    "fused_head_choice",
    "head_returns_hidden",
    "linear_cross_entropy_sum",
    "reference_linear_cross_entropy_sum",
]

log = logging.getLogger(__name__)
# train.loss.fused_linear auto: fused from this vocabulary size up (Llama-3's 128,256, Qwen3's 151,936);
# below, the logits are small next to the activations and the plain head's matmul (bf16 under autocast) is
# faster.
FUSED_MIN_VOCAB = 65_536
# Config fields that change the logits after the head: such a model's head cannot be fused as it is.
_AFTER_HEAD = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")

IGNORE_INDEX = -100
# Logit elements per chunk (tokens x vocab): 2**24 fp32 values = 64 MiB, e.g. 130 tokens of a 128k vocabulary.
LINEAR_CE_CHUNK_ELEMENTS = 2**24


def linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Summed fp32 cross-entropy of ``hidden @ weight.T (+ bias)`` against ``targets``, never materialising
    the ``[tokens x vocab]`` logits. ``hidden``: [tokens, d]; ``weight``: [vocab, d]; ``targets``: [tokens]
    (already shifted; ``ignore_index`` where no loss is wanted). ``chunk_tokens``: tokens per chunk (default:
    ``LINEAR_CE_CHUNK_ELEMENTS // vocab``)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.size(1) != weight.size(1):
        raise ValueError(
            f"hidden [tokens, d] and weight [vocab, d] expected, got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    chunk = chunk_tokens or max(1, LINEAR_CE_CHUNK_ELEMENTS // weight.size(0))
    return _LinearCrossEntropySum.apply(
        hidden, weight, bias, targets, ignore_index, float(label_smoothing), chunk
    )


class _LinearCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ignore_index, label_smoothing, chunk):
        with torch.autocast(hidden.device.type, enabled=False):  # fp32 throughout, whatever autocast says
            return _LinearCrossEntropySum._forward(
                ctx, hidden, weight, bias, targets, ignore_index, label_smoothing, chunk
            )

    @staticmethod
    def _forward(ctx, hidden, weight, bias, targets, ignore_index, label_smoothing, chunk):
        needs = ctx.needs_input_grad
        vocab = weight.size(0)
        # The matmuls run in the weight's dtype (a bf16 head: bf16 inputs, fp32 accumulation, as the plain
        # head under autocast), never on an fp32 copy of a [vocab x d] weight made per micro-batch; the
        # softmax, the loss and the gradient accumulators are fp32.
        compute = weight.dtype
        bias32 = bias.float() if bias is not None else None
        grad_hidden = torch.zeros_like(hidden, dtype=torch.float32) if needs[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs[1] else None
        grad_bias = (
            torch.zeros(vocab, dtype=torch.float32, device=weight.device)
            if bias is not None and needs[2]
            else None
        )
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.no_grad():
            for start in range(0, hidden.size(0), chunk):
                h = hidden[start : start + chunk].to(compute)
                target = targets[start : start + chunk]
                logits = (h @ weight.T).float()  # [c, vocab] fp32: the only vocabulary-wide buffer
                if bias32 is not None:
                    logits += bias32
                valid = target != ignore_index
                index = torch.where(valid, target, 0).unsqueeze(1)
                log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no second buffer
                picked = log_probs.gather(1, index).squeeze(1)
                if label_smoothing:
                    picked = (1 - label_smoothing) * picked + (label_smoothing / vocab) * log_probs.sum(-1)
                total -= torch.where(valid, picked, 0.0).sum()
                if grad_hidden is None and grad_weight is None and grad_bias is None:
                    continue
                grad = log_probs.exp_()  # softmax, in place
                weights = valid.to(grad.dtype).unsqueeze(1)
                if label_smoothing:
                    grad.sub_(weights * (label_smoothing / vocab))
                grad.scatter_add_(1, index, -(1 - label_smoothing) * weights)
                grad.mul_(weights)  # rows without a target: no gradient
                if grad_hidden is not None:
                    grad_hidden[start : start + chunk] = grad.to(compute) @ weight
                if grad_weight is not None:
                    grad_weight.addmm_(grad.T, h.float())
                if grad_bias is not None:
                    grad_bias += grad.sum(0)
        ctx.save_for_backward(
            *(g if g is not None else torch.empty(0) for g in (grad_hidden, grad_weight, grad_bias))
        )
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.present = (grad_hidden is not None, grad_weight is not None, grad_bias is not None)
        return total

    @staticmethod
    def backward(ctx, grad_loss):
        saved = ctx.saved_tensors
        grads = [
            (g * grad_loss).to(dtype) if present else None
            for g, dtype, present in zip(saved, ctx.dtypes, ctx.present, strict=True)
        ]
        return grads[0], grads[1], grads[2], None, None, None, None


def reference_linear_cross_entropy_sum(
    hidden, weight, targets, bias=None, *, ignore_index=IGNORE_INDEX, label_smoothing=0.0
):
    """The plain path, for tests and benchmarks: the full fp32 logits, then ``F.cross_entropy``."""
    logits = F.linear(hidden.float(), weight.float(), bias.float() if bias is not None else None)
    return F.cross_entropy(
        logits, targets, ignore_index=ignore_index, reduction="sum", label_smoothing=label_smoothing
    )


def fused_head_choice(model: torch.nn.Module, request: bool | str) -> tuple[torch.nn.Linear | None, str]:
    """The LM head whose matmul ``linear_cross_entropy_sum`` does in training (``train.loss.fused_linear``),
    or None, and why, in words for the log. ``auto``: fused for vocabularies of ``FUSED_MIN_VOCAB`` and
    more. Under FSDP2 too: the head belongs to the root group, whose parameters stay unsharded from the
    model's forward to the root's post-backward (``fully_shard``'s root does not reshard after forward), so
    the loss reads the whole weight after the forward and its gradient is reduce-scattered with the rest."""
    if request is False:
        return None, "plain LM head (train.loss.fused_linear: false)"
    base = unwrapped(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    config = getattr(base, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        problem = "an encoder-decoder model (its head adds a bias or a scale after the matmul)"
    elif type(head) is not torch.nn.Linear:
        problem = f"its output head is a {type(head).__name__}, not a plain Linear (e.g. adapted by LoRA)"
    elif any(getattr(config, name, None) not in (None, 1, 1.0) for name in _AFTER_HEAD):
        problem = "its config changes the logits after the head (soft-capping or scaling)"
    else:
        problem = None
    if problem is not None:
        if request is True:
            log.warning("train.loss.fused_linear is true, but %s: training with the plain LM head", problem)
        return None, f"plain LM head: {problem}"
    vocab = head.out_features
    if request == "auto" and vocab < FUSED_MIN_VOCAB:
        return None, f"plain LM head (auto: a vocabulary of {vocab:,} < {FUSED_MIN_VOCAB:,}: small logits)"
    return head, f"fused LM head + loss: no [tokens x {vocab:,}] logits (train.loss.fused_linear: {request})"


def _hidden_states(states: torch.Tensor) -> torch.Tensor:
    return states


@contextlib.contextmanager
def head_returns_hidden(head: torch.nn.Linear):
    """Within, ``head`` returns its input: a model's "logits" are the hidden states its head would multiply
    (the positions it keeps, hooks on the head included), for ``linear_cross_entropy_sum``."""
    head.forward = _hidden_states
    try:
        yield
    finally:
        del head.forward
