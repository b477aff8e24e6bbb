"""Gradient checkpointing (activation recompute) policies: ``train.model.gradient_checkpointing``.

A decoder layer that checkpoints keeps only its input for the backward and runs its forward again there: less
activation memory for about a third more compute in that layer. The policies:

* ``off``: every layer keeps its activations (fastest; the most memory).
* ``selective``: every other decoder layer checkpoints (layers 0, 2, 4, ...): about half the activation memory
  for about half the recompute. Whole layers, not only the MLP: the per-layer switch is the one transformers
  gives every architecture (``GradientCheckpointingLayer``, ``every_n_layers``) and peft's k-bit preparation
  keeps, so it works for any model the project loads without patching its forward; an MLP-only checkpoint
  would need a per-architecture wrapper and, with SDPA or flash attention (which keep little of their own),
  saves about what a whole layer saves.
* ``full``: every decoder layer checkpoints (the least memory, the most recompute).
* ``auto``: ``off`` at build time; ``kedro run --pipeline=tune`` measures the policies when the micro-batch
  is memory-bound and writes the one it chose into the tuned parameters.

Always non-reentrant (``use_reentrant=False``): it needs no input that requires grad, so frozen embeddings
(LoRA) keep their adapters' gradients.
"""

from __future__ import annotations

import inspect

POLICIES = ("off", "selective", "full")
EVERY_N_LAYERS = {"selective": 2, "full": 1}
_KWARGS = {"use_reentrant": False}


def resolve_policy(requested: str) -> str:
    """The policy a model is built with: ``auto`` is ``off`` until tune writes one (module docstring)."""
    return "off" if requested == "auto" else requested


def enable_checkpointing(model, policy: str = "full") -> None:
    """Apply ``policy`` to ``model`` (a transformers model or a peft wrapper of one), replacing any other."""
    policy = resolve_policy(policy)
    if policy not in POLICIES:
        raise ValueError(f"unknown gradient checkpointing policy {policy!r}; one of {POLICIES}")
    if policy == "off":
        if checkpointed_layers(model):
            disable = getattr(model, "activation_checkpointing_disable", None)
            (disable or model.gradient_checkpointing_disable)()
        return
    every = EVERY_N_LAYERS[policy]
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x
    if enable is not None and "every_n_layers" in inspect.signature(enable).parameters:
        enable(activation_checkpointing_kwargs=dict(_KWARGS), every_n_layers=every)
        return
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(_KWARGS))
    for index, layer in enumerate(_layers(model)):  # older transformers: every layer on, then thin them out
        layer.gradient_checkpointing = index % every == 0


def checkpointed_layers(model) -> list[int]:
    """Indices (in model order) of the decoder layers that checkpoint."""
    return [index for index, layer in enumerate(_layers(model)) if layer.gradient_checkpointing]


def checkpointing_in_use(model) -> tuple[str, str]:
    """The policy ``model``'s decoder layers run with, read from the layers (``off``, ``selective``,
    ``full``, or ``partial`` for another pattern), and how many checkpoint: ``("selective", "14 of 28")``."""
    layers, on = _layers(model), checkpointed_layers(model)
    if not on:
        policy = "off"
    elif on == list(range(len(layers))):
        policy = "full"
    elif on == list(range(0, len(layers), EVERY_N_LAYERS["selective"])):
        policy = "selective"
    else:
        policy = "partial"
    return policy, f"{len(on)} of {len(layers)}"


def _layers(model) -> list:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
