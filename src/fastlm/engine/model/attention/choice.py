"""What ``auto`` picks and when a model switches attention path.

``auto`` (:func:`choose_attention`), logged: on CUDA, flash-attention varlen when a kernel package is
installed (FA3 on Hopper, else FA2), then PyTorch's native varlen attention, then ``flex_attention``, then
SDPA with the dense mask; the varlen kernels need bf16/fp16. An encoder-decoder model: SDPA everywhere
(its packed rows keep their samples apart through dense per-sample masks). On CPU: ``sdpa`` (a model the
training loop compiles then trains on ``eager``: ``attention_when_compiled``), by measurement
(``python benchmarks/attention_cpu.py``, docs/benchmarks.md): flex_attention has no CPU backward in torch
2.13 (it cannot train), and on the default shape (32 rows x 320) its compiled CPU forward saves at best
~0.16 s of ~0.9 s per batch against >= 4.5 s of compile, and lost (1.7x slower) in a loaded run. CPU rows
that can reach ``LONG_ROW_TOKENS`` (a packed run's ``row_length`` where set, else ``split.max_length``) take
``sdpa_varlen`` instead, each document on its own keys: the dense mask's memory grows with the row's square
(an explicit ``sdpa`` or ``eager`` there is kept, with a warning).

Switching: :func:`attention_path` puts a model on another path meanwhile (a compiled model's path,
:func:`attention_when_compiled`), :func:`generation_attention` puts a varlen-only path on SDPA while it
generates (KV cache, left padding).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging

import torch

from fastlm.engine.model.attention import kernels
from fastlm.engine.model.attention.kernels import SDPA_VARLEN, TORCH_VARLEN, VARLEN_ONLY
from fastlm.engine.model.encoder_decoder import DENSE_MASK_ATTENTION
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

# On CPU rows at least this long take ``sdpa_varlen`` under ``auto``: the dense mask path's memory grows with
# the square of the row (one training step of a 2-layer, hidden-64 Llama on a packed row of 64-token
# documents: 0.08 GiB above its start at 2,048 tokens, 0.7 at 8,192, 2.5 at 16,384; sdpa_varlen 0.05, 0.15,
# 0.27), and sdpa_varlen's whole step measured 1.5-3.5x faster fp32, 1.5-2x bf16 at 1,024 tokens (2.5-5.7x
# at 2,048).
LONG_ROW_TOKENS = 1024
HALF_PRECISION_ONLY = ("flash_attention_2", "flash_attention_3", "flash_attention_4", TORCH_VARLEN)


@contextlib.contextmanager
def generation_attention(model):
    """Generation (KV cache, left padding) on a model whose path only takes packed varlen inputs: SDPA
    meanwhile."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    with attention_path(model, "sdpa") if current in VARLEN_ONLY else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def attention_path(model, attn: str):
    """``model`` (its transformers config) on the attention implementation ``attn`` meanwhile."""
    config = model.config
    current = config._attn_implementation
    config._attn_implementation = attn
    try:
        yield
    finally:
        config._attn_implementation = current


def attention_when_compiled(attn: str, requested: str, device: torch.device) -> str:
    """The attention path a ``torch.compile``d model trains with: on CPU, ``auto``'s ``sdpa`` becomes
    ``eager`` (the same block-causal mask, additive: inductor fuses its masking and softmax with the products,
    where SDPA's CPU flash kernel stays one opaque call; 1.16x whole-step on the 5.2 M benchmark shape, bf16,
    packed 80 x 128: ``benchmarks/issue16_ab.py --lever attention --compile``). Any other choice stays as it
    is."""
    if requested == "auto" and device.type == "cpu" and attn == "sdpa":
        return "eager"
    return attn


def torch_varlen_available(device: torch.device) -> bool:
    """The native varlen kernel exists in this torch and the GPU runs its flash kernel (sm80+)."""
    return (
        kernels.varlen_attn is not None
        and device.type == "cuda"
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability(device)[0] >= 8
    )


def choose_attention(
    requested: str,
    device: torch.device,
    precision: str | None = None,
    *,
    model_class: type | None = None,
    config=None,
    row_length: int | None = None,
) -> str:
    """``auto``: the fastest path that keeps packed samples apart here (see the module docstring) among those
    ``model_class`` supports (transformers' ``_supports_*`` flags; eager last; None: not checked) and that
    compute what ``config``'s attention computes (fastlm's varlen kernels have no logit softcapping and no
    attention sinks), for rows of at most ``row_length`` tokens (None: not known); logged."""
    terms = kernels.unsupported_terms(config, model_class)
    if requested != "auto":
        if device.type == "cuda" and precision == "fp32" and requested in HALF_PRECISION_ONLY:
            raise ConfigError(
                f"train.model.attn_implementation: {requested} runs in bf16 or fp16 only.",
                fix="set train.runtime.precision: bf16 (or choose sdpa / flex_attention for fp32).",
            )
        if requested in VARLEN_ONLY and terms:
            raise ConfigError(
                f"train.model.attn_implementation: {requested} has no {' or '.join(terms)}, which this "
                "model's attention computes.",
                fix="choose auto, flash_attention_2, flex_attention or eager.",
            )
        # the dense mask on long CPU rows, where auto would go per document (a model it can serve)
        dense = requested in ("sdpa", "eager") and device.type == "cpu"
        if dense and not terms and not getattr(config, "is_encoder_decoder", False):
            if row_length is not None and row_length >= LONG_ROW_TOKENS:
                log.warning(
                    "train.model.attn_implementation: %s on CPU with rows of up to %d tokens builds the "
                    "dense [T, T] mask, whose memory grows with the row's square (~10 GiB a 32,768-token "
                    "row). Fix: attn_implementation: auto (or sdpa_varlen) trains each document on its own "
                    "keys.",
                    requested,
                    row_length,
                )
        return requested
    unsupported = []
    for attn, why in _preferred(
        device, precision, encoder_decoder=getattr(config, "is_encoder_decoder", False), row_length=row_length
    ):
        if attn in VARLEN_ONLY and terms:
            log.info("attention auto: not %s (it has no %s)", attn, " or ".join(terms))
            continue
        if model_class is None or _supports(model_class, attn):
            if unsupported:
                why += f"; {model_class.__name__} has no {' or '.join(unsupported)} path"
            log.info("attention auto -> %s (%s)", attn, why)
            return attn
        unsupported.append(attn)
    log.info("attention auto -> eager (%s has no %s path)", model_class.__name__, " or ".join(unsupported))
    return "eager"


def _preferred(
    device: torch.device, precision: str | None, *, encoder_decoder: bool, row_length: int | None
) -> list[tuple[str, str]]:
    """``auto``'s paths here, best first, each with why. An encoder-decoder model's packed rows keep their
    samples apart through dense per-sample masks only (``encoder_decoder.DENSE_MASK_ATTENTION``); on CPU
    rows of ``LONG_ROW_TOKENS`` or more go per document (``sdpa_varlen``) before the dense mask."""
    if encoder_decoder:
        why = "an encoder-decoder model's packed rows take dense per-sample masks"
        return [(attn, why) for attn in DENSE_MASK_ATTENTION if attn != "eager"]
    paths = []
    if device.type == "cuda" and precision in (None, "bf16", "fp16"):
        hopper = torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] == 9
        if hopper and importlib.util.find_spec("flash_attn_interface") is not None:
            paths.append(("flash_attention_3", "FA3 kernel installed"))
        if importlib.util.find_spec("flash_attn") is not None:
            paths.append(("flash_attention_2", "flash_attn installed"))
        if torch_varlen_available(device):
            paths.append((TORCH_VARLEN, "no flash-attention package; PyTorch's native varlen attention"))
    if device.type == "cuda":
        return [*paths, ("flex_attention", "document-causal BlockMask"), ("sdpa", "the dense mask")]
    why = "CPU: flex_attention has no CPU backward and loses to the dense mask here"
    dense = ("sdpa", f"{why} (benchmarks/attention_cpu.py)")
    if row_length is not None and row_length >= LONG_ROW_TOKENS:
        long_rows = (
            f"CPU, rows of up to {row_length} tokens: the dense [T, T] mask would grow with the row's "
            "square; each document attends its own keys"
        )
        return [(SDPA_VARLEN, long_rows), dense]
    return [dense]


# transformers' flag for each path (fastlm's own kernels are registered attention functions)
_SUPPORT_FLAGS = {
    "sdpa": "_supports_sdpa",
    "flex_attention": "_supports_flex_attn",
    "flash_attention_2": "_supports_flash_attn",
    "flash_attention_3": "_supports_flash_attn",
}


def _supports(model_class: type, attn: str) -> bool:
    return bool(getattr(model_class, _SUPPORT_FLAGS.get(attn, "_supports_attention_backend"), False))
