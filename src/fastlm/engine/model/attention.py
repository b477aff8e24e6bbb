"""Attention paths: which inputs each attention implementation needs to keep packed samples apart, the one
input builder every model call uses (training, evaluation, tune), and what ``auto`` picks.

A packed micro-batch is ``[rows, T]`` with several samples per row (``data.packing``). Each implementation
keeps them apart its own way, and gets exactly what it needs from :func:`to_device`:

=====================  ==============  ====================================================================
implementation          packed inputs   what the model gets
=====================  ==============  ====================================================================
``flash_attention_2``   varlen          rows flattened to ``[1, rows*T]`` and ``cu_seq_lens_q/k`` +
``flash_attention_3``                   ``max_length_q/k`` (transformers' FlashAttentionKwargs -> the kernel's
``flash_attention_4``                   ``cu_seqlens`` / ``max_seqlen``): only same-document blocks are computed
``torch_varlen``        varlen          the same, to ``torch.nn.attention.varlen.varlen_attn`` (registered here)
``sdpa_varlen``         varlen          the same, to ``sdpa_varlen_attention`` (registered here; any device,
                                        any dtype): segments gathered into buckets of equal padded length, one
                                        causal SDPA call per bucket, no mask: only each sample's own keys.
                                        Not chosen by ``auto``: on CPU short rows (80 x 128, ~19-token samples)
                                        whole steps measured 1.00x (fp32) and 0.86x (bf16) of ``sdpa``: the CPU
                                        flash kernel costs per call and block, not per score, and the gathers'
                                        backward scatters (``benchmarks/issue16_ab.py --lever attention``)
``flex_attention``      block_mask      a document-causal ``BlockMask`` built once per batch on the device;
                                        fully masked blocks are skipped
``sdpa``                bool            the dense ``[rows, 1, T, T]`` bool block-causal mask (exact, but every
                                        block is computed and SDPA cannot use its flash kernel with a mask)
``eager``               additive        the same mask as 0 / dtype-min (eager ADDS the mask: a bool leaks)
=====================  ==============  ====================================================================

Encoder-decoder batches (``decoder_input_ids``): padded ones (``data.Seq2SeqCollator``) give every path the
encoder and decoder inputs with their 2D masks, and transformers builds the masks it needs. Packed ones
(``data.PackedSeq2SeqCollator``, families and paths in ``seq2seq_hooks``: sdpa / eager) get the three dense
per-sample masks (encoder, causal decoder, cross-attention) built here from the segment ids, plus the packed
positions the model's hooks take (``seq2seq_hooks.PACKED_KEYS``).

Why: transformers 5 infers packed samples from restarting position ids only for a ONE-row batch
(``modeling_flash_attention_utils._is_packed_sequence``); with several rows and no mask, flash attention is
plain causal attention over each row and samples see their neighbours. Varlen kernels therefore get the
flattened view with explicit boundaries (``cu_seq_lens`` from the collator, host-side: no sync).

``auto`` (:func:`choose_attention`), logged: on CUDA, flash-attention varlen when a kernel package is
installed (FA3 on Hopper, else FA2), then PyTorch's native varlen attention, then ``flex_attention``, then
SDPA with the dense mask; the varlen kernels need bf16/fp16. On CPU: ``sdpa`` (a model the training loop compiles
then trains on ``eager``: ``attention_when_compiled``), by measurement
(``python benchmarks/attention_cpu.py``, docs/benchmarks.md): flex_attention has no CPU backward in torch
2.13 (it cannot train), and on the default shape (32 rows x 320) its compiled CPU forward saves at best
~0.16 s of ~0.9 s per batch against >= 4.5 s of compile, and lost (1.7x slower) in a loaded run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import math

import numpy as np
import torch

from fastlm.engine.data.packing import block_causal_mask, to_additive_mask
from fastlm.engine.data.schema import MODEL_INPUT_KEYS, MODEL_INPUTS, TARGET_POSITIONS
from fastlm.engine.data.seq2seq_packing import seq2seq_packed_masks
from fastlm.engine.model.encoder_decoder import CROSS_ATTENTION_MASK, DECODER_POSITIONS, ENCODER_POSITIONS
from fastlm.engine.model.loss import positions_to_keep
from fastlm.errors import ConfigError

try:  # PyTorch's native varlen attention (CUDA flash kernels); absent from older torch
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - depends on the installed torch
    varlen_attn = None

log = logging.getLogger(__name__)

TORCH_VARLEN = "torch_varlen"
SDPA_VARLEN = "sdpa_varlen"
HALF_PRECISION_ONLY = ("flash_attention_2", "flash_attention_3", "flash_attention_4", TORCH_VARLEN)
VARLEN_ONLY = (TORCH_VARLEN, SDPA_VARLEN)  # registered here; they take packed varlen inputs only (no generation)
# sdpa_varlen: segment lengths are rounded up to a multiple of this; each multiple is one causal SDPA call.
VARLEN_BUCKET = 8
VARLEN, BLOCK_MASK, DENSE_BOOL, DENSE_ADDITIVE = "varlen", "block_mask", "bool", "additive"
# How each implementation receives a packed batch (see the module docstring).
PACKED_INPUTS = {
    "flash_attention_2": VARLEN,
    "flash_attention_3": VARLEN,
    "flash_attention_4": VARLEN,
    TORCH_VARLEN: VARLEN,
    SDPA_VARLEN: VARLEN,
    "flex_attention": BLOCK_MASK,
    "sdpa": DENSE_BOOL,
    "eager": DENSE_ADDITIVE,
}
IMPLEMENTATIONS = tuple(PACKED_INPUTS)
# The model-input keys are schema.MODEL_INPUT_KEYS (a causal LM's); an encoder-decoder model adds the decoder's.
DECODER_INPUT_KEYS = ("decoder_input_ids", "decoder_attention_mask")
SEQ2SEQ_INPUTS = (*(key for key in MODEL_INPUT_KEYS if key != "position_ids"), *DECODER_INPUT_KEYS)
DEVICE_KEYS = (*MODEL_INPUT_KEYS, "labels", *DECODER_INPUT_KEYS)


def packed_inputs(attn: str) -> str:
    if attn not in PACKED_INPUTS:
        raise ValueError(f"attention implementation {attn!r} is not one of {IMPLEMENTATIONS}")
    return PACKED_INPUTS[attn]


def to_device(batch: dict, device: torch.device, attn: str) -> dict:
    """The batch with its tensors on ``device`` and ``batch[MODEL_INPUTS]``: the model's keyword arguments for
    ``attn`` (counts, ``cu_seq_lens`` and ``max_seqlen`` stay on the host: reading them costs no sync), and for a
    causal batch ``batch[TARGET_POSITIONS]`` where some positions predict no label (``loss.positions_to_keep``)."""
    kind = packed_inputs(attn)
    moved = {key: batch[key].to(device, non_blocking=True) for key in DEVICE_KEYS if key in batch}
    out = {**batch, **moved}
    packed = "sequence_ids" in batch
    if "decoder_input_ids" in batch:  # encoder-decoder: the head on flat target positions (seq2seq_hooks)
        keep = positions_to_keep(batch["labels"], device, flattened=True) if "labels" in batch else None
        if keep is not None:
            out[TARGET_POSITIONS] = keep
        # packed rows (data.seq2seq_packing): the dense masks; padded sides (collators.Seq2SeqCollator): their masks
        out[MODEL_INPUTS] = (packed_seq2seq_inputs(batch, out, device, kind) if "decoder_segment_ids" in batch
                             else {key: out[key] for key in SEQ2SEQ_INPUTS})
        return out
    if "labels" in batch:  # a training step computes logits only where a label is predicted (loss.training_logits)
        keep = positions_to_keep(batch["labels"], device, flattened=kind == VARLEN)
        if keep is not None:
            out[TARGET_POSITIONS] = keep
    if kind == VARLEN:
        cu_seq_lens, max_seqlen = varlen_boundaries(batch)
        rows, length = out["input_ids"].shape
        positions = out["position_ids"] if packed else torch.arange(length, device=device).expand(rows, -1)
        cu = cu_seq_lens.to(device, non_blocking=True)
        out[MODEL_INPUTS] = {"input_ids": out["input_ids"].reshape(1, -1), "position_ids": positions.reshape(1, -1),
                             "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_seqlen,
                             "max_length_k": max_seqlen}
        return out
    inputs = {"input_ids": out["input_ids"]}
    if packed:  # the mask this path needs, from the segment ids (whatever mask format the collator made)
        inputs["position_ids"] = out["position_ids"]
        sequence_ids = batch["sequence_ids"].to(device, non_blocking=True)
        inputs["attention_mask"] = (document_block_mask(sequence_ids) if kind == BLOCK_MASK
                                    else dense_mask(sequence_ids, kind))
    elif "attention_mask" in out:  # padded rows, one sample each: transformers builds the mask it needs
        inputs["attention_mask"] = out["attention_mask"]
    out[MODEL_INPUTS] = inputs
    return out


def packed_seq2seq_inputs(batch: dict, out: dict, device: torch.device, kind: str) -> dict:
    """A packed encoder-decoder batch's model inputs: the three dense masks made on the device from the segment
    ids, and the packed positions / cross-attention mask that ``seq2seq_hooks`` feed to the model."""
    if kind not in (DENSE_BOOL, DENSE_ADDITIVE):
        raise ValueError(f"packed encoder-decoder batches need dense masks (sdpa or eager), not {kind} inputs")
    segments = [batch[key].to(device, non_blocking=True) for key in ("encoder_segment_ids", "decoder_segment_ids")]
    masks = [mask if kind == DENSE_BOOL else to_additive_mask(mask) for mask in seq2seq_packed_masks(*segments)]
    positions = [batch[key].to(device, non_blocking=True) for key in ("encoder_position_ids", "decoder_position_ids")]
    return {"input_ids": out["input_ids"], "attention_mask": masks[0], "decoder_input_ids": out["decoder_input_ids"],
            "decoder_attention_mask": masks[1], ENCODER_POSITIONS: positions[0], DECODER_POSITIONS: positions[1],
            CROSS_ATTENTION_MASK: masks[2]}


def varlen_boundaries(batch: dict) -> tuple[torch.Tensor, int]:
    """``cu_seq_lens`` (int32) and the longest segment of the row-major flattening of the batch, on the host.

    Packed batches carry them (``PackedCollator``); right-padded ones (one sample + a padding tail per row) get
    them from the host-side 2D ``attention_mask``.
    """
    if "cu_seq_lens" in batch:
        return batch["cu_seq_lens"], int(batch["max_seqlen"])
    mask = batch["attention_mask"]
    if mask.device.type != "cpu" or mask.dim() != 2:
        raise ValueError("varlen attention needs the collator's host-side 2D attention_mask or cu_seq_lens")
    length = mask.shape[1]
    real = mask.sum(dim=1).numpy()
    segments = np.stack([real, length - real], axis=1).reshape(-1)
    segments = segments[segments > 0]
    bounds = np.concatenate([[0], np.cumsum(segments)]).astype(np.int32)
    return torch.from_numpy(bounds), int(segments.max())


def dense_mask(sequence_ids: torch.Tensor, kind: str) -> torch.Tensor:
    """The ``[rows, 1, T, T]`` block-causal mask, bool (SDPA) or additive (eager), built on the ids' device."""
    mask = block_causal_mask(sequence_ids)
    return mask if kind == DENSE_BOOL else to_additive_mask(mask)


def document_block_mask(sequence_ids: torch.Tensor):
    """flex_attention's document-causal ``BlockMask`` for ``[rows, T]`` segment ids, built on their device by
    vectorised mask evaluation (no Python loop per token); blocks no query of a document needs are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    documents = sequence_ids.to(torch.int32)
    rows, length = documents.shape

    def document_causal(batch, head, query, key):
        return (documents[batch, query] == documents[batch, key]) & (key <= query)

    return create_block_mask(document_causal, B=rows, H=None, Q_LEN=length, KV_LEN=length,
                             device=sequence_ids.device)


def torch_varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                           cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None, **kwargs):
    """transformers attention function for ``torch.nn.attention.varlen.varlen_attn`` (causal, per segment).

    ``query`` ``[B, H, S, D]`` (key/value may have fewer heads: GQA); returns ``[B, S, H, D]`` like the others.
    """
    if cu_seq_lens_q is None or max_length_q is None:
        raise ValueError("torch_varlen attention needs cu_seq_lens_q/k and max_length_q/k (fastlm's to_device "
                         "gives them); use sdpa for generation")
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
    out = call_varlen_attn(q, k, v, cu_seq_lens_q, cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q,
                           int(max_length_q), int(max_length_k if max_length_k is not None else max_length_q),
                           scaling)
    return out.view(batch, length, heads, dim), None


def segment_buckets(cu_seq_lens: torch.Tensor, bucket: int = VARLEN_BUCKET):
    """The gather plan of ``sdpa_varlen_attention`` for segment boundaries ``cu_seq_lens`` (read on the host).

    Segments are grouped by their length rounded up to a multiple of ``bucket``. Per group: ``index``
    ``[segments, P]``, the flat token positions of each segment followed by its last token repeated as padding,
    and ``valid`` ``[segments, P]``, which of them are the segment's own. ``inverse`` puts the groups' valid
    outputs, concatenated in group order, back into token order.
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


def sdpa_varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None, max_length_k=None, **kwargs):
    """transformers attention function: causal attention within each ``cu_seq_lens`` segment, on any device.

    The packed rows come flattened (``[1, H, tokens, D]``, as for the varlen kernels). Segments are gathered into
    groups of equal padded length (``segment_buckets``) and each group is one causal ``scaled_dot_product_attention``
    call without a mask, so SDPA's fast causal kernel runs and only a segment's own keys are computed: the dense
    block-diagonal mask costs ``rows x T^2`` score pairs, this about ``sum(length^2)``. Padding follows each
    segment's real tokens, so causality keeps it out of every real query; padded outputs are dropped.
    Returns ``[1, tokens, H, D]`` like the other attention functions.
    """
    if cu_seq_lens_q is None:
        raise ValueError("sdpa_varlen attention needs cu_seq_lens_q (fastlm's to_device gives it); use sdpa for "
                         "generation")
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q and not torch.equal(cu_seq_lens_k,
                                                                                             cu_seq_lens_q):
        raise ValueError("sdpa_varlen attention is self-attention: cu_seq_lens_k must equal cu_seq_lens_q")
    groups, inverse = segment_buckets(cu_seq_lens_q)
    device = query.device
    q, k, v = query[0], key[0], value[0]  # [H, tokens, D]
    gqa = k.shape[0] != q.shape[0]
    outputs = []
    for index, valid in groups:
        index, valid = index.to(device, non_blocking=True), valid.to(device, non_blocking=True)
        qb, kb, vb = (x[:, index].transpose(0, 1) for x in (q, k, v))  # [segments, H, P, D]
        out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, dropout_p=dropout, is_causal=True,
                                                               scale=scaling, enable_gqa=gqa)
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


def call_varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q: int, max_k: int, scale: float | None) -> torch.Tensor:
    """Causal ``varlen_attn`` over ``[tokens, heads, dim]`` inputs, whatever the installed torch's signature.

    torch 2.13: ``window_size=(-1, 0)``, ``scale``, ``enable_gqa``. torch 2.11 (seen on an H200): ``scale`` and
    ``window_size`` but no ``enable_gqa``. torch 2.9-2.10: ``is_causal`` only. Without GQA support the KV heads
    are repeated; without ``scale`` a non-default scale is folded into the queries.
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
        kwargs["window_size"] = (-1, 0)
    elif "is_causal" in accepted:
        kwargs["is_causal"] = True
    else:
        raise RuntimeError("this torch's varlen_attn has neither window_size nor is_causal; choose another attention")
    if scale is not None:
        if "scale" in accepted:
            kwargs["scale"] = scale
        elif not math.isclose(scale, q.shape[-1] ** -0.5):
            q = q * (scale * q.shape[-1] ** 0.5)
    return varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, **kwargs)


def register_attention_functions() -> None:
    """Add ``torch_varlen`` and ``sdpa_varlen`` to transformers' attention registry (no mask function: they need
    none)."""
    from transformers import AttentionInterface

    AttentionInterface.register(TORCH_VARLEN, torch_varlen_attention)
    AttentionInterface.register(SDPA_VARLEN, sdpa_varlen_attention)


register_attention_functions()


@contextlib.contextmanager
def generation_attention(model):
    """Generation (KV cache, left padding) on a model whose path only takes packed varlen inputs: SDPA meanwhile."""
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
    """The attention path a ``torch.compile``d model trains with: on CPU, ``auto``'s ``sdpa`` becomes ``eager``
    (the same block-causal mask, additive: inductor fuses its masking and softmax with the products, where SDPA's
    CPU flash kernel stays one opaque call; 1.16x whole-step on the 5.2 M benchmark shape, bf16, packed 80 x 128:
    ``benchmarks/issue16_ab.py --lever attention --compile``). Any other choice stays as it is."""
    if requested == "auto" and device.type == "cpu" and attn == "sdpa":
        return "eager"
    return attn


def torch_varlen_available(device: torch.device) -> bool:
    """The native varlen kernel exists in this torch and the GPU runs its flash kernel (sm80+)."""
    return (varlen_attn is not None and device.type == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device)[0] >= 8)


def choose_attention(requested: str, device: torch.device, precision: str | None = None) -> str:
    """``auto``: the fastest path that keeps packed samples apart here (see the module docstring); logged."""
    if requested != "auto":
        if device.type == "cuda" and precision == "fp32" and requested in HALF_PRECISION_ONLY:
            raise ConfigError(f"train.model.attn_implementation: {requested} runs in bf16 or fp16 only.",
                              fix="set train.runtime.precision: bf16 (or choose sdpa / flex_attention for fp32).")
        return requested
    half = precision in (None, "bf16", "fp16")
    if device.type == "cuda" and half:
        hopper = torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] == 9
        if hopper and importlib.util.find_spec("flash_attn_interface") is not None:
            return _chosen("flash_attention_3", "FA3 kernel installed")
        if importlib.util.find_spec("flash_attn") is not None:
            return _chosen("flash_attention_2", "flash_attn installed")
        if torch_varlen_available(device):
            return _chosen(TORCH_VARLEN, "no flash-attention package; PyTorch's native varlen attention")
    if device.type == "cuda":
        return _chosen("flex_attention", "document-causal BlockMask")
    return _chosen("sdpa", "CPU: flex_attention has no CPU backward and loses to the dense mask here "
                           "(benchmarks/attention_cpu.py)")


def _chosen(attn: str, why: str) -> str:
    log.info("attention auto -> %s (%s)", attn, why)
    return attn
