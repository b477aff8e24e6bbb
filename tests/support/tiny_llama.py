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
    folder: Path,
    tokenizer,
    *,
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 0,
    tied: bool = False,
    dtype=None,
) -> Path:
    """A randomly initialised LlamaForCausalLM for ``tokenizer``, saved with its tokenizer in ``folder``;
    ``tied``: its head shares the input embedding (as Llama-3.2-1B/3B's and Qwen3-4B's do); ``dtype``: saved
    in it (a torch dtype; default fp32), as a bf16 download is."""
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
    LlamaForCausalLM(config).to(dtype or torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def save_project_llama(
    project: Path, *, vocab_size: int | None = None, max_positions: int = 64, with_tokenizer: bool = True
) -> str:
    """A one-layer Llama for the tokenizer a project's split trained (data/06_models/tokenizer), saved under
    ``project``/models with that tokenizer (``with_tokenizer``); its folder as
    ``train.model.name_or_path`` takes it (``./models/tiny-<vocab>-<positions>``)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(project / "data/06_models/tokenizer", local_files_only=True)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=max_positions,
    )
    folder = project / "models" / f"tiny-{config.vocab_size}-{max_positions}"
    LlamaForCausalLM(config).save_pretrained(folder)
    if with_tokenizer:  # the model's own: the data's
        tokenizer.save_pretrained(folder)
    return f"./{folder.relative_to(project)}"


# The bigram model's vocabulary and the token each one is followed by: greedy decoding walks the cycle
# a, "\r", b, c, "\r\n", a, ...: a text with a bare carriage return and no line feed ("a\rb") as well as
# one with a CRLF.
LINE_END_VOCAB = ("<pad>", "<s>", "</s>", "<unk>", "a", "b", "c", "\r", "\r\n")
LINE_END_NEXT = {"a": "\r", "\r": "b", "b": "c", "c": "\r\n", "\r\n": "a"}


def line_end_llama():
    """A Llama whose greedy next token depends on the last token alone (its layers add nothing to the
    residual stream: one-hot embeddings straight to the head) and a word-level tokenizer whose tokens
    include a bare carriage return and a CRLF: what a model that writes Windows line ends generates. Returns
    (model, tokenizer); the tokenizer joins tokens without spaces, as byte-level tokenizers decode."""
    return scripted_llama(LINE_END_VOCAB, LINE_END_NEXT)


def scripted_llama(vocab_tokens, next_token: dict, *, special: tuple = (), metaspace: bool = False):
    """A Llama whose greedy next token is ``next_token[last token]`` (else the token after the four named
    below; its layers add nothing to the residual stream: one-hot embeddings straight to the head) over a
    word-level tokenizer of ``vocab_tokens`` (``<pad>``, ``<s>``, ``</s>``, ``<unk>`` among them;
    ``special``: more of them marked special, as a tokenizer marks its chat markup). Returns (model,
    tokenizer); the tokenizer splits on whitespace and joins tokens without spaces, as byte-level tokenizers
    decode. ``metaspace``: a SentencePiece-style tokenizer instead (Llama-2, Mistral, Gemma: words as
    ``▁word`` tokens, a ``▁`` put before the text, and taken off the first token when decoding)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(vocab_tokens)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace() if metaspace else pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.Metaspace() if metaspace else decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=list(special),
    )
    hidden = max(16, len(vocab))
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"],
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # the attention and the MLP write nothing to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(len(vocab), hidden))
        head = torch.zeros(len(vocab), hidden)
        for token, index in vocab.items():
            head[vocab[next_token.get(token, vocab_tokens[4])], index] = 5.0
        model.lm_head.weight.copy_(head)
    return model.eval(), tokenizer


# A scripted model's chain for a function-calling answer: "ask" is answered by a call (its markup special
# tokens, as Hermes-style tokenizers mark <tool_call>), "hi" by text; any other token by "hi".
CALL_TOKENS = (
    "<pad>", "<s>", "</s>", "<unk>", "hi", "sunny", "ask", "<tool_call>", "</tool_call>",
    '{"name":', '"get_weather",', '"arguments":', '{"city":', '"서울"}}',
)  # fmt: skip
_CALL_CHAIN = ("ask", "<tool_call>", '{"name":', '"get_weather",', '"arguments":', '{"city":', '"서울"}}')
_CALL_NEXT = {
    **dict(zip(_CALL_CHAIN[:-1], _CALL_CHAIN[1:], strict=True)),
    '"서울"}}': "</tool_call>",
    "</tool_call>": "</s>",
    "hi": "sunny",
    "sunny": "</s>",
}


def calling_llama():
    """``scripted_llama`` answering ``ask`` with ``<tool_call>{"name":"get_weather","arguments":{"city":
    "서울"}}</tool_call>`` (the markup special tokens) and ``hi`` with ``sunny``; its tokenizer carries the
    Qwen-style function-calling template (``chat_templates.QWEN_STYLE_TOOLS_TEMPLATE``)."""
    from tests.support.chat_templates import QWEN_STYLE_TOOLS_TEMPLATE

    model, tokenizer = scripted_llama(CALL_TOKENS, _CALL_NEXT, special=("<tool_call>", "</tool_call>"))
    tokenizer.chat_template = QWEN_STYLE_TOOLS_TEMPLATE
    return model, tokenizer


def rewrite_weights_keeping_time(folder: Path, name: str = "model.safetensors") -> None:
    """Other weights of the same shapes written over ``folder``'s ``name`` in place (every tensor plus one),
    its size and modification time put back, as ``cp -p``, ``rsync -t`` or ``os.utime`` leave a rewrite."""
    import os

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = Path(folder) / name
    stat = path.stat()
    with safe_open(path, "pt") as handle:
        metadata = handle.metadata()
    save_file({key: tensor + 1 for key, tensor in load_file(path).items()}, path, metadata=metadata)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
