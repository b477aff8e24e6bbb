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

from fastlm.engine.model.linear_loss import IGNORE_INDEX, product_dtype
from fastlm.errors import ConfigError

__all__ = ["CCE_DTYPES", "cce_linear_cross_entropy_sum", "cce_unavailable", "triton_kernel_unavailable"]

CCE_DTYPES = (torch.bfloat16, torch.float16)  # its backward kernel takes these alone (25.1 asserts it)


def triton_kernel_unavailable(device: torch.device, module: str, package: str, library: str) -> str | None:
    """Why ``library``'s Triton kernels (importable as ``module``, installed as ``package``) cannot run for a
    run on ``device`` (None: they can); liger-kernel's and cut-cross-entropy's alike."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"this run is not on a CUDA device ({library}'s kernels are Triton, GPU only)"
    try:
        importlib.import_module(module)
    except ImportError:
        return f"{library} is not installed (`pip install {package}`)"
    return None


def cce_unavailable(device: torch.device) -> str | None:
    """Why cut-cross-entropy cannot run for a run on ``device`` (None: it can)."""
    return triton_kernel_unavailable(device, "cut_cross_entropy", "cut-cross-entropy", "cut-cross-entropy")


def cce_operand_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype both operands reach cut-cross-entropy in (``linear_loss.product_dtype``: autocast's where the
    caller runs under it, else the weight's). Its backward has no fp32 kernel: an fp32 run is refused (the
    parameters refuse the pair first)."""
    dtype = product_dtype(hidden, weight)
    if dtype not in CCE_DTYPES:
        raise ConfigError(
            f"train.loss.fused_linear_kernel is cce, whose backward computes in bf16 or fp16 only, and this "
            f"step runs in {str(dtype).removeprefix('torch.')}.",
            fix="set train.runtime.precision: bf16 (or auto), or train.loss.fused_linear_kernel: auto.",
        )
    return dtype


def cce_linear_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """``linear_loss.linear_cross_entropy_sum``'s contract (no bias, no label smoothing) through
    cut-cross-entropy: the fp32 summed loss. Both operands in ``cce_operand_dtype`` (its kernels multiply two
    operands of one dtype, bf16/fp16 in its backward); an fp32 weight's gradient comes back through the cast
    in fp32."""
    from cut_cross_entropy import linear_cross_entropy

    dtype = cce_operand_dtype(hidden, weight)
    loss = linear_cross_entropy(
        hidden.to(dtype).contiguous(),
        weight.to(dtype),
        targets.contiguous(),
        ignore_index=ignore_index,
        reduction="sum",
        shift=False,
    )
    return loss.float()
