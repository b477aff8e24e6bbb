"""Cheap checks that a pipeline's saved output is whole before another pipeline reads it.

A file cut off by a full disk, a killed copy or a bad sync otherwise fails deep inside a loader (a JSON
decoder, Arrow's IPC reader, safetensors) with a traceback that does not name the file. Checked here, per
file of the output: ``*.json`` parses, every ``*.arrow`` (Arrow IPC stream, as ``datasets`` writes it) reads
to its end through a memory map and validates (offsets within bounds: one sequential read, no copy), every
``*.safetensors`` header parses and its tensors end where the file does; a named pipe, socket or device in
place of a file is refused (a loader would block on it). Other files are left to their loaders.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from fastlm.errors import InputDataError
from fastlm.temporary_files import shown_path


def find_damaged(path: str | Path) -> tuple[Path, str] | None:
    """The first damaged file under ``path`` and what its reader said, or None when every file reads whole."""
    path = Path(path)
    files = (
        sorted(p for p in path.rglob("*") if not p.is_dir())
        if path.is_dir()
        else [path]
        if path.exists()
        else []
    )
    for file in files:
        if not file.is_file():  # a named pipe, socket or device: a loader opening it would block or fail
            return file, "not a regular file"
        check = _CHECKS.get(file.suffix)
        if check is None:
            continue
        try:
            check(file)
        except Exception as exc:  # noqa: BLE001 - every reader fails its own way; the file is what matters
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return file, detail[:200]
    return None


def damaged_input_error(file: Path, detail: str, *, producer: str) -> InputDataError:
    """One line naming the damaged ``file`` and the pipeline that writes it again."""
    what = "is not a regular file" if detail == "not a regular file" else f"is cut off or corrupt ({detail})"
    return InputDataError(
        f"{shown_path(file)} {what}.", fix=f"run `kedro run --pipeline={producer}` to write it again."
    )


def _json(file: Path) -> None:
    with file.open("rb") as handle:
        json.load(handle)


def _arrow(file: Path) -> None:
    import pyarrow as pa

    with pa.memory_map(str(file)) as source:
        reader = pa.ipc.open_stream(source)
        for batch in reader:  # offsets within bounds, lengths consistent: garbage in the body fails here
            batch.validate(full=True)
            _no_negative_ids(batch)


def _no_negative_ids(batch) -> None:
    """Token id columns (lists of integers) hold no negative id: garbage bytes read as ids would train."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if (
            pa.types.is_list(column.type)
            and pa.types.is_integer(column.type.value_type)
            and len(column.values)
        ):
            lowest = pc.min(column.values).as_py()
            if lowest is not None and lowest < 0:
                raise ValueError(f"token id {lowest} in column {name}")


def _safetensors(file: Path) -> None:
    size = file.stat().st_size
    with file.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than a safetensors header")
        (header_length,) = struct.unpack("<Q", head)
        if 8 + header_length > size:
            raise ValueError(f"the header needs {8 + header_length} bytes, the file has {size}")
        header = json.loads(handle.read(header_length))
    end = max(
        (entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0
    )
    if 8 + header_length + end != size:
        raise ValueError(f"the tensors need {8 + header_length + end} bytes, the file has {size}")


_CHECKS = {".json": _json, ".arrow": _arrow, ".safetensors": _safetensors}
