"""The split report: rows per split, drops per reason, token length percentiles, share truncated; with
``split.folds``, each fold's figures and their spread."""

from __future__ import annotations

from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)
# the split report's (and the length statistics') key of the per-fold figures (split.folds)
FOLDS = "folds"


def length_summary(lengths: np.ndarray, truncated: np.ndarray) -> dict[str, Any]:
    """Token-length statistics of one split (EOS included)."""
    if len(lengths) == 0:
        return {"rows": 0, "tokens": 0, "mean_length": 0.0, "max_length": 0, "truncated_share": 0.0}
    points = np.percentile(lengths, PERCENTILES)
    return {
        "rows": int(len(lengths)),
        "tokens": int(lengths.sum()),
        "mean_length": round(float(lengths.mean()), 2),
        **{f"p{p}_length": float(value) for p, value in zip(PERCENTILES, points, strict=True)},
        "max_length": int(lengths.max()),
        "truncated_rows": int(truncated.sum()),
        "truncated_share": round(float(truncated.mean()), 6),
    }


def fold_summary(lengths: np.ndarray, folds: np.ndarray, count: int) -> dict[str, Any]:
    """Each of ``count`` folds' rows, tokens (EOS included, no padding), mean and p90 length, of the samples
    whose bucket (``folds``, -1: a test row, in no fold) is that fold, and the spread across folds: the
    largest fold over the smallest, by rows and by tokens (None where a fold is empty)."""
    per_fold = []
    for fold in range(count):
        chosen = lengths[folds == fold]
        per_fold.append(
            {
                "fold": fold,
                "rows": int(len(chosen)),
                "tokens": int(chosen.sum()),
                "mean_length": round(float(chosen.mean()), 2) if len(chosen) else 0.0,
                "p90_length": float(np.percentile(chosen, 90)) if len(chosen) else 0.0,
            }
        )
    return {
        "count": int(count),
        "per_fold": per_fold,
        "largest_smallest_rows": _largest_over_smallest([fold["rows"] for fold in per_fold]),
        "largest_smallest_tokens": _largest_over_smallest([fold["tokens"] for fold in per_fold]),
    }


def _largest_over_smallest(values: list[int]) -> float | None:
    return round(max(values) / min(values), 4) if values and min(values) > 0 else None


# a split whose tokens are this share of the tokenizer's unknown token or more is said (with the fix)
UNKNOWN_WARNING_SHARE = 0.01


def unknown_per_row(values: np.ndarray, offsets: np.ndarray, unknown_id: int) -> np.ndarray:
    """How many of each row's tokens are ``unknown_id`` (ragged rows: ``values[offsets[i]:offsets[i+1]]``):
    one byte per token held meanwhile (the positions of the unknown ones, then their rows)."""
    hits = np.flatnonzero(values == unknown_id)
    rows = np.searchsorted(offsets, hits, side="right") - 1
    return np.bincount(rows, minlength=len(offsets) - 1)


def unknown_summary(unknown: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """One split's unknown tokens: their count, their share of its tokens and the rows holding one."""
    tokens = int(lengths.sum())
    return {
        "unknown_tokens": int(unknown.sum()),
        "unknown_token_share": round(float(unknown.sum()) / tokens, 6) if tokens else 0.0,
        "rows_with_unknown": int((unknown > 0).sum()),
    }


def build_report(
    raw_rows: int, drops: dict[str, int], capped: int, splits: dict[str, dict], extra: dict
) -> dict:
    kept = sum(split["rows"] for split in splits.values())
    return {
        "raw_rows": int(raw_rows),
        "dropped": {**drops, "total": int(sum(drops.values()))},
        "capped_by_max_samples": int(capped),
        "kept_rows": int(kept),
        "splits": splits,
        **extra,
    }
