"""Labels for causal-LM training, taken from sample boundaries, never from the pad id.

Hugging Face causal-LM models shift the labels inside their loss: position ``t`` predicts ``labels[t + 1]``
(``fastlm.engine.data.schema.shift_labels`` does the same). So the labels are a copy of ``input_ids``, and
``IGNORE_INDEX`` (-100) marks only the labels no position may be trained to predict:

* padding positions, known from the lengths / the attention mask of the batch. Testing
  ``input_ids == pad_id`` instead would also drop each sample's final EOS whenever pad == eos (as
  ``transformers.DataCollatorForLanguageModeling(mlm=False)`` does), and the model would never learn to stop.
  Here the EOS that ends each sample stays a target.
* in packed rows, the first token of every sample: position ``s - 1`` is the last token (the EOS) of the
  previous sample, and "predict the first token of an unrelated sample from the previous one's EOS" is not
  a transition of the data. For the first sample of a row the shift already drops that label (label 0 of a
  row is never a target); for every later sample it is set to -100 here. It is also set on the row's first
  token, which changes no loss but keeps the row-major flattened view ``[1, rows * T]`` (flash-attention
  varlen) free of cross-row transitions.

* prompt tokens of prompt/response samples (completion-only loss): the first ``prompt_length`` labels of a
  sample are -100, so no position is trained to predict a prompt token. The label of the first response
  token (predicted from the last prompt token) and the closing EOS stay targets. Prompt tokens are still
  *inputs*: the response is conditioned on them.
* except a chat's earlier assistant answers inside its prompt (``answers``: True on their tokens, the end of
  turn after each included): every answer of a chat is trained, as TRL's ``assistant_only_loss`` trains
  them, while the user turns and the template around them stay inputs only.

With these labels, the summed loss of a packed row (with its block-diagonal mask, see ``packing``) equals the
sum of the losses of its samples run one at a time, and ``count_target_tokens(labels)`` (labels[..., 1:] that
are not -100, the divisor of the mean loss) is the number of next-token predictions actually scored.
"""

from __future__ import annotations

import torch

from fastlm.engine.data.schema import IGNORE_INDEX, count_target_tokens

__all__ = [
    "IGNORE_INDEX",
    "causal_lm_labels",
    "count_target_tokens",
    "packed_causal_lm_labels",
    "real_token_mask",
]


def real_token_mask(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(batch, seq_len) bool, True on the first ``lengths[i]`` positions of row i (right padding)."""
    lengths = torch.as_tensor(lengths)
    return torch.arange(seq_len, device=lengths.device)[None, :] < lengths[:, None]


def causal_lm_labels(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_lengths: torch.Tensor | None = None,
    answers: torch.Tensor | None = None,
) -> torch.Tensor:
    """Labels of a padded batch: ``input_ids`` with ``IGNORE_INDEX`` exactly where ``attention_mask`` is 0
    and, with ``prompt_lengths`` (one per row), on the first ``prompt_lengths[i]`` tokens of row i but the
    ``answers`` (bool, same shape: earlier answers inside a prompt, trained).

    ``attention_mask`` (0/1 or bool, same shape) says which positions hold real tokens; the pad id plays no
    role.
    """
    labels = input_ids.clone()
    labels[~attention_mask.bool()] = IGNORE_INDEX
    if prompt_lengths is not None:
        prompt = real_token_mask(prompt_lengths, input_ids.shape[-1])
        labels[prompt if answers is None else prompt & ~answers] = IGNORE_INDEX
    return labels


def packed_causal_lm_labels(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    real_mask: torch.Tensor,
    prompt_limits: torch.Tensor | None = None,
    answers: torch.Tensor | None = None,
) -> torch.Tensor:
    """Labels of packed rows: padding and every sample's first token (``position_ids == 0``) are
    ``IGNORE_INDEX``.

    ``position_ids`` restart at 0 at each sample start (as the packed layout builds them); ``real_mask`` is
    True on sample tokens, False on padding. ``prompt_limits`` (same shape, optional) holds, at each token,
    the prompt length of its sample: tokens with ``position_ids < prompt_limits`` are prompt tokens,
    ``IGNORE_INDEX``, but the ``answers`` (bool, same shape: earlier answers inside a prompt, trained).
    """
    labels = input_ids.clone()
    ignored = ~real_mask.bool() | (position_ids == 0)
    if prompt_limits is not None:
        prompt = position_ids < prompt_limits
        ignored |= prompt if answers is None else prompt & ~answers
    labels[ignored] = IGNORE_INDEX
    return labels
