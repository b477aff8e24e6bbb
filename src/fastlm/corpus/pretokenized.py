"""Pre-tokenized data: a column of integer id lists (e.g. log keys from a log parser), no text at all.

Each row is checked (a non-empty list of whole numbers in ``0 .. vocab_size - 1``, never the EOS id that
split appends to end every sample) and written as its ids
joined by spaces: that string is the row's stable split key (the hash of the id sequence), its dedup key and
what the reports show. :func:`id_tokenizer` is the fixed one-token-per-id vocabulary ("0" .. "N-1") saved as
the ``tokenizer`` catalog entry, so train and report use pad/EOS ids and ``len(tokenizer)`` unchanged.
:func:`input_ids` reads one row predict asks such a model (a list, or ids separated by spaces) with the same
checks, as its ids or the reason it cannot be asked (that tokenizer would read an unknown word as EOS).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from fastlm.errors import InputDataError


def id_texts(
    column: pd.Series, *, vocab_size: int, eos_id: int, source: str, param: str, place=None
) -> list[str]:
    """The id lists of ``column`` as space-joined strings, or InputDataError naming the first bad row
    (1-based, the line of a JSON Lines file; ``place``: what names a row where not ``<source> row <n>``, a
    shard's) and ``param``.

    ``eos_id`` (split.eos_id) is refused anywhere in a row: inside it would end a sample early, at its end it
    would make ``4 5 9`` and ``4 5`` two rows (split keys, dedup) of one and the same sample.
    """
    texts = []
    place = place or (lambda number: f"{source} row {number}")
    for number, row in enumerate(column.tolist(), start=1):
        ids = _row_ids(row, place(number), param=param)
        bad = _first_bad_id(ids, vocab_size=vocab_size, eos_id=eos_id)
        if bad is not None and bad[0] == "eos":
            raise InputDataError(
                f"{place(number)}: id {eos_id} in {param} is split.eos_id, which split appends to end "
                "every sample; the data must not hold it.",
                fix=f"drop id {eos_id} from the data, or set split.eos_id to an id the data never uses "
                "(default vocab_size - 1: --params split.vocab_size=<largest id + 2>).",
            )
        if bad is not None:
            value = bad[1]
            raise InputDataError(
                f"{place(number)}: id {value} in {param} is "
                + ("negative" if value < 0 else f"not below split.vocab_size ({vocab_size})")
                + ".",
                fix="ids must be 0 .. split.vocab_size - 1: "
                + (
                    "fix or drop that row."
                    if value < 0
                    else "fix that row or raise split.vocab_size "
                    "(--params split.vocab_size=<largest id + 2>)."
                ),
            )
        texts.append(" ".join(map(str, ids.tolist())))
    return texts


def _id_list_problem(row) -> str | None:
    """What makes ``row`` no id list, as a phrase after its name (``is an empty list``, ``holds 2.5, not an
    integer id``); None for a non-empty list (tuple, array) of whole numbers (whole floats included: a
    double column)."""
    if not isinstance(row, list | tuple | np.ndarray):
        return f"is {_shown(row)}, not a list of integer ids"
    if len(row) == 0:
        return "is an empty list"
    for value in row:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | np.integer | float | np.floating)
            or (isinstance(value, float | np.floating) and not float(value).is_integer())
        ):
            return f"holds {_shown(value)}, not an integer id"
    return None


def _first_bad_id(ids: np.ndarray, *, vocab_size: int, eos_id: int) -> tuple[str, int] | None:
    """The first id a model of ``vocab_size`` ids trained on such rows cannot be given: ``("eos", eos_id)``
    where the row holds the EOS id (anywhere: it ends a sample), else ``("negative", id)`` or
    ``("too_large", id)`` for the first id outside ``0 .. vocab_size - 1``; None when every id is one."""
    if (ids == eos_id).any():
        return "eos", int(eos_id)
    bad = (ids < 0) | (ids >= vocab_size)
    if not bad.any():
        return None
    value = int(ids[bad][0])
    return ("negative" if value < 0 else "too_large"), value


def input_ids(value, *, vocab_size: int, eos_id: int) -> tuple[list[int] | None, str | None]:
    """One input row of a model trained on pre-tokenized ids as the ids it is asked, or None and the reason
    it cannot be (its first word the reason's name, as predict counts reasons). ``value``: a list of ids
    (JSON list, Parquet list column: checked as the split checks a row, ``_id_list_problem``), ids written
    as decimal words separated by white space (``"3 17 5"``: the form the split writes them in), or one
    whole number. Refused: a word that is no id as the split writes one (``malformed_ids``,
    :func:`id_word`: no whole number, or leading zeros; the model's tokenizer reads it as its EOS id), an id
    outside ``0 .. vocab_size - 1`` (``unknown_id``: read as EOS too) and the EOS id (``eos_id``: it ends
    every training sample, so the model never saw it inside one)."""
    if value is None or (isinstance(value, float | np.floating) and value != value):
        return None, "missing"
    if isinstance(value, str):
        words = value.split()
        if not words:
            return None, "empty" if value == "" else "whitespace_only"
        numbers = [id_word(word) for word in words]
        malformed = next((word for word, number in zip(words, numbers, strict=True) if number is None), None)
        if malformed is not None:
            return None, f"malformed_ids ({_shown(malformed)} is not a whole-number id)"
    else:
        if isinstance(value, int | np.integer | float | np.floating) and not isinstance(value, bool):
            value = [value]
        if isinstance(value, list | tuple | np.ndarray) and len(value) == 0:
            return None, "empty"
        problem = _id_list_problem(value)
        if problem is not None:
            return None, f"malformed_ids (the row {problem})"
        numbers = [int(number) for number in value]
    ids = np.asarray(numbers)
    if ids.dtype.kind not in "iu":  # int64 beside uint64 ids reads as float64 (rounded): Python's ints
        ids = np.asarray(numbers, dtype=object)
    bad = _first_bad_id(ids, vocab_size=vocab_size, eos_id=eos_id)
    if bad is None:
        return numbers, None
    kind, found = bad
    if kind == "eos":
        return None, f"eos_id (id {found} is the EOS id, which ends every training sample)"
    if kind == "negative":
        return None, f"unknown_id (id {found} is negative; the model's ids are 0 .. {vocab_size - 1})"
    return None, f"unknown_id (id {found} is not below the model's vocabulary size {vocab_size})"


def id_word(word: str) -> int | None:
    """The whole number a word of space-separated ids is written as, or None: ASCII decimal digits as the
    split writes an id (``str(id)``, the id tokenizer's vocabulary ``"0"`` .. ``"N-1"``), with a minus sign
    for a negative one. ``007``, ``-0``, ``+5``, ``1_0``, ``5.0`` or a full-width digit are none: the
    model's tokenizer reads such a word as its EOS id. Predict's rows (:func:`input_ids`) and the report's
    prompts (``reporting.params.check_id_prompts``) read their words by this one rule."""
    return int(word) if _ID_WORD.fullmatch(word) else None


_ID_WORD = re.compile(r"0|-?[1-9][0-9]*")


def _row_ids(row, shown: str, *, param: str) -> np.ndarray:
    where = f"{shown}: {param}"
    fix = f"give every row of {param} a non-empty list of whole numbers such as [3, 17, 5]."
    problem = _id_list_problem(row)
    if problem is not None:
        extra = " Drop empty rows." if problem == "is an empty list" else ""
        raise InputDataError(f"{where} {problem}.", fix=fix + extra)
    return np.asarray(row, dtype=np.float64).astype(np.int64)


def _shown(value) -> str:
    text = repr(value.tolist() if isinstance(value, np.generic) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_id_texts(texts: Sequence[str]) -> list[list[int]]:
    """The inverse of :func:`id_texts`."""
    return [[int(token) for token in text.split()] for text in texts]


def id_tokenizer(vocab_size: int, *, eos_id: int, pad_id: int, model_max_length: int):
    """A fast tokenizer whose token ``str(i)`` has id ``i`` (whitespace-separated ids in, ids out): the
    vocabulary of pre-tokenized data, with its EOS and pad ids; an unknown word maps to EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token=str(eos_id)))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with single spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=str(eos_id),
        pad_token=str(pad_id),
        unk_token=str(eos_id),
        padding_side="right",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
