"""Benchmark texts with the length profile of real short reviews (issue 16), deterministic.

``benchmarks/data/short_review_lengths.csv`` holds the character-length distribution of 300,000 real Korean
user reviews (median 27, p90 75, p99 139, max 147 characters). ``realistic_texts(n, seed)`` draws each row's
character length from it, takes the content from the project's synthetic generator (``make_texts``, profile
"short") and cuts each text to its drawn length or extends it with further generated sentences; then a few
rows are emptied and rows are made exact duplicates of earlier ones until about 2.5 % are (natural
repeats of very short texts included), as in the real data. A duplicate
copies a row drawn from the same distribution, so the length statistics stay those of the file.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # demo_data: the demo-data generators

LENGTHS_CSV = Path(__file__).resolve().parent / "data" / "short_review_lengths.csv"
DUPLICATE_SHARE = 0.025
EMPTY_ROWS = 3  # the real data has 0.003 % empty rows; a few, so the empty-row path is exercised


def load_length_distribution(path: Path = LENGTHS_CSV) -> tuple[np.ndarray, np.ndarray]:
    """(characters, share) from the CSV; '#' lines are comments; shares are normalised to sum to 1."""
    with path.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    chars = np.array([int(row["characters"]) for row in rows], dtype=np.int64)
    share = np.array([float(row["share"]) for row in rows], dtype=np.float64)
    return chars, share / share.sum()


def realistic_texts(n: int, *, seed: int = 0) -> list[str]:
    """``n`` texts whose character lengths follow the real short-review distribution (same seed, same list)."""
    from demo_data.texts import make_texts

    rng = np.random.default_rng(seed)
    chars, share = load_length_distribution()
    goals = rng.choice(chars, size=n, p=share)
    pool = make_texts(n, seed=seed, profile="short")
    spare = make_texts(max(n // 2, 16), seed=seed + 1, profile="short")
    texts: list[str] = []
    next_spare = 0
    for text, goal in zip(pool, goals.tolist(), strict=True):
        while len(text) < goal:
            text = f"{text} {spare[next_spare % len(spare)]}"
            next_spare += 1
        # Start at a random word so that short cuts are not all the first words of common templates.
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == " " and len(text) - i - 1 >= goal]
        start = starts[int(rng.integers(0, len(starts)))]
        text = text[start:start + goal]
        if text != text.rstrip():  # never end on a space: fill it with a full stop, same length
            text = text.rstrip() + "." * (goal - len(text.rstrip()))
        texts.append(text)
    if n >= 100:
        for row in rng.choice(n, size=min(EMPTY_ROWS, n), replace=False).tolist():
            texts[row] = ""
    n_dup = int(round(n * DUPLICATE_SHARE)) - (n - len(set(texts)))  # natural repeats of short texts count
    if n_dup:
        targets = rng.choice(np.arange(1, n), size=min(n_dup, n - 1), replace=False)
        for row in np.sort(targets).tolist():
            texts[row] = texts[int(rng.integers(0, row))]
    return texts


def text_statistics(texts: list[str]) -> dict:
    """Character-length statistics, empty rows and exact-duplicate share of ``texts``."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    return {
        "rows": len(texts),
        "chars_median": float(np.median(lengths)),
        "chars_p90": float(np.percentile(lengths, 90)),
        "chars_p99": float(np.percentile(lengths, 99)),
        "chars_max": int(lengths.max()) if len(texts) else 0,
        "empty_rows": int((lengths == 0).sum()),
        "duplicate_share": 1 - len(set(texts)) / len(texts) if texts else 0.0,
    }
