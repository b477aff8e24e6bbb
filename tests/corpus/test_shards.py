import gzip
import json
import logging
import os

import pandas as pd
import pytest

import fastlm.corpus.shards as shards
from fastlm.corpus.readers import read_text_table
from fastlm.corpus.shards import check_raw_path, read_raw_table, shard_files, shards_changed, shards_record
from fastlm.errors import InputDataError


def _rows(start: int, count: int) -> list[dict]:
    return [{"text": f"text {i}", "n": i} for i in range(start, start + count)]


def _jsonl(path, rows, compress=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    path.write_bytes(gzip.compress(data) if compress else data)


def _one_file(tmp_path, rows, name="whole.jsonl"):
    path = tmp_path / name
    _jsonl(path, rows)
    return read_text_table(path)


def test_a_folder_of_shards_reads_as_one_file_of_their_rows_in_path_order(tmp_path):
    folder = tmp_path / "shards"
    # written out of order: read in sorted path order, one compressed
    _jsonl(folder / "part-00002.jsonl", _rows(20, 5))
    _jsonl(folder / "part-00000.jsonl.gz", _rows(0, 10), compress=True)
    _jsonl(folder / "part-00001.jsonl", _rows(10, 10))
    table = read_raw_table(folder)
    expected = _one_file(tmp_path, _rows(0, 25))
    pd.testing.assert_frame_equal(table, expected)
    assert table.attrs["source_path"] == str(folder)
    assert [rows for _, rows in table.attrs["shards"]] == [10, 10, 5]


def test_a_recursive_glob_reads_matching_parquet_shards(tmp_path):
    for index, sub in enumerate(["b", "a"]):
        (tmp_path / "data" / sub).mkdir(parents=True)
        pd.DataFrame(_rows(index * 4, 4)).to_parquet(tmp_path / "data" / sub / f"train-{index}.parquet")
    table = read_raw_table(tmp_path / "data" / "**" / "*.parquet")
    expected = pd.concat([pd.DataFrame(_rows(4, 4)), pd.DataFrame(_rows(0, 4))], ignore_index=True)
    assert table["text"].tolist() == expected["text"].tolist()  # a/ before b/
    assert table["n"].tolist() == expected["n"].tolist()


def test_markers_and_other_files_in_a_folder_are_skipped_and_the_others_said(tmp_path, monkeypatch):
    folder = tmp_path / "spark"
    _jsonl(folder / "part-0.jsonl", _rows(0, 3))
    _jsonl(folder / "part-1.jsonl", _rows(3, 3))
    for name in ("_SUCCESS", ".part-0.jsonl.crc", "part-1.jsonl.crc", ".hidden.jsonl"):
        (folder / name).write_bytes(b"x")
    (folder / "README.md").write_text("# data\n")
    (folder / "sub").mkdir()
    logger = logging.Logger("shards-test")
    records = []
    logger.addHandler(logging.Handler())
    logger.handlers[0].emit = records.append
    monkeypatch.setattr(shards, "log", logger)
    assert [path.name for path in shard_files(folder)] == ["part-0.jsonl", "part-1.jsonl"]
    assert read_raw_table(folder)["n"].tolist() == list(range(6))
    said = " ".join(record.getMessage() for record in records)
    assert "README.md" in said and "_SUCCESS" not in said and "crc" not in said


def test_a_save_to_disk_folder_and_a_single_file_are_no_shards(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(tmp_path / "saved")
    _jsonl(tmp_path / "one.jsonl", _rows(0, 2))
    assert shard_files(tmp_path / "saved") is None and shard_files(tmp_path / "one.jsonl") is None
    assert read_raw_table(tmp_path / "saved")["text"].tolist() == ["a", "b"]
    pd.testing.assert_frame_equal(
        read_raw_table(tmp_path / "one.jsonl"), read_text_table(tmp_path / "one.jsonl")
    )


def _refusal(path) -> str:
    with pytest.raises(InputDataError) as raised:
        check_raw_path(path)
        read_raw_table(path)
    message = str(raised.value)
    assert "\n" not in message and "Fix:" in message, message
    return message


def test_a_shard_with_other_columns_is_refused_naming_it_and_the_difference(tmp_path):
    _jsonl(tmp_path / "s" / "a.jsonl", _rows(0, 2))
    _jsonl(tmp_path / "s" / "b.jsonl", [{"body": "x", "n": 1}])
    message = _refusal(tmp_path / "s")
    assert str(tmp_path / "s" / "b.jsonl") in message and "'body'" in message and "'text'" in message


def test_a_shard_of_another_format_is_refused_naming_it(tmp_path):
    _jsonl(tmp_path / "s" / "a.jsonl", _rows(0, 2))
    pd.DataFrame(_rows(2, 2)).to_parquet(tmp_path / "s" / "b.parquet")
    message = _refusal(tmp_path / "s")
    assert str(tmp_path / "s" / "b.parquet") in message and "parquet" in message and "jsonl" in message


@pytest.mark.parametrize("kind", ["empty folder", "no match", "only other files"])
def test_nothing_to_read_names_the_folder_or_pattern(tmp_path, kind):
    (tmp_path / "s").mkdir()
    if kind == "only other files":
        (tmp_path / "s" / "notes.md").write_text("x")
    path = tmp_path / "s" / "*.jsonl" if kind == "no match" else tmp_path / "s"
    message = _refusal(path)
    assert str(path) in message and "raw_path" in message


def test_an_error_inside_a_shard_names_the_shard_and_its_line(tmp_path):
    _jsonl(tmp_path / "s" / "a.jsonl", _rows(0, 3))
    (tmp_path / "s" / "b.jsonl").write_text('{"text": "x", "n": 1}\n{"text": \n')
    message = _refusal(tmp_path / "s")
    assert f"{tmp_path / 's' / 'b.jsonl'} line 2" in message


def test_shards_of_mixed_types_read_as_one_file_of_those_rows_does(tmp_path):
    _jsonl(tmp_path / "s" / "a.jsonl", [{"text": "a", "n": 1}])
    _jsonl(tmp_path / "s" / "b.jsonl", [{"text": 5, "n": "two"}])
    table = read_raw_table(tmp_path / "s")
    expected = _one_file(tmp_path, [{"text": "a", "n": 1}, {"text": 5, "n": "two"}])
    assert table["text"].tolist() == expected["text"].tolist()
    assert table["n"].tolist() == expected["n"].tolist()


def test_the_record_sees_a_shard_added_removed_or_changed_not_one_touched(tmp_path):
    folder = tmp_path / "s"
    for index in range(3):
        _jsonl(folder / f"p{index}.jsonl", _rows(index * 2, 2))
    record = shards_record(folder)
    assert shards_changed(folder, record) is None
    os.utime(folder / "p1.jsonl", (1_000_000_000, 1_000_000_000))
    assert shards_changed(folder, record) is None
    _jsonl(folder / "p3.jsonl", _rows(9, 1))
    assert "p3.jsonl" in shards_changed(folder, record)
    (folder / "p3.jsonl").unlink()
    (folder / "p2.jsonl").unlink()
    assert "p2.jsonl" in shards_changed(folder, record)
    _jsonl(folder / "p2.jsonl", _rows(4, 2))
    assert shards_changed(folder, record) is None
    _jsonl(folder / "p2.jsonl", _rows(5, 2))  # same size, other bytes
    assert "p2.jsonl" in shards_changed(folder, record)


def test_the_files_skipped_are_said_once_when_the_shards_are_read(tmp_path, monkeypatch):
    """A split checks the shards before the run, reads them and records them after it; a train compares the
    record: each listed the folder and said its skipped files again (three lines a split, two a train)."""
    folder = tmp_path / "shards"
    _jsonl(folder / "part-0.jsonl", _rows(0, 3))
    (folder / "README.md").write_text("# data\n")
    logger = logging.Logger("shards-once")
    records = []
    logger.addHandler(logging.Handler())
    logger.handlers[0].emit = records.append
    monkeypatch.setattr(shards, "log", logger)
    check_raw_path(folder)
    assert read_raw_table(folder)["n"].tolist() == list(range(3))
    recorded = shards_record(folder)
    assert shards_changed(folder, recorded) is None
    said = [record.getMessage() for record in records if "README.md" in record.getMessage()]
    assert len(said) == 1, said


def test_a_glob_written_with_backslashes_is_refused_naming_it_with_slashes(tmp_path, monkeypatch):
    """``raw_path=data\\01_raw\\shards\\*.jsonl`` (a Windows path) matches nothing here: the refusal said to
    check the path, not that a backslash is no folder separator."""
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "data/01_raw/shards/part-0.jsonl", _rows(0, 3))
    with pytest.raises(InputDataError) as refused:
        check_raw_path("data\\01_raw\\shards\\*.jsonl")
    assert "raw_path='data/01_raw/shards/*.jsonl'" in str(refused.value), str(refused.value)
    assert read_raw_table("data/01_raw/shards/*.jsonl")["n"].tolist() == list(range(3))


def test_a_glob_through_a_folder_named_in_another_normalization_names_the_folder_and_the_rename(
    tmp_path, monkeypatch
):
    """``raw_path='data/01_raw/리뷰/*.jsonl'`` typed composed where the folder, copied from macOS, is named
    decomposed: `no data file matches the glob` for a folder `ls` shows under that very name."""
    import unicodedata

    monkeypatch.chdir(tmp_path)
    decomposed = unicodedata.normalize("NFD", "리뷰")
    _jsonl(tmp_path / "raw" / decomposed / "part-0.jsonl", _rows(0, 3))
    with pytest.raises(InputDataError) as refused:
        check_raw_path("raw/리뷰/*.jsonl")
    message = str(refused.value)
    assert f"raw/{decomposed} is there" in message and f"os.rename('raw/{decomposed}', 'raw/리뷰')" in message


def test_a_changed_file_of_the_same_size_is_said_so():
    """A raw file reordered (or edited byte for byte) keeps its size: the refusal said
    ``(2946814 -> 2946814 bytes)``, which reads as no change. Now "same size, other contents"."""
    from fastlm.corpus.shards import size_change

    assert size_change(2946814, 2946814) == "same size, 2946814 bytes, other contents"
    assert size_change(10, 12) == "10 -> 12 bytes"
    assert size_change(None, 12) == "12 bytes now"


def test_a_file_rewritten_with_its_size_and_time_kept_is_changed(tmp_path):
    """Other bytes of the same size whose modification time was put back (``touch -r``, ``cp -p`` or
    ``rsync -t`` of another version, a rewrite within a coarse clock's tick) read as the file the split
    read: the record's size and time alone were compared, and train and the report used the old texts."""
    from fastlm.corpus.shards import file_changed, file_record

    folder = tmp_path / "s"
    _jsonl(folder / "p0.jsonl", _rows(0, 3))
    raw, before = folder / "p0.jsonl", (folder / "p0.jsonl").stat()
    recorded, shards = file_record(raw, "p0.jsonl"), shards_record(folder)
    _jsonl(raw, _rows(1, 3))  # "text 1".."text 3": the same size, other texts
    os.utime(raw, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (raw.stat().st_size, raw.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert file_changed(raw, recorded)
    assert "p0.jsonl changed (same size" in shards_changed(folder, shards)
    _jsonl(raw, _rows(0, 3))  # the old bytes back, touched: the same file
    os.utime(raw, (1_000_000_000, 1_000_000_000))
    assert not file_changed(raw, recorded)
    assert shards_changed(folder, shards) is None


def test_a_folder_of_txt_shards_reads_one_text_a_line_and_a_txt_beside_other_shards_is_skipped(tmp_path):
    """Text files are shards where the folder holds no other data file; beside JSON Lines or Parquet shards
    a .txt (notes, a licence) is no data and said skipped, as a README.md is."""
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "b.txt").write_text("three\nfour\n", encoding="utf-8")
    (tmp_path / "lines" / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    assert read_raw_table(tmp_path / "lines")["text"].tolist() == ["one", "two", "three", "four"]
    _jsonl(tmp_path / "mixed" / "part-0.jsonl", _rows(0, 3))
    (tmp_path / "mixed" / "LICENSE.txt").write_text("a licence\n", encoding="utf-8")
    assert [path.name for path in shard_files(tmp_path / "mixed")] == ["part-0.jsonl"]
    assert read_raw_table(tmp_path / "mixed")["n"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_shard_holding_no_rows_once_decompressed_is_skipped_as_an_empty_file_is(tmp_path, monkeypatch, fmt):
    """A writer's empty partition, compressed (a gzip of nothing is 20 bytes) or of blank lines, is a shard of
    no rows, as an empty file is: skipped and said. It was refused as a shard lacking the first shard's
    columns (JSON Lines) or as a file that could not be read as csv, so the folder could not be split."""
    folder = tmp_path / "shards"
    folder.mkdir()
    frame = pd.DataFrame(_rows(0, 6))

    def write(name, rows, compress):
        data = rows.to_csv(index=False).encode() if fmt == "csv" else b""
        if fmt == "jsonl":
            data = "".join(json.dumps(row) + "\n" for row in rows.to_dict("records")).encode()
        (folder / name).write_bytes(gzip.compress(data) if compress else data)

    (folder / f"part-0.{fmt}.gz").write_bytes(gzip.compress(b""))  # the first shard empty: columns come later
    write(f"part-1.{fmt}", frame.iloc[:3], compress=False)
    (folder / f"part-2.{fmt}.gz").write_bytes(gzip.compress(b""))
    (folder / f"part-3.{fmt}").write_bytes(b"\n\n")
    write(f"part-4.{fmt}.gz", frame.iloc[3:], compress=True)
    logger = logging.Logger("shards-empty")
    records = []
    logger.addHandler(logging.Handler())
    logger.handlers[0].emit = records.append
    monkeypatch.setattr(shards, "log", logger)
    check_raw_path(folder)
    table = read_raw_table(folder)
    assert table["text"].tolist() == frame["text"].astype(str).tolist()
    assert [rows for _, rows in table.attrs["shards"]] == [3, 3]
    said = " ".join(record.getMessage() for record in records)
    assert f"part-0.{fmt}.gz (no rows)" in said and f"part-2.{fmt}.gz (no rows)" in said, said
    assert f"part-3.{fmt} (no rows)" in said, said


def test_shards_that_all_hold_no_rows_are_refused_naming_the_folder(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "part-0.jsonl.gz").write_bytes(gzip.compress(b""))
    (folder / "part-1.jsonl").write_bytes(b"\n")
    message = _refusal(folder)
    assert str(folder) in message and "no rows" in message and "column" not in message, message
