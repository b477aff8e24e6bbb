"""Checks of LoRA layers' forward against peft's: adapters that add something (``nonzero_lora_b``), one
step's loss and gradients (``loss_and_grads``), and the memory-bound passes a model makes over its
activations (``ActivationOps``: dtype copies, clones, elementwise multiplications and additions whose output
has one row per token of the batch, what a LoRA layer's input cast, defensive clone, scaling pass and
separate sum cost, forward and backward)."""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COUNTED = ("_to_copy", "clone", "mul", "add")


class ActivationOps(TorchDispatchMode):
    """Counts the ``COUNTED`` aten ops whose output has ``rows`` rows (all dimensions but the last), and the
    bytes they write (``written``, by op and output dtype)."""

    def __init__(self, rows: int):
        super().__init__()
        self.rows = rows
        self.counts = collections.Counter()
        self.written = collections.Counter()  # bytes of the counted outputs, by op and dtype

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket).removeprefix("aten.")
        rows = out.numel() // out.shape[-1] if isinstance(out, torch.Tensor) and out.dim() >= 2 else 0
        if name in COUNTED and rows == self.rows:
            self.counts[name] += 1
            self.written[name, str(out.dtype).removeprefix("torch.")] += out.numel() * out.element_size()
        return out


def token_batch(vocab: int, tokens: int, rows: int = 2, seed: int = 2) -> dict:
    """``rows`` rows of ``tokens`` random token ids (the same on each call), as their own labels."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, tokens), generator=generator)
    return {"input_ids": ids, "labels": ids}


def relative_norm_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def nonzero_lora_b(model, scale: float = 0.1) -> None:
    """Draw every LoRA B (seeded): peft starts B at zero, so the adapters would add nothing and A would get
    no gradient, hiding any difference between two forwards."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)


def loss_and_grads(model, batch: dict, autocast: bool, seed: int = 3):
    """One forward (bf16 autocast or none) and backward: the loss and each trainable parameter's gradient."""
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    loss.backward()
    grads = {name: p.grad.float().clone() for name, p in model.named_parameters() if p.requires_grad}
    return loss.detach().float(), grads
