"""Which data a ``datasets`` split holds, cheaply: what a launched worker compares with its launcher's.

A memory-mapped split pickles as its Arrow files' paths and a worker opens them again as it unpickles its
job: a folder written again in between (the split pipeline's atomic swap) hands the worker other rows than
those the launcher checked. :func:`split_identity` says what a process holds: its rows, its files as they are
on disk (name, size, device, inode, modification time: a file swapped in is another inode, since the
launcher's map keeps the old one alive) and a digest of its columns' buffers, their sizes whole and their
bytes sampled (whole up to 256 KiB a column, else 8 blocks of 32 KiB spread over it: at most 256 KiB read a
column whatever the data's size; 2 ms for a 1 GB split of 4 files). The files tell any swap after the
launcher looked; the sample tells a swap before it unless the new data differs from the old only in bytes
no block reads (the same row count and buffer sizes).

:func:`content_of` is the part that holds wherever the data is copied (rows and the sampled digest, not the
files' inodes, devices or times): what the ranks of a run started on their own (torchrun) compare with each
other, each of which loaded its own copy (``launch.job``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

WHOLE = 256 * 1024  # a column's buffers up to this size are read whole
BLOCK = 32 * 1024  # else this many bytes at each of BLOCKS places spread over them
BLOCKS = 8


def split_identity(dataset) -> dict[str, Any]:
    """``{"rows", "files", "sha256"}`` of ``dataset`` (a ``datasets.Dataset`` or a pyarrow Table): its row
    count, its Arrow files (``[name, size, device, inode, mtime_ns]``, none for data in memory) and the
    sampled digest of its table (and of its row selection, a selected view's indices)."""
    table = dataset.data.table if hasattr(dataset, "data") else dataset
    digest = hashlib.sha256()
    _table_digest(table, digest)
    indices = getattr(dataset, "_indices", None)  # a selected/shuffled view: the rows it picks
    if indices is not None:
        digest.update(b"\0indices\0")
        _table_digest(indices.table if hasattr(indices, "table") else indices, digest)
    files = []
    for entry in getattr(dataset, "cache_files", None) or ():
        stat = os.stat(entry["filename"])
        files.append([Path(entry["filename"]).name, stat.st_size, stat.st_dev, stat.st_ino, stat.st_mtime_ns])
    return {"rows": len(dataset), "files": files, "sha256": digest.hexdigest()}


def content_of(identity: dict[str, Any]) -> dict[str, Any]:
    """The rows and sampled digest of a :func:`split_identity` record: equal for two copies of the same data
    on two machines, whose files are other inodes on other devices."""
    return {"rows": identity["rows"], "sha256": identity["sha256"]}


def identity_change(expected: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What differs between two :func:`split_identity` records, in words; None when they are equal."""
    if now == expected:
        return None
    if now["rows"] != expected["rows"]:
        return f"it holds {now['rows']} rows, {expected['rows']} were checked"
    if now["files"] != expected["files"]:
        return "its files are not those that were checked"
    return "its tokens are not those that were checked"


def _table_digest(table, digest) -> None:
    for name in table.column_names:
        buffers = [
            buffer
            for chunk in table.column(name).chunks
            for buffer in chunk.buffers()  # a nested column's children's too
            if buffer is not None
        ]
        sizes = [buffer.size for buffer in buffers]
        digest.update(f"{name}\0{table.schema.field(name).type}\0{sizes}\0".encode())
        total = sum(sizes)
        if total <= WHOLE:
            for buffer in buffers:
                digest.update(memoryview(buffer))
            continue
        for place in range(BLOCKS):  # evenly spread over the column's bytes, the last block at its end
            start = place * (total - BLOCK) // (BLOCKS - 1)
            for buffer in buffers:
                if start < buffer.size:
                    digest.update(memoryview(buffer)[start : start + BLOCK])
                    break
                start -= buffer.size
