"""Causal LM loss: shift semantics, equality with Hugging Face's loss, chunked and label-smoothed
cross-entropy, the LM head kept to the predicted positions (accumulation: test_accumulation.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fastlm.engine.model.loss as loss_module
import tests.support.micro_batches as micro_batches_support
from fastlm.engine.data.schema import IGNORE_INDEX, count_target_tokens
from fastlm.engine.model.accumulation import accumulate_gradients
from fastlm.engine.model.loss import causal_lm_loss_sum
from tests.support.allocations import full_size_allocations
from tests.support.micro_batches import VOCAB, concatenate, gradients, relative_difference
from tests.support.tolerances import BF16_VS_FP32, EPS_FP32, OTHER_FP32_KERNEL, reordered_sum_rtol

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    return micro_batches_support.tiny_llama()


@pytest.fixture(scope="module")
def micro_batches() -> list[dict[str, torch.Tensor]]:
    return micro_batches_support.unequal_micro_batches()


def test_shift_position_t_predicts_label_t_plus_1_and_ignores_masked_labels():
    labels = torch.tensor([[5, 7, IGNORE_INDEX, 2]])
    logits = torch.full((1, 4, 10), -30.0)
    logits[0, 0, 7] = 30.0  # position 0 predicts label 1 (= 7): right
    logits[0, 1, 3] = 30.0  # position 1 predicts label 2 (ignored): anything goes
    logits[0, 2, 9] = 30.0  # position 2 predicts label 3 (= 2): wrong, costs 60
    loss_sum, n_targets = causal_lm_loss_sum(logits, labels)
    assert n_targets.item() == 2 == count_target_tokens(labels).item()
    assert loss_sum.item() == pytest.approx(60.0, abs=1e-3)


def test_loss_sum_is_fp32_for_bf16_logits():
    logits = torch.randn(2, 8, 50).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 8))
    loss_sum, n_targets = causal_lm_loss_sum(logits, labels)
    assert loss_sum.dtype == torch.float32
    assert n_targets.item() == 2 * 7


def test_mean_loss_equals_the_hugging_face_model_loss(tiny_llama, micro_batches):
    batch = concatenate(micro_batches)
    with torch.no_grad():
        outputs = tiny_llama(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        )
        loss_sum, n_targets = causal_lm_loss_sum(outputs.logits, batch["labels"])
    assert n_targets.item() == batch["num_target_tokens"]
    # our fp32 sum divided once vs the model's own mean over the same tokens: a reordered sum
    tolerance = reordered_sum_rtol(int(n_targets))
    torch.testing.assert_close(loss_sum / n_targets, outputs.loss, rtol=tolerance, atol=0)


def reference_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The plain, unchunked definition: full fp32 log-softmax of the shifted logits."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.size(-1)),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def random_logits_and_labels(rows: int = 3, seq: int = 11, vocab: int = 37):
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, seq, vocab, generator=generator) * 4
    labels = torch.randint(0, vocab, (rows, seq), generator=generator)
    labels[0, 2:5] = IGNORE_INDEX  # a prompt
    labels[2, 7:] = IGNORE_INDEX  # padding
    return logits, labels


@pytest.mark.parametrize("reuse_logits", [False, True])
# one token per chunk, a ragged last chunk, one
@pytest.mark.parametrize("chunk_elements", [1, 37 * 4 + 5, 2**21])
def test_chunked_loss_and_gradient_equal_the_full_log_softmax(monkeypatch, reuse_logits, chunk_elements):
    monkeypatch.setattr(loss_module, "CE_CHUNK_ELEMENTS", chunk_elements)
    logits, labels = random_logits_and_labels()
    reference_input = logits.clone().requires_grad_()
    expected = reference_loss_sum(reference_input, labels)
    (expected / 7).backward()

    leaf = logits.clone().requires_grad_()
    produced = leaf * 1.0  # a non-leaf, as a model's logits are; its memory may be reused for the gradient
    loss_sum, n_targets = causal_lm_loss_sum(produced, labels, reuse_logits=reuse_logits)
    (loss_sum / 7).backward()

    assert n_targets.item() == (labels[:, 1:] != IGNORE_INDEX).sum().item()
    # chunked log-softmax vs whole: each token's logsumexp computed alike, the sum over tokens reordered;
    # the gradient (softmax - one-hot) is per element, so only the exp's own rounding (a few eps) differs
    torch.testing.assert_close(loss_sum, expected, rtol=reordered_sum_rtol(n_targets.item()), atol=0)
    torch.testing.assert_close(leaf.grad, reference_input.grad, rtol=8 * EPS_FP32, atol=1e-8)
    assert leaf.grad[2, 6:].abs().sum() == 0 and leaf.grad[:, -1].abs().sum() == 0  # no target: no gradient


def test_bf16_logits_get_a_bf16_gradient_close_to_the_fp32_one():
    logits, labels = random_logits_and_labels()
    half = logits.to(torch.bfloat16).requires_grad_()
    reference = half.detach().float().requires_grad_()
    reference_loss_sum(reference, labels).backward()
    loss_sum, _ = causal_lm_loss_sum(half * 1, labels, reuse_logits=True)
    loss_sum.backward()
    assert half.grad.dtype == torch.bfloat16
    torch.testing.assert_close(half.grad.float(), reference.grad, **BF16_VS_FP32)  # one bf16 rounding


def test_training_loss_makes_no_tokens_by_vocab_buffer_besides_the_logits(monkeypatch):
    """The old path made a log-softmax, a zero-filled nll gradient and a log-softmax gradient, each
    [tokens x vocab] fp32; the chunked one writes the gradient over the logits and makes none."""
    monkeypatch.setattr(loss_module, "CE_CHUNK_ELEMENTS", 37 * 8)
    logits, labels = random_logits_and_labels(rows=4, seq=32)
    leaf = logits.requires_grad_()

    def step():
        produced = leaf * 1.0
        loss_sum, _ = causal_lm_loss_sum(produced, labels, reuse_logits=True)
        (loss_sum / 10).backward()

    produced_numel = logits.numel()
    assert full_size_allocations(step, produced_numel) == 2  # the logits themselves and the leaf's .grad


@pytest.mark.parametrize("attn", ["sdpa", "sdpa_varlen"])
def test_training_computes_logits_only_where_a_label_is_predicted(attn):
    """A prompt token, a sample's last token and padding predict no label: the LM head must not compute their
    logits ([tokens x vocab] work for nothing: most of an SFT batch). Same loss and gradients as with every
    logit computed, on a packed batch (several rows; one flattened row on the varlen path)."""
    from fastlm.engine.data import PackedCollator
    from fastlm.engine.data.packing import TokenBudget
    from fastlm.engine.data.schema import TARGET_POSITIONS
    from fastlm.engine.model.attention.inputs import to_device

    generator = torch.Generator().manual_seed(3)
    layout = [(12, 8), (7, 0), (15, 11), (5, 2), (9, 6), (3, 0)]  # (length, prompt length)
    features = [
        {"input_ids": torch.randint(3, VOCAB, (n,), generator=generator).tolist(), "prompt_length": p}
        for n, p in layout
    ]
    collator = PackedCollator(
        pad_id=0,
        budget=TokenBudget(row_length=20, rows_per_batch=4),
        pad_to_multiple_of=8,
        attention_mask_format="none",
    )
    batch = to_device(collator(features), torch.device("cpu"), attn)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = attn
    head_rows = []
    model.lm_head.register_forward_hook(lambda module, args, out: head_rows.append(args[0].numel() // 64))

    kept_sum, kept_targets = accumulate_gradients(model, [batch])
    kept = gradients(model)
    model.zero_grad(set_to_none=True)
    every = {key: value for key, value in batch.items() if key != TARGET_POSITIONS}
    full_sum, full_targets = accumulate_gradients(model, [every])
    full = gradients(model)

    assert kept_targets == full_targets == sum(n - max(p, 1) for n, p in layout)
    assert head_rows == [kept_targets, batch["input_ids"].numel()], (
        "the LM head ran on positions without a target"
    )
    assert kept_targets < 0.6 * batch["input_ids"].numel()
    # the LM head on K kept rows vs every row: another matmul shape (blocking), then a reordered loss sum
    torch.testing.assert_close(kept_sum, full_sum, rtol=reordered_sum_rtol(kept_targets), atol=1e-6)
    assert relative_difference(kept, full) < OTHER_FP32_KERNEL["rtol"]


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
@pytest.mark.parametrize("chunk_elements", [1, 37 * 4 + 5, 2**21])
def test_label_smoothing_gives_torch_cross_entropys_loss_and_gradient(monkeypatch, smoothing, chunk_elements):
    """The chunked loss with ``label_smoothing`` against ``F.cross_entropy(..., label_smoothing=)`` (summed
    over the targets; ignored rows contribute nothing, their gradient is zero)."""
    monkeypatch.setattr(loss_module, "CE_CHUNK_ELEMENTS", chunk_elements)
    logits, labels = random_logits_and_labels()
    flat, targets = logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
    reference_input = flat.clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(
        reference_input, targets, ignore_index=IGNORE_INDEX, reduction="sum", label_smoothing=smoothing
    )
    (expected / 7).backward()
    leaf = flat.clone().requires_grad_()
    got = loss_module.cross_entropy_sum(leaf * 1.0, targets, label_smoothing=smoothing)
    (got / 7).backward()
    n_targets = int((targets != IGNORE_INDEX).sum())
    # the same terms as torch's, reordered sums: (targets x vocab) * eps for the loss,
    # a few eps per gradient entry
    torch.testing.assert_close(got, expected, rtol=reordered_sum_rtol(n_targets * logits.size(-1)), atol=0)
    torch.testing.assert_close(leaf.grad, reference_input.grad, rtol=8 * EPS_FP32, atol=1e-7)
    assert leaf.grad[targets == IGNORE_INDEX].abs().sum() == 0
