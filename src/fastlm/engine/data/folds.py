"""The rows of one fold (``train.fold``) of data split with ``split.folds``.

The split pipeline records each train/validation sample's fold bucket in a ``fold`` column of the
tokenized data (``fastlm.corpus.splitting.assign_folds``), so choosing a fold is a row selection, never a
re-tokenisation: fold ``i`` validates on the train + validation samples whose bucket is ``i`` and trains on
the others. The test split is never part of a fold.
"""

from __future__ import annotations

import datasets
import numpy as np

from fastlm.errors import ConfigError

FOLD_COLUMN = "fold"  # written by the split pipeline (fastlm.corpus.splitting.FOLD_COLUMN)


def fold_splits(tokenized, fold: int | None, folds: int | None):
    """(train, validation) of ``tokenized`` (a ``DatasetDict``) for ``train.fold`` = ``fold``; the splits as
    they are when ``fold`` is None. ``folds`` is the data's number of folds (its fingerprint's
    ``split.folds``: ``fastlm.corpus.fingerprint.data_folds``). Refused in one line when the data was split
    without folds or has no fold ``fold``."""
    if fold is None:
        return tokenized["train"], tokenized["validation"]
    if FOLD_COLUMN not in tokenized["train"].column_names or folds is None:
        raise ConfigError(
            f"train.fold = {fold} but the tokenized data was split without folds (split.folds is not set).",
            fix="run `kedro run --pipeline=split --params "
            "split.folds=<k>` first, or unset train.fold (--params train.fold=null).",
        )
    if fold >= folds:
        raise ConfigError(
            f"train.fold = {fold} but the data was split into {folds} folds (split.folds).",
            fix=f"pick a fold from 0 to {folds - 1}.",
        )
    pool = datasets.concatenate_datasets([tokenized["train"], tokenized["validation"]])
    buckets = np.asarray(pool.with_format("numpy", columns=[FOLD_COLUMN])[FOLD_COLUMN])
    return pool.select(np.flatnonzero(buckets != fold)), pool.select(np.flatnonzero(buckets == fold))
