"""A folder put in place of another: one atomic exchange where the system has it, else two renames that put
the previous folder back when the second fails."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil

import pytest

from fastlm import temporary_files
from fastlm.engine.checkpoint import swap
from tests.support.renames import second_rename_fails


def _folders(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "a.txt").write_text("first", encoding="utf-8")
    (second / "b.txt").write_text("second", encoding="utf-8")
    return first, second


def test_exchange_swaps_two_folders_in_one_call(tmp_path):
    first, second = _folders(tmp_path)
    if not swap.exchange(first, second):
        pytest.skip("this system or filesystem has no atomic exchange (the two-rename path is tested below)")
    assert sorted(p.name for p in first.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in second.iterdir()) == ["a.txt"]
    assert (first / "b.txt").read_text(encoding="utf-8") == "second"


def _refusing(code):
    def renameat2(*args):
        ctypes.set_errno(code)
        return -1

    return renameat2


@pytest.mark.parametrize(
    "call",
    [None, _refusing(errno.EINVAL), _refusing(errno.ENOSYS), _refusing(errno.EOPNOTSUPP)],
    ids=["missing", "EINVAL", "ENOSYS", "EOPNOTSUPP"],
)
def test_exchange_says_no_where_the_call_is_missing_or_refused(tmp_path, monkeypatch, call):
    first, second = _folders(tmp_path)
    monkeypatch.setattr(swap, "_renameat2", call)
    assert swap.exchange(first, second) is False
    assert (first / "a.txt").is_file() and (second / "b.txt").is_file()  # nothing moved


def test_exchange_raises_any_other_error(tmp_path, monkeypatch):
    first, _ = _folders(tmp_path)
    monkeypatch.setattr(swap, "_renameat2", _refusing(errno.ENOENT))
    with pytest.raises(FileNotFoundError):
        swap.exchange(first, tmp_path / "absent")


def test_replacing_by_exchange_never_moves_the_target_away(tmp_path, monkeypatch):
    new, target = _folders(tmp_path)
    probes = [tmp_path / "probe-a", tmp_path / "probe-b"]
    for probe in probes:
        probe.mkdir()
    if not swap.exchange(*probes):
        pytest.skip("this system or filesystem has no atomic exchange")
    real_replace = os.replace

    def no_rename_of_the_target(source, destination):
        assert os.fspath(source) != os.fspath(target), "the target was renamed away: a window without it"
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", no_rename_of_the_target)
    previous = swap.replace_folder(new, target, tmp_path / "aside")
    assert (target / "a.txt").read_text(encoding="utf-8") == "first"
    assert previous is not None and (previous / "b.txt").read_text(encoding="utf-8") == "second"


def test_replacing_without_the_exchange_puts_the_previous_folder_back_when_the_second_rename_fails(
    tmp_path, monkeypatch
):
    new, target = _folders(tmp_path)
    second_rename_fails(monkeypatch)
    with pytest.raises(OSError, match="I/O error"):
        swap.replace_folder(new, target, tmp_path / "aside")
    assert (target / "b.txt").read_text(encoding="utf-8") == "second"
    assert not (tmp_path / "aside").exists() and (new / "a.txt").is_file()


def test_replacing_without_the_exchange_and_without_a_target(tmp_path, monkeypatch):
    new, target = _folders(tmp_path)
    monkeypatch.setattr(swap, "exchange", lambda first, second: False)
    previous = swap.replace_folder(new, target, tmp_path / "aside")
    assert (target / "a.txt").is_file() and (previous / "b.txt").is_file() and previous == tmp_path / "aside"
    shutil.rmtree(target)
    assert swap.replace_folder(previous, target, tmp_path / "aside2") is None
    assert (target / "b.txt").is_file()


def test_a_writer_tag_names_its_host_and_pid_and_an_old_tag_reads_as_this_hosts(monkeypatch):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "gpu node-7.cluster/x")
    tag = temporary_files.writer_tag()
    assert tag.startswith(f"gpu_node-7.cluster_x-{os.getpid()}-")
    assert temporary_files.tag_writer(tag) == ("gpu_node-7.cluster_x", os.getpid())
    assert temporary_files.tag_writer("4242-0a1b2c3d") == (
        "gpu_node-7.cluster_x",
        4242,
    )  # written before hosts were named
    assert temporary_files.tag_writer("node-1-4242-0a1b2c3d") == ("node-1", 4242)
    assert temporary_files.tag_writer("not a tag") is None
