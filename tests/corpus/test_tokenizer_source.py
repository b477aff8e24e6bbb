import json
import logging

import pandas as pd
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from fastlm.corpus.tokenizer_source import load_tokenizer, train_bpe_tokenizer
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
    (tmp_path / "vocab.json").write_text("{}")  # a vocabulary file: the class is what cannot load
    with pytest.raises(ConfigError, match="could not be loaded as a tokenizer"):
        load_tokenizer(str(tmp_path))


def _learned(tokenizer, piece: str) -> bool:
    return any(piece in token for token in tokenizer.get_vocab())


def test_bpe_training_reads_only_what_max_length_can_use(sample_texts):
    """A 50 MB one-line text must not cost gigabytes: BPE training sees each text cut as tokenization cuts
    it (max_length * MAX_CHARS_PER_TOKEN characters), so a word only past that cut is never learned."""
    from fastlm.corpus.tokenization import MAX_CHARS_PER_TOKEN

    long_text = "a" * (8 * MAX_CHARS_PER_TOKEN) + " zqxj" * 2000  # "zqxj" only past the cut at max_length 8
    texts = sample_texts[:200] + [long_text]
    assert not _learned(train_bpe_tokenizer(texts, vocab_size=400, min_frequency=2, model_max_length=8), "zq")
    assert _learned(train_bpe_tokenizer(texts, vocab_size=400, min_frequency=2, model_max_length=64), "zq")


def test_split_trains_the_bpe_on_texts_cut_like_tokenization(sample_texts, monkeypatch):
    """Prompts keep their end (tokenization cuts them from the left), responses and texts their start."""
    from fastlm.corpus.tokenization import MAX_CHARS_PER_TOKEN
    from fastlm.pipelines.split import nodes

    fed = []
    monkeypatch.setattr(
        nodes, "train_bpe_tokenizer", lambda texts, **kwargs: fed.append(list(texts)) or _Bare()
    )
    limit = 8 * MAX_CHARS_PER_TOKEN
    long_text = "<" + "x" * 3 * limit + ">"
    frame = pd.DataFrame({"prompt": [long_text, "p"], "response": [long_text, "r"], "split": ["train"] * 2})
    nodes.build_tokenizer(frame, {"max_length": 8})
    assert fed[0] == [long_text[-limit:], "p", long_text[:limit], "r"]
    nodes.build_tokenizer(frame.rename(columns={"prompt": "text"}), {"max_length": 8})
    assert fed[1] == [long_text[:limit], "p"]


class _Bare(list):
    """A stand-in tokenizer: a length and the ``init_kwargs`` its settings are recorded in."""

    def __init__(self):
        super().__init__()
        self.init_kwargs = {}


def _model_folder_without_tokenizer(folder):
    """A save_pretrained model folder (config and weights) with no tokenizer file in it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=500, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_model_folder_without_tokenizer_files_is_refused_as_a_tokenizer(tmp_path):
    """transformers builds an empty tokenizer from a model folder's config.json alone: the split tokenized
    every text into its EOS alone (exit 0), and training then stopped on a NaN loss, blamed on the rate."""
    folder = _model_folder_without_tokenizer(tmp_path / "qwen3_notok")
    with pytest.raises(ConfigError) as error:
        load_tokenizer(str(folder))
    message = str(error.value)
    assert "split.tokenizer.source" in message and "no tokenizer" in message and "\n" not in message


def test_the_pad_warning_survives_the_logs_secret_masking(tmp_path, caplog):
    """The log masks values after key words such as ``token:``: the no-pad line must read whole."""
    from fastlm.redaction import redact_text

    backend = Tokenizer(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>").save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        load_tokenizer(str(tmp_path))
    said = [r.getMessage() for r in caplog.records if "no pad token" in r.getMessage()]
    assert said and redact_text(said[0]) == said[0], redact_text(said[0])


def test_a_byte_level_tokenizer_folder_without_a_vocabulary_file_loads(tmp_path):
    """ByT5's folder holds tokenizer_config.json and added_tokens.json: its vocabulary is the bytes."""
    from transformers import ByT5Tokenizer

    ByT5Tokenizer().save_pretrained(tmp_path / "byt5")
    assert len(load_tokenizer(str(tmp_path / "byt5"))) > 256


def test_a_tokenizer_folder_named_another_way_is_the_same_source(tmp_path, monkeypatch, bpe_tokenizer_dir):
    """``split.tokenizer.source`` recorded with the saved tokenizer: ``models/base`` at the split and
    ``./models/base`` or its absolute path at train named one folder, and train refused the data as made
    with other settings. Another folder is still a change."""
    import shutil

    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.tokenizer_source import record_settings, settings_changes

    shutil.copytree(bpe_tokenizer_dir, tmp_path / "models/base")
    shutil.copytree(bpe_tokenizer_dir, tmp_path / "models/other")
    monkeypatch.chdir(tmp_path)
    tokenizer = load_tokenizer("models/base")
    record_settings(tokenizer, parse_split_params({"tokenizer": {"source": "models/base"}}).tokenizer)
    for same in ("./models/base", str(tmp_path / "models/base"), "models/other/../base"):
        assert (
            settings_changes(tokenizer, parse_split_params({"tokenizer": {"source": same}}).tokenizer) == []
        )
    other = settings_changes(
        tokenizer, parse_split_params({"tokenizer": {"source": "models/other"}}).tokenizer
    )
    assert len(other) == 1 and "split.tokenizer.source" in other[0], other
