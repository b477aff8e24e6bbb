"""Pre-tokenized data (issue 18): id lists checked per row, EOS/truncation like text, the id vocabulary,
parameters and fingerprint, the deterministic log-key demo."""

import numpy as np
import pandas as pd
import pytest
from demo_data.logkeys import NORMAL_KEYS, VOCAB_SIZE, logkey_sessions

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.fingerprint import check_fresh, data_format_params, make_fingerprint
from fastlm.corpus.pretokenized import id_texts, id_tokenizer, input_ids, parse_id_texts
from fastlm.corpus.tokenization import encode_id_lists
from fastlm.errors import ConfigError, InputDataError, StaleDataError

PARAM = "split.ids_column ('ids')"


def _texts(rows, vocab_size=10, eos_id=None):
    return id_texts(
        pd.Series(rows, dtype=object),
        vocab_size=vocab_size,
        source="raw.jsonl",
        param=PARAM,
        eos_id=vocab_size - 1 if eos_id is None else eos_id,
    )


def test_id_lists_become_space_joined_keys_and_back():
    rows = [[3, 1, 4], np.array([0, 8]), [2.0, 5.0]]  # arrays (pyarrow) and whole floats (a double column)
    texts = _texts(rows)
    assert texts == ["3 1 4", "0 8", "2 5"]
    assert parse_id_texts(texts) == [[3, 1, 4], [0, 8], [2, 5]]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ([1, 10], "row 2: id 10 in split.ids_column ('ids') is not below split.vocab_size (10)"),
        ([1, -3], "row 2: id -3 in split.ids_column ('ids') is negative"),
        ([1, 2.5], "row 2: split.ids_column ('ids') holds 2.5, not an integer id"),
        ([1, "7"], "row 2: split.ids_column ('ids') holds '7', not an integer id"),
        ([True], "row 2: split.ids_column ('ids') holds True, not an integer id"),
        ([], "row 2: split.ids_column ('ids') is an empty list"),
        ("1 2 3", "row 2: split.ids_column ('ids') is '1 2 3', not a list of integer ids"),
        (None, "row 2: split.ids_column ('ids') is None, not a list"),
    ],
)
def test_a_bad_row_is_named(row, expected):
    with pytest.raises(InputDataError) as raised:
        _texts([[1, 2], row, [3]])
    message = str(raised.value)
    assert message.startswith("raw.jsonl " + expected), message
    assert "\n" not in message and "Fix:" in message


@pytest.mark.parametrize(("row", "eos_id"), [([4, 9, 5], None), ([4, 5, 9], None), ([0, 4], 0)])
def test_a_row_holding_the_eos_id_is_refused(row, eos_id):
    """EOS is what split appends to end a sample: inside the data it would end samples early (and a trailing
    one would make ``4 5 9`` and ``4 5`` two rows of one sample)."""
    eos = 9 if eos_id is None else eos_id
    with pytest.raises(InputDataError) as raised:
        _texts([[1, 2], row, [3]], eos_id=eos_id)
    message = str(raised.value)
    assert message.startswith(f"raw.jsonl row 2: id {eos} in {PARAM} is split.eos_id"), message
    assert "\n" not in message and "Fix:" in message


def test_eos_appended_and_truncated_like_text():
    tokens = encode_id_lists([[1, 2, 3], [4, 5, 6, 7, 8, 9], [1, 9]], eos=9, max_length=4)
    rows = [tokens.values[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)]
    assert rows == [[1, 2, 3, 9], [4, 5, 6, 9], [1, 9]]  # a trailing EOS is not doubled
    assert tokens.truncated.tolist() == [False, True, False]


def test_id_tokenizer_maps_each_id_to_itself(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = id_tokenizer(50, eos_id=49, pad_id=0, model_max_length=32)
    assert (len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id) == (50, 49, 0)
    assert tokenizer("3 17 5")["input_ids"] == [3, 17, 5]
    assert tokenizer.decode([3, 17, 5, 49], skip_special_tokens=True) == "3 17 5"
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (len(loaded), loaded.eos_token_id, loaded.pad_token_id) == (50, 49, 0)
    assert make_fingerprint(loaded, 32) == make_fingerprint(tokenizer, 32)


def test_parameters():
    config = parse_split_params({"pretokenized": True, "vocab_size": 64})
    assert config.data_format == "pretokenized" and config.special_ids == (63, 63)
    assert parse_split_params(
        {"pretokenized": True, "vocab_size": 64, "eos_id": 0, "pad_id": 1}
    ).special_ids == (0, 1)
    with pytest.raises(ConfigError, match=r"split.pretokenized is true but split.vocab_size is not set"):
        parse_split_params({"pretokenized": True})
    with pytest.raises(ConfigError, match=r"split.eos_id = 64 is not below split.vocab_size \(64\)"):
        parse_split_params({"pretokenized": True, "vocab_size": 64, "eos_id": 64})


@pytest.mark.parametrize("change", [{"vocab_size": 65}, {"eos_id": 0}, {"pad_id": 0}, {"ids_column": "keys"}])
def test_every_pretokenized_parameter_is_in_the_fingerprint(change):
    base = {"pretokenized": True, "vocab_size": 64, "max_length": 32}
    old = parse_split_params(base)
    stored = make_fingerprint(
        id_tokenizer(64, eos_id=63, pad_id=63, model_max_length=32),
        32,
        data_format=data_format_params(old, None),
    )
    new = parse_split_params({**base, **change})
    eos, pad = new.special_ids
    with pytest.raises(StaleDataError):
        check_fresh(
            stored, id_tokenizer(new.vocab_size, eos_id=eos, pad_id=pad, model_max_length=32), new, where="x"
        )


def test_logkey_demo_is_deterministic_with_planted_anomalies():
    sessions = logkey_sessions(300, seed=1)
    assert sessions == logkey_sessions(300, seed=1) and sessions != logkey_sessions(300, seed=2)
    for session in sessions:
        unusual = any(key >= NORMAL_KEYS for key in session["ids"])
        assert unusual == session["anomaly"]
        assert max(session["ids"]) < VOCAB_SIZE - 1  # the last id stays free for EOS
    assert 0 < sum(s["anomaly"] for s in sessions) < 30


def test_parquet_list_column_and_jsonl_with_a_string_id(tmp_path):
    """Parquet list<int> rows arrive as numpy arrays; a JSONL string id makes the reader fall back to Python
    lists: both are checked with the right row number."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastlm.corpus.readers import read_text_table

    path = tmp_path / "keys.parquet"
    pq.write_table(pa.table({"ids": pa.array([[1, 2], [3], [4, 5, 6]], type=pa.list_(pa.int32()))}), path)
    ids = read_text_table(path)["ids"]
    assert id_texts(ids, vocab_size=8, source="k", param=PARAM, eos_id=7) == ["1 2", "3", "4 5 6"]
    path = tmp_path / "keys.jsonl"
    path.write_text('{"ids": [1, 2]}\n{"ids": [3, "x"]}\n', encoding="utf-8")
    with pytest.raises(InputDataError, match=r"^k row 2: split.ids_column \('ids'\) holds 'x'"):
        id_texts(read_text_table(path)["ids"], vocab_size=8, source="k", param=PARAM, eos_id=7)


def test_split_refuses_its_configured_eos_id_in_the_data():
    from fastlm.pipelines.split import nodes

    raw = pd.DataFrame({"ids": [[1, 2], [3, 0, 4]]})
    raw.attrs["source_path"] = "keys.jsonl"
    params = {"pretokenized": True, "vocab_size": 10, "eos_id": 0}
    with pytest.raises(InputDataError, match=r"^keys.jsonl row 2: id 0 in .* is split.eos_id"):
        nodes.clean_corpus(raw, params)
    assert len(nodes.clean_corpus(raw, {**params, "eos_id": 9})[0]) == 2


@pytest.mark.parametrize(
    ("value", "ids", "reason"),
    [
        ("3 17 5", [3, 17, 5], None),
        (" 3\t17\n5 ", [3, 17, 5], None),
        ("007 4", None, "malformed_ids ('007' is not a whole-number id)"),  # the tokenizer reads it as EOS
        ("-0 4", None, "malformed_ids ('-0' is not"),
        ([3, 17], [3, 17], None),
        (np.array([3, 17]), [3, 17], None),  # a Parquet list column
        ([3.0, 4.0], [3, 4], None),  # a double column
        (5, [5], None),  # one id a row (a CSV column of numbers)
        ("3 40 5", None, "unknown_id (id 40 is not below the model's vocabulary size 40)"),
        ("-1 4", None, "unknown_id (id -1 is negative"),
        ("9" * 30, None, f"unknown_id (id {'9' * 30} is not below"),
        ("12a 4", None, "malformed_ids ('12a' is not a whole-number id)"),
        ("3.5", None, "malformed_ids ('3.5' is not a whole-number id)"),
        ("\uff13 4", None, "malformed_ids"),  # a full-width digit: no id of the vocabulary
        ([3, "x"], None, "malformed_ids (the row holds 'x', not an integer id)"),
        ([3.5], None, "malformed_ids (the row holds 3.5"),
        (True, None, "malformed_ids (the row is True"),
        ("3 39 5", None, "eos_id (id 39 is the EOS id"),
        ([39], None, "eos_id"),
        ([], None, "empty"),
        ("", None, "empty"),
        ("  ", None, "whitespace_only"),
        (None, None, "missing"),
        (float("nan"), None, "missing"),
    ],
)
def test_an_input_row_is_its_ids_or_the_reason_it_cannot_be_asked(value, ids, reason):
    """Predict's reading of one row for a model trained on ids (``input_ids``): what the id tokenizer would
    read as its EOS id (an id past the vocabulary, a negative one, a word that is no whole number) and the
    EOS id itself are refused with a reason, never asked as another sequence."""
    got, why = input_ids(value, vocab_size=40, eos_id=39)
    assert got == ids
    assert (why is None) if reason is None else why.startswith(reason), why


ID_WORDS = [
    "0",
    "12",
    "38",
    "007",
    "00",
    "-0",
    "+5",
    "1_0",
    "\uff13",
    "5.0",
    "0x1f",
    "1e1",
    "-1",
    "40",
    "12a",
]


@pytest.mark.parametrize("word", ID_WORDS)
def test_predict_and_the_report_take_a_word_as_an_id_exactly_when_the_id_tokenizer_does(word):
    """One rule for a word of space-separated ids, the way the split writes an id (``str(id)``: the id
    tokenizer's vocabulary "0" .. "N-1"): predict's rows (``input_ids``) and the report's prompts
    (``check_id_prompts``) take a word as an id exactly when the model's tokenizer reads it as that id, and
    refuse it where the tokenizer would read EOS. Was: predict asked ``007`` as id 7 and ``-0`` as id 0 where
    the report refused them."""
    from fastlm.reporting.params import check_id_prompts

    vocab, eos = 40, 39
    tokenizer = id_tokenizer(vocab, eos_id=eos, pad_id=eos, model_max_length=16)
    read = tokenizer(f"4 {word}", add_special_tokens=False)["input_ids"]
    ids, why = input_ids(f"4 {word}", vocab_size=vocab, eos_id=eos)
    try:
        check_id_prompts([f"4 {word}"], vocab)
        report_takes = True
    except ConfigError:
        report_takes = False
    tokenizer_takes = read[1] != eos
    assert (ids is not None) == report_takes == tokenizer_takes, (word, ids, why, read)
    if ids is not None:
        assert ids == read
