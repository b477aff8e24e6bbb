import json
import os
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from fastlm.corpus.fingerprint import check_fresh, make_fingerprint, params_changes, selection_params
from fastlm.corpus.tokenizer_source import train_bpe_tokenizer
from fastlm.errors import StaleDataError
from tests.support.project import PROJECT_ROOT


def test_fingerprint_survives_save_and_load(bpe_tokenizer, bpe_tokenizer_dir):
    loaded = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    assert make_fingerprint(bpe_tokenizer, 64)["fingerprint"] == make_fingerprint(loaded, 64)["fingerprint"]
    check_fresh(make_fingerprint(bpe_tokenizer, 64), loaded, 64, where="tokenized")


def test_changed_max_length_is_refused_with_the_refresh_command(bpe_tokenizer):
    stored = make_fingerprint(bpe_tokenizer, 320)
    with pytest.raises(StaleDataError) as error:
        check_fresh(stored, bpe_tokenizer, 512, where="data/05_model_input/tokenized_corpus")
    message = str(error.value)
    assert "max_length 320 -> 512" in message and "kedro run --pipeline=split" in message
    assert "data/05_model_input/tokenized_corpus" in message
    # a train run given other split.* parameters than the split was (prompt columns passed to the split
    # alone): re-splitting with those would tokenize the data as they say; the fix names both ways
    assert "or run this pipeline with the split.* parameters the data was split with" in message


def test_changed_tokenizer_is_refused(bpe_tokenizer, sample_texts):
    other = train_bpe_tokenizer(sample_texts[:200], vocab_size=300, min_frequency=1, model_max_length=64)
    with pytest.raises(StaleDataError, match="the tokenizer changed"):
        check_fresh(make_fingerprint(bpe_tokenizer, 64), other, 64, where="tokenized")


def test_missing_fingerprint_is_refused(bpe_tokenizer):
    with pytest.raises(StaleDataError, match="no tokenization fingerprint"):
        check_fresh(None, bpe_tokenizer, 64, where="tokenized")


def test_bpe_training_is_deterministic(sample_texts):
    first = train_bpe_tokenizer(sample_texts, vocab_size=400, min_frequency=2, model_max_length=64)
    second = train_bpe_tokenizer(sample_texts, vocab_size=400, min_frequency=2, model_max_length=64)
    assert make_fingerprint(first, 64) == make_fingerprint(second, 64)


def test_the_data_identity_tells_other_texts_apart_where_the_fingerprint_cannot(bpe_tokenizer):
    """The fingerprint says which tokenizer and parameters made the tokens; with a tokenizer that does not
    depend on the data (a model folder's, pre-tokenized ids) two splits of different texts share it. What a
    model or a sweep run trained on is its data identity: the fingerprint and the split texts' digest (a
    fingerprint written before the digest existed is its own identity)."""
    from fastlm.corpus.fingerprint import data_identity, texts_digest

    ours = make_fingerprint(bpe_tokenizer, 64, data_digest=texts_digest(["a", "b"], ["train", "test"]))
    theirs = make_fingerprint(bpe_tokenizer, 64, data_digest=texts_digest(["a", "c"], ["train", "test"]))
    assert ours["fingerprint"] == theirs["fingerprint"]
    assert data_identity(ours) != data_identity(theirs)
    assert data_identity(ours) == data_identity(dict(ours))  # the same record: the same identity
    older = make_fingerprint(bpe_tokenizer, 64)
    assert data_identity(older) == older["fingerprint"] and data_identity(None) is None


@pytest.mark.parametrize("name", ["tokenized_corpus_fingerprint", "split_report", "bottleneck_diagnosis"])
def test_json_kept_as_written_is_utf8_whatever_the_locale(tmp_path, name):
    """The fingerprint and the split report keep non-ASCII text as written (``ensure_ascii: false``) and are
    read back as UTF-8 (the hooks, predict): written in the locale's encoding, an ASCII locale failed the
    split at its end and a Latin-1 one wrote bytes no UTF-8 reader takes. Written as UTF-8 in any locale."""
    target = tmp_path / "out.json"
    script = (
        "import sys; from tests.support.project import catalog_dataset; "
        "from pathlib import Path; "
        f"d = catalog_dataset({name!r}, Path(sys.argv[1])); "
        "v = {'system_prompt': '\\uc548\\ub155 caf\\u00e9'}; d.save(v); assert d.load() == v"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(target)], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(target.read_text(encoding="utf-8")) == {"system_prompt": "\uc548\ub155 caf\u00e9"}


def test_a_split_of_nested_columns_digests_alike_whatever_its_chunks():
    """A chat split's ``answer_spans`` (lists of pairs): the lengths of both levels were hashed into one
    digest chunk after chunk, so the same rows read back in more pieces digested otherwise and a freshly
    split chat corpus was refused as edited. Same rows in other chunks: the same digest; the same values
    grouped otherwise: another."""
    import datasets

    from fastlm.corpus.fingerprint import tokenized_digests

    rows = [
        {"input_ids": list(range(i % 9 + 1)), "answer_spans": [[1, 2], [3, 4]] if i % 2 else []}
        for i in range(300)
    ]
    whole = tokenized_digests({"train": datasets.Dataset.from_list(rows)})
    pieces = datasets.concatenate_datasets(
        [datasets.Dataset.from_list(rows[start : start + 100]) for start in range(0, 300, 100)]
    )
    assert tokenized_digests({"train": pieces}) == whole
    regrouped = [dict(row) for row in rows]
    regrouped[1]["answer_spans"] = [[1, 2, 3, 4]]
    assert tokenized_digests({"train": datasets.Dataset.from_list(regrouped)}) != whole


def test_split_digest_hashes_rows_in_bounded_chunks_as_the_whole_frame(bpe_tokenizer, monkeypatch):
    # A million-row split hashed at once held every text again as Python objects and bytes (+0.9 GB at
    # 1M short texts): the digest is taken over chunks of rows, and must not change (earlier runs' data)
    import hashlib

    import pandas as pd

    from fastlm.corpus import fingerprint
    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.split_steps import split_fingerprint

    splits = pd.DataFrame(
        {
            "text": [f"텍스트 {index} text" for index in range(50)],
            "split": pd.Categorical(["train", "test"] * 25, categories=["train", "validation", "test"]),
        }
    )
    whole = hashlib.sha256(pd.util.hash_pandas_object(splits, index=False).to_numpy().tobytes()).hexdigest()
    seen = []
    hash_rows = pd.util.hash_pandas_object
    monkeypatch.setattr(fingerprint, "HASH_CHUNK_ROWS", 7, raising=False)
    monkeypatch.setattr(
        pd.util,
        "hash_pandas_object",
        lambda part, **kwargs: seen.append(len(part)) or hash_rows(part, **kwargs),
    )
    digest = split_fingerprint(splits, bpe_tokenizer, parse_split_params({"max_length": 64}))["data_sha256"]
    assert digest == whole
    assert max(seen) <= 7 and sum(seen) == len(splits)


def test_plain_text_tokenized_with_special_tokens_parsed_is_stale(bpe_tokenizer):
    """Plain text tokenized before a special token's text in a text was read as text (the EOS token in the
    middle of a sample) is stale, saying why; data of prompts, chats or ids keeps its fingerprint."""
    current = make_fingerprint(bpe_tokenizer, 64)
    assert current["params"]["special_tokens_in_texts"] == "as_text"
    older = json.loads(json.dumps(current))
    del older["params"]["special_tokens_in_texts"]
    older["fingerprint"] = "written-by-an-older-fastlm"
    with pytest.raises(StaleDataError) as error:
        check_fresh(older, bpe_tokenizer, 64, where="data/05_model_input/tokenized_corpus")
    assert "special tokens written in a text were read as the tokens" in str(error.value)
    prompts = make_fingerprint(bpe_tokenizer, 64, data_format={"kind": "prompt_response"})
    assert "special_tokens_in_texts" not in prompts["params"]


@pytest.mark.parametrize("made_as", ["prompt_response", "text"])
def test_data_of_another_format_is_stale_for_that_reason_alone_not_for_its_special_token_reading(
    bpe_tokenizer, made_as
):
    """Plain text records how it read special tokens' texts and prompt/response data records its format
    instead: data made by this fastlm in one format and read as the other is stale for its format (and any
    real difference), never "tokenized by an older fastlm" nor a raw ``special_tokens_in_texts`` change."""
    from fastlm.corpus.config import parse_split_params

    prompts = {"kind": "prompt_response", "prompt_column": "dialogue", "response_column": "summary"}
    stored = make_fingerprint(bpe_tokenizer, 128, data_format=prompts if made_as != "text" else None)
    asked = make_fingerprint(bpe_tokenizer, 48, data_format=prompts if made_as == "text" else None)
    other = "text" if made_as != "text" else "prompt_response"
    assert sorted(params_changes(stored["params"], asked["params"])) == sorted(
        [f"the data format changed ({made_as} -> {other})", "max_length 128 -> 48"]
    )
    # as train checks the data it is given: the split.* parameters of plain text against prompt/response data
    split = parse_split_params({"max_length": 48})
    stored = make_fingerprint(bpe_tokenizer, 128, data_format=prompts, selection=selection_params(split))
    with pytest.raises(StaleDataError) as error:
        check_fresh(stored, bpe_tokenizer, split, where="data/05_model_input/tokenized_corpus")
    message = str(error.value)
    assert (
        "the data format changed (prompt_response -> text)" in message and "max_length 128 -> 48" in message
    )
    assert "older fastlm" not in message, message
