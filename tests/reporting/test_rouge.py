"""ROUGE: rouge-score's numbers on English, Hangul kept by the Unicode tokenizers, dropped by the default
one."""

import pytest
from rouge_score import rouge_scorer

from fastlm.reporting.rouge import ROUGE_TYPES, resolve_tokenizer, rouge_scores, score_columns, tokenize

ENGLISH_REFERENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog",
    "Battery life is great, shipping was fast!",
]
ENGLISH_PREDICTIONS = [
    "the cat was on a mat",
    "the lazy dog jumps over a quick fox",
    "Fast shipping; battery OK.",
]
KOREAN_REFERENCES = ["배송이 빠르고 포장이 꼼꼼해요", "가격 대비 품질이 좋습니다"]
KOREAN_PREDICTIONS = ["배송이 빠르고 좋아요", "품질이 좋습니다"]


def test_english_scores_equal_rouge_scores_own(tmp_path):
    per_sample, aggregate, kind = rouge_scores(ENGLISH_PREDICTIONS, ENGLISH_REFERENCES, "auto")
    assert kind == "default"
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES))
    expected = [
        scorer.score(ref, pred) for ref, pred in zip(ENGLISH_REFERENCES, ENGLISH_PREDICTIONS, strict=True)
    ]
    for row, scores in zip(per_sample.to_dict("records"), expected, strict=True):
        for rouge in ROUGE_TYPES:
            assert row[f"{rouge}_f1"] == pytest.approx(scores[rouge].fmeasure)
            assert row[f"{rouge}_precision"] == pytest.approx(scores[rouge].precision)
            assert row[f"{rouge}_recall"] == pytest.approx(scores[rouge].recall)
    for rouge in ROUGE_TYPES:
        assert aggregate[rouge] == pytest.approx(sum(s[rouge].fmeasure for s in expected) / len(expected))
    assert 0 < aggregate["rouge2"] < aggregate["rouge1"] < 1
    # The Unicode tokenizer is the default one on ASCII text: same numbers.
    unicode_scores = rouge_scores(ENGLISH_PREDICTIONS, ENGLISH_REFERENCES, "unicode")[0]
    assert unicode_scores.equals(per_sample)


def test_default_tokenizer_drops_hangul_so_korean_scores_zero():
    assert tokenize("배송이 빠르고 포장이 꼼꼼해요", "default") == []
    _, aggregate, kind = rouge_scores(KOREAN_REFERENCES, KOREAN_REFERENCES, "default")  # identical texts
    assert kind == "default" and all(aggregate[rouge] == 0 for rouge in ROUGE_TYPES)


@pytest.mark.parametrize("kind", ["auto", "unicode", "syllable", "whitespace"])
def test_korean_aware_tokenizers_score_identical_texts_one_and_overlaps_above_zero(kind):
    identical = rouge_scores(KOREAN_REFERENCES, KOREAN_REFERENCES, kind)[1]
    assert all(identical[rouge] == pytest.approx(1.0) for rouge in ROUGE_TYPES)
    per_sample, aggregate, resolved = rouge_scores(KOREAN_PREDICTIONS, KOREAN_REFERENCES, kind)
    assert resolved == ("unicode" if kind == "auto" else kind)
    assert (per_sample["rouge1_f1"] > 0).all() and 0 < aggregate["rouge1"] < 1
    assert aggregate["rouge1_precision"] > aggregate["rouge1_recall"]  # shorter predictions, all words right


@pytest.mark.parametrize("kind", ["auto", "unicode", "syllable", "whitespace"])
def test_a_text_scores_one_against_itself_whatever_form_either_side_is_written_in(kind):
    """The references are the split's cleaned texts (NFC, no invisible marks, LF); a generation is decoded as
    the model wrote it. A zero-width space, word joiner or BOM inside a generated word split it into two
    tokens (or, under ``whitespace``, made it another token), so a prediction equal to its reference scored
    below 1; decomposed (NFD) Hangul on either side must not score 0 either. Both sides are normalized by
    the split's rule before tokenizing."""
    import unicodedata

    reference = "배송이 빨라요\n가격 대비 좋아요"
    predictions = [
        "배송\u200b이 빨라요\r\n가격 대\u2060비 좋아요",
        "\ufeff" + unicodedata.normalize("NFD", reference),
        unicodedata.normalize("NFD", reference)[:1] + "\u200b" + unicodedata.normalize("NFD", reference)[1:],
    ]
    scores = rouge_scores(predictions, [reference] * 3, kind)[0]
    f1 = scores[[f"{rouge}_f1" for rouge in ROUGE_TYPES]].to_numpy().ravel().tolist()
    assert f1 == pytest.approx([1.0] * 9), scores
    decomposed = rouge_scores([reference], [unicodedata.normalize("NFD", reference)], kind)[1]
    assert all(decomposed[rouge] == pytest.approx(1.0) for rouge in ROUGE_TYPES), decomposed


def test_unicode_tokenizer_keeps_words_and_splits_unspaced_scripts():
    assert tokenize("배송이 빨라요! 東京に行く Café, 3x_y", "unicode") == [
        "배송이",
        "빨라요",
        "東",
        "京",
        "に",
        "行",
        "く",
        "café",
        "3x",
        "y",
    ]
    assert tokenize("배송이 빨라요", "syllable") == ["배", "송", "이", "빨", "라", "요"]
    assert tokenize("ＡＢＣ Ｄ", "unicode") == ["abc", "d"]  # NFKC folds full-width letters


def test_a_word_keeps_its_vowel_signs_and_other_combining_marks():
    """Hindi, Thai, Arabic with its vowel marks, Hebrew with niqqud write vowels as combining marks (Unicode
    Mn/Mc) inside a word: the word is one token, marks kept. Was: each mark cut the word and was dropped, so
    "हिन्दी" read as the consonants ह न द and Thai ดี (good) and ดู (look) as the same token ด: different
    words matched, one word counted as several. An emoji's variation selector is no letter's mark."""
    assert tokenize("हिन्दी भाषा", "unicode") == ["हिन्दी", "भाषा"]
    assert tokenize("ภาษาไทย ดี", "unicode") == ["ภาษาไทย", "ดี"]
    assert tokenize("مَرْحَبًا بِكَ", "unicode") == ["مَرْحَبًا", "بِكَ"]
    assert tokenize("배송이 빨라요 ❤️ 1️⃣", "syllable") == ["배", "송", "이", "빨", "라", "요", "1"]
    assert rouge_scores(["ดู"], ["ดี"], "unicode")[1]["rouge1"] == 0.0
    assert rouge_scores(["हिन्दी"], ["हिन्दी"], "auto")[1]["rouge1"] == pytest.approx(1.0)
    assert rouge_scores(["हन्द"], ["हिन्दी"], "auto")[1]["rouge1"] == 0.0


def test_han_characters_past_the_basic_plane_are_one_token_each_as_the_others():
    """Han characters of CJK Extension B and later (U+20000 on: Cantonese 𠮶, 𨋢, rare names' characters)
    are one token each, as the basic plane's are. Was: a run of them was one word, so 𠮶𨋢 and 𨋢𠮶 shared no
    token."""
    assert tokenize("佢哋𠮶𨋢 字", "unicode") == ["佢", "哋", "𠮶", "𨋢", "字"]
    assert rouge_scores(["𨋢𠮶"], ["𠮶𨋢"], "unicode")[1]["rouge1"] == pytest.approx(1.0)


def test_syllables_credit_the_same_word_with_another_particle():
    word = rouge_scores(["배송은 빨라요"], ["배송이 빨라요"], "unicode")[1]
    syllable = rouge_scores(["배송은 빨라요"], ["배송이 빨라요"], "syllable")[1]
    assert word["rouge1"] == pytest.approx(0.5) and syllable["rouge1"] == pytest.approx(5 / 6)


def test_auto_looks_at_references_only():
    assert resolve_tokenizer("auto", ["plain ascii, 123"]) == "default"
    assert resolve_tokenizer("auto", ["plain", "café"]) == "unicode"
    assert resolve_tokenizer("syllable", ["plain"]) == "syllable"
    with pytest.raises(ValueError, match="unknown ROUGE tokenizer"):
        resolve_tokenizer("mecab", ["x"])


def test_empty_prediction_scores_zero_and_columns_are_complete():
    per_sample, aggregate, _ = rouge_scores(["", "the cat"], ["the cat", "the cat"], "auto")
    assert list(per_sample.columns) == score_columns()
    assert per_sample.loc[0, "rouge1_f1"] == 0 and per_sample.loc[1, "rougeL_f1"] == 1
    assert aggregate["rougeL"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        rouge_scores(["a", "b"], ["a"])


def test_references_without_rouge_tokens_are_counted_and_kept_in_the_mean_as_rouge_score_keeps_them():
    """A reference of punctuation only ("!!!") has no tokens under either tokenizer: it scores 0 whatever
    was generated. The means keep it (rouge-score's aggregator and Hugging Face evaluate count it as 0, so
    the figures compare with theirs), and it is counted, with the means over the other samples beside."""
    references = ["the cat sat", "!!!", "a dog ran"]
    predictions = ["the cat sat", "!!!", "a dog sat"]
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES))
    expected = [scorer.score(r, p) for r, p in zip(references, predictions, strict=True)]
    assert expected[1]["rouge1"].fmeasure == 0.0  # rouge-score's own: no tokens, 0 even for the same text
    for kind in ("default", "unicode"):
        assert tokenize("!!!", kind) == []
        _, aggregate, _ = rouge_scores(predictions, references, kind)
        assert aggregate["rouge_tokenless_references"] == 1
        for rouge in ROUGE_TYPES:
            scores = [s[rouge].fmeasure for s in expected]
            assert aggregate[rouge] == pytest.approx(sum(scores) / 3, abs=1e-12)
            assert aggregate[f"{rouge}_scorable"] == pytest.approx((scores[0] + scores[2]) / 2, abs=1e-12)
    _, plain, _ = rouge_scores(["the cat"], ["the cat"], "auto")
    assert plain["rouge_tokenless_references"] == 0 and "rouge1_scorable" not in plain
