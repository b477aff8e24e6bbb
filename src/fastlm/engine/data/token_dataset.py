"""Tokenized samples as one flat int32 array plus offsets: O(1), zero-copy access for DataLoader workers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


class TokenSequences:
    """Sample ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (a numpy view; nothing is tokenized here).

    ``prompt_lengths`` (optional, one per sample) is the number of leading prompt tokens of prompt/response
    data. ``dataset[i]`` is always the ids; the DataLoader's batched fetch (``__getitems__``, what collators
    receive) gives ``{"input_ids": ids, "prompt_length": n}`` when prompt lengths are known, so every
    collator can leave the prompt out of the loss.
    """

    def __init__(self, values: np.ndarray, offsets: np.ndarray, prompt_lengths: np.ndarray | None = None):
        self.values = np.ascontiguousarray(values, dtype=np.int32)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.lengths = np.diff(self.offsets)
        self.prompt_lengths = None
        if prompt_lengths is not None:
            self.prompt_lengths = np.ascontiguousarray(prompt_lengths, dtype=np.int64)
            if self.prompt_lengths.shape != self.lengths.shape or np.any(self.prompt_lengths >= self.lengths):
                raise ValueError("prompt_lengths needs one value per sample, each shorter than its sample")

    @classmethod
    def from_arrow(cls, dataset, column: str = "input_ids") -> TokenSequences:
        """From a ``datasets.Dataset`` (or a pyarrow Table) with a list<int> column, without Python loops.

        A ``prompt_length`` column (prompt/response data) becomes ``prompt_lengths``.
        """
        table = dataset.data.table if hasattr(dataset, "data") else dataset
        if hasattr(dataset, "_indices") and dataset._indices is not None:  # a selected/shuffled view
            table = table.take(dataset._indices.column(0))
        ids = table.column(column).combine_chunks() if table.num_rows else pa.array([], pa.list_(pa.int32()))
        offsets = ids.offsets.to_numpy().astype(np.int64)
        values = (
            ids.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
            if len(offsets)
            else ids.values
        )
        prompts = None
        if "prompt_length" in table.column_names:
            prompts = table.column("prompt_length").to_numpy().astype(np.int64)
        return cls(np.asarray(values), offsets - (offsets[0] if len(offsets) else 0), prompts)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def __getitems__(self, indices) -> list:
        if self.prompt_lengths is None:
            return [self[int(index)] for index in indices]
        return [
            {"input_ids": self[int(i)], "prompt_length": int(self.prompt_lengths[int(i)])} for i in indices
        ]

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def num_target_tokens(self) -> int:
        """Tokens the loss covers when each sample is alone (all but the first; all but the prompt)."""
        if self.prompt_lengths is None:
            return int(np.maximum(self.lengths - 1, 0).sum())
        return int((self.lengths - np.maximum(self.prompt_lengths, 1)).sum())
