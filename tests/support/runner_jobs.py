"""Background jobs (tests/support/background.py) of `kedro run` under Kedro's ParallelRunner and ThreadRunner,
through the real CLI in a project of their own (its own MLflow store, mlflow.db): their subprocesses run on
the core the foreground tests leave idle. Jobs read and write files with the built-in open and os only."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import yaml

from tests.support import background
from tests.support.e2e import SPLIT, TRAIN
from tests.support.project import demo_texts, make_kedro_project

REPORT = {"max_new_tokens": 5, "prompts": ["", "배송"], "worst_samples": 3, "error_pairs": 5}
MARKER = "data/05_model_input/split_complete.json"


def new_project(folder: Path) -> Path:
    """The ``kedro_project`` fixture's project (600 demo texts and a few rows cleaning drops) with the small
    split, train and report parameters of the end-to-end tests in conf/local/parameters.yml."""
    project = make_kedro_project(folder / "project", list(demo_texts()))
    with open(project / "conf/local/parameters.yml", "w", encoding="utf-8") as file:
        file.write(yaml.safe_dump({"split": SPLIT, "train": TRAIN, "report": REPORT}))
    return project


def kedro(project: Path, *args: str, **env: str | None) -> dict:
    """``kedro run *args`` in ``project`` (its own mlflow.db): the exit status and what it printed."""
    environ = background.environ(DO_NOT_TRACK="true", COLUMNS="200", MLFLOW_TRACKING_URI=None, **env)
    done = background.run([sys.executable, "-m", "kedro", "run", *args], cwd=project, env=environ)
    return {"args": list(args), "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def data_files(project: Path) -> dict[str, tuple[str, int]]:
    """Every file under data/ (output locks aside): its bytes' digest and modification time (a rewrite of the
    same bytes counts)."""
    import hashlib

    files = {}
    for root, _, names in os.walk(project / "data"):
        for name in names:
            if name.startswith(".") and name.endswith(".lock"):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                digest = hashlib.sha256(file.read()).hexdigest()
            files[os.path.relpath(path, project)] = (digest, os.stat(path).st_mtime_ns)
    return files


def mlflow_runs(project: Path) -> int:
    """The runs in the project's own MLflow store."""
    with sqlite3.connect(project / "mlflow.db") as db:
        return db.execute("select count(*) from runs").fetchone()[0]


def read_marker(project: Path) -> dict | None:
    """The finished split's marker, removed (the next split of the job must write its own), or None."""
    path = project / MARKER
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as file:
        marker = json.load(file)
    os.remove(path)
    return marker


def runs_under_the_parallel_and_thread_runners(folder: Path) -> dict:
    """In a new project: a sequential split, the same split under the ParallelRunner with forked and then
    spawned workers (the marker each leaves), a training named ``exp-p``, and its report under the
    ParallelRunner with spawned workers (macOS's default start method, or KEDRO_MP_CONTEXT=spawn). Then the
    tokenized data made stale (the split settings changed since, with --params) and edited (a split's file
    copied over another's), each refused by a report or a train under the ParallelRunner or the ThreadRunner;
    for each refusal: what it printed, the files under data/ it changed, and the MLflow runs before and after.
    """
    project = new_project(folder)
    parallel = ("--runner=ParallelRunner", "--runner-params", "max_workers=4")
    runs, markers = {}, {}
    runs["sequential"] = kedro(project, "--pipeline=split")
    markers["sequential"] = read_marker(project)
    for start in ("fork", "spawn"):
        runs[start] = kedro(project, "--pipeline=split", *parallel, KEDRO_MP_CONTEXT=start)
        markers[start] = read_marker(project) if start == "fork" else _kept_marker(project)
    runs["train"] = kedro(project, "--pipeline=train", "--params", "run_name=exp-p")
    runs["report"] = kedro(project, "--pipeline=report", "--runner=ParallelRunner", KEDRO_MP_CONTEXT="spawn")
    done = {"project": project, "runs": runs, "markers": markers, "refusals": []}
    if all(run["returncode"] == 0 for run in runs.values()):
        done["refusals"] = _refusals(project)
    return done


def _refusals(project: Path) -> list[tuple[str, dict]]:
    def refusal(*args: str) -> dict:
        before, runs = data_files(project), mlflow_runs(project)
        done = kedro(project, *args)
        after = data_files(project)
        done["changed"] = sorted(path for path, state in after.items() if before.get(path) != state)
        done["same_files"] = set(after) == set(before)
        done["runs"] = (runs, mlflow_runs(project))
        return done

    vocab = f"split.tokenizer.vocab_size={SPLIT['tokenizer']['vocab_size'] + 100}"
    refusals = [
        ("stale", refusal(f"--pipeline={pipeline}", f"--runner={runner}", "--params", vocab))
        for pipeline, runner in (("report", "ThreadRunner"), ("train", "ParallelRunner"))
    ]
    split_folder = project / "data/05_model_input/tokenized_corpus"
    arrow = "data-00000-of-00001.arrow"
    with open(split_folder / "validation" / arrow, "rb") as source:
        copied = source.read()
    with open(split_folder / "train" / arrow, "wb") as target:
        target.write(copied)
    refusals += [
        ("edited", refusal(f"--pipeline={pipeline}", f"--runner={runner}"))
        for pipeline, runner in (("report", "ParallelRunner"), ("train", "ThreadRunner"))
    ]
    return refusals


def _kept_marker(project: Path) -> dict | None:
    path = project / MARKER
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as file:
        return json.load(file)
