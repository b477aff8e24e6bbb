"""Compressed raw files: a file compressed under a plain-text name, a zip of no file or of several, a .zst
without the zstandard module: each refused in one line naming the file and the fix."""

from __future__ import annotations

import bz2
import gzip
import lzma
import sys
import zipfile

import pytest

from fastlm.corpus.readers import read_text_table
from fastlm.errors import InputDataError

BODY = b"text\nfirst text\nsecond text\n"


def _zip(data: bytes) -> bytes:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("rows.csv", data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "compress", "kind"),
    [
        ("rows.csv", gzip.compress, "gzip"),
        ("rows.txt", bz2.compress, "bzip2"),
        ("rows.jsonl", lzma.compress, "xz"),
        ("rows.csv", _zip, "zip"),
        ("rows.tsv", lambda data: b"\x28\xb5\x2f\xfd" + data, "zstd"),
    ],
)
def test_a_compressed_file_named_as_plain_text_is_refused_with_its_compression_named(
    tmp_path, name, compress, kind
):
    """Its bytes were taken for text in an unknown encoding (`iconv -f <its encoding>`): the magic bytes say
    which compression it is, and the fix is the name that reads it."""
    path = tmp_path / name
    path.write_bytes(compress(BODY if name != "rows.jsonl" else b'{"text": "a"}\n'))
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    suffix = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zip": ".zip", "zstd": ".zst"}[kind]
    assert message.startswith(f"{path} is {kind}-compressed, but its name says plain")
    assert f"rename it to {name}{suffix}" in message and "iconv" not in message and "\n" not in message


@pytest.mark.parametrize("members", [{}, {"a.csv": BODY, "b.csv": BODY}])
def test_a_zip_of_no_file_or_of_several_is_refused_naming_what_it_holds(tmp_path, members):
    path = tmp_path / "rows.csv.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    held = "no file" if not members else "2 files (a.csv, b.csv)"
    assert (
        message.startswith(f"{path} holds {held}; fastlm reads a zip of one file") and "UTF-8" not in message
    )
    assert "Fix: " in message and "unzip" in message


def test_a_zst_file_without_the_zstandard_module_names_the_module_or_the_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)
    for name in ("rows.csv.zst", "rows.txt.zst"):
        path = tmp_path / name
        path.write_bytes(b"\x28\xb5\x2f\xfd" + BODY)  # not a real frame: never decompressed here
        with pytest.raises(InputDataError) as error:
            read_text_table(path)
        message = str(error.value)
        assert message.startswith(f"{path} is zstd-compressed and the zstandard module is not installed")
        assert "pip install zstandard" in message and f"zstd -d {path}" in message and "\n" not in message


def test_a_text_that_begins_as_a_magic_number_does_is_read_as_text(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text("BZh9 is how a bzip2 file begins\nPK is a name\n", encoding="utf-8")
    assert list(read_text_table(path)["text"]) == ["BZh9 is how a bzip2 file begins", "PK is a name"]


@pytest.mark.parametrize(
    ("name", "compress", "check"),
    [
        ("rows.csv.gz", gzip.compress, "gzip -t"),
        ("rows.jsonl.gz", gzip.compress, "gzip -t"),
        ("rows.txt.bz2", bz2.compress, "bzip2 -t"),
        ("rows.tsv.xz", lzma.compress, "xz -t"),
        ("rows.parquet", None, None),
    ],
)
def test_a_file_cut_short_says_so_and_to_copy_it_again(tmp_path, name, compress, check):
    """A download or copy stopped part way (a disk that filled, a dropped connection): a compressed file
    whose stream ends early, a Parquet file without its footer. Refused in one line saying it is cut short
    and to fetch it again (with the command that checks a copy). Was: the decompressor's or pyarrow's words
    ("Compressed file ended before the end-of-stream marker was reached") with the fix "check the file's
    format matches its extension", which it does."""
    import pandas as pd

    rows = [f"배송 빨라요 {i}번째 리뷰" for i in range(2000)]
    path = tmp_path / name
    if compress is None:
        pd.DataFrame({"text": rows}).to_parquet(path)
        whole = path.read_bytes()
    elif ".jsonl" in name:
        whole = compress("".join(f'{{"text": "{row}"}}\n' for row in rows).encode())
    else:
        whole = compress(("text\n" + "\n".join(rows) + "\n").encode())
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert message.startswith(f"raw data file {path} is cut short"), message
    assert "matches its extension" not in message and "\n" not in message
    assert "again" in message.split("Fix:")[1]
    if check is not None:
        assert f"{check} {path}" in message
