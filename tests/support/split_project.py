"""A background job (tests/support/background.py): one new project split once by `kedro run --pipeline=split`
with the end-to-end tests' small split (tests.support.e2e.SPLIT) and an MLflow store of its own in the
project, for the jobs that then train, stop or refuse in a split project: each copies it (files only, times
kept: a copied project is the same project to its split) instead of starting a `kedro run` to split again.
Jobs read and write files with the built-in open and shutil only."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import background
from tests.support.e2e import SPLIT
from tests.support.project import demo_texts, make_kedro_project

SHARED_SPLIT = SPLIT  # the split settings the project is split with


def _flat(params: dict, prefix: str) -> list[str]:
    return [
        item
        for key, value in params.items()
        for item in (
            _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={value}"]
        )
    ]


SPLIT_PARAMS = ",".join(_flat(SPLIT, "split."))  # as --params takes them


def split_project(folder: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The ``kedro_project`` fixture's project (600 demo texts and a few rows cleaning drops) split by
    `kedro run --pipeline=split --params <SPLIT>` (its store: mlflow.db in the project): the project and the
    run."""
    project = make_kedro_project(folder / "project", list(demo_texts()))
    environ = background.environ(DO_NOT_TRACK="true", COLUMNS="200", MLFLOW_TRACKING_URI=None)
    command = [sys.executable, "-m", "kedro", "run", "--pipeline=split", "--params", SPLIT_PARAMS]
    return project, background.run(command, cwd=project, env=environ)


def copy_of_the_split_project(project: Path) -> subprocess.CompletedProcess:
    """The split project (``split_project``, run once a session) copied to ``project``, its data, MLflow
    store and artefacts with it, when its split finished; the split's run either way (a job's test asserts
    on it as on a split of its own)."""
    split, done = background.result(split_project)
    if done.returncode == 0:
        shutil.copytree(split, project, symlinks=True)
    return done
