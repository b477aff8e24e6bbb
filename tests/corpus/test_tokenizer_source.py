import json
import logging

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from fastlm.corpus.tokenizer_source import load_tokenizer
from fastlm.errors import ConfigError


def test_loads_a_local_directory_with_right_padding(bpe_tokenizer_dir):
    tokenizer = load_tokenizer(str(bpe_tokenizer_dir))
    assert tokenizer.padding_side == "right" and tokenizer.pad_token_id == tokenizer.eos_token_id


def test_tokenizer_without_pad_gets_eos_with_one_warning(tmp_path, caplog):
    backend = Tokenizer(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>").save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        tokenizer = load_tokenizer(str(tmp_path))
    assert tokenizer.pad_token == "</s>"
    assert len([r for r in caplog.records if "no pad token" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    ("source", "expected"),
    [("./does/not/exist", "no such tokenizer directory"), ("some-org/some-model", "downloads are off")],
)
def test_unusable_sources_name_the_parameter(source, expected):
    with pytest.raises(ConfigError) as error:
        load_tokenizer(source)
    assert expected in str(error.value) and "split.tokenizer.source" in str(error.value)


def test_a_folder_that_is_not_a_tokenizer_is_refused(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "NoSuchTokenizer"}))
    with pytest.raises(ConfigError, match="could not be loaded as a tokenizer"):
        load_tokenizer(str(tmp_path))
