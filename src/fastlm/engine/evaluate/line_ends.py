"""Line ends of the texts fastlm writes from a model: CRLF and a lone CR become LF, the rule the split's
cleaning applies to its inputs (``fastlm.corpus.cleaning``).

A decoded generation, token or sample may hold a bare carriage return (a model trained on Windows text, a
byte-level token for CR). ``DataFrame.to_csv`` quotes only the fields that hold a line feed, so a CR left in
an unquoted field splits its row for every CSV reader. Every decoded text goes through :func:`lf_line_ends`
before it is put in a table.
"""

from __future__ import annotations

__all__ = ["lf_line_ends"]


def lf_line_ends(text: str) -> str:
    """``text`` with each CRLF and each lone CR as one LF (a CRLF is one line end, not two)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
