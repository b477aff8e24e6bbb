"""Tiny encoder-decoder models (BART, mBART, T5 from configs) and random prompt/response samples, packed."""

from __future__ import annotations

import numpy as np
import torch

from fastlm.engine.data import PackedSeq2SeqCollator, TokenBudget

VOCAB, PAD, EOS = 64, 1, 2
BUDGET = TokenBudget(row_length=24, rows_per_batch=4)
# The smallest BART-family shape the tests build (BART, Pegasus): one layer each side, width 16.
SMALL_BART_LAYERS = dict(
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=64,
)


def tiny_seq2seq(kind: str, attn: str = "sdpa", layers: int = 2):
    """``layers`` on each side (encoder and decoder)."""
    import transformers as tf

    torch.manual_seed(0)
    bart_like = dict(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=0,
        decoder_start_token_id=EOS,
        dropout=0.0,
        init_std=0.2,
    )
    if kind == "bart":
        model = tf.BartForConditionalGeneration(tf.BartConfig(**bart_like))
    elif kind == "mbart":
        model = tf.MBartForConditionalGeneration(tf.MBartConfig(**bart_like))
    else:
        model = tf.T5ForConditionalGeneration(
            tf.T5Config(
                vocab_size=VOCAB,
                d_model=16,
                d_kv=8,
                d_ff=32,
                num_layers=layers,
                num_heads=2,
                pad_token_id=PAD,
                eos_token_id=EOS,
                decoder_start_token_id=PAD,
                dropout_rate=0.0,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=16,
            )
        )
    model.config._attn_implementation = attn
    return model


def samples(n: int = 10, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(3, VOCAB, size=int(rng.integers(2, 11))).tolist()
        response = rng.integers(3, VOCAB, size=int(rng.integers(1, 7))).tolist()
        out.append({"input_ids": np.array(prompt + response + [EOS]), "prompt_length": len(prompt)})
    return out


def packed_batch(features, start: int) -> dict:
    batch = PackedSeq2SeqCollator(pad_id=PAD, decoder_start_id=start, budget=BUDGET)(features)
    per_row = [len(set(row.tolist()) - {-1}) for row in batch["decoder_segment_ids"]]
    assert len(per_row) > 1 and max(per_row) > 2  # several rows, several samples per row
    return batch


def head_rows(model) -> list[int]:
    """The number of positions the LM head computes, per call."""
    rows: list[int] = []
    head = model.get_output_embeddings()
    head.register_forward_hook(lambda module, args, output: rows.append(output.shape[:-1].numel()))
    return rows


def bart_style_tokenizer(bos_before_text: bool = True):
    """A tiny byte-level BPE with BART's special tokens (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3) and
    its post-processor: ``tokenizer(text)`` is ``<s> text </s>``, as BART's own tokenizer encodes a text
    (``bos_before_text=False``: ``text </s>``, as KoBART's does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(["summarize the dialogue please", "a short summary of it"], trainer=trainer)
    head = "<s> " if bos_before_text else ""
    backend.post_processor = processors.TemplateProcessing(
        single=f"{head}$A </s>", pair=f"{head}$A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
