"""Fingerprint of tokenized data: what tokenizer and which parameters produced it.

Stored beside the tokenized splits; every consumer recomputes it from the tokenizer it is about to use
and its own parameters, and refuses stale data with one line saying how to refresh it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from fastlm.corpus.tokenizer_source import settings_changes
from fastlm.errors import InputDataError, StaleDataError

# Rows hashed at a time for the split's data digest (``rows_digest``): hashing a million texts at once holds
# each again as a Python object and its bytes (about 0.9 GB); a row's hash depends on that row alone.
HASH_CHUNK_ROWS = 65_536
FORMAT_VERSION = 1  # bump when tokenization itself changes (e.g. how EOS or truncation work)
# How the split groups the rows sharing a prompt (``prompts.SPLIT_GROUP``), recorded with the data it made:
# pairs of one prompt, chats of one conversation (one's prompt beginning another's) split as one.
SPLIT_GROUPS = {"prompt_response": "shared_prompt", "messages": "conversation"}
REFRESH = (
    "run `kedro run --pipeline=split` to re-tokenize with these settings (it overwrites the stale data), or "
    "run this pipeline with the split.* parameters the data was split with (--params given to the split "
    "alone are not remembered: conf/local/parameters_split.yml keeps them for every pipeline)"
)


def tokenizer_digest(tokenizer) -> str:
    """SHA-256 of what decides the ids: the full tokenizer definition and its special tokens.

    The backend's own padding and truncation are left out (as if off): fastlm never applies them, and a call
    through transformers switches them off in place, which must not change the digest.
    """
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.update({key: None for key in ("padding", "truncation") if key in spec})
        digest.update(json.dumps(spec, sort_keys=True).encode("utf-8"))
    else:  # slow tokenizer: hash its saved vocabulary files
        with tempfile.TemporaryDirectory() as folder:
            tokenizer.save_pretrained(folder)
            for path in sorted(Path(folder).rglob("*")):
                if path.is_file() and path.name != "tokenizer_config.json":
                    digest.update(path.name.encode() + b"\0" + path.read_bytes())
    special = {"eos": tokenizer.eos_token_id, "bos": tokenizer.bos_token_id, "pad": tokenizer.pad_token_id}
    digest.update(json.dumps(special, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()


def tokenization_params(
    max_length: int,
    data_format: dict[str, Any] | None = None,
    selection: dict[str, Any] | None = None,
    folds: int | None = None,
) -> dict[str, Any]:
    """What decides the ids besides the tokenizer; ``data_format`` only for prompt/response data;
    ``selection``: the split parameters that decide which rows land in which split
    (:func:`selection_params`); ``folds``: the fold buckets the data records (``split.folds``, when set)."""
    params = {
        "format_version": FORMAT_VERSION,
        "max_length": int(max_length),
        "add_special_tokens": True,
        "append_eos": True,
        "truncation_side": "right",
        "padding": False,
    }
    if data_format is not None:
        params["data_format"] = data_format
    else:  # plain text: a special token's text inside a text is read as its characters (tokenize_texts)
        params["special_tokens_in_texts"] = "as_text"
    if selection is not None:
        params["selection"] = selection
    if folds is not None:
        params["folds"] = int(folds)
    return params


def selection_params(split) -> dict[str, Any]:
    """The split parameters (``SplitParams``) that decide which texts are kept and where they go: changing
    any of them without re-running split leaves train on the old rows. (The tokenizer settings are covered
    by the tokenizer digest, the prompt/response settings by :func:`data_format_params`, ``batch_size`` /
    ``num_proc`` do not change the data, and ``folds`` is recorded with the data: see :func:`data_folds`.)"""
    salt = hashlib.sha256(split.hash_salt.encode()).hexdigest()  # a digest: the salt may be a secret
    return {
        "text_column": split.text_column,
        "ratios": split.ratios.model_dump(),
        "hash_salt": salt,
        "max_samples": split.max_samples,
    }


def data_format_params(split, tokenizer) -> dict[str, Any] | None:
    """The split parameters (``SplitParams``) that shape prompt/response tokens; None for plain text.

    The chat template itself is part of it when messages are rendered with one, so editing the template in
    the tokenizer folder makes the tokenized data stale too; so are the variables it is given
    (``chat_template_kwargs``, recorded only when some are set: data split before they existed stays fresh),
    which predict and the report read back to render prompts as training did, which answers of a chat are
    trained (``train_turns``), and the column of each row's tools (``tools_column``), which predict reads
    the tools of a chat input from. ``split_groups`` (``SPLIT_GROUPS``) records that the rows sharing a prompt
    were split as one (``prompts.SPLIT_GROUP``): data split before, whose test split may ask prompts the
    train split trained on, is stale, saying so.
    """
    kind = split.data_format
    if kind == "text":
        return None
    if kind == "pretokenized":  # the vocabulary and special ids are in the tokenizer digest too
        eos, pad = split.special_ids
        return {
            "kind": kind,
            "ids_column": split.ids_column,
            "vocab_size": split.vocab_size,
            "eos_id": eos,
            "pad_id": pad,
        }
    if kind == "prompt_response":  # a special token's text in a response is read as its characters
        columns = {
            "prompt_column": split.prompt_column,
            "response_column": split.response_column,
            "response_special_tokens": "as_text",
            "split_groups": SPLIT_GROUPS[kind],
        }
    else:
        template = getattr(tokenizer, "chat_template", None) if split.chat_template else None
        template_sha = hashlib.sha256(str(template).encode()).hexdigest() if template else None
        columns = {
            "messages_column": split.messages_column,
            "chat_template_sha256": template_sha,
            "train_turns": split.train_turns,
            "tools_column": split.tools_column,
            "split_groups": SPLIT_GROUPS[kind],
        }
        if template and split.chat_template_kwargs:
            columns["chat_template_kwargs"] = dict(sorted(split.chat_template_kwargs.items()))
    return {
        "kind": kind,
        **columns,
        "prompt_template": split.prompt_template,
        "prompt_special_tokens": "leading_bos",
        "truncation": "prompt_left_first",
        "completion_only": True,
    }


def rows_digest(frame) -> str:
    """SHA-256 of ``frame``'s row hashes (``pandas.util.hash_pandas_object``, index left out), taken over
    ``HASH_CHUNK_ROWS`` rows at a time: the digest of the whole frame hashed at once, in bounded memory."""
    import pandas as pd

    digest = hashlib.sha256()
    for start in range(0, len(frame), HASH_CHUNK_ROWS):
        part = frame.iloc[start : start + HASH_CHUNK_ROWS]
        digest.update(pd.util.hash_pandas_object(part, index=False).to_numpy().tobytes())
    return digest.hexdigest()


def make_fingerprint(
    tokenizer,
    max_length: int,
    *,
    data_digest: str | None = None,
    data_format: dict[str, Any] | None = None,
    selection: dict[str, Any] | None = None,
    folds: int | None = None,
) -> dict[str, Any]:
    params = tokenization_params(max_length, data_format, selection, folds)
    token_digest = tokenizer_digest(tokenizer)
    combined = hashlib.sha256(json.dumps([token_digest, params], sort_keys=True).encode()).hexdigest()
    return {
        "fingerprint": combined,
        "tokenizer_sha256": token_digest,
        "params": params,
        "data_sha256": data_digest,
    }


def data_identity(stored: dict[str, Any] | None) -> str | None:
    """What a model or a sweep run trained on: the fingerprint (the tokenizer and parameters) with the split
    texts' digest (``data_sha256``). The fingerprint alone cannot tell two splits of other texts apart where
    the tokenizer does not depend on them (a model folder's, pre-tokenized ids). A record written before the
    digest existed is its own fingerprint; None without a record."""
    fingerprint = (stored or {}).get("fingerprint")
    if fingerprint is None:
        return None
    data = stored.get("data_sha256")
    return fingerprint if data is None else hashlib.sha256(f"{fingerprint}\0{data}".encode()).hexdigest()


def identity_of_test_split(stored: dict[str, Any] | None, test) -> str | None:
    """What the test split a model is evaluated on is: the tokenizer, the parameters that made the data less
    ``folds``, and the test split's rows and tokens (``test``: its ``Dataset``) without the fold column
    (-1 on every test row). Data split with ``split.folds`` and the same texts split without are other data
    (:func:`data_identity`: their train and validation rows differ) on one test split: their test figures
    compare. None without a record."""
    from fastlm.corpus.splitting import FOLD_COLUMN

    if not isinstance(stored, dict) or stored.get("fingerprint") is None:
        return None
    params = {key: value for key, value in (stored.get("params") or {}).items() if key != "folds"}
    rows = test.remove_columns([FOLD_COLUMN]) if FOLD_COLUMN in test.column_names else test
    record = [stored.get("tokenizer_sha256"), params, _split_digest(rows)]
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def check_fresh(stored: dict[str, Any] | None, tokenizer, split, *, where: str) -> None:
    """Raise StaleDataError unless ``stored`` matches ``tokenizer`` and ``split``.

    ``split`` is the split parameters (``SplitParams``: max_length, the prompt/response format and the row
    selection are checked) or just ``max_length`` (an int: the data format and selection are then not
    compared).
    """
    if not isinstance(stored, dict) or "fingerprint" not in stored:
        raise StaleDataError(
            f"{where} has no tokenization fingerprint, so it cannot be trusted.", fix=REFRESH + "."
        )
    if isinstance(split, int):
        kept = stored.get("params", {})
        current = make_fingerprint(
            tokenizer,
            split,
            data_format=kept.get("data_format"),
            selection=kept.get("selection"),
            folds=data_folds(stored),
        )
    else:
        current = make_fingerprint(
            tokenizer,
            split.max_length,
            data_format=data_format_params(split, tokenizer),
            selection=selection_params(split),
            folds=data_folds(stored),  # recorded with the data, not a setting a consumer must repeat
        )
    settings = (
        [] if isinstance(split, int) or split.pretokenized else settings_changes(tokenizer, split.tokenizer)
    )
    if stored["fingerprint"] == current["fingerprint"] and not settings:
        return
    changed = params_changes(stored.get("params", {}), current["params"]) + settings
    if stored.get("tokenizer_sha256") != current["tokenizer_sha256"]:
        changed.append("the tokenizer changed")
    raise StaleDataError(
        f"{where} is stale: {', '.join(changed) or 'its fingerprint differs'}.", fix=REFRESH + "."
    )


def tokenized_digests(tokenized) -> dict[str, dict[str, Any]]:
    """Each tokenized split's rows and a SHA-256 of its columns (``tokenized``: a ``DatasetDict``), recorded
    with the fingerprint by the split and compared by :func:`check_tokenized`. Read chunk by chunk, as the
    saved data is memory-mapped: no copy of a whole column."""
    return {name: _split_digest(part) for name, part in tokenized.items()}


def check_tokenized(stored: dict[str, Any] | None, tokenized, *, where: str) -> None:
    """Raise InputDataError unless every split of ``tokenized`` holds the rows and tokens the split recorded
    (``splits`` of its fingerprint; a record without them, written before they were recorded, is not
    compared): a split file replaced or edited by hand since would be trained or scored without a word. The
    likeliest cause named first: a split run between Kedro's loads of the data and of its fingerprint."""
    recorded = (stored or {}).get("splits")
    if not isinstance(recorded, dict):
        return
    for name, record in recorded.items():
        now = _split_digest(tokenized[name]) if name in tokenized else None
        if now == record:
            continue
        if now is None or now["rows"] != record.get("rows"):
            held = "no" if now is None else now["rows"]
            what = f"its {name} split holds {held} rows, the split wrote {record.get('rows')}"
        else:
            what = f"its {name} split's tokens are not those the split wrote ({now['rows']} rows)"
        raise InputDataError(
            f"{where} was changed since the split wrote it: {what}; likely a split (`kedro run "
            "--pipeline=split`) ran while this command read the data, then its fingerprint.",
            fix="if a split is running, wait for it to finish, then run this command again; otherwise run "
            "`kedro run --pipeline=split` to write the data again (its files are not to be edited or "
            "copied by hand).",
        )


def _split_digest(dataset) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")[:] if len(dataset) else dataset.data.table
    digest = hashlib.sha256()
    for name in sorted(table.column_names):  # lengths and values hashed apart: the same whatever the chunks
        lengths, values = [], hashlib.sha256()  # lengths: one digest per level of nesting (spans: pairs)
        for chunk in table.column(name).chunks:
            depth = 0
            while pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
                if depth == len(lengths):
                    lengths.append(hashlib.sha256())
                lengths[depth].update(np.asarray(pc.list_value_length(chunk), dtype=np.int64).tobytes())
                chunk, depth = pc.list_flatten(chunk), depth + 1
            if pa.types.is_integer(chunk.type) and chunk.null_count == 0:
                values.update(np.asarray(chunk.to_numpy(), dtype=np.int64).tobytes())
            else:
                values.update(
                    "".join(f"{json.dumps(value, default=str)}\n" for value in chunk.to_pylist()).encode()
                )
        levels = "\0".join(level.hexdigest() for level in lengths)
        digest.update(f"{name}\0{levels}\0{values.hexdigest()}\0".encode())
    return {"rows": len(dataset), "sha256": digest.hexdigest()}


def data_folds(stored: dict[str, Any] | None) -> int | None:
    """The number of folds (``split.folds``) the tokenized data was split into, from its fingerprint; None
    without folds. Train and sweep read it from the data, not from ``params:split``, so their commands need no
    ``split.folds`` and always use the fold buckets that were written. It is part of the fingerprint: a
    re-split into another number of folds changes it, so a sweep trains its runs again."""
    folds = (stored or {}).get("params", {}).get("folds")
    return int(folds) if folds is not None else None


def folds_mismatch(stored: dict[str, Any] | None, configured: int | None) -> str | None:
    """One line where ``split.folds`` asks for another fold count than the data was split into (its
    fingerprint's, :func:`data_folds`); None where they agree or ``split.folds`` is unset. The data's count is
    the one train and sweep use (they need no ``split.folds``): this says so, and how to get the other."""
    folds = data_folds(stored)
    if configured is None or configured == folds:
        return None
    data = "without folds" if folds is None else f"into {folds} folds"
    used = "no folds can be run" if folds is None else f"{folds} folds are used"
    return (
        f"split.folds = {configured} but the tokenized data was split {data}: {used}, not {configured}. "
        f"Fix: run `kedro run --pipeline=split --params split.folds={configured}` to split into "
        f"{configured} folds, or set split.folds to {folds if folds is not None else 'null'} to use the "
        "data as it is."
    )


def params_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints' tokenization parameters, a phrase each. Plain text records how
    it read special tokens' texts and prompt/response data its format instead: where the format changed,
    that one phrase says it (the other key's absence is no sign of an older fastlm)."""
    format_changed = ("data_format" in old) != ("data_format" in new)
    return [
        _change(key, old.get(key), new.get(key))
        for key in {**new, **old}
        if old.get(key) != new.get(key) and not (key == "special_tokens_in_texts" and format_changed)
    ]


def _change(key: str, old: Any, new: Any) -> str:
    if key == "selection":
        if old is None:
            return "it records no split parameters (written by an older fastlm)"
        return ", ".join(
            f"split.{name} changed"
            if name == "hash_salt"
            else f"split.{name} {old.get(name)!r} -> {new.get(name)!r}"
            for name in {**new, **old}
            if old.get(name) != new.get(name)
        )
    if key == "special_tokens_in_texts" and old is None:
        return "special tokens written in a text were read as the tokens (tokenized by an older fastlm)"
    if key != "data_format":
        return f"{key} {old!r} -> {new!r}"
    if old is None or new is None:
        return (
            f"the data format changed ({(old or {}).get('kind', 'text')} -> "
            f"{(new or {}).get('kind', 'text')})"
        )
    return ", ".join(
        ungrouped_split(new["kind"])
        if name == "split_groups" and old.get(name) is None and old.get("kind") == new.get("kind")
        else f"{name} changed"
        for name in {**new, **old}
        if old.get(name) != new.get(name)
    )


def ungrouped_split(kind: str | None) -> str:
    """Why data split before the rows sharing a prompt were split as one (``SPLIT_GROUPS``) is stale."""
    rows = "chats of one conversation" if kind == "messages" else "pairs sharing a prompt"
    return (
        f"it was split by an older fastlm, which could put {rows} in two splits (a test row asking what a "
        "train row trained on)"
    )


def texts_digest(texts, splits) -> str:
    """SHA-256 of the split texts in order, for provenance (which data produced the tokens)."""
    digest = hashlib.sha256()
    for text, split in zip(texts, splits, strict=True):
        digest.update(f"{split}\0{text}\0".encode())
    return digest.hexdigest()
