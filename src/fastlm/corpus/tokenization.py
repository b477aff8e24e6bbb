"""Tokenize texts fast: batched Rust tokenizer calls, a fork pool on large inputs, numpy post-processing.

Nothing is padded: each sample is its ids (special tokens as the tokenizer adds them), truncated so
that, with one EOS appended, it has at most ``max_length`` tokens. A tokenizer's own padding and truncation
(a tokenizer.json may pad every text to a fixed length and cut it at 128 tokens) are never applied: the
backend is always run with both off, whatever the tokenizer folder says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

POOL_MIN_ROWS = 100_000  # below this a pool's start-up costs more than it saves
# A token of any tokenizer fastlm meets spans far fewer characters than this: a text longer than
# max_length * MAX_CHARS_PER_TOKEN characters is cut before tokenizing (what is cut could never survive the
# token truncation), so one 50 MB line costs memory for max_length tokens, not for millions.
MAX_CHARS_PER_TOKEN = 64
# Characters per tokenizer call (``split.batch_size`` counts texts): a call holds every text's encoding until
# it returns, ~30-36 bytes of peak memory per input character (measured: 200 texts of 100 KB, 19 MiB, peaked
# 583-686 MiB above the start in one call at max_length 32,768), so 20,000 such texts in one batch would peak
# near 60-67 GB. 8 M characters keep one call near 250-300 MiB (that case: +251 MiB in three calls; ~1 GB for
# a script of one token per character), each fork worker holding one call; short texts (20,000 of ~100
# characters: 2 M) never reach it.
MAX_CHARS_PER_CALL = 8_000_000


@dataclass(frozen=True)
class TokenizedTexts:
    """Ragged token ids: row i is ``values[offsets[i]:offsets[i + 1]]`` (EOS last)."""

    values: np.ndarray  # int32
    offsets: np.ndarray  # int64, len(rows) + 1
    truncated: np.ndarray  # bool, one per row
    prompt_lengths: np.ndarray | None = (
        None  # int32 leading prompt tokens per row (prompt/response data only)
    )
    # a chat's earlier answers inside its prompt, trained too: row i's [start, end) token pairs are
    # answer_spans[0][answer_spans[1][i]:answer_spans[1][i + 1]] (int32 values, int64 offsets)
    answer_spans: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def target_lengths(self) -> np.ndarray:
        """Tokens trained per row of prompt/response data: the response, its EOS and any earlier answers."""
        targets = self.lengths - self.prompt_lengths
        if self.answer_spans is not None:
            values, offsets = self.answer_spans
            widths = values[1::2].astype(np.int64) - values[::2]
            pairs = np.repeat(np.arange(len(targets)), np.diff(offsets) // 2)
            targets = targets + np.bincount(pairs, weights=widths, minlength=len(targets)).astype(np.int64)
        return targets

    def to_arrow(
        self, rows: np.ndarray | None = None, extra: dict[str, np.ndarray] | None = None
    ) -> pa.Table:
        """An Arrow table with ``input_ids`` (list<int32>), ``length`` (int32) and, for prompt/response data,
        ``prompt_length`` (int32) and, where a chat's earlier answers are trained, ``answer_spans``
        (list<int32>: ``[start, end)`` token pairs inside the prompt), plus the ``extra`` per-row columns
        (e.g. the fold bucket), optionally of ``rows``."""
        offsets = self.offsets.astype(np.int32) if self.offsets[-1] < 2**31 else self.offsets
        list_type = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
        ids = list_type.from_arrays(pa.array(offsets), pa.array(self.values, type=pa.int32()))
        columns = {"input_ids": ids, "length": pa.array(self.lengths.astype(np.int32))}
        if self.prompt_lengths is not None:
            columns["prompt_length"] = pa.array(self.prompt_lengths.astype(np.int32))
        if self.answer_spans is not None:
            values, span_offsets = self.answer_spans
            columns["answer_spans"] = pa.ListArray.from_arrays(
                pa.array(span_offsets.astype(np.int32)), pa.array(values, type=pa.int32())
            )
        columns.update({name: pa.array(values) for name, values in (extra or {}).items()})
        table = pa.table(columns)
        return table if rows is None else table.take(pa.array(rows))


def resolve_num_proc(num_proc: int | str, rows: int) -> int:
    if num_proc != "auto":
        return int(num_proc)
    if rows < POOL_MIN_ROWS or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(
        1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8)
    )


def tokenize_texts(
    texts: Sequence[str],
    tokenizer,
    *,
    max_length: int,
    batch_size: int = 20_000,
    num_proc: int | str = "auto",
) -> TokenizedTexts:
    """Token ids of ``texts`` with EOS appended and truncation at ``max_length`` (EOS included). A special
    token's text inside a text (``<|endoftext|>`` written out: scraped model output, a page about tokenizers)
    is encoded as the characters it is, not as the token (the backend's ``encode_special_tokens``, the
    tokenizer call's ``split_special_tokens``): a sample's one EOS is the one appended."""
    eos = int(tokenizer.eos_token_id)
    texts, cut = cut_long_texts(texts, max_length)
    tokens = _concat(
        _encode_all(
            texts,
            tokenizer,
            eos=eos,
            max_length=max_length,
            add_special_tokens=True,
            batch_size=batch_size,
            num_proc=num_proc,
            special_tokens_as_text=True,
        )
    )
    return dataclasses.replace(tokens, truncated=tokens.truncated | cut) if cut.any() else tokens


def encode_id_lists(rows: Sequence[Sequence[int]], *, eos: int, max_length: int) -> TokenizedTexts:
    """Pre-tokenized rows as samples: the same EOS and truncation rules as :func:`tokenize_texts` (a trailing
    EOS already there is not doubled; the body is cut at ``max_length - 1`` ids, then EOS)."""
    return _concat(
        [_finish(_ids_to_arrays([list(row) for row in rows]), eos, max_length)] if len(rows) else []
    )


def cut_long_texts(
    texts: Sequence[str], max_length: int, *, keep: str = "head"
) -> tuple[Sequence[str], np.ndarray]:
    """``texts`` with every text longer than ``max_length * MAX_CHARS_PER_TOKEN`` characters cut to that many
    (its first characters, or its last with ``keep="tail"``), and which ones were cut."""
    limit = max_length * MAX_CHARS_PER_TOKEN
    cut = np.fromiter((len(text) > limit for text in texts), dtype=bool, count=len(texts))
    if not cut.any():
        return texts, cut
    if keep == "head":
        return [text[:limit] if too_long else text for text, too_long in zip(texts, cut, strict=True)], cut
    return [text[-limit:] if too_long else text for text, too_long in zip(texts, cut, strict=True)], cut


def call_chunks(texts: Sequence[str], max_texts: int) -> list[Sequence[str]]:
    """``texts`` in consecutive pieces, one per tokenizer call: at most ``max_texts`` texts and, where they
    hold more, ``MAX_CHARS_PER_CALL`` characters (a longer text is a piece alone). Each text is tokenized
    alone, so the pieces change the memory of a call, never an id."""
    ends = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=ends[1:])
    chunks, start = [], 0
    while start < len(texts):
        stop = min(start + max_texts, len(texts))
        if ends[stop] - ends[start] > MAX_CHARS_PER_CALL:
            fits = int(np.searchsorted(ends, ends[start] + MAX_CHARS_PER_CALL, side="right")) - 1
            stop = max(fits, start + 1)
        chunks.append(texts[start:stop])
        start = stop
    return chunks


def encode_ragged(
    texts: Sequence[str],
    tokenizer,
    *,
    add_special_tokens: bool,
    batch_size: int = 20_000,
    num_proc: int | str = "auto",
    special_tokens_as_text: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Raw token ids of ``texts`` as flat int32 ``values`` and int64 ``lengths``: no EOS, no truncation;
    ``special_tokens_as_text``: a special token's text inside a text encoded as its characters."""
    parts = _encode_all(
        texts,
        tokenizer,
        eos=-1,
        max_length=None,
        add_special_tokens=add_special_tokens,
        batch_size=batch_size,
        num_proc=num_proc,
        special_tokens_as_text=special_tokens_as_text,
    )
    if not parts:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    return np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts])


def _encode_all(
    texts,
    tokenizer,
    *,
    eos: int,
    max_length: int | None,
    add_special_tokens: bool,
    batch_size: int,
    num_proc: int | str,
    special_tokens_as_text: bool = False,
) -> list:
    chunks = call_chunks(texts, batch_size)
    procs = resolve_num_proc(num_proc, len(texts))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: batched calls in this process
        return [
            _finish(
                _ids_to_arrays(
                    tokenizer(
                        list(chunk),
                        add_special_tokens=add_special_tokens,
                        padding=False,
                        truncation=False,
                        split_special_tokens=special_tokens_as_text,
                    )["input_ids"]
                ),
                eos,
                max_length,
            )
            for chunk in chunks
        ]
    if procs > 1 and len(chunks) > 1:
        return _in_pool(
            chunks, backend.to_str(), eos, max_length, procs, add_special_tokens, special_tokens_as_text
        )
    _init_worker(backend.to_str(), special_tokens_as_text)
    return [_encode_chunk(chunk, eos, max_length, add_special_tokens) for chunk in chunks]


def _in_pool(
    chunks,
    backend_json: str,
    eos: int,
    max_length: int | None,
    procs: int,
    add_special_tokens: bool = True,
    special_tokens_as_text: bool = False,
) -> list:
    # Workers tokenize single-threaded: the pool is the parallelism.
    with _single_threaded_tokenizers():
        context = multiprocessing.get_context("fork")
        initargs = (backend_json, special_tokens_as_text)
        with context.Pool(procs, initializer=_init_worker, initargs=initargs) as pool:
            return pool.starmap(
                _encode_chunk, [(chunk, eos, max_length, add_special_tokens) for chunk in chunks], chunksize=1
            )


@contextlib.contextmanager
def _single_threaded_tokenizers():
    """``TOKENIZERS_PARALLELISM=false`` while a fork pool runs: set before the fork, it also keeps the
    tokenizers library from warning about a fork after its thread pool started."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


_shared = None  # what fork_map's workers read: inherited by the fork, never pickled


def fork_map(function, chunks: Sequence, procs: int, shared=None) -> list:
    """``function(shared, chunk)`` for every chunk, in order: in a fork pool of ``procs`` workers when more
    than one worker and one chunk (and the platform forks), else here. ``shared`` (e.g. a tokenizer) reaches
    the workers through the fork, not by pickling; ``function`` must be a module-level function."""
    global _shared
    if procs <= 1 or len(chunks) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [function(shared, chunk) for chunk in chunks]
    _shared = shared
    try:
        with _single_threaded_tokenizers():
            with multiprocessing.get_context("fork").Pool(procs) as pool:
                return pool.starmap(_call_shared, [(function, chunk) for chunk in chunks], chunksize=1)
    finally:
        _shared = None


def _call_shared(function, chunk):
    return function(_shared, chunk)


_worker_backend = None


def _init_worker(backend_json: str, special_tokens_as_text: bool = False) -> None:
    global _worker_backend
    from tokenizers import Tokenizer

    _worker_backend = Tokenizer.from_str(backend_json)
    _worker_backend.no_padding()  # the tokenizer.json's own settings: fastlm pads nothing and cuts itself
    _worker_backend.no_truncation()
    _worker_backend.encode_special_tokens = special_tokens_as_text


def _encode_chunk(chunk: Sequence[str], eos: int, max_length: int | None, add_special_tokens: bool = True):
    encode = getattr(_worker_backend, "encode_batch_fast", _worker_backend.encode_batch)
    encodings = encode(list(chunk), add_special_tokens=add_special_tokens)
    return _finish(_ids_to_arrays([encoding.ids for encoding in encodings]), eos, max_length)


def _ids_to_arrays(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    values = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
    return values, lengths


def _finish(arrays: tuple[np.ndarray, np.ndarray], eos: int, max_length: int | None):
    """Drop a trailing EOS the tokenizer added, truncate the body to max_length - 1, append one EOS.

    ``max_length=None`` returns the raw ids untouched (``encode_ragged``).
    """
    values, lengths = arrays
    if max_length is None:
        return values, lengths
    ends = np.cumsum(lengths)
    ends_with_eos = (lengths > 0) & (values[np.maximum(ends - 1, 0)] == eos) if len(values) else lengths > 0
    body = lengths - ends_with_eos
    keep = np.minimum(body, max_length - 1)
    position = np.arange(len(values)) - np.repeat(ends - lengths, lengths)
    kept_values = values[position < np.repeat(keep, lengths)]
    out_lengths = keep + 1
    out = np.empty(int(out_lengths.sum()), dtype=np.int32)
    is_eos = np.zeros(len(out), dtype=bool)
    is_eos[np.cumsum(out_lengths) - 1] = True
    out[is_eos] = eos
    out[~is_eos] = kept_values
    return out, out_lengths, body > max_length - 1


def _concat(parts) -> TokenizedTexts:
    if not parts:
        return TokenizedTexts(np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0, bool))
    values = np.concatenate([part[0] for part in parts])
    lengths = np.concatenate([part[1] for part in parts])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return TokenizedTexts(values, offsets, np.concatenate([part[2] for part in parts]))
