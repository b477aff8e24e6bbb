"""Linear cross-entropy without ``[tokens x vocab]`` logits: the LM head and the loss fused, chunk by chunk.

With a 128k-150k vocabulary (Llama-3, Qwen3) the logits of one 8k-token micro-batch are 8,192 x 128,256
values: 4.2 GB in fp32, and their gradient as much again, more than the rest of a LoRA step. Here the head's
matmul, the log-softmax, the loss and the gradients run over chunks of tokens, then, for a trained head, over
blocks of vocabulary rows:

    for each chunk of tokens c:   z = h_c @ W.T (+ b)            [c x vocab], fp32, the only vocab-wide buffer
                                  loss += CE(z, y_c)               (label smoothing as ``F.cross_entropy``)
                                  g = softmax(z) - target_dist     d(loss)/dz, 0 on ignored rows
                                  dh_c = g @ W ;  db += g.sum(0) ;  lse_c = logsumexp(z)
    for each block of rows v:     g = exp(W_v @ h.T (+ b_v) - lse) - target_dist     [v x tokens]
                                  dW_v = g @ h                     one product over all tokens, written once

The weight's gradient summed chunk by chunk instead (``dW += g_c.T @ h_c``) reads and writes the whole fp32
``[vocab x d]`` gradient once per chunk of tokens (130 tokens for a 128k vocabulary: some 50x the chunk's
logits in memory traffic) in fp32 products too thin for the matrix units. Its blocks recompute their logits
instead: one more product of the head's size, every one of them over all the tokens or the whole vocabulary,
in the compute dtype. Where the products are fp32 on a CPU, bound by their arithmetic, the chunk sums stay
(``weight_gradient_by_block``).

The gradients are computed in the forward pass (one pass over the weights per chunk, as liger-kernel's
FusedLinearCrossEntropy does on GPUs) and scaled by the incoming gradient in the backward. The products run in
the compute dtype: autocast's where it is on (bf16 under a mixed-precision run's autocast, fp32 weights
included, as the plain head's matmul), else the weight's; the softmax, the loss and the gradient sums are
fp32 whatever the inputs' dtype; the returned gradients take the inputs' dtypes. This pure-PyTorch version is
the CPU path and the reference for GPU kernels (liger-kernel, cut-cross-entropy).

A head adapted by LoRA (``lora.target_modules`` listing ``lm_head``) computes ``x W^T + s B A drop(x)``: the
same as ``cat([x, s A drop(x)]) @ cat([W, B], 1).T``, exact for any dropout. Its forward returns that wider
hidden state (``head_returns_hidden``: ``[tokens x (d + r)]``, the adapter's product where peft computes it,
the same dropout mask), and the loss multiplies it by W and, kept apart, B (``up``): neither ``W + s B A``
nor the concatenated weight is formed, W gets no gradient (frozen), B's (``[vocab x r]``) is summed chunk by
chunk, A's and the earlier layers' flow back through the r columns by autograd.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
import torch.nn.functional as F

from fastlm.engine.model.encoder_decoder import unwrapped

__all__ = [
    "FUSED_MIN_VOCAB",
    "LINEAR_CE_CHUNK_ELEMENTS",
    "fused_head_choice",
    "head_operands",
    "head_returns_hidden",
    "head_weight_gradient",
    "linear_cross_entropy_sum",
    "product_dtype",
    "reference_linear_cross_entropy_sum",
    "weight_gradient_by_block",
]

log = logging.getLogger(__name__)
# train.loss.fused_linear auto: fused from this vocabulary size up (Llama-3's 128,256, Qwen3's 151,936);
# below, the logits are small next to the activations and the plain head's matmul (bf16 under autocast) is
# faster.
FUSED_MIN_VOCAB = 65_536
# Config fields that change the logits after the head: such a model's head cannot be fused as it is. Read on
# the model's config and on its text config (a multimodal Gemma-3n/4 soft-caps by its text config's).
_AFTER_HEAD = (
    "final_logit_softcapping",
    "logits_soft_cap",  # RecurrentGemma
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
)

IGNORE_INDEX = -100
# Logit elements per chunk (tokens x vocab) and per block of the weight's gradient (all tokens x vocabulary
# rows): 2**24 fp32 values = 64 MiB, e.g. 130 tokens of a 128k vocabulary, 2,048 rows for 8,192 tokens.
LINEAR_CE_CHUNK_ELEMENTS = 2**24


def linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    up: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    chunk_tokens: int | None = None,
    vocab_block: int | None = None,
) -> torch.Tensor:
    """Summed fp32 cross-entropy of ``hidden @ weight.T (+ bias)`` against ``targets``, never materialising
    the ``[tokens x vocab]`` logits. ``hidden``: [tokens, d]; ``weight``: [vocab, d]; ``targets``: [tokens]
    (already shifted; ``ignore_index`` where no loss is wanted). ``chunk_tokens``: tokens per chunk (default:
    ``LINEAR_CE_CHUNK_ELEMENTS // vocab``); ``vocab_block``: vocabulary rows per block of the weight's
    gradient (default: ``LINEAR_CE_CHUNK_ELEMENTS // tokens`` where ``weight_gradient_by_block`` says so,
    else summed chunk by chunk).

    ``up`` ([vocab, r]): r more columns of the weight, kept apart: the logits are ``hidden @ cat([weight,
    up], 1).T``, ``hidden`` [tokens, d + r], without the concatenated ``[vocab x (d + r)]`` copy (a LoRA
    head: ``hidden`` the states with the adapter's ``s A drop(x)``, ``up`` its B; ``head_operands``). Its
    gradient ([vocab x r], fp32) is summed chunk by chunk of tokens: r columns, no weight-sized traffic."""
    columns = weight.size(1) + (up.size(1) if up is not None else 0)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.size(1) != columns:
        raise ValueError(
            f"hidden [tokens, d] and weight [vocab, d] expected, got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}" + (f" with up {tuple(up.shape)}" if up is not None else "")
        )
    if up is not None and (up.dim() != 2 or up.size(0) != weight.size(0)):
        raise ValueError(f"up [vocab, r] expected for a weight {tuple(weight.shape)}, got {tuple(up.shape)}")
    sizes = (chunk_tokens or max(1, LINEAR_CE_CHUNK_ELEMENTS // weight.size(0)), vocab_block)
    compute = product_dtype(hidden, weight)
    return _LinearCrossEntropySum.apply(
        hidden, weight, bias, up, targets, ignore_index, float(label_smoothing), (sizes, compute)
    )


class _LinearCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, up, targets, ignore_index, label_smoothing, plan):
        # The products in ``compute`` (cast here, once), all else fp32, whatever autocast says; ``sizes``:
        # the token chunk and the vocabulary block (None: chosen here).
        sizes, compute = plan
        with torch.autocast(hidden.device.type, enabled=False), torch.no_grad():
            needs = ctx.needs_input_grad
            head = _Head(
                hidden.to(compute),
                weight.to(compute),
                bias,
                targets,
                ignore_index,
                label_smoothing,
                up=up.to(compute) if up is not None else None,
            )
            by_block = needs[1] and (sizes[1] is not None or weight_gradient_by_block(compute, hidden.device))
            total, grad_hidden, grad_weight, grad_bias, grad_up, lse = head.over_token_chunks(
                sizes[0], needs[0], needs[1] and not by_block, needs[2], by_block, want_up=needs[3]
            )
            if by_block:
                block = sizes[1] or max(1, LINEAR_CE_CHUNK_ELEMENTS // max(hidden.size(0), 1))
                grad_weight = head.weight_gradient(lse, block)
        grads = (grad_hidden, grad_weight, grad_bias, grad_up)
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in grads))
        ctx.dtypes = tuple(x.dtype if x is not None else None for x in (hidden, weight, bias, up))
        ctx.present = tuple(g is not None for g in grads)
        return total

    @staticmethod
    def backward(ctx, grad_loss):
        # Each gradient scaled in place, in the input's dtype: no second [vocab x d] buffer where that is the
        # products' dtype (a second backward through this graph, retain_graph, finds the saved gradients
        # modified and raises instead of scaling them twice).
        saved = ctx.saved_tensors
        grads = [
            _scaled(g, grad_loss, dtype) if present else None
            for g, dtype, present in zip(saved, ctx.dtypes, ctx.present, strict=True)
        ]
        return grads[0], grads[1], grads[2], grads[3], None, None, None, None


def _scaled(grad: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if grad.dtype == dtype:
        return grad.mul_(scale)
    return grad.to(dtype).mul_(scale)


def product_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the head's products run in: autocast's where the caller runs under it (fp32 master weights
    in a bf16/fp16 run, what the plain head's matmul gets too), else the weight's."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def weight_gradient_by_block(compute: torch.dtype, device: torch.device) -> bool:
    """Whether the head's weight gradient is computed block by block of vocabulary rows (one product over
    all the tokens per block, the block's logits recomputed) rather than summed chunk by chunk of tokens:
    where the products run in 16 bits (the chunk sums' thin fp32 products and ``[vocab x d]`` traffic
    dominate: a 3B head under bf16 autocast on CPU, 1,024 tokens, 3.6 s against 9.6 s) or on a GPU (the
    traffic). fp32 products on a CPU are bound by their arithmetic, which the recomputed logits add to: the
    chunk sums there (1.15-1.2x faster; docs/benchmarks.md)."""
    return compute in (torch.bfloat16, torch.float16) or device.type != "cpu"


class _Head:
    """One call's inputs (the hidden states and weight already in the compute dtype), with its two passes:
    over chunks of tokens (the loss, the hidden states' and bias' gradients, each token's log-sum-exp), then
    over blocks of vocabulary rows (the weight's gradient). No autograd: the gradients are computed here, the
    hidden states' and weight's in the products' dtype (each element written once), the bias' in fp32.
    ``up``: the weight's last columns kept apart (``linear_cross_entropy_sum``), in the compute dtype; its
    gradient summed in fp32 chunk by chunk."""

    def __init__(self, hidden, weight, bias, targets, ignore_index, label_smoothing, *, up=None):
        self.hidden, self.weight, self.up = hidden, weight, up
        self.columns = weight.size(1)  # the hidden states' columns ``weight`` multiplies; ``up`` the rest
        self.bias = bias.float() if bias is not None else None
        self.smoothing = label_smoothing
        self.has_target = targets != ignore_index
        self.valid = self.has_target.to(torch.float32)
        self.index = torch.where(self.has_target, targets, 0)

    def over_token_chunks(
        self,
        chunk: int,
        want_hidden: bool,
        want_weight: bool,
        want_bias: bool,
        want_lse: bool,
        *,
        want_up: bool = False,
    ):
        hidden, weight, up, vocab = self.hidden, self.weight, self.up, self.weight.size(0)
        smoothing, columns = self.smoothing, self.columns
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        grad_bias = (
            torch.zeros(vocab, dtype=torch.float32, device=weight.device)
            if self.bias is not None and want_bias
            else None
        )
        grad_up = torch.zeros_like(up, dtype=torch.float32) if up is not None and want_up else None
        lse = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device) if want_lse else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.size(0), chunk):
            rows = slice(start, start + chunk)
            low = (hidden[rows, columns:], up.T) if up is not None else (None, None)
            logits = _logits(
                hidden[rows, :columns], weight.T, *low
            )  # [c, vocab] fp32: the only vocab-wide buffer
            if self.bias is not None:
                logits += self.bias
            valid, index = self.valid[rows].unsqueeze(1), self.index[rows].unsqueeze(1)
            top, top_index = logits.max(dim=-1, keepdim=True) if lse is not None else (None, None)
            log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no second buffer
            picked = log_probs.gather(1, index)
            if lse is not None:  # log-sum-exp = the largest logit - its log-probability: both finite
                lse[rows] = (top - log_probs.gather(1, top_index)).squeeze(1)
            if smoothing:
                picked = (1 - smoothing) * picked + (smoothing / vocab) * log_probs.sum(-1, keepdim=True)
            total -= torch.where(self.has_target[rows].unsqueeze(1), picked, 0.0).sum()  # no -inf * 0
            if grad_hidden is None and grad_weight is None and grad_bias is None and grad_up is None:
                continue
            grad = self._target_gradient(log_probs.exp_(), 1, valid, index, valid)  # softmax, in place
            product = grad.to(weight.dtype) if grad_hidden is not None or grad_up is not None else None
            if grad_hidden is not None:
                torch.mm(product, weight, out=grad_hidden[rows, :columns])
                if up is not None:
                    torch.mm(product, up, out=grad_hidden[rows, columns:])
            if grad_weight is not None:
                grad_weight.addmm_(grad.T, hidden[rows, :columns].float())
            if grad_up is not None:  # [vocab x r]: r columns summed chunk by chunk, in the products' dtype
                if product.dtype == torch.float32:
                    grad_up.addmm_(product.T, hidden[rows, columns:])
                else:
                    grad_up += product.T @ hidden[rows, columns:]
            if grad_bias is not None:
                grad_bias += grad.sum(0)
        return total, grad_hidden, grad_weight, grad_bias, grad_up, lse

    def weight_gradient(self, lse: torch.Tensor, block: int) -> torch.Tensor:
        """``dW`` block by block of vocabulary rows: each block's softmax from its recomputed logits
        ([block, tokens]: the product below reads them row-major) and the tokens' log-sum-exp, then one
        product over all the tokens, written once."""
        hidden, weight, up = self.hidden, self.weight, self.up
        grad_weight = torch.empty_like(weight)
        valid = self.valid.unsqueeze(0)
        for start in range(0, weight.size(0), block):
            rows = slice(start, start + block)
            low = (up[rows], hidden[:, self.columns :].T) if up is not None else (None, None)
            probs = _logits(weight[rows], hidden[:, : self.columns].T, *low)  # [block, tokens]
            if self.bias is not None:
                probs += self.bias[rows].unsqueeze(1)
            probs = probs.sub_(lse).exp_()
            index = self.index - start
            hit = valid * ((index >= 0) & (index < probs.size(0))).to(torch.float32)
            index = index.clamp(0, probs.size(0) - 1).unsqueeze(0)
            grad = self._target_gradient(probs, 0, valid, index, hit)
            torch.mm(grad.to(weight.dtype), hidden[:, : self.columns], out=grad_weight[rows])
        return grad_weight

    def _target_gradient(self, probs, dim, valid, index, hit):
        """``probs - target_dist`` in place, the vocabulary ``probs`` holds along ``dim``, the tokens along
        the other: ``valid`` 1 where a token has a target (0: no gradient for it), ``index`` its target's
        position along ``dim``, ``hit`` 1 where that target is among the vocabulary held (each broadcast
        along ``dim``)."""
        if self.smoothing:
            probs.sub_(valid * (self.smoothing / self.weight.size(0)))
        probs.scatter_add_(dim, index, -(1 - self.smoothing) * hit)
        return probs.mul_(valid)


def _logits(a: torch.Tensor, b: torch.Tensor, a_low, b_low) -> torch.Tensor:
    """``a @ b`` (+ ``a_low @ b_low``: the columns kept apart, ``cat([a, a_low], 1) @ cat([b, b_low])``),
    fp32: each product in the operands' (compute) dtype, their sum fp32 (in place where fp32)."""
    logits = (a @ b).float()
    if a_low is not None:
        if a_low.dtype == torch.float32:
            logits.addmm_(a_low, b_low)
        else:
            logits += a_low @ b_low
    return logits


def head_weight_gradient(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    lse: torch.Tensor,
    *,
    up: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    vocab_block: int | None = None,
) -> torch.Tensor:
    """d(summed loss)/d(weight) of the head, block by block of vocabulary rows (one product over all the
    tokens per block, its logits recomputed from each token's log-sum-exp ``lse``, fp32), in the dtype of
    ``hidden`` and ``weight`` (the products'); no gradient from a token whose target is ``ignore_index``. For
    a kernel that gives the loss and the hidden states' gradient chunk by chunk of tokens but would sum the
    weight's as a ``[vocab x d]`` product per chunk (``engine.model.liger``). ``up``: the weight's columns
    kept apart (``linear_cross_entropy_sum``), in the logits recomputed, not in the gradient."""
    head = _Head(hidden, weight, bias, targets, ignore_index, label_smoothing, up=up)
    block = vocab_block or max(1, LINEAR_CE_CHUNK_ELEMENTS // max(hidden.size(0), 1))
    return head.weight_gradient(lse, block)


def reference_linear_cross_entropy_sum(
    hidden, weight, targets, bias=None, *, up=None, ignore_index=IGNORE_INDEX, label_smoothing=0.0
):
    """The plain path, for tests and benchmarks: the full fp32 logits, then ``F.cross_entropy`` (``up``:
    concatenated to the weight)."""
    if up is not None:
        weight = torch.cat([weight, up], dim=1)
    logits = F.linear(hidden.float(), weight.float(), bias.float() if bias is not None else None)
    return F.cross_entropy(
        logits, targets, ignore_index=ignore_index, reduction="sum", label_smoothing=label_smoothing
    )


def fused_head_choice(model: torch.nn.Module, request: bool | str) -> tuple[torch.nn.Module | None, str]:
    """The LM head whose matmul ``linear_cross_entropy_sum`` does in training (``train.loss.fused_linear``),
    or None, and why, in words for the log. ``auto``: fused for vocabularies of ``FUSED_MIN_VOCAB`` and
    more. A LoRA run's head trained in full (``lora.modules_to_save: [lm_head]``): peft's wrapper computes the
    logits with its trained copy, the module returned. A head adapted by LoRA (``lora.target_modules``
    listing it): peft's ``lora.Linear`` itself, its logits ``x W^T + s B A drop(x)`` computed as the hidden
    states with the adapter's r columns ``s A drop(x)`` against ``[W, B]`` (``head_returns_hidden``,
    ``head_operands``): exact for any dropout, no ``W + s B A``, W frozen; where that is not the layer's
    forward (DoRA, several active adapters, a bias on B, ... ``_lora_adapter``) the plain head, said.

    Under FSDP2 too: the head belongs to the root group, whose parameters (an adapted head's A and B among
    them) stay unsharded from the model's forward to the root's post-backward (``fully_shard``'s root does
    not reshard after forward), so the loss reads the whole weight after the forward and its gradient is
    reduce-scattered with the rest. Under DDP the parameters the loss reads after the forward get their
    gradients' all-reduce hooks as any other."""
    if request is False:
        return None, "plain LM head (train.loss.fused_linear: false)"
    base = unwrapped(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    copy = _trained_copy(head)
    head = copy if copy is not None else head
    adapter, unfused = _lora_adapter(head) if _is_lora(head) else (None, None)
    config = getattr(base, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        problem = "an encoder-decoder model (its head adds a bias or a scale after the matmul)"
    elif unfused is not None:
        problem = f"its output head's LoRA adapter {unfused}"
    elif adapter is None and type(head) is not torch.nn.Linear:
        problem = f"its output head is a {type(head).__name__}, not a plain Linear"
    elif _changes_logits_after_head(config):
        problem = "its config changes the logits after the head (soft-capping or scaling)"
    else:
        problem = None
    if problem is not None:
        if request is True:
            log.warning("train.loss.fused_linear is true, but %s: training with the plain LM head", problem)
        return None, f"plain LM head: {problem}"
    vocab = head.get_base_layer().out_features if adapter is not None else head.out_features
    if request == "auto" and vocab < FUSED_MIN_VOCAB:
        return None, f"plain LM head (auto: a vocabulary of {vocab:,} < {FUSED_MIN_VOCAB:,}: small logits)"
    which = " (the trained copy of the head, lora.modules_to_save)" if copy is not None else ""
    if adapter is not None:
        rank = head.lora_A[adapter].out_features
        which = f" (the head's LoRA adapter as {rank} more columns of its weight, lora.target_modules)"
    return head, (
        f"fused LM head + loss{which}: no [tokens x {vocab:,}] logits (train.loss.fused_linear: {request})"
    )


def _trained_copy(head) -> torch.nn.Module | None:
    """The module that computes the logits in place of ``head`` where ``head`` is peft's wrapper of a head
    trained in full (``lora.modules_to_save: [lm_head]``): its active adapter's copy, else None."""
    copies = getattr(head, "modules_to_save", None)
    if not isinstance(copies, torch.nn.ModuleDict) or getattr(head, "original_module", None) is None:
        return None
    active = list(getattr(head, "active_adapters", None) or [])
    if getattr(head, "disable_adapters", False) or len(active) != 1 or active[0] not in copies:
        return None
    return copies[active[0]]


def _is_lora(head) -> bool:
    """Whether ``head`` is one of peft's LoRA layers (its adapters' A matrices by name)."""
    return isinstance(getattr(head, "lora_A", None), torch.nn.ModuleDict) and hasattr(head, "base_layer")


def _lora_adapter(head) -> tuple[str | None, str | None]:
    """For peft's LoRA layer ``head``: the one active adapter whose forward is ``base(x) + s B A drop(x)``
    over a plain Linear, the fused head's (name, None); else (None, why not, in words for the log). Where
    the layer computes anything else (DoRA's magnitudes, a bias on B, several adapters' sum, a quantized
    base's own product) the fused loss would compute another loss: the plain head keeps it."""
    from peft.tuners.lora.layer import Linear as PeftLoraLinear

    from fastlm.engine.model.lora_forward import FusedLoraLinear

    if type(head) not in (PeftLoraLinear, FusedLoraLinear):
        return (
            None,
            f"is peft's {type(head).__name__} (a quantized base's or another layer's), not lora.Linear",
        )
    base = head.get_base_layer()
    if type(base) is not torch.nn.Linear:
        return None, f"adapts a {type(base).__name__}, not a plain Linear"
    if head.disable_adapters or head.merged:
        return None, "is disabled or merged into the weight"
    active = [name for name in head.active_adapters if name in head.lora_A]
    if len(active) != 1:
        return None, f"has {len(active)} active adapters (one is fused)"
    name = active[0]
    variant = getattr(head, "lora_variant", {}).get(name)
    if variant is not None:
        dora = getattr(head, "use_dora", {}).get(name)
        return None, "uses DoRA (use_dora)" if dora else f"uses peft's {type(variant).__name__}"
    if head.lora_B[name].bias is not None:
        return None, "has a bias on B (lora_bias)"
    if getattr(head, "fan_in_fan_out", False):
        return None, "reads its weight transposed (fan_in_fan_out)"
    if type(head.lora_A[name]) is not torch.nn.Linear or type(head.lora_B[name]) is not torch.nn.Linear:
        return None, "is not a pair of Linear layers"
    if not isinstance(head.scaling[name], (int, float)):
        return None, "has a scaling that is not a number"
    return name, None


def _changes_logits_after_head(config) -> bool:
    """Whether ``config`` (or its text config, where it has one) sets one of ``_AFTER_HEAD``."""
    configs = [config]
    text = getattr(config, "get_text_config", None)
    if callable(text):
        configs.append(text())
    return any(getattr(each, name, None) not in (None, 1, 1.0) for each in configs for name in _AFTER_HEAD)


def _hidden_states(states: torch.Tensor) -> torch.Tensor:
    return states


def _with_adapter_columns(head, x: torch.Tensor) -> torch.Tensor:
    """A LoRA head's input with its adapter's r columns: ``cat([x, s A drop(x)], -1)``, the adapter's
    product where peft's forward computes it (after the model's body: the same dropout mask from the same
    generator state), its input cast to A's dtype outside autocast as peft's (under it: as autocast casts)."""
    name, problem = _lora_adapter(head)
    if name is None:  # chosen fusable for the run, changed since (toggled adapters)
        raise RuntimeError(f"the fused LM head's LoRA adapter {problem} since the run chose it")
    lora_a = head.lora_A[name]
    if not torch.is_autocast_enabled(x.device.type) and x.dtype != lora_a.weight.dtype:
        x = x.to(lora_a.weight.dtype)
    low = lora_a(head.lora_dropout[name](x)) * head.scaling[name]
    return torch.cat([x, low], dim=-1)


_ADAPTED_FORWARD = "_fastlm_adapted_head_forward"


def head_operands(head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """What ``linear_cross_entropy_sum`` multiplies the hidden states ``head_returns_hidden`` gave by: the
    head's ``weight``, ``bias`` and ``up`` (a LoRA head: its base's weight and bias, its adapter's B; else
    None)."""
    if not _is_lora(head):
        return head.weight, head.bias, None
    name, problem = _lora_adapter(head)
    if name is None:
        raise RuntimeError(f"the fused LM head's LoRA adapter {problem} since the run chose it")
    base = head.get_base_layer()
    return base.weight, base.bias, head.lora_B[name].weight


@contextlib.contextmanager
def head_returns_hidden(head: torch.nn.Module):
    """Within, ``head`` returns its input: a model's "logits" are the hidden states its head would multiply
    (the positions it keeps, hooks on the head included), for ``linear_cross_entropy_sum``; a LoRA head
    returns them with its adapter's columns (``_with_adapter_columns``). The forward put in is one object per
    head, the same at every micro-batch (nothing new for a compiled model's guards)."""
    forward = _hidden_states
    if _is_lora(head):
        forward = head.__dict__.get(_ADAPTED_FORWARD)
        if forward is None:
            forward = head.__dict__[_ADAPTED_FORWARD] = functools.partial(_with_adapter_columns, head)
    head.forward = forward
    try:
        yield
    finally:
        del head.forward
