"""linear_cross_entropy_sum: the LM head and the loss fused chunk by chunk, against the plain full-logits
path."""

import pytest
import torch

from fastlm.engine.model.linear_loss import linear_cross_entropy_sum, reference_linear_cross_entropy_sum
from tests.support.allocations import full_size_allocations, matrix_products
from tests.support.linear_loss import (
    HIDDEN,
    IGNORE,
    RANK,
    TOKENS,
    VOCAB,
    inputs,
    lora_head_model,
    loss_and_grads,
    packed_batch,
    seeded_step,
    step_loss_and_grads,
    tiny_llama,
)
from tests.support.lora_checks import nonzero_lora_b
from tests.support.tolerances import (
    BF16_VS_FP32,
    OTHER_FP32_KERNEL,
    OTHER_FP32_KERNEL_GRAD,
    reordered_sum_rtol,
)

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
# tokens per chunk, vocabulary rows per weight-gradient block: one each; ragged last ones; one of each
@pytest.mark.parametrize(("chunk", "block"), [(1, 1), (7, 13), (TOKENS, None)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_fused_loss_gives_the_plain_paths_loss_and_gradients(smoothing, chunk, block, bias):
    hidden, weight, b, targets = inputs(bias=bias)
    expected, expected_grads = loss_and_grads(
        reference_linear_cross_entropy_sum, hidden, weight, b, targets, label_smoothing=smoothing
    )
    got, grads = loss_and_grads(
        linear_cross_entropy_sum,
        hidden,
        weight,
        b,
        targets,
        label_smoothing=smoothing,
        chunk_tokens=chunk,
        vocab_block=block,
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


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_under_bf16_autocast_the_heads_products_run_in_bf16(smoothing):
    """A full fine-tune under bf16 autocast keeps fp32 weights, and the plain head's matmul runs in bf16 there
    (autocast): so do the fused head's, at the matrix units' bf16 speed (fp32 products ran 3.4x slower than
    the plain head on a 128k vocabulary on CPU). The loss, softmax and gradient sums stay fp32: the loss and
    gradients are the fp32 path's within bf16's rounding of the products' inputs, in the leaves' dtype."""
    hidden, weight, b, targets = inputs()
    expected, expected_grads = loss_and_grads(
        reference_linear_cross_entropy_sum, hidden, weight, b, targets, label_smoothing=smoothing
    )
    result = []

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            result.append(
                loss_and_grads(
                    linear_cross_entropy_sum,
                    hidden,
                    weight,
                    b,
                    targets,
                    label_smoothing=smoothing,
                    chunk_tokens=5,
                    vocab_block=64,
                )
            )

    products = matrix_products(step)
    assert len(products) >= 3 and {dtypes for _, _, dtypes in products} == {(torch.bfloat16,) * 2}, products
    got, grads = result[0]
    assert got.dtype == torch.float32 and [g.dtype for g in grads] == [torch.float32] * 3
    torch.testing.assert_close(got, expected, rtol=2 * BF16_VS_FP32["rtol"], atol=0)  # inputs rounded to bf16
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=0.05, atol=0.05 * want.abs().max().item())


def _weight_gradient_sums(**kwargs) -> list[int]:
    """How many terms each product that yields the hidden size's columns sums (the hidden states' gradient:
    the vocabulary; the weight's: tokens)."""
    hidden, weight, b, targets = inputs()
    products = matrix_products(
        lambda: loss_and_grads(linear_cross_entropy_sum, hidden, weight, b, targets, **kwargs)
    )
    return [a[1] for _, (a, out_columns), _ in products if out_columns[-1] == HIDDEN]


@pytest.mark.parametrize("chunk", [1, 7])
def test_with_16_bit_products_the_heads_weight_gradient_is_one_product_over_all_the_tokens_per_block(chunk):
    """Summing dW += g_c.T @ h_c chunk by chunk reads and writes the whole fp32 [vocab x d] gradient once per
    chunk of tokens: 130 tokens for a 128k vocabulary, some 50x the chunk's logits in memory traffic, in fp32
    products too thin (130 terms per sum) for the matrix units. Under bf16 autocast each block of vocabulary
    rows of the weight's gradient is one product over all the tokens instead, written once."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sums = _weight_gradient_sums(chunk_tokens=chunk)
    assert TOKENS in sums and set(sums) <= {TOKENS, VOCAB}, sums


def test_fp32_products_on_a_cpu_sum_the_weight_gradient_chunk_by_chunk():
    """fp32 products on a CPU are bound by their arithmetic, which the blocks' recomputed logits add to: the
    chunk sums measured 1.15-1.2x faster there (docs/benchmarks.md). A ``vocab_block`` given: blocks."""
    from fastlm.engine.model.linear_loss import weight_gradient_by_block

    assert 7 in _weight_gradient_sums(chunk_tokens=7)
    assert set(_weight_gradient_sums(chunk_tokens=7, vocab_block=50)) == {TOKENS, VOCAB}
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert not weight_gradient_by_block(torch.float32, cpu)
    assert all(weight_gradient_by_block(dtype, cpu) for dtype in (torch.bfloat16, torch.float16))
    assert weight_gradient_by_block(torch.float32, gpu)  # the [vocab x d] traffic, at GPU speeds


@pytest.mark.parametrize("block", [None, 50])  # the chunk sums (fp32 on CPU), the vocabulary blocks
def test_a_banned_token_with_a_minus_infinite_bias_leaves_loss_and_gradients_finite(block):
    """A bias of -inf bans a token (column 0 here, the column ignored rows point at): the loss and every
    gradient stay the plain path's, no NaN from an ignored row's -inf times 0."""
    hidden, weight, b, targets = inputs()
    b[0] = float("-inf")
    expected, expected_grads = loss_and_grads(reference_linear_cross_entropy_sum, hidden, weight, b, targets)
    got, grads = loss_and_grads(
        linear_cross_entropy_sum, hidden, weight, b, targets, chunk_tokens=7, vocab_block=block
    )
    torch.testing.assert_close(got, expected, rtol=reordered_sum_rtol(TOKENS * VOCAB), atol=0)
    for grad, want in zip(grads, expected_grads, strict=True):
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, want, **OTHER_FP32_KERNEL_GRAD)


def test_a_second_backward_through_the_same_graph_raises_rather_than_scaling_twice():
    """The saved gradients are scaled in place in the backward (no second [vocab x d] buffer): a second
    backward (retain_graph) must not scale them again silently."""
    hidden, weight, b, targets = inputs()
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, b)]
    loss = linear_cross_entropy_sum(leaves[0], leaves[1], targets, leaves[2])
    (loss / 5).backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_no_tokens_by_vocab_buffer_is_made():
    hidden, weight, b, targets = inputs()
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, b)]

    def step():
        linear_cross_entropy_sum(
            leaves[0], leaves[1], targets, leaves[2], chunk_tokens=4, vocab_block=50
        ).backward()

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


def soft_capped(kind: str) -> torch.nn.Module:
    """A tiny model whose forward soft-caps the logits after the head under a config name of its own: a
    multimodal Gemma-4 (its text config's ``final_logit_softcapping``, as Gemma-3n's), a RecurrentGemma
    (``logits_soft_cap``)."""
    import transformers as t

    from tests.support.tiny_models import multimodal_gemma4

    torch.manual_seed(0)
    if kind == "gemma4":
        text = {
            "vocab_size": VOCAB,
            "vocab_size_per_layer_input": VOCAB,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "hidden_size_per_layer_input": 8,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "final_logit_softcapping": 3.0,
        }
        model = multimodal_gemma4(text)
    else:
        config = t.RecurrentGemmaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            lru_width=32,
            attention_window_size=16,
            block_types=["recurrent", "attention"],
            logits_soft_cap=3.0,
        )
        model = t.RecurrentGemmaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model


@pytest.mark.parametrize("kind", ["gemma4", "recurrent_gemma"])
def test_a_model_that_soft_caps_its_logits_under_another_name_keeps_the_plain_head(kind, caplog):
    """The fused loss multiplies the head's weight itself: a soft-capping after the head would be skipped, a
    silently other loss (and a 262k vocabulary is fused under auto). Gemma-3n/4's multimodal classes read it
    from their text config, RecurrentGemma from ``logits_soft_cap``: both keep the plain head, said, and a
    step trains exactly as with ``fused_linear: false``."""
    from fastlm.engine.model.linear_loss import fused_head_choice

    model = soft_capped(kind)
    with caplog.at_level("WARNING"):
        head, why = fused_head_choice(model, True)
    assert head is None and "soft-capping" in why and "train.loss.fused_linear is true" in caplog.text
    batches = [packed_batch(VOCAB - 8)]
    plain_loss, plain = step_loss_and_grads(model, batches)
    chosen_loss, chosen = step_loss_and_grads(model, batches, fused_head=head)
    assert torch.equal(chosen_loss, plain_loss) and all(torch.equal(chosen[n], g) for n, g in plain.items())


def test_a_lora_run_that_trains_a_copy_of_the_head_fuses_that_copy():
    """``lora.modules_to_save: [lm_head]`` (a head trained in full beside the adapters, e.g. for added
    tokens): peft's wrapper computes the logits with its trained copy, a plain Linear. That copy is fused: no
    [tokens x vocab] logits (the plain head's would be 4 GB for a 128k vocabulary), the same loss and
    gradients as the plain head's, the copy's weight among them; the frozen original stays untouched."""
    from peft import LoraConfig, get_peft_model

    from fastlm.engine.model.linear_loss import fused_head_choice

    model = get_peft_model(
        tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    )
    wrapper = model.get_output_embeddings()
    copy = wrapper.modules_to_save["default"]
    head, why = fused_head_choice(model, True)
    assert head is copy and "fused" in why and "trained copy" in why
    batches = [packed_batch(VOCAB), packed_batch(VOCAB)]
    plain_loss, plain = step_loss_and_grads(model, batches)
    fused_loss, fused = step_loss_and_grads(model, batches, fused_head=head)
    assert plain.keys() == fused.keys() and any("modules_to_save" in name for name in fused)
    torch.testing.assert_close(fused_loss, plain_loss, **OTHER_FP32_KERNEL)
    for name, grad in fused.items():
        torch.testing.assert_close(grad, plain[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
    assert wrapper.original_module.weight.grad is None
    model.disable_adapter_layers()  # the original head computes: nothing to fuse of the copy
    assert fused_head_choice(model, True)[0] is None


def test_a_trained_head_copy_over_a_bf16_base_fuses_under_bf16_autocast():
    """The copy trains in fp32 over a bf16 frozen base (``lora.apply_lora``: its input cast to fp32 by a
    hook): fused, its products run in autocast's bf16 as the plain copy's matmul does, the loss and the
    trained gradients the plain step's within bf16's rounding."""
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.model import lora
    from fastlm.engine.model.linear_loss import fused_head_choice

    raw = {"model": {"lora": {"enabled": True, "r": 4, "modules_to_save": ["lm_head"]}}}
    model = lora.apply_lora(
        tiny_llama().to(torch.bfloat16), parse_train_params(raw).model.lora, gradient_checkpointing="off"
    )
    head, _ = fused_head_choice(model, True)
    assert head is not None and head.weight.dtype == torch.float32 and head.weight.requires_grad
    batches = [packed_batch(VOCAB)]

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    plain_loss, plain = step_loss_and_grads(model, batches, autocast=autocast)
    fused_loss, fused = step_loss_and_grads(model, batches, autocast=autocast, fused_head=head)
    assert plain.keys() == fused.keys() and all(g.dtype == torch.float32 for g in fused.values())
    torch.testing.assert_close(fused_loss, plain_loss, rtol=BF16_VS_FP32["rtol"], atol=0)
    for name, grad in fused.items():
        want = plain[name]
        torch.testing.assert_close(grad, want, rtol=0.05, atol=0.05 * want.abs().max().item(), msg=name)


def test_a_fused_run_validates_through_its_fused_head(tmp_path, monkeypatch):
    """The validation of a run with the fused head (every ``eval_every``, micro-batches of the training's
    size) runs its loss through that head too, no logits, and reports the plain head's validation loss."""
    from tests.support.tolerances import TRAINED_FP32_LOSS_REL
    from tests.support.toy_training import run_toy, toy_params

    through = fused_validation_heads(monkeypatch)
    steps = {
        "max_steps": 2,
        "log_every": 1,
        "eval_every": 2,
        "runtime": {"precision": "fp32", "compile": False},
    }
    plain = run_toy(toy_params(tmp_path / "plain", loss={"fused_linear": False}, **steps))
    assert through == []
    fused = run_toy(toy_params(tmp_path / "fused", loss={"fused_linear": True}, **steps))
    assert through and all(type(head) is torch.nn.Linear for head in through)
    assert fused.eval_history[-1]["val_loss"] == pytest.approx(
        plain.eval_history[-1]["val_loss"], rel=TRAINED_FP32_LOSS_REL
    )


# --- a LoRA-adapted head -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("chunk", "block"), [(1, 1), (7, 13), (TOKENS, None)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_more_columns_of_a_weight_kept_apart_give_the_concatenated_heads_loss_and_gradients(
    chunk, block, smoothing
):
    """A LoRA head's logits are ``cat([x, s A x]) @ cat([W, B], 1).T``: the adapter's ``B`` given apart
    (``up``), never concatenated to the ``[vocab x d]`` weight, gives the loss and every gradient of the
    concatenated head's plain path (the weight trained too: its gradient by blocks, ``vocab_block``)."""
    hidden, weight, b, targets = inputs()
    generator = torch.Generator().manual_seed(1)
    down = torch.randn(TOKENS, RANK, generator=generator)
    up = torch.randn(VOCAB, RANK, generator=generator) / RANK**0.5
    wide = torch.cat([hidden, down], 1)
    expected, expected_grads = loss_and_grads(
        reference_linear_cross_entropy_sum,
        wide,
        torch.cat([weight, up], 1),
        b,
        targets,
        label_smoothing=smoothing,
    )
    leaves = [x.clone().requires_grad_() for x in (wide, weight, b, up)]
    got = linear_cross_entropy_sum(
        leaves[0],
        leaves[1],
        targets,
        leaves[2],
        up=leaves[3],
        label_smoothing=smoothing,
        chunk_tokens=chunk,
        vocab_block=block,
    )
    (got / 5).backward()
    torch.testing.assert_close(got.detach(), expected, rtol=reordered_sum_rtol(TOKENS * VOCAB), atol=0)
    torch.testing.assert_close(leaves[0].grad, expected_grads[0], **OTHER_FP32_KERNEL)
    torch.testing.assert_close(leaves[1].grad, expected_grads[1][:, :HIDDEN], **OTHER_FP32_KERNEL_GRAD)
    torch.testing.assert_close(leaves[3].grad, expected_grads[1][:, HIDDEN:], **OTHER_FP32_KERNEL_GRAD)
    torch.testing.assert_close(leaves[2].grad, expected_grads[2], **OTHER_FP32_KERNEL_GRAD)


@pytest.mark.parametrize("kind", ["peft", "fastlm"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_lora_adapted_head_fuses_with_the_plain_heads_loss_and_gradients(kind, dropout):
    """LoRA on the head (``target_modules`` listing ``lm_head``, e.g. to adapt a 128k vocabulary's output
    distribution) kept the plain head: ``[tokens x vocab]`` logits and their gradient on the runs the fused
    loss is for. Its logits are ``x W^T + s B A drop(x)``: the hidden states with the adapter's r columns
    ``s A drop(x)`` (computed where the head's forward computes them: the same dropout mask) against
    ``[W, B]``. Fused, the loss and the gradients of the head's A and B, of the earlier layers' adapters
    (through the hidden states) match the plain peft forward's, dropout included; W stays frozen."""
    from fastlm.engine.model.linear_loss import fused_head_choice

    model = lora_head_model(kind, dropout)
    model.train()
    wrapper = model.get_output_embeddings()
    head, why = fused_head_choice(model, True)
    assert head is wrapper and "fused" in why and "LoRA" in why, why
    batches = [packed_batch(VOCAB), packed_batch(VOCAB, layout=((9, 3), (14, 5), (8, 0)))]
    plain_loss, plain = seeded_step(model, batches)
    fused_loss, fused = seeded_step(model, batches, fused_head=head)
    assert plain.keys() == fused.keys()
    assert {"lm_head.lora_A", "lm_head.lora_B", "q_proj.lora_A"} <= {
        ".".join(name.split(".")[-4:-2]) for name in fused
    }, sorted(fused)
    torch.testing.assert_close(fused_loss, plain_loss, **OTHER_FP32_KERNEL)
    for name, grad in fused.items():
        torch.testing.assert_close(grad, plain[name], **OTHER_FP32_KERNEL_GRAD, msg=name)
    assert wrapper.get_base_layer().weight.grad is None
    assert "forward" not in vars(wrapper)  # the head is itself again
    if dropout:  # the masks matter: another seed, another loss
        torch.manual_seed(12)
        other, _ = step_loss_and_grads(model, batches, fused_head=head)
        assert not torch.allclose(other, fused_loss, **OTHER_FP32_KERNEL)


@pytest.mark.parametrize("base_dtype", [torch.float32, torch.bfloat16])
def test_a_lora_adapted_head_under_bf16_autocast_multiplies_in_bf16(base_dtype):
    """As the plain fused head: the products in autocast's bf16 (the adapter's columns too), the loss and
    the sums fp32; the loss and the trained gradients (fp32 adapters, over an fp32 or a bf16 frozen base)
    the plain step's within bf16's rounding."""
    model = lora_head_model("fastlm", base_dtype=base_dtype)
    from fastlm.engine.model.linear_loss import fused_head_choice

    head, _ = fused_head_choice(model, True)
    assert head is model.get_output_embeddings()
    batches = [packed_batch(VOCAB)]

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    plain_loss, plain = step_loss_and_grads(model, batches, autocast=autocast)
    result = []
    products = matrix_products(
        lambda: result.append(step_loss_and_grads(model, batches, autocast=autocast, fused_head=head))
    )
    vocab_wide = [p for p in products if VOCAB in p[1][0] + p[1][1]]
    assert len(vocab_wide) >= 3 and {dtypes for _, _, dtypes in vocab_wide} == {(torch.bfloat16,) * 2}
    fused_loss, fused = result[0]
    assert plain.keys() == fused.keys() and all(g.dtype == torch.float32 for g in fused.values())
    torch.testing.assert_close(fused_loss, plain_loss, rtol=BF16_VS_FP32["rtol"], atol=0)
    for name, grad in fused.items():
        want = plain[name]
        torch.testing.assert_close(grad, want, rtol=0.05, atol=0.05 * want.abs().max().item(), msg=name)


def test_a_lora_adapted_head_makes_no_tokens_by_vocab_logits_in_training_or_validation(monkeypatch):
    """Chunks of 4 tokens: no tensor of more than 4 vocabulary-wide rows in a fused training step or a fused
    validation batch (``evaluation._fused_loss_sum``, the run's head), whose loss is the plain one's."""
    from fastlm.engine.evaluate import evaluation
    from fastlm.engine.model import linear_loss
    from fastlm.engine.model.accumulation import FusedHead
    from fastlm.engine.model.loss import forward_logits, shift_labels
    from tests.support.allocations import vocab_wide_rows

    model = lora_head_model("fastlm", dropout=0.1)
    head, _ = linear_loss.fused_head_choice(model, True)
    batch = packed_batch(VOCAB)
    monkeypatch.setattr(linear_loss, "LINEAR_CE_CHUNK_ELEMENTS", 4 * VOCAB)
    assert vocab_wide_rows(lambda: step_loss_and_grads(model, [batch], fused_head=head), VOCAB) <= 4
    assert vocab_wide_rows(lambda: step_loss_and_grads(model, [batch]), VOCAB) > 16
    model.eval()
    with torch.no_grad():
        got = []
        assert (
            vocab_wide_rows(
                lambda: got.append(evaluation._fused_loss_sum(model, batch, FusedHead(head))), VOCAB
            )
            <= 4
        )
        logits = forward_logits(model, batch)
        targets = shift_labels(batch["labels"], IGNORE).reshape(-1)
        want = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB).float(), targets, ignore_index=IGNORE, reduction="sum"
        )
    loss_sum, count = got[0]
    assert int(count) == int((targets != IGNORE).sum())
    torch.testing.assert_close(loss_sum, want, rtol=reordered_sum_rtol(int(count) * VOCAB), atol=0)
    assert all(p.grad is None for p in model.parameters())


class _QuantizedLinear(torch.nn.Linear):
    """A Linear subclass computing its own product (as bitsandbytes' or float8's layers do)."""


def _quantized_base(model):
    model.get_output_embeddings().base_layer.__class__ = _QuantizedLinear


def _two_adapters(model):
    from peft import LoraConfig

    model.add_adapter("other", LoraConfig(r=2, target_modules=["lm_head"]))
    model.base_model.set_adapter(["default", "other"])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda m: None, None),
        ("use_dora", "DoRA"),
        ("lora_bias", "bias"),
        (_two_adapters, "2 active adapters"),
        (lambda m: m.disable_adapter_layers(), "disabled or merged"),
        (lambda m: m.get_output_embeddings().merge(), "disabled or merged"),
        (lambda m: setattr(m.get_output_embeddings(), "fan_in_fan_out", True), "fan_in_fan_out"),
        (_quantized_base, "adapts a _QuantizedLinear, not a plain Linear"),
    ],
)
def test_a_lora_head_that_cannot_be_fused_exactly_keeps_the_plain_head_and_says_why(change, says, caplog):
    from fastlm.engine.model.linear_loss import fused_head_choice

    if isinstance(change, str):
        model = lora_head_model("peft", **{change: True})
    else:
        model = lora_head_model("peft")
        change(model)
    with caplog.at_level("WARNING"):
        head, why = fused_head_choice(model, True)
    if says is None:
        assert head is model.get_output_embeddings() and "fused" in why
        return
    assert head is None and "plain LM head" in why and says in why, why
    assert "train.loss.fused_linear is true" in caplog.text


def test_a_run_with_lora_on_the_head_trains_fused_as_one_with_the_plain_head(tmp_path, monkeypatch):
    """``lora.target_modules`` listing ``lm_head`` and ``loss.fused_linear: true``: the run's summary says
    fused, its losses and validation loss (through the adapted head too) are the plain head's."""
    from fastlm.engine.model.lora import apply_lora
    from tests.support.tolerances import TRAINED_FP32_LOSS_REL
    from tests.support.toy_training import run_toy, toy_model, toy_params

    through = fused_validation_heads(monkeypatch)
    lora = {"enabled": True, "r": 4, "dropout": 0.1, "target_modules": ["q_proj", "v_proj", "lm_head"]}
    steps = {
        "max_steps": 4,
        "log_every": 1,
        "eval_every": 4,
        "runtime": {"precision": "fp32", "compile": False},
        "model": {"lora": lora},
    }

    def adapted(params):
        model = apply_lora(toy_model(), params.model.lora, gradient_checkpointing=False)
        nonzero_lora_b(model)
        return model

    runs = {}
    for name, fused_linear in (("plain", False), ("fused", True)):
        params = toy_params(tmp_path / name, loss={"fused_linear": fused_linear}, **steps)
        runs[name] = run_toy(params, model=adapted(params))
    plain, fused = runs["plain"], runs["fused"]
    assert fused.summary["fused_linear"] is True, fused.summary["fused_linear_choice"]
    assert "LoRA" in fused.summary["fused_linear_choice"]
    assert plain.summary["fused_linear"] is False
    assert through and all(hasattr(head, "lora_A") for head in through)
    assert [r["loss"] for r in fused.history] == pytest.approx(
        [r["loss"] for r in plain.history], rel=TRAINED_FP32_LOSS_REL
    )
    assert fused.eval_history[-1]["val_loss"] == pytest.approx(
        plain.eval_history[-1]["val_loss"], rel=TRAINED_FP32_LOSS_REL
    )


def fused_validation_heads(monkeypatch) -> list:
    """The heads each validation batch's loss runs through the fused path with (``evaluation._fused_loss_sum``
    recorded from here on)."""
    from fastlm.engine.evaluate import evaluation

    through = []
    fused_loss_sum = evaluation._fused_loss_sum

    def counted(model, batch, fused):
        through.append(fused.head)
        return fused_loss_sum(model, batch, fused)

    monkeypatch.setattr(evaluation, "_fused_loss_sum", counted)
    return through
