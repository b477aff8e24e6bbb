"""Tokenized samples as one flat int32 array plus offsets: O(1), zero-copy access for DataLoader workers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


class TokenSequences:
    """Sample ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (a numpy view; nothing is tokenized here)."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values = np.ascontiguousarray(values, dtype=np.int32)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.lengths = np.diff(self.offsets)

    @classmethod
    def from_arrow(cls, dataset, column: str = "input_ids") -> TokenSequences:
        """From a ``datasets.Dataset`` (or a pyarrow Table) with a list<int> column, without Python loops."""
        table = dataset.data.table if hasattr(dataset, "data") else dataset
        if hasattr(dataset, "_indices") and dataset._indices is not None:  # a selected/shuffled view
            table = table.take(dataset._indices.column(0))
        ids = table.column(column).combine_chunks() if table.num_rows else pa.array([], pa.list_(pa.int32()))
        offsets = ids.offsets.to_numpy().astype(np.int64)
        values = ids.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]] if len(offsets) else ids.values
        return cls(np.asarray(values), offsets - (offsets[0] if len(offsets) else 0))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def __getitems__(self, indices) -> list[np.ndarray]:
        return [self[int(index)] for index in indices]

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())
