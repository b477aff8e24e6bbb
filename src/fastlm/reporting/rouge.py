"""ROUGE-1/2/L of generated texts against references, with the rouge-score package and a tokenizer that
keeps every script.

rouge-score's own tokenizer (Chin-Yew Lin's ROUGE rules) lower-cases and keeps only ``[a-z0-9]`` runs: a
Korean, Chinese or Japanese text becomes *no tokens at all*, and every score is 0 whatever the model wrote.
So the n-gram matching, LCS and F-measure stay rouge-score's, and only the tokenizer is chosen:

``default``    rouge-score's tokenizer: English (ASCII) text, numbers identical to the package's.
``unicode``    lower-cased (NFKC) runs of Unicode letters and digits with the combining marks written in
               words (vowel signs of Devanagari and Thai, Arabic's harakat), so Hangul words (eojeol) are
               kept; scripts written without spaces (Han ideographs, Hiragana, Katakana) give one token per
               character. Identical to ``default`` on ASCII text.
``syllable``   ``unicode``, then every Hangul syllable is its own token: a Korean word and the same word
               with another particle (배송이 / 배송은) share n-grams. More lenient (ROUGE-1 counts common
               syllables), a stand-in for the morpheme split a Korean analyser would give.
``whitespace`` lower-cased whitespace-separated pieces, punctuation kept attached.
``auto``       ``unicode`` when any reference holds a letter or digit outside ASCII, else ``default``.

Both sides are first normalized by the split's rule (``fastlm.corpus.cleaning.normalize_text``: NFC, LF line
ends, no zero-width space, word joiner, BOM or soft hyphen): the references are the split's cleaned texts,
and a generation holding such a mark inside a word, or written decomposed, is the same text (it scored
below 1 against itself).

``auto`` looks at the references only, so the choice is the same for every run scored on the same data and
their scores compare.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import unicodedata
from collections.abc import Sequence

import pandas as pd

from fastlm.corpus.cleaning import normalize_text

__all__ = [
    "ROUGE_TYPES",
    "TOKENIZERS",
    "resolve_tokenizer",
    "rouge_scores",
    "score_columns",
    "tokenize",
    "tokenless_note",
]

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
TOKENIZERS = ("auto", "default", "unicode", "syllable", "whitespace")
MEASURES = {"precision": "precision", "recall": "recall", "f1": "fmeasure"}


def _marks() -> str:
    """The combining marks written inside a word (Unicode Mn, Mc: Devanagari's and Thai's vowel signs, the
    virama, Arabic's harakat, Hebrew's niqqud), as a regex character class's ranges; the variation selectors
    (an emoji's presentation, U+FE0F) left out, as enclosing marks (a keycap's U+20E3) are."""
    marks = [
        code
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in ("Mn", "Mc")
        and not (0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF)
    ]
    ranges, start = [], None
    for index, code in enumerate(marks):
        if start is None:
            start = code
        if index + 1 == len(marks) or marks[index + 1] != code + 1:
            ranges.append(
                f"{re.escape(chr(start))}-{re.escape(chr(code))}" if code > start else re.escape(chr(code))
            )
            start = None
    return "".join(ranges)


@functools.cache
def _word() -> re.Pattern:
    """A word: a letter or digit, then letters, digits and the combining marks written in words (Python's
    ``\\w`` leaves marks out: "हिन्दी" would read as its consonants ह न द, Thai ดี and ดู as one token ด).
    Built at its first use (a scan of the code points), not at each kedro start-up."""
    return re.compile(rf"[^\W_](?:[^\W_]|[{_marks()}])*")


# Scripts written without spaces between words: one token per character (Hiragana, Katakana, Han: the
# unified ideographs, Extension A, the compatibility ideographs, and Extension B on past the basic plane).
_PER_CHARACTER = re.compile(
    r"([\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U000323af])"
)
_HANGUL_SYLLABLE = re.compile(r"([\uac00-\ud7a3])")
_NON_ASCII_LETTER = re.compile(r"[^\W_\x00-\x7f]")  # a letter or digit that rouge-score's tokenizer drops


def _split_out(pattern: re.Pattern, words: list[str]) -> list[str]:
    return [piece for word in words for piece in pattern.split(word) if piece]


def tokenize(text: str, kind: str) -> list[str]:
    """``text`` as the tokens ``kind`` (one of TOKENIZERS except ``auto``) scores, normalized first as the
    split normalizes its texts (``normalize_text``)."""
    text = normalize_text(text or "")
    if kind == "default":
        from rouge_score import tokenizers  # here, not at each kedro start-up: rouge-score imports nltk

        return tokenizers.DefaultTokenizer(use_stemmer=False).tokenize(text)
    text = unicodedata.normalize("NFKC", text).lower()
    if kind == "whitespace":
        return text.split()
    if kind not in ("unicode", "syllable"):
        raise ValueError(f"unknown ROUGE tokenizer {kind!r}; choose one of {TOKENIZERS}")
    words = _split_out(_PER_CHARACTER, _word().findall(text))
    return _split_out(_HANGUL_SYLLABLE, words) if kind == "syllable" else words


def resolve_tokenizer(kind: str, references: Sequence[str]) -> str:
    """``auto`` -> ``unicode`` when a reference has a non-ASCII letter or digit, else ``default``."""
    if kind != "auto":
        if kind not in TOKENIZERS:
            raise ValueError(f"unknown ROUGE tokenizer {kind!r}; choose one of {TOKENIZERS}")
        return kind
    if any(_NON_ASCII_LETTER.search(reference or "") for reference in references):
        return "unicode"
    return "default"


class _Tokenizer:
    """The object rouge-score calls (``tokenize(text) -> list[str]``)."""

    def __init__(self, kind: str):
        self.kind = kind

    def tokenize(self, text: str) -> list[str]:
        return tokenize(text, self.kind)


def score_columns() -> list[str]:
    """Per-sample score columns: ``rouge1_precision``, ``rouge1_recall``, ``rouge1_f1``, ... ``rougeL_f1``."""
    return [f"{rouge}_{measure}" for rouge in ROUGE_TYPES for measure in MEASURES]


def rouge_scores(
    predictions: Sequence[str], references: Sequence[str], tokenizer: str = "auto"
) -> tuple[pd.DataFrame, dict, str]:
    """Per-sample scores (``score_columns()``), their means, and the tokenizer used.

    The means are ``rouge1`` / ``rouge2`` / ``rougeL`` (F1) and ``<type>_precision`` / ``<type>_recall``,
    averaged over samples (what rouge-score's BootstrapAggregator reports as ``mid``, without resampling).
    ROUGE-L is the sentence-level LCS (``rougeL``, no newline splitting). An empty prediction scores 0.

    A reference with no tokens under the tokenizer (punctuation only, such as "!!!", or empty) scores 0
    whatever was generated. It stays in the means, as rouge-score's aggregator and Hugging Face evaluate
    keep it (so the figures compare with theirs), and is counted: ``rouge_tokenless_references``; where
    there are any, ``<type>_scorable`` is the mean F1 over the other samples (NaN where there are none).
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    from rouge_score import rouge_scorer

    kind = resolve_tokenizer(tokenizer, references)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=_Tokenizer(kind))
    rows = []
    for prediction, reference in zip(predictions, references, strict=True):
        scores = scorer.score(reference or "", prediction or "")  # (target, prediction)
        rows.append(
            {
                f"{rouge}_{measure}": float(getattr(scores[rouge], field))
                for rouge in ROUGE_TYPES
                for measure, field in MEASURES.items()
            }
        )
    per_sample = pd.DataFrame(rows, columns=score_columns())
    means = per_sample.mean() if len(per_sample) else pd.Series(float("nan"), index=per_sample.columns)
    aggregate = {}
    for rouge in ROUGE_TYPES:
        aggregate[rouge] = float(means[f"{rouge}_f1"])
        aggregate[f"{rouge}_precision"] = float(means[f"{rouge}_precision"])
        aggregate[f"{rouge}_recall"] = float(means[f"{rouge}_recall"])
    tokenless = [not tokenize(reference or "", kind) for reference in references]
    aggregate["rouge_tokenless_references"] = sum(tokenless)
    if any(tokenless):
        scorable = per_sample[[not empty for empty in tokenless]]
        for rouge in ROUGE_TYPES:
            aggregate[f"{rouge}_scorable"] = (
                float(scorable[f"{rouge}_f1"].mean()) if len(scorable) else math.nan
            )
    return per_sample, aggregate, kind


def tokenless_note(aggregate: dict) -> str:
    """What ``rouge_tokenless_references`` means for the figures, in one sentence ("" where there are
    none): the report's text and the node's warning."""
    count = aggregate.get("rouge_tokenless_references") or 0
    if not count:
        return ""
    total = aggregate.get("rouge_samples")
    others = None if total is None else total - count
    of = (
        f"{count:,} of the {total:,} reference responses"
        if total is not None
        else f"{count:,} reference responses"
    )
    verb = "has" if count == 1 else "have"
    text = (
        f"{of} {verb} no tokens under tokenizer '{aggregate.get('rouge_tokenizer')}' (punctuation only, or "
        "empty): each scores 0 whatever the model wrote and is counted in the means as 0, as rouge-score's "
        "aggregator and Hugging Face evaluate count it"
    )
    if others:
        scores = " / ".join(f"{aggregate.get(f'{rouge}_scorable', math.nan):.4g}" for rouge in ROUGE_TYPES)
        text += f"; ROUGE-1 / ROUGE-2 / ROUGE-L F1 over the other {others:,}: {scores}"
    return text + "."
