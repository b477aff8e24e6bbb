"""The batch schema every layer shares: the label convention (``IGNORE_INDEX`` marks a position with no
target; a causal model's position ``t`` predicts ``labels[t + 1]``) and the keys of a batch on its way to the
model (``inputs.to_device`` puts the model's keyword arguments under ``MODEL_INPUTS`` and the positions
whose logits a step needs under ``TARGET_POSITIONS``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")
MODEL_INPUTS = "model_inputs"  # a batch from inputs.to_device: the model's keyword arguments for its path
# A batch from inputs.to_device: the positions whose logits a training step needs (``logits_to_keep``).
TARGET_POSITIONS = "target_positions"
# A packed batch of one shape whatever its fill (``PackedCollator.fixed_shape``): its varlen view keeps one.
FIXED_SHAPE = "fixed_shape"
# A varlen batch from inputs.to_device whose one row holds padding (its round-up tail, a fixed shape's
# capacity, or rows left as they are): the ``[1, width]`` bool mask of its real tokens, on the device, which
# the router load-balancing loss is computed over (``loss.router_aux_loss``; no attention mask reaches the
# model there). Absent where every token of the row is real.
VARLEN_REAL_TOKENS = "varlen_real_tokens"


def model_inputs(batch: Mapping) -> dict:
    """The model's keyword arguments: ``batch["model_inputs"]`` (``inputs.to_device``), else its plain
    keys."""
    if MODEL_INPUTS in batch:
        return batch[MODEL_INPUTS]
    return {key: batch[key] for key in MODEL_INPUT_KEYS if key in batch}


def shift_labels(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The label each position predicts: labels moved one step left, the last position gets ``ignore_index``.

    Padding the labels (instead of dropping the last logit) keeps the big logits tensor uncopied.
    """
    return F.pad(labels[..., 1:], (0, 1), value=ignore_index)


def count_target_tokens(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Number of labels that some position predicts (an int64 scalar tensor on the labels' device)."""
    return (labels[..., 1:] != ignore_index).sum()
