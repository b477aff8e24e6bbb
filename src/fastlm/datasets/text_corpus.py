"""Read-only raw text table: CSV, TSV, JSONL or Parquet by extension, a ``save_to_disk`` folder, or the
shards of a folder or glob (``fastlm.corpus.shards``)."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from fastlm.corpus.readers import FIX
from fastlm.corpus.shards import check_raw_path, data_files, is_pattern, read_raw_table
from fastlm.engine.paths import project_name
from fastlm.errors import InputDataError
from fastlm.redaction import shown_location

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


class TextCorpusDataset(AbstractDataset):
    """The user's raw corpus, a local file, folder or glob. Never written by a pipeline.

    ``filepath`` is shown with its credentials masked as given, before ``PurePosixPath`` turns a URL's ``//``
    into ``/``; a URL (``https://``, ``s3://``) is refused in one line before anything is read.
    """

    raw_input = True  # its reader explains a bad file itself (hooks.MissingInputsHook asks check_input)

    def __init__(self, filepath: str, metadata: dict | None = None):
        self._shown = shown_location(filepath)
        self._is_url = bool(_URL.match(str(filepath)))
        self._filepath = PurePosixPath(filepath)
        self.metadata = metadata

    def load(self):
        self._refuse_url()
        return read_raw_table(self._local)

    def check_input(self) -> None:
        """Refuse, in the reader's one line, a file that cannot be read (missing, an unknown extension, not a
        regular file, empty; a folder or glob of no shards, or of shards of two formats), before a run starts:
        nothing runs and no MLflow run is opened."""
        self._refuse_url()
        check_raw_path(self._local)

    @property
    def _local(self) -> Path:
        """The file as messages name it: relative to the project (where every run works) when inside it."""
        return Path(project_name(self._filepath))

    def _refuse_url(self) -> None:
        if self._is_url:
            raise InputDataError(
                f"raw data {self._shown} is a URL; fastlm reads the raw data from a local file or folder.",
                fix=f"download it first (credentials stay out of parameters and logs), then {FIX}.",
            )

    def save(self, data) -> None:
        raise DatasetError(f"{self._shown} is raw input: fastlm never writes it.")

    def _exists(self) -> bool:
        if self._is_url:
            return False
        return bool(data_files(self._local)) if is_pattern(self._local) else Path(self._filepath).exists()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": self._shown}
