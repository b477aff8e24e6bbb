"""Attention inputs: which inputs each attention implementation needs to keep packed samples apart, and the
one input builder every model call uses (training, evaluation, tune).

A packed micro-batch is ``[rows, T]`` with several samples per row (``data.packing``). Each implementation
keeps them apart its own way, and gets exactly what it needs from :func:`to_device`:

=====================  ==============  ====================================================================
implementation          packed inputs   what the model gets
=====================  ==============  ====================================================================
``flash_attention_2``   varlen          rows flattened to ``[1, rows*T]`` and ``cu_seq_lens_q/k`` +
``flash_attention_3``                   ``max_length_q/k`` (transformers' FlashAttentionKwargs -> the kernel's
``flash_attention_4``                   ``cu_seqlens`` / ``max_seqlen``): only same-document blocks are
                                        computed
``torch_varlen``        varlen          the same, to ``torch.nn.attention.varlen.varlen_attn`` (``kernels``)
``sdpa_varlen``         varlen          the same, to ``sdpa_varlen_attention`` (``kernels``; any device,
                                        any dtype): segments gathered into buckets of equal padded length, one
                                        causal SDPA call per bucket, no mask: only each sample's own keys.
                                        Not chosen by ``auto``: on CPU short rows (80 x 128, ~19-token
                                        samples) whole steps measured 1.00x (fp32) and 0.86x (bf16) of
                                        ``sdpa``: the CPU flash kernel costs per call and block, not per
                                        score, and the gathers' backward scatters
                                        (``benchmarks/issue16_ab.py --lever attention``)
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
"""

from __future__ import annotations

import numpy as np
import torch

from fastlm.engine.data.packing import block_causal_mask, to_additive_mask
from fastlm.engine.data.schema import (
    FIXED_SHAPE,
    IGNORE_INDEX,
    MODEL_INPUT_KEYS,
    MODEL_INPUTS,
    TARGET_POSITIONS,
    VARLEN_REAL_TOKENS,
)
from fastlm.engine.data.seq2seq_packing import seq2seq_packed_masks
from fastlm.engine.model.attention.kernels import MAX_LENGTH_BOUND, SDPA_VARLEN, TORCH_VARLEN
from fastlm.engine.model.encoder_decoder import CROSS_ATTENTION_MASK, DECODER_POSITIONS, ENCODER_POSITIONS
from fastlm.engine.model.loss import positions_to_keep

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
# The model-input keys are schema.MODEL_INPUT_KEYS (a causal LM's); an encoder-decoder model adds the
# decoder's.
DECODER_INPUT_KEYS = ("decoder_input_ids", "decoder_attention_mask")
SEQ2SEQ_INPUTS = (*(key for key in MODEL_INPUT_KEYS if key != "position_ids"), *DECODER_INPUT_KEYS)
DEVICE_KEYS = (*MODEL_INPUT_KEYS, "labels", *DECODER_INPUT_KEYS, VARLEN_REAL_TOKENS)


def packed_inputs(attn: str) -> str:
    if attn not in PACKED_INPUTS:
        raise ValueError(f"attention implementation {attn!r} is not one of {IMPLEMENTATIONS}")
    return PACKED_INPUTS[attn]


def to_device(batch: dict, device: torch.device, attn: str) -> dict:
    """The batch with its tensors on ``device`` and ``batch[MODEL_INPUTS]``: the model's keyword arguments for
    ``attn`` (counts, ``cu_seq_lens`` and ``max_seqlen`` stay on the host: reading them costs no sync), and
    for a causal batch ``batch[TARGET_POSITIONS]`` where some positions predict no label
    (``loss.positions_to_keep``)."""
    kind = packed_inputs(attn)
    if kind == VARLEN and "decoder_input_ids" not in batch:
        batch = without_padding(batch)
    moved = {key: batch[key].to(device, non_blocking=True) for key in DEVICE_KEYS if key in batch}
    out = {**batch, **moved}
    packed = "sequence_ids" in batch
    if "decoder_input_ids" in batch:  # encoder-decoder: the head on flat target positions (seq2seq_hooks)
        keep = positions_to_keep(batch["labels"], device, flattened=True) if "labels" in batch else None
        if keep is not None:
            out[TARGET_POSITIONS] = keep
        # packed rows (data.seq2seq_packing): the dense masks; padded sides (collators.Seq2SeqCollator): their
        # masks
        out[MODEL_INPUTS] = (
            packed_seq2seq_inputs(batch, out, device, kind)
            if "decoder_segment_ids" in batch
            else {key: out[key] for key in SEQ2SEQ_INPUTS}
        )
        return out
    # a training step computes logits only where a label is predicted (loss.training_logits)
    if "labels" in batch:
        keep = positions_to_keep(batch["labels"], device, flattened=kind == VARLEN)
        if keep is not None:
            # varlen: 1-D positions, which transformers' slice_logits_to_keep indexes (hidden[:, keep]); its
            # [1, K] branch (take_along_dim) ties the kept count to the token count under torch.compile,
            # which then compiles again for every micro-batch's token count
            out[TARGET_POSITIONS] = keep.reshape(-1) if kind == VARLEN else keep
    if kind == VARLEN:
        cu_seq_lens, max_seqlen = varlen_boundaries(batch)
        rows, length = out["input_ids"].shape
        positions = out["position_ids"] if packed else torch.arange(length, device=device).expand(rows, -1)
        cu = cu_seq_lens.to(device, non_blocking=True)
        out[MODEL_INPUTS] = {
            "input_ids": out["input_ids"].reshape(1, -1),
            "position_ids": positions.reshape(1, -1),
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": max_seqlen,
            "max_length_k": max_seqlen,
            MAX_LENGTH_BOUND: max_length_bound(batch, length),
        }
        mark_varying_sizes(out, fixed=FIXED_SHAPE in batch)
        return out
    inputs = {"input_ids": out["input_ids"]}
    if packed:  # the mask this path needs, from the segment ids (whatever mask format the collator made)
        inputs["position_ids"] = out["position_ids"]
        sequence_ids = batch["sequence_ids"].to(device, non_blocking=True)
        inputs["attention_mask"] = (
            document_block_mask(sequence_ids) if kind == BLOCK_MASK else dense_mask(sequence_ids, kind)
        )
    elif "attention_mask" in out:  # padded rows, one sample each: transformers builds the mask it needs
        inputs["attention_mask"] = out["attention_mask"]
    out[MODEL_INPUTS] = inputs
    return out


# The varlen row's length is rounded up to a multiple of this (its padding tail one segment more): the token
# count is every projection's M dimension, and the inner one of each weight gradient, which float8's GEMMs
# take in multiples of 16 only (runtime.float8.ALIGNMENT; at most 15 padding tokens a micro-batch).
VARLEN_ROW_MULTIPLE = 16


def without_padding(batch: dict) -> dict:
    """A causal batch for the varlen kernels as one row of its real tokens, on the host: the samples in the
    collator's order with their labels and restarting positions, padded at the end to a multiple of
    ``VARLEN_ROW_MULTIPLE`` only, instead of the rows' padding tails (which the kernels would compute as
    segments of their own). ``cu_seq_lens``, ``max_seqlen``, ``sequence_ids`` and ``num_computed_tokens``
    follow; each sample's first label is ``ignore_index`` (its row's start predicted nothing). Packed
    batches carry their real tokens' mask (``real_mask``), right-padded ones their 2D ``attention_mask``;
    a batch without padding beyond the round-up is returned as it is. Where the row holds padding (its tail,
    or the rows' own where they are left as they are) ``VARLEN_REAL_TOKENS`` is its ``[1, width]`` mask of
    the real tokens, made here on the host (no sync): the router load-balancing loss leaves the rest out, as
    the attention mask does on padded rows (``loss.router_aux_loss``).

    A batch of one fixed shape (``PackedCollator.fixed_shape``: CUDA graphs replay one shape) keeps it: the
    row is padded to the batch's capacity, its padding in segments of at most the row length (the longest
    segment the kernel is told of under compile, ``max_length_bound``), and the boundaries to a power-of-two
    count of segments by repeating the last one (empty segments: the kernels skip them), so the token count
    is the same in every micro-batch and the boundary count one of a few."""
    real = batch.get("real_mask")
    if real is None and "attention_mask" in batch and batch["attention_mask"].dim() == 2:
        real = batch["attention_mask"].bool()
    if real is None or real.device.type != "cpu" or batch["input_ids"].device.type != "cpu":
        return batch
    fixed = FIXED_SHAPE in batch
    count = int(real.sum())
    width = real.numel() if fixed else -(-count // VARLEN_ROW_MULTIPLE) * VARLEN_ROW_MULTIPLE
    if (width >= real.numel() and not fixed) or count == 0:
        if count in (0, real.numel()):
            return batch
        return {**batch, VARLEN_REAL_TOKENS: _pinned_like(batch, real.reshape(1, -1).bool())}
    flat, tail = real.reshape(-1), width - count
    ids = batch["input_ids"].reshape(-1)
    if "position_ids" in batch:
        positions = batch["position_ids"].reshape(-1)[flat]
    else:
        positions = (real.cumsum(1) - 1).reshape(-1)[flat]
    starts = (positions == 0).nonzero().reshape(-1)
    chunk = max_length_bound(batch, real.shape[1]) if fixed else max(tail, 1)  # the padding's segments
    ends = list(range(count + chunk, width, chunk)) + ([width] if tail else [])
    if fixed:  # a power-of-two count of segments: empty ones at the end
        segments = starts.numel() + len(ends)
        ends += [width] * ((1 << max(segments - 1, 0).bit_length()) - segments)
    bounds = torch.cat([starts, torch.tensor([count] + ends)])
    lengths = bounds.diff()
    labels = batch["labels"].reshape(-1)[flat].clone()
    labels[starts] = IGNORE_INDEX
    out = {key: value for key, value in batch.items() if key not in ("attention_mask", "real_mask")}
    out["input_ids"] = torch.cat([ids[flat], ids[~flat][:1].expand(tail)]).unsqueeze(0)
    out["labels"] = torch.cat([labels, torch.full((tail,), IGNORE_INDEX)]).unsqueeze(0)
    padding = lengths[starts.numel() :]  # the padding's segments, each restarting its positions
    out["position_ids"] = torch.cat([positions, *(torch.arange(int(n)) for n in padding)]).unsqueeze(0)
    out["sequence_ids"] = torch.repeat_interleave(torch.arange(lengths.numel()), lengths).to(torch.int32)[
        None
    ]
    out["cu_seq_lens"] = bounds.to(torch.int32)
    out["max_seqlen"] = torch.tensor(int(lengths.max()), dtype=torch.int64)
    out["num_computed_tokens"] = torch.tensor(width, dtype=torch.int64)
    if "row_length" not in batch:  # the bound a right-padded batch's rows gave (few values in a run)
        out["row_length"] = torch.tensor(max_length_bound(batch, real.shape[1]), dtype=torch.int64)
    if tail:  # the first count tokens are the real ones
        out[VARLEN_REAL_TOKENS] = (torch.arange(width) < count).unsqueeze(0)
    if batch["input_ids"].is_pinned():  # the loader pinned the rows (CUDA): the copies made here too, so
        for key in ("input_ids", "labels", "position_ids", "cu_seq_lens", VARLEN_REAL_TOKENS):
            if key in out:  # their transfers stay async
                out[key] = out[key].pin_memory()
    return out


def _pinned_like(batch: dict, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` pinned where the loader pinned the batch's rows (CUDA), so that its transfer stays async."""
    if batch["input_ids"].is_pinned() and not tensor.is_pinned():
        return tensor.pin_memory()
    return tensor


def max_length_bound(batch: dict, length: int) -> int:
    """A bound of the longest segment that stays the same from one micro-batch to the next
    (``kernels.MAX_LENGTH_BOUND``): a packed run's row length (``PackedCollator``), else this batch's row
    length rounded up to a power of two (few values in a run)."""
    if "row_length" in batch:
        return int(batch["row_length"])
    return 1 << max(length - 1, 1).bit_length()


def mark_varying_sizes(out: dict, fixed: bool = False) -> None:
    """A varlen batch's sizes that change from one packed micro-batch to the next (the token count, the
    segment boundaries, the target positions) marked dynamic for ``torch.compile``: its first trace serves
    every later micro-batch, where dynamo would otherwise compile again at each size it first sees vary (each
    compile of a 0.73 B Llama's layer took about 55 s on an H100). A mark is read at a compile only; eager
    runs ignore it. ``fixed``: a batch of one shape (``without_padding``; CUDA graphs), whose token count
    stays static: only the boundaries' count, one of a few powers of two, is marked (a CUDA graph is then
    recorded once per count, from one compile)."""
    from torch._dynamo import maybe_mark_dynamic

    inputs = out[MODEL_INPUTS]
    if fixed:
        maybe_mark_dynamic(inputs["cu_seq_lens_q"], 0)
        return
    for key, dim in (("input_ids", 1), ("position_ids", 1), ("cu_seq_lens_q", 0)):
        maybe_mark_dynamic(inputs[key], dim)
    if TARGET_POSITIONS in out:
        maybe_mark_dynamic(out[TARGET_POSITIONS], 0)


def packed_seq2seq_inputs(batch: dict, out: dict, device: torch.device, kind: str) -> dict:
    """A packed encoder-decoder batch's model inputs: the three dense masks made on the device from the
    segment ids, and the packed positions / cross-attention mask that ``seq2seq_hooks`` feed to the model."""
    if kind not in (DENSE_BOOL, DENSE_ADDITIVE):
        raise ValueError(
            f"packed encoder-decoder batches need dense masks (sdpa or eager), not {kind} inputs"
        )
    segments = [
        batch[key].to(device, non_blocking=True) for key in ("encoder_segment_ids", "decoder_segment_ids")
    ]
    masks = [
        mask if kind == DENSE_BOOL else to_additive_mask(mask) for mask in seq2seq_packed_masks(*segments)
    ]
    positions = [
        batch[key].to(device, non_blocking=True) for key in ("encoder_position_ids", "decoder_position_ids")
    ]
    return {
        "input_ids": out["input_ids"],
        "attention_mask": masks[0],
        "decoder_input_ids": out["decoder_input_ids"],
        "decoder_attention_mask": masks[1],
        ENCODER_POSITIONS: positions[0],
        DECODER_POSITIONS: positions[1],
        CROSS_ATTENTION_MASK: masks[2],
    }


def varlen_boundaries(batch: dict) -> tuple[torch.Tensor, int]:
    """``cu_seq_lens`` (int32) and the longest segment of the row-major flattening of the batch, on the host.

    Packed batches carry them (``PackedCollator``); right-padded ones (one sample + a padding tail per row)
    get them from the host-side 2D ``attention_mask``.
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
    """The ``[rows, 1, T, T]`` block-causal mask, bool (SDPA) or additive (eager), built on the ids'
    device."""
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

    return create_block_mask(
        document_causal, B=rows, H=None, Q_LEN=length, KV_LEN=length, device=sequence_ids.device
    )
