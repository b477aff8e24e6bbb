"""Clean raw texts: Unicode NFC, strip, drop unusable rows and exact duplicates, counting each reason."""

from __future__ import annotations

import pandas as pd

DROP_REASONS = ("missing", "non_string", "empty", "whitespace_only", "duplicate")


def clean_texts(values: pd.Series) -> tuple[pd.Series, dict[str, int]]:
    """Return the kept texts (NFC, stripped, first occurrence of each, original order) and drop counts.

    Reasons, checked in this order: ``missing`` (None/NaN), ``non_string`` (numbers, lists, booleans),
    ``empty`` (""), ``whitespace_only`` (nothing left after strip), ``duplicate`` (same text after
    NFC and strip as an earlier row).
    """
    missing = values.isna()
    if pd.api.types.is_string_dtype(values.dtype) and not pd.api.types.is_object_dtype(values.dtype):
        is_text = ~missing
    else:
        is_text = values.map(lambda value: isinstance(value, str), na_action="ignore").fillna(False)
        is_text = is_text.astype(bool)
    texts = values[is_text].astype(object)
    empty = texts == ""
    normalized = texts.str.normalize("NFC").str.strip()
    whitespace_only = (normalized == "") & ~empty
    usable = normalized[~empty & ~whitespace_only]
    duplicate = usable.duplicated(keep="first")
    kept = usable[~duplicate].reset_index(drop=True)
    drops = {
        "missing": int(missing.sum()),
        "non_string": int((~missing & ~is_text).sum()),
        "empty": int(empty.sum()),
        "whitespace_only": int(whitespace_only.sum()),
        "duplicate": int(duplicate.sum()),
    }
    return kept.rename("text"), drops
