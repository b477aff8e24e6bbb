"""NEFTune (Jain et al., 2023, "NEFTune: Noisy Embeddings Improve Instruction Finetuning"): while training,
uniform noise in ``[-alpha / sqrt(L d), alpha / sqrt(L d)]`` on every input embedding, d the hidden size and L
the length of the token's own sample, as the NEFTune authors' code scales it (the sample's unpadded length);
nothing in evaluation mode. On a LoRA model the hook sits on the base model's embeddings, as the Trainer's
``neftune_noise_alpha`` puts it.

The Trainer and TRL (transformers' ``neftune_post_forward_hook``) take L from the embedding tensor's length:
the padded row, or under padding-free packing the whole micro-batch, so the noise would depend on the batching
mode, the micro-batch size and the attention path (the varlen kernels see a micro-batch as one row of all its
tokens). Here a forward pre-hook on the model reads each token's sample from the inputs of its call, on the
device and without a sync: restarting ``position_ids`` (packed rows, the varlen row), else the 2-D
``attention_mask`` (padded rows: each row's real tokens). Without either (the embeddings called alone), L is
the tensor's row length, as transformers takes it.

An encoder-decoder model (BART, T5) embeds its tokens through its encoder's and its decoder's own
``embed_tokens``, not the shared table ``get_input_embeddings`` returns (a hook there never runs): the noise
goes on both, each side's L its own sample's length on that side (packed rows: the packed positions each side
restarts per sample; padded rows: ``attention_mask`` / ``decoder_attention_mask``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fastlm.engine.model.encoder_decoder import DECODER_POSITIONS, ENCODER_POSITIONS


def add_neftune(model: torch.nn.Module, alpha: float) -> Callable[[], None]:
    """Noise of scale ``alpha`` on ``model``'s input embeddings while it trains; returns what removes it."""
    state: dict[str, torch.Tensor | None] = {}
    sides = _token_embeddings(model)

    def remember(module, args, kwargs):
        state.clear()
        if module.training:
            read = ("encoder", "decoder") if "shared" in sides else sides
            state.update({side: _side_lengths(kwargs, side) for side in read})

    def noise(side: str):
        def hook(module, args, output):
            # one table for both sides: the encoder's call comes first, then the decoder's
            lengths = state.pop(side if side != "shared" else next(iter(state), ""), None)
            if not module.training:
                return output
            if lengths is None or lengths.shape != output.shape[:-1]:
                lengths = torch.full(output.shape[:-1], output.size(1), device=output.device)
            scale = alpha / (lengths.to(torch.float32) * output.size(-1)).sqrt()
            return output + ((torch.rand_like(output) * 2 - 1) * scale.unsqueeze(-1)).to(output.dtype)

        return hook

    # first among the model's pre-hooks: the packed encoder-decoder inputs are taken off the call by another
    handles = [model.register_forward_pre_hook(remember, with_kwargs=True, prepend=True)]
    handles += [table.register_forward_hook(noise(side)) for side, table in sides.items()]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove


def _side_lengths(kwargs: dict, side: str) -> torch.Tensor | None:
    """Each token's sample length on ``side`` (``tokens``: a decoder-only model's; ``encoder`` /
    ``decoder``) from a model call's keyword inputs."""
    if side == "tokens":
        return sample_lengths(kwargs)
    packed, mask = (
        (ENCODER_POSITIONS, "attention_mask")
        if side == "encoder"
        else (DECODER_POSITIONS, "decoder_attention_mask")
    )
    if isinstance(kwargs.get(packed), torch.Tensor):
        return sample_lengths({"position_ids": kwargs[packed]})
    return sample_lengths({"attention_mask": kwargs.get(mask)})


def sample_lengths(inputs: dict) -> torch.Tensor | None:
    """Each token's sample length (``[rows, T]``, on the inputs' device), from a model call's keyword inputs:
    ``position_ids`` restarting at 0 where a sample starts, else a 2-D ``attention_mask`` (each row's real
    tokens); None without either."""
    positions = inputs.get("position_ids")
    if isinstance(positions, torch.Tensor) and positions.dim() == 2:
        rows, length = positions.shape
        starts = positions == 0
        starts[:, 0] = True  # a row starts a sample (its positions may continue one cut elsewhere)
        segment = starts.cumsum(-1) - 1 + torch.arange(rows, device=positions.device)[:, None] * length
        counts = torch.zeros(rows * length, dtype=torch.int64, device=positions.device)
        counts.scatter_add_(0, segment.reshape(-1), torch.ones_like(segment).reshape(-1))
        return counts[segment]
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        real = mask.sum(-1, keepdim=True).clamp(min=1)
        return real.expand(mask.shape)
    return None


def _token_embeddings(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The embeddings the noise goes on, by side: a PEFT model's base model's (transformers'
    ``activate_neftune``); an encoder-decoder's encoder and decoder token tables (``shared`` where they are
    one module, which then sees the encoder's call first)."""
    base = getattr(getattr(model, "base_model", None), "model", None)
    owner = base if base is not None and hasattr(model, "peft_config") else model
    if not getattr(getattr(owner, "config", None), "is_encoder_decoder", False):
        return {"tokens": owner.get_input_embeddings()}
    encoder = getattr(owner.get_encoder(), "embed_tokens", None) or owner.get_input_embeddings()
    decoder = getattr(owner.get_decoder(), "embed_tokens", None) or owner.get_input_embeddings()
    return {"shared": encoder} if encoder is decoder else {"encoder": encoder, "decoder": decoder}
