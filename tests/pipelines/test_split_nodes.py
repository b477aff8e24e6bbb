import numpy as np
import pandas as pd
import pytest

from fastlm.corpus.fingerprint import check_fresh
from fastlm.errors import InputDataError
from fastlm.pipelines.split import nodes

PARAMS = {
    "ratios": {"train": 0.8, "validation": 0.1, "test": 0.1},
    "max_length": 24,
    "tokenizer": {"vocab_size": 400},
}


@pytest.fixture
def raw(sample_texts):
    frame = pd.DataFrame(
        {"body": sample_texts + ["", None, sample_texts[0]], "id": range(len(sample_texts) + 3)}
    )
    frame.attrs["source_path"] = "data/01_raw/reviews.csv"
    return frame


def test_clean_corpus_names_the_file_and_lists_columns(raw):
    with pytest.raises(InputDataError) as error:
        nodes.clean_corpus(raw, {})
    assert "data/01_raw/reviews.csv has no column 'text'; its columns are ['body', 'id']" in str(error.value)


def test_clean_corpus_refuses_an_empty_result(raw):
    frame = pd.DataFrame({"text": ["", "  ", None]})
    with pytest.raises(InputDataError, match="no usable text left"):
        nodes.clean_corpus(frame, {})


def test_nodes_chain_into_tokenized_splits_and_a_report(raw, sample_texts):
    params = {**PARAMS, "text_column": "body"}
    clean, counts = nodes.clean_corpus(raw, params)
    assert counts["dropped"]["empty"] == 1 and counts["dropped"]["missing"] == 1
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    assert set(splits["split"].unique()) == {"train", "validation", "test"}
    assert len(splits) == len(set(sample_texts))
    tokenizer = nodes.build_tokenizer(splits, params)
    tokenized, fingerprint, stats = nodes.tokenize_corpus(splits, tokenizer, params)
    assert {name: len(part) for name, part in tokenized.items()} == splits["split"].value_counts().to_dict()
    lengths = np.array(tokenized["train"]["length"])
    assert lengths.max() <= 24 and np.all(lengths == [len(ids) for ids in tokenized["train"]["input_ids"]])
    check_fresh(fingerprint, tokenizer, 24, where="tokenized")
    report, table = nodes.report_split(split_counts, stats, fingerprint)
    assert report["kept_rows"] == len(splits) and report["dropped"]["total"] == 3
    assert list(table["split"]) == ["train", "validation", "test"]
    assert table["truncated_share"].between(0, 1).all()


def test_max_samples_caps_deterministically(raw):
    params = {**PARAMS, "text_column": "body", "max_samples": 50}
    clean, counts = nodes.clean_corpus(raw, params)
    first, first_counts = nodes.split_corpus(clean, counts, params)
    second, _ = nodes.split_corpus(
        clean.sample(frac=1, random_state=1).reset_index(drop=True), counts, params
    )
    assert len(first) == 50 and set(first["text"]) == set(second["text"])
    assert first_counts["capped_by_max_samples"] == len(clean) - 50
