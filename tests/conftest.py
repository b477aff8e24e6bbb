"""Shared fixtures: tiny tokenizers and throw-away copies of the Kedro project."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "true")

from demo_data.texts import make_texts  # noqa: E402

import fastlm  # noqa: E402,F401  (sets offline/telemetry defaults before any HF import)
from fastlm.corpus.tokenizer_source import train_bpe_tokenizer  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_dangling_mlflow_run():
    """Each test starts with no active MLflow run (kedro-mlflow can leave one open in-process)."""
    yield
    import sys

    if "mlflow" in sys.modules:
        import mlflow

        while mlflow.active_run() is not None:
            mlflow.end_run()


@pytest.fixture(scope="session")
def sample_texts() -> list[str]:
    return make_texts(600, seed=3, profile="demo")


@pytest.fixture(scope="session")
def bpe_tokenizer(sample_texts):
    return train_bpe_tokenizer(sample_texts, vocab_size=400, min_frequency=2, model_max_length=64)


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(bpe_tokenizer, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    bpe_tokenizer.save_pretrained(folder)
    return folder


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": row}, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One tracking database for the whole session: creating MLflow's schema costs seconds each time."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


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


@pytest.fixture
def kedro_project(tmp_path, monkeypatch, sample_texts, mlflow_uri) -> Path:
    """A copy of the project's configuration in tmp_path (cwd), with a small raw corpus; code is the installed package."""
    copy_project(tmp_path)
    for layer in ("01_raw", "02_intermediate", "03_primary", "04_feature", "05_model_input", "06_models",
                  "07_model_output", "08_reporting"):
        (tmp_path / "data" / layer).mkdir(parents=True)
    write_jsonl(tmp_path / "data/01_raw/demo_corpus.jsonl", sample_texts + ["", "   ", None, 7, sample_texts[0]])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    return tmp_path


def run_pipeline(project: Path, pipeline: str, params: dict | None = None):
    """Run ``pipeline`` in-process through a KedroSession, as `kedro run --pipelines=<pipeline>` does."""
    import mlflow
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(project)
    try:
        with KedroSession.create(project_path=project, runtime_params=params or {}) as session:
            return session.run(pipeline_names=[pipeline])
    finally:  # kedro-mlflow can leave a failed run active; one CLI run is one process, a test is not
        while mlflow.active_run() is not None:
            mlflow.end_run("FAILED")
