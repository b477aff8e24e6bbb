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


def test_texts_that_differ_only_in_the_spaces_inside_a_line_are_one_text():
    """Texts that read the same, one written with a no-break space (web text's &nbsp;), an ideographic or
    narrow space, a tab, two spaces or spaces around a line end: one text, its first occurrence kept as
    written and the others counted as duplicates (they were kept each, and by their own hash keys could lie
    in train and in test). The lines of a text stay its own: another number of line ends is another text."""
    first = "배송이 빨라요 정말 좋아요"
    lines = "첫 줄\n둘째 줄"
    values = pd.Series(
        [
            first,
            "배송이  빨라요 정말 좋아요",
            "배송이\u00a0빨라요 정말 좋아요",
            "배송이\u3000빨라요\t정말\u202f좋아요",
            "Fast  delivery",
            "Fast\u00a0delivery",
            lines,
            "첫 줄 \n 둘째 줄",
            "첫 줄\t\n둘째 줄",
            "첫 줄\n\n둘째 줄",
        ]
    )
    kept, drops = clean_texts(values)
    assert kept.tolist() == [first, "Fast  delivery", lines, "첫 줄\n\n둘째 줄"]
    assert drops["duplicate"] == 6


def test_pairs_and_chats_that_differ_only_in_the_spaces_inside_a_line_are_one_row():
    """A prompt/response pair or a chat whose texts differ from an earlier one's only in the spaces inside a
    line is that row again: counted a duplicate, not a second row the hash split may put in another split."""
    from fastlm.corpus.cleaning import clean_pairs
    from fastlm.corpus.prompts import clean_messages

    kept, drops = clean_pairs(
        pd.Series(["대화 내용 요약", "대화\u00a0내용  요약", "대화 내용 요약"]),
        pd.Series(["짧은 요약", "짧은\t요약", "다른 요약"]),
    )
    assert kept.to_dict("records") == [
        {"prompt": "대화 내용 요약", "response": "짧은 요약"},
        {"prompt": "대화 내용 요약", "response": "다른 요약"},
    ]
    assert drops["duplicate"] == 1
    chats = pd.Series(
        [
            [{"role": "user", "content": "배송 언제 와요?"}, {"role": "assistant", "content": "내일 와요"}],
            [
                {"role": "user", "content": "배송\u00a0언제  와요?"},
                {"role": "assistant", "content": "내일\u3000와요"},
            ],
        ]
    )
    kept, drops = clean_messages(chats)
    assert len(kept) == 1 and drops["duplicate"] == 1


def test_a_soft_hyphen_makes_no_other_text():
    """A soft hyphen (U+00AD: a hyphenation point that shows nothing inside a line; web pages and PDFs put
    them inside long words) is an invisible mark as a zero-width space is: removed, so the text is the same
    text as without it. Was: kept, another text (in another split) and trained as a character no reader
    sees."""
    from fastlm.corpus.cleaning import normalize_text

    plain = ["internationalization works", "배송이 빨라요"]
    marked = ["inter\u00adnational\u00adization works", "배송\u00ad이 빨라요"]
    kept, drops = clean_texts(pd.Series(plain + marked))
    assert kept.tolist() == plain and drops["duplicate"] == len(marked)
    assert [normalize_text(text) for text in marked] == plain
