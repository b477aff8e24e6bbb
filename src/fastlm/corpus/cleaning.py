"""Clean raw texts: Unicode NFC, LF line ends, invisible marks out, strip; drop unusable rows and exact
duplicates, counting each reason.

Plain text (``clean_texts``) and prompt/response pairs (``clean_pairs``: a row is usable only when both its
prompt and its response are, and duplicates are exact repeats of the *pair*) share one rule per value.
Chat-style message lists are cleaned in ``fastlm.corpus.prompts.clean_messages`` with the same rule.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pandas as pd

from fastlm.errors import InputDataError

DROP_REASONS = ("missing", "non_string", "empty", "whitespace_only", "duplicate")
# Marks that show nothing and mean nothing in a text (a zero-width space, a word joiner, a BOM inside a
# file, a soft hyphen: a hyphenation point web pages and PDFs put inside long words): removed, so that they
# make no other text. The zero-width joiner and non-joiner are kept (emoji sequences, Indic and Persian
# writing).
INVISIBLE = "\u200b\u2060\ufeff\u00ad"
# str.translate's table: a lone CR becomes LF (CRLF first becomes LF), the invisible marks go
_TRANSLATE = {ord("\r"): "\n", **dict.fromkeys(map(ord, INVISIBLE))}
_MARKED = re.compile(f"[\r{INVISIBLE}]")
# Characters that render as blank but are not Unicode white space (Hangul fillers, the Braille blank): a
# value of these alone is blank; inside a text they stay.
FILLERS = "\u3164\uffa0\u115f\u1160\u2800"
BLANK = f"^[\\s{FILLERS}]*$"
# White space inside a line (a no-break space, an ideographic or narrow one, a tab, a run of them) and
# around a line end: texts that differ only there are one text (``line_spaces_key``)
_LINE_SPACES = re.compile(r"[^\S\n]+")
_AROUND_LINE_END = re.compile(r" ?\n ?")
_OTHER_SPACES = re.compile(r"[^\S \n]")  # white space but a space or a line end
_ODD_PAIRS = ("  ", " \n", "\n ")


def clean_texts(values: pd.Series) -> tuple[pd.Series, dict[str, int]]:
    """Return the kept texts (NFC, stripped, first occurrence of each, original order) and drop counts.

    Reasons, checked in this order: ``missing`` (None/NaN), ``non_string`` (numbers, lists, booleans),
    ``empty`` (""), ``whitespace_only`` (nothing left after strip), ``duplicate`` (same text after
    NFC and strip as an earlier row, up to the white space inside its lines: ``line_spaces_key``).
    """
    normalized, reasons = classify_values(values)
    usable = normalized[reasons.isna()]
    duplicate = line_spaces_keys(usable).duplicated(keep="first")
    kept = usable[~duplicate].reset_index(drop=True)
    return kept.rename("text"), _drop_counts(reasons, int(duplicate.sum()))


def clean_pairs(prompts: pd.Series, responses: pd.Series) -> tuple[pd.DataFrame, dict[str, int]]:
    """Kept ``prompt``/``response`` pairs (each value NFC + stripped; first occurrence of each pair) and
    drops.

    A row is dropped for the first reason found in its prompt, else in its response; ``duplicate`` means the
    same (prompt, response) pair as an earlier row, up to the white space inside their lines (the same
    prompt with another response is kept).
    """
    prompt_text, prompt_reason = classify_values(prompts.reset_index(drop=True))
    response_text, response_reason = classify_values(responses.reset_index(drop=True))
    reasons = prompt_reason.fillna(response_reason)
    usable = pd.DataFrame({"prompt": prompt_text, "response": response_text})[reasons.isna()]
    duplicate = usable.apply(line_spaces_keys).duplicated(keep="first")
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


def line_spaces_key(text: str) -> str:
    """``text`` (cleaned: ``classify_values``) as deduplication and the hash split key it: each run of white
    space inside a line (a no-break space as web text writes ``&nbsp;``, an ideographic or narrow space, a
    tab, two spaces) one space, none at a line's ends. Texts that read the same are one text, never one in
    train and one in test; a text written with single spaces (most) is its own key, so its split is the
    same as ever. Line ends stay: another number of them is another text."""
    if _OTHER_SPACES.search(text) is None and not any(pair in text for pair in _ODD_PAIRS):
        return text
    return _AROUND_LINE_END.sub("\n", _LINE_SPACES.sub(" ", text))


def line_spaces_keys(texts: pd.Series) -> pd.Series:
    """``line_spaces_key`` of each text of ``texts`` (object dtype, its index kept): the texts to rewrite
    found in one scan of them all joined, most being their own key."""
    values = texts.astype(object).tolist()
    keys = pd.Series(values, index=texts.index, dtype=object)
    if not values:
        return keys
    ends = np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)) + 1)
    joined = "\0".join(values)
    found = [match.start() for match in _OTHER_SPACES.finditer(joined)]
    for pair in _ODD_PAIRS:  # str.find: far faster than these as alternatives of one pattern
        at = joined.find(pair)
        while at != -1:
            found.append(at)
            at = joined.find(pair, at + 1)
    for row in np.unique(np.searchsorted(ends, found, side="right")).tolist():
        keys.iat[row] = line_spaces_key(values[row])
    return keys


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
