"""Parquet columns of text that are not UTF-8 strings: a string column holding another encoding's bytes
(a writer that stored CP949 under the UTF8 annotation), a binary column of text (writers that drop the
annotation, as Impala and older Hive do: what Spark's ``binaryAsString`` is for), and a text column of
numbers. Each is read as the text it is, or refused in one line naming the file, the column and the row."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.readers import read_text_table
from fastlm.corpus.split_steps import clean_rows
from fastlm.errors import InputDataError

KOREAN = ["배송 빨라요 정말 좋아요", "가격 대비 품질이 훌륭합니다", "포장이 꼼꼼해서 만족해요"]


def _strings_of_bytes(values: list[bytes]):
    """A string column whose bytes are ``values`` as they are (no UTF-8 check: a broken writer's)."""
    return pa.array(values, pa.binary()).view(pa.string())


def _split(path):
    raw = read_text_table(path)
    return clean_rows(raw, parse_split_params({"text_column": "text"}), str(path))


def test_a_binary_column_of_utf8_text_is_read_as_text(tmp_path):
    path = tmp_path / "binary.parquet"
    pq.write_table(pa.table({"text": pa.array([t.encode() for t in KOREAN], pa.binary())}), path)
    table = read_text_table(path)
    assert table["text"].tolist() == KOREAN
    kept, counts = _split(path)
    assert kept["text"].tolist() == KOREAN and counts["dropped"]["non_string"] == 0


def test_a_string_column_holding_cp949_bytes_is_refused_naming_the_column_and_row(tmp_path):
    """Was: pyarrow's `ArrowException: Unknown error: Wrapping <garbage> failed` as a traceback, status 1.
    One bad row among UTF-8 ones is named (row 2, counted from 1), with what it reads as in CP949; a column
    the split does not read does not stop it."""
    path = tmp_path / "mixed.parquet"
    values = [KOREAN[0].encode(), KOREAN[1].encode("cp949"), KOREAN[2].encode()]
    other = _strings_of_bytes([b"\xff\xfe", b"ok", b"ok"])
    pq.write_table(pa.table({"text": _strings_of_bytes(values), "note": other}), path)
    table = read_text_table(path)  # read: the bad values are kept as their bytes, for the check to name
    assert table["text"][0] == KOREAN[0] and table["text"][1] == KOREAN[1].encode("cp949")
    with pytest.raises(InputDataError) as refused:
        _split(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message, message
    assert "column 'text'" in message and "row 2" in message and "not UTF-8" in message, message
    assert f"as CP949: '{KOREAN[1]}'" in message and "Fix:" in message, message
    clean = pq.write_table(pa.table({"text": pa.array(KOREAN), "note": other}), tmp_path / "ok.parquet")
    assert clean is None and _split(tmp_path / "ok.parquet")[0]["text"].tolist() == KOREAN


def test_a_binary_column_of_cp949_text_is_refused_naming_the_row(tmp_path):
    """Was: every row dropped as `non_string` and `no usable text left ... check that split.text_column
    ('text') hold the data`: nothing said the column held bytes, or in which encoding."""
    path = tmp_path / "binary_cp949.parquet"
    pq.write_table(pa.table({"text": pa.array([t.encode("cp949") for t in KOREAN], pa.binary())}), path)
    with pytest.raises(InputDataError) as refused:
        _split(path)
    message = str(refused.value)
    assert "column 'text'" in message and "row 1" in message and f"as CP949: '{KOREAN[0]}'" in message


def test_a_text_column_of_numbers_says_it_holds_numbers(tmp_path):
    """Was: `no usable text left ... (dropped: {... 'non_string': 3 ...})` without the column's type: the
    numbers are still dropped (a JSON or Parquet number is no text), and the line says so."""
    path = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": pa.array([7, 8, 9])}), path)
    with pytest.raises(InputDataError) as refused:
        _split(path)
    message = str(refused.value)
    assert "split.text_column ('text') holds numbers (int64), not texts" in message, message
    assert isinstance(read_text_table(path)["text"].dtype, type(pd.Series([1]).dtype))
