"""Read a raw text table by file extension: CSV, TSV, JSONL, Parquet, or a ``save_to_disk`` folder."""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import logging
from pathlib import Path

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
}
FIX = "point raw_path at it (kedro run --pipeline=split --params raw_path=<file>) or edit raw_corpus in conf/base/catalog.yml"


def detect_format(path: Path) -> str:
    """The reader for ``path``: by extension (compression suffix ignored), or 'arrow_dir' for a folder."""
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return "arrow_dir"
        raise InputDataError(
            f"{path} is a folder but not a datasets.save_to_disk folder (no dataset_info.json or dataset_dict.json).",
            fix=f"give a .csv, .tsv, .jsonl or .parquet file, or a save_to_disk folder; {FIX}.",
        )
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    kind = FORMATS.get(suffixes[-1] if suffixes else "")
    if kind is None:
        raise InputDataError(
            f"{path}: unknown extension {path.suffix or '(none)'!r}; fastlm reads "
            ".csv, .tsv, .jsonl (.json, .ndjson), .parquet, optionally compressed, or a save_to_disk folder.",
            fix="convert the file to one of those or rename it to its real format.",
        )
    return kind


def read_text_table(path: str | Path) -> pd.DataFrame:
    """Load the table at ``path`` with its own column types (nothing renamed, nothing dropped).

    Text files (CSV, TSV, JSONL) are read as UTF-8; a file that is not UTF-8 but detected as Korean
    CP949/EUC-KR is decoded as CP949 (a superset of EUC-KR); any other encoding is named in the error.
    """
    path = Path(path)
    if not path.exists():
        raise InputDataError(f"raw data file {path} does not exist.", fix=f"create it or {FIX}.")
    kind = detect_format(path)
    if kind != "arrow_dir" and not path.is_file():  # a named pipe or a device would block or never end
        raise InputDataError(
            f"raw data file {path} is not a regular file (a named pipe, socket or device).",
            fix=f"save the data to a regular file first, then {FIX}.",
        )
    if path.is_file() and path.stat().st_size == 0:
        raise InputDataError(f"raw data file {path} is empty (0 bytes).", fix=f"fill it or {FIX}.")
    try:
        source = _text_source(path) if kind in TEXT_FORMATS and not _is_compressed(path) else path
        table = _READERS[kind](source, path)
        table.attrs["source_path"] = str(path)
        return table
    except InputDataError:
        raise
    except UnicodeDecodeError as exc:  # a compressed text file (not checked up front)
        raise _not_utf8(path, exc.start, exc.reason, None) from exc
    except Exception as exc:  # noqa: BLE001 - parser errors differ per format; name the file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputDataError(
            f"{path} could not be read as {kind}: {first_line}.",
            fix="check the file's format matches its extension.",
        ) from exc


TEXT_FORMATS = {"csv", "tsv", "jsonl"}
KOREAN_ENCODINGS = {"cp949", "euc_kr", "johab", "iso2022_kr"}
ICONV_NAMES = {"latin_1": "ISO-8859-1", "utf_16": "UTF-16", "utf_16_le": "UTF-16LE", "utf_16_be": "UTF-16BE",
               "utf_32": "UTF-32", "euc_kr": "EUC-KR", "cp949": "CP949"}
CHUNK = 16 * 2**20


def _is_compressed(path: Path) -> bool:
    return bool(path.suffixes) and path.suffixes[-1].lower() in COMPRESSIONS


def _text_source(path: Path) -> Path | io.BytesIO:
    """``path`` itself when it is UTF-8 (checked in chunks, memory bounded); a UTF-8 copy in memory when it
    is Korean CP949/EUC-KR; otherwise an error naming the detected encoding."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                return _legacy_text(path, offset + exc.start, exc.reason)
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        return _legacy_text(path, offset + exc.start, exc.reason)
    return path


def _legacy_text(path: Path, position: int, reason: str) -> io.BytesIO:
    from charset_normalizer import from_bytes

    data = path.read_bytes()
    start = max(0, position - 2**20)
    encoding = _likely_encoding(from_bytes(data[start:position + 2**20]))
    if encoding in KOREAN_ENCODINGS:
        try:
            text = data.decode("cp949")
        except UnicodeDecodeError:
            pass
        else:
            log.warning("%s is not UTF-8; read it as Korean CP949/EUC-KR (detected %s).", path, encoding)
            return io.BytesIO(text.encode("utf-8"))
    raise _not_utf8(path, position, reason, encoding)


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


def _not_utf8(path: Path, position: int, reason: str, encoding: str | None) -> InputDataError:
    if encoding is None:
        return InputDataError(f"{path} is not valid UTF-8 (byte {position}: {reason}).",
                              fix=f"re-save the file as UTF-8 (iconv -f <its encoding> -t UTF-8 {path}).")
    name = ICONV_NAMES.get(encoding, encoding.upper().replace("_", "-"))
    return InputDataError(
        f"{path} is not valid UTF-8 (byte {position}: {reason}); it looks like {name}.",
        fix=f"re-save it as UTF-8: iconv -f {name} -t UTF-8 {path} > converted{path.suffix}, then point raw_path "
        "at the converted file.",
    )


def _read_csv(source, path: Path, sep: str = ",") -> pd.DataFrame:
    # Only truly empty cells are missing: a text that reads "NA" or "null" stays a text.
    return pd.read_csv(source, sep=sep, keep_default_na=False, na_values=[""], low_memory=False)


def _read_jsonl(source, path: Path) -> pd.DataFrame:
    """JSON Lines (one object per line), or a ``.json`` file holding one JSON array of objects."""
    if _first_byte(source) == b"[":
        return _read_json_array(source, path)
    try:
        import pyarrow.json as pajson

        return pajson.read_json(_rewound(source)).to_pandas()
    except Exception:  # noqa: BLE001 - mixed types in a column or a bad line: Python's json says which
        pass
    try:
        return pd.read_json(_rewound(source), lines=True, dtype=False)
    except ValueError as exc:
        line, error = _first_bad_json_line(source)
        if line is None:
            raise
        raise InputDataError(f"{path} line {line} is not valid JSON ({error}).",
                             fix="fix or remove that line (JSON Lines: one JSON object per line).") from exc


def _read_json_array(source, path: Path) -> pd.DataFrame:
    try:
        with _open(source) as handle:
            rows = json.load(handle)
    except json.JSONDecodeError as exc:
        raise InputDataError(f"{path} line {exc.lineno} is not valid JSON ({exc.msg}).",
                             fix="fix the JSON array, or give one JSON object per line (.jsonl).") from exc
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise InputDataError(f"{path} holds a JSON array, but not only of objects.",
                             fix='give an array of objects such as [{"text": "..."}, ...].')
    return pd.DataFrame.from_records(rows)


def _first_byte(source) -> bytes:
    with _open(source) as handle:
        while chunk := handle.read(4096):
            stripped = chunk.lstrip(b" \t\r\n\xef\xbb\xbf")
            if stripped:
                return stripped[:1]
    return b""


def _first_bad_json_line(source) -> tuple[int | None, str]:
    with _open(source) as handle:
        for number, line in enumerate(handle, start=1):
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
    return Path(source).open("rb")


def _rewound(source):
    if isinstance(source, io.BytesIO):
        source.seek(0)
    return source


def _read_arrow_dir(source, path: Path) -> pd.DataFrame:
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        return pd.concat([part.to_pandas() for part in data.values()], ignore_index=True)
    return data.to_pandas()


_READERS = {
    "csv": _read_csv,
    "tsv": lambda source, path: _read_csv(source, path, sep="\t"),
    "jsonl": _read_jsonl,
    "parquet": lambda source, path: pd.read_parquet(source),
    "arrow_dir": _read_arrow_dir,
}
