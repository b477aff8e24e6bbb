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

from fastlm.engine.data.schema import IGNORE_INDEX, TARGET_POSITIONS, VARLEN_REAL_TOKENS
from fastlm.engine.model.accumulation import accumulate_gradients
from fastlm.engine.model.loss import positions_to_keep, router_aux_loss, router_loss_choice
from fastlm.errors import ConfigError
from tests.support.tolerances import OTHER_FP32_KERNEL, OTHER_FP32_KERNEL_GRAD, OTHER_FP32_MODEL

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


# --- varlen paths: the row's padding tail is no text to route -----------------------------------------------

# Samples of 9 + 14 + 5 tokens: 28, not a multiple of VARLEN_ROW_MULTIPLE (16), so the varlen row ends in 4
# padding tokens; 7 + 9 = 16 leaves none.
TAILED, UNTAILED = (9, 14, 5), (7, 9)


def features(lengths, seed: int = 6) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [
        {"input_ids": torch.randint(3, VOCAB, (n,), generator=generator).tolist(), "prompt_length": 2}
        for n in lengths
    ]


def on_path(model, host: dict, attn: str):
    """The micro-batch as the engine gives it to ``attn`` (``inputs.to_device``), and its weighted router
    loss, step loss and router-weight gradients (``accumulate_gradients``)."""
    from fastlm.engine.model.attention.inputs import to_device
    from fastlm.engine.model.loss import training_outputs

    model.config._attn_implementation = attn
    moved = to_device(dict(host), torch.device("cpu"), attn)
    with torch.no_grad():
        aux = training_outputs(model, moved)[2]
    loss_sum, total = accumulate_gradients(model, [moved])
    router = {name: grad for name, grad in grads(model).items() if "mlp.gate." in name}
    return moved, aux, loss_sum / total, router


def padded(lengths) -> dict:
    from fastlm.engine.data import DynamicPaddingCollator

    return DynamicPaddingCollator(pad_id=0, pad_to_multiple_of=None)(features(lengths))


def assert_same_router_loss(got, expected):
    """A varlen row against padded rows: the router logits come out of another attention layout, so they
    differ by a tiny model's fp32 rounding (``OTHER_FP32_MODEL``); the top-k picks and the mean over the
    same real tokens are then the same, and the router gradient has the backward's room."""
    _, aux, loss, router = got
    _, expected_aux, expected_loss, expected_router = expected
    torch.testing.assert_close(aux, expected_aux, **OTHER_FP32_MODEL)
    torch.testing.assert_close(loss, expected_loss, **OTHER_FP32_MODEL)
    assert router.keys() == expected_router.keys() and router
    for name, grad in expected_router.items():
        torch.testing.assert_close(router[name], grad, **OTHER_FP32_KERNEL_GRAD)


def tiny_mixtral():
    """Mixtral: its config names the experts ``num_local_experts``; the model's ``num_experts`` says them."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
        router_aux_loss_coef=COEF,
        max_position_embeddings=64,
    )
    return MixtralForCausalLM(config).float().train()


@pytest.mark.parametrize("family", [tiny_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
@pytest.mark.parametrize(
    ("lengths", "shape"), [(TAILED, (1, 32)), (TAILED[:2], (2, 14))], ids=["padding-tail", "rows-as-they-are"]
)
def test_a_varlen_rows_padding_is_left_out_of_the_router_loss_as_on_padded_rows(lengths, shape, family):
    """The varlen row (no attention mask reaches the model) ends in padding up to a multiple of 16, or keeps
    its rows' padding tails where they make no more than that round-up (``without_padding`` leaves such a
    batch as it is): the router loss and its gradient are those of the same samples on padded rows, where
    transformers' attention mask leaves the padding out."""
    model = family()
    expected = on_path(model, padded(lengths), "sdpa")
    got = on_path(model, padded(lengths), "sdpa_varlen")
    assert tuple(got[0]["input_ids"].shape) == shape and sum(lengths) < got[0]["input_ids"].numel()
    assert_same_router_loss(got, expected)


def test_a_fixed_shape_rows_large_padding_tail_is_left_out_of_the_router_loss():
    """A fixed-shape micro-batch (CUDA graphs: ``PackedCollator.fixed_shape``) pads its varlen row to the
    whole capacity: here 36 padding tokens after 28 real ones."""
    from fastlm.engine.data import PackedCollator
    from fastlm.engine.data.packing import TokenBudget

    model = tiny_moe()
    expected = on_path(model, padded(TAILED), "sdpa")
    collate = PackedCollator(
        pad_id=0,
        budget=TokenBudget(row_length=16, rows_per_batch=4),
        attention_mask_format="none",
        fixed_shape=True,
    )
    got = on_path(model, collate(features(TAILED)), "sdpa_varlen")
    assert got[0]["input_ids"].shape == (1, 64)
    assert_same_router_loss(got, expected)


def test_a_varlen_row_without_a_padding_tail_keeps_the_models_own_router_loss():
    """Nothing to leave out (16 real tokens): the router loss is the model's own, bit for bit (the same
    computation)."""
    from fastlm.engine.data.schema import model_inputs
    from fastlm.engine.model.attention.inputs import to_device
    from fastlm.engine.model.loss import training_outputs

    model = tiny_moe()
    model.config._attn_implementation = "sdpa_varlen"
    moved = to_device(padded(UNTAILED), torch.device("cpu"), "sdpa_varlen")
    assert moved["input_ids"].shape == (1, 16) and VARLEN_REAL_TOKENS not in moved
    with torch.no_grad():
        aux = training_outputs(model, moved)[2]
        own = model(**model_inputs(moved)).aux_loss
    assert torch.equal(aux, own.float() * COEF)


class RoutedElsewhere(torch.nn.Module):
    """A mixture-of-experts model whose modeling module has no ``load_balancing_loss_func``."""

    router_aux_loss_coef = COEF


def test_a_family_without_transformers_balancing_function_keeps_its_own_router_loss_said_once(caplog):
    from types import SimpleNamespace

    outputs = SimpleNamespace(aux_loss=torch.tensor(1.25), router_logits=(torch.zeros(4, 4),))
    real = torch.tensor([[True, True, False, False]])
    with caplog.at_level("WARNING", logger="fastlm.engine.model.loss"):
        values = [router_aux_loss(RoutedElsewhere(), outputs, real) for _ in range(2)]
    assert [float(value) for value in values] == [1.25 * COEF] * 2
    said = [record.getMessage() for record in caplog.records if "router loss" in record.getMessage()]
    assert len(said) == 1 and "RoutedElsewhere has no load_balancing_loss_func" in said[0], said
