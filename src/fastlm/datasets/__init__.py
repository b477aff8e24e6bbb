"""Kedro datasets the catalog needs where kedro-datasets has none (or none that writes atomically)."""

from fastlm.datasets.atomic_arrow import AtomicArrowDataset
from fastlm.datasets.pretrained_model import PretrainedModelDataset
from fastlm.datasets.pretrained_tokenizer import PretrainedTokenizerDataset
from fastlm.datasets.text_corpus import TextCorpusDataset
from fastlm.datasets.train_summary import TrainSummaryDataset

__all__ = [
    "AtomicArrowDataset",
    "PretrainedModelDataset",
    "PretrainedTokenizerDataset",
    "TextCorpusDataset",
    "TrainSummaryDataset",
]
