"""The split on raw data held as shards (a folder or a glob): the same splits as one file of those rows, and
the split's record of its raw data seeing a shard added, removed or changed (not one touched)."""

import json
import os

import pandas as pd
import pytest

from fastlm.corpus.readers import read_text_table
from fastlm.corpus.split_steps import split_fingerprint
from fastlm.datasets import TextCorpusDataset
from fastlm.errors import InputDataError, StaleDataError
from fastlm.hooks.split_complete import check_raw_unchanged, raw_record
from fastlm.parameters import parse_group
from fastlm.pipelines.split import nodes
from tests.support.project import write_jsonl

PARAMS = {"ratios": {"train": 0.8, "validation": 0.1, "test": 0.1}, "max_length": 24}


def _shards(folder, texts, count):
    size = -(-len(texts) // count)
    for index in range(count):
        write_jsonl(folder / f"part-{index:05d}.jsonl", texts[index * size : (index + 1) * size])


def test_shards_split_as_one_file_of_their_rows(tmp_path, sample_texts):
    texts = sample_texts + sample_texts[:20]  # duplicates across shards are dropped as in one file
    _shards(tmp_path / "shards", texts, 7)
    (tmp_path / "shards" / "_SUCCESS").write_bytes(b"")
    write_jsonl(tmp_path / "whole.jsonl", texts)
    results = []
    for path in (tmp_path / "shards", tmp_path / "shards" / "*.jsonl", tmp_path / "whole.jsonl"):
        dataset = TextCorpusDataset(str(path))
        dataset.check_input()
        assert dataset.exists()
        clean, counts = nodes.clean_corpus(dataset.load(), PARAMS)
        splits, _ = nodes.split_corpus(clean, counts, PARAMS)
        results.append((splits.reset_index(drop=True), counts))
    for splits, counts in results[:2]:
        pd.testing.assert_frame_equal(splits, results[2][0])
        assert counts["dropped"] == results[2][1]["dropped"] and counts["raw_rows"] == len(texts)


def test_a_glob_matching_nothing_is_refused_before_the_run(tmp_path):
    dataset = TextCorpusDataset(str(tmp_path / "shards" / "*.parquet"))
    assert not dataset.exists()
    with pytest.raises(InputDataError, match=r"no data file .* matches the glob .*\*\.parquet"):
        dataset.check_input()


def _marker(tmp_path, raw) -> tuple:
    marker = tmp_path / "split_complete.json"
    marker.write_text(json.dumps({"outputs": [], "raw": raw_record(raw)}), encoding="utf-8")
    return marker


@pytest.mark.parametrize("glob", [False, True])
def test_the_split_record_sees_shards_added_removed_or_changed_not_touched(tmp_path, sample_texts, glob):
    folder = tmp_path / "shards"
    _shards(folder, sample_texts[:30], 3)
    marker = _marker(tmp_path, folder / "*.jsonl" if glob else folder)
    check_raw_unchanged(marker, None, None)
    os.utime(folder / "part-00001.jsonl", (1_000_000_000, 1_000_000_000))
    check_raw_unchanged(marker, None, None)  # touched, not changed
    kept = (folder / "part-00002.jsonl").read_bytes()
    for change in ("added", "removed", "changed"):
        if change == "added":
            write_jsonl(folder / "part-00003.jsonl", ["one more"])
        elif change == "removed":
            (folder / "part-00003.jsonl").unlink()
            (folder / "part-00002.jsonl").unlink()
        else:
            (folder / "part-00002.jsonl").write_bytes(kept.replace(b"a", b"b", 1))
        shard = "part-00003" if change == "added" else "part-00002"
        with pytest.raises(StaleDataError, match=f"{shard}.jsonl {change}.*kedro run --pipeline=split"):
            check_raw_unchanged(marker, None, None)
    (folder / "part-00002.jsonl").write_bytes(kept)  # put back as it was
    check_raw_unchanged(marker, None, None)


def test_a_single_file_record_is_kept(tmp_path, sample_texts):
    raw = write_jsonl(tmp_path / "one.jsonl", sample_texts[:10])
    record = raw_record(raw)
    assert "shards" not in record and record["size"] == raw.stat().st_size
    assert read_text_table(raw).attrs["source_path"] == str(raw)


@pytest.mark.parametrize("kind", ["pretokenized", "messages", "tools", "sharegpt"])
def test_a_bad_row_is_named_by_its_shard_and_its_row_there(tmp_path, kind):
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    good = {"pretokenized": {"ids": [1, 2, 3]}, "messages": chat, "tools": chat, "sharegpt": chat}[kind]
    bad = {
        "pretokenized": {"ids": [1, 99]},
        "messages": {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": 7}]},
        "tools": {**good, "tools": "not json"},
        "sharegpt": {"messages": [{"from": "human", "value": "hi"}, {"from": "bing", "value": "yo"}]},
    }[kind]
    if kind == "tools":
        good = {**good, "tools": None}
    if kind == "messages":  # no chat left: the first malformed one is named
        good = {"messages": None}
    (tmp_path / "s").mkdir()
    for name, rows in (("a", [good] * 4), ("b", [good, good, bad])):
        (tmp_path / "s" / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    params = {
        "pretokenized": {"pretokenized": True, "vocab_size": 16},
        "messages": {"messages_column": "messages", "chat_template": False},
        "tools": {"messages_column": "messages", "tools_column": "tools", "chat_template": False},
        "sharegpt": {"messages_column": "messages", "chat_template": False},
    }[kind]
    with pytest.raises(InputDataError) as raised:
        nodes.clean_corpus(TextCorpusDataset(str(tmp_path / "s")).load(), {**PARAMS, **params})
    assert f"{tmp_path / 's' / 'b.jsonl'} row 3" in str(raised.value), str(raised.value)


def _split_hook_catalog(raw: str):
    """The project's catalog (conf/base/catalog.yml) with ``raw_path`` as ``raw``, as a run builds it."""
    import yaml
    from kedro.io import DataCatalog

    from tests.support.project import PROJECT_ROOT

    config = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text(encoding="utf-8"))
    config["raw_corpus"]["filepath"] = raw
    return DataCatalog.from_config(config)


@pytest.mark.parametrize("raw", ["data/**/*.parquet", "data/03_primary"])
def test_shards_that_are_outputs_of_the_project_are_refused_before_the_split(
    tmp_path, monkeypatch, sample_texts, raw
):
    """``raw_path='data/**/*.parquet'`` (or a folder of outputs) after a split: the glob matched the split's
    own ``data/03_primary/corpus_splits.parquet``, which the split then read as raw data and split again;
    beside real shards it was refused as a shard with other columns, not as an output."""
    from fastlm.errors import ConfigError
    from fastlm.hooks.split_complete import SplitCompleteHook
    from fastlm.pipelines.split import create_pipeline

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data/03_primary").mkdir(parents=True)
    frame = pd.DataFrame({"text": sample_texts[:20], "split": "train"})
    frame.to_parquet(tmp_path / "data/03_primary/corpus_splits.parquet")
    catalog = _split_hook_catalog(raw)
    TextCorpusDataset(raw).check_input()  # readable shards: what the split read
    with pytest.raises(ConfigError, match=r"corpus_splits\.parquet.*corpus_splits.*output") as refused:
        SplitCompleteHook().before_pipeline_run({}, create_pipeline(), catalog)
    assert "\n" not in str(refused.value) and "raw_path" in str(refused.value)
    (tmp_path / "data/01_raw/pq").mkdir(parents=True)
    frame.to_parquet(tmp_path / "data/01_raw/pq/train-0.parquet")
    SplitCompleteHook().before_pipeline_run(
        {}, create_pipeline(), _split_hook_catalog("data/01_raw/**/*.parquet")
    )


@pytest.mark.parametrize("kind", ["file", "folder", "glob"])
def test_the_fix_for_changed_raw_data_splits_the_raw_data_the_split_read(
    tmp_path, monkeypatch, sample_texts, kind
):
    """The fix said `kedro run --pipeline=split` alone: that split reads the catalog's default raw_path (the
    demo corpus), not the file, folder or glob this split read, and the train after it trained on it."""
    import shlex

    monkeypatch.chdir(tmp_path)
    _shards(tmp_path / "shards", sample_texts[:30], 2)
    raw = {"file": "shards/part-00000.jsonl", "folder": "shards", "glob": "shards/*.jsonl"}[kind]
    marker = _marker(tmp_path, tmp_path / raw)
    write_jsonl(tmp_path / "shards/part-00000.jsonl", ["changed"])
    with pytest.raises(StaleDataError) as refused:
        check_raw_unchanged(marker, None, None)
    assert f"kedro run --pipeline=split --params raw_path={shlex.quote(raw)}" in str(refused.value)


def test_raw_path_naming_the_same_shards_another_way_is_the_split_s_raw_data(
    tmp_path, monkeypatch, sample_texts
):
    """The split read the folder ``shards``; ``kedro run --pipeline=train --params raw_path='shards/*.jsonl'``
    (the same shards, as a glob) was refused as another raw path than the split read; one naming other
    shards still is."""
    from fastlm.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    _shards(tmp_path / "shards", sample_texts[:30], 3)
    marker = _marker(tmp_path, tmp_path / "shards")
    for given in ("shards/*.jsonl", str(tmp_path / "shards/part-*.jsonl"), "shards/"):
        check_raw_unchanged(marker, given, tmp_path / given)
    with pytest.raises(ConfigError, match="raw_path names shards/part-0000\\[01\\]"):
        check_raw_unchanged(marker, "shards/part-0000[01].jsonl", tmp_path / "shards/part-0000[01].jsonl")


def test_csv_shards_of_numbers_split_as_one_file_of_their_rows_as_written(tmp_path):
    """A folder of CSV shards whose answer column is numbers alone in one shard (read by pandas as numbers)
    and mixed with words in another: every answer is the text the shards write ("007", "1e3"), the splits
    those of one file of the same rows, and a re-read gives the same fingerprint."""
    questions = [f"How many stones are in pile {i}?" for i in range(40)]
    answers = [["42", "1e3", "007", "-3.50", "12"][i % 5] for i in range(39)] + ["a dozen"]
    (tmp_path / "shards").mkdir()
    whole = pd.DataFrame({"question": questions, "answer": answers})
    whole[:25].to_csv(tmp_path / "shards" / "part-0.csv", index=False)  # numbers alone
    whole[25:].to_csv(tmp_path / "shards" / "part-1.csv", index=False)  # "a dozen" among them
    whole.to_csv(tmp_path / "whole.csv", index=False)
    params = {
        **PARAMS,
        "prompt_column": "question",
        "response_column": "answer",
        "tokenizer": {"vocab_size": 300},
    }
    results = []
    for path in (
        tmp_path / "shards",
        tmp_path / "shards" / "*.csv",
        tmp_path / "whole.csv",
        tmp_path / "shards",
    ):
        clean, counts = nodes.clean_corpus(TextCorpusDataset(str(path)).load(), params)
        assert counts["dropped"]["non_string"] == 0 and list(clean["response"]) == answers
        splits, split_counts = nodes.split_corpus(clean, counts, params)
        results.append(splits.reset_index(drop=True))
    for splits in results[1:]:
        pd.testing.assert_frame_equal(splits, results[0])
    tokenizer = nodes.build_tokenizer(results[0], params)
    first, second = (
        split_fingerprint(splits, tokenizer, parse_group("split", params))["fingerprint"]
        for splits in (results[0], results[3])
    )
    assert first == second


def test_a_raw_file_changed_while_the_split_runs_is_stale_data(tmp_path, monkeypatch, sample_texts):
    """The raw file edited after the split read it, before the split finished (a long split, an export still
    writing the file): the record was taken of the file as it was when the split finished, so train and
    the report took the splits of the old texts for the new file's."""
    from fastlm.hooks.split_complete import SplitCompleteHook
    from fastlm.pipelines.split import create_pipeline

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data/05_model_input").mkdir(parents=True)
    write_jsonl(tmp_path / "data/01_raw/corpus.jsonl", sample_texts[:20])
    hook, pipeline = SplitCompleteHook(), create_pipeline()
    catalog = _split_hook_catalog("data/01_raw/corpus.jsonl")
    hook.before_pipeline_run({}, pipeline, catalog)  # then clean_corpus reads the file
    write_jsonl(tmp_path / "data/01_raw/corpus.jsonl", sample_texts[:21])  # a row more, as the split runs
    for node in pipeline.nodes:
        hook.after_node_run(node)
        for output in node.outputs:
            hook.after_dataset_saved(output)
    marker = tmp_path / "data/05_model_input/split_complete.json"
    assert "tokenized_corpus" in json.loads(marker.read_text(encoding="utf-8"))["outputs"]
    with pytest.raises(StaleDataError, match="data/01_raw/corpus.jsonl changed since the split"):
        check_raw_unchanged(marker, None, None)
