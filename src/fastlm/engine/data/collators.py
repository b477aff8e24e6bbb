"""Collators: lists of samples (token id lists / arrays, or dicts with ``input_ids``) to dicts of tensors.

No tokenization happens here; samples arrive as the split pipeline stored them (unpadded, EOS last).
Prompt/response samples arrive as ``{"input_ids": ..., "prompt_length": n}`` (``TokenSequences`` with
prompt lengths): every collator then sets the labels of the first ``n`` tokens to -100 (completion-only loss,
see ``labels``), and ``num_target_tokens`` counts only the response tokens and EOS; a chat's earlier answers
inside its prompt (``"answer_spans"``, ``[k, 2]`` token ranges) are trained too.
Every collator returns ``input_ids``, ``labels``, ``attention_mask`` and the host-side counts

``num_target_tokens``    labels some position predicts (``count_target_tokens``: the divisor of the mean loss)
``num_real_tokens``      sample tokens in the batch
``num_computed_tokens``  tokens the model runs on (the tensor's numel); real / computed = padding efficiency

all int64 scalar tensors. Collators hold only ints and strings, so they pickle into DataLoader workers.

* ``DynamicPaddingCollator``: right padding to the longest sample of the batch, rounded up to
  ``pad_to_multiple_of``; 2D ``attention_mask``. Pair it with ``samplers.LengthGroupedSampler`` so that a
  batch holds samples of similar lengths (or with a shuffling sampler for plain random batches).
* ``PackedCollator``: several samples per row (``packing``), ``position_ids`` restarting per sample, a 4D
  block-diagonal causal ``attention_mask``, plus ``cu_seq_lens`` / ``max_seqlen`` for flash-attention varlen.
  Pair it with ``samplers.PackedBatchSampler``.
* ``Seq2SeqCollator``: encoder-decoder models; the prompt is the encoder input, the response the decoder
  row, each padded to its own longest side (pair it with a ``LengthGroupedSampler`` over ``seq2seq_lengths``).
  Both sides get the special tokens the model's tokenizer puts around a text (``TextEnds``: BART's ``</s>``
  after the prompt and ``<s>`` before the response), as Hugging Face's fine-tuning feeds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fastlm.engine.data.labels import (
    IGNORE_INDEX,
    causal_lm_labels,
    count_target_tokens,
    packed_causal_lm_labels,
)
from fastlm.engine.data.packing import (
    TokenBudget,
    assign_rows,
    block_causal_mask,
    packed_layout,
    to_additive_mask,
)
from fastlm.engine.data.schema import FIXED_SHAPE

__all__ = [
    "DynamicPaddingCollator",
    "PackedCollator",
    "Seq2SeqCollator",
    "TextEnds",
    "pad_id_of",
    "seq2seq_lengths",
    "seq2seq_sides",
]

ATTENTION_MASK_FORMATS = ("bool", "additive", "none")


def pad_id_of(tokenizer) -> int:
    """The tokenizer's pad id, else its EOS id (labels never depend on the pad id, so either is safe)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token")
    return int(pad)


@dataclass(frozen=True)
class TextEnds:
    """The special ids a tokenizer puts around a text it encodes with its special tokens
    (``tokenizer(text)``): ``head`` before it (BART: ``<s>``), ``tail`` after it (BART, T5: ``</s>``);
    none for GPT-2-style ones.

    An encoder-decoder model was pretrained on rows so framed, and Hugging Face's fine-tuning
    (``run_summarization``) feeds them so: encoder ``tokenizer(prompt)``, labels
    ``tokenizer(text_target=response)``. The split tokenizes both without them (decoder-only rows need the
    prompt and response to join), putting only a leading BOS in front of the prompt
    (``corpus.prompts.leading_bos``); the encoder-decoder collators add the rest: the encoder row is the
    prompt then ``tail``, the decoder row the decoder start, ``head``, the response and its EOS.
    """

    head: tuple[int, ...] = ()
    tail: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer) -> TextEnds:
        """What ``tokenizer`` adds around a text (compared with the same text encoded without them)."""
        unpadded = {"padding": False, "truncation": False, "verbose": False}
        framed = list(tokenizer("x", add_special_tokens=True, **unpadded)["input_ids"])
        bare = list(tokenizer("x", add_special_tokens=False, **unpadded)["input_ids"])
        for at in range(len(framed) - len(bare) + 1):
            if framed[at : at + len(bare)] == bare:
                return cls(tuple(map(int, framed[:at])), tuple(map(int, framed[at + len(bare) :])))
        return cls()


def _sample_ids(feature) -> np.ndarray:
    ids = feature["input_ids"] if isinstance(feature, Mapping) else feature
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def _prompt_length(feature) -> int:
    return int(feature.get("prompt_length", 0)) if isinstance(feature, Mapping) else 0


def _answer_mask(features: Sequence, starts: np.ndarray, size: int) -> torch.Tensor | None:
    """True on the tokens of the samples' earlier answers (``"answer_spans"``), the samples' tokens starting
    at flat positions ``starts`` of a ``size``-token layout; None when no sample has one."""
    spans = [(feature.get("answer_spans") if isinstance(feature, Mapping) else None) for feature in features]
    if not any(span is not None and len(span) for span in spans):
        return None
    marks = np.zeros(size + 1, dtype=np.int32)  # +1 at each answer start, -1 at its end: a running sum
    for start, span in zip(starts, spans, strict=True):
        if span is not None and len(span):
            span = np.asarray(span, dtype=np.int64).reshape(-1, 2)
            np.add.at(marks, start + span[:, 0], 1)
            np.add.at(marks, start + span[:, 1], -1)
    return torch.from_numpy(np.cumsum(marks[:-1]) > 0)


def _round_up(value: int, multiple: int | None) -> int:
    return value if not multiple else -(-value // multiple) * multiple


def _counts(
    labels: torch.Tensor, num_real: int, num_computed: int, num_samples: int
) -> dict[str, torch.Tensor]:
    return {
        "num_samples": torch.tensor(num_samples, dtype=torch.int64),
        "num_target_tokens": count_target_tokens(labels).to(torch.int64),
        "num_real_tokens": torch.tensor(num_real, dtype=torch.int64),
        "num_computed_tokens": torch.tensor(num_computed, dtype=torch.int64),
    }


@dataclass(frozen=True)
class DynamicPaddingCollator:
    """Right-pads a batch to its longest sample (rounded up to ``pad_to_multiple_of``) with ``pad_id``.

    ``attention_mask`` is 1 on sample tokens; ``labels`` are ``input_ids`` with -100 exactly on the padding,
    so each sample's final EOS stays a target even when ``pad_id`` is the EOS id.
    """

    pad_id: int
    pad_to_multiple_of: int | None = 8

    @classmethod
    def from_tokenizer(cls, tokenizer, **kwargs) -> DynamicPaddingCollator:
        return cls(pad_id=pad_id_of(tokenizer), **kwargs)

    def __call__(self, features: Sequence) -> dict[str, torch.Tensor]:
        samples = [_sample_ids(feature) for feature in features]
        if not samples:
            raise ValueError("cannot collate an empty batch")
        lengths = np.fromiter((len(ids) for ids in samples), dtype=np.int64, count=len(samples))
        seq_len = _round_up(int(lengths.max()), self.pad_to_multiple_of)
        input_ids = np.full((len(samples), seq_len), self.pad_id, dtype=np.int64)
        for row, ids in enumerate(samples):
            input_ids[row, : len(ids)] = ids
        attention_mask = torch.from_numpy(np.arange(seq_len)[None, :] < lengths[:, None]).to(torch.int64)
        input_ids = torch.from_numpy(input_ids)
        prompts = [_prompt_length(feature) for feature in features]
        answers = _answer_mask(features, np.arange(len(samples)) * seq_len, input_ids.numel())
        labels = causal_lm_labels(
            input_ids,
            attention_mask,
            torch.tensor(prompts) if any(prompts) else None,
            None if answers is None else answers.view(input_ids.shape),
        )
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            **_counts(labels, int(lengths.sum()), input_ids.numel(), len(samples)),
        }


@dataclass(frozen=True)
class PackedCollator:
    """Packs a batch's samples, in order, into rows of at most ``budget.row_length`` tokens.

    Rows are filled next-fit (``packing.assign_rows``): on batches from ``PackedBatchSampler`` this reproduces
    the packer's rows, so at most ``budget.rows_per_batch`` rows; more raise ``ValueError``. Shape:
    ``[rows_per_batch, row_length]`` with ``fixed_shape`` (static shapes; empty rows are all padding), else
    ``[rows used, longest row rounded up to pad_to_multiple_of]``.

    Returns ``input_ids``, ``labels`` (-100 on padding and on every sample's first token, see ``labels``),
    ``position_ids`` (restarting at 0 per sample), ``attention_mask`` — ``[rows, 1, T, T]`` block-diagonal
    causal: bool (True = attend) for SDPA with ``attention_mask_format="bool"``, 0 / float32-min for eager
    with ``"additive"``, left out with ``"none"`` (flash-attention varlen) —, ``cu_seq_lens`` (int32) and
    ``max_seqlen`` (see ``packing``), ``row_length`` (``budget.row_length``: the bound of every batch's
    segments), and the counts of the module docstring.
    """

    pad_id: int
    budget: TokenBudget
    pad_to_multiple_of: int | None = 8
    fixed_shape: bool = False
    attention_mask_format: str = "bool"

    def __post_init__(self) -> None:
        if self.attention_mask_format not in ATTENTION_MASK_FORMATS:
            raise ValueError(f"attention_mask_format must be one of {ATTENTION_MASK_FORMATS}")

    @classmethod
    def from_tokenizer(cls, tokenizer, budget: TokenBudget, **kwargs) -> PackedCollator:
        return cls(pad_id=pad_id_of(tokenizer), budget=budget, **kwargs)

    def __call__(self, features: Sequence) -> dict[str, torch.Tensor]:
        samples = [_sample_ids(feature) for feature in features]
        if not samples:
            raise ValueError("cannot collate an empty batch")
        lengths = [len(ids) for ids in samples]
        rows = assign_rows(lengths, self.budget.row_length)
        if len(rows) > self.budget.rows_per_batch:
            raise ValueError(
                f"the batch needs {len(rows)} rows of {self.budget.row_length} tokens, "
                f"more than rows_per_batch={self.budget.rows_per_batch}"
            )
        row_lengths = [[lengths[i] for i in row] for row in rows]
        if self.fixed_shape:
            seq_len = self.budget.row_length
            row_lengths += [[] for _ in range(self.budget.rows_per_batch - len(rows))]
        else:
            longest = max(sum(row) for row in row_lengths)
            seq_len = min(_round_up(max(longest, 1), self.pad_to_multiple_of), self.budget.row_length)
        layout = packed_layout(row_lengths, seq_len)
        flat = np.full(len(row_lengths) * seq_len, self.pad_id, dtype=np.int64)
        flat[layout.real_mask.reshape(-1).numpy()] = np.concatenate([samples[i] for row in rows for i in row])
        input_ids = torch.from_numpy(flat.reshape(len(row_lengths), seq_len))
        prompts = [_prompt_length(feature) for feature in features]
        limits = answers = None
        if any(prompts):  # each token gets its sample's prompt length; position < limit marks a prompt token
            flat_limits = np.zeros(flat.size, dtype=np.int64)
            order = [i for row in rows for i in row]
            flat_limits[layout.real_mask.reshape(-1).numpy()] = np.repeat(
                [prompts[i] for i in order], [lengths[i] for i in order]
            )
            limits = torch.from_numpy(flat_limits.reshape(input_ids.shape))
            starts = np.flatnonzero(layout.position_ids.reshape(-1).numpy() == 0)
            starts = starts[
                layout.real_mask.reshape(-1).numpy()[starts]
            ]  # each sample's first token, in order
            answers = _answer_mask([features[i] for i in order], starts, flat.size)
            answers = None if answers is None else answers.view(input_ids.shape)
        labels = packed_causal_lm_labels(input_ids, layout.position_ids, layout.real_mask, limits, answers)
        batch = {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": layout.position_ids,
            "sequence_ids": layout.sequence_ids.to(torch.int32),
            "real_mask": layout.real_mask,  # host-side: the varlen view leaves the rest out (inputs)
        }
        if self.attention_mask_format != "none":
            mask = block_causal_mask(layout.sequence_ids)
            batch["attention_mask"] = mask if self.attention_mask_format == "bool" else to_additive_mask(mask)
        batch["cu_seq_lens"] = layout.cu_seq_lens
        batch["max_seqlen"] = torch.tensor(layout.max_seqlen, dtype=torch.int64)
        # the longest a segment can be in any batch of the run: a bound the same for every micro-batch
        batch["row_length"] = torch.tensor(self.budget.row_length, dtype=torch.int64)
        batch.update(_counts(labels, sum(lengths), input_ids.numel(), len(samples)))
        if self.fixed_shape:  # the varlen view keeps this shape too (attention.inputs.without_padding)
            batch[FIXED_SHAPE] = torch.tensor(True)
        return batch


@dataclass(frozen=True)
class Seq2SeqCollator:
    """Encoder-decoder batches from prompt/response samples: the prompt feeds the encoder, the response (with
    its EOS) is the decoder's target. Encoder and decoder are right-padded separately, each to its own longest
    side in the batch (rounded up to ``pad_to_multiple_of``): no ``max_length`` padding.

    The encoder row is the prompt then ``ends.tail``, the decoder row ``[decoder_start_id] + ends.head +
    response + EOS`` (what the model's own shift of the labels ``tokenizer(text_target=response)`` would feed
    it; ``TextEnds``), and ``labels`` is that row with -100 on its first token and on padding: the same causal
    convention as the decoder-only collators (position t predicts ``labels[t + 1]``), so the one loss
    (``loss.causal_lm_loss_sum``), target count and token-normalised accumulation serve both kinds. The EOS
    input's own prediction is ignored (one computed, never scored position per sample).

    Returns ``input_ids`` / ``attention_mask`` (encoder), ``decoder_input_ids`` / ``decoder_attention_mask``,
    ``labels`` and the counts of the module docstring (real and computed tokens cover both sides).
    """

    pad_id: int
    decoder_start_id: int
    pad_to_multiple_of: int | None = 8
    ends: TextEnds = TextEnds()

    def __call__(self, features: Sequence) -> dict[str, torch.Tensor]:
        encoder, decoder = seq2seq_sides(features, self.decoder_start_id, self.ends)
        input_ids, attention_mask = self._pad(encoder)
        decoder_input_ids, decoder_attention_mask = self._pad(decoder)
        labels = causal_lm_labels(decoder_input_ids, decoder_attention_mask)
        labels[:, 0] = IGNORE_INDEX
        real = sum(len(ids) for ids in encoder) + sum(len(ids) for ids in decoder)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_attention_mask,
            "labels": labels,
            **_counts(labels, real, input_ids.numel() + decoder_input_ids.numel(), len(features)),
        }

    def _pad(self, rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = np.fromiter((len(ids) for ids in rows), dtype=np.int64, count=len(rows))
        seq_len = _round_up(max(int(lengths.max()), 1), self.pad_to_multiple_of)
        ids = np.full((len(rows), seq_len), self.pad_id, dtype=np.int64)
        for row, values in enumerate(rows):
            ids[row, : len(values)] = values
        mask = torch.from_numpy(np.arange(seq_len)[None, :] < lengths[:, None]).to(torch.int64)
        return torch.from_numpy(ids), mask


def seq2seq_sides(
    features: Sequence, decoder_start_id: int, ends: TextEnds = TextEnds()
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each prompt/response sample's encoder ids (the prompt, then ``ends.tail``) and decoder row
    (``[decoder_start_id] + ends.head + response``, the response with its EOS)."""
    if not features:
        raise ValueError("cannot collate an empty batch")
    if not all(isinstance(feature, Mapping) and "prompt_length" in feature for feature in features):
        raise ValueError("encoder-decoder batches need prompt/response samples (a prompt_length per sample)")
    samples = [_sample_ids(feature) for feature in features]
    prompts = [_prompt_length(feature) for feature in features]
    tail = np.asarray(ends.tail, dtype=np.int64)
    start = np.asarray([decoder_start_id, *ends.head], dtype=np.int64)
    encoder = [np.concatenate([ids[:n], tail]) for ids, n in zip(samples, prompts, strict=True)]
    decoder = [np.concatenate([start, ids[n:]]) for ids, n in zip(samples, prompts, strict=True)]
    return encoder, decoder


def seq2seq_lengths(
    lengths: np.ndarray, prompt_lengths: np.ndarray, ends: TextEnds = TextEnds()
) -> np.ndarray:
    """The longer side of each encoder-decoder sample (prompt and ``ends.tail``, or decoder start,
    ``ends.head`` and response): what to group by."""
    return np.maximum(prompt_lengths + len(ends.tail), lengths - prompt_lengths + 1 + len(ends.head))
