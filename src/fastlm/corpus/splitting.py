"""Stable train/validation/test assignment from a keyed hash of each text.

A row's split depends only on its text, the salt and the ratios: never on row order, row count or a
random draw, so appending rows never moves an existing row to another split.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

SPLITS = ("train", "validation", "test")
FOLD_COLUMN = "fold"  # split.folds: each train/validation row's fold bucket (0 .. k-1); test rows -1
_SCALE = 2.0**-53


def text_keys(texts: Iterable[str], salt: str = "") -> np.ndarray:
    """Two independent uniform keys in [0, 1) per text: column 0 for the split, column 1 for capping."""
    key = salt.encode("utf-8")
    digests = b"".join(
        hashlib.blake2b(text.encode("utf-8"), digest_size=16, key=key).digest() for text in texts
    )
    words = np.frombuffer(digests, dtype="<u8").reshape(-1, 2)
    return (words >> np.uint64(11)).astype(np.float64) * _SCALE


def assign_splits(split_keys: np.ndarray, train: float, validation: float, test: float) -> np.ndarray:
    """Index into SPLITS for each key: train below ``train``, validation below ``train + validation``.

    A zero ratio gets no rows at all, whatever the floating-point rounding of the others.
    """
    bounds = np.array([train, train + validation], dtype=np.float64)
    if test == 0:
        bounds[1] = np.inf
        if validation == 0:
            bounds[0] = np.inf
    return np.searchsorted(bounds, split_keys, side="right").astype(np.int8)


def assign_folds(
    split_keys: np.ndarray, codes: np.ndarray, folds: int, train: float, validation: float, test: float
) -> np.ndarray:
    """Fold bucket (0 .. ``folds`` - 1) of each train/validation row, -1 for a test row.

    The bucket is the row's split key rescaled over the train + validation range: the same keyed hash as
    the split (stable, independent of row order; the salt re-draws both), while the test rows, whose keys
    lie above that range, keep their split and belong to no fold. Each fold holds about 1/``folds`` of
    train + validation.
    """
    span = 1.0 if test == 0 else train + validation
    buckets = np.minimum(np.floor(split_keys / span * folds), folds - 1).astype(np.int8)
    return np.where(codes == SPLITS.index("test"), np.int8(-1), buckets)


def cap_rows(sample_keys: np.ndarray, max_samples: int | None) -> np.ndarray:
    """Positions of the rows kept under ``max_samples`` (smallest keys; original order preserved)."""
    if max_samples is None or max_samples >= len(sample_keys):
        return np.arange(len(sample_keys))
    chosen = np.argpartition(sample_keys, max_samples - 1)[:max_samples]
    return np.sort(chosen)
