"""Nodes of the split pipeline: each validates ``params:split`` once, then calls the corpus library (its
steps are ``fastlm.corpus.split_steps``)."""

from __future__ import annotations

import logging

import datasets
import numpy as np
import pandas as pd

from fastlm.corpus.config import TRAIN_TOKENIZER
from fastlm.corpus.fingerprint import tokenized_digests
from fastlm.corpus.pretokenized import id_tokenizer
from fastlm.corpus.prompts import SYSTEM_TURN
from fastlm.corpus.split_steps import (
    MADE_WITH,
    check_made_with,
    clean_id_lists,
    clean_rows,
    grouped_rows,
    match_columns,
    measure_splits,
    require_columns,
    split_fingerprint,
    split_rows,
    splits_made_with,
    tokenize_rows,
    tokenizer_texts,
    training_system_turn,
)
from fastlm.corpus.splitting import FOLD_COLUMN, SPLITS
from fastlm.corpus.statistics import FOLDS, build_report
from fastlm.corpus.tokenizer_source import (
    load_tokenizer,
    record_settings,
    settings_changes,
    train_bpe_tokenizer,
)
from fastlm.errors import ConfigError
from fastlm.parameters import parse_group

log = logging.getLogger(__name__)


def clean_corpus(raw: pd.DataFrame, params: dict) -> tuple[pd.DataFrame, dict]:
    """NFC + strip, drop missing/non-string/empty/whitespace-only rows and exact duplicates.

    Prompt/response data (``split.prompt_column`` + ``response_column``, or ``messages_column``) is also
    rendered here (prompt template or chat template, see ``fastlm.corpus.prompts``), keyed on the raw pair.
    """
    config = parse_group("split", params)
    source = raw.attrs.get("source_path", "raw_corpus")
    raw = match_columns(raw, config, source)
    require_columns(raw, config, source)
    if config.pretokenized:
        clean, counts = clean_id_lists(raw, config, source)
        return clean, {**counts, MADE_WITH: splits_made_with(config)}
    tokenizer = None
    if config.tokenizer.source != TRAIN_TOKENIZER:  # fail now, before any output is written
        tokenizer = load_tokenizer(  # build_tokenizer loads it again for the data and says what it lacks
            config.tokenizer.source,
            **config.tokenizer.model_dump(include={"allow_download", "trust_remote_code"}),
            warn=False,
        )
    clean, counts = clean_rows(raw, config, source, tokenizer)
    # the settings (and chat template) the splits are made with: a run of the later nodes must have them
    return clean, {**counts, MADE_WITH: splits_made_with(config, tokenizer)}


def split_corpus(clean: pd.DataFrame, cleaning: dict, params: dict) -> tuple[pd.DataFrame, dict]:
    """Assign train/validation/test by a keyed hash of each text (or raw prompt/response pair; the rows
    sharing a prompt by the prompt's, counted under ``grouped_by_prompt``); apply the max_samples cap."""
    config = parse_group("split", params)
    splits, keep, codes = split_rows(clean, config)
    split_counts = {**cleaning, "capped_by_max_samples": int(len(clean) - len(keep))}
    grouped = grouped_rows(clean, keep)
    if grouped is not None:  # the kept rows split with others by a shared prompt, and those prompts
        split_counts["grouped_by_prompt"] = grouped
    if SYSTEM_TURN in clean:  # the system turn every chat the model trains on (train, capped) began with
        turns = clean[SYSTEM_TURN].to_numpy()[keep][codes == SPLITS.index("train")]
        system, said = training_system_turn(turns)
        if system is not None:
            split_counts["system_prompt"] = system
        if said:
            log.info("%s", said)
    return splits, split_counts


def build_tokenizer(splits: pd.DataFrame, params: dict, split_counts: dict | None = None):
    """Train a byte-level BPE on the train split (the default), or load the configured tokenizer; refused
    before it is saved where the splits were made with other settings (``split_counts``, a run of the
    split's later nodes)."""
    split = parse_group("split", params)
    tokenizer = _tokenizer(splits, split)
    check_made_with(split_counts, split, tokenizer)
    return tokenizer


def _tokenizer(splits: pd.DataFrame, split):
    """The id vocabulary of pre-tokenized data, the configured tokenizer, or a BPE trained on the train
    split."""
    if split.pretokenized:
        eos, pad = split.special_ids
        log.info(
            "Pre-tokenized data: ids 0..%d, EOS %d, pad %d (no tokenizer trained)",
            split.vocab_size - 1,
            eos,
            pad,
        )
        return id_tokenizer(split.vocab_size, eos_id=eos, pad_id=pad, model_max_length=split.max_length)
    config = split.tokenizer
    if config.source != TRAIN_TOKENIZER:
        tokenizer = load_tokenizer(
            config.source, allow_download=config.allow_download, trust_remote_code=config.trust_remote_code
        )
        record_settings(tokenizer, config)
        return tokenizer
    train = tokenizer_texts(splits, split, config.training_samples)
    tokenizer = train_bpe_tokenizer(
        train,
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        model_max_length=split.max_length,
    )
    record_settings(tokenizer, config)
    # prompt/response rows give the BPE their prompts and responses: counted as rows, as training_samples is
    rows = "texts" if "text" in splits else "rows (their prompts and responses)"
    count = len(train) if "text" in splits else len(train) // 2
    log.info("Trained a byte-level BPE on %d train %s: %d tokens", count, rows, len(tokenizer))
    return tokenizer


def tokenize_corpus(
    splits: pd.DataFrame, tokenizer, params: dict, split_counts: dict | None = None
) -> tuple[datasets.DatasetDict, dict, dict]:
    """Unpadded token ids with EOS appended, truncated at max_length; fingerprint; length stats.

    Prompt/response rows become prompt ids + response ids + EOS with a ``prompt_length`` column. The system
    turn every chat begins with (``split_counts``' ``system_prompt``) is recorded with the fingerprint, for
    predict and the report to ask the model as it was trained.
    """
    config = parse_group("split", params)
    check_made_with(split_counts, config, tokenizer)  # a run of the later nodes: the splits' own settings
    changed = [] if config.pretokenized else settings_changes(tokenizer, config.tokenizer)
    if changed:  # a run of the later nodes from tokenize_corpus: the saved tokenizer, not one built anew
        raise ConfigError(
            f"the tokenizer this run tokenizes with was made with other settings ({'; '.join(changed)}): "
            "build_tokenizer made it, and the data would be recorded as tokenized with the new ones.",
            fix="run the split from build_tokenizer: kedro run --pipeline=split --from-nodes build_tokenizer "
            "(or keep the settings the tokenizer had).",
        )
    tokens = tokenize_rows(splits, tokenizer, config)
    codes = splits["split"].cat.codes.to_numpy()
    rows = {name: np.flatnonzero(codes == index) for index, name in enumerate(SPLITS)}
    # split.folds: each sample keeps its fold bucket, so train.fold picks a fold without re-tokenizing.
    folds = splits[FOLD_COLUMN].to_numpy() if FOLD_COLUMN in splits else None
    extra = {FOLD_COLUMN: folds} if folds is not None else None
    tokenized = datasets.DatasetDict(
        {name: datasets.Dataset(tokens.to_arrow(rows[name], extra)) for name in SPLITS}
    )
    fingerprint = split_fingerprint(splits, tokenizer, config, (split_counts or {}).get("system_prompt"))
    fingerprint["splits"] = tokenized_digests(tokenized)  # a split file replaced or edited since is refused
    stats = measure_splits(tokens, rows, tokenizer, config, folds)
    log.info(
        "Tokenized %d texts into %d tokens (max_length %d)",
        len(splits),
        len(tokens.values),
        config.max_length,
    )
    return tokenized, fingerprint, stats


def report_split(counts: dict, length_stats: dict, fingerprint: dict) -> tuple[dict, pd.DataFrame]:
    """The split report as JSON (everything: with ``split.folds``, each fold's figures under ``folds``) and
    CSV (one row per split)."""
    data_format = (fingerprint.get("params") or {}).get("data_format")
    splits = {name: stats for name, stats in length_stats.items() if name != FOLDS}
    report = build_report(
        counts["raw_rows"],
        counts["dropped"],
        counts["capped_by_max_samples"],
        splits,
        {
            "source": counts["source"],
            "fingerprint": fingerprint["fingerprint"],
            "max_length": fingerprint["params"]["max_length"],
            # prompt/response pairs and chats: the rows split as one with others by a shared prompt
            **({"grouped_by_prompt": counts["grouped_by_prompt"]} if "grouped_by_prompt" in counts else {}),
            # the system turn every chat begins with: predict and the report ask the model after it
            **({"system_prompt": counts["system_prompt"]} if "system_prompt" in counts else {}),
            # chats' tools and tool calls (split.tools_column): the report's training summary says them
            **({"tool_use": counts["tool_use"]} if "tool_use" in counts else {}),
            # how the prompts were rendered and what was trained: the report's training summary says it
            **({"data_format": data_format} if data_format else {}),
            # split.folds: each fold's rows, tokens, mean and p90 length, and the largest / smallest fold
            **({FOLDS: length_stats[FOLDS]} if FOLDS in length_stats else {}),
        },
    )
    table = pd.DataFrame([{"split": name, **stats} for name, stats in splits.items()])
    return report, table
