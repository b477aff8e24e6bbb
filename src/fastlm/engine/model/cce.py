"""cut-cross-entropy's fused LM head + loss: ``train.loss.fused_linear_kernel: cce`` (CUDA, the package).

cut-cross-entropy (``cut_cross_entropy.linear_cross_entropy``) computes the cross-entropy of ``hidden @ W.T``
without writing the logits to memory at all (its Triton kernels keep each block of them in on-chip memory),
where ours and liger's materialise one chunk of them at a time. Same contract as
``linear_loss.linear_cross_entropy_sum``: the fp32 *sum* over the target tokens (the caller divides by the
step's global target count), ``ignore_index`` rows scoring nothing, targets already shifted (``shift``
off). Its backward skips the softmax entries below bf16's resolution (the library's default
``filter_eps="high"``): the loss is exact, the gradients within bf16 rounding of the exact ones.

What it cannot compute keeps another kernel: label smoothing is refused with the parameters
(``engine.config``), and a head with a bias (no Llama-family head has one) runs ours. Chosen only when asked
(``auto`` stays liger / ours until a GPU run has measured the two against each other). Tested on CPU with a
stand-in module (``tests/engine/model/test_cce.py``); the kernel runs in ``benchmarks/gpu_levers.py``.
"""

from __future__ import annotations

import importlib

import torch

from fastlm.engine.model.linear_loss import IGNORE_INDEX

__all__ = ["cce_linear_cross_entropy_sum", "cce_unavailable"]


def cce_unavailable(device: torch.device) -> str | None:
    """Why cut-cross-entropy cannot run for a run on ``device`` (None: it can)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return "this run is not on a CUDA device (cut-cross-entropy's kernels are Triton, GPU only)"
    try:
        importlib.import_module("cut_cross_entropy")
    except ImportError:
        return "cut-cross-entropy is not installed (`pip install cut-cross-entropy`)"
    return None


def cce_linear_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """``linear_loss.linear_cross_entropy_sum``'s contract (no bias, no label smoothing) through
    cut-cross-entropy: the fp32 summed loss, the hidden states in the weight's dtype (its kernels multiply
    two operands of one dtype)."""
    from cut_cross_entropy import linear_cross_entropy

    loss = linear_cross_entropy(
        hidden.to(weight.dtype).contiguous(),
        weight,
        targets.contiguous(),
        ignore_index=ignore_index,
        reduction="sum",
        shift=False,
    )
    return loss.float()
