"""Launching the worker processes of a data-parallel run (``launch.workers``): a user error in a worker ends
the run in one line with that error's exit status, and the launcher leaves the caller's signal handlers as it
found them. Two real worker processes each: the tiny job of tests/support/parallel_jobs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastlm.engine.launch.workers import WorkerFailedError
from tests.support.parallel_jobs import job_params, launch, tokenized_splits


@pytest.fixture(scope="module")
def tokenized(bpe_tokenizer, sample_texts):
    return tokenized_splits(bpe_tokenizer, sample_texts)


def test_a_worker_error_ends_the_run_with_that_error_in_one_line(tmp_path, bpe_tokenizer, tokenized):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "COMPLETE").write_text("{not json")
    params = job_params(tmp_path, accum=1, nproc=2, resume=str(broken))
    with pytest.raises(WorkerFailedError, match=r"training worker rank \d of 2 failed: .*broken") as caught:
        launch(params, bpe_tokenizer, tokenized, tmp_path)
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2  # a user error keeps its status


def test_the_launcher_puts_the_signal_handlers_back(tmp_path, bpe_tokenizer, tokenized):
    import signal

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    launch(
        job_params(tmp_path, accum=1, nproc=2, max_steps=1, eval_every=None, save_every=None),
        bpe_tokenizer,
        tokenized,
        tmp_path,
    )
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_each_worker_is_handed_a_few_bytes_whatever_the_jobs_size(tmp_path, bpe_tokenizer, monkeypatch):
    """spawn writes a worker's arguments into its start pipe, and the worker reads the last of them only
    after importing its parent's main module: arguments above the pipe's 64 KiB held the launcher at each
    worker until that one had imported, so N workers started one after another. The job (its data: 2 MB
    here) travels by one file; each worker's arguments stay far below a pipe's buffer."""
    import pickle

    import datasets
    import torch.distributed.launcher.api as launcher_api

    handed = []

    class Handed(Exception):
        pass

    def elastic_launch(config, entrypoint):
        def run(*args):
            handed.append(pickle.dumps((entrypoint, *args)))
            raise Handed

        return run

    monkeypatch.setattr(launcher_api, "elastic_launch", elastic_launch)
    rows = datasets.Dataset.from_dict({"input_ids": [list(range(47)) + [2]] * 5000})  # ~2 MB
    params = job_params(tmp_path, accum=1, nproc=2)
    with pytest.raises(Handed):
        launch(params, bpe_tokenizer, (rows, rows), tmp_path)
    assert handed and len(handed[0]) < 4096, f"{len(handed[0])} bytes through each worker's start pipe"
    assert not list(tmp_path.glob(".launch-*"))  # nothing left behind by a launch that failed


def test_a_launch_removes_what_a_killed_launch_left_and_keeps_a_live_ones(
    tmp_path, bpe_tokenizer, monkeypatch
):
    """A launcher killed outright (the out-of-memory killer, kill -9) leaves its hand-over files beside the
    model folder: the pickled job (its data) and the weights. The next launch there removes those of a
    process that no longer runs, and keeps a running one's."""
    import datasets
    import torch.distributed.launcher.api as launcher_api

    class Handed(Exception):
        pass

    def elastic_launch(config, entrypoint):
        def run(*args):
            raise Handed

        return run

    monkeypatch.setattr(launcher_api, "elastic_launch", elastic_launch)
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has this id
    left = [tmp_path / f".launch-{gone}-0badcafe.job", tmp_path / f".launch-{gone}-0badcafe.safetensors"]
    running = tmp_path / f".launch-{os.getppid()}-00c0ffee.job"
    for path in (*left, running):
        path.write_bytes(b"x")
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4})
    with pytest.raises(Handed):
        launch(job_params(tmp_path, accum=1, nproc=2), bpe_tokenizer, (rows, rows), tmp_path)
    assert not any(path.exists() for path in left) and running.exists()
