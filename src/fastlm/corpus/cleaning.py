"""Clean raw texts: Unicode NFC, LF line ends, invisible marks out, strip; drop unusable rows and exact
duplicates, counting each reason.

Plain text (``clean_texts``) and prompt/response pairs (``clean_pairs``: a row is usable only when both its
prompt and its response are, and duplicates are exact repeats of the *pair*) share one rule per value.
Chat-style message lists are cleaned in ``fastlm.corpus.prompts.clean_messages`` with the same rule.
"""

from __future__ import annotations

import re
import unicodedata

import pandas as pd

from fastlm.errors import InputDataError

DROP_REASONS = ("missing", "non_string", "empty", "whitespace_only", "duplicate")
# Marks that show nothing and mean nothing in a text (a zero-width space, a word joiner, a BOM inside a
# file): removed, so that they make no other text. The zero-width joiner and non-joiner are kept (emoji
# sequences, Indic and Persian writing).
INVISIBLE = "\u200b\u2060\ufeff"
# str.translate's table: a lone CR becomes LF (CRLF first becomes LF), the invisible marks go
_TRANSLATE = {ord("\r"): "\n", **dict.fromkeys(map(ord, INVISIBLE))}
_MARKED = re.compile(f"[\r{INVISIBLE}]")
# Characters that render as blank but are not Unicode white space (Hangul fillers, the Braille blank): a
# value of these alone is blank; inside a text they stay.
FILLERS = "\u3164\uffa0\u115f\u1160\u2800"
BLANK = f"^[\\s{FILLERS}]*$"


def clean_texts(values: pd.Series) -> tuple[pd.Series, dict[str, int]]:
    """Return the kept texts (NFC, stripped, first occurrence of each, original order) and drop counts.

    Reasons, checked in this order: ``missing`` (None/NaN), ``non_string`` (numbers, lists, booleans),
    ``empty`` (""), ``whitespace_only`` (nothing left after strip), ``duplicate`` (same text after
    NFC and strip as an earlier row).
    """
    normalized, reasons = classify_values(values)
    usable = normalized[reasons.isna()]
    duplicate = usable.duplicated(keep="first")
    kept = usable[~duplicate].reset_index(drop=True)
    return kept.rename("text"), _drop_counts(reasons, int(duplicate.sum()))


def clean_pairs(prompts: pd.Series, responses: pd.Series) -> tuple[pd.DataFrame, dict[str, int]]:
    """Kept ``prompt``/``response`` pairs (each value NFC + stripped; first occurrence of each pair) and
    drops.

    A row is dropped for the first reason found in its prompt, else in its response; ``duplicate`` means the
    same (prompt, response) pair as an earlier row (the same prompt with another response is kept).
    """
    prompt_text, prompt_reason = classify_values(prompts.reset_index(drop=True))
    response_text, response_reason = classify_values(responses.reset_index(drop=True))
    reasons = prompt_reason.fillna(response_reason)
    usable = pd.DataFrame({"prompt": prompt_text, "response": response_text})[reasons.isna()]
    duplicate = usable.duplicated(keep="first")
    kept = usable[~duplicate].reset_index(drop=True)
    return kept, _drop_counts(reasons, int(duplicate.sum()))


def classify_values(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Each value normalized (object dtype), and its drop reason (None when usable): ``normalize_text``
    (Unicode NFC, line ends as LF: a file saved with CRLF holds the same texts; the ``INVISIBLE`` marks
    removed), stripped; a value of white space and ``FILLERS`` alone is blank."""
    missing = values.isna()
    if pd.api.types.is_string_dtype(values.dtype) and not pd.api.types.is_object_dtype(values.dtype):
        is_text = ~missing
    else:
        is_text = values.map(lambda value: isinstance(value, str), na_action="ignore").fillna(False)
        is_text = is_text.astype(bool)
    normalized = pd.Series(None, index=values.index, dtype=object)
    texts = values[is_text].astype(object).map(normalize_text).str.strip()
    filler_first = texts.str[:1].isin(set(FILLERS))  # a blank of fillers starts with one once stripped
    blank = texts[filler_first].str.match(BLANK)
    normalized[is_text] = texts.mask(blank.reindex(texts.index, fill_value=False), "")
    reasons = pd.Series(None, index=values.index, dtype=object)
    reasons[missing] = "missing"
    reasons[~missing & ~is_text] = "non_string"
    raw_empty = is_text & values.where(is_text, "x").astype(object).eq("")
    reasons[raw_empty] = "empty"
    reasons[is_text & ~raw_empty & normalized.eq("")] = "whitespace_only"
    return normalized, reasons


def normalize_text(text: str) -> str:
    """``text`` as the split normalizes every value before it strips it (``classify_values``), the one rule
    for every text given to a model's tokenizer (the split's texts, predict's inputs, the report's prompts)
    and for ROUGE's two sides: Unicode NFC, each CRLF and lone CR as LF, the ``INVISIBLE`` marks removed, and
    NFC again where one was (a mark removed from between a decomposed syllable's jamo, or a letter and its
    accent, joins them). Not stripped: a plain-text prompt's trailing space is part of what a model
    continues."""
    text = unicodedata.normalize("NFC", text)
    if _MARKED.search(text) is None:  # most texts: nothing more to rewrite
        return text
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n").translate(_TRANSLATE))


def _drop_counts(reasons: pd.Series, duplicates: int) -> dict[str, int]:
    counts = reasons.value_counts()
    drops = {reason: int(counts.get(reason, 0)) for reason in DROP_REASONS[:-1]}
    extra = {str(reason): int(count) for reason, count in counts.items() if reason not in drops}
    return {**drops, **extra, "duplicate": duplicates}


def typed_not_text(values: pd.Series) -> str | None:
    """What a column the file typed as numbers or booleans holds (a JSON or Parquet column; a CSV's cells are
    text as written already): ``numbers (int64)``, said where no text is left; None for any other column."""
    if pd.api.types.is_bool_dtype(values.dtype):
        return f"true/false values ({values.dtype})"
    if pd.api.types.is_numeric_dtype(values.dtype):
        return f"numbers ({values.dtype})"
    return None


def not_utf8_error(
    values: pd.Series, what: str, source: str, parameter: str, place=None
) -> InputDataError | None:
    """Why the column ``values`` (``what``: ``column 'text' (split.text_column)``) of ``source`` cannot be
    read as text, or None: bytes that are not UTF-8 (a Parquet string column a writer filled with CP949, read
    as bytes by ``readers``), the first such row named (``place``: what names a row where not ``row N``, a
    shard's) with what it reads as in CP949. They were dropped as ``non_string``: one bad row among
    thousands without a word, a whole column as "no usable text left"."""
    if not pd.api.types.is_object_dtype(values.dtype):
        return None
    bad = next(
        (
            (row, bytes(value))
            for row, value in enumerate(values, start=1)
            if isinstance(value, bytes | bytearray) and not _is_utf8(bytes(value))
        ),
        None,
    )
    if bad is None:
        return None
    row, value = bad
    try:
        korean = f"; as CP949: {value.decode('cp949')[:60]!r}"
    except UnicodeDecodeError:
        korean = ""
    named = (place or (lambda number: f"row {number}"))(row)
    decode = "as cp949" if korean else "from their encoding"
    return InputDataError(
        f"{source} {what} {named} holds bytes that are not UTF-8 text ({value[:24]!r}{korean}): the file's "
        "writer stored that column in another encoding.",
        fix=f"write that column as UTF-8 text (decode its bytes {decode} first), then point {parameter} at "
        "the converted file.",
    )


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
