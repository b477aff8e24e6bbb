"""Tokenized samples as one flat int32 array plus offsets: O(1), zero-copy access for DataLoader workers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


class TokenSequences:
    """Sample ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (a numpy view; nothing is tokenized here).

    ``prompt_lengths`` (optional, one per sample) is the number of leading prompt tokens of prompt/response
    data. ``answer_spans`` (optional, with prompt lengths): a chat's earlier assistant answers inside its
    prompt, trained too, as ``(values, offsets)``: sample ``i``'s ``[start, end)`` token ranges are the pairs
    of ``values[offsets[i]:offsets[i + 1]]``, each inside ``1 .. prompt_length``. ``dataset[i]`` is always the
    ids; the DataLoader's batched fetch (``__getitems__``, what collators receive) gives
    ``{"input_ids": ids, "prompt_length": n}`` (plus ``"answer_spans"``: a ``[k, 2]`` array, when the sample
    has some) when prompt lengths are known, so every collator can leave the prompt out of the loss.
    ``text_ends`` (``collators.TextEnds``, None: unknown, none added): the special tokens the tokenizer that
    made the ids puts around a text, which an encoder-decoder model's rows get back (``seq2seq_sides``).
    """

    def __init__(
        self,
        values: np.ndarray,
        offsets: np.ndarray,
        prompt_lengths: np.ndarray | None = None,
        *,
        answer_spans: tuple[np.ndarray, np.ndarray] | None = None,
        text_ends=None,
    ):
        self.text_ends = text_ends
        self.values = np.ascontiguousarray(values, dtype=np.int32)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.lengths = np.diff(self.offsets)
        self.prompt_lengths = None
        if prompt_lengths is not None:
            self.prompt_lengths = np.ascontiguousarray(prompt_lengths, dtype=np.int64)
            if self.prompt_lengths.shape != self.lengths.shape or np.any(self.prompt_lengths >= self.lengths):
                raise ValueError("prompt_lengths needs one value per sample, each shorter than its sample")
        self.answer_spans = None
        if answer_spans is not None:
            if self.prompt_lengths is None:
                raise ValueError(
                    "answer_spans need prompt_lengths: the answers sit inside the samples' prompts"
                )
            self.answer_spans = _checked_spans(*answer_spans, self.prompt_lengths)

    @classmethod
    def from_arrow(cls, dataset, column: str = "input_ids", *, text_ends=None) -> TokenSequences:
        """From a ``datasets.Dataset`` (or a pyarrow Table) with a list<int> column, without Python loops.

        A ``prompt_length`` column (prompt/response data) becomes ``prompt_lengths``; ``text_ends``: the
        tokenizer's (``collators.TextEnds.of``).
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
        prompts = spans = None
        if "prompt_length" in table.column_names:
            prompts = table.column("prompt_length").to_numpy().astype(np.int64)
        if "answer_spans" in table.column_names and table.num_rows:
            column = table.column("answer_spans").combine_chunks()
            span_offsets = column.offsets.to_numpy().astype(np.int64)
            span_values = column.values.to_numpy(zero_copy_only=False)[span_offsets[0] : span_offsets[-1]]
            spans = (np.asarray(span_values), span_offsets - span_offsets[0])
        return cls(
            np.asarray(values),
            offsets - (offsets[0] if len(offsets) else 0),
            prompts,
            answer_spans=spans,
            text_ends=text_ends,
        )

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def answer_spans_of(self, index: int) -> np.ndarray:
        """Sample ``index``'s earlier answers inside its prompt: ``[k, 2]`` int64 ``[start, end)`` rows."""
        if self.answer_spans is None:
            return np.zeros((0, 2), dtype=np.int64)
        values, offsets = self.answer_spans
        return values[offsets[index] : offsets[index + 1]].reshape(-1, 2).astype(np.int64)

    def __getitems__(self, indices) -> list:
        if self.prompt_lengths is None:
            return [self[int(index)] for index in indices]
        features = []
        for i in map(int, indices):
            feature = {"input_ids": self[i], "prompt_length": int(self.prompt_lengths[i])}
            if self.answer_spans is not None and self.answer_spans[1][i + 1] > self.answer_spans[1][i]:
                feature["answer_spans"] = self.answer_spans_of(i)
            features.append(feature)
        return features

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def num_target_tokens(self) -> int:
        """Tokens the loss covers when each sample is alone (all but the first; all but the prompt)."""
        if self.prompt_lengths is None:
            return int(np.maximum(self.lengths - 1, 0).sum())
        answers = 0
        if self.answer_spans is not None:
            answers = int((self.answer_spans[0][1::2].astype(np.int64) - self.answer_spans[0][::2]).sum())
        return int((self.lengths - np.maximum(self.prompt_lengths, 1)).sum()) + answers


_SPANS_OUTSIDE = (
    "each answer span needs 1 <= start < end <= its sample's prompt_length (inside its prompt), in order"
)


def _checked_spans(values, offsets, prompt_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``answer_spans`` as contiguous arrays, refused unless each sample's pairs are ordered, disjoint ranges
    inside its prompt (after its first token, which nothing predicts)."""
    wide = np.asarray(values)
    if wide.size and (wide.min() < 1 or wide.max() > np.iinfo(np.int32).max):  # int32 would wrap them
        raise ValueError(_SPANS_OUTSIDE)
    values = np.ascontiguousarray(wide, dtype=np.int32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if (
        offsets.shape != (len(prompt_lengths) + 1,)
        or np.any(np.diff(offsets) % 2)
        or offsets[-1] != len(values)
    ):
        raise ValueError("answer_spans needs an even number of values per sample (start, end pairs)")
    sample = np.repeat(np.arange(len(prompt_lengths)), np.diff(offsets) // 2)
    starts, ends = values[::2].astype(np.int64), values[1::2].astype(np.int64)
    after_previous = np.ones(len(starts), dtype=bool)
    same_sample = sample[1:] == sample[:-1]
    after_previous[1:] = ~same_sample | (starts[1:] >= ends[:-1])
    if (
        np.any(starts < 1)
        or np.any(ends <= starts)
        or np.any(ends > prompt_lengths[sample])
        or not after_previous.all()
    ):
        raise ValueError(_SPANS_OUTSIDE)
    return values, offsets
