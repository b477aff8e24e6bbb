"""Launching the worker processes of a data-parallel run (``launch.workers``): a user error in a worker ends
the run in one line with that error's exit status, and the launcher leaves the caller's signal handlers as it
found them. Two real worker processes each: the tiny job of tests/support/parallel_jobs."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from fastlm.engine.launch.workers import WorkerFailedError
from tests.support.parallel_jobs import job_params, launch, tokenized_splits


@pytest.fixture(scope="module")
def tokenized(bpe_tokenizer, sample_texts):
    return tokenized_splits(bpe_tokenizer, sample_texts)


def _temporary_folder(tmp_path, monkeypatch) -> Path:
    """This process's temporary folder (``tempfile``'s), where the elastic launcher made its log folder
    (``torchelastic_*``) when given none and torch's process start makes each worker's traceback file
    (``pytorch-errorfile-*``) unless the launch says where."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_worker_error_ends_the_run_with_that_error_in_one_line(
    tmp_path, bpe_tokenizer, tokenized, monkeypatch
):
    """The worker's own message comes back through its error file, in the launch's log folder, which the
    launch removes when it ends: nothing left in the temporary folder (no log folder, no worker's traceback
    file) or beside the model folder."""
    temporary = _temporary_folder(tmp_path, monkeypatch)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "COMPLETE").write_text("{not json")
    params = job_params(tmp_path, accum=1, nproc=2, resume=str(broken))
    with pytest.raises(WorkerFailedError, match=r"training worker rank \d of 2 failed: .*broken") as caught:
        launch(params, bpe_tokenizer, tokenized, tmp_path)
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2  # a user error keeps its status
    assert not list(temporary.glob("torchelastic_*")) and not list(tmp_path.glob(".launch-*"))
    assert not list(temporary.glob("pytorch-errorfile-*"))
    assert tempfile.tempdir == str(temporary)  # set for the workers' start only, then put back


def test_the_launcher_puts_the_signal_handlers_back(tmp_path, bpe_tokenizer, tokenized, monkeypatch):
    """... and leaves no log folder behind (``torchelastic_*`` in the temporary folder, one a launch)."""
    import signal

    temporary = _temporary_folder(tmp_path, monkeypatch)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    launch(
        job_params(tmp_path, accum=1, nproc=2, max_steps=1, eval_every=None, save_every=None),
        bpe_tokenizer,
        tokenized,
        tmp_path,
    )
    assert {signum: signal.getsignal(signum) for signum in before} == before
    assert not list(temporary.glob("torchelastic_*")) and not list(tmp_path.glob(".launch-*"))


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
    model folder: the pickled job (its data), the weights and the log folder. The next launch there removes
    those of a process that no longer runs, and keeps a running one's."""
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
    logs = tmp_path / f".launch-{gone}-0badcafe.logs"  # its log folder: the workers' error files
    (logs / "fastlm-run_x" / "attempt_0" / "0").mkdir(parents=True)
    (logs / "fastlm-run_x" / "attempt_0" / "0" / "error.json").write_text("{}")
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4})
    with pytest.raises(Handed):
        launch(job_params(tmp_path, accum=1, nproc=2), bpe_tokenizer, (rows, rows), tmp_path)
    assert not any(path.exists() for path in (*left, logs)) and running.exists()


def _launch_recording(tmp_path, tokenizer, tokenized, method: str, name: str):
    """A one-step, two-worker launch started by ``method``: rank 0's final train loss and what its worker
    process recorded (``WorkerProcess``)."""
    import functools
    import json

    from tests.support.parallel_jobs import WorkerProcess

    record = tmp_path / f"{name}.json"
    params = job_params(
        tmp_path / name,
        accum=1,
        nproc=2,
        max_steps=2,
        eval_every=None,
        save_every=None,
        distributed={"nproc_per_node": 2, "monitor_interval_s": 0.2, "start_method": method},
    )
    result = launch(
        params,
        tokenizer,
        tokenized,
        tmp_path / name,
        callback_factory=functools.partial(WorkerProcess, str(record), "FASTLM_TEST_LAUNCH_MARK"),
    )
    return result.history[-1]["loss"], json.loads(record.read_text())


@pytest.fixture(scope="module")
def forked_twice(tmp_path_factory, bpe_tokenizer, tokenized):
    """Two forkserver launches one after the other (``_launch_recording``), launched once for the module:
    each one's loss and record, which the tests only read."""
    folder = tmp_path_factory.mktemp("forked")
    return [
        _launch_recording(folder, bpe_tokenizer, tokenized, "forkserver", name) for name in ("fork1", "fork2")
    ]


def test_forkserver_workers_come_from_one_server_and_train_as_spawned_workers(
    tmp_path, bpe_tokenizer, tokenized, forked_twice
):
    """``distributed.start_method: forkserver``: each worker is forked from one server process that
    imported the engine once (the worker's parent is that server, the same for two launches), not started
    as a fresh interpreter by the launcher (``spawn``: the worker's parent is the launcher). The training is
    the same computation either way: the same losses, exactly."""
    spawned_loss, spawned = _launch_recording(tmp_path, bpe_tokenizer, tokenized, "spawn", "spawn")
    (first_loss, first), (second_loss, second) = forked_twice
    assert spawned["parent"] == os.getpid()
    assert first["parent"] != os.getpid() and second["parent"] == first["parent"]
    assert spawned_loss == first_loss == second_loss


def test_a_changed_environment_starts_workers_that_see_it(
    tmp_path, bpe_tokenizer, tokenized, monkeypatch, forked_twice
):
    """A forkserver's workers inherit the server's environment, which is the launcher's when the server
    started: a variable set since then would not reach them. The launcher then starts the server again, with
    the environment as it is now: the workers see it, and later launches fork from that server (they were
    all spawned, each importing the engine again, in a test session once an earlier test had changed the
    environment). The launch before the change: the module's last forkserver launch."""
    _, before = forked_twice[-1]
    assert before["variable"] is None  # forked before the variable was set
    monkeypatch.setenv("FASTLM_TEST_LAUNCH_MARK", "set after the server started")
    _, after = _launch_recording(tmp_path, bpe_tokenizer, tokenized, "forkserver", "after")
    _, again = _launch_recording(tmp_path, bpe_tokenizer, tokenized, "forkserver", "again")
    assert after["variable"] == again["variable"] == "set after the server started"
    assert before["parent"] != os.getpid() and after["parent"] not in (os.getpid(), before["parent"])
    assert again["parent"] == after["parent"]


def test_auto_forks_workers_on_a_cpu_and_spawns_them_for_a_gpu(monkeypatch):
    """``auto``: forkserver where the job trains on the CPU; spawn where it trains on a GPU. forkserver for a
    GPU job is refused in one line naming the parameter: the server's imports ask the CUDA driver for its
    devices (torchao's modules do), after which PyTorch refuses CUDA in a forked child."""
    import torch

    from fastlm.engine.launch.workers import worker_start_method
    from fastlm.errors import ConfigError

    assert worker_start_method("auto", "cpu") == "forkserver"
    assert worker_start_method("auto", "cuda") == "spawn"
    assert worker_start_method("spawn", "cpu") == "spawn"
    assert worker_start_method("forkserver", "cpu") == "forkserver"
    with pytest.raises(
        ConfigError, match=r"train\.distributed\.start_method is forkserver .* cuda"
    ) as refused:
        worker_start_method("forkserver", "cuda:1")
    assert "\n" not in str(refused.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert worker_start_method("auto", "auto") == "spawn"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert worker_start_method("auto", "auto") == "forkserver"


def test_more_workers_than_the_cpu_has_cores_is_refused_in_one_line_before_anything_starts(
    tmp_path, bpe_tokenizer, tokenized, monkeypatch
):
    """``train.distributed.nproc_per_node`` above the usable cores of a CPU run (a GPU node's 8 copied to a
    2-core machine): each worker gets one thread and two share a core, and every collective of a step waits
    for the slowest, so the run is slower than with fewer processes (4 workers on 2 cores: 12,000 real
    tokens/s where 2 trained 17,400). Refused in one line naming the parameter, the cores and the fix
    before any worker, log folder or checkpoint is made; a GPU job is not counted against the cores."""
    import torch

    from fastlm.engine.launch import workers
    from fastlm.errors import ConfigError

    monkeypatch.setattr(workers, "usable_cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    params = job_params(tmp_path, accum=1, nproc=3)
    with pytest.raises(ConfigError) as refused:
        launch(params, bpe_tokenizer, tokenized, tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "train.distributed.nproc_per_node is 3" in message
    assert "2 usable CPU cores" in message and "Fix:" in message and "at most 2" in message
    assert not list(tmp_path.glob(".launch-*")) and not (tmp_path / "checkpoints-3").exists()
    workers.refuse_more_workers_than_cores(2, "cpu")  # one a core: let through
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    workers.refuse_more_workers_than_cores(8, "auto")  # one a GPU: the cores are not what it is counted by


def test_a_killed_worker_is_named_before_the_peer_that_lost_its_connection(tmp_path):
    """A worker killed outright (the out-of-memory killer, kill -9) writes no error; its peer fails on the
    closed connection a moment later and does. The elastic launcher dates the peer's failure by its error
    file and the killed one's by when the launcher saw it, in whole seconds, and names the earliest: the
    peer's when both fall in one second or the launcher looked late. The killed worker is the cause, and is
    named."""
    import json
    import time

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from fastlm.engine.launch.workers import _worker_error

    peer = tmp_path / "rank0.json"
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6797."
    stamp = str(int(time.time()) - 1)
    peer.write_text(json.dumps({"message": {"message": lost, "extraInfo": {"timestamp": stamp}}}))
    failures = {
        0: ProcessFailure(local_rank=0, pid=100, exitcode=1, error_file=str(peer)),
        1: ProcessFailure(local_rank=1, pid=101, exitcode=-9, error_file=str(tmp_path / "none.json")),
    }
    message = str(_worker_error(ChildFailedError("_worker", failures), 2))
    assert "training worker rank 1 of 2 was killed (Signal 9 (SIGKILL)" in message, message


def test_forked_workers_run_the_engine_the_launcher_imported_from_its_own_path(tmp_path):
    """A launcher whose engine comes from a folder put on ``sys.path`` at run time (a benchmark run from
    another checkout, a project's ``src``), not from where the interpreter finds it by itself: its
    forkserver imports that same engine before forking the workers, and they train with it. In a fresh
    process, from a copy of the engine's sources."""
    import shutil
    import subprocess
    import sys
    import textwrap

    import fastlm

    copy = tmp_path / "checkout" / "src"
    shutil.copytree(
        Path(fastlm.__file__).parent, copy / "fastlm", ignore=shutil.ignore_patterns("__pycache__")
    )
    repo = Path(__file__).resolve().parents[3]
    script = textwrap.dedent(
        f"""
        import functools, json, pathlib, sys
        sys.path[:0] = [{str(copy)!r}, {str(repo)!r}]

        def main():
            from fastlm.corpus.tokenizer_source import train_bpe_tokenizer
            from tests.support.parallel_jobs import WorkerProcess, job_params, launch, tokenized_splits

            texts = [f"the cat {{i}} sat on the mat number {{i % 7}} today" for i in range(400)]
            tokenizer = train_bpe_tokenizer(texts, vocab_size=200, min_frequency=2, model_max_length=64)
            root = pathlib.Path({str(tmp_path)!r})
            params = job_params(root, accum=1, nproc=2, max_steps=1, eval_every=None, save_every=None)
            record = root / "worker.json"
            launch(params, tokenizer, tokenized_splits(tokenizer, texts), root,
                   callback_factory=functools.partial(WorkerProcess, str(record), "HOME"))
            print(json.dumps({{"launcher": sys.modules["fastlm"].__file__,
                              "method": params.distributed.start_method,
                              **json.loads(record.read_text())}}))

        if __name__ == "__main__":
            main()
        """
    )
    (tmp_path / "launch.py").write_text(script)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "launch.py")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["launcher"].startswith(str(copy)), seen
    assert seen["fastlm"] == seen["launcher"], seen  # the worker's engine is the launcher's
    assert seen["parent"] != os.getpid()  # forked from the server (auto on a CPU)


def test_a_worker_that_lost_its_peer_waits_for_the_launcher_to_see_the_peers_death(tmp_path, monkeypatch):
    """The elastic launcher names one failed worker: the first it finds at its check (every
    ``monitor_interval_s``), the lowest rank when several ended since the last one. A worker whose peer was
    killed fails on the closed connection at once; it waits two of the launcher's checks before it ends, so
    that the launcher finds the killed peer first and names it. Any other error ends the worker at once."""
    import logging
    import pickle

    from fastlm.engine.launch import workers
    from fastlm.engine.launch.job import TrainJob

    waited = []
    monkeypatch.setattr(workers.time, "sleep", waited.append)
    params = job_params(
        tmp_path, accum=1, nproc=2, distributed={"nproc_per_node": 2, "monitor_interval_s": 0.3}
    )
    job_file = tmp_path / "job"
    job_file.write_bytes(pickle.dumps(TrainJob(params, 48, None, None, None, str(tmp_path / "model"))))
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6797.")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # a worker sets up its own logging
    try:
        for error, expected in ((lost, [pytest.approx(0.6)]), (ValueError("a bad value"), [])):
            waited.clear()

            def fail(*args, error=error, **kwargs):
                raise error

            monkeypatch.setattr(workers, "run_job", fail)
            with pytest.raises(type(error)):
                workers._worker(str(job_file), str(tmp_path / "weights"), None, None)
            assert waited == expected, error
    finally:
        root.handlers[:], root.level = handlers, level


def test_the_rendezvous_names_its_events_without_reading_every_frames_source(
    tmp_path, bpe_tokenizer, monkeypatch
):
    """The elastic rendezvous names each of its events by its caller's method (``get_method_name``), built
    even where no handler records them, with two ``inspect.stack()`` calls each: every frame's source lines
    read, which under a deep stack (a test session, a Kedro run) took the launcher most of a second per
    launch. During a launch the name comes from the frame itself: the same name, no source read; the
    rendezvous's own function is back afterwards."""
    import inspect

    import datasets
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous as rendezvous
    import torch.distributed.launcher.api as launcher_api

    original = rendezvous.get_method_name

    class Named:
        def event(self, name_of):
            return name_of()

    seen = {}

    class Handed(Exception):
        pass

    def elastic_launch(config, entrypoint):
        def run(*args):
            seen["during"] = rendezvous.get_method_name
            seen["expected"] = Named().event(original)
            monkeypatch.setattr(inspect, "stack", lambda *a, **k: pytest.fail("inspect.stack() called"))
            seen["named"] = Named().event(rendezvous.get_method_name)
            seen["too_deep"] = rendezvous.get_method_name(depth=10_000)
            monkeypatch.undo()
            raise Handed

        return run

    monkeypatch.setattr(launcher_api, "elastic_launch", elastic_launch)
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4})
    with pytest.raises(Handed):
        launch(job_params(tmp_path, accum=1, nproc=2), bpe_tokenizer, (rows, rows), tmp_path)
    assert seen["during"] is not original and seen["named"] == seen["expected"]
    assert seen["too_deep"] == original(depth=10_000)
    assert rendezvous.get_method_name is original


def test_the_worker_server_imports_what_a_job_unpickles_and_trains_before_it_forks(tmp_path, bpe_tokenizer):
    """A forked worker unpickles its job (the splits' ``datasets`` classes) and builds the model (its
    transformers class): imported in each worker at each launch, they took a second of every worker's
    start. The server imports them once, with the engine."""
    import datasets
    import transformers

    from fastlm.engine.launch.job import TrainJob
    from fastlm.engine.launch.workers import server_preload

    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4})
    job = TrainJob(job_params(tmp_path, accum=1, nproc=2), 48, rows, None, bpe_tokenizer, str(tmp_path / "m"))
    modules = server_preload(job)
    assert {type(rows).__module__, transformers.LlamaForCausalLM.__module__} <= set(modules)
    assert modules[:2] == ["fastlm.engine.launch.server", "fastlm.engine.launch.workers"]  # levels first
    remote = job.params.model.model_copy(update={"name_or_path": "an/unknown-hub-model"})
    hub_job = TrainJob(job.params.model_copy(update={"model": remote}), 48, rows, None, None, "m")
    assert server_preload(hub_job) == [*modules[:2], type(rows).__module__]  # no class to tell: none


def _handed_to_a_worker(tmp_path, tokenizer, monkeypatch, *, replace, before_launch: bool = False) -> dict:
    """Launch two workers over a split saved on disk and loaded memory-mapped, as the train node does; the
    launch calls ``replace(folder)`` (before the launcher looks at the data with ``before_launch``) and then
    runs rank 1's entry point in this process, as a worker would run it, with the job it unpickled. What
    that worker held (``rows``) or raised (``error``)."""
    import logging
    import signal

    import datasets
    import torch.distributed.launcher.api as launcher_api

    import fastlm.engine.launch.workers as workers
    from fastlm.engine.distributed.ranks import RankInfo

    folder = tmp_path / "tokenized"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"input_ids": [[5, 6, 7, 2]] * 40})}
    ).save_to_disk(str(folder))
    train = datasets.load_from_disk(str(folder))["train"]
    checked = train["input_ids"]  # what the train node's check read
    if before_launch:
        replace(folder)
    seen: dict = {}

    class Handed(Exception):
        pass

    def run_job(job, rank, callbacks=()):
        seen["rows"] = job.train_split["input_ids"]

    def elastic_launch(config, entrypoint):
        def run(*args):
            if not before_launch:
                replace(folder)
            try:
                entrypoint(*args)
            except Exception as error:
                seen["error"] = error
            raise Handed

        return run

    monkeypatch.setattr(launcher_api, "elastic_launch", elastic_launch)
    monkeypatch.setattr(workers, "run_job", run_job)
    monkeypatch.setattr(workers, "rank_from_env", lambda: RankInfo(1, 2, 1))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # the worker's logging set-up undone after
    monkeypatch.setattr(root, "level", root.level)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    params = job_params(
        tmp_path, accum=1, nproc=2, distributed={"nproc_per_node": 2, "start_method": "spawn"}
    )
    try:
        with pytest.raises(Handed):
            launch(params, tokenizer, (train, None), tmp_path)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    seen["checked"] = checked
    return seen


def _split_again(folder: Path, row: list[int], shards: int = 1) -> None:
    """The tokenized data written again while a run starts (the split's atomic folder swap): the folder's
    path now holds other files; the launcher's memory-mapped copy still reads the old ones."""
    import shutil

    import datasets

    fresh = folder.with_name("fresh")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [row] * 40})}).save_to_disk(
        str(fresh), num_shards={"train": shards}
    )
    old = folder.with_name("old")
    folder.rename(old)
    fresh.rename(folder)
    shutil.rmtree(old)


@pytest.mark.parametrize("before_launch", [False, True], ids=["after-launch", "before-launch"])
def test_a_worker_refuses_a_split_written_again_after_the_launcher_checked_it(
    tmp_path, bpe_tokenizer, monkeypatch, before_launch
):
    """A worker's job holds its memory-mapped splits as their files' paths, opened again as the job is
    unpickled: a split run that replaced the tokenized data after the train node checked it (its
    fingerprint and digests) had the workers train on the new rows while the run recorded the old data. The
    worker now compares what it opened with what the launcher held and refuses in one line: here rows of
    the same lengths, other tokens, swapped in after the launcher looked (its files tell) or before (the
    sampled digest of its buffers tells)."""
    seen = _handed_to_a_worker(
        tmp_path,
        bpe_tokenizer,
        monkeypatch,
        replace=lambda folder: _split_again(folder, [9, 9, 9, 2]),
        before_launch=before_launch,
    )
    assert "rows" not in seen, (
        f"the worker trained on {seen['rows'][0]}, the launcher checked {seen['checked'][0]}"
    )
    error = seen["error"]
    assert "\n" not in str(error) and "train split" in str(error) and "pipeline=split" in str(error)
    assert error.exit_code == 2


def test_a_worker_refuses_a_split_written_again_in_other_files(tmp_path, bpe_tokenizer, monkeypatch):
    """The data written again in two files where the launcher held one: the job's file is gone as the worker
    unpickles it; one line, not the traceback of a missing file."""
    seen = _handed_to_a_worker(
        tmp_path, bpe_tokenizer, monkeypatch, replace=lambda folder: _split_again(folder, [9, 2], shards=2)
    )
    assert "rows" not in seen and "\n" not in str(seen["error"]) and seen["error"].exit_code == 2
    assert "data-00000-of-00001.arrow" in str(seen["error"]) and "pipeline=split" in str(seen["error"])


def test_a_worker_trains_on_a_split_left_as_the_launcher_checked_it(tmp_path, bpe_tokenizer, monkeypatch):
    seen = _handed_to_a_worker(tmp_path, bpe_tokenizer, monkeypatch, replace=lambda folder: None)
    assert "error" not in seen and seen["rows"] == seen["checked"]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_worker_other_than_rank_0_logs_warnings_only_whatever_level_its_loggers_were_handed(rank, capfd):
    """The forkserver hands the launcher's levels over (``fastlm`` at INFO, conf/logging.yml's), and the
    kedro import of a worker's preparation applies conf/logging.yml again: a worker of rank 1 printed every
    INFO line of the run a second time (``[rank 1] INFO fastlm.engine.train.build: Training 6 steps ...``)."""
    import logging

    from fastlm.engine.launch.workers import _configure_worker_logging

    engine_log = logging.getLogger("fastlm.engine.train.build")
    fastlm_log = logging.getLogger("fastlm")
    root = logging.getLogger()
    saved = (fastlm_log.level, root.level, list(root.handlers), logging.root.manager.disable)
    fastlm_log.setLevel(logging.INFO)  # as the launcher's conf/logging.yml sets it
    try:
        _configure_worker_logging(rank)
        engine_log.info("an info line")
        engine_log.warning("a warning line")
    finally:
        fastlm_log.setLevel(saved[0])
        root.setLevel(saved[1])
        root.handlers[:] = saved[2]
        logging.disable(saved[3])
    err = capfd.readouterr().err
    assert f"[rank {rank}] WARNING fastlm.engine.train.build: a warning line" in err
    assert ("an info line" in err) == (rank == 0)


def test_a_worker_crashing_in_native_code_is_named_with_where_it_crashed(tmp_path, bpe_tokenizer, tokenized):
    """A worker killed by a crash of native code (SIGSEGV in a kernel or a collective's library) wrote no
    error, and the line said only the signal: no one could tell where, or whether it was the memory killer.
    Each worker records its Python stack on such a crash (``faulthandler``, in the launch's log folder): the
    line names the function that was running and the engine's frame under it, and the fix says it is a
    crash, not the out-of-memory killer. The log folder is still removed."""
    from tests.support.parallel_jobs import CrashInNativeCode

    params = job_params(tmp_path, accum=1, nproc=2, max_steps=1, eval_every=None, save_every=None)
    with pytest.raises(WorkerFailedError) as caught:
        launch(params, bpe_tokenizer, tokenized, tmp_path, CrashInNativeCode, again_after_native_crash=False)
    message = str(caught.value)
    assert "\n" not in message
    assert "rank 0 of 2 was killed (Signal 11 (SIGSEGV)" in message, message
    assert "crashed in native code under string_at (" in message and "ctypes" in message, message
    assert "tests/support/parallel_jobs.py:" in message or "fastlm/engine/" in message, message
    assert "dmesg" not in message and "run the same command again" in message, message
    assert "Current thread" in caught.value.native_stack  # the whole record, kept for a report
    assert not list(tmp_path.glob(".launch-*"))


def test_the_tests_launch_once_more_after_a_native_crash_with_its_stack_in_a_warning(
    tmp_path, bpe_tokenizer, tokenized
):
    """The tests' launcher (tests/support/parallel_jobs.launch) runs a launch whose worker native code
    crashed once more, from nothing, and says so with the crashed worker's stack: the run's result is the
    second launch's, trained to its last step."""
    import functools

    from tests.support.parallel_jobs import CrashOnce

    params = job_params(tmp_path, accum=1, nproc=2, max_steps=2, eval_every=None, save_every=None)
    marker = tmp_path / "crashed"
    with pytest.warns(UserWarning, match=r"(?s)launched again after: .*SIGSEGV.*Current thread"):
        result = launch(params, bpe_tokenizer, tokenized, tmp_path, functools.partial(CrashOnce, str(marker)))
    assert marker.read_text() == "crashed" and [row["step"] for row in result.history][-1] == 2


def test_the_tests_own_ranks_start_once_more_after_a_native_crash_with_its_stack_in_a_warning(tmp_path):
    """The tests that start gloo ranks of their own (tests/support/ddp_ranks, fsdp_ranks, data_ranks) were
    not covered by the launcher's second start: a SIGSEGV of gloo's library there failed CI's run with a
    signal alone. ``spawned_ranks.start`` runs the ranks once more after a native crash, from what their
    folder held before, and warns with the crashed rank's stack; a failure of any other kind is raised at
    once, and a second crash too."""
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    from tests.support import spawned_ranks

    folder, marker = tmp_path / "ranks", tmp_path / "crashed"
    folder.mkdir()
    (folder / "kept.txt").write_text("there before")
    with pytest.warns(UserWarning, match=r"(?s)ranks started again after: .*SIGSEGV.*rank 1:.*string_at"):
        spawned_ranks.start(spawned_ranks.crash_once, (folder, marker), folder, 2, start_method="fork")
    assert marker.read_text() == "crashed"
    assert sorted(path.name for path in folder.glob("*.txt") if "native" not in path.name) == [
        "kept.txt",
        "rank0.txt",
        "rank1.txt",
    ]
    calls = tmp_path / "calls"
    with pytest.raises(ProcessRaisedException, match="failed"):
        spawned_ranks.start(spawned_ranks.fail, (folder, calls), folder, 2, start_method="fork")
    assert len(calls.read_text().split()) in (1, 2)  # one start: both ranks, or one before the other's stop
    with pytest.warns(UserWarning), pytest.raises(ProcessExitedException, match="SIGSEGV"):
        spawned_ranks.start(spawned_ranks.crash_once, (folder, marker, True), folder, 2, start_method="fork")


def test_a_stop_signal_before_the_workers_saved_a_checkpoint_ends_as_a_stop_not_a_failure(tmp_path):
    """Round thirty-two: Ctrl-C (or SIGTERM) to a run of several processes while its workers start, before
    rank 0 saved a checkpoint: the launcher's line ended the run with status 1, as a failed worker does, and
    its MLflow run FAILED; a one-process run stopped so ends with 130 and KILLED. A stop now, the same line
    (a checkpoint of an earlier launch is not this launch's)."""
    import time

    from fastlm.engine.launch.job import TrainJob
    from fastlm.engine.launch.workers import _stopped_by
    from fastlm.tracking import stopped_by_user

    params = job_params(tmp_path, accum=1, nproc=2)
    (tmp_path / "checkpoints-2").mkdir()
    job = TrainJob(params, 48, None, None, None, str(tmp_path / "model"))
    error = _stopped_by("SIGINT", job, 2, since=time.time())
    assert str(error).startswith("training stopped by SIGINT: the 2 workers were stopped before a checkpoint")
    assert "\n" not in str(error) and "train.resume: auto" in str(error)
    assert error.exit_code == 130 and stopped_by_user(error)
