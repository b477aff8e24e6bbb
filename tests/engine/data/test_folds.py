"""``train.fold: i`` on data split with folds: validation = the train/validation rows of fold i, train = the
rest; refused in one line on data split without folds or for a fold the data does not have."""

import datasets
import pytest

from fastlm.engine.data.folds import fold_splits
from fastlm.errors import ConfigError


def _tokenized(with_folds=True):
    def part(ids, folds):
        columns = {"input_ids": [[i, i + 1] for i in ids], "length": [2] * len(ids)}
        return datasets.Dataset.from_dict({**columns, **({"fold": folds} if with_folds else {})})

    return datasets.DatasetDict(
        {
            "train": part([1, 2, 3, 4, 5], [0, 1, 1, 0, 1]),
            "validation": part([6, 7], [0, 1]),
            "test": part([8], [-1]),
        }
    )


def _first_ids(split):
    return sorted(row[0] for row in split["input_ids"])


def test_fold_i_validates_on_its_bucket_and_trains_on_the_rest():
    data = _tokenized()
    for fold, held_out in ((0, [1, 4, 6]), (1, [2, 3, 5, 7])):
        train, validation = fold_splits(data, fold, folds=2)
        assert _first_ids(validation) == held_out
        assert sorted(_first_ids(train) + _first_ids(validation)) == [1, 2, 3, 4, 5, 6, 7]  # a partition


def test_no_fold_keeps_the_splits_as_they_are():
    data = _tokenized()
    train, validation = fold_splits(data, None, folds=2)
    assert train is data["train"] and validation is data["validation"]


def test_a_fold_on_data_split_without_folds_is_one_line():
    with pytest.raises(ConfigError, match=r"train.fold = 0 .*split.folds") as error:
        fold_splits(_tokenized(with_folds=False), 0, folds=None)
    assert "\n" not in str(error.value) and "Fix:" in str(error.value)


def test_a_fold_the_data_does_not_have_is_one_line():
    with pytest.raises(ConfigError, match=r"train.fold = 2 .* 2 folds") as error:
        fold_splits(_tokenized(), 2, folds=2)
    assert "\n" not in str(error.value)
