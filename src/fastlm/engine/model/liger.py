"""liger-kernel's Triton kernels where they beat our own code: on a CUDA GPU with liger-kernel installed.

Two levers, each off by a parameter, each falling back to our pure-PyTorch code elsewhere:

* ``train.loss.fused_linear_kernel`` (``linear_ce_kernel_choice``): the fused LM head + loss of
  ``linear_loss`` runs liger's ``liger_fused_linear_cross_entropy`` (one Triton kernel per chunk for the
  softmax, the loss and its gradient, in place in the logits chunk) instead of our chunked PyTorch loop.
  Same contract: the fp32 *sum* over the target tokens (divided later by the step's global target count,
  ``accumulation``), ``ignore_index`` rows scoring nothing, ``F.cross_entropy``'s label smoothing, the bias,
  fp32 accumulation of the weight and bias gradients (``accum_dtype``). Our ``linear_cross_entropy_sum``
  stays the CPU path and the reference the liger path is tested against (``tests/engine/model/
  test_liger.py``, with a stand-in liger module).
* ``train.model.liger`` (``apply_liger``): liger's fused RMSNorm, rotary embedding and SwiGLU (GeGLU for
  Gemma) patched onto the model instance through its family's ``apply_liger_kernel_to_<family>(model=...)``,
  with liger's own cross-entropy options off: our loss path owns the head.

Costs liger brings: its fused linear cross-entropy reads the number of target tokens back to the host
(``.item()``) once per micro-batch, a sync our path avoids; its rotary patch replaces the family's
module-level ``apply_rotary_pos_emb``, so it holds for every model of that family in the process (one device
per run).
"""

from __future__ import annotations

import importlib
import inspect
import logging

import torch

from fastlm.engine.model.cce import cce_linear_cross_entropy_sum, cce_unavailable, triton_kernel_unavailable
from fastlm.engine.model.encoder_decoder import unwrapped
from fastlm.engine.model.linear_loss import IGNORE_INDEX, linear_cross_entropy_sum
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
        return "liger", f"liger-kernel's fused linear cross-entropy ({KERNEL_PARAM}: {request})"
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
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``linear_loss.linear_cross_entropy_sum``'s contract through liger's kernel: the fp32 summed loss
    (``reduction="sum"``: the caller divides by the step's target count), the weight and bias gradients
    accumulated in fp32 (``accum_dtype``), the hidden states in the weight's dtype (liger multiplies them as
    given; ours casts them the same way)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    loss = liger_fused_linear_cross_entropy(
        hidden.to(weight.dtype).contiguous(),
        weight,
        targets.contiguous(),
        bias=bias,
        ignore_index=ignore_index,
        label_smoothing=float(label_smoothing),
        reduction="sum",
        accum_dtype=torch.float32,
    )
    return loss.float()


def fused_linear_cross_entropy_sum(
    kernel: str,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The summed loss of the fused head through ``kernel`` (``linear_ce_kernel_choice``). liger computes
    the weight's gradient only when the hidden states need one too: a trainable head on a frozen body (no
    such run in fastlm so far) keeps ours. cut-cross-entropy has no bias and no label smoothing: a head with
    a bias keeps ours (smoothing with cce is refused with the parameters)."""
    if kernel == "liger" and (hidden.requires_grad or not weight.requires_grad):
        return liger_linear_cross_entropy_sum(hidden, weight, targets, bias, label_smoothing=label_smoothing)
    if kernel == "cce" and bias is None and not label_smoothing:
        return cce_linear_cross_entropy_sum(hidden, weight, targets)
    return linear_cross_entropy_sum(hidden, weight, targets, bias, label_smoothing=label_smoothing)


def apply_liger(model: torch.nn.Module, request: str, device: torch.device, *, strategy: str = "ddp") -> str:
    """Patch liger's RMSNorm, rotary and SwiGLU/GeGLU kernels onto ``model`` (in place, before compile) where
    ``train.model.liger`` = ``request`` allows it; why (or why not), logged once. ``on`` where it cannot be
    applied: one ``ConfigError`` line."""
    if request == "off":
        return f"liger kernels off ({MODEL_PARAM}: off)"
    base = unwrapped(model)
    family = getattr(getattr(base, "config", None), "model_type", None)
    problem = liger_unavailable(device)
    if problem is None and family not in LIGER_FAMILIES:
        problem = f"the {family} family has no liger patch here (families: {', '.join(LIGER_FAMILIES)})"
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
