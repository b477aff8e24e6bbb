"""Read a raw text table by file extension: CSV, TSV, JSONL, Parquet, plain text (one text a line, a
``text`` column), or a ``save_to_disk`` folder."""

from __future__ import annotations

import bz2
import codecs
import contextlib
import gzip
import io
import json
import logging
import lzma
import os
import re
import unicodedata
import warnings
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fastlm.errors import InputDataError

log = logging.getLogger(__name__)

COMPRESSIONS = {".gz", ".bz2", ".xz", ".zst", ".zip"}
FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "txt",
}
LINES = "txt"  # one text a line, in a ``text`` column (Hugging Face's ``text`` loader, line by line)
RAW_PATH = "raw_path"
FIX = (
    "point raw_path at it (kedro run --pipeline=split --params raw_path=<file>) or edit raw_corpus in "
    "conf/base/catalog.yml"
)


def _fix(parameter: str) -> str:
    """How to point the pipeline at another file: the split's ``raw_path`` (``FIX``) or ``parameter``."""
    return FIX if parameter == RAW_PATH else f"point {parameter} at it (--params {parameter}=<file>)"


def suffix_format(path: Path) -> str | None:
    """The format ``path``'s extension names (a compression suffix ignored), None for none."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return FORMATS.get(suffixes[-1]) if suffixes else None


def is_saved_folder(path: Path) -> bool:
    """Whether ``path`` is a ``datasets.save_to_disk`` folder."""
    return (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()


def detect_format(path: Path, parameter: str = RAW_PATH) -> str:
    """The reader for ``path``: by extension (compression suffix ignored), or 'arrow_dir' for a folder.
    ``parameter``: what named the file, for the fix of an error."""
    if path.is_dir():
        if is_saved_folder(path):
            return "arrow_dir"
        raise InputDataError(
            f"{path} is a folder but not a datasets.save_to_disk folder (no dataset_info.json or "
            "dataset_dict.json).",
            fix=f"give a .csv, .tsv, .jsonl or .parquet file, or a save_to_disk folder; {_fix(parameter)}.",
        )
    kind = suffix_format(path)
    if kind is None:
        raise InputDataError(
            f"{path}: unknown extension {path.suffix or '(none)'!r}; fastlm reads .csv, .tsv, .jsonl (.json, "
            ".ndjson), .parquet, .txt (one text a line), optionally compressed, or a save_to_disk folder.",
            fix="convert the file to one of those or rename it to its real format"
            + ("." if parameter == RAW_PATH else f", then {_fix(parameter)}."),
        )
    return kind


def check_table_path(path: str | Path, parameter: str = RAW_PATH) -> str:
    """What can be said of ``path`` without reading it (one line each): it exists, its extension names a
    format, it is a regular file (or a ``save_to_disk`` folder) and not empty; returns its format. Cheap, so
    a run checks its raw file before it starts (``hooks.MissingInputsHook``)."""
    path = Path(path)
    what, fix = ("raw data file" if parameter == RAW_PATH else parameter), _fix(parameter)
    if not path.exists():
        there = other_normalization(path)
        if there is not None:  # a name copied from macOS (decomposed) beside one typed (composed), or back
            raise InputDataError(
                f"{what} {path} does not exist; {there} is there, the same name in another Unicode "
                "normalization (decomposed, NFD, as macOS writes file names, or composed, NFC).",
                fix=f'rename it as {parameter} writes it: python3 -c "import os; os.rename({str(there)!r}, '
                f'{str(path)!r})", or {fix}.',
            )
        raise InputDataError(f"{what} {path} does not exist.", fix=f"create it or {fix}.")
    kind = detect_format(path, parameter)
    if kind != "arrow_dir" and not path.is_file():  # a named pipe or a device would block or never end
        raise InputDataError(
            f"{what} {path} is not a regular file (a named pipe, socket or device).",
            fix=f"save the data to a regular file first, then {fix}.",
        )
    if path.is_file() and path.stat().st_size == 0:
        raise InputDataError(f"{what} {path} is empty (0 bytes).", fix=f"fill it or {fix}.")
    if path.is_file() and (kind in TEXT_FORMATS or kind == LINES):
        _check_compression(path, kind, fix)
    return kind


def other_normalization(path: str | Path) -> Path | None:
    """The existing file or folder that ``path`` (one that does not exist) names in another Unicode
    normalization, each missing part of it matched to the one entry of its folder of the same NFC name (a
    name copied from macOS, decomposed, where the parameter was typed composed); None where there is none."""
    path = Path(path)
    found = Path(path.anchor) if path.is_absolute() else Path()
    for part in path.parts[1:] if path.is_absolute() else path.parts:
        if (found / part).exists() or part in ("", ".", ".."):
            found = found / part
            continue
        try:
            same = [
                entry
                for entry in found.iterdir()
                if unicodedata.normalize("NFC", entry.name) == unicodedata.normalize("NFC", part)
            ]
        except OSError:
            return None
        if len(same) != 1:
            return None
        found = same[0]
    return found if found != path and found.exists() else None


# The first bytes of each compression a text file may be read through (by its name's last suffix). bzip2's
# "BZh" is ASCII, so its block size and first block's (or end's) magic number are matched too: a text that
# begins "BZh" is no bzip2 file.
MAGIC = {
    re.compile(rb"\x1f\x8b"): ("gzip", ".gz"),
    re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)"): ("bzip2", ".bz2"),
    re.compile(rb"\xfd7zXZ\x00"): ("xz", ".xz"),
    re.compile(rb"\x28\xb5\x2f\xfd"): ("zstd", ".zst"),
    re.compile(rb"PK(?:\x03\x04|\x05\x06)"): ("zip", ".zip"),  # a member first, or an empty archive
}


def _check_compression(path: Path, kind: str, fix: str) -> None:
    """Refuse what the text readers cannot read as the name says, before any byte is decoded: a compressed
    file named as plain text (its bytes would be taken for text in some unknown encoding), a zip holding no
    file or several (which one is meant?), a .zst where the zstandard module is missing."""
    suffix = path.suffixes[-1].lower() if _is_compressed(path) else ""
    if not suffix:
        with path.open("rb") as handle:
            head = handle.read(10)
        found = next((named for magic, named in MAGIC.items() if magic.match(head)), None)
        if found is not None:
            compression, extension = found
            raise InputDataError(
                f"{path} is {compression}-compressed, but its name says plain {kind} text.",
                fix=f"rename it to {path.name}{extension} (fastlm decompresses by the name's last suffix), "
                f"then {fix}.",
            )
    elif suffix == ".zip":
        with contextlib.suppress(zipfile.BadZipFile), zipfile.ZipFile(path) as archive:
            members = [info.filename for info in archive.infolist() if not info.is_dir()]
            if len(members) != 1:
                shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
                held = "no file" if not members else f"{len(members)} files ({shown})"
                raise InputDataError(
                    f"{path} holds {held}; fastlm reads a zip of one file.",
                    fix=f"unzip it (unzip {path} -d <folder>) and give the file to read alone: {fix}.",
                )
    elif suffix == ".zst":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise InputDataError(
                f"{path} is zstd-compressed and the zstandard module is not installed.",
                fix=f"pip install zstandard, or decompress it first (zstd -d {path} -o "
                f"{path.with_suffix('')}), then {fix}.",
            ) from None


def read_text_table(
    path: str | Path, parameter: str = RAW_PATH, as_written: Sequence[str] = ()
) -> pd.DataFrame:
    """Load the table at ``path`` with its own column types (nothing renamed, nothing dropped).
    ``parameter``: the parameter that named the file (the split's ``raw_path``, predict's ``predict.input``),
    which an error's fix names. ``as_written``: columns whose values are kept as the file writes them
    (``_as_written``: predict's row ids), not as numbers pandas makes of them.

    Text files (CSV, TSV, JSONL), compressed or not, are read as UTF-8; a file that is not UTF-8 but detected
    as Korean CP949/EUC-KR is decoded as CP949 (a superset of EUC-KR); any other encoding is named in the
    error.
    A column name given twice (a CSV/TSV header, a Parquet schema, a key in one JSON object) is refused.
    """
    path = Path(path)
    raw = read_table(path, parameter)
    if holds_no_rows(raw):
        what = "raw data file" if parameter == RAW_PATH else parameter
        raise InputDataError(
            f"{what} {path} holds no rows{' once decompressed' if _is_compressed(path) else ''} (nothing but "
            "white space, or an empty JSON list).",
            fix=f"fill it or {_fix(parameter)}.",
        )
    table = _as_written(raw, as_frame(raw, path), path, parameter, as_written)
    table.attrs["source_path"] = str(path)
    return table


def text_as_written(table: pd.DataFrame, names: Sequence[str], parameter: str = RAW_PATH) -> pd.DataFrame:
    """``table`` (``read_text_table``'s) with those of its columns ``names`` that pandas read from a CSV or
    TSV file as numbers (or booleans) back as the text the file writes: a cell is text, "2024" and "007" are
    the prompts a column of numbers holds (a column mixing words and numbers is text as written already).
    Any other table as it is: a .txt's lines are text, a JSON or Parquet value has its own type (a JSON number
    is no text)."""
    source = table.attrs.get("source_path")
    if source is None or suffix_format(Path(source)) not in ("csv", "tsv") or not Path(source).is_file():
        return table
    numbers = [name for name in names if name in table.columns and not is_text_dtype(table[name].dtype)]
    if not numbers:
        return table
    return _as_written(None, table.copy(deep=False), Path(source), parameter, numbers)


def is_text_dtype(dtype) -> bool:
    """Whether a column of this dtype holds text as read: object (pandas 2's text, or words and numbers
    mixed) or pandas' string dtype (pandas 3's text, strings alone), not a column pandas made numbers of."""
    return pd.api.types.is_object_dtype(dtype) or isinstance(dtype, pd.StringDtype)


def _as_written(raw, table: pd.DataFrame, path: Path, parameter: str, names: Sequence[str]) -> pd.DataFrame:
    """``table`` with its columns ``names`` as the file writes them, a missing value None: a CSV's or TSV's
    cells as text ("007" is not the number 7, "1e3" not 1000.0), an Arrow column's (JSON Lines, Parquet)
    values as Arrow holds them (an integer column with a missing value is not turned into floats, 7.0), a
    JSON integer read by Python's ``json`` beside a missing value likewise."""
    names = [name for name in dict.fromkeys(names) if name in table.columns]
    if not names:
        return table
    kind = check_table_path(path, parameter)
    if kind in ("csv", "tsv"):
        columns = written_cells(path, names, parameter)
    elif not isinstance(raw, pd.DataFrame):  # an Arrow table
        columns = {name: raw.column(name).to_pylist() for name in names}
    else:  # JSON read by Python's json: integers beside a missing value made floats by pandas
        columns = {name: [_written_value(v) for v in table[name]] for name in names}
    for name, values in columns.items():
        table[name] = pd.Series(values, index=table.index, dtype=object)
    return table


def written_cells(path: str | Path, names: Sequence[str], parameter: str = RAW_PATH) -> dict[str, list]:
    """The cells of the columns ``names`` of the CSV or TSV file at ``path`` as the file writes them, read as
    ``read_text_table`` reads the file (its encoding, its compression): text ("007" is not the number 7, "1e3"
    not 1000.0), a truly empty cell None."""
    path = Path(path)
    source = without_header_repeats(_text_source(path, parameter), path)
    sep = "\t" if check_table_path(path, parameter) == "tsv" else ","
    quoting = csv_quoting(source, sep, path)
    header = pd.read_csv(
        _rewound(source), sep=sep, header=None, nrows=1, dtype=str, keep_default_na=False, quoting=quoting
    )
    written_names = header.iloc[0].tolist() if len(header) else []
    # a name the split matched to the file's own spelling (``matching_column``: ' text', a decomposed name)
    files = {name: matching_column(written_names, name) or name for name in names}
    written = csv_rows(
        source,
        sep,
        list(dict.fromkeys(files.values())),
        dtype=str,
        keep_default_na=False,
        na_values=[""],
        quoting=quoting,
        index_col=False,
    )
    return {name: [None if pd.isna(v) else str(v) for v in written[files[name]]] for name in names}


def column_key(name) -> object:
    """What a column name is the same name as: a text composed (NFC) and without white space around it (a
    CSV header written ``id, text`` names ' text'; one saved on macOS may be decomposed, NFD, where a
    parameter typed is composed); any other name itself."""
    return unicodedata.normalize("NFC", name).strip() if isinstance(name, str) else name


def matching_column(columns, name: str):
    """The column of ``columns`` that ``name`` (a parameter's) names: itself, else the one column of the same
    ``column_key``; None where there is none, or several."""
    columns = list(columns)
    if name in columns:
        return name
    same = [column for column in columns if column_key(column) == column_key(name)]
    return same[0] if len(same) == 1 else None


def _written_value(value):
    """A JSON value as written: None for a missing one, an integral float (pandas' of an integer beside a
    missing value) as the integer."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def read_table(path: str | Path, parameter: str = RAW_PATH):
    """The table at ``path`` as its reader made it, before pandas: an Arrow table (Parquet, JSON Lines
    pyarrow reads) or a pandas frame (CSV, TSV, JSON Python reads, a ``save_to_disk`` folder), with the
    errors of ``read_text_table``; ``as_frame`` makes it the frame ``read_text_table`` returns. Shards are
    read so (``fastlm.corpus.shards``): their Arrow tables are joined without a copy, then converted once."""
    path = Path(path)
    kind = check_table_path(path, parameter)
    if kind == LINES:
        lines = read_text_lines(path, parameter)
        refuse_a_table_of_tabs(lines, path)
        return pd.DataFrame({"text": pd.Series(lines, dtype=object)})
    try:
        source = _text_source(path, parameter) if kind in TEXT_FORMATS else path
        if kind in ("csv", "tsv"):
            source = without_header_repeats(source, path, say=True)
        return _READERS[kind](source, path)
    except InputDataError:
        raise
    except pd.errors.EmptyDataError:  # a CSV or TSV of nothing once decompressed, or of blank lines alone
        return pd.DataFrame()
    except UnicodeDecodeError as exc:  # a compressed text file (not checked up front)
        raise _not_utf8(path, exc.start, exc.reason, None, parameter) from exc
    except Exception as exc:  # noqa: BLE001 - parser errors differ per format; name the file
        cut = cut_short(path, exc, parameter)
        if cut is not None:
            raise cut from exc
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputDataError(
            f"{path} could not be read as {kind}: {first_line.rstrip('.')}.",
            fix="check the file's format matches its extension.",
        ) from exc


# The command that checks a copy of a file so compressed is whole
CHECK_COMMANDS = {".gz": "gzip -t", ".bz2": "bzip2 -t", ".xz": "xz -t", ".zst": "zstd -t"}
PARQUET_MAGIC = b"PAR1"
COMPRESSION_NAMES = {extension: name for name, extension in MAGIC.values()}


def cut_short(path: Path, error: BaseException, parameter: str = RAW_PATH) -> InputDataError | None:
    """Why ``path`` could not be read where it is cut short (a download or copy stopped part way, a disk
    that filled): a compressed file whose stream ends early (``error``, the decompressor's EOFError), a
    Parquet file that begins as one and ends before its footer; None otherwise."""
    what = "raw data file" if parameter == RAW_PATH else parameter
    fix = f"copy or download it again, or {_fix(parameter)}"
    if _is_compressed(path) and isinstance(error, EOFError):
        suffix = path.suffixes[-1].lower()
        check = CHECK_COMMANDS.get(suffix)
        return InputDataError(
            f"{what} {path} is cut short: its {COMPRESSION_NAMES.get(suffix, suffix[1:])}-compressed data "
            "ends before its stream does (a "
            "download or copy stopped part way, a disk that filled).",
            fix=fix.replace("again", f"again ({check} {path} checks a copy)" if check else "again", 1) + ".",
        )
    if suffix_format(path) == "parquet" and path.is_file() and path.stat().st_size >= len(PARQUET_MAGIC):
        with path.open("rb") as handle:
            head = handle.read(len(PARQUET_MAGIC))
            handle.seek(-len(PARQUET_MAGIC), os.SEEK_END)
            tail = handle.read()
        if head == PARQUET_MAGIC and tail != PARQUET_MAGIC:
            return InputDataError(
                f"{what} {path} is cut short: it begins as a Parquet file but ends before its footer (a "
                "download or copy stopped part way, a disk that filled).",
                fix=f"{fix}.",
            )
    return None


def holds_no_rows(table) -> bool:
    """Whether ``table`` (``read_table``'s) holds nothing, neither a column nor a row: a compressed file empty
    once decompressed (a writer's empty partition), a JSON Lines or CSV file of blank lines, a JSON ``[]``.
    A header without rows is a table (of no rows)."""
    if isinstance(table, pd.DataFrame):
        return table.shape == (0, 0)
    return table.num_rows == 0 and table.num_columns == 0


def as_frame(table, path: Path) -> pd.DataFrame:
    """``table`` (``read_table``'s) as a pandas frame; a conversion error names ``path``."""
    if isinstance(table, pd.DataFrame):
        return table
    try:
        return _arrow_frame(table)
    except Exception as exc:  # noqa: BLE001 - name the file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputDataError(
            f"{path} could not be converted to a table: {first_line}.",
            fix="check the file's columns hold one type each.",
        ) from exc


def read_text_lines(path: str | Path, parameter: str = RAW_PATH) -> list[str]:
    """The lines of a text file (``.txt``, optionally compressed), one input each: split at ``\n``, ``\r\n``
    and a lone ``\r`` (classic Mac line ends), as Python's universal newlines (and so Hugging Face's ``text``
    loader) and the CSV reader split, not at the other characters Python's ``splitlines`` takes for line
    ends (form feed, U+2028 and the like, which stay inside their line), with a leading UTF-8 BOM dropped;
    decoded as ``read_text_table`` decodes (Korean CP949 read, any other non-UTF-8 encoding named)."""
    path = Path(path)
    what, fix = ("raw data file" if parameter == RAW_PATH else parameter), _fix(parameter)
    if not path.is_file():
        raise InputDataError(f"{what} {path} is not a regular file.", fix=f"{fix}.")
    try:
        source = _text_source(path, parameter)
        with _open(source) as handle:
            text = handle.read().decode("utf-8-sig")
    except InputDataError:
        raise
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc.start, exc.reason, None, parameter) from exc
    except DECOMPRESS_ERRORS as exc:
        cut = cut_short(path, exc, parameter)
        if cut is not None:
            raise cut from exc
        raise InputDataError(
            f"{what} {path} could not be read as {path.suffixes[-1]}-compressed text: "
            f"{str(exc).rstrip('.')}.",
            fix="check the file's compression matches its extension.",
        ) from exc
    if "\r" in text:  # CRLF and a lone CR end a line as LF does
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the file's last line ends with a newline
    return lines


def renamed(path: Path, kind: str) -> str:
    """``path``'s name with its format's extension made ``.kind``, a compression suffix kept
    (``ratings.v2.txt.gz`` -> ``ratings.v2.tsv.gz``)."""
    compression = path.suffix if _is_compressed(path) else ""
    base = path.name[: len(path.name) - len(compression)]
    return f"{base[: len(base) - len(Path(base).suffix)]}.{kind}{compression}"


def refuse_a_table_of_tabs(lines: list[str], path: Path, column: str = "split.text_column") -> None:
    """A .txt whose every line (two or more, blank ones aside) holds the same number of tabs is a table saved
    as text (NSMC's ratings_train.txt: id, document, label): read a line a text, its header and every id and
    label would train as text (or be asked, by predict: ``column`` names the parameter that picks the
    column of texts). So is a .txt whose every line is a JSON object (JSON Lines saved as .txt)."""
    filled = [line for line in lines if line.strip()]
    if filled and _json_objects(filled):
        raise InputDataError(
            f"{path} looks like JSON Lines, not one text a line: each of its lines is a JSON object (its "
            f"first: {filled[0].strip()[:60]!r}).",
            fix=f"rename it to {renamed(path, 'jsonl')} to read its keys as columns, then set {column} to "
            "the key of the texts.",
        )
    tabs = {line.count("\t") for line in filled}
    if len(filled) >= 2 and len(tabs) == 1 and (count := tabs.pop()) >= 1:
        raise InputDataError(
            f"{path} looks like a table, not one text a line: each of its lines holds {count} tab"
            f"{'s' if count > 1 else ''} (its first: {filled[0][:60]!r}).",
            fix=f"rename it to {renamed(path, 'tsv')} to read its columns (its first line names them), then "
            f"set {column} to the column of texts.",
        )


JSON_LINES_LOOKED_AT = 100  # the lines parsed to tell a .txt of JSON objects (each braced line is looked at)


def _json_objects(filled: list[str]) -> bool:
    """Whether every line of ``filled`` (a .txt's lines holding text) is braced and the first
    ``JSON_LINES_LOOKED_AT`` of them are JSON objects: a JSON Lines file saved as .txt."""
    if not all(line.strip().startswith("{") and line.strip().endswith("}") for line in filled):
        return False
    for line in filled[:JSON_LINES_LOOKED_AT]:
        try:
            if not isinstance(json.loads(line), dict):
                return False
        except ValueError:
            return False
    return True


TEXT_FORMATS = {"csv", "tsv", "jsonl"}
KOREAN_ENCODINGS = {"cp949", "euc_kr", "johab", "iso2022_kr"}
# Python's codec name -> the name glibc's ``iconv -l`` knows it by (a name guessed from the codec's, such as
# PTCP154 for ptcp154, may be unknown to iconv: a fix naming it fails). A codec not here is named to Python.
ICONV_NAMES = {
    "iso8859_1": "ISO-8859-1",
    **{f"iso8859_{n}": f"ISO-8859-{n}" for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16)},
    **{f"cp{n}": f"CP{n}" for n in (*range(1250, 1259), 437, 850, 852, 855, 857, 858, 860, 861, 862, 863)},
    **{f"cp{n}": f"CP{n}" for n in (864, 865, 866, 869, 874, 932, 949, 950, 1125, 737, 775)},
    "utf_16": "UTF-16",
    "utf_16_le": "UTF-16LE",
    "utf_16_be": "UTF-16BE",
    "utf_32": "UTF-32",
    "utf_32_le": "UTF-32LE",
    "utf_32_be": "UTF-32BE",
    "euc_kr": "EUC-KR",
    "johab": "JOHAB",
    "iso2022_kr": "ISO-2022-KR",
    "euc_jp": "EUC-JP",
    "iso2022_jp": "ISO-2022-JP",
    "shift_jis": "SHIFT_JIS",
    "gb2312": "GB2312",
    "gbk": "GBK",
    "gb18030": "GB18030",
    "big5": "BIG5",
    "big5hkscs": "BIG5-HKSCS",
    "koi8_r": "KOI8-R",
    "koi8_u": "KOI8-U",
    "mac_roman": "MACINTOSH",
    "mac_cyrillic": "MAC-CYRILLIC",
    "ptcp154": "PT154",
    "tis_620": "TIS-620",
    "hp_roman8": "HP-ROMAN8",
}


def iconv_name(codec: str) -> str | None:
    """The name ``iconv -f`` takes for the Python codec ``codec``, None for one it may not know."""
    try:
        return ICONV_NAMES.get(codecs.lookup(codec).name.replace("-", "_"))
    except LookupError:
        return None


CHUNK = 16 * 2**20
THREADED_JSON = 16 * 2**20  # bytes: a JSON Lines file read by pyarrow's threads above it
# Writes the decompressed bytes of a file to stdout (the start of a pipe into iconv).
DECOMPRESS_COMMANDS = {
    ".gz": "gzip -dc",
    ".bz2": "bzip2 -dc",
    ".xz": "xz -dc",
    ".zst": "zstd -dc",
    ".zip": "unzip -p",
}
# What a file that is not compressed as its name says raises on reading: the format reader then names it.
DECOMPRESS_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error, zipfile.BadZipFile)


def _is_compressed(path: Path) -> bool:
    return bool(path.suffixes) and path.suffixes[-1].lower() in COMPRESSIONS


def _open_path(path: Path):
    """``path`` opened for reading its bytes, decompressed by its suffix (as pandas does); None where that
    cannot be done here (zstandard missing, a zip of several files): the format reader then says why."""
    suffix = path.suffixes[-1].lower() if _is_compressed(path) else ""
    if suffix == ".gz":
        return gzip.open(path, "rb")
    if suffix == ".bz2":
        return bz2.open(path, "rb")
    if suffix == ".xz":
        return lzma.open(path, "rb")
    if suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            return None
        return zstandard.open(path, "rb")
    if suffix == ".zip":
        with zipfile.ZipFile(path) as archive:  # the member keeps the file open after the archive is closed
            members = [info for info in archive.infolist() if not info.is_dir()]
            return archive.open(members[0]) if len(members) == 1 else None
    return path.open("rb")


def _text_source(path: Path, parameter: str = RAW_PATH) -> Path | io.BytesIO:
    """``path`` itself when its (decompressed) text is UTF-8 (checked in chunks, memory bounded); a UTF-8
    copy in memory when it is Korean CP949/EUC-KR; otherwise an error naming the detected encoding."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        handle = _open_path(path)
        if handle is None:
            return path
        with handle:
            while chunk := handle.read(CHUNK):
                if not offset:
                    _refuse_utf32_without_bom(chunk, path, parameter)
                    _refuse_utf16_without_bom(chunk, path, parameter)
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    return _legacy_text(path, offset + exc.start, exc.reason, parameter)
                offset += len(chunk)
    except DECOMPRESS_ERRORS:
        return path
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        return _legacy_text(path, offset + exc.start, exc.reason, parameter)
    return path


UTF16_HEAD = 4096  # the bytes of a file's start looked at for UTF-16 or UTF-32 without its byte-order mark


def _refuse_utf32_without_bom(head: bytes, path: Path, parameter: str = RAW_PATH) -> None:
    """Refuse a file whose start (``head``, decompressed) is UTF-32 without its byte-order mark: each four
    bytes one character, its top byte a NUL in every one (no code point reaches 2**24) and its next byte a
    NUL in nearly every one (all of the Basic Multilingual Plane), while its low byte is not. ASCII so written
    is valid UTF-8, each character then followed (LE) or preceded (BE) by three NULs: a CSV's header
    ``t\x00\x00\x00e...``, a .txt's lines trained so; other text fails as UTF-8 at an arbitrary byte."""
    sample = head[: UTF16_HEAD - len(head[:UTF16_HEAD]) % 4]
    if len(sample) < 8 or sample.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        return  # with its byte-order mark: not UTF-8 from its first byte, named as UTF-32 (``_not_utf8``)
    units = len(sample) // 4
    for named, top, next_, low in (("UTF-32LE", 3, 2, 0), ("UTF-32BE", 0, 1, 3)):
        if (
            sample[top::4].count(0) == units
            and sample[next_::4].count(0) >= units * 3 // 4
            and sample[low::4].count(0) <= units // 4
        ):
            _refuse_without_bom(
                path,
                parameter,
                named,
                "each character of its start takes four bytes, the top one a NUL (read as UTF-8, each ASCII "
                f"character would be {'followed' if named.endswith('LE') else 'preceded'} by three NULs).",
            )


def _refuse_utf16_without_bom(head: bytes, path: Path, parameter: str = RAW_PATH) -> None:
    """Refuse a file whose start (``head``, decompressed) is UTF-16 without its byte-order mark: a NUL at
    least every fourth byte, nearly all of them on one side of each byte pair (ASCII text so written). Such
    bytes are valid UTF-8, each character then followed by a NUL: a CSV's header ``t\x00e\x00x\x00t\x00``, a
    .txt's lines trained so. A lone NUL inside a UTF-8 text is no such file."""
    sample = head[:UTF16_HEAD]
    if len(sample) < 8 or sample.count(0) < len(sample) // 4 or sample.startswith((b"\xff\xfe", b"\xfe\xff")):
        return  # with its byte-order mark: not UTF-8 from its first byte, named as UTF-16 (``_not_utf8``)
    odd, even = sample[1::2].count(0), sample[0::2].count(0)
    if max(odd, even) < 9 * min(odd, even) + 4:
        return
    named = "UTF-16LE" if odd > even else "UTF-16BE"
    _refuse_without_bom(
        path,
        parameter,
        named,
        "every other byte of its start is a NUL (read as UTF-8, each character would be followed by one).",
    )


def _refuse_without_bom(path: Path, parameter: str, named: str, why: str) -> None:
    """Refuse ``path``, read as ``named`` (an iconv name) without its byte-order mark for ``why``: the fix
    converts its (decompressed) bytes to UTF-8."""
    compressed = _is_compressed(path)
    suffix = path.suffixes[-2] if compressed and len(path.suffixes) > 1 else path.suffix
    reads = f"{DECOMPRESS_COMMANDS[path.suffixes[-1].lower()]} {path} | " if compressed else ""
    command = f"{reads}iconv -f {named} -t UTF-8{'' if compressed else f' {path}'} > converted{suffix}"
    raise InputDataError(
        f"{path} looks like {named} without a byte-order mark, not UTF-8: {why}",
        fix=f"re-save it as UTF-8: {command}, then point {parameter} at the converted file.",
    )


def _legacy_text(path: Path, position: int, reason: str, parameter: str = RAW_PATH) -> io.BytesIO:
    from charset_normalizer import from_bytes

    with _open_path(path) as handle:
        data = handle.read()
    # a UTF-8 BOM before CP949 text (a header saved with one, joined with a CP949 export) is no text of it
    korean = _korean_text(data.removeprefix(BOM))
    encoding = "cp949" if korean is not None else None
    if korean is None:
        start = max(0, position - 2**20)
        encoding = _likely_encoding(from_bytes(data[start : position + 2**20]))
        if encoding in KOREAN_ENCODINGS:
            with contextlib.suppress(UnicodeDecodeError):
                korean = data.removeprefix(BOM).decode("cp949")
            if korean is not None and _western_look_alike(korean):
                korean, encoding = None, _western(data)
    if korean is not None:
        log.warning("%s is not UTF-8; read it as Korean CP949/EUC-KR (detected %s).", path, encoding)
        return io.BytesIO(korean.encode("utf-8"))
    raise _not_utf8(path, position, reason, encoding, parameter, data)


# The 2,350 Hangul syllables of KS X 1001 (EUC-KR): nearly every syllable of real Korean text. The other
# syllables CP949 can write take an ASCII letter as second byte, which is what Western text gives it too
# (cp1252 "don\x92t" is valid CP949): such syllables are no sign of Korean.
KS_HANGUL = frozenset(
    bytes([lead, trail]).decode("euc_kr") for lead in range(0xB0, 0xC9) for trail in range(0xA1, 0xFF)
)
ASCII_RUNS = re.compile(r"[\x00-\x7f]+")
KOREAN_SAMPLE = 2**20  # non-ASCII characters looked at


# A non-ASCII character with a Latin letter on either side: inside a Western word (INFORMAÇÃO), where the
# accented capitals Ç (C7) and Ã (C3) read as CP949 make the KS X 1001 syllable 플. Korean writes a syllable
# between two Latin letters next to never (``API를`` has one on one side): such syllables are no sign of it.
BETWEEN_LETTERS = re.compile(r"(?<=[A-Za-z])[^\x00-\x7f](?=[A-Za-z])")


def _korean_text(data: bytes) -> str | None:
    """``data`` decoded as CP949 when all of it decodes and most of its non-ASCII characters are KS X 1001
    Hangul syllables not standing between two Latin letters, else None: this finds a mostly-ASCII Korean
    file, which detectors take for cp1252, and leaves all-caps Portuguese or German (whose accented
    capitals pair into syllables) to be named Western."""
    try:
        text = data.decode("cp949")
    except UnicodeDecodeError:
        return None
    window = BETWEEN_LETTERS.sub("\ufffd", text[: 64 * KOREAN_SAMPLE])
    sample = ASCII_RUNS.sub("", window)[:KOREAN_SAMPLE]
    hangul = sum(char in KS_HANGUL for char in sample)
    return text if sample and hangul >= len(sample) / 2 else None


def _western_look_alike(text: str) -> bool:
    """Whether most KS X 1001 syllables of ``text`` (``data`` read as CP949) stand between two Latin
    letters: a Western text's accented capitals, which a detector may still call Korean."""
    window = text[: 64 * KOREAN_SAMPLE]
    hangul = sum(char in KS_HANGUL for char in ASCII_RUNS.sub("", window)[:KOREAN_SAMPLE])
    inside = sum(char in KS_HANGUL for char in BETWEEN_LETTERS.findall(window))
    return hangul > 0 and inside >= hangul / 2


def _western(data: bytes) -> str:
    """The Western European single-byte encoding of ``data``: cp1252 where it decodes (its curly quotes and
    dashes in 0x80-0x9F), else Latin-1 (which decodes any byte)."""
    try:
        data.decode("cp1252")
    except UnicodeDecodeError:
        return "latin_1"
    return "cp1252"


# Among equally good guesses, the Western European encodings win, in this order: a French Latin-1 text scores
# the same as Central European cp1250 or Baltic cp1257, which would turn its è into č (charset-normalizer's
# candidates and their order vary between its releases).
WESTERN = ("latin_1", "cp1252", "iso8859_15")


def _likely_encoding(matches) -> str | None:
    """charset-normalizer's best guess; among equally good guesses the Western European family wins."""
    best = matches.best()
    if best is None:
        return None
    ties = [match for match in matches if (match.chaos, match.coherence) == (best.chaos, best.coherence)]
    candidates = {name for match in ties for name in (match.encoding, *match.could_be_from_charset)}
    return next((name for name in WESTERN if name in candidates), best.encoding)


NAMED_BAD_LINES = 5  # the lines after the first that a refusal lists by number
EXCERPT = 60  # characters of a bad line a refusal shows


def _not_utf8(
    path: Path,
    position: int,
    reason: str,
    encoding: str | None,
    parameter: str = RAW_PATH,
    data: bytes | None = None,
) -> InputDataError:
    """The refusal of a file (its decompressed bytes ``data``, read here where not given) that is not UTF-8:
    the first line holding a bad byte (counted from 1, as an editor counts), shown, and a fix that converts
    what is wrong alone. Where the file's other non-ASCII lines are UTF-8 (a few lines pasted in from a CP949
    or Latin-1 file) converting the whole file would garble every good line, so the fix converts those lines
    alone; otherwise the whole file, from ``encoding`` (detected), by ``iconv`` or Python."""
    if data is None:
        with _open_path(path) or path.open("rb") as handle:
            data = handle.read()
    bad, count, good = _non_utf8_lines(data)
    compressed = _is_compressed(path)
    suffix = path.suffixes[-2] if compressed and len(path.suffixes) > 1 else path.suffix
    # the decompressed bytes: a pipe from the decompressing command, else the file itself
    reads = f"{DECOMPRESS_COMMANDS[path.suffixes[-1].lower()]} {path} | " if compressed else ""
    into = "" if compressed else f" < {path}"
    where = f"byte {position}{' after decompression' if compressed else ''}: {reason}"
    then = f"then point {parameter} at the converted file."
    if not bad:  # not expected: a decoder's error is on some line
        return InputDataError(f"{path} is not valid UTF-8 ({where}).", fix=f"re-save it as UTF-8, {then}")
    number, line, column = bad[0]
    if good > count:  # a UTF-8 file with a few lines in another encoding
        encoding = _lines_encoding([line for _, line, _ in bad])
        shown = _excerpt(line, column, encoding)
        more = ""
        if count > 1:
            listed = ", ".join(str(n) for n, _, _ in bad[1 : 1 + NAMED_BAD_LINES])
            listed += ", ..." if count > 1 + NAMED_BAD_LINES else ""
            more = f" and {count - 1} more line{'s' if count > 2 else ''} ({listed})"
        what = (
            f"{path} is not valid UTF-8 at line {number} ({where}): {shown}{more}; its other lines are "
            "UTF-8, so converting the whole file would garble them."
        )
        those = "that line" if count == 1 else "those lines"
        if encoding is None:
            return InputDataError(what, fix=f"fix or remove {those} (re-typed as UTF-8), {then}")
        one_liner = (
            "import sys; o=sys.stdout.buffer; [o.write(l if l.decode('utf-8','replace').encode()==l else "
            f"l.decode('{encoding}').encode()) for l in sys.stdin.buffer]"
        )
        return InputDataError(
            what,
            fix=f"fix or remove {those}, or convert {those} alone from {_named(encoding)}: "
            f'{reads}python3 -c "{one_liner}"{into} > converted{suffix}, {then}',
        )
    shown = _excerpt(line, column, encoding)
    name = None if encoding is None else iconv_name(encoding)
    looks = "" if encoding is None else f"; it looks like {_named(encoding)}"
    what = f"{path} is not valid UTF-8 at line {number} ({where}): {shown}{looks}."
    if encoding is None:
        command = f"{reads}iconv -f <its encoding> -t UTF-8{'' if compressed else f' {path}'}"
        return InputDataError(what, fix=f"re-save it as UTF-8: {command} > converted{suffix}, {then}")
    python = (
        f'{reads}python3 -c "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()'
        f".decode('{encoding}').encode())\"{into} > converted{suffix}"
    )
    if name is None:
        return InputDataError(what, fix=f"re-save it as UTF-8: {python}, {then}")
    command = f"{reads}iconv -f {name} -t UTF-8{'' if compressed else f' {path}'} > converted{suffix}"
    return InputDataError(what, fix=f"re-save it as UTF-8: {command} (without iconv: {python}), {then}")


def _named(encoding: str) -> str:
    """How a message names a Python codec: its ``iconv`` name, else the codec's own."""
    return iconv_name(encoding) or encoding


def _non_utf8_lines(data: bytes) -> tuple[list[tuple[int, bytes, int]], int, int]:
    """(the first lines of ``data`` that are not UTF-8, as (number from 1, bytes, first bad byte's index),
    how many lines are not, how many non-ASCII lines are)."""
    bad: list[tuple[int, bytes, int]] = []
    count = good = 0
    for number, line in enumerate(io.BytesIO(data), start=1):
        if line.isascii():
            continue
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            count += 1
            if len(bad) <= NAMED_BAD_LINES:
                bad.append((number, line.rstrip(b"\r\n"), exc.start))
        else:
            good += 1
    return bad, count, good


def _lines_encoding(lines: list[bytes]) -> str | None:
    """The encoding the bad lines of a UTF-8 file are in: CP949 where they read as Korean, else the Western
    cp1252 or Latin-1; None where a line also holds UTF-8 (a line of two encodings, which no decoding of the
    whole line reads right)."""
    data = b"\n".join(lines)
    if _korean_text(data) is not None and all(_korean_text(line) is not None for line in lines):
        return "cp949"
    for line in lines:
        if any(char != "\ufffd" and not char.isascii() for char in line.decode("utf-8", "replace")):
            return None
    return _western(data)


def _excerpt(line: bytes, column: int, encoding: str | None) -> str:
    """A bad line shown: at most ``EXCERPT`` characters around its first bad byte, bytes that are not UTF-8
    as ``\\xNN``, then the line as ``encoding`` reads it (where it decodes so)."""
    start = max(0, column - EXCERPT // 2)
    end = start + EXCERPT
    cut = line[start:end].decode("utf-8", "backslashreplace")
    shown = f"'{'...' if start else ''}{cut}{'...' if end < len(line) else ''}'"
    if encoding is None:
        return shown
    try:
        text = line.decode(encoding)
    except UnicodeDecodeError:
        return shown
    at = len(line[:start].decode(encoding, "replace"))
    read = f"{'...' if at else ''}{text[at : at + EXCERPT]}{'...' if at + EXCERPT < len(text) else ''}"
    return f"{shown} (as {_named(encoding)}: '{read}')"


def _refuse_repeated(names, path: Path) -> None:
    """InputDataError naming the first column name given twice: the readers would keep one of the two."""
    seen: dict[str, int] = {}
    for number, name in enumerate(names, start=1):
        if name == "":  # unnamed columns (pandas: "Unnamed: N") cannot be chosen, so none is read by mistake
            continue
        if name in seen:
            raise InputDataError(
                f"{path} has the column {name!r} twice (columns {seen[name]} and {number}); only one of them "
                "would be read.",
                fix="rename or drop one of the two columns.",
            )
        seen[name] = number


class KeyWrittenTwice(ValueError):
    """A JSON object that writes one key twice (``json`` keeps the last value and loses the first)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"writes the key {key!r} twice in one object")
        self.key = key


def unique_keys_object(pairs: list[tuple[str, object]]) -> dict:
    """A JSON ``object_pairs_hook`` refusing a key given twice (``KeyWrittenTwice``), where ``json`` keeps the
    last value (and pyarrow refuses the line)."""
    row = dict(pairs)
    if len(row) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise KeyWrittenTwice(key)
            seen.add(key)
    return row


def _repeated_key(path: Path, line: int, key: str) -> InputDataError:
    return InputDataError(
        f"{path} line {line} has the key {key!r} twice in one object; only one value would be read.",
        fix="drop or rename one of the two keys on that line.",
    )


def _read_csv(source, path: Path, sep: str = ",") -> pd.DataFrame:
    quoting = csv_quoting(source, sep, path)
    # pandas renames a repeated header name ("text", "text.1"): read the header row as it is written first.
    header = pd.read_csv(
        _rewound(source), sep=sep, header=None, nrows=1, dtype=str, keep_default_na=False, quoting=quoting
    )
    _refuse_repeated(header.iloc[0].tolist() if len(header) else [], path)
    # Only truly empty cells are missing: a text that reads "NA" or "null" stays a text. index_col=False:
    # pandas took the first column as the index where the first record held one field more than the header
    # (an unquoted comma), shifting every value one column; the longer record is refused instead.
    options = {"keep_default_na": False, "na_values": [""], "low_memory": False, "quoting": quoting}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # "... leads to a loss of data"
            return csv_rows(source, sep, index_col=False, **options)
    except pd.errors.ParserWarning:
        expected, line, saw = len(header.columns), None, None
        found = _longer_record(source, sep, expected, quoting)
        if found is None:  # a warning of another kind: read as pandas reads it
            return csv_rows(source, sep, index_col=False, **options)
        line, saw = found
    except pd.errors.ParserError as exc:
        found = MORE_FIELDS.search(str(exc))
        if found is None:
            raise
        expected, line, saw = found.groups()  # pandas counts records: the editor's line is looked for
        line, saw = _longer_record(source, sep, int(expected), quoting) or (line, saw)
    what = SEPARATOR_NAMES[sep]
    raise InputDataError(
        f"{path} line {line} holds {saw} fields where its header names {expected}: a value holding {what} "
        "unquoted is split there.",
        fix=f"quote each value that holds {what} ({QUOTED_EXAMPLES[sep]}; a quote inside a quoted value "
        'doubled: "say ""hi"""), or remove the extra field.',
    )


def without_header_repeats(source, path: Path, say: bool = False):
    """``source`` (a CSV or TSV file's, ``_text_source``'s) without its later lines that repeat its header
    line (a BOM before one, or CRLF after it, aside): files joined with ``cat``, each with its header (Spark's
    part files, a day's export each), whose header lines would be read as rows (a text "text", a pair
    ("dialogue", "summary")). ``source`` itself where none does (one scan, memory bounded); else a copy in
    memory without them, said (``say``) in one warning naming ``path``."""
    with _open(source) as handle:
        header = handle.readline().removeprefix(BOM).rstrip(b"\r\n")
        if not header.strip():
            return source
        rest, found = b"\n", False  # the header line is read: the next line starts after a line end
        while not found:
            block = handle.read(_SCAN_BLOCK)
            data = rest + block
            if not block:
                found = _holds_line(data + b"\n", header, len(data) + 1)  # a last line without its end
                break
            cut = data.rfind(b"\n")
            found = _holds_line(data, header, cut + 1)
            rest = data[cut:]
    if not found:
        return source
    with _open(source) as handle:
        lines = handle.read().splitlines(keepends=True)
    kept = lines[:1] + [line for line in lines[1:] if line.removeprefix(BOM).rstrip(b"\r\n") != header]
    if say:
        log.warning(
            "%s: %d later lines repeat its header line (%s), as files joined with their headers (cat) do: "
            "they are no rows and are left out",
            path,
            len(lines) - len(kept),
            header.decode("utf-8", "replace")[:80],
        )
    return io.BytesIO(b"".join(kept))


def _holds_line(data: bytes, line: bytes, end: int) -> bool:
    """Whether ``data[:end]`` (whole lines, each after a line end) holds ``line`` as a whole line, a BOM
    before it or a CR after it aside: each occurrence found by ``bytes.find`` (far faster than a pattern),
    then looked at around."""
    at = data.find(line, 0, end)
    while at != -1:
        start = at - len(BOM) if data[max(0, at - len(BOM)) : at] == BOM else at
        after = at + len(line) + (data[at + len(line) : at + len(line) + 1] == b"\r")
        if data[start - 1 : start] == b"\n" and data[after : after + 1] == b"\n":
            return True
        at = data.find(line, at + 1, end)
    return False


def _longer_record(source, sep: str, fields: int, quoting: int) -> tuple[int, int] | None:
    """(line, fields) of the first record of more than ``fields`` fields, its line the one where it ends
    (counted from 1, as an editor counts), read by Python's ``csv`` (a quoted value may span lines, which
    pandas' record number does not count)."""
    import csv

    with _open(source) as handle:
        text = io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")
        try:
            reader = csv.reader(text, delimiter=sep, quoting=quoting)
            for record in reader:
                if len(record) > fields:
                    return reader.line_num, len(record)
        except csv.Error:
            return None
        finally:
            text.detach()  # the source stays open for its owner
    return None


def csv_quoting(source, sep: str, path: Path) -> int:
    """How the CSV or TSV file at ``source`` quotes (``csv.QUOTE_*``, for ``pd.read_csv``): as spreadsheets
    and pandas write (a value in quotes, a quote inside it doubled) where every quote of the file is such
    quoting, or where it holds none; a TSV whose quotes are not (typed by hand or by a tool that quotes
    nothing, as NSMC's reviews are: ``"좋아요" 최고``, a quote never closed) has its quotes read as text. A
    CSV whose quoting is broken is refused, naming the line where the broken value begins."""
    import csv

    if not _holds_quote(source):
        return csv.QUOTE_MINIMAL
    # white space between a closing quote and the separator or line end (``"a"  ,b``: pandas reads it and
    # cleaning strips it) is no broken quoting: left out of the check (the lines read stay as they are)
    spaces = TRAILING_SPACES[sep]
    with _open(source) as handle:
        text = io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")
        lines = (spaces.sub("", line) if '"' in line else line for line in text)  # a closing quote's line
        reader = csv.reader(lines, delimiter=sep, strict=True)
        start = 1  # the line where the record being read begins
        try:
            for _ in reader:
                start = reader.line_num + 1
        except csv.Error as exc:
            if sep == "\t":
                return csv.QUOTE_NONE
            raise _broken_quoting(path, start, str(exc)) from None
        finally:
            text.detach()  # the source stays open for its owner
    return csv.QUOTE_MINIMAL


TRAILING_SPACES = {",": re.compile(r"[ \t]+(?=,|\r?\n|\Z)"), "\t": re.compile(r" +(?=\t|\r?\n|\Z)")}


def _holds_quote(source) -> bool:
    with _open(source) as handle:
        return any(b'"' in block for block in iter(lambda: handle.read(_SCAN_BLOCK), b""))


def _broken_quoting(path: Path, line: int, error: str) -> InputDataError:
    what = (
        "a quote opened here is never closed"
        if "unexpected end of data" in error or "EOF" in error
        else "a quoted value is followed by more text before the next comma"
    )
    return InputDataError(
        f"{path} line {line}: {what} (a CSV value that begins with a quote ends with the quote closing it).",
        fix='quote the whole value and double each quote inside it ("""hi"" there" for "hi" there), or '
        "remove the stray quote.",
    )


# pandas' C parser on a record longer than the header
MORE_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")
SEPARATOR_NAMES = {",": "a comma", "\t": "a tab", ";": "a semicolon", "|": "a bar"}
QUOTED_EXAMPLES = {",": '"a, b"', "\t": '"a<tab>b"'}
SHOWN_SEPARATORS = {",": "','", "\t": "tabs", ";": "';'", "|": "'|'"}


def separator_hint(table: pd.DataFrame, file: str | Path) -> tuple[str, str] | None:
    """(what, fix) where ``table``, read from ``file`` (a CSV or TSV file), is one column whose name holds
    another separator than the file's: a CSV separated by semicolons (a European spreadsheet's export), tabs
    or bars, or a TSV by commas, read as one column named ``text;label``; None otherwise."""
    kind = suffix_format(Path(file))
    if kind not in ("csv", "tsv") or len(table.columns) != 1:
        return None
    own = "," if kind == "csv" else "\t"
    name = str(table.columns[0])
    other = next((sep for sep in SHOWN_SEPARATORS if sep != own and sep in name), None)
    if other is None:
        return None
    what = f"its one column is named {name!r}: the file looks separated by {SHOWN_SEPARATORS[other]}, not "
    what += f"{SHOWN_SEPARATORS[own]}"
    if other in (",", "\t"):
        other_kind = "csv" if other == "," else "tsv"
        return what, f"rename it to {renamed(Path(file), other_kind)}."
    return what, (
        f"save it with commas between columns (pandas: pd.read_csv(path, sep={other!r}).to_csv(new_path, "
        "index=False)), or with tabs as a .tsv file."
    )


# A line of spaces and tabs alone, which pandas' CSV reader skips as blank (skip_blank_lines): after each line
# end, or first (searched for one by one: a regex led by one character searches many times faster).
SPACE_LINES = tuple(re.compile(start + rb"[ \t]+(?=[\r\n]|\Z)") for start in (rb"\A", rb"\n", rb"\r"))
BLANK_LINES = {
    sep: re.compile(rb"[" + blank + rb"]*(?:\r\n|\r|\n)") for sep, blank in ((",", b" \t"), ("\t", b" "))
}


def csv_rows(source, sep: str, columns: list[str] | None = None, **options) -> pd.DataFrame:
    """The records of a CSV or TSV file (``pd.read_csv``'s ``options``; ``columns``: those alone), one row
    each: a line of spaces or tabs alone too (a record of white space, which pandas skips as a blank line:
    cleaning counts it ``whitespace_only``), an empty line none (nor the last line's newline), as Python's
    ``csv`` reads them. A file without a line of white space alone is read by pandas alone."""
    if not _has_space_line(source):
        return pd.read_csv(_rewound(source), sep=sep, usecols=columns, **options)
    skipped = _blank_lines_above(source, sep)  # before the rewind: it reads the source (a copy in memory too)
    every = pd.read_csv(_rewound(source), sep=sep, skip_blank_lines=False, skiprows=skipped, **options)
    every = _without_empty_lines(every, pd.read_csv(_rewound(source), sep=sep, **options))
    return every if columns is None else every[columns]


def _has_space_line(source) -> bool:
    """Whether ``source`` has a line of spaces or tabs alone (anywhere: inside a quoted text too), read in
    blocks of whole lines."""
    rest = b""
    with _open(source) as handle:
        while True:
            block = handle.read(_SCAN_BLOCK)
            data = rest + block
            cut = max(data.rfind(b"\n"), data.rfind(b"\r"), 0) if block else len(data)
            data, rest = data[:cut], data[cut:]
            if any(pattern.search(data) for pattern in SPACE_LINES):
                return True
            if not block:
                return False


def _blank_lines_above(source, sep: str) -> int:
    """The blank lines above a CSV or TSV file's header (pandas skips them before it, as it reads no header;
    a TSV line of tabs is a record)."""
    with _open(source) as handle:
        head = handle.read(CHUNK).removeprefix(b"\xef\xbb\xbf")
    count = position = 0
    while found := BLANK_LINES[sep].match(head, position):
        count, position = count + 1, found.end()
    return count


def _without_empty_lines(every: pd.DataFrame, skipping: pd.DataFrame) -> pd.DataFrame:
    """``every`` (a file read with its blank lines, ``skip_blank_lines=False``) without the rows of its empty
    lines. ``skipping`` (the file read without its blank lines) is ``every`` less its blank lines' rows: rows
    of missing values alone, and rows whose first value alone is there, spaces or tabs. Between two other
    rows, ``every`` holds the rows of missing values ``skipping`` holds there (records such as ``""``), and
    one more for each empty line: as many are dropped, the first there (the same values)."""

    def blank(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        rest_missing = frame.iloc[:, 1:].isna().all(axis=1).to_numpy()
        first = frame.iloc[:, 0]
        missing = first.isna().to_numpy() & rest_missing
        spaces = first.map(lambda value: isinstance(value, str) and not value.strip(" \t"))
        return missing, missing | (rest_missing & spaces.to_numpy(dtype=bool))

    every_missing, every_blank = blank(every)
    skipping_missing, skipping_blank = blank(skipping)
    gaps = int((~every_blank).sum()) + 1
    gap = np.cumsum(~every_blank)[every_missing]  # the blank rows after the same other row share a number
    extra = (
        np.bincount(gap, minlength=gaps)
        - np.bincount(np.cumsum(~skipping_blank)[skipping_missing], minlength=gaps)[:gaps]
    )
    rank = pd.Series(gap).groupby(gap).cumcount().to_numpy()
    dropped = np.flatnonzero(every_missing)[rank < extra[gap]]
    return every.drop(index=every.index[dropped]).reset_index(drop=True)


def _read_jsonl(source, path: Path) -> pd.DataFrame:
    """JSON Lines (one object per line), or a ``.json`` file holding one JSON array of objects. A line that
    is not one object (an array, a bare value, two objects) is named: pyarrow's reader takes two objects on
    one line as two rows, either reader a ``null`` line as an empty row: each would shift every later row's
    number."""
    if _first_byte(source) == b"[":
        return _read_json_array(source, path)
    try:
        import pyarrow.json as pajson

        # threads pay off on a large file only: a thousand small shards read threaded take twice as long
        size = source.getbuffer().nbytes if isinstance(source, io.BytesIO) else path.stat().st_size
        threads = size > THREADED_JSON
        table = pajson.read_json(_rewound(source), read_options=pajson.ReadOptions(use_threads=threads))
    except Exception:  # noqa: BLE001 - mixed types, a bad line or a repeated key: Python's json says which
        table = None
    whole = table is not None and table.num_rows == _filled_lines(source)
    # a row with every value missing may be a ``null`` line (pyarrow reads it as one): Python's json decides
    if whole and not _a_row_all_null(table):
        # Arrow reads an integer beyond int64 as a float (its column too: ids 1.0, the big one rounded)
        if not (_holds_floats(table.schema) and _wide_integer(source)):
            return table
        return _python_json_rows(source)
    repeated = _first_repeated_key(source)
    if repeated is not None:
        raise _repeated_key(path, *repeated)
    line, error = _first_bad_json_line(source)
    if line is not None:
        raise InputDataError(
            f"{path} line {line} is not valid JSON ({error}).",
            fix="fix or remove that line (JSON Lines: one JSON object per line).",
        )
    _refuse_lone_surrogate(source, path)
    if whole:
        return table
    # pandas' reader refuses an integer beyond int64 (``Value is too big!``) or rounds it, and a line that
    # starts with a BOM (files saved "UTF-8 with BOM" joined with cat): Python's json reads both
    if _wide_integer(source) or _bom_after_first_line(source):
        return _python_json_rows(source)
    return pd.read_json(_rewound(source), lines=True, dtype=False)


def _without_bom(line: bytes) -> bytes:
    return line.removeprefix(BOM)


def _bom_after_first_line(source) -> bool:
    """Whether a line after the first of ``source`` starts with a UTF-8 BOM."""
    with _open(source) as handle:
        return any(line.startswith(BOM) for number, line in enumerate(handle) if number)


BOM = b"\xef\xbb\xbf"
INT64 = (-(2**63), 2**63 - 1)
LONG_INTEGER = re.compile(rb"(?<![\w.+-])-?[0-9]{19,}(?![0-9.eE])")  # 19 digits: from 10**18 (int64 < 9.3e18)


_SCAN_BLOCK = 16 * 2**20


def _wide_integer(source) -> bool:
    """Whether ``source`` writes an integer outside int64 (anywhere: a text holding one too), read in blocks
    of whole lines (a large file is not held in memory twice)."""
    rest = b""
    with _open(source) as handle:
        while True:
            block = handle.read(_SCAN_BLOCK)
            data = rest + block
            cut = data.rfind(b"\n") + 1 if block else len(data)
            data, rest = data[:cut], data[cut:]
            if any(not INT64[0] <= int(found) <= INT64[1] for found in LONG_INTEGER.findall(data)):
                return True
            if not block:
                return False


def _holds_floats(schema) -> bool:
    """Whether an Arrow schema has a float anywhere (a column, a list's items, a struct's field)."""
    import pyarrow as pa

    def floats(kind) -> bool:
        if pa.types.is_floating(kind):
            return True
        if pa.types.is_struct(kind):
            return any(floats(kind.field(index).type) for index in range(kind.num_fields))
        return hasattr(kind, "value_type") and floats(kind.value_type)

    return any(floats(field.type) for field in schema)


def _python_json_rows(source) -> pd.DataFrame:
    """JSON Lines read by Python's ``json`` (every line checked to be one object): an integer outside int64
    kept whole, for the column's reader to judge (predict refuses such an id as its row's reason)."""
    with _open(source) as handle:
        rows = [
            json.loads(line)
            for line in map(_without_bom, handle)  # any line's: files saved with one, joined
            if line.strip()
        ]
    return pd.DataFrame.from_records(rows)


def _a_row_all_null(table) -> bool:
    """Whether some row of the Arrow ``table`` has every value missing (every row, for no column)."""
    import pyarrow.compute as pc

    if table.num_columns == 0:
        return table.num_rows > 0
    missing = pc.is_null(table.column(0))
    for column in table.columns[1:]:
        missing = pc.and_(missing, pc.is_null(column))
    return bool(pc.any(missing).as_py())


def _filled_lines(source) -> int:
    """The lines of ``source`` holding anything but whitespace (a JSON Lines reader's rows)."""
    with _open(source) as handle:
        return sum(1 for line in handle if not line.isspace())


def _read_json_array(source, path: Path) -> pd.DataFrame:
    try:
        with _open(source) as handle:
            rows = json.load(handle, object_pairs_hook=unique_keys_object)
    except json.JSONDecodeError as exc:
        raise InputDataError(
            f"{path} line {exc.lineno} is not valid JSON ({exc.msg}).",
            fix="fix the JSON array, or give one JSON object per line (.jsonl).",
        ) from exc
    except KeyWrittenTwice as exc:
        raise _repeated_key(path, _array_row_line(source), exc.key) from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise InputDataError(
            f"{path} holds a JSON array, but not only of objects.",
            fix='give an array of objects such as [{"text": "..."}, ...].',
        )
    _refuse_lone_surrogate(source, path)
    return pd.DataFrame.from_records(rows)


# a JSON escape of a surrogate code point (``\ud800``-``\udfff``) and the backslashes before it: an odd run
# is an escape, an even one an escaped backslash followed by the text "u..."
SURROGATE_ESCAPE = re.compile(rb"(\\+)u([dD][89a-fA-F][0-9a-fA-F]{2})")


def first_lone_surrogate(source) -> tuple[int, str] | None:
    r"""(line, escape) of the first JSON escape of half a surrogate pair with no other half beside it: a high
    one (``\ud800``-``\udbff``) not followed at once by a low one, or a low one not preceded by a high one.
    It writes no character (Python's ``json`` keeps it as a string UTF-8 cannot encode; pandas' reader drops a
    high one). A JSON string holds no line break, so the halves are paired within a line."""
    with _open(source) as handle:
        for number, line in enumerate(handle, start=1):
            if b"\\u" not in line:
                continue
            high = None  # the match of a high half awaiting its low half
            for found in SURROGATE_ESCAPE.finditer(line):
                if len(found.group(1)) % 2 == 0:
                    continue
                escape = "\\u" + found.group(2).decode()
                if int(found.group(2), 16) < 0xDC00:  # a high half
                    if high is not None:
                        return number, "\\u" + high.group(2).decode()
                    high = found
                elif high is not None and found.start(1) == high.end() and len(found.group(1)) == 1:
                    high = None  # the pair is whole
                else:
                    return number, escape
            if high is not None:
                return number, "\\u" + high.group(2).decode()
    return None


def _refuse_lone_surrogate(source, path: Path) -> None:
    found = first_lone_surrogate(source)
    if found is not None:
        line, escape = found
        raise InputDataError(
            f"{path} line {line} writes {escape}, half of a surrogate pair without its other half:"
            " no character (the text would lose it).",
            fix="write the character itself (or both halves of its pair), or remove that escape.",
        )


def _first_byte(source) -> bytes:
    with _open(source) as handle:
        while chunk := handle.read(4096):
            stripped = chunk.lstrip(b" \t\r\n\xef\xbb\xbf")
            if stripped:
                return stripped[:1]
    return b""


def _first_repeated_key(source) -> tuple[int, str] | None:
    """(line, key) of the first JSON Lines object holding a key twice; lines that are not JSON are skipped."""
    with _open(source) as handle:
        for number, line in enumerate(handle, start=1):
            try:
                json.loads(line, object_pairs_hook=unique_keys_object)
            except KeyWrittenTwice as exc:
                return number, exc.key
            except ValueError:
                continue
    return None


JSON_SEPARATORS = re.compile(r"[\s,]*")


def _array_row_line(source) -> int:
    """The line where the first element of a JSON array holding a key twice starts (1 if none is found)."""
    with _open(source) as handle:
        text = handle.read().decode("utf-8-sig")
    decoder = json.JSONDecoder(object_pairs_hook=unique_keys_object)
    position = JSON_SEPARATORS.match(text, text.index("[") + 1).end()
    while position < len(text) and text[position] != "]":
        try:
            _, position = decoder.raw_decode(text, position)
        except KeyWrittenTwice:
            return text.count("\n", 0, position) + 1
        position = JSON_SEPARATORS.match(text, position).end()
    return 1


def _first_bad_json_line(source) -> tuple[int | None, str]:
    with _open(source) as handle:
        for number, line in enumerate(map(_without_bom, handle), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                return number, getattr(exc, "msg", str(exc))
            if not isinstance(row, dict):
                return number, f"a {type(row).__name__}, not an object"
    return None, ""


def _open(source):
    if isinstance(source, io.BytesIO):
        source.seek(0)
        return contextlib.nullcontext(source)
    return _open_path(Path(source)) or Path(source).open("rb")


def _rewound(source):
    if isinstance(source, io.BytesIO):
        source.seek(0)
    return source


def _read_parquet(source, path: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    with pq.ParquetFile(source) as file:  # one open for the schema and the rows (shards: a third the time)
        _refuse_repeated(file.schema_arrow.names, path)
        return _dictionaries_decoded(file.read())


def _dictionaries_decoded(table):
    """``table`` with each dictionary-encoded column (pandas' ``category`` written to Parquet, a writer's
    dictionary of repeated values) as the plain column of its values: pandas would read it as a Categorical,
    which holds no value outside its categories (cleaning writes new ones) and compares unlike a column of
    texts. The file's pandas metadata (its index kept) no longer calls those columns categorical."""
    import pyarrow as pa

    encoded = {field.name for field in table.schema if pa.types.is_dictionary(field.type)}
    if not encoded:
        return table
    for index, field in enumerate(table.schema):
        if field.name in encoded:
            plain = table.column(index).cast(field.type.value_type)
            table = table.set_column(index, field.with_type(plain.type), plain)
    metadata = dict(table.schema.metadata or {})
    if b"pandas" in metadata:
        pandas_metadata = json.loads(metadata[b"pandas"])
        for column in pandas_metadata.get("columns", []):
            if column.get("field_name") in encoded:
                column.update(pandas_type="object", numpy_type="object", metadata=None)
        metadata[b"pandas"] = json.dumps(pandas_metadata).encode()
    return table.replace_schema_metadata(metadata)


def _read_arrow_dir(source, path: Path) -> pd.DataFrame:
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        return pd.concat([_arrow_frame(part.data.table) for part in data.values()], ignore_index=True)
    return _arrow_frame(data.data.table)


def _arrow_frame(table) -> pd.DataFrame:
    """``table`` (a pyarrow Table) as pandas reads it, its columns holding structs (chats, calls) as the
    Python values Arrow holds: pandas' own conversion turns an integer field of a struct that holds nulls (a
    call's ``{"n": 7}`` beside another call's arguments without ``n``) into a float, ``7.0``, which a chat
    template then writes. A list of numbers (pre-tokenized ids) keeps pandas' conversion: an array a row,
    8 bytes an id where a Python list takes 36."""
    nested = {field.name: None for field in table.schema if _holds_struct(field.type)}
    special = {**nested, **_text_bytes_columns(table)}
    frame = table.drop_columns(list(special)).to_pandas() if special else table.to_pandas()
    for name in table.column_names:  # in the table's order
        if name in special:
            values = special[name] if special[name] is not None else table.column(name).to_pylist()
            frame.insert(
                table.column_names.index(name), name, pd.Series(values, index=frame.index, dtype=object)
            )
    return frame


def _text_bytes_columns(table) -> dict[str, list]:
    """The columns of ``table`` (Arrow) whose text is bytes as Python values: a binary column whose every
    value is UTF-8 as its texts (writers that drop Parquet's UTF8 annotation: Impala, older Hive; Spark's
    ``binaryAsString``), and a string column holding bytes that are not UTF-8 (a writer that stored CP949
    under the annotation) as its texts where they are UTF-8 and its other values as their bytes, for the
    check of the columns read as text to name (``cleaning.not_text_error``): pyarrow's own conversion of
    such a column failed the whole read (``ArrowException: ... Wrapping ... failed``), whichever column it
    was. Any other binary column stays bytes."""
    import pyarrow as pa
    import pyarrow.types as patypes

    found = {}
    for field in table.schema:
        column = table.column(field.name)
        if patypes.is_string(field.type) or patypes.is_large_string(field.type):
            try:
                column.validate(full=True)
                continue
            except pa.ArrowInvalid:
                binary = pa.binary() if patypes.is_string(field.type) else pa.large_binary()
                values = [value for chunk in column.chunks for value in chunk.view(binary).to_pylist()]
                found[field.name] = [_utf8_or_bytes(value) for value in values]
        elif patypes.is_binary(field.type) or patypes.is_large_binary(field.type):
            values = column.to_pylist()
            decoded = [_utf8_or_bytes(value) for value in values]
            if not any(isinstance(value, bytes) for value in decoded):
                found[field.name] = decoded
    return found


def _utf8_or_bytes(value: bytes | None) -> str | bytes | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _holds_struct(kind) -> bool:
    """Whether an Arrow type is, or holds at any depth, a struct or a map."""
    import pyarrow.types as patypes

    if patypes.is_struct(kind) or patypes.is_map(kind):
        return True
    if patypes.is_list(kind) or patypes.is_large_list(kind) or patypes.is_fixed_size_list(kind):
        return _holds_struct(kind.value_type)
    return False


_READERS = {
    "csv": _read_csv,
    "tsv": lambda source, path: _read_csv(source, path, sep="\t"),
    "jsonl": _read_jsonl,
    "parquet": _read_parquet,
    "arrow_dir": _read_arrow_dir,
}
