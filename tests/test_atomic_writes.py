"""Folders and files written atomically (``fastlm.datasets.atomic_folder``, ``atomic_file``): a run killed
between the two renames of a folder's swap leaves the new copy recovered on the next load or write, and
what a killed writer left beside its target is removed by the next write once its process is gone."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastlm.datasets.atomic_folder import write_folder_atomically
from fastlm.datasets.pretrained_model import PretrainedModelDataset
from fastlm.engine.checkpoint import swap
from fastlm.engine.checkpoint.storage import StorageError
from fastlm.errors import find_user_error
from fastlm.temporary_files import write_file_atomically
from tests.support.disk_full import write_stops_part_way
from tests.support.project import catalog_dataset
from tests.support.renames import second_rename_fails

DAY = 24 * 3600


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def _model_folder(folder, version: str):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"version": version}), encoding="utf-8")
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    return folder


def _writing(version: str):
    def write(folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"version": version}), encoding="utf-8")

    return write


def _version(folder) -> str:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))["version"]


def test_a_folder_replaced_with_the_exchange_is_never_missing(tmp_path, monkeypatch):
    probes = [tmp_path / "probe-a", tmp_path / "probe-b"]
    for probe in probes:
        probe.mkdir()
    if not swap.exchange(*probes):
        pytest.skip("this system or filesystem has no atomic exchange")
    target = _model_folder(tmp_path / "model", "old")
    real_replace = os.replace

    def no_rename_of_the_target(source, destination):
        assert os.fspath(source) != os.fspath(target), "the target was renamed away: a window without it"
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", no_rename_of_the_target)
    write_folder_atomically(target, _writing("new"))
    assert _version(target) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "probe-a", "probe-b"]


def test_without_the_exchange_a_failed_second_rename_keeps_the_previous_folder(tmp_path, monkeypatch):
    target = _model_folder(tmp_path / "model", "old")
    second_rename_fails(monkeypatch)
    with pytest.raises(OSError):
        write_folder_atomically(target, _writing("new"))
    assert _version(target) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def _cut_between_the_renames(tmp_path, pid: int):
    """What a run killed between the two renames of the swap leaves: no model folder, the previous copy
    moved aside, the new one complete beside it."""
    tag = f"{pid}-0a1b2c3d"
    _model_folder(tmp_path / f".model.old-{tag}", "old")
    _model_folder(tmp_path / f".model.tmp-{tag}", "new")
    return tmp_path / "model"


def test_a_swap_cut_between_its_renames_is_recovered_when_the_model_is_loaded(tmp_path, caplog):
    target = _cut_between_the_renames(tmp_path, _dead_pid())
    with caplog.at_level(logging.WARNING, logger="fastlm.datasets.atomic_folder"):
        assert PretrainedModelDataset(str(target)).exists()
    assert _version(target) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    lines = [r.getMessage() for r in caplog.records if r.name == "fastlm.datasets.atomic_folder"]
    assert len(lines) == 1 and "model" in lines[0] and "recovered" in lines[0], lines


def test_a_swap_cut_between_its_renames_is_recovered_before_the_next_write(tmp_path):
    target = _cut_between_the_renames(tmp_path, _dead_pid())

    def failing(folder):
        raise ValueError("the new write fails")

    with pytest.raises(ValueError):
        write_folder_atomically(target, failing)
    assert _version(target) == "new"  # the recovered copy stays where the next write failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_swap_of_a_live_writer_is_left_to_it(tmp_path):
    target = _cut_between_the_renames(tmp_path, os.getpid())  # this process: another thread may be swapping
    assert not PretrainedModelDataset(str(target)).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".model.old-{os.getpid()}-0a1b2c3d",
                                                          f".model.tmp-{os.getpid()}-0a1b2c3d"]  # fmt: skip


def test_the_next_write_removes_what_dead_writers_left_and_keeps_a_live_writers(tmp_path, caplog):
    dead, alive = _dead_pid(), os.getpid()
    target = _model_folder(tmp_path / "model", "old")
    left = _model_folder(tmp_path / f".model.tmp-{dead}-deadbeef", "half")
    (left / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    writing = _model_folder(tmp_path / f".model.tmp-{alive}-cafef00d", "being written")
    other = _model_folder(tmp_path / f".tokenizer.tmp-{dead}-deadbeef", "another target's")
    with caplog.at_level(logging.INFO, logger="fastlm.temporary_files"):
        write_folder_atomically(target, _writing("new"))
    assert _version(target) == "new"
    assert not left.exists() and writing.is_dir() and other.is_dir()
    lines = [r.getMessage() for r in caplog.records if r.name == "fastlm.temporary_files"]
    assert len(lines) == 1 and left.name in lines[0] and "3.0 MB" in lines[0], lines


def test_the_next_file_write_removes_what_a_dead_writer_left(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    target = tmp_path / "predictions.csv"
    left = tmp_path / f".predictions.csv.tmp-{dead}-deadbeef"
    left.write_text("id,prediction\n1,cut", encoding="utf-8")
    writing = tmp_path / f".predictions.csv.tmp-{alive}-cafef00d"
    writing.write_text("id", encoding="utf-8")
    write_file_atomically(target, lambda handle: handle.write("id,prediction\n1,whole\n"))
    assert target.read_text(encoding="utf-8") == "id,prediction\n1,whole\n"
    assert not left.exists() and writing.is_file()


def _aged(path, seconds: float):
    """``path`` and everything in it last changed ``seconds`` ago."""
    then = time.time() - seconds
    for item in [*path.rglob("*"), path] if path.is_dir() else [path]:
        os.utime(item, (then, then))
    return path


def test_leftovers_of_a_writer_on_another_host_are_kept_until_unchanged_for_a_day(tmp_path, monkeypatch):
    """Round twenty: on a shared filesystem (NFS, a cluster's shared home) a writer on another host has a pid
    this host cannot see: its copy in progress was taken for a dead writer's and removed. Leftovers name
    their host; another host's is kept until nothing in it has changed for ``OTHER_HOST_STALE_S``, this
    host's (and an old tag without a host) go by its pid."""
    monkeypatch.setattr(socket, "gethostname", lambda: "trainer 1/a")  # sanitized: trainer_1_a
    dead, alive = _dead_pid(), os.getpid()
    target = _model_folder(tmp_path / "model", "old")
    elsewhere = _model_folder(tmp_path / f".model.tmp-gpu-node-7-{dead}-cafef00d", "another host's, writing")
    still_writing = _aged(
        _model_folder(tmp_path / f".model.tmp-gpu-node-9-{dead}-0ddba11", "writing"), 3 * DAY
    )
    (still_writing / "model.safetensors").write_bytes(b"\0" * 10)  # a file in it changed just now
    stale = _aged(_model_folder(tmp_path / f".model.tmp-gpu-node-8-{dead}-0badcafe", "a day old"), DAY + 60)
    stale_file = tmp_path / f".model.old-gpu-node-8-{dead}-0badcafe"
    stale_file.write_text("x", encoding="utf-8")
    _aged(stale_file, DAY + 60)
    ours_dead = _model_folder(tmp_path / f".model.tmp-trainer_1_a-{dead}-deadbeef", "this host's, dead")
    ours_alive = _model_folder(tmp_path / f".model.tmp-trainer_1_a-{alive}-feedf00d", "this host's, alive")
    untagged_dead = _model_folder(tmp_path / f".model.tmp-{dead}-beefcafe", "an old tag, dead")
    names = []

    def write(folder):
        names.append(folder.name)
        _writing("new")(folder)

    write_folder_atomically(target, write)
    assert _version(target) == "new"
    assert names[0].startswith(f".model.tmp-trainer_1_a-{os.getpid()}-"), names
    assert elsewhere.is_dir() and still_writing.is_dir() and ours_alive.is_dir()
    assert not stale.exists() and not stale_file.exists()
    assert not ours_dead.exists() and not untagged_dead.exists()


def test_a_swap_cut_on_another_host_is_left_to_it_until_a_day_old(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "trainer-1")
    dead = _dead_pid()
    _model_folder(tmp_path / f".model.old-gpu-node-7-{dead}-0a1b2c3d", "old")
    _model_folder(tmp_path / f".model.tmp-gpu-node-7-{dead}-0a1b2c3d", "new")
    assert not PretrainedModelDataset(str(tmp_path / "model")).exists()  # its writer may be swapping now
    assert len(list(tmp_path.iterdir())) == 2
    for leftover in tmp_path.iterdir():
        _aged(leftover, DAY + 60)
    assert PretrainedModelDataset(str(tmp_path / "model")).exists()
    assert _version(tmp_path / "model") == "new"


def test_a_file_writes_temporary_names_its_host(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "trainer-1")
    names = []
    write_file_atomically(tmp_path / "summary.json", lambda handle: names.append(Path(handle.name).name))
    assert names[0].startswith(f".summary.json.tmp-trainer-1-{os.getpid()}-"), names


def test_a_model_folder_s_safetensors_weights_get_the_umask_s_mode(tmp_path):
    """safetensors 0.8 creates every file it writes 0o600, so a model folder's weights (the trained model, a
    merged one) were readable by their writer alone while its config and tokenizer files were not: another
    user serving the model, or a container not run as root, could not load it. Now they have the mode any new
    file gets under the umask."""
    import safetensors.torch
    import torch

    def write(folder):
        folder.mkdir()
        safetensors.torch.save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text("{}")

    previous = os.umask(0o027)
    try:
        write_folder_atomically(tmp_path / "model", write)
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "model").iterdir()}
    assert modes == {"model.safetensors": 0o640, "config.json": 0o640}, modes


def _figure(title: str):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(2, 2))
    figure.subplots().set_title(title)
    return figure


def _catalog_output(name: str, version: str):
    """A value the pipeline saves to catalog entry ``name``, its content depending on ``version``."""
    import pandas as pd

    if name in ("{name}_plot", "sweep_loss_plot"):
        return _figure(version)
    if name in ("report_html", "report_markdown", "sweep_verdict", "sweep_best_run"):
        return f"<p>{version}</p>\n" * 200
    if name in ("test_metrics", "tuned_parameters"):
        return {"version": version, "rows": list(range(200))}
    return pd.DataFrame({"version": [version] * 200, "step": range(200)})


# One entry of each kind the report, tune, sweep, predict and train pipelines write: HTML / Markdown / YAML
# text, CSV tables, PNG plots, JSON and YAML files.
CATALOG_FILES = {
    "report_html": "report.html",
    "report_markdown": "report.md",
    "training_summary": "training_summary.csv",
    "run_comparison": "run_comparison.csv",
    "{name}_plot": "loss.png",
    "test_metrics": "test_metrics.json",
    "tune_trials": "tune_trials.csv",
    "tuned_parameters": "parameters_tuned.yml",
    "sweep_comparison": "sweep_comparison.csv",
    "sweep_folds": "sweep_folds.csv",
    "sweep_verdict": "sweep.md",
    "sweep_best_run": "sweep_best_run.yml",
    "sweep_loss_plot": "sweep_loss.png",
    "predictions": "predictions.csv",
    "train_history": "train_history.csv",
    "split_summary": "split_summary.csv",
    "corpus_splits": "corpus_splits.parquet",
}


@pytest.mark.parametrize("name", sorted(CATALOG_FILES))
def test_a_catalog_file_whose_rewrite_fills_the_disk_keeps_the_previous_one(tmp_path, monkeypatch, name):
    """Round twenty-three: the report's HTML, Markdown, tables and plots, the sweep's tables, verdict and best
    run file, the tune's trials were written in place (kedro-datasets' pandas, text and matplotlib datasets):
    a full disk part way left half a file where the complete one was, and every file save's full disk was
    Kedro's DatasetError with its traceback. Now each is written beside and renamed in, and the error is one
    line naming the file and the fix."""
    target = tmp_path / "data" / CATALOG_FILES[name]
    dataset = catalog_dataset(name, target)
    dataset.save(_catalog_output(name, "old"))
    before = target.read_bytes()
    write_stops_part_way(monkeypatch, target.name)
    with pytest.raises(Exception) as raised:
        dataset.save(_catalog_output(name, "new"))
    monkeypatch.undo()
    error = find_user_error(raised.value)
    assert isinstance(error, StorageError), repr(raised.value)
    message = str(error)
    assert "\n" not in message and str(target) in message and "the disk is full" in message, message
    assert "Fix: free disk space" in message and "previous file is kept" in message, message
    assert target.read_bytes() == before
    assert [path.name for path in target.parent.iterdir()] == [target.name]


@pytest.mark.parametrize(
    "name", ["report_html", "{name}_plot", "sweep_comparison", "sweep_best_run", "corpus_splits"]
)
def test_a_catalog_file_whose_rewrite_is_stopped_by_ctrl_c_keeps_the_previous_one(
    tmp_path, monkeypatch, name
):
    """Round twenty-three: Ctrl-C (KeyboardInterrupt) inside the write of a report, plot or sweep file left
    half of it in place of the complete one."""
    target = tmp_path / "data" / CATALOG_FILES[name]
    dataset = catalog_dataset(name, target)
    dataset.save(_catalog_output(name, "old"))
    before = target.read_bytes()
    write_stops_part_way(monkeypatch, target.name, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        dataset.save(_catalog_output(name, "new"))
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert [path.name for path in target.parent.iterdir()] == [target.name]


def test_a_run_copy_whose_rewrite_fills_the_disk_keeps_the_previous_copy(tmp_path, monkeypatch, caplog):
    import shutil

    from kedro.io import DataCatalog
    from kedro_datasets.json import JSONDataset

    from fastlm.hooks.run_outputs import RunOutputsHook

    runs = tmp_path / "runs"
    output = tmp_path / "train_summary.json"
    dataset = JSONDataset(filepath=str(output), metadata={"keep_per_run": str(runs)})
    hook = RunOutputsHook()
    hook._catalog, hook._trained, hook._pid = DataCatalog({"train_summary": dataset}), "run-a", os.getpid()
    output.write_text(json.dumps({"run_name": "run-a", "steps": 4}), encoding="utf-8")
    hook.after_dataset_saved("train_summary", None, None)
    kept = runs / "run-a" / "train_summary.json"
    assert json.loads(kept.read_text(encoding="utf-8"))["steps"] == 4

    output.write_text(json.dumps({"run_name": "run-a", "steps": 8, "pad": "x" * 4096}), encoding="utf-8")
    monkeypatch.setattr(shutil, "_USE_CP_SENDFILE", False)  # the copy's writes go through open's handles
    write_stops_part_way(monkeypatch, str(runs))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        hook.after_dataset_saved("train_summary", None, None)
    assert json.loads(kept.read_text(encoding="utf-8"))["steps"] == 4, "the previous copy was cut"
    assert sorted(p.name for p in kept.parent.iterdir()) == ["train_summary.json"]
    assert any("could not keep a copy" in r.getMessage() for r in caplog.records)
