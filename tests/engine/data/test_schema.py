"""The batch schema: position t predicts labels[t + 1], ignored labels count no target, and the model's
inputs come from ``model_inputs`` when a batch carries it."""

from __future__ import annotations

import torch

from fastlm.engine.data.schema import (
    IGNORE_INDEX,
    MODEL_INPUTS,
    count_target_tokens,
    model_inputs,
    shift_labels,
)


def test_shift_labels_moves_left_and_ignores_the_last_position():
    labels = torch.tensor([[5, 6, 7, 8], [IGNORE_INDEX, IGNORE_INDEX, 3, 4]])
    assert shift_labels(labels).tolist() == [[6, 7, 8, -100], [-100, 3, 4, -100]]
    assert shift_labels(labels, ignore_index=0)[:, -1].tolist() == [0, 0]


def test_count_target_tokens_counts_what_some_position_predicts():
    labels = torch.tensor([[5, 6, 7, 8], [IGNORE_INDEX, IGNORE_INDEX, 3, 4]])
    count = count_target_tokens(labels)
    assert count.dtype == torch.int64 and count.ndim == 0
    assert int(count) == 3 + 2  # the first label of a row is never predicted
    assert int(count_target_tokens(labels)) == int((shift_labels(labels) != IGNORE_INDEX).sum())


def test_model_inputs_prefers_the_prepared_ones_and_drops_labels():
    ids = torch.ones(1, 3, dtype=torch.long)
    plain = {"input_ids": ids, "attention_mask": ids, "labels": ids, "num_target_tokens": 2}
    assert set(model_inputs(plain)) == {"input_ids", "attention_mask"}
    prepared = {**plain, MODEL_INPUTS: {"input_ids": ids, "cu_seq_lens_q": ids}}
    assert model_inputs(prepared) is prepared[MODEL_INPUTS]
