"""A tiny Llama-architecture model and a Llama-style tokenizer (BOS in front, ``</s>`` as EOS), built from
configs and saved with ``save_pretrained``: what a user's local checkpoint folder looks like, no hub
access."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def llama_style_tokenizer(texts: list[str], *, vocab_size: int = 400, chat_template: bool = False):
    """A byte-level BPE that, like Llama's, adds ``<s>`` in front of every text and has no pad token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", clean_up_tokenization_spaces=False
    )
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tiny_llama(
    folder: Path, tokenizer, *, hidden_size: int = 32, layers: int = 2, seed: int = 0, tied: bool = False
) -> Path:
    """A randomly initialised LlamaForCausalLM for ``tokenizer``, saved with its tokenizer in ``folder``;
    ``tied``: its head shares the input embedding (as Llama-3.2-1B/3B's and Qwen3-4B's do)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tied,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
