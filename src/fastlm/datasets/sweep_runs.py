"""The sweeps' store of finished runs as a catalog entry (``sweep_runs``): the node gets a
``fastlm.sweeps.SweepRuns`` for the configured folder and holds no path of its own."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from fastlm.sweeps import SweepRuns


class SweepRunsDataset(AbstractDataset):
    """Loads a ``SweepRuns`` over ``path`` (the runs are kept by it, run by run, as they finish)."""

    def __init__(self, path: str, metadata: dict | None = None):
        self._path = PurePosixPath(path)
        self.metadata = metadata

    def load(self) -> SweepRuns:
        return SweepRuns(str(self._path))

    def save(self, data) -> None:
        raise DatasetError("sweep_runs is not saved as a whole: the sweep keeps each run as it finishes.")

    def _exists(self) -> bool:
        return True

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
