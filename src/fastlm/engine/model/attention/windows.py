"""Layer types on packed rows: local attention windows, and layers no mask keeps samples apart in.

Mistral, Gemma2/3, EXAONE 4, Qwen2 with ``use_sliding_window``, GPT-OSS and others attend, in all or some
layers (``config.layer_types``: ``sliding_attention`` beside ``full_attention``), to the last
``config.sliding_window`` keys only: a query at position ``q`` sees keys ``k`` with ``q - window < k <= q``.
The packed masks of ``inputs.to_device`` keep samples apart (document-causal), which is a sample's window only
while no sample is longer than the window. Where one can be (``max_length`` above the window),
:func:`enable_packed_windows` installs a forward pre-hook on the model's decoder stack that gives each layer
type its own mask: the document-causal mask for ``full_attention`` layers and the same mask limited to the
window for the local ones (a dense mask cut by a band; a flex ``BlockMask`` rebuilt with the window in its
mask function). Inside one sample the token distance in the row is the position distance, so the band needs
no positions. The windowed copy is made per micro-batch, beside the document-causal one (one more mask a
micro-batch for such models only). Models with several layer types take the masks as a mapping by type
(transformers' own ``causal_mask_mapping``); a model whose layers are all local takes the windowed mask
itself.

The varlen kernels get each layer's window from the model's attention module (its ``sliding_window``
keyword, None in global layers): ``kernels`` honours it. Padded rows (one sample a row) pass transformers a
2D mask, from which it builds the windows itself.

Layers that carry a state along the row (LFM2's short convolutions, Qwen3-Next's linear attention, Mamba's
state-space layers) run across the samples of a packed row whatever the attention mask:
:func:`packing_leak` says so, and such a model trains and is evaluated on padded rows (one sample a row).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

FULL, SLIDING = "full_attention", "sliding_attention"
# ALiBi models: the position bias comes from the row (its 2D mask), not from restarting position ids
ALIBI_FAMILIES = ("bloom", "mpt")
PER_TOKEN = ("mlp", "moe")  # layer types that mix nothing across positions (Nemotron-H names them)
# config attributes of state-space / recurrent layers (Mamba, Mamba2, Jamba, Zamba, Falcon-H1, Bamba,
# Nemotron-H, RecurrentGemma, RWKV, xLSTM), whose configs name no layer types
RECURRENT_ATTRIBUTES = (
    "state_size",
    "ssm_state_size",
    "mamba_d_state",
    "layers_block_type",
    "hybrid_override_pattern",
    "block_types",
    "attention_window_size",
    "rescale_every",
    "chunkwise_kernel",
)


def packing_leak(config) -> str | None:
    """Why packed rows would mix samples in ``config``'s model whatever the mask (None: they do not): layers
    other than full or local attention (convolutions, linear or state-space layers, and attention kinds the
    packed masks do not reproduce: Llama 4's chunks, DeepSeek's indexed attention), or ALiBi biases."""
    family = getattr(config, "model_type", "this")
    text = _text(config)  # a multimodal model's language model
    if family in ALIBI_FAMILIES or any(getattr(c, "alibi", False) is True for c in (config, text)):
        return (
            f"the {family} model's ALiBi position biases count from the start of the row, across the samples "
            "packed in it"
        )
    types = getattr(text, "layer_types", None)
    others = sorted({str(kind) for kind in types or ()} - {FULL, SLIDING, *PER_TOKEN})
    if not others:
        found = [name for name in RECURRENT_ATTRIBUTES if getattr(text, name, None) is not None]
        if not found:
            return None
        others = [f"state-space or recurrent ({found[0]})"]
    return (
        f"the {family} model's {' and '.join(others)} layers carry a state along the row, across the samples "
        "packed in it"
    )


def _text(config):
    """A multimodal model's language-model config (Gemma 3 4B and up), else the config itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def sliding_window(config) -> int | None:
    """The model's local-attention window in tokens (None: every layer attends to all earlier keys)."""
    config = _text(config)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or (types is not None and SLIDING not in types):
        return None
    return int(window)


def enable_packed_windows(model, *, max_length: int) -> bool:
    """Install the windows' pre-hook on ``model``'s decoder stack where a sample of up to ``max_length``
    tokens can be longer than its window (idempotent); True if installed."""
    config = _text(model.config)
    window = sliding_window(config)
    if window is None or max_length <= window:
        return False
    stack = model.get_decoder() if hasattr(model, "get_decoder") else model
    if getattr(stack, "_fastlm_packed_windows", None) == window:
        return True
    types = set(getattr(config, "layer_types", None) or [SLIDING])
    by_type = len(types) > 1

    def windowed_masks(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, dict):
            # a multimodal model made the mapping by type from the packed mask (one object for both types);
            # a mapping transformers built (generation) holds its own windows
            if mask.get(SLIDING) is not None and mask.get(SLIDING) is mask.get(FULL):
                local = limit_to_window(mask[SLIDING], window)
                if local is not None:
                    kwargs["attention_mask"] = {**mask, SLIDING: local}
            return args, kwargs
        local = limit_to_window(mask, window)
        if local is not None:
            kwargs["attention_mask"] = {FULL: mask, SLIDING: local} if by_type else local
        return args, kwargs

    stack.register_forward_pre_hook(windowed_masks, with_kwargs=True)
    stack._fastlm_packed_windows = window
    log.info(
        "packed rows: %s layers attend to their last %d keys (sliding_window), samples may be longer",
        "the local" if by_type else "all",
        window,
    )
    return True


def limit_to_window(mask, window: int):
    """A packed row's mask (dense ``[rows, 1, T, T]`` bool or additive, or a flex ``BlockMask``) limited to
    keys less than ``window`` tokens behind each query; None for anything else (a padded batch's 2D mask:
    transformers windows it)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        if mask.shape[-2] != mask.shape[-1]:  # not a packed row's (queries as many as keys): a cache's
            return None
        length = mask.shape[-1]
        index = torch.arange(length, device=mask.device)
        band = (index[:, None] - index[None, :]) < window
        if mask.dtype == torch.bool:
            return mask & band
        return mask.masked_fill(~band, torch.finfo(mask.dtype).min)
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    if isinstance(mask, BlockMask):
        inner = mask.mask_mod

        def local(batch, head, query, key):
            return inner(batch, head, query, key) & (query - key < window)

        rows, length = mask.shape[0], mask.seq_lengths[0]
        return create_block_mask(
            local, B=rows, H=None, Q_LEN=length, KV_LEN=mask.seq_lengths[1], device=mask.kv_num_blocks.device
        )
    return None
