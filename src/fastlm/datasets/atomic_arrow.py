"""Hugging Face ``Dataset``/``DatasetDict`` saved with ``save_to_disk`` (the YAML of kedro-datasets'
``huggingface.ArrowDataset``: ``path``, ``load_args``, ``save_args``, ``credentials``, ``fs_args``), local
saves atomic (a killed run never leaves a torn folder).

Its own small class, not a subclass: importing ``kedro_datasets.huggingface`` imports its transformers
pipeline dataset too (``transformers.pipeline`` and torch: seconds at every `kedro run` start-up).
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import PurePosixPath
from typing import Any

from kedro.io.core import AbstractDataset, DatasetError, get_filepath_str, get_protocol_and_path

from fastlm.datasets.atomic_folder import recover_folder, write_folder_atomically
from fastlm.redaction import shown_location


class AtomicArrowDataset(AbstractDataset):
    """``datasets.load_from_disk`` / ``save_to_disk`` of a folder; local saves go through a temporary
    sibling."""

    def __init__(
        self,
        *,
        path: str,
        load_args: dict[str, Any] | None = None,
        save_args: dict[str, Any] | None = None,
        credentials: dict[str, Any] | None = None,
        fs_args: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        import fsspec

        self._shown = shown_location(path)  # credentials masked as given: fsspec drops the scheme, not them
        protocol, resolved = get_protocol_and_path(str(path))
        options = {**deepcopy(credentials or {}), **deepcopy(fs_args or {})}
        self._protocol = protocol
        self._filepath = PurePosixPath(resolved)
        self._fs = fsspec.filesystem(protocol, **options)
        self._storage_options = options or None
        self._load_args, self._save_args = deepcopy(load_args or {}), deepcopy(save_args or {})
        self.metadata = metadata

    @property
    def _location(self) -> str:
        return get_filepath_str(self._filepath, self._protocol)

    def load(self):
        from datasets import load_from_disk

        if self._protocol == "file":
            recover_folder(self._location)  # a save killed between the two renames of its swap
        return load_from_disk(self._location, storage_options=self._storage_options, **self._load_args)

    def save(self, data) -> None:
        from datasets import Dataset, DatasetDict

        if not isinstance(data, Dataset | DatasetDict):
            raise DatasetError(
                f"{type(self).__name__} saves a datasets.Dataset or DatasetDict, got {type(data)}"
            )
        if self._protocol != "file":
            data.save_to_disk(self._location, storage_options=self._storage_options, **self._save_args)
            return
        write_folder_atomically(self._location, lambda tmp: data.save_to_disk(str(tmp), **self._save_args))

    def _exists(self) -> bool:
        location = self._location
        return self._fs.isdir(location) and (
            self._fs.exists(f"{location}/dataset_dict.json")
            or self._fs.exists(f"{location}/dataset_info.json")
        )

    def _describe(self) -> dict[str, Any]:
        return {"path": self._shown, "protocol": self._protocol}
