"""Tolerances for tests that compare two *different* computations, each with the reason for its size.

Exact equality (``==``, ``torch.equal``) is kept only where the very same computation runs twice: a bitwise
resume, a determinism check, the same collator called again. Two different computations (another kernel,
attention path, precision, packed vs one row each, chunked vs whole, one batch vs accumulation, compiled vs
eager) round differently, and *how* differently depends on the CPU: PyTorch dispatches other kernels on Intel
and AMD (``ATEN_CPU_CAPABILITY``, MKL and oneDNN pick their own code paths), so such a comparison uses one of
these. ``scripts/check_cpu_kernels.sh`` runs the tests marked ``kernels`` under several CPU kernel sets.
"""

from __future__ import annotations

import torch

EPS_FP32 = torch.finfo(torch.float32).eps  # 1.19e-07
EPS_BF16 = torch.finfo(torch.bfloat16).eps  # 7.8e-03: 8 mantissa bits


def reordered_sum_rtol(terms: int) -> float:
    """A sum of ``terms`` fp32 values taken in another order (split into micro-batches, chunked, another
    blocking): its rounding error is bounded by ``terms * eps`` relative to the sum of magnitudes (Higham,
    *Accuracy and Stability of Numerical Algorithms*, 4.2), for non-negative terms such as losses."""
    return max(terms, 1) * EPS_FP32


# One fp32 forward through another kernel or layout (SDPA vs additive-mask softmax, varlen vs padded,
# packed rows vs one row each, a sliced LM head): each output is a dot product over a few hundred terms,
# reordered, so ~sqrt(n) * eps ~ 1e-6 typical and n * eps ~ 1e-5 at worst; atol for outputs near zero.
OTHER_FP32_KERNEL = {"rtol": 1e-5, "atol": 1e-5}

# The outputs (logits, mean loss) of a whole tiny model (2-4 layers) run through another kernel or layout:
# the per-op differences above compound over the layers and the head, so an order of magnitude more.
OTHER_FP32_MODEL = {"rtol": 1e-4, "atol": 1e-4}

# The gradients of such a forward: backward chains two more reordered products per layer, and small entries
# are differences of large ones, so an order of magnitude more relative room than the forward.
OTHER_FP32_KERNEL_GRAD = {"rtol": 1e-4, "atol": 1e-6}

# Per-step losses of two short fp32 training runs (<= 20 toy steps) on two different kernels: forward
# differences of ~1e-7 (above) go through AdamW's normalised update; measured <= 1e-7 relative on three CPU
# kernel sets, and one shifted label or mask moves a loss by >= 1e-3.
TRAINED_FP32_LOSS_REL = 1e-5

# The weights after those steps: each AdamW update is lr * m / sqrt(v), so gradients that differ in their last
# bits move a weight by ~lr * 1e-5 at most; the atol covers weights near zero.
TRAINED_FP32_WEIGHTS = {"rtol": 1e-5, "atol": 1e-6}

# A LoRA adapter merged into the weights (W + scale * B @ A rounded once per weight) against the unmerged
# forward (x @ W + scale * (x @ A) @ B): logits of ~1 through a few layers differ by ~1e-6, 1e-4 leaves room.
MERGED_ADAPTER_ATOL = 1e-4

# bf16 against fp32: 8 mantissa bits, so one rounding is up to eps_bf16 / 2 ~ 4e-3 relative.
BF16_VS_FP32 = {"rtol": 2 * EPS_BF16, "atol": 2 * EPS_BF16}

# The mean loss of a whole tiny model under bf16 autocast vs fp32: a few bf16 roundings per layer, partly
# averaging out over the tokens; ~2.5 eps_bf16.
BF16_MODEL_LOSS_REL = 2e-2
