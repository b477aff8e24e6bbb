"""AdamW with weight decay on the weight matrices only.

Decay pulls weights towards zero; that regularises matrices (linear layers) but only hurts biases and norm
gains (1-D), whose scale is their meaning. Embedding tables are matrices but are usually left undecayed too
(rare tokens would shrink towards zero between their updates); ``decay_embeddings=True`` decays them.
A tied output head shares its tensor with the input embedding and follows the embedding rule.

The update kernel: ``fused=True`` (one kernel for all parameters) when every parameter is on CUDA, else
``foreach=True`` (a few multi-tensor kernels). Frozen parameters (``requires_grad=False``) are left out.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def parameter_groups(
    model: torch.nn.Module, weight_decay: float, *, decay_embeddings: bool = False
) -> list[dict]:
    """Two AdamW param groups, ``decay`` (≥2-D weights) and ``no_decay`` (the rest), named for logging."""
    embedding_weights = {
        id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)
    }
    decay, no_decay = [], []
    for param in model.parameters():  # each shared (tied) tensor once
        if not param.requires_grad:
            continue
        is_embedding = id(param) in embedding_weights
        if param.ndim >= 2 and (decay_embeddings or not is_embedding):
            decay.append(param)
        else:
            no_decay.append(param)
    return [
        {"name": "decay", "params": decay, "weight_decay": weight_decay},
        {"name": "no_decay", "params": no_decay, "weight_decay": 0.0},
    ]


def make_adamw(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    decay_embeddings: bool = False,
) -> torch.optim.AdamW:
    groups = parameter_groups(model, weight_decay, decay_embeddings=decay_embeddings)
    groups = [group for group in groups if group["params"]]
    params = [p for group in groups for p in group["params"]]
    on_cuda = bool(params) and torch.cuda.is_available() and all(p.is_cuda for p in params)
    kernel = {"fused": True} if on_cuda else {"foreach": True}
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kernel)
    log.info(
        "AdamW (%s): %s",
        next(iter(kernel)),
        ", ".join(
            f"{g['name']} {len(g['params'])} tensors / {sum(p.numel() for p in g['params']):,} params "
            f"(weight_decay={g['weight_decay']})"
            for g in groups
        ),
    )
    return optimizer
