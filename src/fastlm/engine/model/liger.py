"""liger-kernel's Triton kernels where they beat our own code: on a CUDA GPU with liger-kernel installed.

Two levers, each off by a parameter, each falling back to our pure-PyTorch code elsewhere:

* ``train.loss.fused_linear_kernel`` (``linear_ce_kernel_choice``): the fused LM head + loss of
  ``linear_loss`` runs liger's Triton cross-entropy kernel (one launch per chunk of tokens for the softmax,
  the loss and its gradient, in place in the logits chunk) in a loop of ours shaped as liger's
  ``LigerFusedLinearCrossEntropyFunction``, without its host syncs. Same contract as our chunked PyTorch
  loop: the fp32 *sum* over the target tokens (divided later by the step's global target count,
  ``accumulation``), ``ignore_index`` rows scoring nothing, ``F.cross_entropy``'s label smoothing, the bias,
  the weight and bias gradients summed in fp32. Our ``linear_cross_entropy_sum`` stays the CPU path and the
  reference the liger path is tested against (``tests/engine/model/test_liger.py``, with a stand-in liger
  module whose kernel does the Triton kernel's arithmetic in torch).
* ``train.model.liger`` (``apply_liger``): liger's fused RMSNorm, rotary embedding and SwiGLU (GeGLU for
  Gemma) patched onto the model instance through its family's ``apply_liger_kernel_to_<family>(model=...)``,
  with liger's own cross-entropy options off: our loss path owns the head.

Costs liger brings: its rotary patch replaces the family's module-level ``apply_rotary_pos_emb``, so it holds
for every model of that family in the process (one device per run).
"""

from __future__ import annotations

import importlib
import inspect
import logging

import torch

from fastlm.engine.model.cce import cce_linear_cross_entropy_sum, cce_unavailable, triton_kernel_unavailable
from fastlm.engine.model.encoder_decoder import unwrapped
from fastlm.engine.model.linear_loss import (
    IGNORE_INDEX,
    head_weight_gradient,
    linear_cross_entropy_sum,
    product_dtype,
)
from fastlm.errors import ConfigError

__all__ = [
    "LIGER_FAMILIES",
    "apply_liger",
    "fused_linear_cross_entropy_sum",
    "liger_linear_cross_entropy_sum",
    "liger_unavailable",
    "linear_ce_kernel_choice",
]

log = logging.getLogger(__name__)
KERNEL_PARAM = "train.loss.fused_linear_kernel"
MODEL_PARAM = "train.model.liger"
# Decoder families whose ``apply_liger_kernel_to_<family>(model=...)`` liger 0.8 offers and patches on an
# instance (the model_type in the config names the function).
LIGER_FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "granite",
    "smollm3",
)
# What the patch turns on where the family's function takes it (norms, rotary, the gated MLP), and what it
# keeps off: liger's cross-entropy replacements (granite's defaults turn one on).
_PATCH_FLAGS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "geglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def liger_unavailable(device: torch.device) -> str | None:
    """Why liger-kernel cannot run for a run on ``device`` (None: it can)."""
    return triton_kernel_unavailable(
        device, "liger_kernel.transformers.functional", "liger-kernel", "liger-kernel"
    )


def linear_ce_kernel_choice(request: str, device: torch.device) -> tuple[str, str]:
    """The fused linear cross-entropy kernel (``fastlm``, ``liger`` or ``cce``) for
    ``train.loss.fused_linear_kernel`` = ``request`` on ``device``, and why, in words for the log. ``auto``:
    liger where it can run; ``cce`` (cut-cross-entropy, ``engine.model.cce``) only when asked for."""
    if request == "fastlm":
        return "fastlm", f"fastlm's chunked PyTorch kernel ({KERNEL_PARAM}: fastlm)"
    if request == "cce":
        problem = cce_unavailable(device)
        if problem is not None:
            raise ConfigError(
                f"{KERNEL_PARAM} is cce, but {problem}.",
                fix=f"set {KERNEL_PARAM}: auto (liger where it can run, else fastlm's) or fastlm.",
            )
        return "cce", f"cut-cross-entropy's linear cross-entropy ({KERNEL_PARAM}: cce)"
    problem = liger_unavailable(device)
    if problem is None:
        return (
            "liger",
            f"liger-kernel's cross-entropy kernel in fastlm's chunk loop ({KERNEL_PARAM}: {request})",
        )
    if request == "liger":
        raise ConfigError(
            f"{KERNEL_PARAM} is liger, but {problem}.",
            fix=f"set {KERNEL_PARAM}: auto (liger where it can run, else fastlm's) or fastlm.",
        )
    return "fastlm", f"fastlm's chunked PyTorch kernel (auto: {problem})"


def liger_linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    up: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``linear_loss.linear_cross_entropy_sum``'s contract through liger's Triton cross-entropy kernel: the
    fp32 summed loss (the caller divides by the step's target count), the gradients computed in the forward as
    liger's ``LigerFusedLinearCrossEntropyFunction`` does (chunks of its size, the kernel writing each
    logit's gradient in place over the chunk's logits), the bias gradient summed in fp32; a trained head's
    weight gradient by blocks of vocabulary rows (``linear_loss.head_weight_gradient``, from each token's
    log-sum-exp): liger's function sums it chunk by chunk as a ``[vocab x d]`` product cast to fp32 and added,
    some 8 GB of memory traffic per chunk of a 3B head, 32 chunks per 8k-token micro-batch.

    Our loop instead of liger's function: that one reads the number of target tokens back to the host
    (``.item()``) and compares the incoming gradient with 1 on the host (``torch.equal``), three host syncs
    per micro-batch (45 in the H100's 15 LoRA steps, docs/gpu-runs/2026-11-27-h100-gpu_speed_lora.log).
    With the sum reduction the kernel needs no target count, and the backward scales the saved gradients by
    the incoming one on the device. The products run in autocast's dtype where the caller runs under it,
    else the weight's, as ours and the plain head's (liger's function multiplied in the weight's dtype).

    ``up`` (a LoRA head's B: the weight's last columns kept apart, ``hidden`` [tokens, d + r]): its product
    added into each chunk's logits before the kernel, the gradients of its columns of ``hidden`` and of
    ``up`` (fp32, summed chunk by chunk: r columns) from the kernel's d(loss)/d(logits) as the others'."""
    compute = product_dtype(hidden, weight)
    if hidden.size(1) != weight.size(1) + (up.size(1) if up is not None else 0):
        raise ValueError(
            f"hidden [tokens, d (+ r)] for a weight {tuple(weight.shape)}"
            + (f" and up {tuple(up.shape)}" if up is not None else "")
            + f" expected, got {tuple(hidden.shape)}"
        )
    return _LigerLinearCrossEntropySum.apply(
        hidden, weight, bias, up, targets, ignore_index, float(label_smoothing), compute
    )


class _LigerLinearCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, up, targets, ignore_index, label_smoothing, compute):
        from liger_kernel.ops import cross_entropy

        with torch.autocast(hidden.device.type, enabled=False), torch.no_grad():
            needs = ctx.needs_input_grad
            gradients = any(needs[:4])
            h, w = hidden.to(compute).contiguous(), weight.to(compute)
            b = bias.to(compute) if bias is not None else None
            u = up.to(compute) if up is not None else None
            columns = w.shape[1]  # h's columns w multiplies; u the rest
            tokens, vocab = h.shape[0], w.shape[0]
            # liger's chunk: about as many logits as hidden-state elements, a power of two of tokens
            chunk = _next_power_of_2(-(-tokens // -(-vocab // max(h.shape[1], 1))))
            block = min(getattr(cross_entropy, "MAX_FUSED_SIZE", 32768), _next_power_of_2(vocab))
            kernel = cross_entropy.liger_cross_entropy_kernel
            grad_hidden = torch.empty_like(h) if needs[0] else None
            grad_bias = torch.zeros(vocab, dtype=torch.float32, device=w.device) if needs[2] else None
            grad_up = torch.zeros_like(u, dtype=torch.float32) if u is not None and needs[3] else None
            losses = torch.zeros(tokens, dtype=torch.float32, device=h.device)
            # a trained head: each token's log-sum-exp for its weight's gradient by vocabulary blocks
            lse = torch.empty(tokens, dtype=torch.float32, device=h.device) if needs[1] else None
            targets = targets.contiguous()
            if lse is not None:  # only a trained head needs each token's target position
                has_target = targets != ignore_index
                index = torch.where(has_target, targets, 0).unsqueeze(1)
            names = getattr(kernel, "arg_names", None)  # a later liger's kernel: the names it takes
            for start in range(0, tokens, chunk):
                rows = slice(start, start + chunk)
                base = h[rows, :columns]
                logits = torch.addmm(b, base, w.T) if b is not None else base @ w.T
                if u is not None:  # the adapter's columns, added in place in the compute dtype (as the bias)
                    logits.addmm_(h[rows, columns:], u.T)
                if lse is not None:  # the kernel overwrites the logits: the target's and their sum first
                    unscored = _unscored(logits, index[rows], label_smoothing)
                args = _kernel_args(logits, targets[rows], losses[rows], ignore_index, label_smoothing, block)
                args["HAS_GRADIENTS"] = gradients
                if names is not None:
                    args = {k: v for k, v in args.items() if k in names}
                kernel[(logits.shape[0],)](**args, num_warps=_warps())
                if lse is not None:  # the row's loss + what it took off the log-sum-exp; none: no gradient
                    lse[rows] = torch.where(has_target[rows], losses[rows] + unscored, torch.inf)
                if grad_hidden is not None:  # ``logits`` now holds d(loss)/d(logits)
                    torch.mm(logits, w, out=grad_hidden[rows, :columns])
                    if u is not None:
                        torch.mm(logits, u, out=grad_hidden[rows, columns:])
                if grad_up is not None:
                    grad_up += (logits.T @ h[rows, columns:]).float()
                if grad_bias is not None:
                    grad_bias += logits.float().sum(0)
            grad_weight = None
            if lse is not None:
                grad_weight = head_weight_gradient(
                    h, w, b, targets, lse, up=u, ignore_index=ignore_index, label_smoothing=label_smoothing
                )
        grads = (grad_hidden, grad_weight, grad_bias, grad_up)
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in grads))
        ctx.dtypes = tuple(x.dtype if x is not None else None for x in (hidden, weight, bias, up))
        ctx.present = tuple(g is not None for g in grads)
        return losses.sum()

    @staticmethod
    def backward(ctx, grad_loss):
        # scaled on the device, in place where the saved gradient has the input's dtype
        grads = [
            (g if g.dtype == dtype else g.to(dtype)).mul_(grad_loss) if present else None
            for g, dtype, present in zip(ctx.saved_tensors, ctx.dtypes, ctx.present, strict=True)
        ]
        return grads[0], grads[1], grads[2], grads[3], None, None, None, None


def _unscored(logits: torch.Tensor, index: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """What a row's loss takes off its log-sum-exp, fp32: the row's loss is ``lse - x_y`` (the target's
    logit), with label smoothing ``s`` over ``V`` logits ``(1 - s)(lse - x_y) + s lse - (s / V) sum(x)``, so
    ``lse = loss + (1 - s) x_y + (s / V) sum(x)``."""
    picked = logits.gather(1, index).squeeze(1).float()
    if not label_smoothing:
        return picked
    return (1 - label_smoothing) * picked + (label_smoothing / logits.shape[1]) * logits.float().sum(-1)


def _warps() -> int:
    """The warps per row of liger's kernel, as liger launches it: 32 on NVIDIA's GPUs, 16 on AMD's (ROCm's
    torch, ``torch.version.hip``): 32 of their 64-thread wavefronts are more threads than a block takes."""
    return 16 if torch.version.hip else 32


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _kernel_args(logits, targets, losses, ignore_index, label_smoothing, block) -> dict:
    """liger 0.8's ``liger_cross_entropy_kernel`` arguments for one chunk: plain cross-entropy (no class
    weights, z-loss, soft-capping, accuracy or predicted tokens), the sum reduction (the target count, used
    by the mean only, is passed as 1: nothing read back to the host)."""
    return {
        "X_ptr": logits,
        "X_stride": logits.stride(-2),
        "Y_ptr": targets,
        "Y_stride": targets.stride(-1),
        "weight_ptr": None,
        "loss_ptr": losses,
        "z_loss_ptr": None,
        "loss_stride": losses.stride(-1),
        "token_accuracy_ptr": None,
        "token_accuracy_stride": 0,
        "predicted_tokens_ptr": None,
        "predicted_tokens_stride": 0,
        "n_cols": logits.shape[1],
        "n_non_ignore": 1,
        "sum_non_ignore_weight": 1,
        "weight_sum": 0.0,
        "ignore_index": ignore_index,
        "lse_square_scale": 0.0,
        "label_smoothing": label_smoothing,
        "reduction": "sum",
        "softcap": None,
        "RETURN_Z_LOSS": False,
        "RETURN_TOKEN_ACCURACY": False,
        "RETURN_PREDICTED_TOKENS": False,
        "BLOCK_SIZE": block,
        "HAS_WEIGHT": False,
        "HAS_SOFTCAPPING": False,
    }


def fused_linear_cross_entropy_sum(
    kernel: str,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    up: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The summed loss of the fused head through ``kernel`` (``linear_ce_kernel_choice``); ``up``: a LoRA
    head's B, the weight's columns kept apart (``linear_loss.linear_cross_entropy_sum``). cut-cross-entropy
    has no bias, no label smoothing and no columns kept apart: a head with a bias or a LoRA adapter keeps
    ours (smoothing with cce is refused with the parameters)."""
    if kernel == "liger":
        return liger_linear_cross_entropy_sum(
            hidden, weight, targets, bias, up=up, label_smoothing=label_smoothing
        )
    if kernel == "cce" and bias is None and up is None and not label_smoothing:
        return cce_linear_cross_entropy_sum(hidden, weight, targets)
    return linear_cross_entropy_sum(hidden, weight, targets, bias, up=up, label_smoothing=label_smoothing)


def apply_liger(model: torch.nn.Module, request: str, device: torch.device, *, strategy: str = "ddp") -> str:
    """Patch liger's RMSNorm, rotary and SwiGLU/GeGLU kernels onto ``model`` (in place, before compile) where
    ``train.model.liger`` = ``request`` allows it; why (or why not), logged once. ``on`` where it cannot be
    applied: one ``ConfigError`` line."""
    if request == "off":
        return f"liger kernels off ({MODEL_PARAM}: off)"
    base = unwrapped(model)
    family = getattr(getattr(base, "config", None), "model_type", None)
    problem = None  # the family first: the package named only where it is all that is missing
    if family not in LIGER_FAMILIES:
        problem = f"the {family} family has no liger patch here (families: {', '.join(LIGER_FAMILIES)})"
    problem = problem or liger_unavailable(device)
    if problem is None and strategy == "fsdp" and request == "auto":
        problem = "not verified under FSDP2 sharding (set it to on to try)"
    patch = None
    if problem is None:
        patch = getattr(
            importlib.import_module("liger_kernel.transformers"), f"apply_liger_kernel_to_{family}", None
        )
        if patch is None:
            problem = f"this liger-kernel has no apply_liger_kernel_to_{family}"
    if problem is not None:
        if request == "on":
            raise ConfigError(f"{MODEL_PARAM} is on, but {problem}.", fix=f"set {MODEL_PARAM}: auto or off.")
        why = f"liger kernels off (auto: {problem})"
        log.log(logging.INFO if device.type == "cuda" else logging.DEBUG, "%s", why)  # CPU: nothing to say
        return why
    accepted = inspect.signature(patch).parameters
    flags = {name: value for name, value in _PATCH_FLAGS.items() if name in accepted}
    patch(model=base, **flags)
    fused = ", ".join(name for name, value in flags.items() if value)
    why = f"liger kernels on the {family} model: {fused} ({MODEL_PARAM}: {request})"
    log.info("%s", why)
    return why
