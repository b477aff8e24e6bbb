"""Encoder-decoder training steps run the LM head only on decoder positions that predict a target.

The decoder rows of a step hold padding (length-grouped batches are padded to the longest response) and each
sample's EOS input, which predicts nothing; over an 8-32k vocabulary the head is most of the decoder's work.
The loss and the gradients must be those of the full logits, padded and packed, for BART, mBART and T5 (whose
head scales its input first: the hook sits on the head module itself); under a LoRA wrapper:
test_encoder_decoder.py.
"""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.data import Seq2SeqCollator
from fastlm.engine.model.attention.inputs import to_device
from fastlm.engine.model.encoder_decoder import enable_packed_seq2seq, enable_target_head
from fastlm.engine.model.loss import forward_logits, training_logits
from tests.support.tiny_seq2seq import PAD, head_rows, packed_batch, samples, tiny_seq2seq
from tests.support.tolerances import OTHER_FP32_KERNEL_GRAD, reordered_sum_rtol

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


def loss_and_grads(model, batch, logits_and_targets):
    model.zero_grad(set_to_none=True)
    logits, targets = logits_and_targets(model, batch)
    loss = torch.nn.functional.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def full_logits(model, batch):
    logits = forward_logits(model, batch)
    return logits.reshape(-1, logits.size(-1)), torch.nn.functional.pad(
        batch["labels"][:, 1:], (0, 1), value=-100
    ).reshape(-1)


@pytest.mark.parametrize("kind", ["bart", "mbart", "t5"])
@pytest.mark.parametrize("packed", [False, True])
def test_a_training_step_computes_the_head_only_where_a_target_is_predicted(kind, packed):
    model = tiny_seq2seq(kind).train()
    enable_target_head(model)
    if packed:
        enable_packed_seq2seq(model)
    start = model.config.decoder_start_token_id
    features = samples(12, seed=3)
    raw = (
        packed_batch(features, start)
        if packed
        else Seq2SeqCollator(pad_id=PAD, decoder_start_id=start)(features)
    )
    batch = to_device(raw, torch.device("cpu"), "sdpa")
    rows = head_rows(model)
    expected_loss, expected_grads = loss_and_grads(model, batch, full_logits)
    loss, grads = loss_and_grads(model, batch, training_logits)
    targets = int(raw["num_target_tokens"])
    assert rows == [raw["decoder_input_ids"].numel(), targets] and targets < rows[0]
    # the head on K target rows vs every row: another matmul shape, then the loss summed over the same targets
    torch.testing.assert_close(loss, expected_loss, rtol=reordered_sum_rtol(targets), atol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
