"""Issue 19: packed encoder-decoder rows compute exactly what each sample computes alone.

Several prompt/response samples share each encoder row and decoder row (several rows per batch); every
sample's decoder logits, its loss and the gradients of a training step must equal those of the sample run
alone, for BART / mBART (learned absolute positions, restarted by ``seq2seq_hooks``) and T5 (relative position
bias), on SDPA (bool masks) and eager (additive masks). A naive packing (the same rows, plain padding masks,
positions running on across samples) must NOT match: the leak control that shows the check can fail.
"""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.data import Seq2SeqCollator
from fastlm.engine.model.attention.inputs import to_device
from fastlm.engine.model.encoder_decoder import enable_packed_seq2seq
from fastlm.engine.model.loss import causal_lm_loss_sum, forward_logits
from tests.support.tiny_seq2seq import BUDGET, EOS, PAD, packed_batch, samples, tiny_seq2seq
from tests.support.tolerances import OTHER_FP32_KERNEL, OTHER_FP32_KERNEL_GRAD

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


def per_sample(logits: torch.Tensor, batch: dict, index: int) -> torch.Tensor:
    return logits[batch["decoder_segment_ids"] == index]


def alone(model, feature, start: int, attn: str) -> tuple[torch.Tensor, torch.Tensor]:
    batch = to_device(
        Seq2SeqCollator(pad_id=PAD, decoder_start_id=start, pad_to_multiple_of=None)([feature]),
        torch.device("cpu"),
        attn,
    )
    logits = forward_logits(model, batch)
    return logits[0], causal_lm_loss_sum(logits, batch["labels"])[0]


@pytest.mark.parametrize(
    ("kind", "attn"),
    [("bart", "sdpa"), ("bart", "eager"), ("mbart", "sdpa"), ("t5", "sdpa"), ("t5", "eager")],
)
def test_packed_rows_give_every_sample_its_own_logits_and_loss(kind, attn):
    model = tiny_seq2seq(kind, attn).eval()
    enable_packed_seq2seq(model)
    start = model.config.decoder_start_token_id
    features = samples()
    batch = packed_batch(features, start)
    with torch.no_grad():
        logits = forward_logits(model, to_device(batch, torch.device("cpu"), attn))
        packed_sum, packed_targets = causal_lm_loss_sum(logits, batch["labels"])
        single = [alone(model, feature, start, attn) for feature in features]
    for index, (own, _) in enumerate(single):  # a packed row vs the sample alone: another kernel layout
        torch.testing.assert_close(per_sample(logits, batch, index), own, **OTHER_FP32_KERNEL)
    torch.testing.assert_close(packed_sum, sum(loss for _, loss in single), **OTHER_FP32_KERNEL)
    assert (
        int(packed_targets)
        == int(batch["num_target_tokens"])
        == sum(len(f["input_ids"]) - f["prompt_length"] for f in features)
    )

    # Leak control: the same rows with plain padding masks (positions run on) do not give the samples' logits.
    naive = {
        "input_ids": batch["input_ids"],
        "attention_mask": (batch["encoder_segment_ids"] >= 0).long(),
        "decoder_input_ids": batch["decoder_input_ids"],
        "decoder_attention_mask": (batch["decoder_segment_ids"] >= 0).long(),
    }
    with torch.no_grad():
        leaked = model(**naive).logits
    worst = max((per_sample(leaked, batch, i) - own).abs().max().item() for i, (own, _) in enumerate(single))
    assert worst > 1e-3


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_a_packed_training_step_has_the_gradients_of_the_samples_alone(kind):
    features = samples(seed=1)
    grads = []
    for packed in (True, False):
        model = tiny_seq2seq(kind).train()
        enable_packed_seq2seq(model)
        start = model.config.decoder_start_token_id
        if packed:
            batch = packed_batch(features, start)
            total, targets = causal_lm_loss_sum(
                forward_logits(model, to_device(batch, torch.device("cpu"), "sdpa")), batch["labels"]
            )
        else:
            total = sum(alone(model, feature, start, "sdpa")[1] for feature in features)
            targets = sum(len(f["input_ids"]) - f["prompt_length"] for f in features)
        (total / targets).backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    positions = [name for name in grads[0] if "embed_positions" in name or "relative_attention_bias" in name]
    assert positions and all(grads[0][name].abs().sum() > 0 for name in positions)
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **OTHER_FP32_KERNEL_GRAD, msg=name)


def test_the_collator_rows_hold_whole_samples_on_both_sides_and_the_counts_add_up():
    features = samples(12, seed=2)
    batch = packed_batch(features, EOS)
    order = [i for row in batch["encoder_segment_ids"].tolist() for i in dict.fromkeys(row) if i >= 0]
    assert order == [i for row in batch["decoder_segment_ids"].tolist() for i in dict.fromkeys(row) if i >= 0]
    assert sorted(order) == list(range(12))
    for i, feature in enumerate(features):
        n = feature["prompt_length"]
        assert (
            batch["input_ids"][batch["encoder_segment_ids"] == i].tolist()
            == feature["input_ids"][:n].tolist()
        )
        decoder = batch["decoder_input_ids"][batch["decoder_segment_ids"] == i].tolist()
        assert decoder == [EOS, *feature["input_ids"][n:].tolist()]
        assert batch["decoder_position_ids"][batch["decoder_segment_ids"] == i].tolist() == list(
            range(len(decoder))
        )
    assert int(batch["num_real_tokens"]) == sum(len(f["input_ids"]) + 1 for f in features)
    assert (
        int(batch["num_computed_tokens"]) == batch["input_ids"].numel() + batch["decoder_input_ids"].numel()
    )
    assert (
        batch["input_ids"].shape[0] <= BUDGET.rows_per_batch
        and batch["input_ids"].shape[1] <= BUDGET.row_length
    )


def test_a_lora_wrapped_model_packs_exactly_too():
    from peft import LoraConfig, TaskType, get_peft_model

    model = get_peft_model(
        tiny_seq2seq("bart"),
        LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    ).eval()
    enable_packed_seq2seq(model)  # the entry hooks sit on the PEFT wrapper, the position hooks on its base
    enable_packed_seq2seq(model)  # idempotent
    features = samples(seed=3)
    batch = packed_batch(features, EOS)
    with torch.no_grad():
        logits = forward_logits(model, to_device(batch, torch.device("cpu"), "sdpa"))
        for index, feature in enumerate(features):
            torch.testing.assert_close(
                per_sample(logits, batch, index), alone(model, feature, EOS, "sdpa")[0], **OTHER_FP32_KERNEL
            )


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_a_compiled_model_packs_exactly_too(kind):
    """torch.compile (what ``train.runtime.compile`` applies) traces the packing hooks' positions and masks as
    inputs: two different packed batches through one compiled model give the eager model's loss and gradients
    (nothing of the first batch baked into the graph). One layer each side: the hooks' positions and masks
    enter every layer alike, and a second layer only doubles the tracing."""
    torch._dynamo.reset()
    eager = tiny_seq2seq(kind, layers=1).train()
    compiled_source = tiny_seq2seq(kind, layers=1).train()
    for model in (eager, compiled_source):
        enable_packed_seq2seq(model)
    compiled = torch.compile(compiled_source, backend="aot_eager")
    start = eager.config.decoder_start_token_id
    for seed in (2, 3):
        batch = to_device(packed_batch(samples(seed=seed), start), torch.device("cpu"), "sdpa")
        results = []
        for model, source in ((eager, eager), (compiled, compiled_source)):
            source.zero_grad(set_to_none=True)
            total, targets = causal_lm_loss_sum(forward_logits(model, batch), batch["labels"])
            (total / targets).backward()
            results.append(
                (
                    total.detach(),
                    {n: p.grad.clone() for n, p in source.named_parameters() if p.grad is not None},
                )
            )
        # compiled (aot_eager: the traced graph's ops, decomposed and reordered) vs eager
        torch.testing.assert_close(results[1][0], results[0][0], **OTHER_FP32_KERNEL)
        assert results[0][1].keys() == results[1][1].keys()
        for name, grad in results[0][1].items():
            torch.testing.assert_close(results[1][1][name], grad, **OTHER_FP32_KERNEL_GRAD, msg=name)
