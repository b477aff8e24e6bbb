"""A Hugging Face tokenizer stored as a ``save_pretrained`` directory."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from fastlm.datasets.atomic_folder import recover_folder, write_folder_atomically


class PretrainedTokenizerDataset(AbstractDataset):
    """Loads with ``AutoTokenizer.from_pretrained`` (local files only), saves with ``save_pretrained``."""

    def __init__(self, filepath: str, load_args: dict[str, Any] | None = None, metadata: dict | None = None):
        self._filepath = PurePosixPath(filepath)
        self._load_args = {"local_files_only": True, "trust_remote_code": False, **(load_args or {})}
        self.metadata = metadata

    def load(self):
        from transformers import AutoTokenizer

        recover_folder(self._filepath)  # a save killed between the two renames of its swap
        if not Path(self._filepath).is_dir():
            raise DatasetError(f"No tokenizer at {self._filepath}: run `kedro run --pipeline=split` first.")
        return AutoTokenizer.from_pretrained(str(self._filepath), **self._load_args)

    def save(self, data) -> None:
        write_folder_atomically(self._filepath, lambda tmp: data.save_pretrained(str(tmp)))

    def _exists(self) -> bool:
        recover_folder(self._filepath)
        return (Path(self._filepath) / "tokenizer_config.json").is_file()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath), "load_args": self._load_args}
