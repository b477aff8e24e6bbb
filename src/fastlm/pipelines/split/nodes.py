"""Nodes of the split pipeline: each validates ``params:split`` once, then calls the corpus library."""

from __future__ import annotations

import hashlib
import logging

import datasets
import numpy as np
import pandas as pd

from fastlm.corpus.cleaning import clean_texts
from fastlm.corpus.fingerprint import make_fingerprint
from fastlm.corpus.params import TRAIN_TOKENIZER, parse_split_params
from fastlm.corpus.splitting import SPLITS, assign_splits, cap_rows, text_keys
from fastlm.corpus.statistics import build_report, length_summary
from fastlm.corpus.tokenization import tokenize_texts
from fastlm.corpus.tokenizer_source import load_tokenizer, train_bpe_tokenizer
from fastlm.errors import InputDataError

log = logging.getLogger(__name__)


def clean_corpus(raw: pd.DataFrame, params: dict) -> tuple[pd.DataFrame, dict]:
    """NFC + strip, drop missing/non-string/empty/whitespace-only rows and exact duplicates."""
    config = parse_split_params(params)
    source = raw.attrs.get("source_path", "raw_corpus")
    if config.text_column not in raw.columns:
        raise InputDataError(
            f"{source} has no column {config.text_column!r}; its columns are {list(map(str, raw.columns))}.",
            fix="set split.text_column to one of them (--params split.text_column=<name>).",
        )
    if config.tokenizer.source != TRAIN_TOKENIZER:  # fail now, before any output is written
        load_tokenizer(config.tokenizer.source, **config.tokenizer.model_dump(include={"allow_download", "trust_remote_code"}))
    kept, drops = clean_texts(raw[config.text_column])
    log.info("Cleaned %d raw rows of %s: kept %d, dropped %s", len(raw), source, len(kept), drops)
    if kept.empty:
        raise InputDataError(
            f"no usable text left in {source} after cleaning {len(raw)} rows (dropped: {drops}).",
            fix=f"check that split.text_column ({config.text_column!r}) holds the texts.",
        )
    return kept.to_frame(), {"raw_rows": len(raw), "dropped": drops, "source": source}


def split_corpus(clean: pd.DataFrame, cleaning: dict, params: dict) -> tuple[pd.DataFrame, dict]:
    """Assign train/validation/test by a keyed hash of each text; apply the max_samples cap."""
    config = parse_split_params(params)
    keys = text_keys(clean["text"], config.hash_salt)
    keep = cap_rows(keys[:, 1], config.max_samples)
    ratios = config.ratios
    codes = assign_splits(keys[keep, 0], ratios.train, ratios.validation, ratios.test)
    splits = pd.DataFrame(
        {"text": clean["text"].to_numpy()[keep], "split": pd.Categorical.from_codes(codes, categories=list(SPLITS))}
    )
    counts = splits["split"].value_counts().reindex(SPLITS).to_dict()
    for name in SPLITS:
        if counts[name] == 0 and getattr(ratios, name) > 0:
            log.warning("Split %r is empty: %d texts are too few for ratio %g.", name, len(splits), getattr(ratios, name))
    if counts["train"] == 0:
        raise InputDataError(f"the train split is empty ({len(splits)} texts).", fix="give more texts or raise split.ratios.train.")
    log.info("Split %d texts: %s", len(splits), counts)
    return splits, {**cleaning, "capped_by_max_samples": int(len(clean) - len(keep))}


def build_tokenizer(splits: pd.DataFrame, params: dict):
    """Train a byte-level BPE on the train split (the default), or load the configured tokenizer."""
    config = parse_split_params(params).tokenizer
    if config.source != TRAIN_TOKENIZER:
        return load_tokenizer(config.source, allow_download=config.allow_download, trust_remote_code=config.trust_remote_code)
    train = splits.loc[splits["split"] == "train", "text"].tolist()[: config.training_samples]
    tokenizer = train_bpe_tokenizer(
        train, vocab_size=config.vocab_size, min_frequency=config.min_frequency,
        model_max_length=parse_split_params(params).max_length,
    )
    log.info("Trained a byte-level BPE on %d train texts: %d tokens", len(train), len(tokenizer))
    return tokenizer


def tokenize_corpus(splits: pd.DataFrame, tokenizer, params: dict) -> tuple[datasets.DatasetDict, dict, dict]:
    """Unpadded token ids with EOS appended, truncated at max_length; fingerprint; length stats."""
    config = parse_split_params(params)
    tokens = tokenize_texts(
        splits["text"].tolist(), tokenizer, max_length=config.max_length,
        batch_size=config.batch_size, num_proc=config.num_proc,
    )
    codes = splits["split"].cat.codes.to_numpy()
    rows = {name: np.flatnonzero(codes == index) for index, name in enumerate(SPLITS)}
    tokenized = datasets.DatasetDict({name: datasets.Dataset(tokens.to_arrow(rows[name])) for name in SPLITS})
    row_hashes = pd.util.hash_pandas_object(splits, index=False).to_numpy()
    fingerprint = make_fingerprint(tokenizer, config.max_length, data_digest=hashlib.sha256(row_hashes.tobytes()).hexdigest())
    stats = {name: length_summary(tokens.lengths[rows[name]], tokens.truncated[rows[name]]) for name in SPLITS}
    log.info("Tokenized %d texts into %d tokens (max_length %d)", len(splits), len(tokens.values), config.max_length)
    return tokenized, fingerprint, stats


def report_split(counts: dict, length_stats: dict, fingerprint: dict) -> tuple[dict, pd.DataFrame]:
    """The split report as JSON (everything) and CSV (one row per split)."""
    report = build_report(
        counts["raw_rows"], counts["dropped"], counts["capped_by_max_samples"], length_stats,
        {"source": counts["source"], "fingerprint": fingerprint["fingerprint"], "max_length": fingerprint["params"]["max_length"]},
    )
    table = pd.DataFrame([{"split": name, **stats} for name, stats in length_stats.items()])
    return report, table
