"""AdamW with weight decay on the weight matrices only.

Decay pulls weights towards zero; that regularises matrices (linear layers) but only hurts biases and norm
gains (1-D), whose scale is their meaning. Embedding tables are matrices but are usually left undecayed too
(rare tokens would shrink towards zero between their updates); ``decay_embeddings=True`` decays them.
A tied output head shares its tensor with the input embedding and follows the embedding rule.

The update kernel: ``fused=True`` (one pass over each parameter and its states) when every parameter is on
CUDA or every one on the CPU (torch's CPU kernel: 5.0x the multi-tensor kernels' speed on 0.47 B fp32
parameters on a 2-core CPU, ``benchmarks/optimizer_step.py``), else ``foreach=True`` (a few multi-tensor
kernels). Frozen parameters (``requires_grad=False``) are left out.

``train.optimizer.name`` (``make_optimizer``): ``adamw_8bit`` and ``paged_adamw_8bit`` are bitsandbytes'
AdamW with 8-bit (block-wise quantized) moments: 2 bytes per trainable parameter instead of 8, which matters
for a full fine-tune (a 7B model's AdamW states are 56 GB in fp32, 14 GB in 8 bits) and little for LoRA
(the adapters are a fraction of a percent of the weights). ``paged_`` keeps the states in CUDA unified
memory, which the driver pages out to host memory when a long batch spikes the activations instead of
running out of memory. Both get the same parameter groups and decay rule as torch's AdamW; the parameter
is refused in one line where bitsandbytes is missing, for ``paged_`` without CUDA, and for ``adamw_8bit`` on
a CPU-only machine with bitsandbytes before 0.50 (its CPU backend; ``engine.config.OptimizerParams``).
"""

from __future__ import annotations

import importlib
import logging

import torch

log = logging.getLogger(__name__)

# peft's names of the LoRA B matrices: ``<layer>.lora_B.<adapter>.weight`` of a linear (or convolution)
# layer, ``<layer>.lora_embedding_B.<adapter>`` of an embedding.
LORA_B = frozenset({"lora_B", "lora_embedding_B"})


def parameter_groups(
    model: torch.nn.Module,
    weight_decay: float,
    *,
    decay_embeddings: bool = False,
    substitute=None,
    lora_b_ratio: float | None = None,
) -> list[dict]:
    """AdamW param groups, ``decay`` (≥2-D weights) and ``no_decay`` (the rest), named for logging.
    ``substitute(param)``: what the optimizer updates in its place (``MasterWeights.master_of``).
    ``lora_b_ratio`` (LoRA+, ``train.model.lora.loraplus_lr_ratio``): peft's LoRA B matrices, and the 1-D
    trainable parameters (biases, DoRA's magnitudes), learn at that multiple of the rate, as peft's
    ``create_loraplus_optimizer`` groups them: ``lora_b`` (decayed as ``decay``) and ``lora_b_no_decay``, each
    with ``lr_scale`` = the ratio (``schedule.make_lr_scheduler`` multiplies its rate by it at every step, and
    a resume keeps it with the group's other settings, ``persistence.keep_settings``).

    An adapted embedding (``target_modules`` naming it) has ``lora_embedding_A`` (r x vocab: r numbers per
    token) and ``lora_embedding_B`` (hidden x r): B maps the rank up to the model's width as a linear
    adapter's B does, so it learns at the ratio in ``lora_b`` and A at the base rate in ``decay``, both
    decayed as the other adapter matrices. Of the adapters, peft groups these alone otherwise: both in a group
    of their own at ``loraplus_lr_embedding``, an absolute rate (1e-6 by default) that fastlm has no setting
    for. A rate relative to the base follows the schedule and a changed ``train.optimizer.lr`` as the other
    groups' do; a fixed 1e-6 would all but freeze, at LoRA's usual rates, the adapter the user asked for."""
    embedding_weights = {
        id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)
    }
    groups = {name: [] for name in ("decay", "no_decay", "lora_b", "lora_b_no_decay")}
    for name, param in model.named_parameters():  # each shared (tied) tensor once
        if not param.requires_grad:
            continue
        is_embedding = id(param) in embedding_weights
        decayed = param.ndim >= 2 and (decay_embeddings or not is_embedding)
        faster = lora_b_ratio is not None and (not LORA_B.isdisjoint(name.split(".")) or param.ndim == 1)
        group = "decay" if decayed else "no_decay"
        groups[{"decay": "lora_b", "no_decay": "lora_b_no_decay"}[group] if faster else group].append(param)
    if substitute is not None:
        groups = {name: [substitute(p) for p in params] for name, params in groups.items()}
    made = [
        {"name": "decay", "params": groups["decay"], "weight_decay": weight_decay},
        {"name": "no_decay", "params": groups["no_decay"], "weight_decay": 0.0},
    ]
    if lora_b_ratio is not None:
        faster = {"lr_scale": lora_b_ratio}
        made += [
            {"name": "lora_b", "params": groups["lora_b"], "weight_decay": weight_decay, **faster},
            {"name": "lora_b_no_decay", "params": groups["lora_b_no_decay"], "weight_decay": 0.0, **faster},
        ]
    return made


def make_adamw(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    decay_embeddings: bool = False,
    substitute=None,
    lora_b_ratio: float | None = None,
) -> torch.optim.AdamW:
    """torch's AdamW over ``parameter_groups`` (see it for ``substitute`` and ``lora_b_ratio``)."""
    groups = parameter_groups(
        model,
        weight_decay,
        decay_embeddings=decay_embeddings,
        substitute=substitute,
        lora_b_ratio=lora_b_ratio,
    )
    groups = [_scaled(group, lr) for group in groups if group["params"]]
    params = [p for group in groups for p in group["params"]]
    devices = {p.device.type for p in params}
    fused = devices == {"cpu"} or (devices == {"cuda"} and torch.cuda.is_available())
    kernel = {"fused": True} if fused else {"foreach": True}
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kernel)
    log.info(
        "AdamW (%s): %s",
        next(iter(kernel)),
        ", ".join(
            f"{g['name']} {len(g['params'])} tensors / {sum(p.numel() for p in g['params']):,} params "
            f"(weight_decay={g['weight_decay']}{_rate(g)})"
            for g in groups
        ),
    )
    return optimizer


BITSANDBYTES_CLASSES = {"adamw_8bit": "AdamW8bit", "paged_adamw_8bit": "PagedAdamW8bit"}


def make_optimizer(
    model: torch.nn.Module,
    settings,
    *,
    decay_embeddings: bool = False,
    substitute=None,
    lora_b_ratio: float | None = None,
) -> torch.optim.Optimizer:
    """The optimizer ``settings`` (``OptimizerParams``) names, over ``parameter_groups`` of ``model``
    (``substitute``, ``lora_b_ratio``: see ``parameter_groups``)."""
    betas = (settings.beta1, settings.beta2)
    if settings.name == "adamw":
        return make_adamw(
            model,
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            betas=betas,
            eps=settings.eps,
            decay_embeddings=decay_embeddings,
            substitute=substitute,
            lora_b_ratio=lora_b_ratio,
        )
    cls = getattr(importlib.import_module("bitsandbytes").optim, BITSANDBYTES_CLASSES[settings.name])
    groups = parameter_groups(
        model,
        settings.weight_decay,
        decay_embeddings=decay_embeddings,
        substitute=substitute,
        lora_b_ratio=lora_b_ratio,
    )
    groups = [_scaled(group, settings.lr) for group in groups if group["params"]]
    optimizer = cls(groups, lr=settings.lr, betas=betas, eps=settings.eps)
    log.info(
        "%s (bitsandbytes, 8-bit states): %s",
        cls.__name__,
        ", ".join(
            f"{g['name']} {len(g['params'])} tensors (weight_decay={g['weight_decay']}{_rate(g)})"
            for g in groups
        ),
    )
    return optimizer


def _scaled(group: dict, lr: float) -> dict:
    """``group`` with its own learning rate where it has an ``lr_scale`` (LoRA+'s B matrices)."""
    return {**group, "lr": lr * group["lr_scale"]} if "lr_scale" in group else group


def _rate(group: dict) -> str:
    return f", lr x {group['lr_scale']:g}" if "lr_scale" in group else ""
