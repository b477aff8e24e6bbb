"""Pre-tokenized data: a column of integer id lists (e.g. log keys from a log parser), no text at all.

Each row is checked (a non-empty list of whole numbers in ``0 .. vocab_size - 1``, never the EOS id that
split appends to end every sample) and written as its ids
joined by spaces: that string is the row's stable split key (the hash of the id sequence), its dedup key and
what the reports show. :func:`id_tokenizer` is the fixed one-token-per-id vocabulary ("0" .. "N-1") saved as
the ``tokenizer`` catalog entry, so train and report use pad/EOS ids and ``len(tokenizer)`` unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fastlm.errors import InputDataError


def id_texts(column: pd.Series, *, vocab_size: int, eos_id: int, source: str, param: str) -> list[str]:
    """The id lists of ``column`` as space-joined strings, or InputDataError naming the first bad row
    (1-based, the line of a JSON Lines file) and ``param``.

    ``eos_id`` (split.eos_id) is refused anywhere in a row: inside it would end a sample early, at its end it
    would make ``4 5 9`` and ``4 5`` two rows (split keys, dedup) of one and the same sample.
    """
    texts = []
    for number, row in enumerate(column.tolist(), start=1):
        ids = _row_ids(row, number, source=source, param=param)
        if (ids == eos_id).any():
            raise InputDataError(
                f"{source} row {number}: id {eos_id} in {param} is split.eos_id, which split appends to end "
                "every sample; the data must not hold it.",
                fix=f"drop id {eos_id} from the data, or set split.eos_id to an id the data never uses "
                "(default vocab_size - 1: --params split.vocab_size=<largest id + 2>).",
            )
        bad = (ids < 0) | (ids >= vocab_size)
        if bad.any():
            value = int(ids[bad][0])
            raise InputDataError(
                f"{source} row {number}: id {value} in {param} is "
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


def _row_ids(row, number: int, *, source: str, param: str) -> np.ndarray:
    where = f"{source} row {number}: {param}"
    fix = f"give every row of {param} a non-empty list of whole numbers such as [3, 17, 5]."
    if not isinstance(row, list | tuple | np.ndarray):
        raise InputDataError(f"{where} is {_shown(row)}, not a list of integer ids.", fix=fix)
    if len(row) == 0:
        raise InputDataError(f"{where} is an empty list.", fix=fix + " Drop empty rows.")
    for value in row:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | np.integer | float | np.floating)
            or (isinstance(value, float | np.floating) and not float(value).is_integer())
        ):
            raise InputDataError(f"{where} holds {_shown(value)}, not an integer id.", fix=fix)
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
