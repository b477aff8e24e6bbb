"""lf_line_ends: the split's line-end rule for the texts fastlm writes from a model."""

import pandas as pd
import pytest

from fastlm.corpus.cleaning import classify_values
from fastlm.engine.evaluate.line_ends import lf_line_ends


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\r\nb", "a\nb"),
        ("a\rb", "a\nb"),
        ("a\r\rb", "a\n\nb"),
        ("a\r\n\rb\n", "a\n\nb\n"),
        ("a\n\rb", "a\n\nb"),
        ("no line end", "no line end"),
        ("", ""),
    ],
)
def test_crlf_and_lone_cr_become_one_lf_each(text, expected):
    assert lf_line_ends(text) == expected


def test_the_rule_is_the_splits_cleaning_rule():
    texts = ["x\r\ny", "x\ry", "x\r\r\ny\rz", "x\n\r\ny"]
    cleaned, reasons = classify_values(pd.Series(texts, dtype=object))
    assert reasons.isna().all() and [lf_line_ends(text) for text in texts] == cleaned.tolist()
