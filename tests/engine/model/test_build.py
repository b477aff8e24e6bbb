"""engine/model/build.py: the model a run trains, built from the config (a Llama sized by ``train.model``) or
loaded from a pretrained folder (its own weights, bit for bit), in training mode with the KV cache off, and
refused in one line when ``split.max_length`` exceeds its positions. The pretrained families' contract is in
test_pretrained.py."""

import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.engine.model.build import build_model
from fastlm.errors import ConfigError
from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama

TEXTS = ["the battery lasts long", "배송이 빨라요", "the screen is bright"] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return llama_style_tokenizer(TEXTS, vocab_size=300)


def _model_params(**model):
    return parse_train_params({"model": model}).model


def test_a_model_from_the_config_is_sized_by_the_parameters_and_the_tokenizer(tokenizer):
    params = _model_params(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    model = build_model(params, tokenizer, max_length=700, attn_implementation="sdpa")
    config = model.config
    assert config.vocab_size == len(tokenizer) and config.hidden_size == 32 and config.num_hidden_layers == 2
    assert config.max_position_embeddings == 700  # at least max_length (512 below it)
    assert config.eos_token_id == tokenizer.eos_token_id and config.use_cache is False
    assert model.training and next(model.parameters()).dtype == torch.float32
    assert not model.is_activation_checkpointing


def test_a_pretrained_folder_loads_its_own_weights_in_fp32(tmp_path, tokenizer):
    folder = save_tiny_llama(tmp_path / "base", tokenizer)
    from transformers import LlamaForCausalLM

    saved = LlamaForCausalLM.from_pretrained(folder).state_dict()
    model = build_model(
        _model_params(name_or_path=str(folder)), tokenizer, max_length=64, attn_implementation="sdpa"
    )
    loaded = model.state_dict()
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)  # the same file read twice
    assert model.training and model.config.use_cache is False


def test_full_gradient_checkpointing_is_switched_on(tokenizer):
    params = _model_params(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, gradient_checkpointing="full"
    )
    model = build_model(params, tokenizer, max_length=64, attn_implementation="sdpa")
    assert model.is_activation_checkpointing


def test_a_max_length_beyond_the_models_positions_is_one_line(tmp_path, tokenizer):
    folder = save_tiny_llama(tmp_path / "base", tokenizer)  # 512 positions
    with pytest.raises(ConfigError, match=r"split\.max_length = 600 exceeds .*\(512\)") as error:
        build_model(
            _model_params(name_or_path=str(folder)), tokenizer, max_length=600, attn_implementation="sdpa"
        )
    assert "\n" not in str(error.value)
