"""The train pipeline on 2 CPU processes (gloo): launched by the node, started under torchrun, and a killed
worker or torchrun rank."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.support import background
from tests.support.project import run_pipeline
from tests.support.runner_jobs import data_files
from tests.support.split_project import SHARED_SPLIT, copy_of_the_split_project

pytestmark = pytest.mark.e2e
SPLIT = {"tokenizer": {"vocab_size": 400}, "max_length": 48}
assert SPLIT == SHARED_SPLIT  # the background jobs train in copies of the split project, split so
TRAIN = {
    "max_steps": 4,
    "log_every": 1,
    "eval_every": 2,
    "save_every": 2,
    "quiet": True,
    "batching": {"micro_batch_size": 4},
    "runtime": {"num_threads": 1},
    "model": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4},
}


def _train_runs(experiment: str = "fastlm", uri: str | None = None) -> list:
    import mlflow

    client = mlflow.MlflowClient(uri)
    return client.search_runs(
        client.get_experiment_by_name(experiment).experiment_id,
        filter_string="tags.`mlflow.runName` LIKE 'train-%'",
        max_results=1000,
    )


def _written_outputs(project: Path) -> dict:
    return {
        "models": sorted(p.name for p in (project / "data/06_models").iterdir() if p.name != "tokenizer"),
        "checkpoints": sorted(
            p.name for p in (project / "data/06_models/checkpoints").glob("*/checkpoint-*")
        ),
    }


def test_nproc_per_node_launches_workers_and_only_rank_0_writes(kedro_project):
    run_pipeline(kedro_project, "split", {"split": SPLIT})
    before = len(_train_runs())
    distributed = {**TRAIN, "distributed": {"nproc_per_node": 2, "monitor_interval_s": 0.2}}
    run_pipeline(kedro_project, "train", {"split": SPLIT, "train": distributed})

    assert len(_train_runs()) == before + 1  # one MLflow run
    assert _written_outputs(kedro_project) == {
        "models": ["checkpoints", "model", "runs"],
        "checkpoints": ["checkpoint-00000002", "checkpoint-00000004"],
    }
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert (
        summary["world_size"] == 2
        and summary["effective_batch"] == 8
        and summary["distributed_strategy"] == "ddp"
    )
    history = pd.read_csv(kedro_project / "data/07_model_output/train_history.csv")
    assert list(history["step"]) == [1, 2, 3, 4] and history["loss"].notna().all()

    import mlflow

    client = mlflow.MlflowClient()
    run_id = summary["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [
        1,
        2,
        3,
        4,
    ]  # live, from rank 0
    assert [m.step for m in client.get_metric_history(run_id, "eval/val_loss")] == [2, 4]

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        kedro_project / "data/06_models/model", local_files_only=True
    )
    assert model.config.vocab_size > 0


def _store(project: Path) -> str:
    return f"sqlite:///{project / 'mlflow.db'}"


def _params_arg(params: dict) -> str:
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value

    walk("", params)
    return ",".join(f"{key}={value}" for key, value in flat.items())


def split_then_train_under_torchrun(folder: Path):
    """In a copy of the split project (tests/support/split_project.py: the kedro_project fixture's project,
    split by `kedro run --pipeline=split`, its MLflow store in it): `kedro run --pipeline=train` under
    torchrun with 2 processes (a job of tests/support/background.py)."""
    project = folder / "project"
    split_done = copy_of_the_split_project(project)
    env = background.environ(
        PYTHONUNBUFFERED="1", RANK=None, WORLD_SIZE=None, MLFLOW_TRACKING_URI=_store(project)
    )
    kedro_run = ["-m", "kedro", "run"]
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command = [
        sys.executable,
        *torchrun,
        *kedro_run,
        "--pipeline=train",
        "--params",
        _params_arg({"split": SPLIT, "train": TRAIN}),
    ]
    done = background.run(command, cwd=project, env=env) if split_done.returncode == 0 else None
    return project, split_done, done


@pytest.mark.background(job=split_then_train_under_torchrun)
def test_kedro_run_under_torchrun_writes_once():
    project, split, done = background.result(split_then_train_under_torchrun)
    assert split.returncode == 0, split.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_train_runs(uri=_store(project))) == 1  # rank 1 opened no MLflow run
    assert _written_outputs(project)["checkpoints"] == ["checkpoint-00000002", "checkpoint-00000004"]
    summary = json.loads((project / "data/08_reporting/train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4


def _read(path: str, mode: str = "r"):
    """With the built-in open, not Path.read_text: a background job reads, and tests patch Path.open."""
    with open(path, mode) as file:
        return file.read()


def _workers(parent: int) -> tuple[list[int], list[int]]:
    """The worker processes the launcher started, and the forkserver it started them from (if any):
    children of ``parent`` running multiprocessing's spawn_main (``start_method: spawn``), or children of
    its child running multiprocessing's forkserver (``forkserver``, what ``auto`` takes on a CPU)."""
    processes = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(_read(str(stat)).rsplit(")", 1)[1].split()[1])
            processes[int(stat.parent.name)] = (ppid, _read(str(stat.parent / "cmdline"), "rb"))
        except (OSError, ValueError, IndexError):
            continue
    servers = [
        pid for pid, (ppid, cmdline) in processes.items() if ppid == parent and b"forkserver" in cmdline
    ]
    workers = [
        pid
        for pid, (ppid, cmdline) in processes.items()
        if (ppid == parent and b"spawn_main" in cmdline) or ppid in servers
    ]
    return sorted(workers), servers


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that is not a zombie."""
    try:
        return "zombie" not in _read(f"/proc/{pid}/status").lower()
    except OSError:
        return False


def _split_then_train_until_a_checkpoint(folder: Path, save_every: int, **popen) -> tuple:
    """In a copy of the split project (tests/support/split_project.py, its MLflow store in it): a long
    2-process `kedro run --pipeline=train` (``popen``: more Popen arguments) until its first checkpoint is
    written: (what was seen, the training process or None when it did not get there)."""
    project = folder / "project"
    seen = {"project": project, "split": copy_of_the_split_project(project)}
    env = background.environ(
        PYTHONUNBUFFERED="1", RANK=None, WORLD_SIZE=None, MLFLOW_TRACKING_URI=_store(project)
    )
    kedro_run = [sys.executable, "-m", "kedro", "run"]
    if seen["split"].returncode != 0:
        return seen, None
    long_run = {
        **TRAIN,
        "max_steps": 100000,
        "save_every": save_every,
        "keep_last": 1,
        "distributed": {"nproc_per_node": 2, "monitor_interval_s": 0.2},
    }
    command = [*kedro_run, "--pipeline=train", "--params", _params_arg({"split": SPLIT, "train": long_run})]
    process = background.popen(
        command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )
    deadline = time.monotonic() + 180
    while not list((project / "data/06_models/checkpoints").glob("*/checkpoint-*")):
        if process.poll() is not None or time.monotonic() >= deadline:
            seen["started"] = False
            _forget(process)
            return seen, None
        time.sleep(0.2)
    seen["started"] = True
    seen["workers"], seen["servers"] = _workers(process.pid)
    return seen, process


def _forget(process: subprocess.Popen, group: bool = False) -> None:
    if process.poll() is None:
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    background.forget(process)


def split_then_kill_a_worker(folder: Path) -> dict:
    """A long 2-process training run (``_split_then_train_until_a_checkpoint``) whose second worker is
    killed once a checkpoint is written (a job of tests/support/background.py): what was seen."""
    seen, process = _split_then_train_until_a_checkpoint(folder, save_every=1)
    if process is None:
        return seen
    try:
        if len(seen["workers"]) == 2:
            os.kill(seen["workers"][-1], signal.SIGKILL)
            killed = time.monotonic()
            seen["output"], _ = process.communicate(timeout=90)
            seen["ended_in"] = time.monotonic() - killed
            seen["left"] = [pid for pid in seen["workers"] + seen["servers"] if _alive(pid)]
    finally:
        _forget(process)
    seen["returncode"] = process.returncode
    return seen


@pytest.mark.skipif(
    not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the worker processes"
)
@pytest.mark.background(job=split_then_kill_a_worker)
def test_a_killed_worker_ends_the_run_with_a_clear_error_and_no_process_left():
    seen = background.result(split_then_kill_a_worker)
    assert seen["split"].returncode == 0, seen["split"].stderr[-3000:]
    assert seen["started"], "training did not start"
    assert len(seen["workers"]) == 2, seen["workers"]
    output = seen["output"]
    assert seen["returncode"] not in (0, None)
    assert re.search(r"training worker rank \d of 2 was killed \(Signal 9 \(SIGKILL\)", output), output[
        -3000:
    ]
    assert seen["ended_in"] < 60
    assert len(seen["servers"]) == 1  # auto on a CPU: the workers were forked from one server
    # the server imported the engine after the project's logging settings, as a spawned worker does: none of
    # the lines they silence (torchao's missing optional kernels, torch's pytree deprecations)
    assert "Failed to load" not in output and "_pytree" not in output, output[:3000]
    assert seen["left"] == []  # every worker gone (or a zombie), and the server with its launcher
    assert not (seen["project"] / "data/06_models/model").exists()  # nothing half-written


def split_then_stop_the_process_group(folder: Path) -> dict:
    """A long 2-process training run in a session of its own, whose whole process group gets SIGTERM once a
    checkpoint is written (what Slurm's cancel, a pre-emption or `timeout` does): what was seen."""
    seen, process = _split_then_train_until_a_checkpoint(folder, save_every=3, start_new_session=True)
    if process is None:
        return seen
    project = seen["project"]
    try:
        os.killpg(process.pid, signal.SIGTERM)
        seen["output"], _ = process.communicate(timeout=120)
        seen["left"] = [pid for pid in seen["workers"] + seen["servers"] if _alive(pid)]
        seen["weights"] = {  # the job's folder is gone once the test reads this
            str(path.relative_to(project)): (path / "model.safetensors").is_file()
            for path in (project / "data/06_models/checkpoints").glob("*/checkpoint-*")
        }
    finally:
        _forget(process, group=True)
    seen["returncode"] = process.returncode
    return seen


@pytest.mark.skipif(
    not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the worker processes"
)
@pytest.mark.background(job=split_then_stop_the_process_group)
def test_sigterm_to_the_whole_process_group_saves_the_step_as_one_process_does():
    """Every process of the run gets the signal (the launcher, the server, the workers), and the launcher's
    agent sends it to the workers once more: each worker finishes the step, rank 0 saves it, and the run ends
    as a one-process run does (exit 130, the step and the checkpoint named), no process left."""
    seen = background.result(split_then_stop_the_process_group)
    assert seen["split"].returncode == 0, seen["split"].stderr[-3000:]
    assert seen["started"], "training did not start"
    output = seen["output"]
    assert seen["returncode"] == 130, output[-3000:]
    stopped = re.search(r"training stopped by SIGTERM at step (\d+); checkpoint (\S+) saved", output)
    assert stopped, output[-3000:]
    step, checkpoint = int(stopped[1]), stopped[2]  # relative to the project
    assert checkpoint.endswith(f"/checkpoint-{step:08d}") and seen["weights"].get(checkpoint), output[-6000:]
    assert seen["left"] == []


def _torchrun_ranks(agent: int) -> dict[int, int]:
    """The processes torchrun's agent (``agent``) started, by the ``RANK`` it gave each."""
    ranks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(_read(str(stat)).rsplit(")", 1)[1].split()[1]) != agent:
                continue
            environ = _read(str(stat.parent / "environ"), "rb").split(b"\0")
            rank = next(item for item in environ if item.startswith(b"RANK="))
            ranks[int(rank.removeprefix(b"RANK="))] = int(stat.parent.name)
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return ranks


def split_then_kill_a_torchrun_rank(folder: Path) -> dict:
    """In a copy of the split project: a long `kedro run --pipeline=train` under torchrun with 2 ranks (the
    agent's own checks, every 0.1 s), each rank's stderr in a file of its own (``--redirects``), whose rank 1
    is killed (SIGKILL, as the out-of-memory killer does) once a checkpoint is written: what rank 0, the
    survivor, wrote on its stderr, what the agent wrote, the MLflow runs' statuses and the files under
    data/ before and after (a job of tests/support/background.py)."""
    project, logs = folder / "project", folder / "logs"
    seen = {"project": project, "split": copy_of_the_split_project(project)}
    if seen["split"].returncode != 0:
        return seen
    env = background.environ(
        PYTHONUNBUFFERED="1", RANK=None, WORLD_SIZE=None, MLFLOW_TRACKING_URI=_store(project)
    )
    long_run = {**TRAIN, "max_steps": 100000, "save_every": 2, "keep_last": 1}
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command = [
        sys.executable,
        *torchrun,
        f"--log-dir={logs}",
        "--redirects=2",
        *["-m", "kedro", "run", "--pipeline=train"],
        *["--params", _params_arg({"split": SPLIT, "train": long_run})],
    ]
    seen["before"] = data_files(project)
    with open(folder / "agent.txt", "w+") as agent:
        process = background.popen(command, cwd=project, env=env, stdout=agent, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not list((project / "data/06_models/checkpoints").glob("*/checkpoint-*")):
                if process.poll() is not None or time.monotonic() >= deadline:
                    seen["started"] = False
                    return seen
                time.sleep(0.2)
            seen["started"], seen["ranks"] = True, _torchrun_ranks(process.pid)
            if len(seen["ranks"]) == 2:
                os.kill(seen["ranks"][1], signal.SIGKILL)
                process.wait(timeout=90)
        finally:
            _forget(process)
        seen["returncode"] = process.returncode
        agent.seek(0)
        seen["agent"] = agent.read()
    seen["survivor"] = "".join(_read(str(path)) for path in logs.glob("*/attempt_0/0/stderr.log"))
    seen["after"] = data_files(project)
    with sqlite3.connect(project / "mlflow.db") as db:
        seen["runs"] = db.execute("select name, status from runs where name like 'train-%'").fetchall()
    return seen


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the ranks")
@pytest.mark.background(job=split_then_kill_a_torchrun_rank)
def test_a_torchrun_rank_whose_peer_was_killed_ends_with_one_line_and_its_run_failed():
    """The surviving rank fails in a collective on the closed connection (gloo's "Connection reset by
    peer"); the agent then sends it SIGTERM. It ends with one line saying that its peer's process ended and
    how to continue, exit status 2 (its own, not the agent's signal), its MLflow run FAILED, nothing but the
    run's checkpoints written under data/. Was: killed by the agent's SIGTERM (exit -15) with nothing on its
    stderr; with the agent slower to see the killed rank (or on another node), a 280-line traceback of
    gloo's error, exit 1."""
    seen = background.result(split_then_kill_a_torchrun_rank)
    assert seen["split"].returncode == 0, seen["split"].stderr[-3000:]
    assert seen["started"], "training did not start"
    assert sorted(seen["ranks"]) == [0, 1], seen["ranks"]
    agent, survivor = seen["agent"], seen["survivor"]
    assert seen["returncode"] not in (0, None), agent[-3000:]
    assert survivor.strip().splitlines()[-1:] == survivor.strip().splitlines(), survivor[-3000:]
    assert re.fullmatch(
        r"fastlm: error: rank 0 of 2 lost its peer rank 1: .*the other process ended \(killed\?\).*"
        r"Fix: .*out-of-memory killer.*dmesg.*run the same torchrun command again.*train\.resume: auto.*",
        survivor.strip(),
    ), survivor[-3000:]
    # the agent's summary of its failed ranks: rank 0's own exit status (a user error's), not its signal
    assert re.search(r"rank\s+: 0 \(local_rank: 0\)\s+exitcode\s+: 2 ", agent), agent[-3000:]
    assert seen["runs"] == [(seen["runs"][0][0], "FAILED")], seen["runs"]
    checkpoints = "data/06_models/checkpoints/"
    changed = {
        path
        for path in {*seen["before"], *seen["after"]}
        if seen["before"].get(path) != seen["after"].get(path)
    }
    assert changed and all(path.startswith(checkpoints) for path in changed), sorted(changed)
