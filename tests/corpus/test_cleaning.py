import unicodedata

import numpy as np
import pandas as pd

from fastlm.corpus.cleaning import DROP_REASONS, clean_texts


def test_counts_each_reason_and_keeps_first_occurrence_in_order():
    korean = "배송 빨라요"
    values = pd.Series(
        [
            "  hello ",
            None,
            np.nan,
            42,
            3.5,
            ["x"],
            True,
            "",
            "   ",
            "\t\n\u3000",
            "hello",
            unicodedata.normalize("NFD", korean),
            korean,
            "world",
        ],
        dtype=object,
    )
    kept, drops = clean_texts(values)
    assert list(kept) == ["hello", korean, "world"]
    assert all(unicodedata.is_normalized("NFC", text) for text in kept)
    assert drops == {"missing": 2, "non_string": 4, "empty": 1, "whitespace_only": 2, "duplicate": 2}
    assert set(drops) == set(DROP_REASONS)
    assert len(kept) + sum(drops.values()) == len(values)


def test_string_dtype_fast_path_matches_object_path():
    raw = ["b ", "a", None, "a", " ", "c"]
    kept_object, drops_object = clean_texts(pd.Series(raw, dtype=object))
    kept_string, drops_string = clean_texts(pd.Series(raw, dtype="string"))
    assert list(kept_object) == list(kept_string) == ["b", "a", "c"]
    assert drops_object == drops_string


def test_all_numbers_column_leaves_nothing():
    kept, drops = clean_texts(pd.Series([1, 2, 3]))
    assert kept.empty and drops["non_string"] == 3
