"""``huggingface.ArrowDataset`` whose local saves are atomic (a killed run never leaves a torn folder)."""

from __future__ import annotations

from kedro_datasets.huggingface import ArrowDataset

from fastlm.datasets.atomic_folder import write_folder_atomically


class AtomicArrowDataset(ArrowDataset):
    """Same YAML as ``huggingface.ArrowDataset``; local saves go through a temporary sibling folder."""

    def _save_dataset(self, data, save_path: str) -> None:
        self._save_atomically(super()._save_dataset, data, save_path)

    def _save_dataset_dict(self, data, save_path: str) -> None:
        self._save_atomically(super()._save_dataset_dict, data, save_path)

    def _save_atomically(self, save, data, save_path: str) -> None:
        if self._protocol != "file":
            save(data, save_path)
            return
        write_folder_atomically(save_path, lambda tmp: save(data, str(tmp)))
