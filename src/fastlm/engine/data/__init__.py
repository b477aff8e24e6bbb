"""The engine's data layer: labels from sample boundaries, token-budget packing, collators, batch samplers.

``labels`` (what is a target), ``packing`` (which samples share a row, and the position ids / block mask that
keep them apart), ``collators`` (samples to tensors; ``seq2seq_packing``: packed encoder-decoder rows),
``samplers`` (epoch order, resumable).
"""

from fastlm.engine.data.collators import (
    DynamicPaddingCollator,
    PackedCollator,
    Seq2SeqCollator,
    TextEnds,
    pad_id_of,
    seq2seq_lengths,
)
from fastlm.engine.data.labels import (
    IGNORE_INDEX,
    causal_lm_labels,
    count_target_tokens,
    packed_causal_lm_labels,
    real_token_mask,
)
from fastlm.engine.data.packing import (
    PackedLayout,
    Packing,
    TokenBudget,
    assign_rows,
    block_causal_mask,
    pack_by_token_budget,
    pack_rows,
    packed_batch_count,
    packed_layout,
    to_additive_mask,
)
from fastlm.engine.data.samplers import LengthGroupedSampler, PackedBatchSampler, epoch_rng
from fastlm.engine.data.seq2seq_packing import PackedSeq2SeqCollator, seq2seq_packed_masks

__all__ = [
    "IGNORE_INDEX",
    "DynamicPaddingCollator",
    "LengthGroupedSampler",
    "PackedBatchSampler",
    "PackedCollator",
    "PackedLayout",
    "PackedSeq2SeqCollator",
    "Seq2SeqCollator",
    "Packing",
    "TokenBudget",
    "assign_rows",
    "block_causal_mask",
    "causal_lm_labels",
    "count_target_tokens",
    "epoch_rng",
    "pack_by_token_budget",
    "pack_rows",
    "packed_batch_count",
    "packed_causal_lm_labels",
    "packed_layout",
    "pad_id_of",
    "real_token_mask",
    "seq2seq_lengths",
    "TextEnds",
    "seq2seq_packed_masks",
    "to_additive_mask",
]
