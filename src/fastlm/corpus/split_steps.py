"""The split's steps on the raw table, under the validated split parameters (``corpus.config.SplitParams``):
clean it (texts, prompt/response pairs, chats or pre-tokenized id lists, with what the settings change
nothing of said), split it, gather the tokenizer's training texts, tokenize it and measure it. The split
pipeline's nodes call them between the catalog's datasets; each refusal is one line before anything is
written (``fastlm.errors.InputDataError``)."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from fastlm.corpus.chat_template import has_chat_template, unread_variables
from fastlm.corpus.cleaning import clean_texts, line_spaces_keys, not_utf8_error, typed_not_text
from fastlm.corpus.fingerprint import (
    data_format_params,
    make_fingerprint,
    rows_digest,
    selection_params,
    ungrouped_split,
)
from fastlm.corpus.pretokenized import id_texts, parse_id_texts
from fastlm.corpus.prompts import (
    SPLIT_GROUP,
    SYSTEM_TURN,
    TOOL_USE,
    chat_turns,
    common_system_prompt,
    malformed_chat,
    prompt_frame,
    tokenize_pairs,
)
from fastlm.corpus.readers import matching_column, separator_hint
from fastlm.corpus.shards import SHARDS, shard_row, texts_as_written
from fastlm.corpus.splitting import FOLD_COLUMN, SPLITS, assign_folds, assign_splits, cap_rows, text_keys
from fastlm.corpus.statistics import (
    FOLDS,
    UNKNOWN_WARNING_SHARE,
    fold_summary,
    length_summary,
    unknown_per_row,
    unknown_summary,
)
from fastlm.corpus.tokenization import TokenizedTexts, cut_long_texts, encode_id_lists, tokenize_texts
from fastlm.errors import ConfigError, InputDataError

__all__ = [
    "TRUNCATION_WARNING_SHARE",
    "MADE_WITH",
    "check_folds",
    "check_made_with",
    "check_template_variables",
    "clean_id_lists",
    "clean_rows",
    "data_columns",
    "grouped_rows",
    "match_columns",
    "measure_splits",
    "split_fingerprint",
    "require_columns",
    "splits_made_with",
    "split_rows",
    "tokenize_rows",
    "tokenizer_texts",
    "training_system_turn",
]

log = logging.getLogger(__name__)
# From this share of the train rows cut by split.max_length, the split says so (the report counts any).
TRUNCATION_WARNING_SHARE = 0.05
# The split counts' record of the settings that made the splits (``splits_made_with``).
MADE_WITH = "made_with"
# The split parameters the nodes after the splits read alone: a run of those nodes may change them.
_LATER_PARAMS = {"max_length", "tokenizer", "batch_size", "num_proc"}
# The record of how the rows sharing a prompt were split (``fingerprint.SPLIT_GROUPS``), in both records.
SPLIT_GROUPS_KEY = "split_groups"


def clean_rows(raw: pd.DataFrame, config, source: str, tokenizer=None) -> tuple[pd.DataFrame, dict]:
    """Texts, prompt/response pairs or chats of ``raw`` cleaned (prompts rendered with ``tokenizer``, the
    configured one, None where the split trains its own), and the counts of the split report."""
    place = shard_row(raw.attrs)
    if config.data_format in ("text", "prompt_response"):  # a CSV's cells are text, numbers too ("007")
        raw = texts_as_written(raw, [column for _, column in data_columns(config)])
        for name, column in data_columns(config):
            error = not_utf8_error(
                raw[column], f"column {column!r} (split.{name})", source, "raw_path", place
            )
            if error is not None:
                raise error
    if config.data_format == "text":
        kept, drops = clean_texts(raw[config.text_column])
        kept = kept.to_frame()
    else:
        kept, drops = prompt_frame(raw, config, tokenizer)
        if config.data_format == "messages":
            log.info(
                "Messages rendered with %s",
                "the tokenizer's chat template"
                + (f" and {config.chat_template_kwargs}" if config.chat_template_kwargs else "")
                if config.chat_template and has_chat_template(tokenizer)
                else "split.prompt_template",
            )
    check_template_variables(config, tokenizer)
    say_unread_settings(config)
    if drops.get("tool_calls"):
        log.warning(
            "%d chats hold tool calls or tool turns, which no chat template renders here (%s): they are "
            "dropped (split report: dropped.tool_calls); the other chats of split.messages_column train as "
            "usual. Fix: a tokenizer whose chat template renders tool calls (split.tokenizer.source)",
            drops["tool_calls"],
            "split.chat_template is false"
            if not config.chat_template
            else f"the tokenizer ({config.tokenizer.source}) has no chat template",
        )
    log.info("Cleaned %d raw rows of %s: kept %d, dropped %s", len(raw), source, len(kept), drops)
    if kept.empty:
        malformed = (
            malformed_chat(chat_turns(raw, config), place) if config.data_format == "messages" else None
        )
        columns = ", ".join(f"split.{name} ({column!r})" for name, column in data_columns(config))
        typed = [
            f"split.{name} ({column!r}) holds {kind}, not texts"
            for name, column in data_columns(config)
            if column in raw.columns and (kind := typed_not_text(raw[column])) is not None
        ]
        raise InputDataError(
            f"no usable {'text' if config.data_format == 'text' else 'prompt/response row'} left in {source} "
            f"after cleaning {len(raw)} rows (dropped: {drops})"
            + (f"; split.messages_column {config.messages_column!r}: {malformed}." if malformed else "")
            + (f"; {'; '.join(typed)}." if typed else "" if malformed else "."),
            fix=f"check that {columns} hold the data"
            + (
                ": each row a list of {role, content} turns (or ShareGPT {from, value} ones), each content "
                "a text, ending with the assistant's answer (a JSON list in a .jsonl or Parquet file, not a "
                "string)."
                if malformed
                else "."
            ),
        )
    counts = {"raw_rows": len(raw), "dropped": drops, "source": source, "data_format": config.data_format}
    if TOOL_USE in kept.attrs:
        counts[TOOL_USE] = kept.attrs.pop(TOOL_USE)  # the split report's, not the data's
    return kept, counts


# The split settings some data formats alone read, with why the others do not: each changes nothing there.
_IDS = (("pretokenized",), "pre-tokenized data alone reads it (split.pretokenized is false)")
_PROMPTS = (("prompt_response", "messages"), "the data holds neither prompt/response pairs nor chats")
_CHATS = (("messages",), "the data is not chat messages (split.messages_column)")
_FORMAT_SETTINGS = {
    **dict.fromkeys(("ids_column", "vocab_size", "eos_id", "pad_id"), _IDS),
    "prompt_template": _PROMPTS,
    **dict.fromkeys(("chat_template", "tools_column"), _CHATS),
}
_TRAINED_BPE = ("vocab_size", "min_frequency", "training_samples")


def say_unread_settings(config) -> None:
    """One warning naming the split settings set away from their defaults that the data's format never reads
    (``split.vocab_size`` meant for the BPE on text data, a prompt template on plain texts, a tokenizer for
    pre-tokenized ids, the BPE's settings with a tokenizer folder), and why: each changes nothing."""
    defaults = type(config)()
    unread = []
    for key, (formats, why) in _FORMAT_SETTINGS.items():
        value = getattr(config, key)
        if config.data_format not in formats and value != getattr(defaults, key):
            if key == "vocab_size":
                why += "; the BPE's vocabulary is split.tokenizer.vocab_size"
            unread.append(f"split.{key} = {value!r} ({why})")
    tokenizer, default = config.tokenizer, defaults.tokenizer
    if config.pretokenized:
        keys, why = type(tokenizer).model_fields, "pre-tokenized ids are read by no tokenizer"
    elif tokenizer.source != default.source:
        keys, why = (
            _TRAINED_BPE,
            f"only the BPE the split trains (split.tokenizer.source: {default.source}) reads it",
        )
    else:
        keys = ()
    unread += [
        f"split.tokenizer.{key} = {getattr(tokenizer, key)!r} ({why})"
        for key in keys
        if getattr(tokenizer, key) != getattr(default, key)
    ]
    if unread:
        log.warning("split settings that change nothing for this data: %s", "; ".join(unread))


def check_template_variables(config, tokenizer) -> None:
    """Say where ``split.chat_template_kwargs`` change nothing: no chat template renders the data, or the
    template never mentions a name (misspelled, or another model family's variable); and where
    ``split.train_turns: last`` does: data that is not chats."""
    if config.train_turns != "all" and config.data_format != "messages":
        log.warning(
            "split.train_turns: %s changes nothing: the data is not chat messages (split.messages_column), "
            "whose answers it chooses among",
            config.train_turns,
        )
    variables = config.chat_template_kwargs
    if not variables:
        return
    rendered = config.data_format == "messages" and config.chat_template and has_chat_template(tokenizer)
    if not rendered:
        why = (
            "the data is not chat messages (split.messages_column)"
            if config.data_format != "messages"
            else "split.chat_template is false"
            if not config.chat_template
            else f"the tokenizer ({config.tokenizer.source}) has no chat template"
        )
        log.warning("split.chat_template_kwargs %s change nothing: %s", variables, why)
        return
    unread = unread_variables(tokenizer, variables)
    if unread:
        log.warning(
            "split.chat_template_kwargs: the chat template of %s never mentions %s, so %s nothing "
            "(misspelled, or another model family's variable?)",
            config.tokenizer.source,
            ", ".join(unread),
            "it changes" if len(unread) == 1 else "they change",
        )


def clean_id_lists(raw: pd.DataFrame, config, source: str) -> tuple[pd.DataFrame, dict]:
    """Pre-tokenized rows: every id list checked (one bad row refuses the file), exact duplicates dropped."""
    say_unread_settings(config)
    eos, _ = config.special_ids
    ids = id_texts(
        raw[config.ids_column],
        vocab_size=config.vocab_size,
        eos_id=eos,
        source=source,
        param=f"split.ids_column ({config.ids_column!r})",
        place=shard_row(raw.attrs),
    )
    texts = pd.Series(ids, name="text", dtype=object)
    kept = texts.drop_duplicates().to_frame()
    drops = {"duplicate": int(len(texts) - len(kept))}
    log.info(
        "Checked %d pre-tokenized rows of %s (vocab_size %d): kept %d, dropped %s",
        len(raw),
        source,
        config.vocab_size,
        len(kept),
        drops,
    )
    if kept.empty:
        raise InputDataError(f"{source} has no rows.", fix=f"fill split.ids_column ({config.ids_column!r}).")
    return kept, {"raw_rows": len(raw), "dropped": drops, "source": source, "data_format": config.data_format}


def data_columns(config) -> list[tuple[str, str]]:
    """(parameter, column) pairs the configured data format reads."""
    names = {
        "text": ["text_column"],
        "prompt_response": ["prompt_column", "response_column"],
        "messages": ["messages_column"],
        "pretokenized": ["ids_column"],
    }[config.data_format]
    return [(name, getattr(config, name)) for name in names]


def match_columns(raw: pd.DataFrame, config, source: str) -> pd.DataFrame:
    """``raw`` with each column the data's parameters (``data_columns``, ``split.tools_column``) name but that
    ``raw`` spells otherwise, with white space around it (a CSV header ``id, text``) or decomposed (NFD, a
    header saved on macOS), renamed to the parameter's spelling (``readers.matching_column``), said in one
    warning each; any other ``raw`` as it is."""
    names = data_columns(config)
    if config.data_format == "messages" and config.tools_column is not None:
        names.append(("tools_column", config.tools_column))
    renamed = {}
    for name, column in names:
        found = matching_column(raw.columns, column)
        if found is not None and found != column and column not in renamed.values():
            renamed[found] = column
            log.warning(
                "split.%s %r is read from the column %r of %s: the same name %s",
                name,
                column,
                found,
                source,
                "with white space around it"
                if found.strip() != found
                else "decomposed (NFD, as macOS writes it)",
            )
    return raw.rename(columns=renamed) if renamed else raw


def require_columns(raw: pd.DataFrame, config, source: str) -> None:
    for name, column in data_columns(config):
        if column not in raw.columns:
            shards = raw.attrs.get(SHARDS)
            hint = separator_hint(raw, shards[0][0] if shards else source)
            if hint is not None:  # one column named after the whole header: another separator
                raise InputDataError(f"{source} has no column {column!r}; {hint[0]}.", fix=hint[1])
            raise InputDataError(
                f"{source} has no column {column!r}; its columns are {list(map(str, raw.columns))}.",
                fix=f"set split.{name} to one of them (--params split.{name}=<name>).",
            )


def split_rows(clean: pd.DataFrame, config) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The rows of ``clean`` kept by ``split.max_samples`` with their ``split`` (a keyed hash of each text or
    raw prompt/response pair, its white space inside lines made single spaces: ``line_spaces_key``) and
    fold, the kept rows' indices and split codes; a split or a fold left empty is refused.

    Rows that share a prompt (``prompts.SPLIT_GROUP``: pairs of one prompt, chats of one conversation) take
    the split and fold of the prompt's key alone, all of them one, said in one line (``grouped_rows``);
    every other row keeps its own key's. The cap draws each row on its own key either way: a row's split
    does not depend on ``split.max_samples``."""
    keyed = clean["split_key"] if "split_key" in clean else line_spaces_keys(clean["text"])
    keys = text_keys(keyed, config.hash_salt)
    if SPLIT_GROUP in clean:
        shared = clean[SPLIT_GROUP].notna().to_numpy()
        if shared.any():
            keys[shared, 0] = text_keys(clean[SPLIT_GROUP].to_numpy()[shared], config.hash_salt)[:, 0]
    keep = cap_rows(keys[:, 1], config.max_samples)
    ratios = config.ratios
    codes = assign_splits(keys[keep, 0], ratios.train, ratios.validation, ratios.test)
    columns = {
        name: clean[name].to_numpy()[keep]
        for name in clean.columns
        if name not in ("split_key", SPLIT_GROUP, SYSTEM_TURN)
    }
    splits = pd.DataFrame({**columns, "split": pd.Categorical.from_codes(codes, categories=list(SPLITS))})
    if config.folds is not None:
        splits[FOLD_COLUMN] = assign_folds(
            keys[keep, 0], codes, config.folds, ratios.train, ratios.validation, ratios.test
        )
    grouped = grouped_rows(clean, keep)
    if grouped and grouped["rows"]:
        chats = config.data_format == "messages"
        log.info(
            "%d of %d %s share %s (%d %s): each %s's rows lie in one split%s, keyed on %s alone, so no "
            "test row asks a prompt a train row trained on (split report: grouped_by_prompt)",
            grouped["rows"],
            len(keep),
            "chats" if chats else "pairs",
            "a prompt or the start of one with another chat" if chats else "their prompt with another pair",
            grouped["prompts"],
            "conversations" if chats else "prompts",
            "conversation" if chats else "prompt",
            " and one fold" if config.folds is not None else "",
            "its shortest prompt" if chats else "the prompt",
        )
    counts = splits["split"].value_counts().reindex(SPLITS).to_dict()
    empty = [name for name in SPLITS if counts[name] == 0]
    # train needs every split (validation for evaluation, test for the report): refuse before writing
    if empty:
        name = empty[0]
        raise InputDataError(
            f"the {name} split would be empty: {len(splits)} text{'' if len(splits) == 1 else 's'} "
            f"with split.ratios.{name} = {getattr(ratios, name):g} give it no text (counts {counts}"
            + (
                f"; {grouped['rows']} of them lie in {grouped['prompts']} groups sharing a prompt, each "
                "group in one split"
                if grouped and grouped["rows"]
                else ""
            )
            + "); nothing was written.",
            fix=f"give more texts (split.max_samples: {config.max_samples}) or raise split.ratios.{name} "
            "(every split needs at least one text).",
        )
    if config.folds is not None:
        check_folds(splits[FOLD_COLUMN].to_numpy(), config)
    log.info("Split %d texts: %s", len(splits), counts)
    return splits, keep, codes


def grouped_rows(clean: pd.DataFrame, keep: np.ndarray) -> dict | None:
    """The kept rows (``keep``: their indices in ``clean``) split with others by a shared prompt
    (``prompts.SPLIT_GROUP``) and the prompts (chats: conversations) they share, for the split report's
    ``grouped_by_prompt``; None for data without prompts (texts, ids)."""
    if SPLIT_GROUP not in clean:
        return None
    groups = clean[SPLIT_GROUP].iloc[keep].dropna()
    return {"rows": int(len(groups)), "prompts": int(groups.nunique())}


def check_folds(folds: np.ndarray, config) -> None:
    """Every fold needs a validation row and leaves train a row: refuse before anything is written."""
    sizes = np.bincount(folds[folds >= 0], minlength=config.folds)
    if sizes.min() == 0 or sizes.sum() - sizes.max() == 0:
        empty = int(np.argmin(sizes)) if sizes.min() == 0 else int(np.argmax(sizes))
        what = "has no row" if sizes.min() == 0 else "holds every row, leaving train none"
        raise InputDataError(
            f"split.folds = {config.folds}: fold {empty} {what} of the {int(sizes.sum())} train + validation "
            "rows; nothing was written.",
            fix=f"lower split.folds or give more texts (split.max_samples: {config.max_samples}).",
        )
    log.info("Folds of train + validation (split.folds = %d): %s rows", config.folds, sizes.tolist())


def training_system_turn(turns) -> tuple[str | None, str | None]:
    """The system turn every training chat of ``turns`` (``prompts.system_turns``' contents) began with, None
    where they differ or begin otherwise, and what to say of it (None: nothing, no chat has one). A missing
    value that is not None (NaN, as a pandas string column stores one) is a chat without a system turn."""
    turns = [turn if isinstance(turn, str) else None for turn in turns]
    system = common_system_prompt(turns)
    if system is not None:
        return (
            system,
            "Every training chat begins with the same system turn: predict and the report ask after it",
        )
    if not any(turn is not None for turn in turns):
        return None, None
    return None, (
        f"The training chats begin with {len({turn for turn in turns if turn is not None})} different system "
        f"turns ({sum(turn is None for turn in turns)} with none): predict and the report ask a text as a "
        "lone user turn; give predict chats (predict.messages_column) to set one"
    )


def tokenizer_texts(splits: pd.DataFrame, split, count: int | None) -> list[str]:
    """The ``count`` train rows' texts a tokenizer is trained on, hash-selected (the smallest capping keys of
    ``split.hash_salt``'s keyed hash, as ``split.max_samples`` chooses: the same texts, and so the same BPE,
    whatever the raw file's row order), each cut as ``tokenize_rows`` cuts it (prompts keep their end): a
    huge text costs no more memory."""
    train_rows = splits.loc[splits["split"] == "train"]
    if "text" in splits:
        keyed = train_rows["text"].tolist()
    else:  # a prompt/response row by its rendered pair
        pairs = zip(train_rows["prompt"], train_rows["response"], strict=True)
        keyed = [f"{prompt}\0{response}" for prompt, response in pairs]
    train_rows = train_rows.iloc[cap_rows(text_keys(keyed, split.hash_salt)[:, 1], count)]
    if "text" in splits:
        return list(cut_long_texts(train_rows["text"].tolist(), split.max_length)[0])
    return [
        *cut_long_texts(train_rows["prompt"].tolist(), split.max_length, keep="tail")[0],
        *cut_long_texts(train_rows["response"].tolist(), split.max_length)[0],
    ]


def split_fingerprint(splits: pd.DataFrame, tokenizer, config, system_prompt: str | None = None) -> dict:
    """The fingerprint of the tokenized ``splits`` (``fingerprint.make_fingerprint``: the rows, the tokenizer
    and the settings that made them), with the system turn every training chat begins with, for predict and
    the report to ask the model as it was trained."""
    fingerprint = make_fingerprint(
        tokenizer,
        config.max_length,
        data_digest=rows_digest(splits),
        data_format=data_format_params(config, tokenizer),
        selection=selection_params(config),
        folds=config.folds,
    )
    if system_prompt is not None and config.data_format == "messages":
        fingerprint["system_prompt"] = system_prompt
    return fingerprint


def tokenize_rows(splits: pd.DataFrame, tokenizer, config) -> TokenizedTexts:
    """Unpadded token ids with EOS appended, truncated at ``split.max_length``: prompt/response rows as
    prompt ids + response ids + EOS with their prompt lengths (and earlier answers' ranges)."""
    encode = {"max_length": config.max_length, "batch_size": config.batch_size, "num_proc": config.num_proc}
    if config.pretokenized:
        return encode_id_lists(
            parse_id_texts(splits["text"].tolist()),
            eos=int(tokenizer.eos_token_id),
            max_length=config.max_length,
        )
    if config.data_format == "text":
        return tokenize_texts(splits["text"].tolist(), tokenizer, **encode)
    answers = splits["answer_spans"].tolist() if "answer_spans" in splits else None
    return tokenize_pairs(
        splits["prompt"].tolist(),
        splits["response"].tolist(),
        tokenizer,
        answer_spans=answers,
        responses_as_text=config.data_format == "prompt_response",  # a chat's may be a template's render
        **encode,
    )


def measure_splits(
    tokens: TokenizedTexts, rows: dict, tokenizer, config, folds: np.ndarray | None = None
) -> dict:
    """Each split's (``rows``: its sample indices) length summary, unknown-token share and target tokens,
    with a warning where ``split.max_length`` cut many train rows or the tokenizer's unknown token is
    common; with ``folds`` (each sample's fold bucket, ``split.folds``), each fold's figures under
    ``FOLDS``, said in one line."""
    stats = {
        name: length_summary(tokens.lengths[rows[name]], tokens.truncated[rows[name]]) for name in SPLITS
    }
    _measure_unknown(stats, tokens, rows, None if config.pretokenized else tokenizer, config)
    _say_truncation(stats["train"], config)
    if tokens.prompt_lengths is not None:
        for name in SPLITS:
            stats[name]["target_tokens"] = int(tokens.target_lengths[rows[name]].sum())
    if folds is not None and config.folds is not None:
        stats[FOLDS] = fold_summary(tokens.lengths, folds, config.folds)
        _say_folds(stats[FOLDS])
    return stats


def _say_folds(folds: dict) -> None:
    """The folds' rows and tokens and their spread, before k runs are spent on them."""
    per_fold = folds["per_fold"]
    log.info(
        "Tokenized folds (split.folds = %d): rows %s, tokens %s; largest / smallest fold: %s by rows, %s "
        "by tokens (split_report.json: folds)",
        folds["count"],
        [fold["rows"] for fold in per_fold],
        [fold["tokens"] for fold in per_fold],
        folds["largest_smallest_rows"],
        folds["largest_smallest_tokens"],
    )


def _say_truncation(train: dict, config) -> None:
    """One warning where ``split.max_length`` cut ``TRUNCATION_WARNING_SHARE`` or more of the train rows."""
    if train["rows"] and train["truncated_share"] >= TRUNCATION_WARNING_SHARE:
        cut = {
            "text": "their ends are never trained",
            "pretokenized": "their ends are never trained",
        }.get(config.data_format, "their prompts lose their start first, then their responses their end")
        log.warning(
            "%.0f %% of the train split's rows (%d of %d) are longer than split.max_length = %d tokens and "
            "were cut: %s. Fix: a larger split.max_length (--params split.max_length=<tokens>) where memory "
            "allows",
            100 * train["truncated_share"],
            train["truncated_rows"],
            train["rows"],
            config.max_length,
            cut,
        )


def _measure_unknown(stats: dict, tokens, rows: dict, tokenizer, config) -> None:
    """Each split's share of the tokenizer's unknown token (a tokenizer that has one), said from 1 %."""
    unknown_id = getattr(tokenizer, "unk_token_id", None)
    special = {getattr(tokenizer, f"{name}_token_id", None) for name in ("eos", "bos", "pad")}
    if unknown_id is None or unknown_id in special:  # GPT-2 style: one <|endoftext|> for all, no unknown
        return
    unknown = unknown_per_row(tokens.values, tokens.offsets, int(unknown_id))
    for name in SPLITS:
        stats[name].update(unknown_summary(unknown[rows[name]], tokens.lengths[rows[name]]))
    said = [name for name in SPLITS if stats[name].get("unknown_token_share", 0.0) >= UNKNOWN_WARNING_SHARE]
    if said:  # every such split, worst first: a test split as bad as the train split is as much the problem
        said.sort(key=lambda name: -stats[name]["unknown_token_share"])
        shares = ", ".join(
            f"{name} {100 * stats[name]['unknown_token_share']:.1f} % "
            f"({stats[name]['rows_with_unknown']} of {stats[name]['rows']} rows hold one)"
            for name in said
        )
        log.warning(
            "the tokenizer's unknown token %s is this share of a split's tokens: %s; the model learns "
            "nothing of what they stood for and never writes it. Fix: a tokenizer that covers the corpus "
            "(split.tokenizer.source: train, a byte-level BPE of it; now %s)",
            tokenizer.unk_token,
            shares,
            config.tokenizer.source,
        )


def splits_made_with(config, tokenizer=None) -> dict:
    """The split parameters the cleaning and splitting read (``_LATER_PARAMS`` left out; the salt as a digest:
    it may be a secret), with the chat template they rendered chats with (``tokenizer``'s), kept with the
    split's counts: a run of the split's later nodes on these splits (`--from-nodes tokenize_corpus`) must
    have the same (``check_made_with``)."""
    made = config.model_dump(mode="json", exclude=_LATER_PARAMS)
    made["hash_salt"] = selection_params(config)["hash_salt"]
    format_params = data_format_params(config, tokenizer) or {}
    made["chat_template_sha256"] = format_params.get("chat_template_sha256")
    # the rows sharing a prompt split as one: splits made before (none recorded) are not tokenized as such
    made[SPLIT_GROUPS_KEY] = format_params.get(SPLIT_GROUPS_KEY)
    return made


def check_made_with(counts: dict | None, config, tokenizer) -> None:
    """Refuse to tokenize splits made with other settings than ``config`` (``counts``: the split counts the
    cleaning and splitting wrote, with their ``splits_made_with``; counts without it are not compared): the
    fingerprint would record settings the rows were not made with, and a stage asking for those would take
    the rows as fresh."""
    made = (counts or {}).get(MADE_WITH)
    if not isinstance(made, dict):
        return
    now = splits_made_with(config, tokenizer)
    changed = _changed_keys(made, now)
    if not changed:
        return
    shown = "; ".join(
        f"split.{key} changed"  # recorded as a digest: the salt may be a secret
        if key == "hash_salt"
        else ungrouped_split(config.data_format)
        if key == SPLIT_GROUPS_KEY
        else f"split.{key}: {_dotted(made).get(key)!r} -> {_dotted(now).get(key)!r}"
        for key in changed[:3]
    )
    raise ConfigError(
        f"the splits this run tokenizes were made with other settings ({shown}): the split's earlier nodes "
        "(clean_corpus, split_corpus) read them, and the data would be recorded as made with the new ones.",
        fix="run the whole split with them: kedro run --pipeline=split (or keep the settings the split had).",
    )


def _changed_keys(made: dict, now: dict) -> list[str]:
    before, after = _dotted(made), _dotted(now)
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


def _dotted(params: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in params.items():
        if isinstance(value, dict) and value:
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
