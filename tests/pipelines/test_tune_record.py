"""What a tune measured on (the tuned file's record) and the train run's check of it."""

import os

import torch

from fastlm.engine.config import TrainParams
from fastlm.pipelines.tune.record import measured_on, tuned_leaves, what_changed, without_tuned
from tests.support.tiny_llama import rewrite_weights_keeping_time


def record(train: dict | None = None, max_length: int = 48, data: str = "abc", device: str = "cpu") -> dict:
    return measured_on(
        TrainParams.model_validate(train or {}), max_length=max_length, data=data, device=device
    )


def test_the_record_is_the_same_for_the_same_settings_and_names_what_changed():
    assert what_changed(record(), record()) is None
    changed = what_changed(record(), record(max_length=96))
    assert "split.max_length" in changed and "48" in changed and "96" in changed
    assert "tokenized data" not in changed
    lora = what_changed(record(), record({"model": {"lora": {"enabled": True}}}))
    assert "train.model.lora.enabled" in lora
    assert "train.runtime.precision" in what_changed(record(), record({"runtime": {"precision": "fp32"}}))
    assert "device" in what_changed(record(), record(device="cuda (NVIDIA A10, 22 GiB)"))
    # where the model may come from changes nothing measured
    assert what_changed(record(), record({"model": {"allow_download": True}})) is None


def test_a_file_without_a_record_is_stale():
    assert "older version" in what_changed(None, record())


def test_retrained_weights_in_the_same_folder_change_the_record(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"1234")
    before = record({"model": {"name_or_path": str(tmp_path)}})
    (tmp_path / "model.safetensors").write_bytes(b"123456")
    stat = (tmp_path / "model.safetensors").stat()
    os.utime(tmp_path / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    after = record({"model": {"name_or_path": str(tmp_path)}})
    assert "model weights" in what_changed(before, after)


def test_without_the_tuned_file_each_setting_goes_back_to_the_other_files_or_the_default():
    tuned = {"train": {"batching": {"mode": "length_grouped", "micro_batch_size": 4}}}
    merged = {"batching": {"mode": "length_grouped", "micro_batch_size": 4}, "seed": 3}
    base = {"train": {"batching": {"micro_batch_size": 32}, "seed": 3}}
    back = without_tuned(merged, tuned_leaves(tuned), other_files=[base], given=None)
    assert back == {"batching": {"micro_batch_size": 32}, "seed": 3}  # mode: no file sets it, the default
    given = {"train": {"batching": {"micro_batch_size": 2}}}
    kept = without_tuned(
        {**merged, "batching": {"micro_batch_size": 2}}, tuned_leaves(tuned), other_files=[base], given=given
    )
    assert kept["batching"]["micro_batch_size"] == 2


def test_a_model_folder_named_relative_or_absolute_is_the_same_record(tmp_path, monkeypatch):
    """``base_model``, ``./base_model`` and its absolute path name one folder: a tune with one and a train
    with another measured the same model (it refused the file as measured on other settings)."""
    (tmp_path / "base_model").mkdir()
    (tmp_path / "base_model" / "model.safetensors").write_bytes(b"1234")
    monkeypatch.chdir(tmp_path)
    named = [record({"model": {"name_or_path": name}}) for name in ("base_model", "./base_model")]
    absolute = record({"model": {"name_or_path": str(tmp_path / "base_model")}})
    assert what_changed(named[0], named[1]) is None and what_changed(named[0], absolute) is None
    other = tmp_path / "other_model"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"1234")
    moved = record({"model": {"name_or_path": str(other)}})
    assert "train.model.name_or_path" in what_changed(named[0], moved)
    hub = record({"model": {"name_or_path": "org/model"}})  # no such folder: a hub id, kept as written
    assert hub["train.model.name_or_path"] == "org/model"


def test_settings_a_run_ignores_are_no_change(tmp_path):
    """The from-scratch shape (``hidden_size``, ...) is ignored with ``name_or_path``, and the adapter's
    settings with LoRA off: a change of one of them made a tuned file measured on the same run stale (its
    micro-batch not applied). A change the run trains with is still named."""
    (tmp_path / "model.safetensors").write_bytes(b"1234")
    pretrained = {"model": {"name_or_path": str(tmp_path)}}
    wider = {"model": {"name_or_path": str(tmp_path), "hidden_size": 256, "num_hidden_layers": 4}}
    assert what_changed(record(pretrained), record(wider)) is None
    assert "train.model.hidden_size" in what_changed(record(), record({"model": {"hidden_size": 256}}))
    assert what_changed(record(), record({"model": {"lora": {"r": 8}}})) is None
    lora = {"model": {"name_or_path": str(tmp_path), "lora": {"enabled": True}}}
    rank = {"model": {"name_or_path": str(tmp_path), "lora": {"enabled": True, "r": 8}}}
    assert "train.model.lora.r" in what_changed(record(lora), record(rank))


def test_weights_replaced_with_their_size_and_time_put_back_change_the_identity(tmp_path):
    """A weight file replaced by one of the same size whose modification time is put back (``cp -p``,
    ``rsync -t``, ``os.utime``): another identity, as the raw data's record sees it (status-change time and
    inode beside size and time, ``corpus.shards.file_state``). (Names, sizes and modification times alone
    took it for the same weights: a sweep kept its runs, a tuned file was applied.) Untouched: the same."""
    from fastlm.pipelines.tune.record import weights_identity

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"1234")
    before = weights_identity(str(tmp_path))
    assert weights_identity(str(tmp_path)) == before
    stat = weights.stat()
    (tmp_path / "new.tmp").write_bytes(b"abcd")
    os.replace(tmp_path / "new.tmp", weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert weights_identity(str(tmp_path)) != before


def test_a_copied_base_folder_keeps_its_weights_identity_and_rewritten_weights_lose_it(tmp_path):
    """Round twenty: the weights identity digested each weight file's inode and status-change time, so a base
    folder copied or restored (``cp -r``: new inodes, the same weights) was other weights: a sweep trained its
    runs again and a tuned file was set aside. It is the weights' content now (every tensor's dtype, shape
    and sampled bytes, ``base_digest.json``'s digest): a copy keeps it, other weights written in place with
    the file's size and time put back change it."""
    import shutil

    from safetensors.torch import save_file

    from fastlm.pipelines.tune.record import weights_identity

    base = tmp_path / "base"
    base.mkdir()
    generator = torch.Generator().manual_seed(0)
    tensors = {"embed": torch.randn(300, 64, generator=generator), "norm": torch.ones(64)}
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    before = weights_identity(str(base))
    shutil.copytree(base, tmp_path / "copy")
    assert weights_identity(str(tmp_path / "copy")) == before
    rewrite_weights_keeping_time(base)
    assert weights_identity(str(base)) != before


def test_a_record_under_a_memory_limit_holds_it_and_one_without_holds_what_it_held_before():
    """``tune.memory_limit_gb`` and the float8 tensor cores measured with (where float8 may train) are
    recorded under a limit only: a record without a limit has the keys it had (files of older versions
    compare equal). A hand-edited limit of another type is one line naming the key."""
    import pytest

    from fastlm.errors import ConfigError
    from fastlm.pipelines.tune.record import (
        FLOAT8_KEY,
        LIMIT_KEY,
        RECORD_KEY,
        check_tuned_file,
        measured_on,
    )

    train = TrainParams.model_validate({})
    plain = measured_on(train, max_length=48, data="abc", device="cpu")
    assert LIMIT_KEY not in plain and FLOAT8_KEY not in plain
    limited = measured_on(
        train, max_length=48, data="abc", device="cuda (X, 79 GiB)", memory_limit_gb=24, float8_cores=True
    )
    assert limited[LIMIT_KEY] == 24 and limited[FLOAT8_KEY] is True
    assert {key: value for key, value in limited.items() if key not in (LIMIT_KEY, FLOAT8_KEY)} == {
        **plain,
        "device": "cuda (X, 79 GiB)",
    }
    off = TrainParams.model_validate({"runtime": {"float8": "off"}})
    assert FLOAT8_KEY not in measured_on(off, max_length=48, data="abc", device="cuda", memory_limit_gb=24)
    for key, bad in ((LIMIT_KEY, "24"), (LIMIT_KEY, True), (FLOAT8_KEY, "yes")):
        with pytest.raises(ConfigError, match=f"{RECORD_KEY}.{key}"):
            check_tuned_file("t.yml", {RECORD_KEY: {**limited, key: bad}})
