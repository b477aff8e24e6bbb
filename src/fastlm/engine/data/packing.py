"""Greedy token-budget packing, and the tensors that keep packed samples apart.

Budget and layout
-----------------
A packed micro-batch is ``rows_per_batch`` rows of at most ``row_length`` tokens each
(``TokenBudget``; its ``tokens_per_batch`` is their product). Each row holds whole samples, concatenated;
a sample never spans two rows. ``TokenBudget.flat(n)`` is one row of ``n`` tokens (shape ``[1, n]``).
Several shorter rows are usually the better choice on SDPA/eager: attention costs ``rows * T**2``,
and the rows have a fixed capacity (static shapes for ``torch.compile``/CUDA graphs).

Packing (``pack_by_token_budget``)
----------------------------------
The samples are shuffled (a ``numpy.random.Generator`` the caller seeds per epoch, see
``samplers.PackedBatchSampler``), cut into windows of ``window`` samples, and each window is packed into
rows by best-fit decreasing (longest sample first, into the fullest row that still has room; a sorted list of
free capacities, so O(n log n) plus cheap list moves). Rows are then shuffled and grouped, in order, into
batches of ``rows_per_batch`` rows. A batch is the flat list of its sample indices, row after row;
``assign_rows`` (next-fit) recovers rows from that order, never using more rows than the packer did.
``Packing.efficiency`` = real tokens / (batches * tokens_per_batch).

Row length from the data (``choose_row_length``)
------------------------------------------------
Attention work per token grows with the row length, so rows only as long as the data needs are cheaper
(short reviews of ~10 tokens: rows of 64 instead of 320 measured faster on the 5.2 M shape,
docs/benchmarks.md). ``choose_row_length`` takes the shortest multiple of 64 that holds the longest sample and
whose rows, packed by ``pack_rows``, are filled within one point of rows of ``max_length``; the training loop
then keeps the token budget (more, shorter rows).

Keeping samples apart (``packed_layout``, ``block_causal_mask``)
----------------------------------------------------------------
* ``position_ids`` restart at 0 at each sample (and at the padding tail of a row), so RoPE sees each
  sample exactly as if it were alone.
* ``attention_mask``: a 4D boolean block-diagonal causal mask ``[rows, 1, T, T]``, True = attend: token ``q``
  attends to ``k <= q`` of the same sample only. Transformers returns a 4D mask to the attention as given,
  so SDPA computes exact per-sample logits (checked in tests/engine/data/test_collators.py). Restarting
  ``position_ids`` alone are NOT enough with transformers 5.x on SDPA/eager: packing is inferred from them
  only when no attention mask and no cache are given (a model's default ``use_cache=True`` creates a cache
  even in training), and any 2D mask turns that off; attention then leaks across samples.
* eager attention ADDS the mask to the scores, so a bool mask there is silently wrong (True adds 1):
  give eager ``to_additive_mask(mask)`` (0 / dtype-min), i.e.
  ``PackedCollator(attention_mask_format="additive")``.
* padding at the end of a row is its own causal segment (it never sees, and is never seen by, a sample;
  no row of the mask is empty, so no NaN) and its labels are -100.

Flash-attention varlen (CUDA, later)
------------------------------------
The T×T mask is then neither needed nor affordable: use ``attention_mask_format="none"``, view the batch
row-major as one row ``[1, rows * T]`` (``input_ids``, ``position_ids``, ``labels`` — labels are -100 on every
sample start, so the view adds no cross-row target) and either pass only ``position_ids`` (transformers
derives the sequence boundaries from the restarts at 0 when no attention mask is given) or pass
``cu_seq_lens_q = cu_seq_lens_k = batch["cu_seq_lens"]`` and ``max_length_q = max_length_k =
int(batch["max_seqlen"])`` (transformers' ``FlashAttentionKwargs``; flash_attn_varlen_func's ``cu_seqlens``
and ``max_seqlen``). ``cu_seq_lens`` (int32) are the cumulative segment boundaries of that flattened view,
padding tails counted as segments.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "PackedLayout",
    "Packing",
    "TokenBudget",
    "assign_rows",
    "block_causal_mask",
    "choose_row_length",
    "pack_by_token_budget",
    "pack_rows",
    "packed_batch_count",
    "packed_layout",
    "to_additive_mask",
]


@dataclass(frozen=True)
class TokenBudget:
    """``rows_per_batch`` rows of at most ``row_length`` tokens: a micro-batch of ``tokens_per_batch``
    tokens."""

    row_length: int
    rows_per_batch: int = 1

    def __post_init__(self) -> None:
        if self.row_length < 1 or self.rows_per_batch < 1:
            raise ValueError(f"row_length and rows_per_batch must be >= 1, got {self}")

    @classmethod
    def flat(cls, tokens_per_batch: int) -> TokenBudget:
        """One row of ``tokens_per_batch`` tokens (a ``[1, total_tokens]`` micro-batch)."""
        return cls(row_length=tokens_per_batch, rows_per_batch=1)

    @property
    def tokens_per_batch(self) -> int:
        return self.row_length * self.rows_per_batch


@dataclass(frozen=True)
class Packing:
    """The batches of one epoch: each an int64 array of sample indices, row after row."""

    batches: list[np.ndarray]
    budget: TokenBudget
    num_real_tokens: int
    num_rows: int

    @property
    def num_batches(self) -> int:
        return len(self.batches)

    @property
    def efficiency(self) -> float:
        """Real tokens / (batches * tokens_per_batch): the share of the budget filled by samples."""
        return self.num_real_tokens / max(self.num_batches * self.budget.tokens_per_batch, 1)


def _as_lengths(lengths) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise ValueError("lengths must be >= 0")
    return lengths


def pack_rows(lengths: np.ndarray, indices: np.ndarray, row_length: int) -> list[list[int]]:
    """Best-fit decreasing of the samples ``indices`` into rows of ``row_length`` tokens (lists of
    indices)."""
    order = indices[np.argsort(-lengths[indices], kind="stable")]
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free tokens, row number), sorted; full rows leave the list
    for index, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        slot = bisect.bisect_left(free, (length, -1))  # the row with the least room that still fits
        if slot == len(free):
            rows.append([index])
            row, room = len(rows) - 1, row_length - length
        else:
            room, row = free.pop(slot)
            rows[row].append(index)
            room -= length
        if room > 0:
            bisect.insort(free, (room, row))
    return rows


def pack_by_token_budget(
    lengths,
    budget: TokenBudget,
    *,
    rng: np.random.Generator | None = None,
    window: int = 4096,
    split: int = 1,
) -> Packing:
    """Pack all samples into batches that never exceed ``budget`` (see the module docstring).

    ``rng`` shuffles the sample order and the row order (None: keep the given order, rows as packed);
    ``window`` samples are packed together, so larger windows pack tighter and mix less. ``split`` > 1: each
    batch's rows cut into ``split`` consecutive pieces (``np.array_split`` of its rows; a batch of fewer rows,
    only an epoch's last, ends in empty pieces), each a batch of its own: an out-of-memory back-off's
    smaller micro-batches hold the samples of the configured ones (pieces ``split * j`` on are batch ``j``).
    """
    if split < 1:
        raise ValueError(f"split must be >= 1, got {split}")
    lengths, order = _shuffled_for_packing(lengths, budget, rng, window)
    rows: list[list[int]] = []
    for start in range(0, lengths.size, window):
        rows.extend(pack_rows(lengths, order[start : start + window], budget.row_length))
    if rng is not None:
        rows = [rows[k] for k in rng.permutation(len(rows)).tolist()]
    step = budget.rows_per_batch
    groups = [rows[start : start + step] for start in range(0, len(rows), step)]
    if split > 1:  # every batch in ``split`` pieces, the last ones empty where it has fewer rows
        groups = [
            group[piece[0] : piece[-1] + 1] if piece.size else []
            for group in groups
            for piece in np.array_split(np.arange(len(group)), split)
        ]
    batches = [np.fromiter((i for row in group for i in row), dtype=np.int64) for group in groups]
    if split > 1:  # a piece's budget: the most rows a piece holds
        budget = TokenBudget(budget.row_length, -(-budget.rows_per_batch // split))
    return Packing(batches=batches, budget=budget, num_real_tokens=int(lengths.sum()), num_rows=len(rows))


def _shuffled_for_packing(lengths, budget: TokenBudget, rng, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The lengths checked against the budget and window, and the epoch's sample order (``rng``'s first draw;
    None: as given)."""
    lengths = _as_lengths(lengths)
    if lengths.size and lengths.max() > budget.row_length:
        raise ValueError(f"a sample of {lengths.max()} tokens does not fit a row of {budget.row_length}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return lengths, rng.permutation(lengths.size) if rng is not None else np.arange(lengths.size)


def packed_batch_count(
    lengths, budget: TokenBudget, *, rng: np.random.Generator | None = None, window: int = 4096
) -> int:
    """``pack_by_token_budget(lengths, budget, rng=rng, window=window).num_batches``, counted from the lengths
    alone: a step plan counts every epoch's batches before training (each epoch is packed after its own
    shuffle, so their counts differ slightly), and building every epoch's batches would cost as much as
    packing them. The same shuffle (``rng``'s first draw), the same windows and the same best-fit decreasing
    row count (``_best_fit_rows``); no batch is built and the rows are not shuffled (their order changes no
    count)."""
    lengths, order = _shuffled_for_packing(lengths, budget, rng, window)
    shuffled = lengths[order]
    rows = sum(
        _best_fit_rows(shuffled[start : start + window], budget.row_length)
        for start in range(0, lengths.size, window)
    )
    return -(-rows // budget.rows_per_batch)


def _best_fit_rows(lengths: np.ndarray, row_length: int) -> int:
    """The number of rows ``pack_rows`` fills with these samples, computed per run of equal lengths rather
    than per sample. Best-fit decreasing puts a sample into the row with the least room that still holds it;
    that room, less the sample, is then the least room that holds another sample of the same length (it is
    smaller than every other room that did), so a run of equal samples fills one room after another, each
    with as many as it holds, and opens new rows of ``row_length // length`` samples when none is left. The
    rooms are counted, never which row holds what."""
    values, counts = np.unique(lengths, return_counts=True)  # ascending: the runs, longest last
    free: list[int] = []  # the rows' rooms > 0, sorted
    rows = 0
    for length, count in zip(values[::-1].tolist(), counts[::-1].tolist(), strict=True):
        if length == 0:  # an empty sample goes to any row; one opens a row only where none has room
            if not free:
                rows += 1
                free.append(row_length)
            continue
        while count:
            slot = bisect.bisect_left(free, length)
            if slot == len(free):  # no room: new rows of ``per`` samples each, the last holding the rest
                per = row_length // length
                new = -(-count // per)
                rows += new
                full, last = row_length - per * length, row_length - (count - (new - 1) * per) * length
                if full and new > 1:
                    at = bisect.bisect_left(free, full)
                    free[at:at] = [full] * (new - 1)
                if last:
                    bisect.insort(free, last)
                break
            room = free.pop(slot)
            taken = min(room // length, count)
            count -= taken
            if room - taken * length:
                bisect.insort(free, room - taken * length)
    return rows


ROW_LENGTH_STEP = 64  # candidate row lengths: multiples of this (and max_length itself)
ROW_FILL_SLACK = 0.01  # a shorter row may fill its rows this much less than a row of max_length
ROW_LENGTH_SAMPLE = 20_000  # samples packed to compare the candidates (a fixed random subset of larger data)


def _row_fill(lengths: np.ndarray, row_length: int, window: int = 4096) -> float:
    rows = sum(
        len(pack_rows(lengths, np.arange(start, min(start + window, lengths.size)), row_length))
        for start in range(0, lengths.size, window)
    )
    return float(lengths.sum()) / max(rows * row_length, 1)


def choose_row_length(
    lengths,
    max_length: int,
    *,
    step: int = ROW_LENGTH_STEP,
    slack: float = ROW_FILL_SLACK,
    sample: int = ROW_LENGTH_SAMPLE,
) -> int:
    """The packed row length for ``lengths`` (see the module docstring): ``max_length`` unless a shorter
    multiple of ``step`` holds every sample and fills its rows within ``slack`` of rows of ``max_length``."""
    lengths = _as_lengths(lengths)
    if not lengths.size or int(lengths.max()) >= max_length:
        return max_length
    first = -(-max(int(lengths.max()), 1) // step) * step
    if first >= max_length:
        return max_length
    subset = lengths
    if lengths.size > sample:  # a fixed subset, in a random order (rows are packed by windows)
        subset = lengths[np.random.default_rng(0).choice(lengths.size, sample, replace=False)]
    target = _row_fill(subset, max_length) - slack
    for row_length in range(first, max_length, step):
        if _row_fill(subset, row_length) >= target:
            return row_length
    return max_length


def assign_rows(sample_lengths: Sequence[int], row_length: int) -> list[list[int]]:
    """Next-fit: the batch's samples, in order, fill row 0, then row 1, ...; returns positions per row.

    On a batch laid out by ``pack_by_token_budget`` (rows concatenated, each within ``row_length``) this never
    needs more rows than the packer used: the i-th next-fit row cannot start before the packer's i-th row.
    """
    rows: list[list[int]] = []
    room = 0
    for position, length in enumerate(sample_lengths):
        if length > row_length:
            raise ValueError(f"a sample of {length} tokens does not fit a row of {row_length}")
        if not rows or length > room:
            rows.append([])
            room = row_length
        rows[-1].append(position)
        room -= length
    return rows


@dataclass(frozen=True)
class PackedLayout:
    """Per-token layout of packed rows (all ``[rows, T]``) and the varlen view of their flattening."""

    position_ids: torch.Tensor  # int64, restart at 0 at each sample and at the padding tail
    sequence_ids: torch.Tensor  # int64, one id per segment (samples and padding tails), unique in the batch
    real_mask: torch.Tensor  # bool, True on sample tokens
    cu_seq_lens: torch.Tensor  # int32 [segments + 1], boundaries in the row-major [1, rows * T] view
    max_seqlen: int


def packed_layout(row_lengths: Sequence[Sequence[int]], seq_len: int) -> PackedLayout:
    """Layout of rows holding samples of ``row_lengths[r]`` tokens each, padded at the end to ``seq_len``."""
    segments: list[int] = []
    is_real: list[bool] = []
    for lengths in row_lengths:
        fill = sum(lengths)
        if fill > seq_len:
            raise ValueError(f"a row of {fill} tokens does not fit seq_len {seq_len}")
        segments.extend(lengths)
        is_real.extend([True] * len(lengths))
        if fill < seq_len:
            segments.append(seq_len - fill)
            is_real.append(False)
    seg = np.asarray(segments, dtype=np.int64)
    keep = seg > 0
    seg, real = seg[keep], np.asarray(is_real, dtype=bool)[keep]
    bounds = np.concatenate([[0], np.cumsum(seg)])
    total = len(row_lengths) * seq_len
    positions = np.arange(total, dtype=np.int64) - np.repeat(bounds[:-1], seg)
    shape = (len(row_lengths), seq_len)
    return PackedLayout(
        position_ids=torch.from_numpy(positions.reshape(shape)),
        sequence_ids=torch.from_numpy(np.repeat(np.arange(seg.size, dtype=np.int64), seg).reshape(shape)),
        real_mask=torch.from_numpy(np.repeat(real, seg).reshape(shape)),
        cu_seq_lens=torch.from_numpy(bounds.astype(np.int32)),
        max_seqlen=int(seg.max()) if seg.size else 0,
    )


def block_causal_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
    """``[rows, 1, T, T]`` bool, True where query ``q`` may attend key ``k``: same segment and ``k <= q``."""
    index = torch.arange(sequence_ids.shape[-1], device=sequence_ids.device)
    causal = index[None, :] <= index[:, None]
    ids = sequence_ids.to(torch.int32)  # narrower compares: the mask is rows * T * T elements
    return ((ids[:, :, None] == ids[:, None, :]) & causal).unsqueeze(1)


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The bool mask as eager attention wants it: 0 where attended, the dtype's minimum elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min
    )
