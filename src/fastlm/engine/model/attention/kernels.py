"""The attention functions fastlm adds to transformers' registry: ``torch_varlen`` (PyTorch's native
``torch.nn.attention.varlen.varlen_attn``, CUDA flash kernels) and ``sdpa_varlen`` (causal SDPA per bucket of
equal padded segment length, any device, any dtype). Both take the flattened ``[1, rows*T]`` packed rows with
``cu_seq_lens_q/k`` and ``max_length_q/k`` (``inputs.to_device``) and keep each sample to its own keys.

Importing this module registers them (:func:`register_attention_functions`), so a model built with either name
finds it; the registry, the installed ``varlen_attn`` and the cache of its signature live here only.
"""

from __future__ import annotations

import inspect
import math
import sys

import numpy as np
import torch

try:  # PyTorch's native varlen attention (CUDA flash kernels); absent from older torch
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - depends on the installed torch
    varlen_attn = None

TORCH_VARLEN = "torch_varlen"
SDPA_VARLEN = "sdpa_varlen"
# registered here; they take packed varlen inputs only (no generation)
VARLEN_ONLY = (TORCH_VARLEN, SDPA_VARLEN)
# A bound of every segment, the same from one micro-batch to the next (``inputs.max_length_bound``: a packed
# run's row length): the longest segment that ``torch_varlen`` hands the kernel under torch.compile, where
# the exact one, an int that changes every micro-batch, would make dynamo compile again. Flash-attention's
# kernels take any bound at least the longest segment with the same output (it sizes their grid; blocks past
# a segment's end return at once).
MAX_LENGTH_BOUND = "fastlm_max_length_bound"
# sdpa_varlen: segment lengths are rounded up to a multiple of this; each multiple is one causal SDPA call.
VARLEN_BUCKET = 8


def torch_varlen_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    cu_seq_lens_q=None,
    cu_seq_lens_k=None,
    max_length_q=None,
    max_length_k=None,
    fastlm_max_length_bound=None,
    sliding_window=None,
    **kwargs,
):
    """transformers attention function for ``torch.nn.attention.varlen.varlen_attn`` (causal, per segment).

    ``query`` ``[B, H, S, D]`` (key/value may have fewer heads: GQA); returns ``[B, S, H, D]`` like the
    others. Compiled, the longest segment handed to the kernel is ``MAX_LENGTH_BOUND`` where given. A local
    layer's ``sliding_window`` (the attention module passes it) limits each query to its last that many keys.
    """
    refuse_unsupported(TORCH_VARLEN, kwargs)
    # compiled with a bound: max_length_q, an int that changes every micro-batch, is not read (dynamo would
    # guard on its value and compile again)
    bound = fastlm_max_length_bound if torch.compiler.is_compiling() else None
    if cu_seq_lens_q is None or (bound is None and max_length_q is None):
        raise ValueError(
            "torch_varlen attention needs cu_seq_lens_q/k and max_length_q/k (fastlm's to_device "
            "gives them); use sdpa for generation"
        )
    if dropout:
        raise ValueError("torch_varlen attention has no dropout; set the model's attention_dropout to 0")
    if varlen_attn is None:
        raise RuntimeError("torch.nn.attention.varlen is missing from this torch; choose another attention")
    batch, heads, length, dim = query.shape
    q, k, v = (x.transpose(1, 2).reshape(batch * length, x.shape[1], dim) for x in (query, key, value))
    device_type = query.device.type
    if q.dtype == torch.float32 and torch.is_autocast_enabled(device_type):
        # Under autocast the rotary embedding hands fp32 queries/keys (fp32 weights); the flash kernel takes
        # fp16/bf16 only: cast to the autocast dtype, as transformers' flash-attention paths do.
        target = torch.get_autocast_dtype(device_type)
        q, k, v = q.to(target), k.to(target), v.to(target)
    if bound is not None:
        max_q = max_k = bound
    else:
        max_q = int(max_length_q)
        max_k = int(max_length_k if max_length_k is not None else max_length_q)
    out = call_varlen_attn(
        q,
        k,
        v,
        cu_seq_lens_q,
        cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q,
        max_q,
        max_k,
        scaling,
        # a window no segment reaches changes nothing (and a torch without window_size runs it)
        window=sliding_window if sliding_window is not None and max_q > sliding_window else None,
    )
    return out.view(batch, length, heads, dim), None


# Keywords some attention modules pass that change what attention computes; the varlen functions have no
# such term and refuse them rather than compute plain attention (``choice`` does not pick them then).
UNSUPPORTED = {"softcap": "attention logit softcapping", "s_aux": "attention sinks"}


def unsupported_terms(config, model_class: type | None = None) -> list[str]:
    """What the attention of ``config``'s model (a multimodal one: its language model's) computes that the
    varlen functions do not: logit softcapping (Gemma2), or sinks, which the attention of ``model_class``
    passes (``s_aux=`` in its module: GPT-OSS, GraniteSWA, Flint, MiMo-V2-Flash). Empty: nothing."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    terms = []
    if any(getattr(c, "attn_logit_softcapping", None) is not None for c in (config, text)):
        terms.append(UNSUPPORTED["softcap"])
    if getattr(config, "model_type", None) == "gpt_oss" or (model_class and _passes(model_class, "s_aux=")):
        terms.append(UNSUPPORTED["s_aux"])
    return terms


_SOURCES: dict = {}


def _passes(model_class: type, keyword: str) -> bool:
    """Whether the module defining ``model_class`` (transformers' modeling file) passes ``keyword`` to its
    attention function: read once per module."""
    name = model_class.__module__
    if name not in _SOURCES:
        try:
            _SOURCES[name] = inspect.getsource(sys.modules[name])
        except (OSError, TypeError, KeyError):
            _SOURCES[name] = ""
    return keyword in _SOURCES[name]


def refuse_unsupported(name: str, kwargs: dict) -> None:
    for key, what in UNSUPPORTED.items():
        if kwargs.get(key) is not None:
            raise ValueError(
                f"{name} attention has no {what}; choose flash_attention_2, flex_attention or eager "
                "(train.model.attn_implementation)"
            )


def segment_buckets(cu_seq_lens: torch.Tensor, bucket: int = VARLEN_BUCKET):
    """The gather plan of ``sdpa_varlen_attention`` for segment boundaries ``cu_seq_lens`` (read on the host).

    Segments are grouped by their length rounded up to a multiple of ``bucket``. Per group: ``index``
    ``[segments, P]``, the flat token positions of each segment followed by its last token repeated as
    padding, and ``valid`` ``[segments, P]``, which of them are the segment's own. ``inverse`` puts the
    groups' valid outputs, concatenated in group order, back into token order.
    """
    bounds = cu_seq_lens.detach().to("cpu", torch.int64).numpy()
    starts, lengths = bounds[:-1], np.diff(bounds)
    starts, lengths = starts[lengths > 0], lengths[lengths > 0]
    padded = -(-lengths // bucket) * bucket
    groups, order = [], []
    for width in np.unique(padded).tolist():
        chosen = padded == width
        offsets = np.arange(width)
        valid = offsets[None, :] < lengths[chosen, None]
        index = starts[chosen, None] + np.minimum(offsets[None, :], lengths[chosen, None] - 1)
        order.append(index[valid])
        groups.append((torch.from_numpy(index), torch.from_numpy(valid)))
    inverse = np.empty(int(bounds[-1] - bounds[0]), dtype=np.int64)
    inverse[np.concatenate(order) - bounds[0]] = np.arange(inverse.size)
    return groups, torch.from_numpy(inverse)


def sdpa_varlen_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    cu_seq_lens_q=None,
    cu_seq_lens_k=None,
    max_length_q=None,
    max_length_k=None,
    sliding_window=None,
    **kwargs,
):
    """transformers attention function: causal attention within each ``cu_seq_lens`` segment, on any device.

    The packed rows come flattened (``[1, H, tokens, D]``, as for the varlen kernels). Segments are gathered
    into groups of equal padded length (``segment_buckets``) and each group is one causal
    ``scaled_dot_product_attention`` call without a mask, so SDPA's fast causal kernel runs and only a
    segment's own keys are computed: the dense block-diagonal mask costs ``rows x T^2`` score pairs, this
    about ``sum(length^2)``. Padding follows each segment's real tokens, so causality keeps it out of every
    real query; padded outputs are dropped. Returns ``[1, tokens, H, D]`` like the other attention functions.
    A local layer's ``sliding_window``: a group longer than the window gets a banded causal mask instead.
    """
    refuse_unsupported(SDPA_VARLEN, kwargs)
    if cu_seq_lens_q is None:
        raise ValueError(
            "sdpa_varlen attention needs cu_seq_lens_q (fastlm's to_device gives it); use sdpa for generation"
        )
    if (
        cu_seq_lens_k is not None
        and cu_seq_lens_k is not cu_seq_lens_q
        and not torch.equal(cu_seq_lens_k, cu_seq_lens_q)
    ):
        raise ValueError("sdpa_varlen attention is self-attention: cu_seq_lens_k must equal cu_seq_lens_q")
    groups, inverse = segment_buckets(cu_seq_lens_q)
    device = query.device
    q, k, v = query[0], key[0], value[0]  # [H, tokens, D]
    gqa = k.shape[0] != q.shape[0]
    outputs = []
    for index, valid in groups:
        index, valid = index.to(device, non_blocking=True), valid.to(device, non_blocking=True)
        qb, kb, vb = (x[:, index].transpose(0, 1) for x in (q, k, v))  # [segments, H, P, D]
        padded = qb.shape[2]
        band = None
        if sliding_window is not None and padded > sliding_window:
            position = torch.arange(padded, device=device)
            distance = position[:, None] - position[None, :]
            band = (distance >= 0) & (distance < sliding_window)
        out = torch.nn.functional.scaled_dot_product_attention(
            qb,
            kb,
            vb,
            attn_mask=band,
            dropout_p=dropout,
            is_causal=band is None,
            scale=scaling,
            enable_gqa=gqa,
        )
        outputs.append(out.transpose(1, 2)[valid])  # [real tokens of the group, H, D]
    out = torch.cat(outputs)[inverse.to(device, non_blocking=True)]
    return out.unsqueeze(0), None


_VARLEN_PARAMETERS: dict = {}


def varlen_parameters(function) -> frozenset:
    """The keyword names ``function`` accepts, read once (kept out of torch.compile's traced code)."""
    names = _VARLEN_PARAMETERS.get(function)
    if names is None:
        names = _VARLEN_PARAMETERS[function] = frozenset(inspect.signature(function).parameters)
    return names


if varlen_attn is not None:
    varlen_parameters(varlen_attn)


def call_varlen_attn(
    q, k, v, cu_seq_q, cu_seq_k, max_q: int, max_k: int, scale: float | None, window: int | None = None
) -> torch.Tensor:
    """Causal ``varlen_attn`` over ``[tokens, heads, dim]`` inputs, whatever the installed torch's signature.

    torch 2.13: ``window_size=(-1, 0)``, ``scale``, ``enable_gqa``. torch 2.11 (seen on an H200): ``scale``
    and ``window_size`` but no ``enable_gqa``. torch 2.9-2.10: ``is_causal`` only. Without GQA support the KV
    heads are repeated; without ``scale`` a non-default scale is folded into the queries. ``window``: each
    query sees its last ``window`` keys (``window_size=(window - 1, 0)``; refused without ``window_size``).
    """
    accepted = varlen_parameters(varlen_attn)
    kwargs = {}
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in accepted:
            kwargs["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if "window_size" in accepted:
        kwargs["window_size"] = (-1 if window is None else window - 1, 0)
    elif window is not None:
        raise RuntimeError(
            "this torch's varlen_attn has no window_size for the model's sliding-window layers; choose "
            "flash_attention_2, flex_attention or sdpa (train.model.attn_implementation)"
        )
    elif "is_causal" in accepted:
        kwargs["is_causal"] = True
    else:
        raise RuntimeError(
            "this torch's varlen_attn has neither window_size nor is_causal; choose another attention"
        )
    if scale is not None:
        if "scale" in accepted:
            kwargs["scale"] = scale
        elif not math.isclose(scale, q.shape[-1] ** -0.5):
            q = q * (scale * q.shape[-1] ** 0.5)
    return varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, **kwargs)


def register_attention_functions() -> None:
    """Add ``torch_varlen`` and ``sdpa_varlen`` to transformers' attention registry (no mask function: they
    need none)."""
    from transformers import AttentionInterface

    AttentionInterface.register(TORCH_VARLEN, torch_varlen_attention)
    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)


register_attention_functions()
