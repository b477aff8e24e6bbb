"""The content identity of weight folders: what a LoRA adapter records of the base it trains on, what the
resume digest records of a full fine-tune's base, and what predict, tune and sweep key a model folder by.

``base_weights_digest``: ``{tensor name: digest}`` of a model folder's weights, each tensor's dtype, shape and
sampled bytes (a few MB read for a multi-GB model). ``folder_identity``: one digest of a folder's files by
their names and content (its safetensors files' tensors as ``base_weights_digest`` samples them). Neither
counts paths or file metadata: a folder moved, copied or re-saved keeps its identity, other weights written
over its files (their size and time put back) do not. ``safetensors_index`` reads a safetensors header.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def base_weights_digest(folder: str | Path) -> dict[str, str]:
    """``{tensor name: digest}`` of the weights of a model folder (``{file name: digest}`` for a
    ``pytorch_model*.bin``, which has no tensor index to read).

    A tensor's digest (SHA-256, 16 hex digits) covers its dtype, shape and bytes: whole up to 64 KiB (norms,
    biases, small layers), else 4 blocks of 4 KiB spread from its first byte to its last. A ``.bin`` file's
    covers its size and 256 such blocks. A multi-GB base costs a few MB of reads (7B: ~300 tensors, ~5 MB,
    milliseconds from a warm cache); a retrained, fine-tuned or other model changes every sampled block, and
    a change confined to the unsampled middle of a large tensor alone would go unseen. Neither paths, shard
    layout nor file metadata count: the same weights moved, re-sharded or re-saved match.
    """
    from fastlm.engine.model import pretrained

    digests: dict[str, str] = {}
    for pattern in pretrained.WEIGHT_PATTERNS:
        for path in sorted(Path(folder).glob(pattern)):
            if not path.is_file() or path.name.endswith(".index.json"):
                continue
            with path.open("rb") as handle:
                tensors = safetensors_index(handle) if path.suffix == ".safetensors" else None
                if tensors is None:  # a .bin file, or a header that does not parse: the file as a whole
                    size = path.stat().st_size
                    digests[path.name] = _sampled_digest(handle, f"{size}", 0, size, _FILE_BLOCKS)
                    continue
                for name, (dtype, shape, start, end) in tensors.items():
                    digests[name] = _sampled_digest(handle, f"{dtype}{shape}", start, end, _TENSOR_BLOCKS)
    return dict(sorted(digests.items()))


def folder_identity(folder: str | Path, suffixes: tuple[str, ...] | None = None) -> str:
    """A digest (24 hex digits) of the files in ``folder`` and below it (those whose name ends in one of
    ``suffixes`` when given) by their names and content: a safetensors file's tensors as
    :func:`base_weights_digest` samples them (dtype, shape and bytes, whole up to 64 KiB, else 4 spread
    blocks), any other file's bytes whole up to 16 MiB, else its size and 256 spread blocks of 4 KiB.

    File metadata does not count: a folder copied or restored (new inodes and times) keeps its identity, and
    other weights written over a file, its size and time put back (``cp -p``, ``rsync -t``), change it. A
    multi-GB model costs a few MB of reads (as ``base_weights_digest``); a change confined to the unsampled
    middle of a large tensor alone would go unseen."""
    root = Path(folder)
    digest = hashlib.sha256()
    files = sorted(
        path
        for path in root.rglob("*")
        if path.is_file() and (suffixes is None or path.name.endswith(tuple(suffixes)))
    )
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}\n".encode())
        for name, value in _file_digests(path).items():
            digest.update(f"{name}:{value}\n".encode())
    return digest.hexdigest()[:24]


_WHOLE_FILE = 16 * 2**20  # bytes: a file other than safetensors read whole up to this size


def _file_digests(path: Path) -> dict[str, str]:
    """``{tensor: digest}`` of a safetensors file; ``{"": digest}`` of another file (or one whose header does
    not parse)."""
    with path.open("rb") as handle:
        tensors = safetensors_index(handle) if path.suffix == ".safetensors" else None
        if tensors is not None:
            return {
                name: _sampled_digest(handle, f"{dtype}{shape}", start, end, _TENSOR_BLOCKS)
                for name, (dtype, shape, start, end) in sorted(tensors.items())
            }
        size = os.fstat(handle.fileno()).st_size
        handle.seek(0)
        if size <= _WHOLE_FILE:
            return {"": hashlib.sha256(handle.read()).hexdigest()[:16]}
        return {"": _sampled_digest(handle, f"{size}", 0, size, _FILE_BLOCKS)}


_WHOLE = 64 * 1024  # bytes: read whole up to this size
_BLOCK = 4096
_TENSOR_BLOCKS, _FILE_BLOCKS = 4, 256


def safetensors_index(handle) -> dict[str, tuple[str, list, int, int]] | None:
    """``{tensor: (dtype, shape, first byte, end byte)}`` from a safetensors header; None when it does not
    parse (loading the file then names the damage)."""
    head = handle.read(8)
    if len(head) < 8:
        return None
    length = int.from_bytes(head, "little")
    try:
        header = json.loads(handle.read(length))
        begin = 8 + length
        return {
            name: (
                entry["dtype"],
                list(entry["shape"]),
                begin + int(entry["data_offsets"][0]),
                begin + int(entry["data_offsets"][1]),
            )
            for name, entry in header.items()
            if name != "__metadata__"
        }
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, MemoryError, OverflowError):
        return None


def _sampled_digest(handle, described: str, start: int, end: int, blocks: int) -> str:
    """SHA-256 (16 hex digits) of ``described`` and the bytes ``start:end`` of ``handle``: whole up to
    ``_WHOLE`` bytes, else ``blocks`` blocks of ``_BLOCK`` bytes spread from the first byte to the last."""
    digest = hashlib.sha256(f"{described}|{end - start}|".encode())
    if end - start <= _WHOLE:
        reads = [(start, max(end - start, 0))]
    else:
        step = (end - start - _BLOCK) / (blocks - 1)
        reads = [(start + round(index * step), _BLOCK) for index in range(blocks)]
    for offset, length in reads:
        handle.seek(offset)
        digest.update(handle.read(length))
    return digest.hexdigest()[:16]
