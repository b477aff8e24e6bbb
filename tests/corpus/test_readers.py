import gzip
import json
import logging
from pathlib import Path

import datasets
import pandas as pd
import pytest

from fastlm.corpus.readers import read_text_table
from fastlm.corpus.shards import read_raw_table, texts_as_written
from fastlm.errors import InputDataError

ROWS = ["first text", "둘째 텍스트", "NA", "null"]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet", ".csv.gz", ".jsonl.gz"])
def test_reads_each_format_by_extension(tmp_path, suffix):
    path = tmp_path / f"corpus{suffix}"
    frame = pd.DataFrame({"text": ROWS, "id": range(len(ROWS))})
    if suffix.startswith(".csv"):
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, sep="\t", index=False)
    elif suffix.startswith(".jsonl"):
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in frame.to_dict("records"))
        path.write_bytes(gzip.compress(lines.encode()) if suffix.endswith(".gz") else lines.encode())
    else:
        frame.to_parquet(path)
    table = read_text_table(path)
    assert list(table["text"]) == ROWS  # "NA" and "null" stay texts
    assert table.attrs["source_path"] == str(path)


def test_reads_save_to_disk_folder_including_dataset_dict(tmp_path):
    datasets.Dataset.from_dict({"text": ROWS}).save_to_disk(tmp_path / "single")
    assert list(read_text_table(tmp_path / "single")["text"]) == ROWS
    parts = datasets.DatasetDict(
        {
            "a": datasets.Dataset.from_dict({"text": ROWS[:2]}),
            "b": datasets.Dataset.from_dict({"text": ROWS[2:]}),
        }
    )
    parts.save_to_disk(tmp_path / "dict")
    assert sorted(read_text_table(tmp_path / "dict")["text"]) == sorted(ROWS)


def test_jsonl_with_mixed_types_keeps_non_strings_for_cleaning(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"text": "a"}\n{"text": 5}\n{"text": null}\n{"text": ["x"]}\n')
    values = list(read_text_table(path)["text"])
    assert values[0] == "a" and values[1] == 5 and values[3] == ["x"]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.csv", None, "does not exist"),
        ("empty.csv", b"", "is empty"),
        ("corpus.xlsx", b"x", "unknown extension '.xlsx'"),
        ("noext", b"x", "unknown extension"),
        ("latin.csv", "text\ncaf\u00e9\n".encode("cp1252"), "not valid UTF-8"),
        ("broken.parquet", b"not parquet at all", "could not be read as parquet"),
    ],
)
def test_bad_files_give_one_line_naming_the_file_and_fix(tmp_path, name, content, expected):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert expected in message and str(path) in message and "Fix:" in message
    assert "\n" not in message and ".." not in message  # a reader's own message ending in "." not doubled


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("empty.jsonl.gz", b""),
        ("blank.jsonl", b"\n  \n"),
        ("empty.csv.gz", b""),
        ("blank.csv", b"\n\n"),
        ("list.json", b"[]"),
    ],
)
def test_a_file_holding_no_rows_once_decompressed_is_refused_as_an_empty_one(tmp_path, name, content):
    """A compressed file of nothing (20 bytes of gzip), blank lines or an empty JSON list hold no rows, as an
    empty file: one line saying so. Was: `has no column 'text'; its columns are []` with a fix naming
    split.text_column, or `could not be read as csv: No columns to parse from file`."""
    import gzip

    path = tmp_path / name
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert f"raw data file {path} holds no rows" in message and "Fix: fill it" in message, message
    assert "\n" not in message and "column" not in message


def test_a_file_whose_name_is_written_decomposed_is_named_with_the_rename(tmp_path, monkeypatch):
    """``raw_path=data/01_raw/리뷰.jsonl`` typed composed (NFC) where the file, copied from macOS, has its
    name decomposed (NFD), or sits in a folder so named: `does not exist` for a file `ls` shows under that
    very name. The line says which file is there and how to rename it."""
    import unicodedata

    monkeypatch.chdir(tmp_path)
    decomposed = unicodedata.normalize("NFD", "리뷰")
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / f"{decomposed}.jsonl").write_text('{"text": "a"}\n', encoding="utf-8")
    (tmp_path / decomposed).mkdir()
    (tmp_path / decomposed / "rows.jsonl").write_text('{"text": "a"}\n', encoding="utf-8")
    for given, there in (
        ("raw/리뷰.jsonl", f"raw/{decomposed}.jsonl"),
        ("리뷰/rows.jsonl", f"{decomposed}/rows.jsonl"),
    ):
        with pytest.raises(InputDataError) as error:
            read_text_table(Path(given))
        message = str(error.value)
        assert f"raw data file {given} does not exist; {there} is there" in message, message
        assert f"os.rename({there!r}, {given!r})" in message and "\n" not in message, message
    with pytest.raises(InputDataError) as error:
        read_text_table(Path("raw/other.jsonl"))
    assert "is there" not in str(error.value)


def test_plain_folder_is_refused(tmp_path):
    with pytest.raises(InputDataError, match="not a datasets.save_to_disk folder"):
        read_text_table(tmp_path)


@pytest.mark.parametrize("name", ["twice.csv", "twice.tsv", "twice.csv.gz"])
def test_a_column_name_given_twice_in_a_header_is_refused(tmp_path, name):
    sep = "\t" if ".tsv" in name else ","
    content = f"id{sep}text{sep}text\n1{sep}first{sep}second\n".encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert f"{path} has the column 'text' twice (columns 2 and 3)" in message and "Fix:" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "text",
    [
        '{"text": "a"}\n{"text": "b", "id": 2, "text": "c"}\n',
        '{"text": "a"}\n{"text": "b"}\n{"text": 5, "text": "c"}\n',  # mixed types too
        '{"m": [{"content": "a"}]}\n{"m": [{"content": "b", "content": "c"}]}\n',
    ],
)
def test_a_json_key_given_twice_in_a_line_is_refused(tmp_path, text):
    path = tmp_path / "twice.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    line = text.count("\n")
    assert f"{path} line {line} has the key " in message and "twice" in message and "Fix:" in message
    assert "\n" not in message


def test_a_parquet_column_given_twice_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "twice.parquet"
    pq.write_table(pa.table([pa.array(["a"]), pa.array(["b"])], names=["text", "text"]), path)
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    assert f"{path} has the column 'text' twice (columns 1 and 2)" in str(error.value)


def test_a_json_array_with_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "twice.json"
    path.write_text('[{"text": "a"},\n {"text": "b", "text": "c"}]\n', encoding="utf-8")
    with pytest.raises(InputDataError, match=r"twice.json line 2 has the key 'text' twice"):
        read_text_table(path)


# the last: CP949-only (not EUC-KR) syllables
KOREAN = ["안녕하세요 세계", "한국어 문장입니다", "똠방각하 쌰 햏"]


def _korean_jsonl(rows) -> bytes:
    return "".join(json.dumps({"text": row}, ensure_ascii=False) + "\n" for row in rows).encode("cp949")


@pytest.mark.parametrize("name", ["korean.jsonl.gz", "korean.csv.gz"])
def test_compressed_korean_cp949_is_read_like_an_uncompressed_file(tmp_path, name):
    path = tmp_path / name
    csv = ("text\n" + "\n".join(KOREAN) + "\n").encode("cp949")
    data = _korean_jsonl(KOREAN) if ".jsonl" in name else csv
    path.write_bytes(gzip.compress(data))
    assert list(read_text_table(path)["text"]) == KOREAN


@pytest.mark.parametrize("shards", [False, True])
def test_a_korean_cp949_csv_of_words_is_read_once_and_said_once(tmp_path, caplog, shards):
    """Its text columns are words (pandas' string dtype, not object, from pandas 3): read as the file writes
    them already, not read a second time as if they held numbers, so its encoding is said in one warning."""
    csv = ("id,question,answer\n" + "".join(f"{i},{row},{row} 답\n" for i, row in enumerate(KOREAN))).encode(
        "cp949"
    )
    (tmp_path / "part-0.csv").write_bytes(csv)
    path = tmp_path if shards else tmp_path / "part-0.csv"
    with caplog.at_level(logging.WARNING, logger="fastlm.corpus.readers"):
        table = texts_as_written(read_raw_table(path), ["question", "answer"])
    assert list(table["question"]) == KOREAN
    assert [r.getMessage() for r in caplog.records].count(
        f"{tmp_path / 'part-0.csv'} is not UTF-8; read it as Korean CP949/EUC-KR (detected cp949)."
    ) == 1


def test_mostly_ascii_korean_cp949_is_not_taken_for_a_western_encoding(tmp_path):
    rows = [f"An English line, number {i}, with a few more words in it." for i in range(300)]
    rows[150] = "Hello 안녕 world"
    path = tmp_path / "mostly_ascii.jsonl"
    path.write_bytes(_korean_jsonl(rows))
    assert list(read_text_table(path)["text"]) == rows


# valid CP949 bytes, but not Korean
@pytest.mark.parametrize("odd", ["Ça a été très bien, ÀÉÈ Ànfang", "don\u2019t stop, it\u2019s fine"])
def test_a_western_file_stays_western(tmp_path, odd):
    rows = [f"An English line, number {i}, with a few more words in it." for i in range(300)]
    rows[150] = odd
    path = tmp_path / "mostly_ascii.csv"
    path.write_bytes(("text\n" + "\n".join(rows) + "\n").encode("cp1252"))
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert "not valid UTF-8" in message and "CP949" not in message and "EUC-KR" not in message


def test_a_compressed_file_in_another_encoding_names_a_command_for_the_compressed_file(tmp_path):
    path = tmp_path / "latin.jsonl.gz"
    rows = [f"Première ligne numéro {i}, très française, à côté de l'été." for i in range(200)]
    path.write_bytes(
        gzip.compress(
            "".join(json.dumps({"text": r}, ensure_ascii=False) + "\n" for r in rows).encode("cp1252")
        )
    )
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert message.startswith(f"{path} is not valid UTF-8") and "\n" not in message
    assert f"gzip -dc {path} | iconv -f " in message and " -t UTF-8 > converted.jsonl" in message


def test_compressed_json_is_read_and_checked_decompressed(tmp_path):
    array = tmp_path / "rows.json.gz"
    array.write_bytes(gzip.compress(json.dumps([{"text": "a"}, {"text": "b"}]).encode()))
    assert list(read_text_table(array)["text"]) == ["a", "b"]  # not one row holding the array
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"text": "a"}\n{"text": "b"\n'))
    with pytest.raises(InputDataError, match=r"broken.jsonl.gz line 2 is not valid JSON \(Expecting"):
        read_text_table(broken)


@pytest.mark.parametrize(
    ("lines", "line", "what"),
    [
        (['{"text": "first"}', "[1, 2]", '{"text": "third"}'], 2, "a list, not an object"),
        (['{"text": "a"} {"text": "b"}', '{"text": "c"}'], 1, "Extra data"),
        (['{"text": "a"}', '{"text": "c"}', "null"], 3, "a NoneType, not an object"),
        (['{"text": "a"}', "5"], 2, "a int, not an object"),
        (['{"text": "a"}', '"second"'], 2, "a str, not an object"),
    ],
    ids=["array_line", "two_objects_on_a_line", "null_line", "number_line", "string_line"],
)
def test_a_jsonl_line_that_is_not_one_object_is_named_by_its_number(tmp_path, lines, line, what):
    """Each line of JSON Lines is one object: a line holding an array, two objects or a bare value is named
    (pyarrow's reader takes two objects on one line as two rows; pandas' takes ``null`` as an empty row)."""
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert f"{path} line {line} is not valid JSON ({what}" in message and "Fix:" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("name", "content", "line", "escape"),
    [
        ("high.jsonl", '{"text": "a"}\n{"text": "b \\ud800 c"}\n', 2, "\\ud800"),  # pandas dropped it unsaid
        ("low.jsonl", '{"text": "a \\udc00"}\n{"text": "b"}\n', 1, "\\udc00"),
        ("swapped.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": "\\ude00\\ud83d"}\n', 3, "\\ude00"),
        ("nested.jsonl", '{"messages": [{"role": "user", "content": "x\\uDBFF"}]}\n', 1, "\\uDBFF"),
        ("array.json", '[\n  {"text": "a"},\n  {"text": "b \\ud800"}\n]\n', 3, "\\ud800"),
        ("wide.jsonl", '{"text": "\\ud800", "id": 99999999999999999999}\n', 1, "\\ud800"),
    ],
    ids=[
        "high_alone",
        "low_alone",
        "pair_reversed",
        "in_a_nested_value",
        "json_array",
        "beside_a_wide_integer",
    ],
)
def test_a_lone_surrogate_escape_is_refused_naming_its_line(tmp_path, name, content, line, escape):
    """A ``\\ud800``-style escape without its other half writes no character: it was dropped from the text
    without a word (a high one, by pandas' reader) or failed with a fix about the file's extension (a low
    one). Refused, naming the line and the escape, as a line that is not JSON is."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert (
        message.startswith(f"{path} line {line} writes {escape}, half of a surrogate pair")
        and "Fix:" in message
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    "text",
    [
        '{"text": "smile \\ud83d\\ude00"}',
        '{"text": "a backslash then u: \\\\ud800"}',
        '{"text": "\\\\\\ud83d\\ude00"}',
    ],
    ids=["a_whole_pair", "an_escaped_backslash", "a_backslash_then_a_pair"],
)
def test_a_whole_surrogate_pair_and_an_escaped_backslash_are_read(tmp_path, text):
    path = tmp_path / "rows.jsonl"
    path.write_text(text + '\n{"text": "x"}\n', encoding="utf-8")
    assert list(read_text_table(path)["text"]) == [json.loads(text)["text"], "x"]


def test_a_lone_surrogate_is_found_on_the_line_that_writes_it(tmp_path):
    """The scan pairs halves within a line: a high half ending one line and a low half starting the next are
    two lone halves (JSON strings hold no line break)."""
    from fastlm.corpus.readers import first_lone_surrogate

    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"text": "ok \\ud83d\\ude00", "b": "\\\\ud800"}\n{"t": "end \\ud83d"}\n')
    assert first_lone_surrogate(path) == (2, "\\ud83d")
    path.write_bytes(b'{"text": "ok \\ud83d\\ude00"}\n')
    assert first_lone_surrogate(path) is None


def test_blank_lines_between_jsonl_objects_are_no_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a"}\n\n  \n{"text": "b"}\r\n\n', encoding="utf-8")
    assert list(read_text_table(path)["text"]) == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.csv", None, "does not exist"),
        ("empty.csv", b"", "is empty"),
        ("latin.csv", "text\ncaf\u00e9\n".encode("cp1252"), "not valid UTF-8"),
        ("folder", "dir", "not a datasets.save_to_disk folder"),
    ],
    ids=["missing", "empty", "not_utf8", "folder"],
)
def test_a_bad_file_names_the_parameter_that_pointed_at_it(tmp_path, name, content, expected):
    """The predict pipeline reads its input with the same readers: its fix names predict.input, not the
    split's raw_path."""
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(InputDataError) as error:
        read_text_table(path, parameter="predict.input")
    message = str(error.value)
    assert expected in message and "predict.input" in message.split("Fix:")[1]
    assert "raw_path" not in message and "split" not in message and "\n" not in message


def _call_row(arguments: dict) -> dict:
    return {
        "messages": [
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": arguments}}]}
        ]
    }


# an integer argument only one row's call has: Arrow's struct gives the other row a null there
CALL_ROWS = [_call_row({"n": 7}), _call_row({"s": "x"})]


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "save_to_disk"])
def test_a_nested_integer_beside_nulls_stays_an_integer(tmp_path, kind):
    """pandas' conversion of an Arrow struct reads an int64 field holding nulls as float64: a call's
    ``{"n": 7}`` came back as ``{"n": 7.0}``, which the chat template writes as ``7.0``."""

    path = _written(tmp_path / "calls", kind, CALL_ROWS)
    read = read_text_table(path)["messages"][0][0]["tool_calls"][0]["function"]["arguments"]
    written = CALL_ROWS[0]["messages"][0]["tool_calls"][0]["function"]["arguments"]
    assert json.dumps({k: v for k, v in dict(read).items() if v is not None}) == json.dumps(written)


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "save_to_disk"])
def test_a_column_of_id_lists_reads_as_arrays_not_python_lists(tmp_path, kind):
    """Pre-tokenized data (millions of id lists) keeps pandas' conversion: each row an int64 array over
    Arrow's buffer (8 bytes an id), not a Python list (36 bytes an id); only columns holding structs (chats,
    calls) are read as Python values."""
    import numpy as np

    rows = [{"ids": [3, 17, 5]}, {"ids": [9, 10]}]
    ids = read_text_table(_written(tmp_path / "ids", kind, rows))["ids"]
    assert all(isinstance(value, np.ndarray) and value.dtype == np.int64 for value in ids), list(ids)
    assert [value.tolist() for value in ids] == [row["ids"] for row in rows]


def _written(stem, kind: str, rows: list[dict]):
    """``rows`` written as a JSON Lines or Parquet file, or a ``save_to_disk`` folder, at ``stem``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = stem if kind == "save_to_disk" else stem.with_suffix(f".{kind}")
    if kind == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        datasets.Dataset.from_list(rows).save_to_disk(path)
    return path


@pytest.mark.parametrize("written_by", ["pandas_categorical", "arrow_dictionary"])
def test_a_dictionary_encoded_parquet_text_column_reads_and_cleans_as_plain_texts(tmp_path, written_by):
    """A text column Parquet stores dictionary-encoded (pandas' ``category`` dtype, a writer's dictionary of
    repeated answers) is read as the texts it holds: cleaning such a column with a missing value failed with
    pandas' ``Cannot setitem on a Categorical with a new category``, a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastlm.corpus.cleaning import clean_pairs, clean_texts

    texts = ["배송 빨라요", None, "good", "배송 빨라요", "  ", "good "]
    path = tmp_path / "rows.parquet"
    if written_by == "pandas_categorical":
        index = pd.Index(range(10, 16), name="row_id")
        frame = pd.DataFrame(
            {"text": pd.Categorical(texts), "answer": pd.Categorical(texts[::-1])}, index=index
        )
        frame.to_parquet(path)
    else:
        column = pa.array(texts).dictionary_encode()
        pq.write_table(pa.table({"text": column, "answer": pa.array(texts[::-1]).dictionary_encode()}), path)
    table = read_text_table(path)
    assert not any(isinstance(dtype, pd.CategoricalDtype) for dtype in table.dtypes)
    assert list(table.columns) == ["text", "answer"]  # pandas' index stays the index
    kept, drops = clean_texts(table["text"])
    assert list(kept) == ["배송 빨라요", "good"]
    assert drops == {"missing": 1, "non_string": 0, "empty": 0, "whitespace_only": 1, "duplicate": 2}
    pairs, _ = clean_pairs(table["text"], table["answer"])
    assert pairs.values.tolist() == [["배송 빨라요", "good"], ["good", "배송 빨라요"]]


def test_parquet_shards_of_dictionary_and_plain_text_columns_join_as_one_file_of_their_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "shards"
    folder.mkdir()
    pq.write_table(pa.table({"text": pa.array(["a", "b", "a"]).dictionary_encode()}), folder / "0.parquet")
    pq.write_table(pa.table({"text": pa.array(["c", None])}), folder / "1.parquet")
    pq.write_table(pa.table({"text": pa.array(["d", "a"]).dictionary_encode()}), folder / "2.parquet")
    table = read_raw_table(folder)
    assert not isinstance(table["text"].dtype, pd.CategoricalDtype)
    assert table["text"].tolist()[:4] == ["a", "b", "a", "c"] and table["text"].isna().tolist()[4]
    assert table["text"].tolist()[5:] == ["d", "a"]


def test_a_csv_row_with_more_fields_than_its_header_is_named_with_the_quoting_fix(tmp_path):
    """A text holding a comma, unquoted, makes its row one field longer: pandas' ``Expected 2 fields in line
    3, saw 3`` was passed on with the fix to check the file's format matches its extension."""
    path = tmp_path / "ragged.csv"
    path.write_text('id,text\n1,"two\nlines"\n2,a, b\n3,"c, d"\n', encoding="utf-8")
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)  # the line an editor shows (pandas counted records: its "line 3")
    assert (
        message.startswith(f"{path} line 4 holds 3 fields where its header names 2") and "\n" not in message
    )
    assert "Fix: quote" in message and "extension" not in message
    # every record, or the first, one field longer: pandas took the first column as the index and shifted
    # every value one column (id 'a', text ' b'), silently
    for content in ("id,text\n1,a, b\n2,c\n", "id,text\n1,a, b\n2,c, d\n"):
        path = tmp_path / "shifted.csv"
        path.write_text(content, encoding="utf-8")
        with pytest.raises(InputDataError) as error:
            read_text_table(path)
        assert str(error.value).startswith(f"{path} line 2 holds 3 fields where its header names 2")
    path = tmp_path / "ragged.tsv"
    path.write_text("id\ttext\n1\ta\tb\n", encoding="utf-8")
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    assert 'quote each value that holds a tab ("a<tab>b";' in str(error.value), str(error.value)


@pytest.mark.parametrize(
    ("name", "content", "said", "fix"),
    [
        ("semi.csv", "text;label\nhello;1\n", "separated by ';'", "commas"),
        ("bars.csv", "text|label\nhello|1\n", "separated by '|'", "commas"),
        ("tabs.csv", "text\tlabel\nhello\t1\n", "separated by tabs", "rename it to tabs.tsv"),
        ("commas.tsv", "text,label\nhello,1\n", "separated by ','", "rename it to commas.csv"),
    ],
)
def test_a_table_read_with_the_wrong_separator_says_which_separator_it_looks_like(
    tmp_path, name, content, said, fix
):
    """A CSV separated by semicolons (a European spreadsheet's export) reads as one column named
    ``text;label``: the split said to set split.text_column to that name. Now the separator is named, and
    what to do about it."""
    from fastlm.pipelines.split import nodes

    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputDataError) as error:
        nodes.clean_corpus(read_raw_table(path), {"text_column": "text"})
    message = str(error.value)
    assert f"{path} has no column 'text'" in message and said in message and fix in message, message
    assert "set split.text_column to one of them" not in message


def test_a_tsv_whose_quotes_are_text_reads_them_as_written(tmp_path):
    """A TSV written by hand or by a tool that does not quote (NSMC's ratings files: reviews holding quotes)
    is read as written: a CSV-style reading dropped the quotes of a value that begins with one
    (``"좋아요" 최고`` read ``좋아요 최고``) and an unclosed quote swallowed the rows after it or failed with
    pandas' ``EOF inside string``."""
    rows = [
        ("1", '"좋아요" 최고'),
        ("2", '그냥 "보통" 이에요'),
        ("3", '"닫히지 않은 따옴표'),
        ("4", "다음 리뷰"),
        ("5", '""'),
    ]
    path = tmp_path / "ratings.tsv"
    path.write_text("id\tdocument\n" + "".join(f"{i}\t{text}\n" for i, text in rows), encoding="utf-8")
    table = read_text_table(path)
    assert table["document"].tolist() == [text for _, text in rows]
    cells = texts_as_written(read_raw_table(path), ["id"])["id"].tolist()
    assert cells == [i for i, _ in rows]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("spaces.csv", 'id,text,n\n1,"a"  ,1\n2,"b" ,"2"  \n'),
        ("spaces.tsv", 'id\ttext\tn\n1\t"a"  \t1\n2\t"b" \t"2"  \n'),
    ],
)
def test_spaces_after_a_closing_quote_are_no_broken_quoting(tmp_path, name, content):
    """A hand-edited file with spaces between a closing quote and the separator or line end is read as
    pandas reads it (the quotes taken as quoting), not refused."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert [text.strip() for text in read_text_table(path)["text"]] == ["a", "b"]


@pytest.mark.parametrize("sep", [",", "\t"])
def test_a_table_written_with_csv_quoting_reads_back_its_values(tmp_path, sep):
    """pandas' to_csv quotes a value holding the separator, a line end or a quote: read back as written."""
    values = ['he said "hi"', "a\tb", "two\nlines", "a, b", '"quoted whole"', "plain"]
    path = tmp_path / ("rows.csv" if sep == "," else "rows.tsv")
    pd.DataFrame({"id": range(len(values)), "text": values}).to_csv(path, sep=sep, index=False)
    assert read_text_table(path)["text"].tolist() == values


@pytest.mark.parametrize(
    ("content", "line", "said"),
    [
        ('id,text\n1,plain\n2,"좋아요" 최고\n3,next\n', 3, "a quoted value is followed by more text"),
        ('id,text\n1,plain\n2,"never closed\n3,next\n4,last\n', 3, "a quote opened here is never closed"),
    ],
    ids=["text_after_a_quoted_value", "unclosed_quote"],
)
def test_a_csv_whose_quoting_is_broken_is_refused_naming_the_line(tmp_path, content, line, said):
    """A CSV quotes values; a value that starts with a quote and goes on after the closing one, or a quote
    never closed, was read with its quotes dropped (``좋아요 최고``) or swallowed every later row into one
    text, or failed with pandas' ``EOF inside string``."""
    path = tmp_path / "broken.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert message.startswith(f"{path} line {line}: {said}") and "Fix: " in message and "\n" not in message


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("ratings.v2.txt", "tsv", "ratings.v2.tsv"),
        ("a.csv.gz", "tsv", "a.tsv.gz"),
        ("rows.tsv", "csv", "rows.csv"),
    ],
)
def test_a_rename_keeps_the_dots_of_a_name_and_its_compression(name, kind, expected):
    from pathlib import Path

    from fastlm.corpus.readers import renamed

    assert renamed(Path(name), kind) == expected


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_json_lines_files_saved_with_a_bom_and_joined_read_as_their_rows(tmp_path, suffix):
    """Exports saved as "UTF-8 with BOM" (Notepad, PowerShell, Excel) joined with ``cat``: every part's
    first line starts with a BOM. Read as the parts' rows, as each part alone is. Was: refused as "could not
    be read as jsonl: Expected object or value at position 0", naming no line, with a fix to check the
    file's extension."""
    parts = [
        [{"text": f"배송 빨라요 {part}-{i}", "id": 10 * part + i} for i in range(3)] for part in range(3)
    ]
    data = b"".join(
        "\ufeff".encode() + "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
        for rows in parts
    )
    path = tmp_path / f"joined{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    table = read_raw_table(path)
    assert table.to_dict("records") == [row for rows in parts for row in rows]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".csv.gz"])
@pytest.mark.parametrize("bom", ["", "\ufeff"])
def test_csv_files_joined_with_their_headers_read_as_their_rows_said_once(tmp_path, suffix, bom, caplog):
    """Exports joined with ``cat`` (Spark's part files, a day's file each), every part with its header (and
    a BOM where saved "UTF-8 with BOM"): each later header line is no row. Left out and said once, naming
    the file. Was: read as a row (a text "text", a pair ("dialogue", "summary")), cleaned (the BOM
    removed) and trained."""
    sep = "\t" if suffix == ".tsv" else ","
    parts = [
        [{"id": str(10 * part + i), "text": f"배송 빨라요 {part}-{i}"} for i in range(3)] for part in range(3)
    ]
    data = "".join(
        bom + f"id{sep}text\n" + "".join(f"{row['id']}{sep}{row['text']}\n" for row in rows) for rows in parts
    ).encode()
    path = tmp_path / f"joined{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with caplog.at_level(logging.WARNING):
        table = texts_as_written(read_raw_table(path), ["id", "text"])
    assert table.to_dict("records") == [row for rows in parts for row in rows]
    said = [record.getMessage() for record in caplog.records if "header" in record.getMessage()]
    assert len(said) == 1 and path.name in said[0] and "2 later lines" in said[0], said
