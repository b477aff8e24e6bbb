"""Fixtures of the model tests: a tiny Llama saved as a local base folder, its Llama-style tokenizer, and
prompt/summary pairs tokenized with it (the LoRA and adapter folder tests)."""

import pytest
from demo_data.texts import make_texts

from fastlm.corpus.prompts import tokenize_pairs
from fastlm.engine.data.token_dataset import TokenSequences
from tests.support.lora_models import MAX_LENGTH
from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama


@pytest.fixture(scope="module")
def texts():
    return make_texts(240, seed=5, profile="demo")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, texts):
    return save_tiny_llama(tmp_path_factory.mktemp("base"), llama_style_tokenizer(texts))


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_dir, local_files_only=True)


@pytest.fixture(scope="module")
def pairs(texts, tokenizer) -> TokenSequences:
    prompts = [f"{a}\n\nSummary:" for a in texts[:120]]
    tokens = tokenize_pairs(prompts, texts[120:240], tokenizer, max_length=MAX_LENGTH)
    return TokenSequences(tokens.values, tokens.offsets, tokens.prompt_lengths)
