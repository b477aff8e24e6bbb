"""Shared fixtures: tiny tokenizers and throw-away copies of the Kedro project."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "true")

from demo_data.texts import make_texts  # noqa: E402

import fastlm  # noqa: E402,F401  (sets offline/telemetry defaults before any HF import)
from fastlm.corpus.tokenizer_source import train_bpe_tokenizer  # noqa: E402
from tests.support.project import copy_project, write_jsonl  # noqa: E402


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


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One tracking database for the whole session: creating MLflow's schema costs seconds each time."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def kedro_project(tmp_path, monkeypatch, sample_texts, mlflow_uri) -> Path:
    """A copy of the project's configuration in tmp_path (cwd), with a small raw corpus; code is the installed
    package."""
    copy_project(tmp_path)
    for layer in (
        "01_raw",
        "02_intermediate",
        "03_primary",
        "04_feature",
        "05_model_input",
        "06_models",
        "07_model_output",
        "08_reporting",
    ):
        (tmp_path / "data" / layer).mkdir(parents=True)
    write_jsonl(
        tmp_path / "data/01_raw/demo_corpus.jsonl", sample_texts + ["", "   ", None, 7, sample_texts[0]]
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    return tmp_path
