"""Gradient accumulation (``model.accumulation``): the micro-batches of one optimizer step are normalised over
the target tokens of the whole step, so their gradients add up to those of one batch holding every sample
(averaging per-micro-batch means does not), with and without label smoothing."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

import tests.support.micro_batches as micro_batches_support
from fastlm.engine.data.schema import IGNORE_INDEX
from fastlm.engine.model.accumulation import accumulate_gradients, total_target_tokens
from fastlm.engine.model.loss import causal_lm_loss_sum
from tests.support.micro_batches import VOCAB, concatenate, gradients, relative_difference
from tests.support.tolerances import reordered_sum_rtol

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    return micro_batches_support.tiny_llama()


@pytest.fixture(scope="module")
def micro_batches() -> list[dict[str, torch.Tensor]]:
    return micro_batches_support.unequal_micro_batches()


def test_total_target_tokens_uses_the_collator_count_or_counts_labels(micro_batches):
    counts = [b["num_target_tokens"] for b in micro_batches]
    assert len(set(counts)) == 3, "the micro-batches must have unequal target counts"
    without_counts = [{"labels": b["labels"]} for b in micro_batches]
    assert total_target_tokens(micro_batches) == total_target_tokens(without_counts) == sum(counts)


def test_accumulated_gradients_equal_the_full_batch_and_naive_averaging_does_not(tiny_llama, micro_batches):
    model = tiny_llama

    model.zero_grad(set_to_none=True)
    full_loss_sum, full_targets = accumulate_gradients(model, [concatenate(micro_batches)])
    full = gradients(model)

    model.zero_grad(set_to_none=True)
    step_loss_sum, step_targets = accumulate_gradients(model, micro_batches)
    accumulated = gradients(model)

    model.zero_grad(set_to_none=True)
    for batch in micro_batches:  # the bug: mean per micro-batch, then the mean of the k means
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss_sum, n_targets = causal_lm_loss_sum(logits, batch["labels"])
        (loss_sum / n_targets / len(micro_batches)).backward()
    naive = gradients(model)
    model.zero_grad(set_to_none=True)

    assert step_targets == full_targets
    # the per-token losses of three micro-batches summed vs one batch (other shapes, other matmul blocking)
    torch.testing.assert_close(step_loss_sum, full_loss_sum, rtol=reordered_sum_rtol(full_targets), atol=0)
    # the same per-token gradients summed in another order: tokens * eps; naive averaging is off by ~0.8
    tolerance = reordered_sum_rtol(full_targets)
    accumulated_error = relative_difference(accumulated, full)
    naive_error = relative_difference(naive, full)
    print(f"relative L2 gradient error: accumulated {accumulated_error:.2e}, naive {naive_error:.2e}")
    assert accumulated_error < tolerance
    assert naive_error > 100 * tolerance


def test_a_training_step_with_label_smoothing_optimises_the_smoothed_loss(tiny_llama, micro_batches):
    """accumulate_gradients(label_smoothing=): the gradients of the smoothed token-mean loss of the whole
    step."""
    model = tiny_llama
    batch = concatenate(micro_batches)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=0.1,
    )
    expected.backward()
    reference = gradients(model)
    model.zero_grad(set_to_none=True)
    loss_sum, targets = accumulate_gradients(model, micro_batches, label_smoothing=0.1)
    smoothed = gradients(model)
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(
        loss_sum / targets, expected.detach(), rtol=reordered_sum_rtol(targets * VOCAB), atol=0
    )
    # micro-batches: reordered sums
    assert relative_difference(smoothed, reference) < reordered_sum_rtol(targets)
