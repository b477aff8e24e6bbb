"""A Hugging Face causal LM and its tokenizer, stored together as one ``save_pretrained`` directory."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from fastlm.datasets.atomic_folder import write_folder_atomically


class PretrainedModelDataset(AbstractDataset):
    """Saves ``{"model": ..., "tokenizer": ...}`` (safetensors) atomically; loads the same dict, offline.

    The folder loads with ``AutoModelForCausalLM``, ``AutoTokenizer`` and ``pipeline("text-generation")``.
    """

    def __init__(self, filepath: str, load_args: dict[str, Any] | None = None, metadata: dict | None = None):
        self._filepath = PurePosixPath(filepath)
        self._load_args = {"local_files_only": True, "trust_remote_code": False, **(load_args or {})}
        self.metadata = metadata

    def load(self) -> dict:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not (Path(self._filepath) / "config.json").is_file():
            raise DatasetError(f"No trained model at {self._filepath}: run `kedro run --pipeline=train` first.")
        return {
            "model": AutoModelForCausalLM.from_pretrained(str(self._filepath), **self._load_args),
            "tokenizer": AutoTokenizer.from_pretrained(str(self._filepath), **self._load_args),
        }

    def save(self, data: dict) -> None:
        def write(folder: Path) -> None:
            data["model"].save_pretrained(str(folder), safe_serialization=True)
            data["tokenizer"].save_pretrained(str(folder))

        write_folder_atomically(self._filepath, write)

    def _exists(self) -> bool:
        return (Path(self._filepath) / "config.json").is_file()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}
