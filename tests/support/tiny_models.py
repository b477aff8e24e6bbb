"""Tiny Llamas built from configs (no download): one for the packing and completion-only checks, one with an
optimizer and schedule for the checkpoint round trips."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.train.optim import make_adamw
from fastlm.engine.train.schedule import LRSchedule, make_lr_scheduler

PACKING_VOCAB, PACKING_EOS = 300, 2
CHECKPOINT_VOCAB = 100


def llama_config(*, vocab: int, hidden: int, positions: int, **extra) -> LlamaConfig:
    """Two layers (``num_hidden_layers`` in ``extra``: another depth), four heads (no grouped-query
    attention), an MLP twice as wide as ``hidden``."""
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=positions,
        **{"num_hidden_layers": 2, **extra},
    )


def packing_llama(attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    """In eval mode (no dropout), seeded: packed and one-at-a-time logits can be compared exactly."""
    config = llama_config(
        vocab=PACKING_VOCAB, hidden=64, positions=128, attn_implementation=attn_implementation
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def checkpoint_llama(*, seed: int = 0, tie: bool = False, vocab: int = CHECKPOINT_VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(vocab=vocab, hidden=32, positions=64, tie_word_embeddings=tie))


def optimizer_and_scheduler(model: torch.nn.Module):
    optimizer = make_adamw(model, lr=1e-3, weight_decay=0.1)
    scheduler = make_lr_scheduler(optimizer, LRSchedule(peak_lr=1e-3, total_steps=10, warmup_steps=3))
    return optimizer, scheduler


def multimodal_gemma3(text: dict):
    """Gemma3ForConditionalGeneration (the class of google/gemma-3-4b and larger, model_type gemma3) with the
    language model of ``text`` (Gemma3TextConfig keywords) and a one-layer vision tower, for text training."""
    import transformers as t

    vision = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
    }
    config = t.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=text["vocab_size"] - 1,
    )
    return t.AutoModelForCausalLM.from_config(config)


def multimodal_gemma4(text: dict):
    """Gemma4ForConditionalGeneration (model_type gemma4: its forward soft-caps the logits by its text
    config's ``final_logit_softcapping``) with the language model of ``text`` (Gemma4TextConfig keywords) and
    a one-layer vision tower, no audio tower."""
    import transformers as t

    vision = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 8,
    }
    vocab = text["vocab_size"]
    special = dict(
        zip(
            ("boi_token_id", "eoi_token_id", "image_token_id", "video_token_id", "boa_token_id"),
            range(vocab - 7, vocab),
            strict=False,
        )
    )
    config = t.Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=None,
        eoa_token_index=vocab - 2,
        audio_token_id=vocab - 1,
        **special,
    )
    return t.AutoModelForCausalLM.from_config(config)
