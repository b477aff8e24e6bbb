"""Counting the memory-bound passes a model makes over its activations: dtype copies, clones, elementwise
multiplications and additions whose output has one row per token of the batch (what a LoRA layer's input
cast, defensive clone, scaling pass and separate sum cost, forward and backward)."""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COUNTED = ("_to_copy", "clone", "mul", "add")


class ActivationOps(TorchDispatchMode):
    """Counts the ``COUNTED`` aten ops whose output has ``rows`` rows (all dimensions but the last)."""

    def __init__(self, rows: int):
        super().__init__()
        self.rows = rows
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket).removeprefix("aten.")
        rows = out.numel() // out.shape[-1] if isinstance(out, torch.Tensor) and out.dim() >= 2 else 0
        if name in COUNTED and rows == self.rows:
            self.counts[name] += 1
        return out


def relative_norm_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))
