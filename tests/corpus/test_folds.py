"""k-fold assignment (``split.folds``): the fold bucket of a train/validation row comes from the same keyed
hash as its split, so it is stable and independent of row order, the folds partition train and validation,
and the test rows never move."""

import json

import datasets
import numpy as np
import pandas as pd
import pytest

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.fingerprint import (
    check_fresh,
    data_folds,
    data_identity,
    folds_mismatch,
    identity_of_test_split,
    make_fingerprint,
    selection_params,
)
from fastlm.corpus.splitting import FOLD_COLUMN, assign_folds, assign_splits, text_keys
from fastlm.engine.data.folds import fold_splits
from fastlm.errors import ConfigError
from fastlm.pipelines.split.nodes import clean_corpus, report_split, split_corpus, tokenize_corpus

RATIOS = (0.8, 0.1, 0.1)


def _folds(texts, k, salt=""):
    keys = text_keys(texts, salt)[:, 0]
    codes = assign_splits(keys, *RATIOS)
    folds = assign_folds(keys, codes, k, *RATIOS)
    return dict(zip(texts, folds, strict=True)), dict(zip(texts, codes, strict=True))


def test_fold_of_a_text_is_stable_and_independent_of_row_order(sample_texts):
    before, _ = _folds(sample_texts, 3)
    after, _ = _folds(sample_texts[::-1] + ["an appended text", "another one"], 3)
    assert all(after[text] == fold for text, fold in before.items())
    assert _folds(sample_texts, 3)[0] == before  # the same computation twice
    assert _folds(sample_texts, 3, salt="other")[0] != before  # the salt re-draws folds as it re-draws splits


def test_folds_partition_train_and_validation_and_leave_test_alone():
    texts = [f"text number {i}" for i in range(6000)]
    folds, codes = _folds(texts, 4)
    fold = np.array([folds[text] for text in texts])
    code = np.array([codes[text] for text in texts])
    assert (fold[code == 2] == -1).all()  # test rows: in no fold
    assert set(fold[code != 2]) == {0, 1, 2, 3}  # every train/validation row in exactly one fold of 0..k-1
    shares = np.bincount(fold[code != 2], minlength=4) / (code != 2).sum()
    assert np.allclose(shares, 0.25, atol=0.03)  # uniform: the split key rescaled over train + validation


def test_without_a_test_split_every_row_gets_a_fold():
    keys = np.array([0.0, 0.3, 0.6, 0.9, 0.9999999999])
    codes = assign_splits(keys, 0.9, 0.1, 0.0)
    assert list(assign_folds(keys, codes, 2, 0.9, 0.1, 0.0)) == [0, 0, 1, 1, 1]


def _clean(n=400):
    return pd.DataFrame({"text": [f"row {i} of the corpus" for i in range(n)]})


def test_split_node_adds_a_fold_column_and_the_test_rows_are_identical(sample_texts):
    counts = {"raw_rows": 400, "dropped": {}, "source": "x", "data_format": "text"}
    plain, _ = split_corpus(_clean(), counts, {})
    folded, _ = split_corpus(_clean(), counts, {"folds": 3})
    assert FOLD_COLUMN not in plain and list(folded["split"]) == list(plain["split"])
    test = plain["split"] == "test"
    pd.testing.assert_frame_equal(folded.loc[test, ["text", "split"]], plain.loc[test, ["text", "split"]])
    assert (folded.loc[test, FOLD_COLUMN] == -1).all() and set(folded.loc[~test, FOLD_COLUMN]) == {0, 1, 2}


def test_a_fold_without_rows_is_refused_before_anything_is_written():
    counts = {"raw_rows": 3, "dropped": {}, "source": "x", "data_format": "text"}
    with pytest.raises(Exception, match="split.folds") as error:
        split_corpus(
            _clean(8), counts, {"folds": 20, "ratios": {"train": 0.5, "validation": 0.25, "test": 0.25}}
        )
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, "split.folds = 1 is invalid"),
        (0, "split.folds = 0 is invalid"),
        (2.5, "split.folds = 2.5 is invalid"),
        ("three", "split.folds = 'three' is invalid"),
        (-2, "split.folds = -2 is invalid"),
    ],
)
def test_bad_folds_are_one_line(value, expected):
    with pytest.raises(ConfigError) as error:
        parse_split_params({"folds": value})
    message = str(error.value)
    assert expected in message and "Fix:" in message and "\n" not in message


def test_the_data_records_its_folds_in_its_fingerprint(bpe_tokenizer):
    """The fold count is read from the data (train and sweep need no split.folds), yet re-splitting into
    another number of folds changes the fingerprint (a sweep trains its runs again)."""
    params = parse_split_params({})
    prints = {
        folds: make_fingerprint(bpe_tokenizer, 64, selection=selection_params(params), folds=folds)
        for folds in (None, 2, 3)
    }
    assert [data_folds(prints[folds]) for folds in (None, 2, 3)] == [None, 2, 3]
    assert len({fingerprint["fingerprint"] for fingerprint in prints.values()}) == 3
    for fingerprint in prints.values():  # fresh for split parameters with or without split.folds
        check_fresh(fingerprint, bpe_tokenizer, params.model_copy(update={"max_length": 64}), where="data")
        other = parse_split_params({"folds": 5, "max_length": 64})
        check_fresh(fingerprint, bpe_tokenizer, other, where="data")
    assert parse_split_params({"folds": 2}).folds == 2 and params.folds is None


def test_split_folds_other_than_the_datas_are_said_with_both_counts_and_the_fix(bpe_tokenizer):
    """The data's fold count wins (above), but a conf asking for another one is said: split.folds 5 over data
    split into 3 ran a 3-fold sweep without a word. Nothing is said where they agree or split.folds is
    unset (train and sweep need none)."""
    selection = selection_params(parse_split_params({}))
    three = make_fingerprint(bpe_tokenizer, 64, selection=selection, folds=3)
    plain = make_fingerprint(bpe_tokenizer, 64, selection=selection)
    note = folds_mismatch(three, 5)
    assert "split.folds = 5" in note and "split into 3 folds" in note and "3 folds are used" in note, note
    assert "Fix: run `kedro run --pipeline=split --params split.folds=5`" in note and "\n" not in note, note
    assert "without folds" in folds_mismatch(plain, 5)
    assert folds_mismatch(three, 3) is None and folds_mismatch(three, None) is None
    assert folds_mismatch(plain, None) is None


def _pairs(texts: list[str]) -> list[tuple[str, str]]:
    return list(zip(texts[::2], texts[1::2], strict=True))


def _fold_runs(raw: pd.DataFrame, params: dict, tokenizer):
    clean, cleaning = clean_corpus(raw, params)
    splits, counts = split_corpus(clean, cleaning, params)
    tokenized, fingerprint, stats = tokenize_corpus(splits, tokenizer, params, counts)
    report, table = report_split(counts, stats, fingerprint)
    return tokenized, fingerprint, report, table


@pytest.mark.parametrize("data", ["text", "prompt_response", "messages"])
def test_the_split_report_gives_each_folds_figures_as_a_recount_of_the_tokenized_data_finds(
    data, sample_texts, bpe_tokenizer
):
    """k-fold (split.folds): the split report said nothing of the folds, so a user learnt that one fold held
    far more or longer samples only after k runs. Its ``folds`` gives each fold's rows, tokens, mean and p90
    length and the largest / smallest fold, as a recount of the tokenized data finds them; each fold is what
    ``train.fold`` validates on, the other folds what it trains on, and a duplicate (dropped before the
    folds are drawn) sits in no two folds: texts, prompt/response pairs and chats alike."""
    texts = list(sample_texts)
    if data == "text":
        raw, params = pd.DataFrame({"text": texts + texts[:40]}), {}
    elif data == "prompt_response":
        pairs = {"prompt": texts[:300] + texts[:20], "response": texts[300:] + texts[300:320]}
        raw, params = pd.DataFrame(pairs), {"prompt_column": "prompt", "response_column": "response"}
    else:  # chats, the repeated ones written the ShareGPT way
        chats = [
            [{"role": "user", "content": a}, {"role": "assistant", "content": b}] for a, b in _pairs(texts)
        ]
        again = [[{"from": "human", "value": a}, {"from": "gpt", "value": b}] for a, b in _pairs(texts[:40])]
        raw, params = pd.DataFrame({"messages": chats + again}), {"messages_column": "messages"}
    params = {**params, "folds": 4, "max_length": 64}
    tokenized, fingerprint, report, table = _fold_runs(raw, params, bpe_tokenizer)
    assert report["dropped"]["duplicate"] == {"text": 40, "prompt_response": 20, "messages": 20}[data]
    json.dumps(report, allow_nan=False)  # strict JSON
    assert list(table["split"]) == ["train", "validation", "test"]  # the CSV: one row per split, as before
    folds = report["folds"]
    assert folds["count"] == 4 and [fold["fold"] for fold in folds["per_fold"]] == [0, 1, 2, 3]
    pool = datasets.concatenate_datasets([tokenized["train"], tokenized["validation"]])
    seen: dict[tuple, int] = {}
    for figures in folds["per_fold"]:
        fold = figures["fold"]
        trained, validated = fold_splits(tokenized, fold, data_folds(fingerprint))
        held_out = {tuple(ids) for ids in validated["input_ids"]}
        assert not held_out & {tuple(ids) for ids in trained["input_ids"]}  # nothing trained and validated
        assert len(trained) + len(validated) == len(pool)
        assert not held_out & set(seen)  # no sample (no duplicate) in two folds
        seen.update(dict.fromkeys(held_out, fold))
        lengths = np.array([len(ids) for ids in validated["input_ids"]])  # recounted from the ids
        assert figures["rows"] == len(lengths) and figures["tokens"] == int(lengths.sum())
        assert figures["mean_length"] == pytest.approx(lengths.mean(), abs=0.005)  # rounded to 2 decimals
        assert figures["p90_length"] == pytest.approx(np.percentile(lengths, 90), abs=1e-9)
    assert len(seen) == len(pool) == sum(fold["rows"] for fold in folds["per_fold"])  # folds cover the pool
    rows = [fold["rows"] for fold in folds["per_fold"]]
    tokens = [fold["tokens"] for fold in folds["per_fold"]]
    assert folds["largest_smallest_rows"] == pytest.approx(max(rows) / min(rows), abs=5e-5)  # 4 decimals
    assert folds["largest_smallest_tokens"] == pytest.approx(max(tokens) / min(tokens), abs=5e-5)
    # balanced: each fold's rows within 4 standard deviations of the binomial spread around len(pool) / 4
    assert np.abs(np.array(rows) - len(pool) / 4).max() <= 4 * np.sqrt(len(pool) * 0.25 * 0.75)


def test_a_split_without_folds_reports_none(sample_texts, bpe_tokenizer):
    _, _, report, _ = _fold_runs(
        pd.DataFrame({"text": list(sample_texts)}), {"max_length": 64}, bpe_tokenizer
    )
    assert "folds" not in report and set(report["splits"]) == {"train", "validation", "test"}


def test_a_fold_split_and_a_plain_split_of_the_same_texts_have_one_test_split_identity(
    sample_texts, bpe_tokenizer
):
    """split.folds is part of the data fingerprint, so the run comparison showed a k-fold run as on other
    data than a run on the same texts split without folds, although its test split holds the same rows:
    their test figures compare. The test split's identity (recorded by train, logged as data.test) is the
    same for both; another salt (other test rows) or another max_length (other test tokens) changes it."""
    raw = pd.DataFrame({"text": list(sample_texts)})
    identities = {}
    for name, params in {
        "plain": {"max_length": 64},
        "folds": {"max_length": 64, "folds": 2},
        "folds3": {"max_length": 64, "folds": 3},
        "salted": {"max_length": 64, "folds": 2, "hash_salt": "other"},
        "shorter": {"max_length": 32},
    }.items():
        tokenized, fingerprint, _, _ = _fold_runs(raw, params, bpe_tokenizer)
        identities[name] = (
            data_identity(fingerprint),
            identity_of_test_split(fingerprint, tokenized["test"]),
        )
    assert identities["plain"][0] != identities["folds"][0] != identities["folds3"][0]  # the data differs
    assert identities["plain"][1] == identities["folds"][1] == identities["folds3"][1]  # its test split not
    assert len({identities[name][1] for name in ("plain", "salted", "shorter")}) == 3
    assert identity_of_test_split(None, tokenized["test"]) is None  # no record: nothing to compare
