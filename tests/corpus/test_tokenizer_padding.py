"""A tokenizer folder whose tokenizer.json turns on its own padding and truncation (BERT-family folders often
pad to a fixed length and cut at 128): fastlm tokenizes with both off and applies only split.max_length."""

import json

import numpy as np
import pandas as pd
import pytest
from transformers import AutoTokenizer

from fastlm.corpus.fingerprint import tokenizer_digest
from fastlm.corpus.prompts import prompt_token_ids, tokenize_pairs
from fastlm.corpus.tokenization import tokenize_texts
from fastlm.corpus.tokenizer_source import load_tokenizer
from fastlm.pipelines.split import nodes

FOLDER_LENGTH = 128  # what the folder pads and cuts to
MAX_LENGTH = 320  # split.max_length, larger than the folder's length


def _padded_folder(tokenizer, folder):
    """``tokenizer`` saved to ``folder``, its tokenizer.json padding to a fixed 128 and truncating at 128."""
    tokenizer.save_pretrained(folder)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["padding"] = {
        "strategy": {"Fixed": FOLDER_LENGTH},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": tokenizer.eos_token_id,
        "pad_type_id": 0,
        "pad_token": tokenizer.eos_token,
    }
    spec["truncation"] = {
        "direction": "Right",
        "max_length": FOLDER_LENGTH,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return folder


@pytest.fixture
def long_texts(sample_texts):
    """Texts of ~170 to ~500 tokens (several past MAX_LENGTH) and short ones."""
    return [" ".join(sample_texts[start : start + 5]) for start in range(0, 100, 5)] + sample_texts[:10]


def _rows(tokens):
    return [tokens.values[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)]


@pytest.mark.parametrize("num_proc", [1, 2])
@pytest.mark.parametrize("load", ["fastlm", "transformers"])
def test_folder_padding_and_truncation_never_reach_the_samples(
    bpe_tokenizer, long_texts, tmp_path, num_proc, load
):
    folder = _padded_folder(bpe_tokenizer, tmp_path)
    # load_tokenizer (split), or a plain AutoTokenizer (one an older split saved, loaded by the catalog)
    tokenizer = load_tokenizer(str(folder)) if load == "fastlm" else AutoTokenizer.from_pretrained(folder)
    got = tokenize_texts(long_texts, tokenizer, max_length=MAX_LENGTH, batch_size=8, num_proc=num_proc)
    expected = tokenize_texts(long_texts, bpe_tokenizer, max_length=MAX_LENGTH, batch_size=8, num_proc=1)
    eos = bpe_tokenizer.eos_token_id
    full = [len(bpe_tokenizer(text)["input_ids"]) for text in long_texts]
    assert max(full) > MAX_LENGTH and any(FOLDER_LENGTH < n < MAX_LENGTH for n in full)  # the texts test it
    assert _rows(got) == _rows(expected)
    assert all(row.count(eos) == 1 for row in _rows(got))  # no pad (= EOS here) appended
    assert got.lengths.tolist() == [min(n + 1, MAX_LENGTH) for n in full]
    assert got.truncated.tolist() == [n + 1 > MAX_LENGTH for n in full]


def test_prompt_pairs_ignore_the_folder_padding(bpe_tokenizer, long_texts, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(_padded_folder(bpe_tokenizer, tmp_path))
    prompts, responses = long_texts[::2], long_texts[1::2]
    got = tokenize_pairs(prompts, responses, tokenizer, max_length=MAX_LENGTH, num_proc=1)
    expected = tokenize_pairs(prompts, responses, bpe_tokenizer, max_length=MAX_LENGTH, num_proc=1)
    assert _rows(got) == _rows(expected) and got.prompt_lengths.tolist() == expected.prompt_lengths.tolist()
    assert got.truncated.tolist() == expected.truncated.tolist() and got.truncated.any()
    assert prompt_token_ids(tokenizer, long_texts[0]) == bpe_tokenizer(long_texts[0])["input_ids"]


def test_the_tokenizer_split_saves_has_no_padding_or_truncation(bpe_tokenizer, tmp_path):
    tokenizer = load_tokenizer(str(_padded_folder(bpe_tokenizer, tmp_path / "in")))
    tokenizer.save_pretrained(tmp_path / "out")
    spec = json.loads((tmp_path / "out/tokenizer.json").read_text(encoding="utf-8"))
    assert spec["padding"] is None and spec["truncation"] is None
    # the ids are the same, so is the data fingerprint (also before any call switched the settings off)
    raw = AutoTokenizer.from_pretrained(tmp_path / "in")
    assert tokenizer_digest(raw) == tokenizer_digest(tokenizer) == tokenizer_digest(bpe_tokenizer)


def test_split_report_counts_what_split_max_length_cut(bpe_tokenizer, long_texts, tmp_path):
    folder = _padded_folder(bpe_tokenizer, tmp_path)
    params = {
        "max_length": MAX_LENGTH,
        "tokenizer": {"source": str(folder)},
        "ratios": {"train": 0.5, "validation": 0.25, "test": 0.25},
    }
    clean, counts = nodes.clean_corpus(pd.DataFrame({"text": long_texts}), params)
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    tokenizer = nodes.build_tokenizer(splits, params)
    tokenized, fingerprint, stats = nodes.tokenize_corpus(splits, tokenizer, params)
    report, _ = nodes.report_split(split_counts, stats, fingerprint)
    full = {text: len(bpe_tokenizer(text)["input_ids"]) for text in splits["text"]}
    assert sum(part["truncated_rows"] for part in report["splits"].values()) == sum(
        n + 1 > MAX_LENGTH for n in full.values()
    )
    lengths = np.concatenate([np.array(part["length"]) for part in tokenized.values()])
    assert lengths.max() == MAX_LENGTH
    assert sorted(lengths) == sorted(min(n + 1, MAX_LENGTH) for n in full.values())
