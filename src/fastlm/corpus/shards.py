"""Raw data held as shards: a folder of data files of one format (``train-00000-of-00008.parquet``,
``part-*.jsonl.gz``) or a glob (``data/01_raw/shards/*.jsonl``, ``**`` allowed), read as one table.

The shards are read one after the other in sorted path order, each by ``readers.read_table`` (whose errors
name the shard and its line), and joined: Arrow tables without a copy, converted to pandas once. Every shard
must have the columns of the first. In a folder, hidden files and markers (``_SUCCESS``, ``.crc``) are
skipped silently, other files that are no data (a README) with a log line. A single file or a
``save_to_disk`` folder is read as before (``readers.read_text_table``). ``shards_record`` is what a split
records of the shards it read (each one's size, time and SHA-256), ``shards_changed`` what changed since.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import shlex
from pathlib import Path

import numpy as np
import pandas as pd

from fastlm.corpus.readers import (
    COMPRESSIONS,
    FIX,
    LINES,
    RAW_PATH,
    as_frame,
    check_table_path,
    holds_no_rows,
    is_saved_folder,
    other_normalization,
    read_table,
    read_text_table,
    suffix_format,
    text_as_written,
    written_cells,
)
from fastlm.errors import InputDataError

log = logging.getLogger(__name__)

GLOB_CHARACTERS = frozenset("*?[")
MARKER_SUFFIXES = {".crc"}
SHARDS = "shards"  # frame.attrs: [(shard, rows), ...] in reading order


def is_pattern(path: str | Path) -> bool:
    """Whether ``path`` is a glob: it holds ``*``, ``?`` or ``[`` and names no existing file."""
    return bool(GLOB_CHARACTERS & set(str(path))) and not Path(path).exists()


def _marker(path: Path) -> bool:
    """A hidden file or a marker a writer leaves beside its shards (``_SUCCESS``, ``_committed_*``,
    ``.crc``)."""
    return path.name.startswith((".", "_")) or path.suffix.lower() in MARKER_SUFFIXES


def data_files(path: str | Path, say: bool = False) -> list[Path] | None:
    """The data files of a folder or glob in sorted path order (markers, other files and empty files left
    out, and .txt files where other data files are beside them; ``say``: the others said in a log line, as
    the shards are read), without checking them further; None for a single file, a ``save_to_disk`` folder
    or a path that does not exist (read as one file)."""
    path = Path(path)
    if is_pattern(path):
        found = [Path(name) for name in glob.glob(str(path), recursive=True)]
    elif path.is_dir() and not is_saved_folder(path):
        found = list(path.iterdir())
    else:
        return None
    kept, said = [], []
    for file in sorted(found):
        if _marker(file):
            continue
        if not file.is_file():
            said.append(f"{file.name} (a folder)" if file.is_dir() else f"{file.name} (not a regular file)")
        elif suffix_format(file) is None:
            said.append(f"{file.name} (not a data file)")
        elif file.stat().st_size == 0:
            said.append(f"{file.name} (empty)")
        else:
            kept.append(file)
    if any(suffix_format(file) != LINES for file in kept):  # notes or a licence beside the data: no shard
        said += [f"{file.name} (text beside the data files)" for file in kept if suffix_format(file) == LINES]
        kept = [file for file in kept if suffix_format(file) != LINES]
    if said and say:
        log.info("Skipped in %s: %s", path, ", ".join(said))
    return kept


def shard_files(path: str | Path, parameter: str = RAW_PATH, say: bool = False) -> list[Path] | None:
    """``data_files`` of ``path`` (``say``: the files skipped said), refused in one line where there is none
    or where one is of another format than the first; None for a single file or a ``save_to_disk`` folder."""
    files = data_files(path, say)
    if files is None:
        return None
    what = "matches the glob" if is_pattern(path) else "is in the folder"
    if not files:
        slashed = str(path).replace("\\", "/")
        folder = _literal_folder(path)
        there = None if folder.exists() else other_normalization(folder)
        if there is not None:  # a folder copied from macOS (decomposed) where the glob was typed composed
            raise InputDataError(
                f"no data file {what} {path} given as {parameter}: its folder {folder} does not exist; "
                f"{there} is there, the same name in another Unicode normalization (decomposed, NFD, as "
                "macOS writes file names, or composed, NFC).",
                fix=f'rename it as {parameter} writes it: python3 -c "import os; os.rename({str(there)!r}, '
                f'{str(folder)!r})".',
            )
        raise InputDataError(
            f"no data file (.csv, .tsv, .jsonl, .parquet, .txt, optionally compressed) {what} {path} given "
            f"as {parameter}.",
            fix=f"write the path with / (a backslash is no folder separator here): --params "
            f"{parameter}={shlex.quote(slashed)}."
            if slashed != str(path) and data_files(slashed)
            else "check the path (a glob reads from the project folder; ** for subfolders), or " + FIX + ".",
        )
    first = suffix_format(files[0])
    other = next((file for file in files if suffix_format(file) != first), None)
    if other is not None:
        raise InputDataError(
            f"{other} is {suffix_format(other)}, but the shards before it in {path} are {first} "
            f"({files[0].name}): shards must be of one format.",
            fix=f"move it out of the folder, or give a glob naming the shards (e.g. {Path(path) / '*'}"
            f"{files[0].suffix if files[0].suffix.lower() not in COMPRESSIONS else ''}).",
        )
    return files


def _literal_folder(path: str | Path) -> Path:
    """The folder part of a glob before its first part holding a glob character (``data/01_raw`` of
    ``data/01_raw/*/x.jsonl``); a folder itself."""
    parts = Path(path).parts
    index = next((i for i, part in enumerate(parts) if GLOB_CHARACTERS & set(part)), len(parts))
    return Path(*parts[:index]) if index else Path()


def check_raw_path(path: str | Path, parameter: str = RAW_PATH) -> None:
    """``readers.check_table_path`` for a file, a ``save_to_disk`` folder, or each shard of a folder or
    glob."""
    files = shard_files(path, parameter)
    for file in files if files is not None else [path]:
        check_table_path(file, parameter)


def read_raw_table(path: str | Path, parameter: str = RAW_PATH) -> pd.DataFrame:
    """The table of a file, a ``save_to_disk`` folder, or the shards of a folder or glob joined in sorted
    path order (``attrs['shards']``: each shard and its rows, for naming a row of the whole table); the files
    skipped are said here, once a run."""
    files = shard_files(path, parameter, say=True)
    if files is None:
        return read_text_table(path, parameter)
    parts, counts, columns, read, empty = [], [], None, [], []
    for file in files:
        part = read_table(file, parameter)
        if holds_no_rows(part):  # an empty partition, compressed (20 bytes of gzip) or of blank lines
            empty.append(file)
            continue
        names = list(part.columns) if isinstance(part, pd.DataFrame) else part.column_names
        if columns is None:
            columns = names
        elif set(map(str, names)) != set(map(str, columns)):
            raise _other_columns(file, names, files[0], columns)
        parts.append(part)
        read.append(file)
        counts.append((str(file), len(part)))
    if empty:
        log.info("Skipped in %s: %s", path, ", ".join(f"{file.name} (no rows)" for file in empty))
    if not parts:
        what = "matching the glob" if is_pattern(path) else "in the folder"
        raise InputDataError(
            f"every data file {what} {path} given as {parameter} holds no rows "
            f"({_named(list(map(str, empty)))}; nothing but white space once decompressed).",
            fix=f"fill them, or {FIX}.",
        )
    table = _joined(parts, columns, read)
    table.attrs["source_path"] = str(path)
    table.attrs[SHARDS] = counts
    return table


def texts_as_written(table: pd.DataFrame, names: list[str], parameter: str = RAW_PATH) -> pd.DataFrame:
    """``table`` (``read_raw_table``'s) with its text columns ``names`` as a CSV or TSV file writes them
    (``readers.text_as_written``): a cell is text, "007" and "1e3" the texts a column of numbers holds, an
    empty cell missing. In shards, each CSV or TSV shard whose cells of a column pandas read as numbers (all
    of its column, where another shard's held words) has that column read again as written: the same texts
    as one file of those rows. A JSON or Parquet value keeps its type (a JSON number is no text)."""
    counts = table.attrs.get(SHARDS)
    if not counts:
        return text_as_written(table, names, parameter)
    names = [name for name in dict.fromkeys(names) if name in table.columns]
    numbers = {name: _not_text(table[name]) for name in names}
    columns: dict[str, np.ndarray] = {}
    start = 0
    for shard, rows in counts:
        read = [name for name in names if numbers[name][start : start + rows].any()]
        if read and suffix_format(Path(shard)) in ("csv", "tsv"):
            for name, cells in written_cells(shard, read, parameter).items():
                if name not in columns:
                    columns[name] = table[name].to_numpy(dtype=object, copy=True)
                columns[name][start : start + rows] = cells
        start += rows
    if not columns:
        return table
    table = table.copy(deep=False)
    for name, values in columns.items():
        table[name] = pd.Series(values, index=table.index, dtype=object)
    return table


def _not_text(values: pd.Series) -> np.ndarray:
    """Which of ``values`` are there but no text (numbers, booleans)."""
    there = values.notna().to_numpy()
    if isinstance(values.dtype, pd.StringDtype):
        return np.zeros(len(values), dtype=bool)
    if not pd.api.types.is_object_dtype(values.dtype):
        return there
    return there & ~values.map(lambda value: isinstance(value, str)).to_numpy(dtype=bool)


def shard_row(attrs: dict):
    """For a table of shards (``attrs``: its frame's), what names its row ``number`` (counted from 1 over
    the whole table): ``<shard> row <number within it>``; None for a table of one file."""
    counts = attrs.get(SHARDS)
    if not counts:
        return None
    import bisect
    import itertools

    ends = list(itertools.accumulate(rows for _, rows in counts))

    def place(number: int) -> str:
        index = min(bisect.bisect_left(ends, number), len(counts) - 1)
        return f"{counts[index][0]} row {number - (ends[index] - counts[index][1])}"

    return place


def _other_columns(file: Path, names, first: Path, columns) -> InputDataError:
    missing = [str(name) for name in columns if str(name) not in set(map(str, names))]
    extra = [str(name) for name in names if str(name) not in set(map(str, columns))]
    said = "; ".join(
        part
        for part in (f"it lacks {missing}" if missing else "", f"it has {extra} besides" if extra else "")
        if part
    )
    return InputDataError(
        f"{file} has other columns than {first.name}, the first shard ({said}): shards must have the same "
        "columns.",
        fix="give every shard the same columns, or move that file out of the folder (or out of the glob).",
    )


def _joined(parts: list, columns: list, files: list[Path]) -> pd.DataFrame:
    """The parts as one frame, in the first part's column order: Arrow tables joined without a copy and
    converted once; where a column's type differs between parts (as inside one JSON Lines file), each part
    converted and the frames joined, as the reader of one file holding those rows keeps each value."""
    import pyarrow as pa

    if all(not isinstance(part, pd.DataFrame) for part in parts):
        try:
            whole = pa.concat_tables([part.select(columns) for part in parts], promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            whole = None
        if whole is not None:
            return as_frame(whole, files[0].parent)
    frames = []
    for index in range(len(parts)):
        frame, parts[index] = as_frame(parts[index], files[index]), None  # each part's Arrow copy let go
        frames.append(frame[columns] if list(frame.columns) != list(columns) else frame)
    return pd.concat(frames, ignore_index=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path, name: str) -> dict:
    """What a split records of a raw file it read (a file, or one shard): ``name`` (how the record names
    it), its size, time, status-change time, inode and SHA-256."""
    stat = path.stat()
    return {"path": name, **file_state(stat), "sha256": _sha256(path)}


def file_state(stat) -> dict:
    """A file's identity short of its bytes, from its ``os.stat`` result: size, modification time,
    status-change time and inode (the raw record's)."""
    # ctime and inode beside size and mtime: a rewrite whose mtime is put back (touch -r, cp -p, rsync -t, a
    # rewrite within a coarse clock's tick) still moves ctime, which no user call can set
    return {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "inode": stat.st_ino,
    }


def file_changed(path: Path, recorded: dict) -> bool:
    """Whether the file at ``path`` holds other bytes than ``recorded`` (``file_record``'s) says: the same
    size, time, status-change time and inode are the same file; anything else (a new time alone, a record
    of an older fastlm without the last two) is compared by its SHA-256."""
    stat = path.stat()
    if all(recorded.get(key) == value for key, value in file_state(stat).items()):
        return False
    return stat.st_size != recorded.get("size") or _sha256(path) != recorded.get("sha256")


def shards_record(path: str | Path) -> list[dict] | None:
    """Each shard of the folder or glob ``path`` (``file_record``: its path as listed, size, time and
    SHA-256), None when ``path`` holds no shards (a file, a ``save_to_disk`` folder)."""
    files = data_files(path)
    if files is None:
        return None
    return [file_record(file, str(file)) for file in files]


def shards_changed(path: str | Path, recorded: list[dict]) -> str | None:
    """What changed in the shards of ``path`` since ``recorded`` (``shards_record``'s): a shard added,
    removed or of other bytes (a new time alone is the same shard); None when nothing did."""
    files = data_files(path) or []
    now = [str(file) for file in files]
    before = [str(shard.get("path")) for shard in recorded]
    listed, had = set(now), set(before)
    added = [name for name in now if name not in had]
    removed = [name for name in before if name not in listed]
    if added or removed:
        return "; ".join(
            part
            for part in (
                f"{_named(added)} added" if added else "",
                f"{_named(removed)} removed" if removed else "",
            )
            if part
        )
    for file, shard in zip(files, recorded, strict=True):
        if file_changed(file, shard):
            return f"{file} changed ({size_change(shard.get('size'), file.stat().st_size)})"
    return None


def size_change(recorded: int | None, now: int) -> str:
    """How a changed file's size moved, in words: a file of the same size changed too (reordered lines)."""
    if recorded is None:
        return f"{now} bytes now"
    if recorded == now:
        return f"same size, {now} bytes, other contents"
    return f"{recorded} -> {now} bytes"


def _named(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
