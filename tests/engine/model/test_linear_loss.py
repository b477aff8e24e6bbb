"""linear_cross_entropy_sum: the LM head and the loss fused chunk by chunk, against the plain full-logits
path."""

import pytest
import torch

from fastlm.engine.model.linear_loss import linear_cross_entropy_sum, reference_linear_cross_entropy_sum
from tests.support.allocations import full_size_allocations
from tests.support.linear_loss import (
    IGNORE,
    TOKENS,
    VOCAB,
    inputs,
    loss_and_grads,
    packed_batch,
    step_loss_and_grads,
    tiny_llama,
)
from tests.support.tolerances import (
    BF16_VS_FP32,
    OTHER_FP32_KERNEL,
    OTHER_FP32_KERNEL_GRAD,
    reordered_sum_rtol,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 7, TOKENS])  # one token per chunk, a ragged last chunk, one chunk
@pytest.mark.parametrize("bias", [True, False])
def test_the_fused_loss_gives_the_plain_paths_loss_and_gradients(smoothing, chunk, bias):
    hidden, weight, b, targets = inputs(bias=bias)
    expected, expected_grads = loss_and_grads(
        reference_linear_cross_entropy_sum, hidden, weight, b, targets, label_smoothing=smoothing
    )
    got, grads = loss_and_grads(
        linear_cross_entropy_sum, hidden, weight, b, targets, label_smoothing=smoothing, chunk_tokens=chunk
    )
    # the same terms, summed per chunk: the loss a reordered sum;
    # the weight gradient sums tokens chunk by chunk
    torch.testing.assert_close(got, expected, rtol=reordered_sum_rtol(TOKENS * VOCAB), atol=0)
    torch.testing.assert_close(grads[0], expected_grads[0], **OTHER_FP32_KERNEL)
    torch.testing.assert_close(grads[1], expected_grads[1], **OTHER_FP32_KERNEL_GRAD)
    if bias:
        torch.testing.assert_close(grads[2], expected_grads[2], **OTHER_FP32_KERNEL_GRAD)
    assert grads[0][targets == IGNORE].abs().sum() == 0  # no target: no gradient into its hidden state


def test_bf16_inputs_accumulate_in_fp32_and_get_bf16_gradients():
    hidden, weight, b, targets = inputs()
    expected, expected_grads = loss_and_grads(reference_linear_cross_entropy_sum, hidden, weight, b, targets)
    half = [x.to(torch.bfloat16) for x in (hidden, weight, b)]
    got, grads = loss_and_grads(linear_cross_entropy_sum, *half[:2], half[2], targets, chunk_tokens=5)
    assert got.dtype == torch.float32 and [g.dtype for g in grads] == [torch.bfloat16] * 3
    torch.testing.assert_close(got, expected, rtol=2 * BF16_VS_FP32["rtol"], atol=0)  # inputs rounded to bf16
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad.float(), want, rtol=0.05, atol=0.05 * want.abs().max().item())


def test_no_tokens_by_vocab_buffer_is_made():
    hidden, weight, b, targets = inputs()
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, b)]

    def step():
        linear_cross_entropy_sum(leaves[0], leaves[1], targets, leaves[2], chunk_tokens=4).backward()

    assert full_size_allocations(step, TOKENS * VOCAB) == 0
    plain = [x.clone().requires_grad_() for x in (hidden, weight, b)]
    assert (
        full_size_allocations(
            lambda: reference_linear_cross_entropy_sum(plain[0], plain[1], targets, plain[2]).backward(),
            TOKENS * VOCAB,
        )
        >= 2
    )


def test_a_shape_mismatch_is_one_clear_error():
    hidden, weight, _, targets = inputs()
    with pytest.raises(ValueError, match=r"hidden \[tokens, d\] and weight \[vocab, d\]"):
        linear_cross_entropy_sum(hidden, weight.T, targets)


# --- in a training step ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("variant", "smoothing"), [("full", 0.0), ("full", 0.1), ("lora", 0.0)])
def test_a_training_step_with_the_fused_head_equals_the_plain_one(variant, smoothing):
    """Packed rows, prompt tokens unscored, the head kept to the target positions: the fused step's loss and
    every gradient match the plain head's (a LoRA model: the adapters' gradients)."""
    from fastlm.engine.model.linear_loss import fused_head_choice

    model = tiny_llama()
    if variant == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    head, why = fused_head_choice(model, True)
    assert head is not None and "fused" in why
    batches = [packed_batch(VOCAB), packed_batch(VOCAB)]
    plain_loss, plain = step_loss_and_grads(model, batches, label_smoothing=smoothing)
    fused_loss, fused = step_loss_and_grads(model, batches, label_smoothing=smoothing, fused_head=head)
    assert plain.keys() == fused.keys() and len(fused) > 2
    # the head's matmul chunk by chunk vs whole, then reordered sums over the tokens
    torch.testing.assert_close(fused_loss, plain_loss, **OTHER_FP32_KERNEL)
    for name, grad in fused.items():
        torch.testing.assert_close(grad, plain[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
    assert head.forward.__func__ is torch.nn.Linear.forward  # the head is itself again


def test_auto_fuses_large_vocabularies_and_says_why_not_elsewhere(caplog):
    from fastlm.engine.model.linear_loss import FUSED_MIN_VOCAB, fused_head_choice

    large = tiny_llama(FUSED_MIN_VOCAB)
    assert fused_head_choice(large, "auto")[0] is large.lm_head
    head, why = fused_head_choice(tiny_llama(), "auto")
    assert head is None and f"vocabulary of {VOCAB}" in why
    assert fused_head_choice(tiny_llama(FUSED_MIN_VOCAB), False)[0] is None
    assert fused_head_choice(tiny_llama(), True)[0] is not None  # FSDP2 too: tests/engine/distributed
    capped = tiny_llama()
    capped.config.final_logit_softcapping = 30.0
    with caplog.at_level("WARNING"):
        head, why = fused_head_choice(capped, True)
    assert head is None and "soft-capping" in why and "train.loss.fused_linear is true" in caplog.text


def test_a_run_with_the_fused_head_trains_as_one_with_the_plain_head(tmp_path):
    from tests.support.tolerances import TRAINED_FP32_LOSS_REL
    from tests.support.toy_training import run_toy, toy_params

    steps = {
        "max_steps": 4,
        "log_every": 1,
        "eval_every": 4,
        "runtime": {"precision": "fp32", "compile": False},
    }
    plain = run_toy(toy_params(tmp_path / "plain", loss={"fused_linear": False}, **steps))
    fused = run_toy(toy_params(tmp_path / "fused", loss={"fused_linear": True}, **steps))
    assert fused.summary["fused_linear"] is True and plain.summary["fused_linear"] is False
    assert [r["loss"] for r in fused.history] == pytest.approx(
        [r["loss"] for r in plain.history], rel=TRAINED_FP32_LOSS_REL
    )  # two kernels
    assert fused.eval_history[-1]["val_loss"] == pytest.approx(
        plain.eval_history[-1]["val_loss"], rel=TRAINED_FP32_LOSS_REL
    )
