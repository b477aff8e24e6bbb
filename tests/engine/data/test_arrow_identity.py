"""engine/data/arrow_identity.py: what a split holds, as a launched worker compares it with its launcher's:
its files (another inode for data written again, even alike), a digest of its buffers sampled past 256 KiB a
column (other tokens in a sampled place, another row selection), and at most a few hundred KiB read; two
copies of the same data (two nodes') hold the same content."""

from __future__ import annotations

import hashlib

import datasets
import numpy as np

from fastlm.engine.data import arrow_identity
from fastlm.engine.data.arrow_identity import content_of, identity_change, split_identity


def _saved(folder, rows) -> datasets.Dataset:
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder))


def test_the_same_rows_written_again_are_other_files_with_the_same_digest(tmp_path):
    rows = [[5, 6, 7, 2]] * 30
    first, again = split_identity(_saved(tmp_path / "a", rows)), split_identity(_saved(tmp_path / "b", rows))
    assert first["sha256"] == again["sha256"] and first["rows"] == again["rows"] == 30
    assert identity_change(first, again) == "its files are not those that were checked"
    assert identity_change(first, split_identity(_saved(tmp_path / "a2", rows))) is not None
    assert identity_change(first, first) is None


def test_two_copies_of_the_same_data_hold_the_same_content_and_other_rows_another(tmp_path):
    rows = [[5, 6, 7, 2]] * 30
    here, there = split_identity(_saved(tmp_path / "a", rows)), split_identity(_saved(tmp_path / "b", rows))
    assert here["files"] != there["files"] and content_of(here) == content_of(there)
    assert content_of(here) != content_of(split_identity(_saved(tmp_path / "c", rows[:29])))
    assert content_of(here) != content_of(split_identity(_saved(tmp_path / "d", [[5, 6, 8, 2]] * 30)))


def test_other_tokens_in_a_sampled_place_or_another_selection_change_the_digest(tmp_path):
    rows = np.arange(200_000, dtype=np.int32).reshape(-1, 50) % 400  # 800 KB of ids: sampled, not read whole
    base = datasets.Dataset.from_dict({"input_ids": rows.tolist()})
    edited = rows.copy()
    edited[-1, -1] += 1  # the last block always ends at the column's last byte
    assert split_identity(base) == split_identity(datasets.Dataset.from_dict({"input_ids": rows.tolist()}))
    changed = split_identity(datasets.Dataset.from_dict({"input_ids": edited.tolist()}))
    assert identity_change(split_identity(base), changed) == "its tokens are not those that were checked"
    picked, other = base.select(range(0, 4000, 2)), base.select(range(1, 4000, 2))
    assert split_identity(picked)["sha256"] != split_identity(other)["sha256"]
    assert (
        identity_change(split_identity(base), split_identity(picked))
        == "it holds 2000 rows, 4000 were checked"
    )


def test_a_large_split_is_read_a_few_blocks_a_column(tmp_path, monkeypatch):
    rows = (np.arange(2_000_000, dtype=np.int32).reshape(-1, 100) % 400).tolist()  # 8 MB of ids
    split = _saved(tmp_path / "large", rows)
    read, sha256 = [], hashlib.sha256

    class Counting:
        def __init__(self):
            self.inner = sha256()

        def update(self, data):
            read.append(len(data))
            self.inner.update(data)

        def hexdigest(self):
            return self.inner.hexdigest()

    monkeypatch.setattr(arrow_identity.hashlib, "sha256", Counting)
    split_identity(split)
    columns = len(split.column_names)
    assert sum(read) < columns * arrow_identity.BLOCKS * arrow_identity.BLOCK + 4096
