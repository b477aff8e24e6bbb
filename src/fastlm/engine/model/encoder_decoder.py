"""Packed encoder-decoder rows inside the model: which families take them, and the hooks that feed them.

A packed seq2seq batch (``data.seq2seq_packing``) needs three things from the model beyond its usual inputs:

1. per-sample masks for encoder self-attention, decoder self-attention and cross-attention. transformers 5
   returns a 4D ``attention_mask`` / ``decoder_attention_mask`` as given (``masking_utils.
   _preprocess_mask_arguments``), but ``BartModel`` / ``T5ForConditionalGeneration`` hand the ENCODER mask to
   the decoder's cross-attention too (``encoder_attention_mask=attention_mask``), and a ``[R,1,Te,Te]`` mask
   is not a ``[R,1,Td,Te]`` one. A forward pre-hook on the decoder stack swaps in the cross-attention mask.
2. positions restarting per sample where the family uses absolute learned positions (BART, mBART). Their
   ``*LearnedPositionalEmbedding`` computes ``arange(T)`` itself; the encoder takes no ``position_ids`` and
   the decoder builds its own. A forward hook on each ``embed_positions`` module returns the same table looked
   up at the packed positions (``weight[position + offset]``, gradients flow to the table as usual).
3. T5 / mT5 need no positions: their relative position bias depends on ``key - query`` only, which is the same
   inside a packed sample as alone, and the masks remove every cross-sample pair.

Any encoder-decoder model also gets a head hook (``enable_target_head``, packed or not): these families take
no ``logits_to_keep``, so a training step passes the flat positions that predict a target (``HEAD_POSITIONS``,
from the host-side labels: no device sync) and a forward pre-hook on the output embedding (the LM head module;
T5 scales its input before it, BART adds ``final_logits_bias`` after it, both unchanged) keeps only those
decoder states: the head and the loss run on ``[1, K]`` positions instead of every padded decoder position.

The extra inputs travel as keyword arguments of the model call (``PACKED_KEYS``, set by
``inputs.to_device``); a forward pre-hook on the model that is called pops them (the model never sees them)
and a forward hook (``always_call``) forgets them after the call. That model is the one a step calls under
DDP / ``torch.compile``, a PEFT wrapper included: the extra keywords never reach a wrapper's own ``forward``.
Without them the hooks do nothing (generation, unpacked batches). Families outside ``PACKABLE_FAMILIES``
(sinusoidal positions: Marian, Pegasus; others not checked) and attention paths without dense masks keep
length-grouped dynamic padding.

Exactness (every sample's logits, loss and gradients packed == alone):
tests/engine/data/test_seq2seq_packing.py.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

__all__ = [
    "CROSS_ATTENTION_MASK",
    "DECODER_POSITIONS",
    "DENSE_MASK_ATTENTION",
    "ENCODER_POSITIONS",
    "HEAD_POSITIONS",
    "PACKABLE_FAMILIES",
    "PACKED_KEYS",
    "enable_packed_seq2seq",
    "enable_target_head",
    "generate_as_trained",
    "packing_unavailable",
    "takes_head_positions",
    "unwrapped",
]

ENCODER_POSITIONS = "packed_encoder_position_ids"
DECODER_POSITIONS = "packed_decoder_position_ids"
CROSS_ATTENTION_MASK = "packed_cross_attention_mask"
PACKED_KEYS = (ENCODER_POSITIONS, DECODER_POSITIONS, CROSS_ATTENTION_MASK)
HEAD_POSITIONS = "fastlm_head_positions"  # [1, K] flat decoder positions that predict a target
INPUT_KEYS = (*PACKED_KEYS, HEAD_POSITIONS)
PACKABLE_FAMILIES = {
    "bart": "learned absolute positions, restarted per sample by a hook",
    "mbart": "learned absolute positions, restarted per sample by a hook",
    "t5": "relative position bias, exact under the block masks",
    "mt5": "relative position bias, exact under the block masks",
}
DENSE_MASK_ATTENTION = ("sdpa", "eager")  # the 4D masks are dense: bool (SDPA) or additive (eager)
STATE_ATTRIBUTE = "fastlm_packed_seq2seq_state"
HEAD_FLAG = "fastlm_target_head"


def entry_module(model) -> torch.nn.Module:
    """The module a training step calls, under DDP (``.module``) and ``torch.compile`` (``._orig_mod``)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or (
            model.module if type(model).__name__ == "DistributedDataParallel" else None
        )
        if inner is None:
            return model
        model = inner


def unwrapped(model) -> torch.nn.Module:
    """The transformers model under DDP / compile / PEFT wrappers."""
    model = entry_module(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def generate_as_trained(model, start: int, head: tuple[int, ...] = ()) -> None:
    """``model`` generates (report, predict, its saved folder in any ``pipeline()``) from the decoder prefix
    it trains on: ``start``, then ``head`` (the tokenizer's BOS before a text, ``collators.TextEnds``: BART's
    ``<s>``), then the response. One head token is forced as the first generated one
    (``forced_bos_token_id``, as facebook/bart-large-cnn's own config does); without one, a checkpoint that
    forces BOS has it dropped, said once. A config without ``decoder_start_token_id`` gets the one training
    uses."""
    base = unwrapped(model)
    base.config.decoder_start_token_id = start
    generation = getattr(base, "generation_config", None)
    if generation is None:
        return
    generation.decoder_start_token_id = start
    forced = getattr(generation, "forced_bos_token_id", None)
    if len(head) == 1:
        generation.forced_bos_token_id = int(head[0])
    elif forced is not None:
        generation.forced_bos_token_id = None
        log.info(
            "generation: the checkpoint's forced_bos_token_id %d dropped: the decoder trains on the response "
            "right after its start token %d, and generates so",
            forced,
            start,
        )


def packing_unavailable(model, attn: str) -> str | None:
    """Why ``model`` cannot train on packed encoder-decoder rows with ``attn`` (None: it can)."""
    family = getattr(getattr(unwrapped(model), "config", None), "model_type", None)
    if family not in PACKABLE_FAMILIES:
        return (
            f"the {family} family is not checked for packed encoder-decoder rows (packed: "
            f"{', '.join(sorted(PACKABLE_FAMILIES))})"
        )
    if attn not in DENSE_MASK_ATTENTION:
        return (
            f"{attn} attention takes no dense per-sample masks (packed encoder-decoder rows: sdpa or eager)"
        )
    return None


def enable_packed_seq2seq(model) -> None:
    """Install the packing hooks of the module docstring on ``model`` (idempotent; inactive without
    ``PACKED_KEYS``)."""
    base, state = _shared_state(model)
    if not state.get("packing_hooks"):
        encoder, decoder = base.get_encoder(), base.get_decoder()
        for stack, key in ((encoder, ENCODER_POSITIONS), (decoder, DECODER_POSITIONS)):
            table = getattr(stack, "embed_positions", None)
            if table is not None:
                table.register_forward_hook(_positions_hook(state, key))
        decoder.register_forward_pre_hook(_cross_attention_hook(state), with_kwargs=True)
        state["packing_hooks"] = True


def enable_target_head(model) -> None:
    """Install the head hook of the module docstring on ``model`` (idempotent; inactive without
    ``HEAD_POSITIONS``): ``takes_head_positions`` is then true."""
    base, state = _shared_state(model)
    if not vars(base).get(HEAD_FLAG):
        base.get_output_embeddings().register_forward_pre_hook(_head_hook(state))
        setattr(base, HEAD_FLAG, True)


def takes_head_positions(model) -> bool:
    """Whether the encoder-decoder model under ``model``'s wrappers keeps its LM head to
    ``HEAD_POSITIONS``."""
    return bool(vars(unwrapped(model)).get(HEAD_FLAG))


def _shared_state(model) -> tuple[torch.nn.Module, dict]:
    """The transformers model and the state its hooks share; the entry module's hooks that fill it, once."""
    entry = entry_module(model)
    base = unwrapped(model)
    state = getattr(base, STATE_ATTRIBUTE, None)
    if state is None:
        state = {}
        setattr(base, STATE_ATTRIBUTE, state)
    if not vars(entry).get("fastlm_packed_seq2seq_entry"):  # its own flag (PEFT forwards unknown attributes)
        entry.register_forward_pre_hook(_take_inputs(state), with_kwargs=True)
        entry.register_forward_hook(_forget_inputs(state), always_call=True)
        entry.fastlm_packed_seq2seq_entry = True
    return base, state


def _take_inputs(state: dict):
    def hook(module, args, kwargs):
        if not any(key in kwargs for key in INPUT_KEYS):
            return None
        state.update({key: kwargs.pop(key, None) for key in INPUT_KEYS}, owner=id(module))
        return args, kwargs

    return hook


def _forget_inputs(state: dict):
    def hook(module, args, output):
        if state.get("owner") == id(module):
            for key in (*INPUT_KEYS, "owner"):
                state.pop(key, None)

    return hook


def _positions_hook(state: dict, key: str):
    def hook(module, args, output):
        positions = state.get(key)
        if positions is None:
            return None
        if positions.shape[-1] != output.shape[-2]:
            raise ValueError(
                f"packed position ids of length {positions.shape[-1]} for a sequence of "
                f"{output.shape[-2]} tokens"
            )
        return F.embedding(positions + getattr(module, "offset", 0), module.weight).to(output.dtype)

    return hook


def _cross_attention_hook(state: dict):
    def hook(module, args, kwargs):
        mask = state.get(CROSS_ATTENTION_MASK)
        if mask is None:
            return None
        return args, {**kwargs, "encoder_attention_mask": mask}

    return hook


def _head_hook(state: dict):
    def hook(module, args):
        positions = state.get(HEAD_POSITIONS)
        if positions is None:
            return None
        hidden = args[0]
        kept = hidden.reshape(-1, hidden.size(-1)).index_select(0, positions.reshape(-1))
        return (kept.unsqueeze(0), *args[1:])

    return hook
