"""NEFTune (Jain et al., 2023, "NEFTune: Noisy Embeddings Improve Instruction Finetuning"): while training,
uniform noise in ``[-alpha / sqrt(L d), alpha / sqrt(L d)]`` on every input embedding, L the row's length and
d the hidden size, as the Trainer and TRL add it (``neftune_noise_alpha``): transformers' own forward hook on
the model's input embeddings (peft models: the base model's), which adds nothing in evaluation mode. With
packed rows L is the packed row's length, as under TRL's padding-free packing."""

from __future__ import annotations

from collections.abc import Callable

import torch


def add_neftune(model: torch.nn.Module, alpha: float) -> Callable[[], None]:
    """Noise of scale ``alpha`` on ``model``'s input embeddings while it trains; returns what removes it."""
    # imported here: transformers' module brings the Trainer's utilities, and with them peft and
    # bitsandbytes, into every process that trains, noise or not
    from transformers.integrations.neftune import activate_neftune, deactivate_neftune

    handle = activate_neftune(model, alpha)
    return lambda: deactivate_neftune(model, handle)
