"""Packed encoder-decoder batches: several prompt/response samples per row on both sides, kept apart exactly.

A sample's prompt (then the tokenizer's ``TextEnds.tail``) goes to the encoder row and ``[decoder_start_id] +
TextEnds.head + response + EOS`` to the decoder row of the same row number (``collators.seq2seq_sides``);
rows are filled next-fit (``packing.assign_rows``) by each sample's longer side
(``collators.seq2seq_lengths``), so both an encoder row and a decoder row hold at most ``budget.row_length``
tokens, and on batches of ``PackedBatchSampler`` over those lengths the packer's rows come back. Each side is
padded to its own longest row (rounded up to ``pad_to_multiple_of``).

Per token, each side carries

``*_position_ids``   the position within its sample (restarting at 0; the padding tail counts from 0 too)
``*_segment_ids``    the sample's index in the batch (int32), -1 on padding

and ``seq2seq_packed_masks`` turns the two segment-id tensors into the three masks that make a packed row
compute exactly what each sample computes alone:

* encoder self-attention: block-diagonal, bidirectional within a sample (padding sees padding only);
* decoder self-attention: block-diagonal causal (``packing.block_causal_mask``);
* cross-attention: a decoder token sees the encoder tokens of its own sample only (decoder padding sees the
  whole encoder row: never an empty mask row, so no NaN; its outputs carry no label).

The masks are ``[rows, 1, q, k]`` bool, True = attend (SDPA; eager needs ``packing.to_additive_mask``). Which
model families can take them, and how positions restart inside the model: ``engine.model.encoder_decoder``.
Labels follow ``Seq2SeqCollator``: the decoder row with -100 on each sample's start token and on padding
(position t predicts ``labels[t + 1]``; a sample's EOS input predicts the next sample's -100).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fastlm.engine.data.collators import TextEnds, seq2seq_sides
from fastlm.engine.data.labels import count_target_tokens, packed_causal_lm_labels
from fastlm.engine.data.packing import TokenBudget, assign_rows, block_causal_mask, packed_layout

__all__ = ["PackedSeq2SeqCollator", "seq2seq_packed_masks"]

PADDING_SEGMENT = -1


@dataclass(frozen=True)
class PackedSeq2SeqCollator:
    """Packs a batch of prompt/response samples into at most ``budget.rows_per_batch`` encoder and decoder
    rows.

    Returns ``input_ids`` / ``encoder_position_ids`` / ``encoder_segment_ids`` (encoder),
    ``decoder_input_ids`` / ``decoder_position_ids`` / ``decoder_segment_ids``, ``labels`` and the counts of
    ``collators`` (real and computed tokens cover both sides). The masks are made on the device from the
    segment ids (``attention.inputs.to_device``), as for packed causal batches.
    """

    pad_id: int
    decoder_start_id: int
    budget: TokenBudget
    pad_to_multiple_of: int | None = 8
    ends: TextEnds = TextEnds()

    def __call__(self, features: Sequence) -> dict[str, torch.Tensor]:
        encoder, decoder = seq2seq_sides(features, self.decoder_start_id, self.ends)
        longer = [max(len(e), len(d)) for e, d in zip(encoder, decoder, strict=True)]
        rows = assign_rows(longer, self.budget.row_length)
        if len(rows) > self.budget.rows_per_batch:
            raise ValueError(
                f"the batch needs {len(rows)} rows of {self.budget.row_length} tokens, "
                f"more than rows_per_batch={self.budget.rows_per_batch}"
            )
        input_ids, encoder_positions, encoder_segments, _ = self._side(encoder, rows)
        decoder_ids, decoder_positions, decoder_segments, decoder_real = self._side(decoder, rows)
        labels = packed_causal_lm_labels(decoder_ids, decoder_positions, decoder_real)
        real = sum(len(ids) for ids in encoder) + sum(len(ids) for ids in decoder)
        return {
            "input_ids": input_ids,
            "encoder_position_ids": encoder_positions,
            "encoder_segment_ids": encoder_segments,
            "decoder_input_ids": decoder_ids,
            "decoder_position_ids": decoder_positions,
            "decoder_segment_ids": decoder_segments,
            "labels": labels,
            "num_samples": torch.tensor(len(features), dtype=torch.int64),
            "num_target_tokens": count_target_tokens(labels).to(torch.int64),
            "num_real_tokens": torch.tensor(real, dtype=torch.int64),
            "num_computed_tokens": torch.tensor(input_ids.numel() + decoder_ids.numel(), dtype=torch.int64),
        }

    def _side(self, pieces: list[np.ndarray], rows: list[list[int]]):
        """One side's ``[rows, T]`` ids, positions, segment ids (int32) and real-token mask."""
        row_lengths = [[len(pieces[i]) for i in row] for row in rows]
        # <= row_length: rows were assigned by longer side
        longest = max(max(sum(row) for row in row_lengths), 1)
        multiple = self.pad_to_multiple_of
        seq_len = min(-(-longest // multiple) * multiple if multiple else longest, self.budget.row_length)
        layout = packed_layout(row_lengths, seq_len)
        real = layout.real_mask.reshape(-1).numpy()
        flat = np.full(len(rows) * seq_len, self.pad_id, dtype=np.int64)
        order = [i for row in rows for i in row]
        flat[real] = np.concatenate([pieces[i] for i in order]) if order else []
        segments = np.full(flat.size, PADDING_SEGMENT, dtype=np.int32)
        segments[real] = np.repeat(np.asarray(order, dtype=np.int32), [len(pieces[i]) for i in order])
        shape = (len(rows), seq_len)
        return (
            torch.from_numpy(flat.reshape(shape)),
            layout.position_ids,
            torch.from_numpy(segments.reshape(shape)),
            layout.real_mask,
        )


def seq2seq_packed_masks(encoder_segments: torch.Tensor, decoder_segments: torch.Tensor):
    """``(encoder [R,1,Te,Te], decoder [R,1,Td,Td], cross [R,1,Td,Te])`` bool masks from the segment ids."""
    enc = encoder_segments.to(torch.int32)
    dec = decoder_segments.to(torch.int32)
    encoder = (enc[:, :, None] == enc[:, None, :]).unsqueeze(1)
    cross = ((dec[:, :, None] == enc[:, None, :]) | (dec[:, :, None] == PADDING_SEGMENT)).unsqueeze(1)
    return encoder, block_causal_mask(dec), cross
