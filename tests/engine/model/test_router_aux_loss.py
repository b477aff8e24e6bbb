"""A mixture-of-experts model whose config sets ``output_router_logits: true`` trains with transformers'
router load-balancing loss (``router_aux_loss_coef * aux_loss``) added to the token-normalised
cross-entropy, on the plain and the fused-head paths, once per optimizer step whatever the gradient
accumulation: each micro-batch adds ``coef * aux / micro_batches``, so the step's objective is the
cross-entropy over all its targets plus the coefficient times the micro-batches' mean aux loss (with one
micro-batch: exactly the model's own ``model(**batch, labels=labels).loss``)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from fastlm.engine.data.schema import IGNORE_INDEX, TARGET_POSITIONS
from fastlm.engine.model.accumulation import accumulate_gradients
from fastlm.engine.model.loss import positions_to_keep, router_loss_choice
from fastlm.errors import ConfigError
from tests.support.tolerances import OTHER_FP32_KERNEL

pytestmark = pytest.mark.kernels  # compares two computations

VOCAB, COEF = 96, 0.5


def tiny_moe(output_router_logits: bool = True) -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        output_router_logits=output_router_logits,
        router_aux_loss_coef=COEF,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    return Qwen3MoeForCausalLM(config).float().train()


def batch(seed: int, rows: int = 2, length: int = 10) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (rows, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, -3:] = 0  # right padding on the first row
    labels = input_ids.clone()
    labels[attention_mask == 0] = IGNORE_INDEX
    labels[:, :3] = IGNORE_INDEX  # a prompt
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def grads(model) -> dict[str, torch.Tensor]:
    out = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def model_loss_and_grads(model, batches):
    """The model's own loss (cross-entropy + coef * aux) per micro-batch; for several, the cross-entropy
    weighted by target tokens and the aux loss averaged."""
    counts = [int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches]
    total = 0.0
    for each, count in zip(batches, counts, strict=True):
        out = model(**each)
        ce = out.loss - COEF * out.aux_loss
        loss = ce * count / sum(counts) + COEF * out.aux_loss / len(batches)
        loss.backward()
        total = total + loss.detach()
    return total, grads(model)


@pytest.mark.parametrize("kept", [False, True], ids=["every-logit", "kept-positions"])
@pytest.mark.parametrize("fused", [False, True], ids=["plain-head", "fused-head"])
def test_router_aux_loss_is_trained_and_logged_like_the_models_own_loss(fused, kept):
    model = tiny_moe()
    batches = [batch(1)]
    expected, expected_grads = model_loss_and_grads(model, batches)
    assert float(model(**batches[0]).aux_loss.detach()) > 0  # the router loss is on and non-zero
    head = model.lm_head if fused else None
    ours = dict(batches[0])
    if kept:  # logits only where a label is predicted (logits_to_keep): the router still sees every token
        ours[TARGET_POSITIONS] = positions_to_keep(ours["labels"], torch.device("cpu"), flattened=False)
        assert ours[TARGET_POSITIONS] is not None
    loss_sum, total = accumulate_gradients(model, [ours], fused_head=head)
    torch.testing.assert_close(loss_sum / total, expected, **OTHER_FP32_KERNEL)
    got = grads(model)
    router = [name for name in expected_grads if "mlp.gate." in name]
    assert router, "the tiny model has router weights"
    for name in router:  # the router only gets a gradient through the aux loss's share
        torch.testing.assert_close(got[name], expected_grads[name], **OTHER_FP32_KERNEL)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got[name], grad, **OTHER_FP32_KERNEL)


def test_router_aux_loss_counts_once_per_step_under_gradient_accumulation():
    model = tiny_moe()
    batches = [batch(2, rows=1), batch(3, rows=3)]
    expected, expected_grads = model_loss_and_grads(model, batches)
    loss_sum, total = accumulate_gradients(model, batches)
    torch.testing.assert_close(loss_sum / total, expected, **OTHER_FP32_KERNEL)
    got = grads(model)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got[name], grad, **OTHER_FP32_KERNEL)


def test_without_router_logits_the_loss_is_the_cross_entropy_alone():
    model = tiny_moe(output_router_logits=False)
    each = batch(4)
    expected = model(**each).loss
    loss_sum, total = accumulate_gradients(model, [each])
    torch.testing.assert_close(loss_sum / total, expected.detach(), **OTHER_FP32_KERNEL)


def test_the_run_says_the_training_loss_includes_the_router_loss():
    assert "router_aux_loss_coef 0.5 x aux_loss" in router_loss_choice(tiny_moe())
    assert router_loss_choice(tiny_moe(output_router_logits=False)) == ""


def test_packed_rows_with_a_dense_mask_are_refused_in_one_line():
    model = tiny_moe()
    each = batch(5)
    rows, length = each["input_ids"].shape
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    each["attention_mask"] = causal.expand(rows, 1, length, length)  # packed rows on sdpa: the dense mask
    with pytest.raises(ConfigError, match=r"output_router_logits: true .* Fix: set train.batching.mode"):
        accumulate_gradients(model, [each])
