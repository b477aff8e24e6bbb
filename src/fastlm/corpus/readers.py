"""Read a raw text table by file extension: CSV, TSV, JSONL, Parquet, or a ``save_to_disk`` folder."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fastlm.errors import InputDataError

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
    """Load the table at ``path`` with its own column types (nothing renamed, nothing dropped)."""
    path = Path(path)
    if not path.exists():
        raise InputDataError(f"raw data file {path} does not exist.", fix=f"create it or {FIX}.")
    kind = detect_format(path)
    if path.is_file() and path.stat().st_size == 0:
        raise InputDataError(f"raw data file {path} is empty (0 bytes).", fix=f"fill it or {FIX}.")
    try:
        table = _READERS[kind](path)
        table.attrs["source_path"] = str(path)
        return table
    except InputDataError:
        raise
    except UnicodeDecodeError as exc:
        raise InputDataError(
            f"{path} is not valid UTF-8 (byte {exc.start}: {exc.reason}).",
            fix="re-save the file as UTF-8 (e.g. iconv -f cp949 -t utf-8).",
        ) from exc
    except Exception as exc:  # noqa: BLE001 - parser errors differ per format; name the file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputDataError(
            f"{path} could not be read as {kind}: {first_line}.",
            fix="check the file's format matches its extension.",
        ) from exc


def _read_csv(path: Path, sep: str = ",") -> pd.DataFrame:
    # Only truly empty cells are missing: a text that reads "NA" or "null" stays a text.
    return pd.read_csv(path, sep=sep, keep_default_na=False, na_values=[""], low_memory=False)


def _read_jsonl(path: Path) -> pd.DataFrame:
    try:
        import pyarrow.json as pajson

        return pajson.read_json(path).to_pandas()
    except Exception:  # noqa: BLE001 - mixed types in a column: fall back to Python's json
        return pd.read_json(path, lines=True, dtype=False)


def _read_arrow_dir(path: Path) -> pd.DataFrame:
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        return pd.concat([part.to_pandas() for part in data.values()], ignore_index=True)
    return data.to_pandas()


_READERS = {
    "csv": _read_csv,
    "tsv": lambda path: _read_csv(path, sep="\t"),
    "jsonl": _read_jsonl,
    "parquet": pd.read_parquet,
    "arrow_dir": _read_arrow_dir,
}
