"""Kedro-Viz sees the split pipeline: `kedro viz build` writes it into the static site, `kedro viz run` serves
it.

Both commands run in a throw-away copy of the project (conf/, pyproject.toml; the code is the installed
fastlm): `kedro viz build` has no output option and always writes ./build, and `kedro viz run` writes ./.viz.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import background
from tests.support.project import copy_project

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SPLIT_NODES = {"clean_corpus", "split_corpus", "build_tokenizer", "tokenize_corpus", "report_split"}
SPLIT_DATASETS = {"raw_corpus", "tokenized_corpus"}
KEDRO = [sys.executable, "-m", "kedro"]


def _viz_env(project: Path) -> dict[str, str]:
    env = background.environ(DO_NOT_TRACK="true", MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}")
    # `kedro viz run` asks PyPI for a newer kedro-viz (30 s timeout): make that fail at once, keep localhost
    # direct.
    for name in ("HTTPS_PROXY", "https_proxy"):
        env[name] = "http://127.0.0.1:9"
    for name in ("NO_PROXY", "no_proxy"):
        env[name] = "127.0.0.1,localhost"
    return env


def _assert_split_graph(graph: dict, where: str) -> None:
    """The split pipeline's nodes and datasets are in a /api/main-style graph, wired raw_corpus ->
    clean_corpus."""
    tasks = {node["name"]: node for node in graph["nodes"] if node["type"] == "task"}
    data = {node["name"]: node for node in graph["nodes"] if node["type"] == "data"}
    assert SPLIT_NODES <= tasks.keys(), f"{where}: split nodes missing, tasks are {sorted(tasks)}"
    assert SPLIT_DATASETS <= data.keys(), f"{where}: datasets missing, data nodes are {sorted(data)}"
    assert "split" in {pipeline["id"] for pipeline in graph["pipelines"]}, f"{where}: {graph['pipelines']}"
    for name in SPLIT_NODES:
        assert "split" in tasks[name]["pipelines"], f"{where}: {name} is not in the split pipeline"
    edges = {(edge["source"], edge["target"]) for edge in graph["edges"]}
    assert (data["raw_corpus"]["id"], tasks["clean_corpus"]["id"]) in edges
    assert (tasks["tokenize_corpus"]["id"], data["tokenized_corpus"]["id"]) in edges


def viz_build(folder: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """`kedro viz build` in a throw-away project (a job of tests/support/background.py)."""
    project = copy_project(folder / "project")
    return project, background.run([*KEDRO, "viz", "build"], cwd=project, env=_viz_env(project), timeout=220)


@pytest.mark.e2e
@pytest.mark.timeout(240)
@pytest.mark.background(job=viz_build)
def test_viz_build_lists_the_split_pipeline():
    viz_project, result = background.result(viz_build)
    log = f"rc={result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    # `kedro viz build` reports its own failures as a message and still exits 0: check the files it wrote.
    api = viz_project / "build" / "api"
    assert result.returncode == 0 and (api / "main").is_file(), log
    assert (viz_project / "build" / "index.html").is_file(), log

    main = json.loads((api / "main").read_text(encoding="utf-8"))
    _assert_split_graph(main, "build/api/main")
    assert main["selected_pipeline"] == "__default__"

    split = json.loads((api / "pipelines" / "split").read_text(encoding="utf-8"))
    _assert_split_graph(split, "build/api/pipelines/split")
    assert split["selected_pipeline"] == "split"
    assert {node["name"] for node in split["nodes"] if node["type"] == "task"} == SPLIT_NODES

    # run on its own, listed too
    predict = json.loads((api / "pipelines" / "predict").read_text(encoding="utf-8"))
    assert {node["name"] for node in predict["nodes"] if node["type"] == "task"} == {"predict_file"}


def _free_port() -> int:
    """A free localhost port below 49151 (kedro viz refuses higher ones)."""
    rng = random.Random()
    for _ in range(100):
        port = rng.randint(20000, 45000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-45000")


def _stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM the server's whole process group (the CLI and its spawned server), SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the spawned server child may outlive the CLI by a moment
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def viz_run(folder: Path) -> dict:
    """`kedro viz run` in a throw-away project, polled for its /api/main, then stopped (a job of
    tests/support/background.py): the graph (or None, the last error and the log's tail), the exit code while
    it was polled, and whether it stopped."""
    viz_project = copy_project(folder / "project")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api/main"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    log_path = viz_project / "viz_run.log"
    with open(log_path, "wb") as log:
        server = background.popen(
            [*KEDRO, "viz", "run", "--no-browser", "--host", "127.0.0.1", "--port", str(port)],
            cwd=viz_project,
            env=_viz_env(viz_project),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        graph, error = None, None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with opener.open(url, timeout=5) as response:
                    graph = json.load(response)
                break
            except OSError as exc:  # not listening yet (URLError, ConnectionError, timeouts)
                error = exc
                time.sleep(0.25)
        with open(log_path, encoding="utf-8", errors="replace") as log:
            tail = log.read()[-3000:]
        served = {"url": url, "graph": graph, "error": error, "exit": server.poll(), "tail": tail}
    finally:
        _stop_process_group(server)
        background.forget(server)
    return {**served, "stopped": server.poll() is not None}


@pytest.mark.e2e
@pytest.mark.timeout(240)
@pytest.mark.background(job=viz_run)
def test_viz_run_serves_the_split_pipeline():
    served = background.result(viz_run)
    assert served["graph"] is not None, (
        f"no graph at {served['url']} (exit code {served['exit']}, last error {served['error']!r}):\n"
        f"{served['tail']}"
    )
    _assert_split_graph(served["graph"], served["url"])
    assert served["stopped"]
