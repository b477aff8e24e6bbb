"""The encoder-decoder hooks of ``model.encoder_decoder``: which families and attention paths may pack, the
hooks installed once whatever the wrappers (PEFT, ``torch.compile``), and the LM head kept to the target
positions under a LoRA wrapper while evaluation still gets every position."""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.data import Seq2SeqCollator
from fastlm.engine.model.attention.inputs import to_device
from fastlm.engine.model.encoder_decoder import (
    enable_packed_seq2seq,
    enable_target_head,
    entry_module,
    packing_unavailable,
    takes_head_positions,
    unwrapped,
)
from fastlm.engine.model.loss import causal_lm_loss_sum, forward_logits, training_logits
from tests.support.tiny_seq2seq import PAD, SMALL_BART_LAYERS, VOCAB, head_rows, samples, tiny_seq2seq
from tests.support.tolerances import reordered_sum_rtol

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too


def test_only_checked_families_on_dense_mask_paths_pack():
    assert packing_unavailable(tiny_seq2seq("bart"), "sdpa") is None
    assert packing_unavailable(tiny_seq2seq("t5"), "eager") is None
    assert "sdpa or eager" in packing_unavailable(tiny_seq2seq("bart"), "flash_attention_2")
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    pegasus = PegasusForConditionalGeneration(
        PegasusConfig(
            vocab_size=VOCAB,
            **SMALL_BART_LAYERS,
        )
    )
    assert "pegasus family is not checked" in packing_unavailable(pegasus, "sdpa")


def test_the_hooks_are_installed_once_and_the_wrappers_are_seen_through():
    """Enabling twice must not stack a second hook (each would shift the positions or cut the head again);
    the entry module under ``torch.compile`` and the transformers model under PEFT are the ones hooked."""
    from peft import LoraConfig, TaskType, get_peft_model

    base = tiny_seq2seq("bart")
    model = get_peft_model(
        base, LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM, r=2, target_modules=["q_proj", "v_proj"])
    )
    compiled = torch.compile(model, backend="eager")
    assert entry_module(compiled) is model and unwrapped(compiled) is base
    assert not takes_head_positions(compiled)
    head = base.get_output_embeddings()
    positions = base.get_encoder().embed_positions
    for _ in range(2):
        enable_target_head(compiled)
        enable_packed_seq2seq(compiled)
    assert takes_head_positions(model) and takes_head_positions(base)
    assert len(head._forward_pre_hooks) == 1 and len(positions._forward_hooks) == 1


def test_a_lora_wrapped_encoder_decoder_keeps_its_head_to_the_targets_too():
    from peft import LoraConfig, get_peft_model

    base = tiny_seq2seq("bart").train()
    model = get_peft_model(
        base, LoraConfig(task_type="SEQ_2_SEQ_LM", r=2, target_modules=["q_proj", "v_proj"])
    )
    enable_target_head(model)
    features = samples(8, seed=4)
    raw = Seq2SeqCollator(pad_id=PAD, decoder_start_id=base.config.decoder_start_token_id)(features)
    batch = to_device(raw, torch.device("cpu"), "sdpa")
    rows = head_rows(base)
    logits, targets = training_logits(model, batch)
    assert rows == [int(raw["num_target_tokens"])] == [logits.size(0)] == [int((targets != -100).sum())]
    # evaluation: every position
    loss_sum, _ = causal_lm_loss_sum(forward_logits(model, batch), batch["labels"])
    assert rows[-1] == raw["decoder_input_ids"].numel()
    kept_sum = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    torch.testing.assert_close(kept_sum, loss_sum, rtol=reordered_sum_rtol(rows[0]), atol=0)  # head on K rows
