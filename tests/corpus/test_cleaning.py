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


def test_line_ends_and_invisible_marks_do_not_make_another_text():
    """Round six: a file saved again by Excel (CRLF line ends) moved 19 % of multi-line rows to another split
    and, appended to the first, kept each of them twice; a zero-width space, word joiner or BOM (web text)
    made another text of the same one. Line ends become LF and those marks go, before deduplication and the
    split key; a zero-width joiner (emoji sequences) stays."""
    lf = "첫 줄\n둘째 줄"
    values = pd.Series(
        [
            lf,
            "첫 줄\r\n둘째 줄",
            "첫 줄\r둘째 줄",
            "\ufeff첫 줄\n둘째 줄",
            "첫 줄\u200b\n둘째\u2060 줄",
            "가족 👨\u200d👩",
        ]
    )
    kept, drops = clean_texts(values)
    assert kept.tolist() == [lf, "가족 👨\u200d👩"]
    assert drops["duplicate"] == 4


def test_a_row_of_filler_characters_is_blank():
    """Korean users post "empty" comments as Hangul fillers (U+3164) or zero-width spaces: nothing to
    train on, counted ``whitespace_only`` as blank rows are (they were kept as texts)."""
    blank = ["\u3164", "\u200b", "\uffa0", "\u115f\u1160", "\u2800", "\u3164 \u3164", "\ufeff"]
    kept, drops = clean_texts(pd.Series([*blank, "안녕\u3164하세요"]))
    assert kept.tolist() == ["안녕\u3164하세요"]  # a filler inside a text is the text's
    assert drops["whitespace_only"] == len(blank)


def test_an_invisible_mark_inside_decomposed_text_leaves_it_nfc_and_a_duplicate():
    """A zero-width space, word joiner or BOM between a decomposed Hangul syllable's jamo (or a letter and its
    combining accent): once removed, the text is NFC and the same text as its composed form."""
    composed = ["한국어 리뷰", "café 좋아요", "배송 빨라요"]
    marked = []
    for text, mark in zip(composed, "\u200b\u2060\ufeff", strict=True):
        decomposed = unicodedata.normalize("NFD", text)
        marked.append(decomposed[:1] + mark + decomposed[1:3] + mark + decomposed[3:])
    kept, drops = clean_texts(pd.Series(composed + marked))
    expected = [
        unicodedata.normalize("NFC", text.translate(dict.fromkeys(map(ord, "\u200b\u2060\ufeff"))))
        for text in marked
    ]
    assert expected == composed
    assert kept.tolist() == composed
    assert drops["duplicate"] == len(marked)
    assert all(unicodedata.is_normalized("NFC", text) for text in kept)
