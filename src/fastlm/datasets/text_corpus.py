"""Read-only raw text table: CSV, TSV, JSONL or Parquet by extension, or a ``save_to_disk`` folder."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from fastlm.corpus.readers import read_text_table


class TextCorpusDataset(AbstractDataset):
    """The user's raw corpus. Never written by a pipeline."""

    raw_input = True  # its reader explains a bad file itself (hooks.MissingInputsHook leaves it alone)

    def __init__(self, filepath: str, metadata: dict | None = None):
        self._filepath = PurePosixPath(filepath)
        self.metadata = metadata

    def load(self):
        return read_text_table(self._filepath)

    def save(self, data) -> None:
        raise DatasetError(f"{self._filepath} is raw input: fastlm never writes it.")

    def _exists(self) -> bool:
        return Path(self._filepath).exists()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}
