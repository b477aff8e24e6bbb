"""The last sweep's results as one read-only view for the report: None before any sweep, so the report has a
sweep section only after ``kedro run --pipeline=sweep``."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
from kedro.io import AbstractDataset, DatasetError

from fastlm.reporting.sweep_view import read_sweep_data, read_sweep_document


class SweepResultsDataset(AbstractDataset):
    """Loads ``{"name", "verdict", "table", "plot" (PNG bytes or None), "source", "data", "folds"}`` from the
    sweep pipeline's comparison table, document (``sweep.md``: ``data`` is the identity of the data its runs
    trained on, None where not recorded), loss plot and per-fold table (``sweep_folds.csv``: None where there
    is none or it holds other runs than the comparison); None when there is no comparison table yet.
    Read-only: the sweep pipeline writes those files through their own catalog entries."""

    def __init__(
        self,
        comparison: str,
        document: str,
        plot: str,
        folds: str | None = None,
        metadata: dict | None = None,
    ):
        self._comparison, self._document, self._plot = (
            PurePosixPath(comparison),
            PurePosixPath(document),
            PurePosixPath(plot),
        )
        self._folds = PurePosixPath(folds) if folds else None
        self.metadata = metadata

    def load(self) -> dict | None:
        if not Path(self._comparison).is_file():
            return None
        document = Path(self._document)
        text = document.read_text(encoding="utf-8") if document.is_file() else ""
        name, verdict = read_sweep_document(text) if text else ("", "")
        plot = Path(self._plot)
        table = pd.read_csv(self._comparison)
        if "stopped" in table:  # an empty cell: the run was not stopped (not a missing value)
            table["stopped"] = table["stopped"].astype(object).where(table["stopped"].notna(), "")
        return {
            "name": name,
            "verdict": verdict,
            "table": table,
            "plot": plot.read_bytes() if plot.is_file() else None,
            "source": str(self._comparison),
            "data": read_sweep_data(text),
            "folds": self._load_folds(table),
        }

    def _load_folds(self, table: pd.DataFrame) -> pd.DataFrame | None:
        """The per-fold table of the same sweep (its runs the comparison's), None otherwise."""
        if self._folds is None or not Path(self._folds).is_file():
            return None
        folds = pd.read_csv(self._folds)
        runs = folds.loc[folds.get("row", pd.Series(dtype=object)).isin(["fold", "run"]), "run"]
        return folds if set(runs.astype(str)) == set(table["run"].astype(str)) else None

    def save(self, data) -> None:
        raise DatasetError(
            "sweep_results is read-only: `kedro run --pipeline=sweep` writes the sweep's files."
        )

    def _exists(self) -> bool:
        return Path(self._comparison).is_file()

    def _describe(self) -> dict[str, Any]:
        return {
            "comparison": str(self._comparison),
            "document": str(self._document),
            "plot": str(self._plot),
            "folds": str(self._folds),
        }
