"""TokenSequences: sample i is a zero-copy view of one flat array, built from Arrow without Python loops,
with prompt lengths handed to collators and counted out of the targets."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from fastlm.engine.data.token_dataset import TokenSequences


def test_samples_are_views_of_the_flat_array_with_their_counts():
    data = TokenSequences(np.arange(10, 19), np.array([0, 4, 5, 9]))
    assert len(data) == 3 and data.lengths.tolist() == [4, 1, 4]
    assert data[0].tolist() == [10, 11, 12, 13] and data[2].tolist() == [15, 16, 17, 18]
    assert data[0].dtype == np.int32 and np.shares_memory(data[0], data.values)
    assert data.num_tokens == 9 and data.num_target_tokens == 3 + 0 + 3
    assert [row.tolist() for row in data.__getitems__([2, 1])] == [[15, 16, 17, 18], [14]]


def test_prompt_lengths_go_to_collators_and_out_of_the_targets():
    data = TokenSequences(np.arange(8), np.array([0, 5, 8]), np.array([2, 0]))
    fetched = data.__getitems__([0, 1])
    assert fetched[0]["input_ids"].tolist() == [0, 1, 2, 3, 4] and fetched[0]["prompt_length"] == 2
    assert data[1].tolist() == [5, 6, 7]  # plain indexing is always the ids
    assert data.num_target_tokens == (5 - 2) + (3 - 1)  # a prompt of 0 still leaves the first token out
    with pytest.raises(ValueError, match="shorter than its sample"):
        TokenSequences(np.arange(8), np.array([0, 5, 8]), np.array([5, 0]))


def test_from_arrow_matches_the_rows_and_follows_a_sliced_table():
    rows = [[1, 2, 3], [4], [5, 6]]
    table = pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32())), "prompt_length": [1, 0, 1]})
    data = TokenSequences.from_arrow(table)
    assert [data[i].tolist() for i in range(len(data))] == rows
    assert data.prompt_lengths.tolist() == [1, 0, 1]
    tail = TokenSequences.from_arrow(table.slice(1))
    assert [tail[i].tolist() for i in range(len(tail))] == rows[1:]
    empty = TokenSequences.from_arrow(table.slice(0, 0).select(["input_ids"]))
    assert len(empty) == 0 and empty.num_tokens == 0


@pytest.mark.parametrize("span", [[1, 2**32 + 3], [-(2**32) + 1, 3]])
def test_answer_spans_beyond_int32_are_refused_not_wrapped_into_the_prompt(span):
    """Spans are kept as int32: a wider value (an Arrow list<int64> column) wrapped silently into the prompt,
    so a span far outside it trained tokens it never named; it is refused as any span outside the prompt."""
    ids, offsets, prompts = np.arange(20), np.array([0, 10, 20]), np.array([6, 6])
    with pytest.raises(ValueError, match="inside its prompt"):
        TokenSequences(
            ids, offsets, prompts, answer_spans=(np.array(span, dtype=np.int64), np.array([0, 2, 2]))
        )
    table = pa.table(
        {
            "input_ids": [list(range(10)), list(range(10, 20))],
            "prompt_length": pa.array(prompts, type=pa.int32()),
            "answer_spans": pa.array([span, []], type=pa.list_(pa.int64())),
        }
    )
    with pytest.raises(ValueError, match="inside its prompt"):
        TokenSequences.from_arrow(table)


def test_a_loader_worker_keeps_the_rows_read_when_the_folder_is_written_again(tmp_path):
    """DataLoader workers get the samples as numpy arrays (pickled by value, or shared by a fork), never as
    the Arrow files' paths: a split written again after the samples were read leaves a worker's rows as
    they were."""
    import pickle
    import shutil

    import datasets

    folder = tmp_path / "split"
    datasets.Dataset.from_dict({"input_ids": [[5, 6, 7, 2]] * 8}).save_to_disk(str(folder))
    samples = TokenSequences.from_arrow(datasets.load_from_disk(str(folder)))
    shutil.rmtree(folder)
    datasets.Dataset.from_dict({"input_ids": [[9, 9, 9, 2]] * 8}).save_to_disk(str(folder))
    assert pickle.loads(pickle.dumps(samples))[3].tolist() == [5, 6, 7, 2]
