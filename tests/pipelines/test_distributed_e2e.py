"""The train pipeline on 2 CPU processes (gloo): launched by the node, started under torchrun, and a killed
worker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.support.project import run_pipeline

pytestmark = pytest.mark.e2e
SPLIT = {"tokenizer": {"vocab_size": 400}, "max_length": 48}
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


def _train_runs(experiment: str = "fastlm") -> list:
    import mlflow

    client = mlflow.MlflowClient()
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


def _cli_env(project: Path) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


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


def test_kedro_run_under_torchrun_writes_once(kedro_project):
    run_pipeline(kedro_project, "split", {"split": SPLIT})
    before = len(_train_runs())
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "kedro",
        "run",
        "--pipeline=train",
        "--params",
        _params_arg({"split": SPLIT, "train": TRAIN}),
    ]
    done = subprocess.run(
        command, cwd=kedro_project, env=_cli_env(kedro_project), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_train_runs()) == before + 1  # rank 1 opened no MLflow run
    assert _written_outputs(kedro_project)["checkpoints"] == ["checkpoint-00000002", "checkpoint-00000004"]
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4


def _spawned_workers(parent: int) -> list[int]:
    """The worker processes the launcher spawned: children of ``parent`` running multiprocessing's
    spawn_main."""
    workers = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"spawn_main" in cmdline:
            workers.append(int(stat.parent.name))
    return sorted(workers)


@pytest.mark.skipif(
    not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the worker processes"
)
def test_a_killed_worker_ends_the_run_with_a_clear_error_and_no_process_left(kedro_project):
    run_pipeline(kedro_project, "split", {"split": SPLIT})
    long_run = {
        **TRAIN,
        "max_steps": 100000,
        "save_every": 1,
        "keep_last": 1,
        "distributed": {"nproc_per_node": 2, "monitor_interval_s": 0.2},
    }
    command = [
        sys.executable,
        "-m",
        "kedro",
        "run",
        "--pipeline=train",
        "--params",
        _params_arg({"split": SPLIT, "train": long_run}),
    ]
    process = subprocess.Popen(
        command,
        cwd=kedro_project,
        env=_cli_env(kedro_project),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not list((kedro_project / "data/06_models/checkpoints").glob("*/checkpoint-*")):
            assert process.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        workers = _spawned_workers(process.pid)
        assert len(workers) == 2, workers
        os.kill(workers[-1], signal.SIGKILL)
        killed = time.monotonic()
        output, _ = process.communicate(timeout=90)
        ended_in = time.monotonic() - killed
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode not in (0, None)
    assert re.search(r"training worker rank \d of 2 was killed \(Signal 9 \(SIGKILL\)", output), output[
        -3000:
    ]
    assert ended_in < 60
    assert all(
        not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        for pid in workers
    )
    assert not (kedro_project / "data/06_models/model").exists()  # nothing half-written
