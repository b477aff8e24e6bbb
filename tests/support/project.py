"""Throw-away copies of the Kedro project and running a pipeline in them in-process (fixtures:
tests/conftest.py)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LAYERS = (
    "01_raw",
    "02_intermediate",
    "03_primary",
    "04_feature",
    "05_model_input",
    "06_models",
    "07_model_output",
    "08_reporting",
)


@functools.lru_cache(maxsize=1)
def demo_texts() -> tuple[str, ...]:
    """The session's sample texts (the ``sample_texts`` fixture): 600 demo texts, seed 3."""
    from demo_data.texts import make_texts

    return tuple(make_texts(600, seed=3, profile="demo"))


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # the built-in open, not Path.write_text: background jobs write with it while a test patches Path.open
    with open(path, "w", encoding="utf-8") as file:
        file.write("".join(json.dumps({"text": row}, ensure_ascii=False) + "\n" for row in rows))
    return path


def copy_project(project: Path) -> Path:
    """pyproject.toml, .telemetry and conf/ (without conf/local) copied to ``project``, and an empty src/.

    Kedro wants <project>/src to exist (it resolves links, so no symlink); the code is the installed fastlm.
    """
    project.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(PROJECT_ROOT / name, project / name)
    shutil.copytree(PROJECT_ROOT / "conf", project / "conf", ignore=shutil.ignore_patterns("local"))
    (project / "conf" / "local").mkdir()
    (project / "src").mkdir()
    return project


def make_kedro_project(project: Path, texts: list[str]) -> Path:
    """copy_project, every data layer folder, and a raw corpus of ``texts`` with a few rows cleaning drops
    (empty, whitespace only, missing, not a string, a duplicate): the ``kedro_project`` fixture's project."""
    copy_project(project)
    for layer in LAYERS:
        (project / "data" / layer).mkdir(parents=True)
    write_jsonl(project / "data/01_raw/demo_corpus.jsonl", [*texts, "", "   ", None, 7, texts[0]])
    return project


def bootstrap(project: Path):
    """Kedro's ``bootstrap_project(project)``, as a fresh `kedro run` process makes it, without two costs it
    has only in a test process that makes hundreds: it prepends <project>/src (empty here: the code is the
    installed fastlm) to ``sys.path`` and ``PYTHONPATH``, one more folder per test that every later import
    (and failed import: kedro, MLflow and the datasets try some at each run) and subprocess would search,
    so both are put back; and dynaconf reads every frame of the calling stack for each settings file
    (``inspect.stack``: deep under pytest, each frame's source and module looked up among thousands), so it
    runs from a fresh thread's stack. Its errors are raised here."""
    from concurrent.futures import ThreadPoolExecutor

    from kedro.framework.startup import bootstrap_project

    path, python_path = list(sys.path), os.environ.get("PYTHONPATH")
    try:
        with ThreadPoolExecutor(max_workers=1) as thread:
            return thread.submit(bootstrap_project, project).result()
    finally:
        sys.path[:] = path
        if python_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = python_path


def run_pipeline(
    project: Path,
    pipeline: str,
    params: dict | None = None,
    *,
    env: str | None = None,
    from_nodes: list[str] | None = None,
    node_names: list[str] | None = None,
):
    """Run ``pipeline`` in-process through a KedroSession, as `kedro run --pipelines=<pipeline>` does
    (``from_nodes``: as `--from-nodes`, ``node_names``: as `--nodes`)."""
    import mlflow
    from kedro.framework.session import KedroSession

    bootstrap(project)
    try:
        with KedroSession.create(project_path=project, env=env, runtime_params=params or {}) as session:
            return session.run(pipeline_names=[pipeline], from_nodes=from_nodes, node_names=node_names)
    finally:  # kedro-mlflow can leave a failed run active; one CLI run is one process, a test is not
        while mlflow.active_run() is not None:
            mlflow.end_run("FAILED")


def split_once(folder: Path, texts: list[str], mlflow_uri: str, params: dict) -> Path:
    """A new project in ``folder`` (the kedro_project fixture's) split with ``params`` through a
    KedroSession, its cwd and tracking store set for that run only: the project, whose data/ a module's tests
    copy into their own (``copy_split_data``) instead of splitting the same texts again."""
    import pytest

    project = make_kedro_project(folder / "project", texts)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        run_pipeline(project, "split", params)
    return project


def copy_split_data(split: Path, project: Path) -> Path:
    """``project`` as the split of ``split_once`` leaves it: its data/ copied over (the raw file too, its
    times kept: the same file the split read)."""
    shutil.copytree(split / "data", project / "data", symlinks=True, dirs_exist_ok=True)
    return project


def run_quick(project: Path, pipeline: str, params: dict | None = None):
    """Run ``pipeline`` in the ``quick`` environment (conf/quick over conf/base), as
    `kedro run --env quick`."""
    return run_pipeline(project, pipeline, params, env="quick")


def catalog_dataset(name: str, filepath: Path):
    """The dataset of catalog entry ``name`` (conf/base/catalog.yml: its type, load and save arguments) at
    ``filepath``: what a pipeline writes to and reads from that entry."""
    import yaml
    from kedro.io import AbstractDataset

    catalog = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text(encoding="utf-8"))
    return AbstractDataset.from_config(name, {**catalog[name], "filepath": str(filepath)})


def kedro_cli(project: Path, *args: str):
    """``kedro run *args`` in a fresh process in ``project`` (the refusals of the CLI end the process: they
    are never driven in-process). Returns the CompletedProcess."""
    import subprocess

    env = {**os.environ, "DO_NOT_TRACK": "true", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "kedro", "run", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def cli_refusal(project: Path, *args: str) -> str:
    """The one ``fastlm: error:`` line ``kedro run *args`` ends with, checked to exit 2 without a traceback
    and to leave every file under ``project``/data as it was."""
    before = {path: path.read_bytes() for path in (project / "data").rglob("*") if path.is_file()}
    done = kedro_cli(project, *args)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fastlm: error:") and "Fix:" in last, last
    assert {path: path.read_bytes() for path in (project / "data").rglob("*") if path.is_file()} == before
    return last


def data_snapshot(project: Path) -> dict[str, bytes]:
    """Every file under ``project``/data with its bytes (the built-in open: background jobs take it)."""
    files = {}
    for root, _, names in os.walk(project / "data"):
        for name in names:
            with open(os.path.join(root, name), "rb") as file:
                files[os.path.relpath(os.path.join(root, name), project)] = file.read()
    return files


# What MLflow makes in a project with its default local store (conf/base/mlflow.yml): a run refused before it
# starts makes neither
MLFLOW_STORE = ("mlflow.db", "mlruns")


def refusal_in_background(project: Path, *args: str, **env: str | None) -> dict:
    """For a background job (tests/support/background.py): ``kedro run *args`` in ``project`` in a fresh
    process (its own mlflow.db; ``env``: changes to the session's environment, None removes one), whether it
    left every file under data/ as it was, and the parts of an MLflow store (``MLFLOW_STORE``) it made.
    ``refused_line`` checks it in the test."""
    from tests.support import background

    before = data_snapshot(project)
    store = [name for name in MLFLOW_STORE if not os.path.exists(project / name)]
    environ = background.environ(DO_NOT_TRACK="true", COLUMNS="200", MLFLOW_TRACKING_URI=None, **env)
    done = background.run([sys.executable, "-m", "kedro", "run", *args], cwd=project, env=environ)
    return {
        "args": list(args),
        "done": done,
        "data_unchanged": data_snapshot(project) == before,
        "store_made": [name for name in store if os.path.exists(project / name)],
    }


def without_import_times(done):
    """``done`` (a process run with ``PYTHONPROFILEIMPORTTIME=1``) without the ``import time:`` lines of its
    stderr, and the modules it imported (their full names)."""
    import subprocess

    kept, imported = [], set()
    for line in done.stderr.splitlines(keepends=True):
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[-1].strip())
        else:
            kept.append(line)
    imported.discard("imported package")  # the header line
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, "".join(kept)), imported


def refused_line(refusal: dict) -> str:
    """cli_refusal's checks on a ``refusal_in_background`` result: status 2, no traceback, one ``fastlm:
    error:`` line with a fix at the end, nothing under data/ changed, no MLflow store made (mlflow.db,
    mlruns). Returns that line."""
    done = refusal["done"]
    assert done.returncode == 2, (refusal["args"], done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fastlm: error:") and "Fix:" in last, last
    assert refusal["data_unchanged"], refusal["args"]
    assert not refusal["store_made"], (refusal["args"], refusal["store_made"])  # nothing of MLflow's either
    return last
