import gzip
import json

import datasets
import pandas as pd
import pytest

from fastlm.corpus.readers import read_text_table
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
    parts = datasets.DatasetDict({"a": datasets.Dataset.from_dict({"text": ROWS[:2]}),
                                  "b": datasets.Dataset.from_dict({"text": ROWS[2:]})})
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
    assert "\n" not in message


def test_plain_folder_is_refused(tmp_path):
    with pytest.raises(InputDataError, match="not a datasets.save_to_disk folder"):
        read_text_table(tmp_path)
